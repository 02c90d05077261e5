"""A failure found after its test had finished fails the session, in every report (#24).

With ``--update-baselines`` over several launches, a profile's later launches run after pytest
has reported its tests (passed, on the first launch), and the baselines are written at the very
end. The noise guard refusing launch 2, launch 2 failing to load, or a baseline that cannot be
written then fail the session: exit status 1, an ERROR of the test in pytest's summary and in
JUnit XML, the JSON report's ``late_failure`` and ``failed_after_tests``, and the Markdown
summary, so that no report says FAIL while pytest says passed.

Only the second launch is shaped, through the simulator's test knob
``SPECDECODE_SIM_LAUNCH_SCRIPT`` (one line of ``--sim-*`` flags per launch, in the order the
launches start): launch 1 and 3 have a run CV of about 2%, launch 2 a lognormal request noise of
CV 2.0 (a run CV of about 60% over 5 runs, seeded), far above the suite's guard of 30%.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jsonschema
import pytest

from pytest_specdecode.outputs.json_report import REPORT_SCHEMA_PATH

if TYPE_CHECKING:
    from conftest import Project

PROFILES = """
[defaults]
launcher = "sim"
model_path = "/models/tiny-llm"
startup_timeout = 30
warmup_requests = 1

[profiles.relaunched]
extra_args = ["--sim-speed", "20", "--sim-load-seconds", "0.2", "--sim-noise-cv", "0.02",
              "--sim-seed", "11"]

[workloads.steady]
prompt_set = "mixed"
max_new_tokens = 64
concurrency = 1
requests_per_run = 2
warmup_requests = 1
"""

TESTS = """
import pytest

@pytest.mark.specdecode("relaunched", workload="steady", tok_s=-0.05)
def test_first():
    pass

@pytest.mark.specdecode("relaunched", workload="steady", tok_s=-0.05)
def test_second():
    pass
"""

OUTPUTS = (
    "--junitxml=out/junit.xml",
    "--specdecode-report=out/report.json",
    "--specdecode-markdown=out/summary.md",
)
# Three launches asked for: a simulated server's launches do not vary by default (one launch).
RECORD = (
    "--update-baselines",
    "--specdecode-baseline-runs",
    "5",
    "--specdecode-baseline-launches",
    "3",
    *OUTPUTS,
)
TEST_IDS = ("test_perf.py::test_first", "test_perf.py::test_second")


def record_with_script(project: Project, lines: list[str], *args: str) -> pytest.RunResult:
    """``--update-baselines`` with one line of ``--sim-*`` flags per launch."""
    project.profiles(PROFILES)
    project.tests(TESTS)
    script = project.path / "launches.txt"
    script.write_text("".join(f"{line}\n" for line in lines))
    return project.run_with_env({"SPECDECODE_SIM_LAUNCH_SCRIPT": str(script)}, *RECORD, *args)


def junit_errors(path: Path) -> dict[str, str]:
    """Test name -> the message of its ``<error>`` element in pytest's JUnit XML."""
    root = ET.parse(path).getroot()
    (suite,) = root.iter("testsuite")
    errors = {}
    for case in suite.iter("testcase"):
        for error in case.iter("error"):
            errors[case.get("name", "").split("@")[0]] = error.get("message", "")
    assert suite.get("errors") == str(len(errors)), ET.tostring(suite, encoding="unicode")
    return errors


def report_of(project: Project) -> dict[str, Any]:
    report: dict[str, Any] = json.loads((project.path / "out" / "report.json").read_text())
    jsonschema.validate(report, json.loads(REPORT_SCHEMA_PATH.read_text()))
    return report


