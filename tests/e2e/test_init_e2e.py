"""``python -m pytest_specdecode init`` as a new user runs it (#25 item 3): the suite it writes
records its baseline and passes against it, on the simulated server, with nothing edited.

Every command is a subprocess in a fresh directory: ``init``, then ``pytest perf_tests
--update-baselines``, then ``pytest perf_tests``. The simulated server's run-to-run noise is
turned off with ``SPECDECODE_SIM_NOISE_CV`` (outside the profile file and every fingerprint),
so the check's verdict depends on the suite, not on luck.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import sim_pids_with_env

MODEL = ("--model", "/models/llama-3.1-8b", "--draft-model", "/models/llama-3.1-8b-eagle3")


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    state_dir = tmp_path / "state"
    env = {
        **os.environ,  # PYTHONPATH included: the package under test
        "PYTEST_SPECDECODE_STATE_DIR": str(state_dir),
        "SPECDECODE_SIM_NOISE_CV": "0",
    }
    env.pop("PYTEST_ADDOPTS", None)
    yield tmp_path, env
    for pid in sim_pids_with_env("PYTEST_SPECDECODE_STATE_DIR", str(state_dir)):
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def sh(cwd: Path, env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.quiet_machine  # records a baseline, then must PASS against it
def test_the_written_suite_records_its_baseline_and_passes(
    fresh: tuple[Path, dict[str, str]],
) -> None:
    root, env = fresh
    init = sh(
        root, env, "pytest_specdecode", "init", *MODEL, "--tp", "8", "--nccl", "NCCL_PROTO=LL"
    )
    assert init.returncode == 0, init.stderr
    quick = ("-p", "no:cacheprovider", "--specdecode-target", "sim")

    recorded = sh(
        root, env, "pytest", "perf_tests", *quick, "--update-baselines",
        "--specdecode-baseline-runs", "8",
    )  # fmt: skip
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    out = recorded.stdout
    assert "1 passed" in out
    assert "RECORDED" in out
    # The header states what recording costs before any server starts.
    assert (
        "specdecode: recording cost if every profile is selected: 1 server launch (1 per profile "
        "x 1 profile), each loading within its startup_timeout (60 s): up to 60 s of loading, "
        "plus the runs"
    ) in out
    assert out.index("recording cost") < out.index("collected 1 item")
    baseline = root / "baselines" / "simulated" / "perf_tests" / "test_perf"
    assert (baseline / "test_eagle3_2step_nccl.json").is_file()

    checked = sh(
        root, env, "pytest", "perf_tests", *quick, "--specdecode-on-missing-baseline", "fail"
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "1 passed" in checked.stdout
    row = next(line for line in checked.stdout.splitlines() if "| test_eagle3_2step_nccl" in line)
    assert "eagle3-2step-nccl (simulated)" in row
    assert row.rstrip(" |").endswith("PASS")

    again = sh(root, env, "pytest_specdecode", "init", *MODEL)
    assert again.returncode == 2
    assert "already exist; init never overwrites a file" in again.stderr


def test_a_suite_in_another_directory_is_found_through_its_ini(
    fresh: tuple[Path, dict[str, str]],
) -> None:
    root, env = fresh
    init = sh(root, env, "pytest_specdecode", "init", "bench/perf", "--model", "/models/m")
    assert init.returncode == 0, init.stderr
    collected = sh(root, env, "pytest", "bench/perf", "--collect-only", "-p", "no:cacheprovider")
    assert collected.returncode == 0, collected.stdout + collected.stderr
    suite = root / "bench" / "perf"
    assert f"specdecode: profiles {suite}/specdecode.toml (ini key" in collected.stdout
    assert f"baselines {suite}/baselines" in collected.stdout
    assert "<Function test_nospec>" in collected.stdout
