"""``python -m pytest_specdecode compare`` on reports that real pytest runs wrote (#25 item 4).

Three sessions of one suite on quiet simulated servers, each writing its JSON report: the
recording, a clean check, and a check with the server 30% slower (``SPECDECODE_SIM_SLOWDOWN``,
outside every fingerprint, as a slower SGLang build). ``compare`` then judges the saved runs in a
subprocess, as a user runs it, and must reach the verdicts the live runs reached.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from summary_table import summary_table

from tests.e2e.conftest import SLOW_QUIET_PROFILES

if TYPE_CHECKING:
    from conftest import Project

RECORD = ("--update-baselines", "--specdecode-baseline-runs", "6")
CHECK = ("--specdecode-runs", "4", "--specdecode-max-runs", "6")

SUITE = """
import pytest

@pytest.mark.specdecode("nospec", workload="steady", tok_s=-0.10)
def test_nospec_throughput():
    pass

@pytest.mark.specdecode("eagle3", workload="steady", accept_length=-0.10)
def test_eagle3_acceptance():
    pass
"""


def compare(*args: Path | str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_specdecode", "compare", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=os.environ.copy(),  # PYTHONPATH included: the package under test
        timeout=120,
    )


def rows(text: str) -> dict[str, str]:
    """Test name -> its table row."""
    return {
        line.split("|")[1].strip(): line
        for line in text.splitlines()
        if line.startswith("| test_") and "|" in line[1:]
    }


def test_compare_reaches_the_live_verdicts_on_saved_reports(quiet_project: Project) -> None:
    # At 5x: the unchanged check must PASS a -10% margin, and at 20x, where the client's share
    # of a run moves with the load, a clean-clone run measured it 6.8% under its recording
    # seconds before ([-10.1%, -3.5%]: INCONCLUSIVE).
    quiet_project.profiles(SLOW_QUIET_PROFILES)
    quiet_project.tests(SUITE)
    path = quiet_project.path
    old, same, slow = path / "old.json", path / "same.json", path / "slow.json"
    quiet_project.run(*RECORD, "--specdecode-report", str(old)).assert_outcomes(passed=2)
    quiet_project.run(*CHECK, "--specdecode-report", str(same)).assert_outcomes(passed=2)
    live = quiet_project.run_with_env(
        {"SPECDECODE_SIM_SLOWDOWN": "1.3"}, *CHECK, "--specdecode-report", str(slow)
    )
    live.assert_outcomes(passed=1, failed=1)
    assert summary_table(live)["test_nospec_throughput"]["verdict"] == "FAIL"

    # The recording against the clean check: the check's report carries the markers' margins.
    clean = compare(old, same, cwd=path)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert clean.stderr == ""
    assert "SIMULATED: these figures come from" in clean.stdout
    table = rows(clean.stdout)
    assert set(table) == {"test_nospec_throughput", "test_eagle3_acceptance"}
    assert all(row.rstrip(" |").endswith("PASS") for row in table.values())
    assert "compared: 2 pass" in clean.stdout

    # The recording against the slowed run: the same FAIL as live, exit status 1.
    failed = compare(old, slow, cwd=path)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    table = rows(failed.stdout)
    assert table["test_nospec_throughput"].rstrip(" |").endswith("FAIL")
    assert table["test_eagle3_acceptance"].rstrip(" |").endswith("PASS")
    assert f"output tok/s vs OLD ({old}): FAIL." in failed.stdout
    assert "margin -10.0%" in failed.stdout

    # The stored baseline files compare too (a directory of them as OLD).
    files = compare(path / "baselines", slow, cwd=path)
    assert files.returncode == 1, files.stdout + files.stderr
    assert rows(files.stdout)["test_nospec_throughput"].rstrip(" |").endswith("FAIL")

    usage = compare(old, path / "missing.json", cwd=path)
    assert usage.returncode == 2
    assert f"{path / 'missing.json'}: no such file or directory" in usage.stderr
