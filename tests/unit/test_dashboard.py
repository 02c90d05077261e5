"""The dashboard's model: a real change is marked with what changed that night; gaps, errors, a
re-recorded baseline, a renamed test and a new hardware key are drawn as what they are, never as
a change. And the site's folder: written, rewritten over an earlier dashboard, never over a
user's files."""

from __future__ import annotations

import json
import math
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from pytest_specdecode.__main__ import main
from pytest_specdecode.outputs.dashboard.model import build_model
from pytest_specdecode.outputs.dashboard.site import DashboardError, write_site
from pytest_specdecode.outputs.history import parse_record

START = datetime(2026, 9, 1, 3, 0, tzinfo=timezone.utc)
REFERENCE = 10


def entry(
    mean: float | None,
    *,
    test_id: str = "perf/test_a.py::test_eagle3",
    hardware_key: str = "8xH200",
    baseline: float = 100.0,
    outcome: str = "pass",
    server_version: str = "0.5.15",
) -> dict[str, Any]:
    metrics = {}
    if mean is not None:
        half = mean * 0.02
        metrics["tok_s"] = {
            "n": 10, "mean": mean, "cv": 0.03, "ci_low": mean - half, "ci_high": mean + half,
        }  # fmt: skip
    checks = []
    if outcome not in ("recorded", "error"):
        checks.append({
            "metric": "tok_s", "reference": None, "margin": -0.05, "compared": True,
            "verdict": outcome, "ratio": (mean or baseline) / baseline, "baseline_mean": baseline,
            "baseline_std": baseline * 0.03, "threshold": baseline * 0.95,
        })  # fmt: skip
    return {
        "test_id": test_id, "profile": "eagle3", "outcome": outcome, "simulated": False,
        "hardware_key": hardware_key, "workload_hash": "w1", "fingerprint": "f1",
        "server_version": server_version, "algorithm": "EAGLE3", "runs": 10,
        "build": {"launcher": "sglang", "sglang": server_version}, "metrics": metrics,
        "samples": {"tok_s": [mean] * 10} if mean is not None else {}, "checks": checks,
        "error": (
            {"phase": "setup", "type": "ServerCrashedError", "cause": "exit 1"}
            if outcome == "error"
            else None
        ),
    }  # fmt: skip


