"""What a newcomer meets (#13): a run without an ini file from inside ``perf_tests/``, attaching
to a simulated server without naming the target, and ``against=`` a profile whose baseline no
test of the session records. Each is a real pytest subprocess against simulated servers."""

from __future__ import annotations

import os
import signal
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from hand_started import EAGLE3, hand_started_sim

from tests.e2e.conftest import QUIET_PROFILES, Project, sim_pids_with_env

RUNS = ("--specdecode-runs", "3", "--specdecode-max-runs", "3")
RECORD = ("--update-baselines", "--specdecode-baseline-runs", "3", "--specdecode-force-baseline")

SUITE = """
import pytest

@pytest.mark.specdecode("nospec", workload="fast", tok_s=-0.5)
def test_nospec():
    pass
"""


@pytest.fixture
def bare(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Iterator[Project]:
    """A project without an ini file: ``perf_tests/specdecode.toml`` and a test beside it."""
    state_dir = pytester.path / "state"
    monkeypatch.setenv("PYTEST_SPECDECODE_STATE_DIR", str(state_dir))
    (pytester.path / "perf_tests").mkdir()
    (pytester.path / "perf_tests" / "specdecode.toml").write_text(textwrap.dedent(QUIET_PROFILES))
    (pytester.path / "perf_tests" / "test_perf.py").write_text(textwrap.dedent(SUITE))
    yield Project(pytester, state_dir)
    for pid in sim_pids_with_env("PYTEST_SPECDECODE_STATE_DIR", str(state_dir)):
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def header(result: pytest.RunResult) -> str:
    (line,) = [line for line in result.outlines if line.startswith("specdecode: profiles ")]
    return line


def test_without_an_ini_file_the_paths_do_not_move_with_the_directory(
    bare: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = bare.path
    recorded = bare.run("perf_tests", *RECORD)
    recorded.assert_outcomes(passed=1)
    assert f"specdecode: profiles {root}/perf_tests/specdecode.toml (the default)" in header(
        recorded
    )
    baseline = root / "baselines" / "simulated" / "perf_tests" / "test_perf" / "test_nospec.json"
    assert baseline.is_file(), sorted(root.rglob("*.json"))

    # From inside perf_tests/ pytest's rootdir is perf_tests/ itself: the same profile file,
    # the same baselines and the same test id (so the baseline above is found).
    monkeypatch.chdir(root / "perf_tests")
    checked = bare.run(*RUNS)
    checked.assert_outcomes(passed=1)
    line = header(checked)
    assert f"profiles {root}/perf_tests/specdecode.toml (the default, found above the rootdir" in (
        line
    )
    assert f"baselines {root}/baselines" in line
    assert not (root / "perf_tests" / "baselines").exists()
    assert "PASS" in checked.stdout.str()


# -- attaching to a simulated server without --specdecode-target -----------------------------

ATTACH_PROFILES = """
[defaults]
launcher = "sglang"
tp_size = 8
model_path = "/models/tiny-llm"
warmup_requests = 1
startup_timeout = 30

[profiles.eagle3]
extra_args = ["--disable-custom-all-reduce"]
speculative.algorithm = "EAGLE3"
speculative.draft_model_path = "/models/tiny-eagle3"
speculative.num_steps = 2
speculative.eagle_topk = 1
speculative.num_draft_tokens = 3

[targets.sim]
launcher = "sim"
gpus = []
extra_args = ["--sim-speed", "50", "--sim-load-seconds", "0.2", "--sim-seed", "1"]

[workloads.fast]
prompt_set = "mixed"
max_new_tokens = 64
concurrency = 1
requests_per_run = 2
warmup_requests = 1
"""


@pytest.fixture
def attached_sim(tmp_path: Path) -> Iterator[str]:
    """A simulated server run by hand, as the sim target of ATTACH_PROFILES would run it."""
    with hand_started_sim(*EAGLE3, log=tmp_path / "server.log") as (port, _):
        yield f"127.0.0.1:{port}"


def test_attach_to_a_simulated_server_picks_the_sim_target(
    project: Project, attached_sim: str
) -> None:
    project.profiles(ATTACH_PROFILES)
    project.tests(
        """
        import pytest

        @pytest.mark.specdecode("eagle3", workload="fast", tok_s=-0.5)
        def test_attached(): pass
        """
    )
    # The baseline is recorded on the simulated server through the sim target...
    recorded = project.run("--server-host", attached_sim, "--specdecode-target", "sim", *RECORD)
    recorded.assert_outcomes(passed=1)
    # ...and checked without naming the target: the server says it is simulated.
    checked = project.run("--server-host", attached_sim, *RUNS)
    # Compared, not refused as a mismatch or a missing baseline. Whether three runs of 64-token
    # requests at the sim's speed decide it is the load's business: a busy worker once made one
    # run twice as slow (CV 42%) and the verdict INCONCLUSIVE (an xfail).
    outcomes = checked.parseoutcomes()
    assert outcomes.get("passed", 0) + outcomes.get("xfailed", 0) == 1, outcomes
    if outcomes.get("xfailed"):
        assert "output tok/s vs its own baseline: INCONCLUSIVE." in checked.stdout.str()
    line = header(checked)
    assert f'target sim (the server at http://{attached_sim} reports "simulated": true)' in line
    assert "mismatch" not in checked.stdout.str().lower()


# -- against= another profile, and a changed workload, said before measuring ---------------

AGAINST_SUITE = """
import pytest

@pytest.mark.specdecode("nospec", workload="fast", tok_s=-0.5)
def test_nospec():
    pass

@pytest.mark.specdecode("eagle3", workload="fast", tok_s=-0.5, against={"nospec": {"tok_s": -0.5}})
def test_eagle3():
    pass
"""


def test_against_names_the_test_that_records_the_other_baseline(quiet_project: Project) -> None:
    quiet_project.tests(AGAINST_SUITE)
    quiet_project.run("-k", "eagle3", *RECORD).assert_outcomes(passed=1)

    checked = quiet_project.run("-k", "eagle3", "-rs", *RUNS)
    checked.assert_outcomes(skipped=1)
    out = checked.stdout.str()
    # Said before the runs, as a line of its own...
    assert (
        "specdecode: test_perf.py::test_eagle3: nospec's baseline cannot be compared: no stored "
        "baseline of profile 'nospec'" in out
    )
    # ...and in the skip reason, naming the test that would record it.
    assert "test_perf.py::test_nospec would record it but is not selected" in out
    assert "pytest --update-baselines test_perf.py::test_nospec" in out

    # Without any test of that profile collected, the message says what to add.
    only = quiet_project.run("test_perf.py::test_eagle3", "-rs", *RUNS)
    only.assert_outcomes(skipped=1)
    assert (
        "no collected test measures profile 'nospec': add a test marked "
        "@pytest.mark.specdecode('nospec', workload='fast') and record it with "
        "--update-baselines" in only.stdout.str()
    )


def test_a_changed_workload_is_named_by_its_field_before_measuring(quiet_project: Project) -> None:
    quiet_project.tests(SUITE)
    quiet_project.run(*RECORD).assert_outcomes(passed=1)
    profiles = quiet_project.path / "specdecode.toml"
    text = profiles.read_text()
    start = text.index("[workloads.fast]")
    block = text[start:].replace("max_new_tokens = 64", "max_new_tokens = 48", 1)
    profiles.write_text(text[:start] + block)

    changed = quiet_project.run(*RUNS)
    changed.assert_outcomes(failed=1)
    out = changed.stdout.str()
    assert "specdecode: test_perf.py::test_nospec: its own baseline cannot be compared:" in out
    assert "max_new_tokens was 64, now 48" in out
