"""The session's side of detection across nights (pytest_specdecode.session.cross_night): which
series a test has, tonight's night, what changed the night a drop began, the alarm's text."""

from __future__ import annotations

import math
import random
import statistics
from typing import Any

from pytest_specdecode.session.cross_night import (
    Tonight,
    alarm_message,
    cross_night,
    tonight_night,
    watched_metrics,
    what_changed,
)
from pytest_specdecode.stats.night_series import series_from_history
from pytest_specdecode.verdict import Threshold

TONIGHT = Tonight(
    test_id="perf/test_seed.py::test_eagle3",
    hardware_key="8xh200",
    fingerprint="fp",
    workload_hash="wl",
    when="2026-12-03T02:00:00Z",
    session="tonight",
)


def night(index: int, tok_s: float, **test_fields: Any) -> dict[str, Any]:
    test = {
        "test_id": TONIGHT.test_id,
        "profile": "eagle3",
        "outcome": "pass",
        "hardware_key": TONIGHT.hardware_key,
        "fingerprint": TONIGHT.fingerprint,
        "workload_hash": TONIGHT.workload_hash,
        "server_version": "0.5.15",
        "metrics": {"tok_s": {"n": 10, "mean": tok_s, "cv": 0.03}},
        "checks": [{"metric": "tok_s", "reference": None, "baseline_mean": 100.0}],
    }
    test.update(test_fields)
    return {
        "schema_version": 1,
        "time_utc": f"2026-11-{index:02d}T02:00:00Z",
        "run_id": f"night-{index}",
        "commit": f"c{index}",
        "plugin_version": "0.1.0",
        "gpu": {"names": ["H200"] * 8, "driver": "580.1"},
        "tests": [test],
    }


def test_a_test_watches_tok_s_accept_length_and_its_own_margins_only() -> None:
    samples = {"tok_s": [1.0], "accept_length": [2.0], "ttft": [0.1], "itl_p50": [0.01]}
    thresholds = [
        Threshold("ttft", 0.1),
        Threshold("itl_p50", -0.1, reference="nospec"),  # a claim about two profiles
    ]
    assert watched_metrics(samples, thresholds) == ["tok_s", "accept_length", "ttft"]
    assert watched_metrics({"tok_s": [1.0]}, []) == ["tok_s"]  # no accept length measured


def test_tonight_is_the_mean_of_its_runs_with_their_log_sd() -> None:
    tonight = tonight_night([90.0, 100.0, 110.0], TONIGHT)
    assert tonight.mean == 100.0
    assert tonight.runs == 3
    assert tonight.run_sd is not None
    assert math.isclose(tonight.run_sd, statistics.stdev([math.log(v) for v in (90, 100, 110)]))
    assert tonight.when == TONIGHT.when


def test_what_changed_names_the_fields_that_differ_from_the_night_before() -> None:
    history = [night(1, 100.0), night(2, 90.0, server_version="0.5.16")]
    history[1]["gpu"]["driver"] = "580.2"
    nights = series_from_history(
        history,
        test_id=TONIGHT.test_id,
        hardware_key=TONIGHT.hardware_key,
        fingerprint=TONIGHT.fingerprint,
        workload_hash=TONIGHT.workload_hash,
        metric="tok_s",
    )
    changed = what_changed(history, TONIGHT, nights, 1)
    assert "server version 0.5.15 -> 0.5.16" in changed
    assert "driver 580.1 -> 580.2" in changed
    assert "test repository commit c1 -> c2" in changed
    assert not any(item.startswith("GPUs") for item in changed)  # same GPUs
    assert what_changed(history, TONIGHT, nights, 0) == []  # nothing before the first night


def test_a_persistent_drop_raises_an_alarm_with_its_text_and_an_unchanged_series_does_not() -> None:
    rng = random.Random(7)
    steady = [night(i, 100.0 * math.exp(rng.gauss(0, 0.03))) for i in range(1, 26)]
    dropped = [
        night(i, (90.0 if i >= 20 else 100.0) * math.exp(rng.gauss(0, 0.03))) for i in range(1, 26)
    ]
    ok = cross_night(steady, TONIGHT, {"tok_s": [100.0] * 5}, [], reference_nights=15)
    assert [s.metric for s in ok] == ["tok_s"]
    assert ok[0].state.status == "watching"
    assert alarm_message(ok) is None

    states = cross_night(dropped, TONIGHT, {"tok_s": [90.0] * 5}, [], reference_nights=15)
    assert states[0].state.alarm
    text = alarm_message(states)
    assert text is not None
    assert text.startswith("cross-night alarm")
    assert "tok_s: cross-night scan" in text
    assert "--update-baselines" in text
    data = states[0].to_json()
    assert data["alarm"] is True
    assert data["start_session"] is not None


def test_a_recorded_baseline_restarts_the_reference() -> None:
    history = [night(i, 90.0 if i >= 20 else 100.0) for i in range(1, 26)]
    history.append(night(26, 90.0, outcome="recorded"))  # --update-baselines accepted the drop
    states = cross_night(history, TONIGHT, {"tok_s": [90.0] * 5}, [], reference_nights=15)
    assert states[0].state.status == "warming up"
    assert not states[0].state.alarm