def assert_session_fails(
    project: Project, result: pytest.RunResult, reason: str, row: str
) -> dict[str, Any]:
    """Exit status 1 and every report names both tests and ``reason``; returns the report."""
    text = result.stdout.str()
    assert result.ret == 1, text
    result.assert_outcomes(passed=2, errors=2)
    for test in ("test_first", "test_second"):
        # pytest's own ERRORS section and short summary, then the plugin's section
        result.stdout.fnmatch_lines([f"*ERROR at teardown of {test}*", f"*{reason}*"])
        result.stdout.fnmatch_lines([f"ERROR test_perf.py::{test}* - relaunched: fail*"])
        result.stdout.fnmatch_lines([f"  test_perf.py::{test} [[]relaunched]: *{reason}*"])
    result.stdout.fnmatch_lines(["failed after the test had finished (2): the session fails*"])
    rows = [line for line in result.stdout.lines if line.startswith("| test_")]
    assert len(rows) == 2, rows
    assert all(row in line for line in rows), rows

    errors = junit_errors(project.path / "out" / "junit.xml")
    assert set(errors) == {"test_first", "test_second"}, errors
    assert all(reason in message for message in errors.values()), errors

    report = report_of(project)
    assert report["session"]["exit_status"] == 1
    late = {entry["test_id"]: entry["reason"] for entry in report["session"]["failed_after_tests"]}
    assert set(late) == set(TEST_IDS), late
    assert all(reason in text for text in late.values()), late
    for test in report["tests"]:
        assert reason in test["late_failure"], test["late_failure"]

    summary = (project.path / "out" / "summary.md").read_text()
    assert "**The session fails**: 2 failure(s) found after the test had finished" in summary
    section = summary[summary.index("### Failed after the test had finished") :]
    for test in ("test_first", "test_second"):
        assert f"- `{test}` (relaunched): " in section
    assert reason in section.replace("\\", "")
    return report


def test_the_noise_guard_refusing_launch_2_fails_the_session(project: Project) -> None:
    result = record_with_script(project, ["", "--sim-noise-cv 2.0", ""])
    reason = "in launch 2 of 3, above the limit of 30.0%"
    report = assert_session_fails(project, result, reason, "FAIL; fails the session")
    assert [t["launch_runs"] for t in report["tests"]] == [[5, 5, 5], [5, 5, 5]]
    assert {t["outcome"] for t in report["tests"]} == {"fail"}
    # launches 1 and 3 passed the guard: only the second is named
    assert "in launch 1 of 3" not in result.stdout.str()
    assert project.baseline_files() == []  # a refused baseline is not written


def test_a_failed_launch_2_fails_the_session_under_xdist_and_keeps_launch_1(
    project: Project,
) -> None:
    # JUnit XML with xdist: the controller writes it, from the workers' reports and results.
    result = record_with_script(project, ["", "--sim-fault exit-during-load"], "-n", "2")
    reason = "baseline launch 2 of 3 failed: server 'relaunched' exited"
    report = assert_session_fails(project, result, reason, "RECORDED; fails the session")
    # what launch 1 measured is kept: its baseline is written, and the session still fails
    assert [t["launch_runs"] for t in report["tests"]] == [[5], [5]]
    assert len(project.baseline_files()) == 2
    for test in report["tests"]:
        assert test["late_failure"].endswith("the baseline is recorded over 1 of 3 launches")


def test_a_baseline_that_cannot_be_written_fails_the_session(project: Project) -> None:
    # Where the hardware key's directory would go lies a file of the user's: the write fails.
    blocker = project.path / "baselines" / "simulated"
    blocker.parent.mkdir()
    blocker.write_text("the user's own file\n")
    result = record_with_script(project, [], "--specdecode-baseline-launches", "1")
    reason = "its baseline could not be written: could not write"
    report = assert_session_fails(project, result, reason, "ERROR: NotADirectoryError")
    assert blocker.read_text() == "the user's own file\n"  # nothing of the user's is lost
    for test in report["tests"]:
        assert test["outcome"] == "error"
        assert test["error"]["phase"] == "session end"
        assert test["runs"] == 5  # what was measured stays in the report
