"""Run and launch noise measured on one H200 at TP 1 (``[noise.*]`` of ``sim/model.toml``, from
``tests/contract/data/h200_noise.json``): chosen for a simulated server of that kind (tp 1, CUDA
graphs on, noise not set by hand) by ``--sim-noise-preset auto``, or by name, and said where
the figures appear (``/server_info``, the startup log).

Without a preset every server keeps the fixed defaults (run CV 3 %, launches alike), so that
existing simulated suites and their baselines are unchanged; ``tests/contract/test_h200_noise.py``
holds the presets' figures to the contract file.
"""

from __future__ import annotations

import pytest

from pytest_specdecode.sim.args import ENV_LAUNCH_CV, ENV_NOISE_CV, SimOptions, parse_args
from pytest_specdecode.sim.noise import (
    DEFAULT_LAUNCH_CV,
    DEFAULT_RUN_CV,
    NoisePreset,
    load_presets,
)

from .conftest import EAGLE3_2STEP, EAGLE3_5STEP, StartSim

DENSE_TP1 = ("--model-path", "/models/llama-3.1-8b")
PRESETS = load_presets().presets
NOSPEC, TWO, FIVE = (PRESETS[f"h200-tp1-{name}"] for name in ("nospec", "eagle3-2step",
                                                              "eagle3-5step"))  # fmt: skip
LABEL = "measured on one H200, TP 1 (tests/contract/data/h200_noise.json)"


def sim(*flags: str, env: dict[str, str] | None = None) -> SimOptions:
    return parse_args([*DENSE_TP1, *flags], env).sim


def preset_of(options: SimOptions) -> str | None:
    choice = options.noise_choice
    return choice.preset.name if choice is not None and choice.preset is not None else None


def four_step_eagle3() -> tuple[str, ...]:
    flags = list(EAGLE3_5STEP)
    flags[flags.index("--speculative-num-steps") + 1] = "4"
    flags[flags.index("--speculative-num-draft-tokens") + 1] = "5"
    return tuple(flags)


@pytest.mark.parametrize(
    ("flags", "preset"),
    [((), NOSPEC), (EAGLE3_2STEP, TWO), (EAGLE3_5STEP, FIVE), (four_step_eagle3(), FIVE)],
    ids=["nospec", "eagle3-2step", "eagle3-5step", "eagle3-4step-nearest-5"],
)
def test_auto_at_tp1_with_cuda_graphs_takes_the_measured_noise_nearest_in_steps(
    flags: tuple[str, ...], preset: NoisePreset
) -> None:
    options = sim(*flags, "--sim-noise-preset", "auto")
    assert preset_of(options) == preset.name
    assert (options.noise_cv, options.launch_cv) == (preset.run_cv, preset.launch_cv)
    assert options.launch_factor != 1.0  # launches vary, as the H200's did
    assert options.noise_choice is not None
    assert LABEL in options.noise_choice.describe()


@pytest.mark.parametrize(
    "flags",
    [
        (),
        ("--tp-size", "8", "--sim-noise-preset", "auto"),
        ("--disable-cuda-graph", "--sim-noise-preset", "auto"),
        ("--sim-noise-preset", "none"),
    ],
    ids=["default", "auto-at-tp8", "auto-with-cuda-graphs-off", "preset-none"],
)
def test_other_servers_keep_the_fixed_defaults(flags: tuple[str, ...]) -> None:
    options = sim(*EAGLE3_2STEP, *flags)
    assert preset_of(options) is None
    assert (options.noise_cv, options.launch_cv) == (DEFAULT_RUN_CV, DEFAULT_LAUNCH_CV)
    assert options.launch_factor == 1.0


def test_noise_set_by_hand_is_set_as_a_whole() -> None:
    # either knob given: no automatic preset, the other knob at its fixed default
    run_only = sim("--sim-noise-cv", "0", "--sim-noise-preset", "auto")
    assert (run_only.noise_cv, run_only.launch_cv, preset_of(run_only)) == (0.0, 0.0, None)
    launch_only = sim("--sim-launch-cv", "0.05", "--sim-noise-preset", "auto")
    assert (launch_only.noise_cv, launch_only.launch_cv) == (DEFAULT_RUN_CV, 0.05)
    assert preset_of(launch_only) is None


def test_a_named_preset_applies_anywhere_and_a_flag_wins_for_its_knob() -> None:
    named = sim("--tp-size", "8", "--sim-noise-preset", "h200-tp1-eagle3-5step")
    assert (named.noise_cv, named.launch_cv, preset_of(named)) == (
        FIVE.run_cv,
        FIVE.launch_cv,
        FIVE.name,
    )
    assert named.noise_choice is not None
    assert "chosen by --sim-noise-preset" in named.noise_choice.describe()
    mixed = sim("--sim-noise-preset", "h200-tp1-nospec", "--sim-launch-cv", "0.1")
    assert (mixed.noise_cv, mixed.launch_cv) == (NOSPEC.run_cv, 0.1)
    both = sim("--sim-noise-preset", "h200-tp1-nospec", "--sim-noise-cv", "0.2",
               "--sim-launch-cv", "0.1")  # fmt: skip
    assert (both.noise_cv, both.launch_cv, preset_of(both)) == (0.2, 0.1, None)


def test_the_environment_knobs_still_replace_the_presets_figures() -> None:
    options = sim(env={ENV_NOISE_CV: "0", ENV_LAUNCH_CV: "0.2"})
    assert (options.noise_cv, options.launch_cv) == (0.0, 0.2)
    assert options.env_knobs == (f"{ENV_NOISE_CV}=0", f"{ENV_LAUNCH_CV}=0.2")


def test_an_unknown_preset_is_a_usage_error_naming_the_choices(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        sim("--sim-noise-preset", "h100")
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --sim-noise-preset: invalid choice: 'h100'" in err
    for name in (*PRESETS, "auto", "none"):
        assert name in err


def test_a_live_server_says_where_its_noise_comes_from(start_sim: StartSim) -> None:
    measured = start_sim(*EAGLE3_2STEP, "--sim-noise-preset", "auto", base=DENSE_TP1)
    seed_box = start_sim(*EAGLE3_2STEP)  # the seed's TP8 flags
    with measured.client() as client:
        info = client.get("/server_info").json()
    assert info["sim_noise_preset"] == TWO.name
    assert info["sim_noise_source"] == f"noise: {LABEL}"
    assert (info["sim_noise_cv"], info["sim_launch_cv"]) == (TWO.run_cv, TWO.launch_cv)
    assert info["sim_launch_speed_factor"] != 1.0
    assert f"[simulated] noise: {LABEL}: run CV {TWO.run_cv:g}" in measured.log()
    with seed_box.client() as client:
        info = client.get("/server_info").json()
    assert info["sim_noise_preset"] is None
    assert info["sim_noise_source"] == "noise: set by hand or the simulator's fixed defaults"
    assert (info["sim_noise_cv"], info["sim_launch_cv"]) == (DEFAULT_RUN_CV, DEFAULT_LAUNCH_CV)
