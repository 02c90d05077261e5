"""What the dashboard shows, computed from history records: plain JSON-shaped dicts.

One *series* per (test, profile, hardware key), as the trend table has them
(:func:`pytest_specdecode.outputs.trend.trend`, whose cross-night detector state this reuses).
Nights are placed on one axis for the whole history: night ``x`` is the history's ``x``-th
session in time order, so a night a test did not run is a hole in its line, not a shorter line.

What is drawn as a change and what is not:

* a **change** is what the cross-night detector found: the estimated first changed night of its
  current state (recomputed here, as ``report`` does) and of every alarm a nightly session
  recorded in its history line; each with what changed that night (:func:`what_changed`);
* a **gap** (sessions that did not run the test), an **error** night, a **baseline re-recorded**
  (``--update-baselines``, or a new stored baseline mean), a **new hardware key** and a test
  **renamed** (one id ends and another with the same profile, hardware, configuration and
  workload starts right after) are markers of their own kind; the detector restarts its
  reference after a re-recording and keys its series by test id and hardware, so none of them
  is a change.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_specdecode.metrics import METRICS
from pytest_specdecode.outputs.json_report import parse_iso
from pytest_specdecode.outputs.trend import TrendRow, trend
from pytest_specdecode.stats.horizon import horizon

CHARTED = ("tok_s", "accept_length", "ttft", "tpot", "itl_p50", "itl_p99")
"""The metrics a test page draws, in this order (those the history has)."""

SAMPLED = ("tok_s", "accept_length")
"""The metrics whose run-level values a test page carries (shown on demand)."""

RENAME_WITHIN = 3
"""A test whose id ends this many sessions or fewer before another with the same configuration
begins is taken as renamed to it."""

Entry = tuple[int, Mapping[str, Any], Mapping[str, Any]]  # (night x, record, test entry)


def _num(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _round(value: float | None) -> float | None:
    return None if value is None else float(f"{value:.5g}")


def slug(test_id: str, profile: str, hardware_key: str) -> str:
    """A file name for a series' page: readable, and unique by a hash of the whole key."""
    base = re.sub(r"[^A-Za-z0-9]+", "-", test_id.split("::", 1)[-1]).strip("-")[:60]
    digest = hashlib.sha256(f"{test_id}\0{profile}\0{hardware_key}".encode()).hexdigest()[:8]
    return f"{base or 'test'}-{digest}"


def _own_check(test: Mapping[str, Any], metric: str) -> Mapping[str, Any] | None:
    for check in test.get("checks") or ():
        if check.get("metric") == metric and check.get("reference") is None:
            return check  # type: ignore[no-any-return]
    return None


# --------------------------------------------------------------------------- attribution


def facts(record: Mapping[str, Any], test: Mapping[str, Any]) -> dict[str, str]:
    """What one night ran with, as its history line records it."""
    gpu = record.get("gpu") if isinstance(record.get("gpu"), Mapping) else {}
    build = test.get("build") if isinstance(test.get("build"), Mapping) else {}
    found: dict[str, Any] = {
        "SGLang version": test.get("server_version"),
        "fingerprint": test.get("fingerprint"),
        "driver": (gpu or {}).get("driver"),
        "GPUs": ", ".join((gpu or {}).get("names") or []) or None,
        "test repository commit": record.get("commit"),
        "pytest-specdecode": record.get("plugin_version"),
    }
    for key, value in (build or {}).items():
        if key == "env":  # names only (values may be secret): a name that comes or goes
            for name in value or ():
                found[f"environment {name}"] = "set"
        else:
            found[f"build {key}"] = value
    return {name: str(value) for name, value in found.items() if value not in (None, "")}