def night(index: int, *tests: dict[str, Any]) -> dict[str, Any]:
    record = {
        "schema_version": 1,
        "time_utc": (START + timedelta(days=index)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "run_id": f"night-{index + 1:02d}", "commit": f"{index:040x}", "plugin_version": "0.1.0",
        "hardware_keys": sorted({t["hardware_key"] for t in tests}), "simulated": False,
        "tests": list(tests),
    }  # fmt: skip
    return parse_record(json.dumps(record), where=f"night {index + 1}")


def noisy(level: float, nights: int, seed: int = 1, sd: float = 0.02) -> list[float]:
    rng = random.Random(seed)
    return [level * math.exp(rng.gauss(0.0, sd)) for _ in range(nights)]


def kinds(series: dict[str, Any]) -> list[str]:
    return [m["kind"] for m in series["markers"]]


def only(model: dict[str, Any], **match: str) -> dict[str, Any]:
    (found,) = [s for s in model["series"] if all(s[k] == v for k, v in match.items())]
    return found


def test_a_ten_percent_drop_from_night_20_is_marked_with_what_changed_that_night() -> None:
    values = noisy(100.0, 40, sd=0.01)  # quiet nights: the estimated start is the true one
    history = [
        night(i, entry(v * 0.9, server_version="0.5.16") if i >= 19 else entry(v))
        for i, v in enumerate(values)
    ]
    model = build_model(history, reference_nights=REFERENCE)
    (series,) = model["series"]
    changes = [m for m in series["markers"] if m["kind"] == "change"]
    assert changes, series["detector"]
    assert {m["metric"] for m in changes} == {"tok_s"}
    assert changes[0]["x"] == 19, changes  # night 20, counted from 1
    assert "SGLang version: 0.5.15 → 0.5.16" in changes[0]["changed"]
    assert "build sglang: 0.5.15 → 0.5.16" in changes[0]["changed"]
    assert series["alarm"] is True
    assert "regression of -" in changes[0]["label"]


def test_the_same_history_without_the_drop_marks_no_change() -> None:
    history = [night(i, entry(v)) for i, v in enumerate(noisy(100.0, 40))]
    (series,) = build_model(history, reference_nights=REFERENCE)["series"]
    assert kinds(series) == []
    assert series["alarm"] is False


def test_gaps_and_errored_nights_are_drawn_as_such_not_as_a_change() -> None:
    other = "perf/test_b.py::test_other"
    history = []
    for i, v in enumerate(noisy(100.0, 40)):
        tests = [entry(50.0, test_id=other)]
        if i == 24:
            tests.append(entry(None, outcome="error"))
        elif not 14 <= i <= 17:  # nights 15-18: the test did not run
            tests.append(entry(v))
        history.append(night(i, *tests))
    model = build_model(history, reference_nights=REFERENCE)
    series = only(model, test_id="perf/test_a.py::test_eagle3")
    assert kinds(series) == ["gap", "error"]
    gap, error = series["markers"]
    assert (gap["x"], gap["x2"]) == (14, 17)
    assert gap["label"] == "not run on 4 nights (a gap)"
    assert error["x"] == 24
    assert "ServerCrashedError" in error["label"]
    # the errored night is a hole in the line, not a value
    assert series["metrics"]["tok_s"]["mean"][series["nights"]["x"].index(24)] is None


@pytest.mark.parametrize("how", ["--update-baselines night", "baseline recorded elsewhere"])
def test_a_baseline_re_recorded_at_a_new_level_is_not_a_change(how: str) -> None:
    history = []
    for i, v in enumerate(noisy(100.0, 40)):
        if i == 20 and how == "--update-baselines night":
            history.append(night(i, entry(None, outcome="recorded")))
        elif i >= 20:
            history.append(night(i, entry(v * 0.85, baseline=85.0)))
        else:
            history.append(night(i, entry(v)))
    (series,) = build_model(history, reference_nights=REFERENCE)["series"]
    assert kinds(series) == ["rerecorded"]
    assert series["markers"][0]["x"] == 20
    assert series["alarm"] is False
    # the band steps to the new baseline
    assert series["metrics"]["tok_s"]["base"][0] == 100.0
    assert series["metrics"]["tok_s"]["base"][-1] == 85.0


def test_without_the_re_recording_the_same_drop_is_a_change() -> None:
    """The control of the test above: the step alone, with the old baseline, is found."""
    history = [
        night(i, entry(v * (0.85 if i >= 20 else 1.0))) for i, v in enumerate(noisy(100, 40))
    ]
    (series,) = build_model(history, reference_nights=REFERENCE)["series"]
    assert "change" in kinds(series)


def test_a_renamed_test_is_linked_to_its_old_name_not_drawn_as_a_change() -> None:
    old, new = "perf/test_a.py::test_eagle3", "perf/test_speed.py::test_eagle3_tok_s"
    history = [
        night(i, entry(v * (0.9 if i >= 20 else 1.0), test_id=old if i < 20 else new))
        for i, v in enumerate(noisy(100.0, 40))
    ]
    model = build_model(history, reference_nights=REFERENCE)
    before, after = only(model, test_id=old), only(model, test_id=new)
    assert before["renamed_to"] == after["id"]
    assert after["renamed_from"] == before["id"]
    assert kinds(after) == ["renamed"]
    assert after["markers"][0]["x"] == 20
    assert kinds(before) == []
    assert f"renamed: continues {old}" in after["notes"]


def test_tests_of_another_configuration_are_not_taken_as_renamed() -> None:
    history = [night(i, entry(100.0, test_id="a")) for i in range(10)]
    history += [night(i, {**entry(100.0, test_id="b"), "fingerprint": "f2"}) for i in range(10, 20)]
    model = build_model(history, reference_nights=REFERENCE)
    assert all("renamed_to" not in s and "renamed_from" not in s for s in model["series"])


def test_a_new_hardware_key_is_a_new_series_marked_new_not_a_change() -> None:
    history = []
    for i, v in enumerate(noisy(100.0, 40)):
        tests = [entry(v)]
        if i >= 25:
            tests.append(entry(v * 2.0, hardware_key="8xB200", baseline=200.0))
        history.append(night(i, *tests))
    model = build_model(history, reference_nights=REFERENCE)
    h200, b200 = only(model, hardware_key="8xH200"), only(model, hardware_key="8xB200")
    assert kinds(h200) == []
    assert not h200.get("new_hardware")
    assert b200["new_hardware"] is True
    assert kinds(b200) == ["new-hardware"]
    assert b200["markers"][0]["x"] == 25
    assert b200["nights"]["x"][0] == 25  # it starts where it starts, on the same axis


def test_the_site_is_written_and_rewritten_but_never_over_a_users_files(tmp_path: Path) -> None:
    history = [night(i, entry(v)) for i, v in enumerate(noisy(100.0, 12))]
    site = tmp_path / "site"
    written = write_site(history, site, reference_nights=REFERENCE)
    assert written.index == site / "index.html"
    assert written.pages == 1
    (page,) = (site / "tests").glob("*.html")
    assert "perf/test_a.py::test_eagle3" in page.read_text()
    assert (site / "assets" / "dashboard.js").is_file()
    assert "http://" not in written.index.read_text()
    assert "https://" not in page.read_text()
    write_site(history[:5], site, reference_nights=REFERENCE)  # an earlier dashboard: replaced
    assert "5 sessions" in written.index.read_text()

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes")
    with pytest.raises(DashboardError, match=r"mine: the folder holds other files"):
        write_site(history, mine)
    assert (mine / "notes.txt").read_text() == "my notes"
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


def test_the_cli_writes_the_dashboard_and_names_it(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "history.jsonl"
    path.write_text("".join(json.dumps(night(i, entry(100.0))) + "\n" for i in range(6)))
    code = main(["report", str(path), "--html", str(tmp_path / "site")])
    out = capsys.readouterr().out
    assert code == 0
    assert f"dashboard: {tmp_path / 'site' / 'index.html'} (1 test pages" in out
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("")
    assert main(["report", str(path), "--html", str(tmp_path / "taken")]) == 2
    assert "the folder holds other files" in capsys.readouterr().err
