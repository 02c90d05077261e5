"""A failure found after its test had finished, in every output (#24): the result carries it
(``late_failure``) through xdist's JSON, the report and its schema, the terminal's table and
section, the Markdown summary and the history. End to end: tests/e2e/test_failed_after_test_e2e.py.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import jsonschema
from reportdata import seed_result

from pytest_specdecode.outputs.history import HISTORY_SCHEMA_PATH, history_record
from pytest_specdecode.outputs.json_report import (
    REPORT_SCHEMA_PATH,
    build_report,
    make_session_info,
)
from pytest_specdecode.outputs.markdown import markdown_summary
from pytest_specdecode.outputs.terminal import failed_after_tests, results_table
from pytest_specdecode.result import Outcome, SpecdecodeResult, TestError
from pytest_specdecode.session.finish import late_failures

REFUSED = (
    "refusing to record a baseline: tok_s has a CV of 13.4% over 5 runs in launch 2 of 3, "
    "above the limit of 8.0%"
)


def refused_later(profile: str = "eagle3-2step-nccl") -> SpecdecodeResult:
    """A test pytest passed on launch 1 whose launch 2 the noise guard then refused."""
    result = seed_result(profile)
    result.outcome, result.message, result.checks = Outcome.FAIL, REFUSED, []
    result.late_failure = REFUSED
    return result


def not_written() -> SpecdecodeResult:
    result = seed_result("nospec-nccl")
    result.outcome = Outcome.ERROR
    result.error = TestError("session end", "PermissionError", "could not write b.json")
    result.late_failure = "its baseline could not be written: could not write b.json"
    result.checks = []
    return result


def session_info(results: list[SpecdecodeResult]) -> dict[str, Any]:
    return make_session_info(
        started=datetime(2026, 12, 1, 3, 0, tzinfo=timezone.utc),
        finished=datetime(2026, 12, 1, 3, 10, tzinfo=timezone.utc),
        target="sim",
        pytest_args=["--update-baselines"],
        exit_status=1,
        failed_after_tests=[(r.test_id, r.late_failure or "") for r in late_failures(results)],
    )


def test_the_late_failure_travels_with_the_result_and_old_results_still_load() -> None:
    result = refused_later()
    back = SpecdecodeResult.from_json(json.loads(json.dumps(result.to_json())))
    assert back.late_failure == REFUSED
    assert back == result
    old = seed_result().to_json()
    del old["late_failure"]  # a result of a worker of an older plugin version
    assert SpecdecodeResult.from_json(old).late_failure is None


def test_only_results_with_a_late_failure_fail_the_session() -> None:
    results = [seed_result("nospec-nccl"), refused_later()]
    assert late_failures(results) == [results[1]]
    assert late_failures([seed_result()]) == []


def test_the_report_names_each_late_failure_and_validates() -> None:
    results = [seed_result("eagle3-5step"), refused_later(), not_written()]
    report = build_report(results, session_info=session_info(results))
    validator = jsonschema.Draft202012Validator(json.loads(REPORT_SCHEMA_PATH.read_text()))
    validator.validate(report)
    assert report["session"]["exit_status"] == 1
    assert report["session"]["failed_after_tests"] == [
        {"test_id": results[1].test_id, "reason": REFUSED},
        {"test_id": results[2].test_id, "reason": results[2].late_failure},
    ]
    assert [t["late_failure"] for t in report["tests"]] == [None, REFUSED, results[2].late_failure]
    assert report["tests"][2]["error"]["phase"] == "session end"
    # a session without one has no such key (readers of older reports see nothing new)
    clean = build_report([seed_result()], session_info=session_info([seed_result()]))
    assert "failed_after_tests" not in clean["session"]


def test_the_history_accepts_an_error_at_the_session_end() -> None:
    results = [not_written()]
    record = history_record(results, session_info=session_info(results))
    jsonschema.Draft202012Validator(json.loads(HISTORY_SCHEMA_PATH.read_text())).validate(record)
    assert record["exit_status"] == 1


def test_the_terminal_says_the_session_fails_and_why() -> None:
    results = [seed_result("eagle3-5step"), refused_later()]
    table = "\n".join(results_table(results))
    assert "FAIL; fails the session (after the test)" in table
    assert table.count("fails the session") == 1
    lines = failed_after_tests(results)
    assert lines[0].startswith("failed after the test had finished (1): the session fails")
    assert lines[1] == f"  {results[1].test_id} [eagle3-2step-nccl]: {REFUSED}"
    assert failed_after_tests([seed_result()]) == []


def test_the_markdown_summary_puts_late_failures_first() -> None:
    results = [seed_result("eagle3-5step"), refused_later(), not_written()]
    text = markdown_summary(results)
    assert "**The session fails**: 2 failure(s) found after the test had finished" in text
    late = text.index("### Failed after the test had finished")
    assert late < text.index("### Errored or crashed")
    section = text[late : text.index("### Errored or crashed")]
    assert "(eagle3-2step-nccl): refusing to record a baseline" in section
    assert "its baseline could not be written" in section
    assert "The session fails" not in markdown_summary([seed_result()])
