"""One detector, wherever it is read: ``report`` and the dashboard judge a history with the
settings its own sessions recorded (issue 44, item 6), not with their defaults.

``tests/e2e/data/sim-40-nights.jsonl`` was written by 40 nightly sessions through pytest and the
simulated server with a 15-night reference (``bench_nightly.py --e2e``, before issue 44); its
sessions were in alarm from night 25 and the last 16 FAILed. It used to read as "warming up
(40/90) ... status ok" in ``report`` and on the dashboard, beside a red "fail" verdict."""

from __future__ import annotations

import io
from pathlib import Path

from pytest_specdecode.__main__ import EXIT_REGRESSION, main
from pytest_specdecode.outputs.dashboard.model import build_model
from pytest_specdecode.outputs.history import read_history
from pytest_specdecode.outputs.trend import recorded_config, trend

HISTORY_40 = Path(__file__).parents[1] / "e2e" / "data" / "sim-40-nights.jsonl"


def test_the_sessions_settings_travel_with_the_history() -> None:
    records = read_history(HISTORY_40)
    (test,) = records[-1]["tests"]
    assert test["crossnight"]["tok_s"]["reference_nights"] == 15  # what the sessions used
    assert recorded_config(records, test, "tok_s").reference_nights == 15


def test_report_and_dashboard_agree_with_the_sessions_that_alarmed() -> None:
    records = read_history(HISTORY_40)
    (last,) = records[-1]["tests"]
    assert last["outcome"] == "fail"
    assert last["crossnight"]["tok_s"]["alarm"] is True  # as the session saw it

    out = io.StringIO()
    assert main(["report", str(HISTORY_40)], out=out, err=io.StringIO()) == EXIT_REGRESSION
    assert "warming up" not in out.getvalue()
    assert "REGRESSION across nights: tok_s" in out.getvalue()

    (row,) = trend(records).rows
    (tok_s,) = [d for d in row.detections if d.metric == "tok_s"]
    assert tok_s.state.alarm
    assert tok_s.state.reference_nights == 15

    (series,) = build_model(records)["series"]
    (detector,) = [d for d in series["detector"] if d["metric"] == "tok_s"]
    assert detector["status"] == "alarm"
    assert "regression of" in detector["text"]


def test_a_given_reference_overrides_what_the_sessions_recorded() -> None:
    records = read_history(HISTORY_40)
    (row,) = trend(records, reference_nights=30).rows
    assert {d.state.reference_nights for d in row.detections} == {30}
