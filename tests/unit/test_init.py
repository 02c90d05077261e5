"""``python -m pytest_specdecode init``: a suite of one's own, and what recording it costs."""

from __future__ import annotations

import dataclasses
import io
import re
from pathlib import Path

import pytest

from pytest_specdecode.__main__ import EXIT_OK, EXIT_USAGE, main
from pytest_specdecode.profiles.loader import load_profiles
from pytest_specdecode.session.baseline_launches import baseline_cost, planned_launches

EXAMPLE = Path(__file__).parents[2] / "perf_tests" / "specdecode.toml"
EAGLE3 = ("--model", "/models/llama-8b", "--draft-model", "/models/llama-8b-eagle3")


def run(*argv: str | Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["init", *(str(a) for a in argv)], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_an_eagle3_suite_with_nccl_loads_as_asked_under_both_targets(tmp_path: Path) -> None:
    code, out, err = run(*EAGLE3, "--tp", "8", "--steps", "3", "--nccl", "NCCL_PROTO=LL", "A=b c")
    assert (code, err) == (EXIT_OK, "")
    assert out.startswith("wrote perf_tests/specdecode.toml\nwrote perf_tests/test_perf.py\n")
    assert not (tmp_path / "perf_tests" / "pytest.ini").exists()  # found without an ini file
    path = tmp_path / "perf_tests" / "specdecode.toml"
    real = load_profiles(path).profiles["eagle3-3step-nccl"]
    assert (real.model_path, real.tp_size, real.launcher) == ("/models/llama-8b", 8, "sglang")
    assert real.speculative is not None
    spec = real.speculative
    assert (spec.algorithm, spec.num_steps, spec.eagle_topk, spec.num_draft_tokens) == (
        "EAGLE3",
        3,
        1,
        4,
    )
    assert spec.draft_model_path == "/models/llama-8b-eagle3"
    assert dict(real.env) == {"NCCL_PROTO": "LL", "A": "b c"}
    assert load_profiles(path, target="sim").profiles["eagle3-3step-nccl"].simulated
    assert load_profiles(path).warnings == ()  # its workload replaces no built-in
    test = (tmp_path / "perf_tests" / "test_perf.py").read_text()
    assert '@pytest.mark.specdecode(\n    "eagle3-3step-nccl",' in test
    assert "tok_s=-0.03, accept_length=-0.05," in test
    compile(test, "test_perf.py", "exec")
    # How to record, and what it costs: 3 launches of a real server, each within 1800 s.
    assert "pytest perf_tests --update-baselines" in out
    assert "pytest perf_tests --specdecode-target sim --update-baselines" in out
    assert "pytest perf_tests --specdecode-on-missing-baseline fail" in out
    text = " ".join(out.split())
    assert (
        "Recording costs 3 server launches (3 per profile x 1 profile), each loading within its "
        "startup_timeout (1800 s): up to 90 min of loading, plus the runs." in text
    )
    assert "The load time is a bound, the profile's startup_timeout" in text


def test_every_key_of_the_written_profile_file_is_commented(tmp_path: Path) -> None:
    run(*EAGLE3, "--nccl", "NCCL_ALGO=Ring")
    lines = (tmp_path / "perf_tests" / "specdecode.toml").read_text().splitlines()
    uncommented = []
    in_env = False
    for index, line in enumerate(lines):
        if line.startswith("["):
            in_env = line.startswith("[env.")
            continue
        if in_env or not re.match(r"^[a-z_]+ = ", line):
            continue  # the env set's variables are the user's own
        if "#" not in line and not lines[index - 1].startswith("#"):
            uncommented.append(line)
    assert uncommented == []


def test_a_suite_without_speculation(tmp_path: Path) -> None:
    code, _, _ = run("--model", "/models/m", "--tp", "2")
    assert code == EXIT_OK
    loaded = load_profiles(tmp_path / "perf_tests" / "specdecode.toml")
    (profile,) = loaded.profiles.values()
    assert (profile.name, profile.speculative, dict(profile.env)) == ("nospec", None, {})
    test = (tmp_path / "perf_tests" / "test_perf.py").read_text()
    assert "    tok_s=-0.03,\n" in test
    assert "accept_length" not in test


def test_another_directory_gets_its_own_ini(tmp_path: Path) -> None:
    code, out, _ = run("bench/perf", *EAGLE3)
    assert code == EXIT_OK
    ini = tmp_path / "bench" / "perf" / "pytest.ini"
    assert "specdecode_config = specdecode.toml" in ini.read_text()
    assert "wrote bench/perf/pytest.ini" in out
    assert "commit bench/perf/baselines/" in out
    assert "specdecode_config = bench/perf/specdecode.toml there" in " ".join(out.split())


def test_an_existing_file_is_never_replaced_and_nothing_is_written(tmp_path: Path) -> None:
    mine = tmp_path / "perf_tests" / "test_perf.py"
    mine.parent.mkdir()
    mine.write_text("my own test\n")
    code, out, err = run(*EAGLE3)
    assert (code, out) == (EXIT_USAGE, "")
    assert "perf_tests/test_perf.py already exists; init never overwrites a file" in err
    assert mine.read_text() == "my own test\n"
    assert not (tmp_path / "perf_tests" / "specdecode.toml").exists()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--model", "/m", "--algorithm", "eagle3"), "--algorithm eagle3 needs --draft-model"),
        ((*EAGLE3, "--algorithm", "none"), "is given with --algorithm none"),
        ((*EAGLE3, "--nccl", "NCCL_PROTO"), "'NCCL_PROTO' is not KEY=VALUE"),
        ((*EAGLE3, "--nccl", "1X=2"), "'1X' is not an environment variable name"),
        ((*EAGLE3, "--nccl", "A=1", "A=2"), "--nccl A is given twice"),
        ((*EAGLE3, "--nccl", "HF_TOKEN=x"), "HF_TOKEN looks like a secret"),
        ((*EAGLE3, "--steps", "17"), "--steps 17 must be 1 to 16"),
    ],
)
def test_bad_requests_exit_2_and_write_nothing(
    tmp_path: Path, args: tuple[str, ...], says: str
) -> None:
    code, _, err = run(*args)
    assert code == EXIT_USAGE
    assert says in err
    assert not (tmp_path / "perf_tests" / "test_perf.py").exists()


