"""``SPECDECODE_SIM_*``: regressions injected from the environment, outside every profile.

A real regression (a slower SGLang build, a broken draft model) changes speed while the profile,
hence the fingerprint, stays the same. Flags in a profile's ``extra_args`` are hard fingerprint
fields, so the plugin's end-to-end tests inject regressions through these variables instead.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_specdecode.sim.args import (
    ENV_ACCEPT_SCALE,
    ENV_NOISE_CV,
    ENV_SLOWDOWN,
    parse_args,
)
from pytest_specdecode.sim.launch_script import ENV_LAUNCH_SCRIPT

from .conftest import EAGLE3_2STEP, NCCL_TUNED, StartSim

BASE = ["--model-path", "m"]


def test_without_the_variables_nothing_changes() -> None:
    flags = [*BASE, "--sim-slowdown", "1.5", "--sim-accept-scale", "0.9", "--sim-noise-cv", "0.1"]
    flags += ["--sim-seed", "7", "--sim-launch-seed", "1"]
    sim = parse_args(flags, {"UNRELATED": "1"}).sim
    assert (sim.slowdown, sim.accept_scale, sim.noise_cv) == (1.5, 0.9, 0.1)
    assert sim.env_knobs == ()
    assert parse_args(flags, {ENV_SLOWDOWN: "  "}).sim.env_knobs == ()  # empty = unset
    assert parse_args(flags).sim == sim  # no environment given: none read


def test_slowdown_and_accept_scale_multiply_noise_replaces() -> None:
    flags = [*BASE, "--sim-slowdown", "1.5", "--sim-accept-scale", "0.8", "--sim-noise-cv", "0.1"]
    env = {ENV_SLOWDOWN: "2", ENV_ACCEPT_SCALE: "0.5", ENV_NOISE_CV: "0.3"}
    sim = parse_args(flags, env).sim
    assert sim.slowdown == pytest.approx(3.0)
    assert sim.accept_scale == pytest.approx(0.4)
    assert sim.noise_cv == pytest.approx(0.3)
    assert sim.env_knobs == (
        f"{ENV_SLOWDOWN}=2",
        f"{ENV_ACCEPT_SCALE}=0.5",
        f"{ENV_NOISE_CV}=0.3",
    )
    assert parse_args(BASE, {ENV_NOISE_CV: "0"}).sim.noise_cv == 0.0


@pytest.mark.parametrize(
    ("name", "value"),
    [(ENV_SLOWDOWN, "0"), (ENV_SLOWDOWN, "fast"), (ENV_ACCEPT_SCALE, "-1"), (ENV_NOISE_CV, "x")],
)
def test_a_bad_value_is_a_usage_error_naming_the_variable(
    name: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(BASE, {name: value})
    assert exited.value.code == 2
    assert f"environment variable {name}={value!r}" in capsys.readouterr().err


def test_a_live_server_applies_logs_and_reports_the_knobs(start_sim: StartSim) -> None:
    sampling = {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True}
    flags = (*EAGLE3_2STEP, "--sim-seed", "3", "--sim-noise-cv", "0")

    def measure(env: dict[str, str]) -> tuple[float, float, dict[str, object]]:
        sim = start_sim(*flags, env={**NCCL_TUNED, **env})
        meta = sim.generate({"text": "hello there", "sampling_params": sampling}).json()
        with sim.client() as client:
            info = client.get("/server_info").json()
        log = sim.log()
        sim.kill()
        m = meta["meta_info"]
        info["log"] = log
        return m["e2e_latency"], m["completion_tokens"] / m["spec_verify_ct"], info

    plain_latency, plain_accept, plain = measure({})
    slow_latency, slow_accept, slow = measure({ENV_SLOWDOWN: "2", ENV_ACCEPT_SCALE: "1"})
    assert plain["sim_env_knobs"] == []
    assert slow["sim_slowdown"] == 2.0
    assert slow["sim_env_knobs"] == [f"{ENV_SLOWDOWN}=2", f"{ENV_ACCEPT_SCALE}=1"]
    banner = "injected from the environment (test knobs, not part of any profile)"
    assert f"{banner}: {ENV_SLOWDOWN}=2 {ENV_ACCEPT_SCALE}=1" in str(slow["log"])
    assert banner not in str(plain["log"])
    # Same seed, same acceptance; every step twice as long (server-side time, no HTTP noise).
    assert slow_accept == plain_accept
    assert slow_latency / plain_latency == pytest.approx(2.0, rel=0.05)

    _, low_accept, _ = measure({ENV_ACCEPT_SCALE: "0.3"})
    assert low_accept < 0.8 * plain_accept


# -- SPECDECODE_SIM_LAUNCH_SCRIPT: one line of --sim-* flags per launch (sim/launch_script.py) --


def test_a_launch_script_gives_each_launch_its_line_in_turn(tmp_path: Path) -> None:
    script = tmp_path / "launches.txt"
    script.write_text("\n--sim-noise-cv 2.0 --sim-seed 5\n--sim-fault exit-during-load\n")
    env = {ENV_LAUNCH_SCRIPT: str(script)}
    flags = [*BASE, "--sim-noise-cv", "0.02", "--sim-seed", "11"]
    first = parse_args(flags, env).sim
    second = parse_args(flags, env).sim
    third = parse_args(flags, env).sim
    fourth = parse_args(flags, env).sim  # no line left: the command line as it is
    assert (first.noise_cv, first.seed, first.fault) == (0.02, 11, None)
    assert (second.noise_cv, second.seed) == (2.0, 5)  # the line's flags come last and win
    assert third.fault == "exit-during-load"
    assert third.noise_cv == 0.02
    assert (fourth.noise_cv, fourth.fault) == (0.02, None)
    assert script.read_text() == ""
    # what each launch took is logged at startup and reported by /server_info
    assert second.env_knobs == (f"{ENV_LAUNCH_SCRIPT}={script} (--sim-noise-cv 2.0 --sim-seed 5)",)
    assert first.env_knobs == (f"{ENV_LAUNCH_SCRIPT}={script} (nothing added)",)
    assert "no line left" in fourth.env_knobs[0]


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("--tp-size 2", "holds --sim-* flags only"),
        ("--sim-noise-cv 'unclosed", "No closing quotation"),
        ("--sim-noise-cv -1", "argument --sim-noise-cv"),
    ],
)
def test_a_bad_launch_line_is_a_usage_error_naming_the_file_and_line(
    tmp_path: Path, line: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "launches.txt"
    script.write_text(f"{line}\n")
    with pytest.raises(SystemExit) as exited:
        parse_args(BASE, {ENV_LAUNCH_SCRIPT: str(script)})
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert says in err
    if "argument" not in says:  # argparse names the flag; the script's own errors name the file
        assert f"{ENV_LAUNCH_SCRIPT}={str(script)!r}" in err
        assert repr(line) in err


def test_a_launch_script_that_is_missing_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere" / "launches.txt"
    with pytest.raises(SystemExit):
        parse_args(BASE, {ENV_LAUNCH_SCRIPT: str(missing)})
    err = capsys.readouterr().err
    assert f"cannot take this launch's line of {missing}" in err
    assert "one line of --sim-* flags per launch" in err
