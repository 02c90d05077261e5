"""``python -m pytest_specdecode acknowledge``: a change accepted as the new normal, written to the
history without a launch, restarts the cross-night level of the series it names (and of no
other), keeps the night SD, and every reader of the history sees it."""

from __future__ import annotations

import io
import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from pytest_specdecode.__main__ import EXIT_OK, EXIT_REGRESSION, EXIT_USAGE, main
from pytest_specdecode.outputs.history import parse_record, read_history
from pytest_specdecode.outputs.trend import trend
from pytest_specdecode.stats.crossnight import detect
from pytest_specdecode.stats.night_series import series_from_history

TEST = "perf/test_seed.py::test_eagle3"
KEY = {"test_id": TEST, "hardware_key": "8xh200", "fingerprint": "fp", "workload_hash": "wl"}


def night(day: int, tok_s: float) -> dict[str, Any]:
    """Night ``day``: days 1-24 in November 2026, later ones after the acknowledgement (which
    is written at the present time) in 2027."""
    when = f"2026-11-{day:02d}T02:00:00Z" if day <= 24 else f"2027-01-{day - 24:02d}T02:00:00Z"
    return {
        "schema_version": 1, "time_utc": when, "started_utc": None,
        "run_id": f"night-{day}", "commit": None, "dirty": None, "plugin_version": "0.1.0",
        "target": "real", "hardware_keys": ["8xh200"], "gpu": None, "exit_status": 0,
        "simulated": False,
        "tests": [{**KEY, "profile": "eagle3", "outcome": "pass", "simulated": False,
                   "server_version": "0.5.15", "runs": 10,
                   "metrics": {"tok_s": {"n": 10, "mean": tok_s, "cv": 0.03},
                               "accept_length": {"n": 10, "mean": 2.0, "cv": 0.01}},
                   "checks": [{"metric": "tok_s", "reference": None, "baseline_mean": 100.0}]}],
    }  # fmt: skip


def history_file(tmp_path: Path, days: int, drop_from: int) -> Path:
    rng = random.Random(44)
    path = tmp_path / "history.jsonl"
    lines = [
        night(day, (88.0 if day >= drop_from else 100.0) * math.exp(rng.gauss(0, 0.02)))
        for day in range(1, days + 1)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def run(*args: object) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main([str(a) for a in args], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def tok_s_state(path: Path) -> Any:
    nights = series_from_history(read_history(path), metric="tok_s", **KEY)
    return detect(nights)


def test_acknowledging_an_alarm_restarts_the_level_and_keeps_the_noise(tmp_path: Path) -> None:
    path = history_file(tmp_path, 24, drop_from=16)
    assert tok_s_state(path).alarm  # a 12 % drop from night 16
    code, _, _ = run("report", path)
    assert code == EXIT_REGRESSION

    code, out, err = run("acknowledge", path, "--test", TEST, "--by", "ana", "--why",
                         "the slower draft model is kept")  # fmt: skip
    assert code == EXIT_OK, err
    assert "acknowledged in" in out
    assert "ana: the slower draft model is kept" in out
    assert f"{TEST} on 8xh200 (tok_s)" in out
    assert f"{TEST} on 8xh200 (accept_length)" in out
    assert "--update-baselines" in out  # the gate still compares with the stored baseline
    line = read_history(path)[-1]
    assert line["tests"] == []
    assert line["acknowledgements"] == [
        {"test_id": TEST, "hardware_key": None, "metric": None, "by": "ana",
         "why": "the slower draft model is kept"}
    ]  # fmt: skip
    parse_record(json.dumps(line), where="the acknowledge line")  # a valid history line

    state = tok_s_state(path)  # no night since: nothing to judge yet, and no alarm
    assert not state.alarm
    assert state.status == "warming up"
    with path.open("a") as handle:  # two more nights of the slower build
        for day in (25, 26, 27):
            handle.write(json.dumps(night(day, 88.0 * (1 + 0.01 * (day % 2)))) + "\n")
    state = tok_s_state(path)
    assert state.status == "watching"
    assert not state.alarm
    assert state.opened_by is not None
    assert state.opened_by.startswith("acknowledged by ana")
    assert "carried over" in state.sigma_source  # the noise of the nights before it
    code, out, _ = run("report", path)
    assert code == EXIT_OK, out  # the trend command reads the acknowledgement too
    row = trend(read_history(path)).rows[0]
    assert not any(d.state.alarm for d in row.detections)


def test_an_acknowledgement_for_another_key_or_metric_restarts_nothing_else(
    tmp_path: Path,
) -> None:
    path = history_file(tmp_path, 24, drop_from=16)
    code, _, err = run("acknowledge", path, "--test", TEST, "--metric", "accept_length",
                       "--why", "x", "--by", "b")  # fmt: skip
    assert code == EXIT_OK, err
    assert tok_s_state(path).alarm  # tok/s was not acknowledged


def test_a_test_that_is_not_in_the_history_is_refused_with_the_ones_that_are(
    tmp_path: Path,
) -> None:
    path = history_file(tmp_path, 5, drop_from=99)
    before = path.read_bytes()
    code, _, err = run("acknowledge", path, "--test", "perf/test_seed.py::test_eagle",
                       "--by", "ana", "--why", "typo")  # fmt: skip
    assert code == EXIT_USAGE
    assert "no night in" in err
    assert "did you mean perf/test_seed.py::test_eagle3" in err
    assert path.read_bytes() == before  # nothing written
    code, _, err = run("acknowledge", path, "--test", TEST, "--by", " ", "--why", "x")
    assert code == EXIT_USAGE
    assert "--by is empty" in err
    code, _, err = run("acknowledge", path, "--test", TEST)
    assert code == EXIT_USAGE  # --why is required
    assert path.read_bytes() == before


def test_every_test_can_be_acknowledged_at_once(tmp_path: Path) -> None:
    path = history_file(tmp_path, 24, drop_from=16)
    code, out, _ = run("acknowledge", path, "--test", "*", "--by", "ana", "--why", "new box")
    assert code == EXIT_OK
    assert TEST in out


@pytest.mark.parametrize("last", [3, 30])
def test_report_last_keeps_the_acknowledgement(tmp_path: Path, last: int) -> None:
    path = history_file(tmp_path, 24, drop_from=16)
    run("acknowledge", path, "--test", TEST, "--by", "ana", "--why", "kept")
    with path.open("a") as handle:
        for day in (25, 26, 27):
            handle.write(json.dumps(night(day, 88.0)) + "\n")
    code, out, _ = run("report", path, "--last", last)
    assert code == EXIT_OK, out