def test_the_recording_cost_counts_launches_per_profile_and_the_startup_timeouts() -> None:
    real = list(load_profiles(EXAMPLE).profiles.values())
    assert baseline_cost(real, None) == (
        "12 server launches (3 per profile x 4 profiles), each loading within its "
        "startup_timeout (1800 s): up to 6.0 h of loading, plus the runs"
    )
    assert baseline_cost(real[:1], 2).startswith("2 server launches (2 per profile x 1 profile)")
    simulated = list(load_profiles(EXAMPLE, target="sim").profiles.values())
    assert baseline_cost(simulated, None) == (
        "4 server launches (1 per profile x 4 profiles), each loading within its "
        "startup_timeout (60 s): up to 4 min of loading, plus the runs"
    )
    assert baseline_cost([real[0], simulated[1]], None).startswith(
        "4 server launches (3 x nospec-nccl, 1 x eagle3-5step), each loading within its "
        "startup_timeout (its own): up to 91 min"
    )


@pytest.mark.parametrize(
    ("extra", "tp_size", "launches"),
    [
        ((), 1, 1),
        (("--sim-launch-cv", "0.02"), 1, 3),
        (("--sim-noise-preset", "h200-tp1-eagle3-2step"), 8, 3),
        (("--sim-noise-preset=auto",), 1, 3),
        (("--sim-noise-preset", "auto"), 8, 1),
        (("--sim-noise-preset", "auto", "--disable-cuda-graph"), 1, 1),
        (("--sim-noise-preset", "none"), 1, 1),
    ],
)
def test_planned_launches_follow_the_simulators_launch_noise(
    extra: tuple[str, ...], tp_size: int, launches: int
) -> None:
    """A simulated profile is recorded over 3 launches where its launches vary: a launch CV, a
    measured noise preset, or ``auto`` where it applies (tp 1, CUDA graphs on)."""
    base = next(iter(load_profiles(EXAMPLE, target="sim").profiles.values()))
    profile = dataclasses.replace(base, tp_size=tp_size, extra_args=(*base.extra_args, *extra))
    assert planned_launches(profile, None) == launches
