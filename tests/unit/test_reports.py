"""The JSON report, JUnit properties and the Markdown summary, from realistic results."""

from __future__ import annotations

import copy
import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from reportdata import scaled, seed_json, seed_result, seed_results

from pytest_specdecode import __version__
from pytest_specdecode.outputs import terminal as report
from pytest_specdecode.outputs.json_report import (
    REPORT_SCHEMA_PATH,
    REPORT_SCHEMA_VERSION,
    build_report,
    junit_properties,
    make_session_info,
    write_report,
)
from pytest_specdecode.outputs.markdown import (
    TABLE_HEADERS,
    escape,
    markdown_summary,
    markdown_table,
    table_rows,
    write_markdown,
)
from pytest_specdecode.result import Outcome
from pytest_specdecode.result import SpecdecodeResult as Result

SESSION = {
    "started_utc": "2026-11-29T02:40:00Z",
    "finished_utc": "2026-11-29T03:00:00Z",
    "target": "sim",
    "pytest_args": ["perf_tests", "-m", "eagle3"],
    "exit_status": 1,
    "run_id": "20261129-024000-4739",
}


def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(REPORT_SCHEMA_PATH.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def with_changes(result: Result, **changes: Any) -> Result:
    data = copy.deepcopy(result.to_json())
    data.update(changes)
    return Result.from_json(data)


def no_baseline(result: Result) -> Result:
    """``result`` as a session without a stored baseline reports it."""
    problem = (
        f"no baseline for {result.test_id} on hardware 'simulated' (expected at "
        "baselines/simulated/x.json); record one with --update-baselines"
    )
    checks = [
        {
            "metric": c["metric"],
            "margin": c["margin"],
            "reference": c["reference"],
            "baseline_path": c["baseline_path"],
            "problem": problem,
            "verdict": None,
        }
        for c in result.checks
    ]
    return with_changes(
        result, checks=checks, outcome=Outcome.NO_BASELINE.value, message=f"output tok/s: {problem}"
    )


def mixed_results() -> list[Result]:
    """A nightly with every interesting outcome: pass, fail, inconclusive, no baseline."""
    nospec, five, five_nccl, two = seed_results()
    failing = scaled(two, 0.9)
    failing = with_changes(failing, message="output tok/s vs its own baseline: FAIL. ratio 0.900")
    return [nospec, failing, scaled(five, 0.97), no_baseline(five_nccl)]


def build(results: list[Result]) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(json.dumps(build_report(results, session_info=SESSION)))
    return document


# --------------------------------------------------------------------------- JSON report


def test_report_of_a_real_run_validates_against_its_schema() -> None:
    document = build(seed_results())
    errors = sorted(validator().iter_errors(document), key=str)
    assert not errors, [e.message for e in errors]
    assert document["schema_version"] == REPORT_SCHEMA_VERSION == 1
    assert document["simulated"] is True
    assert document["counts"]["total"] == 4
    assert document["counts"]["pass"] == 4


def test_report_of_every_outcome_validates_and_counts_them() -> None:
    document = build(mixed_results())
    errors = sorted(validator().iter_errors(document), key=str)
    assert not errors, [e.message for e in errors]
    counts = document["counts"]
    assert (counts["pass"], counts["fail"], counts["inconclusive"], counts["no baseline"]) == (
        1,
        1,
        1,
        1,
    )
    assert [t["outcome"] for t in document["tests"]] == [
        "pass",
        "fail",
        "inconclusive",
        "no baseline",
    ]


def test_the_schema_rejects_what_the_report_never_writes() -> None:
    check = validator()
    document = build(seed_results())
    broken = copy.deepcopy(document)
    broken["tests"][0]["outcome"] = "passed"
    assert not check.is_valid(broken)
    broken = copy.deepcopy(document)
    del broken["tests"][0]["samples"]
    assert not check.is_valid(broken)
    broken = copy.deepcopy(document)
    broken["schema_version"] = 2
    assert not check.is_valid(broken)


def test_report_keeps_everything_of_the_result_and_adds_a_summary() -> None:
    results = seed_results()
    document = build(results)
    for result, entry in zip(results, document["tests"], strict=True):
        original = json.loads(json.dumps(result.to_json()))
        for key, value in original.items():
            assert entry[key] == value, key
        assert entry["runs"] == result.runs
        for metric, values in result.samples.items():
            summary = entry["summary"][metric]
            assert summary["n"] == len(values)
            assert summary["mean"] == pytest.approx(statistics.fmean(values))
            assert summary["std"] == pytest.approx(statistics.stdev(values))
            mean, half = report.mean_ci(values)  # the terminal table's CI
            assert half is not None
            assert summary["ci95_low"] == pytest.approx(mean - half)
            assert summary["ci95_high"] == pytest.approx(mean + half)


def test_a_single_run_has_no_spread_rather_than_zero() -> None:
    one = seed_result("nospec-nccl")
    one = with_changes(one, samples={k: v[:1] for k, v in one.samples.items()})
    summary = build([one])["tests"][0]["summary"]["tok_s"]
    assert summary["n"] == 1
    assert summary["std"] is None
    assert summary["ci95_low"] is None
    assert validator().is_valid(build([one]))


def test_session_info_is_completed_from_the_results() -> None:
    session = build(seed_results())["session"]
    assert session["started_utc"] == "2026-11-29T02:40:00Z"
    assert session["plugin_version"] == __version__
    assert session["hardware_keys"] == ["simulated"]
    assert session["git"] == seed_json()[0]["provenance"]["git"]
    assert session["exit_status"] == 1
    assert session["run_id"] == "20261129-024000-4739"


def test_make_session_info_gives_what_build_report_needs() -> None:
    from datetime import datetime, timedelta, timezone

    start = datetime(2026, 11, 29, 2, 40, tzinfo=timezone.utc)
    info = make_session_info(
        started=start,
        finished=start + timedelta(minutes=20, seconds=1.5),
        target="real",
        pytest_args=["perf_tests"],
        exit_status=0,
        run_id="r1",
    )
    assert info["finished_utc"] == "2026-11-29T03:00:01Z"
    assert info["duration_s"] == 1201.5
    document = json.loads(json.dumps(build_report(seed_results(), session_info=info)))
    assert validator().is_valid(document)


def test_bad_session_times_and_args_are_named() -> None:
    with pytest.raises(ValueError, match=r"session_info\['finished_utc'\] = 'last night'"):
        build_report(seed_results(), session_info={**SESSION, "finished_utc": "last night"})
    with pytest.raises(ValueError, match=r"pytest_args.*must be a list"):
        build_report(seed_results(), session_info={**SESSION, "pytest_args": "perf_tests -x"})


def test_secrets_never_reach_the_report(tmp_path: Path) -> None:
    data = seed_json()[3]
    data["fingerprint"]["hard"]["extra_args"].append("--api-key sk-live-123")
    data["provenance"]["env"]["HF_TOKEN"] = "hf_secret_456"
    data["provenance"]["launch_argv"] = ["--served-model-name", "m", "--api-key", "sk-argv-789"]
    result = Result.from_json(data)
    info = {**SESSION, "pytest_args": ["perf_tests", "--hf-token", "hf_arg_000", "PASS=hunter2"]}
    path = tmp_path / "report.json"
    write_report(path, build_report([result], session_info=info))
    text = path.read_text(encoding="utf-8")
    for secret in ("sk-live-123", "hf_secret_456", "sk-argv-789", "hf_arg_000"):
        assert secret not in text
    document = json.loads(text)
    assert "--api-key <redacted>" in document["tests"][0]["fingerprint"]["hard"]["extra_args"]
    # The digest is the configuration's, computed before redaction, and speed settings survive.
    assert document["tests"][0]["fingerprint"]["digest"] == result.fingerprint.digest
    assert document["tests"][0]["hardware_key"] == "simulated"
    assert document["tests"][0]["fingerprint"]["hard"]["speculative_num_draft_tokens"] == 3


def test_write_report_is_atomic_and_strict_json(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "dir" / "report.json"
    document = build_report(seed_results(), session_info=SESSION)
    write_report(path, document)
    first = path.read_text(encoding="utf-8")
    assert json.loads(first)["counts"]["total"] == 4

    with pytest.raises(ValueError, match=r"report\.json is not JSON data"):
        write_report(path, {**document, "oops": object()})
    assert path.read_text(encoding="utf-8") == first  # the old report is intact
    assert sorted(p.name for p in path.parent.iterdir()) == ["report.json"]  # no temp file left

    write_report(path, {**document, "bad": [math.nan, math.inf]})
    assert json.loads(path.read_text(encoding="utf-8"))["bad"] == [None, None]


# --------------------------------------------------------------------------- JUnit


def test_junit_properties_of_a_speculative_test_against_another_profile() -> None:
    result = seed_result("eagle3-2step-nccl")
    props = junit_properties(result)
    names = [name for name, _ in props]
    assert len(names) == len(set(names))
    assert all(isinstance(value, str) for _, value in props)
    values = dict(props)
    assert values["specdecode_profile"] == "eagle3-2step-nccl"
    assert values["specdecode_outcome"] == "pass"
    assert values["specdecode_simulated"] == "true"
    assert values["specdecode_runs"] == str(result.runs)
    mean = statistics.fmean(result.samples["tok_s"])
    assert float(values["specdecode_tok_s_mean"]) == pytest.approx(mean, rel=1e-5)
    low, high = (float(v) for v in values["specdecode_tok_s_ci"].strip("[]").split(","))
    assert low < mean < high
    assert float(values["specdecode_accept_length_mean"]) == pytest.approx(
        statistics.fmean(result.samples["accept_length"]), rel=1e-5
    )
    own, accept, versus = result.checks
    assert float(values["specdecode_check_tok_s_ratio"]) == pytest.approx(own["ratio"], rel=1e-5)
    assert values["specdecode_check_tok_s_verdict"] == "pass"
    assert values["specdecode_check_accept_length_verdict"] == accept["verdict"]
    assert values["specdecode_check_tok_s_vs_nospec-nccl_margin"] == "+0.05"
    assert float(values["specdecode_check_tok_s_vs_nospec-nccl_ratio"]) == pytest.approx(
        versus["ratio"], rel=1e-5
    )
    assert values["specdecode_check_tok_s_vs_nospec-nccl_ci"].startswith("[1.05")


def test_junit_properties_of_a_failed_and_an_uncompared_test() -> None:
    failed = dict(junit_properties(scaled(seed_result("nospec-nccl"), 0.9)))
    assert failed["specdecode_outcome"] == "fail"
    assert failed["specdecode_check_tok_s_verdict"] == "fail"
    assert failed["specdecode_check_tok_s_ratio"] == "0.9"
    assert "specdecode_accept_length_mean" not in failed  # no speculation, no accept length

    missing = dict(junit_properties(no_baseline(seed_result("nospec-nccl"))))
    assert missing["specdecode_outcome"] == "no baseline"
    assert missing["specdecode_check_tok_s_verdict"] == "not compared"
    assert "record one with --update-baselines" in missing["specdecode_check_tok_s_problem"]
    assert "specdecode_check_tok_s_ratio" not in missing


# --------------------------------------------------------------------------- Markdown


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def test_markdown_table_has_the_terminal_tables_columns_and_cells() -> None:
    results = mixed_results()
    terminal = report.results_table(results)
    body = [line for line in terminal if line.startswith("|")]
    assert tuple(_cells(body[0])) == TABLE_HEADERS
    expected = [_cells(line) for line in body[2:]]
    assert [[cell.strip() for cell in row] for row in table_rows(results)] == expected
    markdown_lines = markdown_table(results).splitlines()
    assert tuple(_cells(markdown_lines[0])) == TABLE_HEADERS
    assert len(markdown_lines) == 2 + len(results)


def test_markdown_summary_details_what_failed_or_was_not_compared() -> None:
    results = mixed_results()
    text = markdown_summary(results, title="Nightly perf")
    assert text.startswith("## Nightly perf\n")
    assert "> [!WARNING]\n> SIMULATED: these figures come from" in text
    assert "**4 tests**: 1 pass, 1 fail, 1 inconclusive, 1 no baseline" in text
    details = text.split("### Failed, inconclusive or not compared", 1)[1]
    assert "`test_eagle3_2step_nccl_beats_no_speculation` (eagle3-2step-nccl): FAIL" in details
    assert "ratio 0.900" in details
    assert "`test_eagle3_5step_without_nccl_tuning` (eagle3-5step): INCONCLUSIVE" in details
    assert "`test_eagle3_5step_nccl_tuned` (eagle3-5step-nccl): NO BASELINE" in details
    assert "record one with --update-baselines" in details
    assert "test_no_speculation_nccl_tuned" not in details  # it passed


def test_markdown_without_simulated_results_has_no_simulated_label() -> None:
    real = [with_changes(r, simulated=False, hardware_key="8xH100") for r in seed_results()]
    text = markdown_summary(real)
    assert "SIMULATED" not in text
    assert "(simulated)" not in text
    assert "Failed, inconclusive" not in text  # all passed


def test_markdown_escapes_what_would_break_the_table() -> None:
    result = seed_result("nospec-nccl")
    odd = with_changes(
        result,
        test_id="perf_tests/test_x.py::test_x[a|b-*c*]",
        outcome="fail",
        message="tok/s <b>dropped</b> | see _log_",
    )
    text = markdown_summary([odd])
    table = [line for line in text.splitlines() if line.startswith("|")]
    # Every row still has the 7 columns: the | inside the test id is escaped.
    assert all(line.replace("\\|", "").count("|") == 8 for line in table)
    assert "| test_x[a\\|b-\\*c\\*] |" in text
    assert "tok/s \\<b\\>dropped\\</b\\> \\| see \\_log\\_" in text
    assert escape("test_eagle3_2step") == "test_eagle3_2step"  # intraword _ stays readable


def test_markdown_lists_warnings_of_passing_tests() -> None:
    result = with_changes(
        seed_result("nospec-nccl"), warnings=["SGLang version changed: baseline 0.5.5, now 0.5.6"]
    )
    text = markdown_summary([result])
    assert "### Warnings" in text
    assert "SGLang version changed: baseline 0.5.5, now 0.5.6" in text


def test_markdown_is_cut_below_githubs_limit() -> None:
    long_message = "output tok/s vs its own baseline: FAIL. " + "x" * 5000
    results = [
        with_changes(scaled(seed_result("nospec-nccl"), 0.9), message=long_message, test_id=f"t{i}")
        for i in range(50)
    ]
    text = markdown_summary(results, max_bytes=40_000)
    assert len(text.encode()) <= 40_000
    assert "Summary cut at 40000 bytes" in text
    rows = [line for line in text.splitlines() if re.match(r"\| t\d+ ", line)]
    assert len(rows) == 50  # the table is always complete


def test_markdown_of_an_empty_session() -> None:
    assert markdown_summary([]) == (
        "## pytest-specdecode\n\nNo specdecode test was measured in this session.\n"
    )


def test_write_markdown_appends_to_the_step_summary_and_overwrites_a_path(
    tmp_path: Path,
) -> None:
    summary = tmp_path / "step_summary.md"
    summary.write_text("## Build\n\nok\n", encoding="utf-8")
    write_markdown(summary, "## pytest-specdecode\n", append=True)
    write_markdown(summary, "## again", append=True)
    assert summary.read_text(encoding="utf-8") == (
        "## Build\n\nok\n\n## pytest-specdecode\n\n## again\n"
    )

    path = tmp_path / "out" / "summary.md"
    write_markdown(path, "first\n", append=False)
    write_markdown(path, "second\n", append=False)
    assert path.read_text(encoding="utf-8") == "second\n"

    fresh = tmp_path / "new" / "summary.md"
    write_markdown(fresh, "only\n", append=True)
    assert fresh.read_text(encoding="utf-8") == "only\n"
