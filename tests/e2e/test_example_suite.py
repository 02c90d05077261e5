"""The shipped example suite, run the way the README says: ``pytest perf_tests`` from the
repository root, against the committed (simulated) baselines, without a GPU.

Nothing changed since the baselines were recorded, so every check must hold (PASS, or
INCONCLUSIVE: xfail by default), but for one: the seed's claim "+5% over no speculation" sits so
close to the simulated +5.5-6% that a machine slower than the one that recorded the baselines
can FAIL it by a near miss (tests/shipped_suite.py says how near). The committed baselines are
only read. This takes about a minute and a half (four simulated servers at 10x the seed's speed,
500-token requests).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from shipped_suite import near_misses, snapshot

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.quiet_machine  # the borderline claim: tests/conftest.py says why
def test_pytest_perf_tests_passes_against_the_committed_baselines(tmp_path: Path) -> None:
    if not (REPO / "perf_tests" / "test_seed.py").exists():
        pytest.skip("not run from a checkout with perf_tests/")
    baselines = REPO / "baselines"
    before = snapshot(baselines)
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("PYTEST_", "SPECDECODE_SIM_"))
    }
    env["PYTEST_SPECDECODE_STATE_DIR"] = str(tmp_path / "state")
    env["PYTEST_SPECDECODE_REPORT"] = str(tmp_path / "report.json")
    command = [sys.executable, "-m", "pytest", "perf_tests", "-p", "no:cacheprovider", "-rA"]
    result = subprocess.run(
        [*command, "--basetemp", str(tmp_path / "basetemp")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    out = result.stdout
    assert (tmp_path / "report.json").is_file(), out + result.stderr
    missed = near_misses(tmp_path / "report.json")  # every other check held
    assert result.returncode == (1 if missed else 0), out + result.stderr
    assert (" 1 failed" in out.splitlines()[-1]) == bool(missed), out
    assert "SIMULATED: these figures come from pytest-specdecode's simulated SGLang server" in out
    for test in (
        "test_no_speculation_nccl_tuned",
        "test_eagle3_5step_without_nccl_tuning",
        "test_eagle3_5step_nccl_tuned",
        "test_eagle3_2step_nccl_beats_no_speculation",
    ):
        row = next((line for line in out.splitlines() if line.startswith(f"| {test} ")), None)
        assert row is not None, out
        verdict = row.strip("|").split("|")[-1].strip()
        near_miss = missed and test == "test_eagle3_2step_nccl_beats_no_speculation"
        assert verdict.split(";")[0] in (("FAIL",) if near_miss else ("PASS", "INCONCLUSIVE")), row
        assert "(simulated)" in row
    assert snapshot(baselines) == before  # read, never written
