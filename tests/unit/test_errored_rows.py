"""A test that errored or crashed is a row of every output, with its cause, and never reads as
a verdict (#12, item 3): the JSON report, JUnit properties, history, Markdown summary, terminal
table and trend."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from reportdata import errored, night, seed_result

from pytest_specdecode.outputs.history import (
    HISTORY_SCHEMA_PATH,
    HistoryError,
    history_record,
    parse_record,
)
from pytest_specdecode.outputs.json_report import (
    REPORT_SCHEMA_PATH,
    build_report,
    junit_properties,
)
from pytest_specdecode.outputs.markdown import markdown_summary
from pytest_specdecode.outputs.terminal import details, results_table
from pytest_specdecode.outputs.trend import format_table, trend
from pytest_specdecode.result import Outcome, SpecdecodeResult, TestError

SESSION = {
    "started_utc": "2026-11-07T02:40:00Z",
    "finished_utc": "2026-11-07T03:00:00Z",
    "target": "sim",
    "pytest_args": ["perf_tests"],
    "exit_status": 1,
    "run_id": "night-7",
}
CRASH = TestError(
    phase="call",
    type="ServerCrashedError",
    cause="server 'eagle3-2step-nccl' died during run 2 (exit code -9); " + "x" * 120,
)


def crashed(profile: str = "eagle3-2step-nccl", error: TestError = CRASH) -> SpecdecodeResult:
    return errored(profile, error)


def schema(path: Any) -> jsonschema.Draft202012Validator:
    document = json.loads(path.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(document)
    return jsonschema.Draft202012Validator(document)


def test_an_errored_result_travels_as_json_and_carries_its_cause() -> None:
    result = crashed()
    assert result.outcome is Outcome.ERROR
    assert (result.samples, result.checks, result.runs) == ({}, [], 0)
    assert result.message.startswith("ServerCrashedError in call: server 'eagle3-2step-nccl'")
    back = SpecdecodeResult.from_json(json.loads(json.dumps(result.to_json())))
    assert back == result
    # results written before the field existed still load
    old = seed_result().to_json()
    del old["error"]
    assert SpecdecodeResult.from_json(old).error is None


def test_the_cause_is_the_first_line_of_the_message() -> None:
    error = TestError.of("setup", RuntimeError("server 'x' exited with code 1\nlog tail\n..."))
    assert error == TestError("setup", "RuntimeError", "server 'x' exited with code 1")
    assert TestError.of("call", AssertionError()).cause == ""


def test_the_report_counts_errors_apart_from_verdicts_and_validates() -> None:
    results = [seed_result("nospec-nccl"), crashed()]
    report = build_report(results, session_info=SESSION)
    schema(REPORT_SCHEMA_PATH).validate(report)
    assert report["counts"]["total"] == 2
    assert report["counts"]["error"] == 1
    assert report["counts"]["pass"] == 1
    assert report["counts"]["inconclusive"] == 0
    row = report["tests"][1]
    assert row["outcome"] == "error"
    assert row["error"] == {"phase": "call", "type": "ServerCrashedError", "cause": CRASH.cause}
    assert row["summary"] == {}
    assert report["tests"][0]["error"] is None


def test_junit_properties_name_the_error() -> None:
    props = dict(junit_properties(crashed()))
    assert props["specdecode_outcome"] == "error"
    assert props["specdecode_runs"] == "0"
    assert props["specdecode_error"] == CRASH.describe()


def test_the_history_keeps_the_error_and_reads_it_back() -> None:
    record = history_record([seed_result("nospec-nccl"), crashed()], session_info=SESSION)
    schema(HISTORY_SCHEMA_PATH).validate(record)
    line = json.dumps(record)
    tests = parse_record(line, where="h:1")["tests"]
    assert [t["outcome"] for t in tests] == ["pass", "error"]
    assert tests[1]["error"]["type"] == "ServerCrashedError"
    assert tests[0]["error"] is None


def test_a_history_line_with_a_malformed_error_is_named() -> None:
    record = history_record([crashed()], session_info=SESSION)
    record["tests"][0]["error"] = "crashed"
    with pytest.raises(HistoryError, match=r"h:3: tests\[0\]\.error must be null or an object"):
        parse_record(json.dumps(record), where="h:3")


def test_markdown_counts_the_error_and_gives_its_cause_first() -> None:
    text = markdown_summary([seed_result("nospec-nccl"), crashed()])
    assert "**2 tests**: 1 pass, 1 error" in text
    assert "inconclusive" not in text.split("###")[0]
    errored = text.index("### Errored or crashed")
    assert text.index(CRASH.cause) > errored  # the table has it shortened, the section whole


def test_the_terminal_row_says_error_with_a_shortened_cause_and_details_have_it_all() -> None:
    lines = results_table([crashed()])
    row = next(line for line in lines if line.startswith("| test_"))
    verdict = row.split("|")[7].strip()
    assert verdict.startswith("ERROR: ServerCrashedError in call: server 'eagle3-2step-nccl'")
    assert verdict.endswith("...")
    assert len(verdict) <= len("ERROR: ") + 80
    assert any(CRASH.cause in line for line in details([crashed()]))


def test_a_verdict_keeps_its_outcome_when_the_test_errored_afterwards() -> None:
    result = seed_result("nospec-nccl")
    result.error = TestError("teardown", "OSError", "could not remove the log")
    row = next(line for line in results_table([result]) if line.startswith("| test_"))
    assert "PASS; then OSError in teardown" in row
    assert "then errored: OSError in teardown: could not remove the log" in "\n".join(
        details([result])
    )
    assert build_report([result], session_info=SESSION)["counts"]["pass"] == 1


def test_a_night_whose_server_crashed_is_visible_in_the_trend() -> None:
    records = [night(day) for day in range(1, 4)]
    records.append(history_record([crashed()], session_info=SESSION))
    table = trend(records)
    assert table.errored_sessions == 1
    (row,) = [r for r in table.rows if r.profile == "eagle3-2step-nccl"]
    assert [p.outcome for p in row.points][-1] == "error"
    assert row.status.startswith("ERROR in the latest session: ServerCrashedError in call: ")
    text = "\n".join(format_table(table))
    assert "| PPPE " in text
    assert "4 session(s), 1 with tests that errored or crashed" in text
    assert "E error" in text  # the legend
    errors = text.split("\nerrors:\n", 1)[1]
    assert f"2026-11-07 03:00: ServerCrashedError in call: {CRASH.cause}" in errors


def test_an_error_neither_extends_nor_breaks_a_regression() -> None:
    slow = {"eagle3-2step-nccl": 0.9}
    records = [night(1, slow), history_record([crashed()], session_info=SESSION)]
    records[1]["time_utc"] = "2026-11-02T03:00:00Z"
    records.append(night(3, slow))
    (row,) = [r for r in trend(records).rows if r.profile == "eagle3-2step-nccl"]
    assert row.regressed  # two judged bad nights in a row; the crash between is not a judgement