def what_changed(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    """``"SGLang version 0.5.15 → 0.5.16"`` for each fact that differs between two nights."""
    names = list(dict.fromkeys([*before, *after]))
    return [
        f"{name}: {before.get(name, '(none)')} → {after.get(name, '(none)')}"
        for name in names
        if before.get(name) != after.get(name)
    ]


# --------------------------------------------------------------------------- one series


def _metric_columns(entries: Sequence[Entry], metric: str) -> dict[str, Any] | None:
    info = METRICS.get(metric)
    if info is None or not any(metric in (t.get("metrics") or {}) for _, _, t in entries):
        return None
    columns: dict[str, list[float | None]] = {
        key: [] for key in ("mean", "lo", "hi", "base", "base_sd", "threshold")
    }
    for _, _, test in entries:
        summary = (test.get("metrics") or {}).get(metric) or {}
        check = _own_check(test, metric) or {}
        raw = {
            "mean": _num(summary.get("mean")),
            "lo": _num(summary.get("ci_low")),
            "hi": _num(summary.get("ci_high")),
            "base": _num(check.get("baseline_mean")),
            "base_sd": _num(check.get("baseline_std")),
            "threshold": _num(check.get("threshold")),
        }
        for key, value in raw.items():
            columns[key].append(_round(info.display(value)) if value is not None else None)
    return {
        "label": info.label,
        "unit": info.unit,
        "higher_is_better": info.higher_is_better,
        **columns,
    }


def _gaps(xs: Sequence[int]) -> list[dict[str, Any]]:
    out = []
    for a, b in itertools.pairwise(xs):
        if b - a > 1:
            missing = b - a - 1
            out.append(
                {
                    "kind": "gap",
                    "x": a + 1,
                    "x2": b - 1,
                    "label": f"not run on {missing} night{'s' if missing > 1 else ''} (a gap)",
                }
            )
    return out


def _rerecorded(entries: Sequence[Entry]) -> list[dict[str, Any]]:
    out = []
    last: float | None = None
    for x, _, test in entries:
        if test.get("outcome") == "recorded":
            out.append({"kind": "rerecorded", "x": x, "label": "baseline re-recorded"})
            last = None
            continue
        base = _num((_own_check(test, "tok_s") or {}).get("baseline_mean"))
        if base is not None and last is not None and abs(base - last) > 1e-9 * abs(last):
            out.append(
                {
                    "kind": "rerecorded",
                    "x": x,
                    "label": "baseline re-recorded (a new stored baseline from this night on)",
                }
            )
        last = base if base is not None else last
    return out


def _errors(entries: Sequence[Entry]) -> list[dict[str, Any]]:
    out = []
    for x, _, test in entries:
        error = test.get("error")
        if test.get("outcome") == "error":
            cause = (
                f"{error.get('type')} in {error.get('phase')}: {error.get('cause')}"
                if isinstance(error, Mapping)
                else "no cause recorded"
            )
            out.append({"kind": "error", "x": x, "label": f"errored: {cause}"})
    return out


def _change(
    entries: Sequence[Entry], metric: str, when: str, text: str, stored: Sequence[str]
) -> dict[str, Any] | None:
    """A change marker at the night whose time is ``when``, with what changed that night."""
    index = next((i for i, (_, r, _t) in enumerate(entries) if r.get("time_utc") == when), None)
    if index is None:
        return None
    x, record, test = entries[index]
    before = next(
        (
            entries[i]
            for i in range(index - 1, -1, -1)
            if (entries[i][2].get("metrics") or {}).get(metric)
        ),
        None,
    )
    changed = what_changed(facts(before[1], before[2]), facts(record, test)) if before else []
    changed += [line for line in stored if line not in changed]
    return {
        "kind": "change",
        "metric": metric,
        "x": x,
        "label": text,
        "changed": changed
        or ["nothing recorded changed that night (same server, build, driver and commit)"],
    }


def _changes(entries: Sequence[Entry], row: TrendRow) -> list[dict[str, Any]]:
    found: dict[tuple[str, int], dict[str, Any]] = {}
    for detection in row.detections:
        s = detection.state
        if s.direction is None or s.start_index is None:
            continue
        when = detection.nights[s.start_index].when
        text = f"{METRICS[detection.metric].label}: {s.direction} of {s.shift or 0:+.1%}"
        if s.shift_low is not None and s.shift_high is not None:
            text += f" (95% CI {s.shift_low:+.1%} to {s.shift_high:+.1%})"
        marker = _change(entries, detection.metric, str(when), text + ", starts here", ())
        if marker is not None:
            found[detection.metric, marker["x"]] = marker
    for _, _, test in entries:  # the alarms the nightly sessions raised, as they recorded them
        for metric, state in (test.get("crossnight") or {}).items():
            if not (isinstance(state, Mapping) and state.get("alarm")):
                continue
            when = state.get("start_time_utc")
            if not isinstance(when, str) or metric not in METRICS:
                continue
            text = f"{METRICS[metric].label}: regression of {_num(state.get('shift')) or 0:+.1%}"
            marker = _change(
                entries, metric, when, text + " (alarm of a nightly session), starts here",
                [str(c) for c in state.get("changed") or ()],
            )  # fmt: skip
            if marker is not None:
                found.setdefault((metric, marker["x"]), marker)
    return sorted(found.values(), key=lambda m: (m["x"], m["metric"]))


def _detector(row: TrendRow) -> list[dict[str, Any]]:
    out = []
    for detection in row.detections:
        s = detection.state
        status = "alarm" if s.alarm else ("improved" if s.direction else s.status)
        seen = horizon(s)
        out.append(
            {
                "metric": detection.metric,
                "status": status,
                "cell": detection.cell(),
                "text": s.describe(detection.nights),
                "nights_since": s.nights,
                "seen": seen.describe() if seen is not None else None,
            }
        )
    return out


def _series(
    row: TrendRow, entries: Sequence[Entry], sessions: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    xs = [x for x, _, _ in entries]
    latest_x, latest_record, latest = entries[-1]
    metrics = {m: c for m in CHARTED if (c := _metric_columns(entries, m)) is not None}
    samples = {
        m: [list((t.get("samples") or {}).get(m) or []) for _, _, t in entries]
        for m in SAMPLED
        if any((t.get("samples") or {}).get(m) for _, _, t in entries)
    }
    markers = [*_gaps(xs), *_errors(entries), *_rerecorded(entries), *_changes(entries, row)]
    detector = _detector(row)
    return {
        "id": slug(row.test_id, row.profile, row.hardware_key),
        "test_id": row.test_id,
        "profile": row.profile,
        "hardware_key": row.hardware_key,
        # null: no speculative decoding; absent: a line written before the field existed
        "algorithm": str(
            latest.get("algorithm") or ("none" if "algorithm" in latest else "unknown")
        ),
        "simulated": row.simulated,
        "status": row.status,
        "last_outcome": latest.get("outcome"),
        "last_night": latest_record.get("time_utc"),
        "last_x": latest_x,
        "alarm": any(d["status"] == "alarm" for d in detector),
        "detector": detector,
        "nights": {
            "x": xs,
            "when": [r.get("time_utc") for _, r, _ in entries],
            "outcome": [t.get("outcome") for _, _, t in entries],
            "session": [r.get("run_id") or r.get("commit") for _, r, _ in entries],
            "simulated": [bool(t.get("simulated", r.get("simulated"))) for _, r, t in entries],
        },
        "metrics": metrics,
        "samples": samples,
        "markers": sorted(markers, key=lambda m: m["x"]),
        "notes": [],
        "sessions": len(sessions),
    }


# --------------------------------------------------------------------------- the whole site


def _configuration(entries: Sequence[Entry], at: int) -> tuple[Any, ...]:
    test = entries[at][2]
    return (test.get("fingerprint"), test.get("workload_hash"))


def _mark_renames(series: list[dict[str, Any]], entries: Mapping[str, Sequence[Entry]]) -> None:
    """Pair a series that ends with one of another test id that starts right after it with the
    same profile, hardware key, configuration and workload: a renamed test, drawn as such."""
    taken: set[str] = set()
    for old in series:
        for new in series:
            if (
                new["id"] in taken
                or new["test_id"] == old["test_id"]
                or (new["profile"], new["hardware_key"]) != (old["profile"], old["hardware_key"])
            ):
                continue
            gap = new["nights"]["x"][0] - old["nights"]["x"][-1]
            same = _configuration(entries[old["id"]], -1) == _configuration(entries[new["id"]], 0)
            if 1 <= gap <= RENAME_WITHIN and same:
                taken.add(new["id"])
                old["renamed_to"] = new["id"]
                new["renamed_from"] = old["id"]
                old["notes"].append(f"renamed: continues as {new['test_id']}")
                new["notes"].append(f"renamed: continues {old['test_id']}")
                new["markers"].insert(
                    0,
                    {
                        "kind": "renamed",
                        "x": new["nights"]["x"][0],
                        "label": f"renamed from {old['test_id']}",
                    },
                )
                break


def _mark_new_hardware(series: list[dict[str, Any]]) -> None:
    first_of: dict[str, int] = {}
    for s in series:
        key = s["hardware_key"]
        first_of[key] = min(first_of.get(key, s["nights"]["x"][0]), s["nights"]["x"][0])
    if len(first_of) < 2:
        return
    start = min(first_of.values())
    for s in series:
        first = first_of[s["hardware_key"]]
        if first > start:
            s["new_hardware"] = True
            s["notes"].append(f"hardware key {s['hardware_key']!r} is new from night {first + 1}")
            if s["nights"]["x"][0] == first:
                s["markers"].insert(
                    0,
                    {
                        "kind": "new-hardware",
                        "x": first,
                        "label": f"new hardware key {s['hardware_key']}",
                    },
                )


def build_model(
    records: Sequence[Mapping[str, Any]], *, reference_nights: int | None = None
) -> dict[str, Any]:
    """The site's data: the sessions and one series per test x profile x hardware key."""
    everything = sorted(records, key=lambda r: parse_iso(r["time_utc"]))
    table = trend(everything, reference_nights=reference_nights)
    # the nights on the x axis: sessions, not the acknowledge lines (the detector read those)
    ordered = [r for r in everything if not r.get("acknowledgements")]
    grouped: dict[tuple[str, str, str], list[Entry]] = {}
    for x, record in enumerate(ordered):
        for test in record.get("tests") or ():
            key = (test["test_id"], test["profile"], test["hardware_key"])
            grouped.setdefault(key, []).append((x, record, test))
    series = []
    by_id: dict[str, Sequence[Entry]] = {}
    for row in table.rows:
        entries = grouped[row.test_id, row.profile, row.hardware_key]
        one = _series(row, entries, ordered)
        by_id[one["id"]] = entries
        series.append(one)
    _mark_renames(series, by_id)
    _mark_new_hardware(series)
    return {
        "sessions": [
            {"when": r.get("time_utc"), "simulated": bool(r.get("simulated"))} for r in ordered
        ],
        "simulated": table.simulated,
        "reference_nights": reference_nights,
        "series": series,
    }
