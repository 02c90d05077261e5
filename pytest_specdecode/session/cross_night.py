"""Tonight against earlier nights: the cross-night detector of one test, as the session runs it.

A nightly job has one launch per profile, so one night cannot prove a 5-10 % drop
(docs/statistics.md, "Across nights"). After a test's verdict, each of its series (tok/s,
accept length, and every metric the marker puts a margin on against the test's own baseline) is
read from the history (:func:`~pytest_specdecode.stats.crossnight.series_from_history`), tonight's
launch mean is added as the newest night, and the CUSUM of
:mod:`pytest_specdecode.stats.crossnight` gives its state. A regression alarm fails the test,
with the size of the change, the night it is estimated to have started and what changed that
night (:func:`what_changed`: the SGLang version and build, the driver, the test repository's
commit, the plugin). The state of every series goes into the result, so the history line of
tonight carries it: the detector's state lives with the history and is recomputed from it.

What a night can see (:func:`night_sensitivity`) is printed with the verdict once the history
gives the test's launch noise: the smallest drop tonight's gate FAILs the same night, the
smallest the detector flags within 7 and 28 nights, and the launches a night that a 5 % drop
within 14 nights would need.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_specdecode.metrics import METRICS
from pytest_specdecode.stats.crossnight import (
    CrossNightState,
    DetectorConfig,
    Night,
    detect,
    sensitivity,
    series_from_history,
)
from pytest_specdecode.stats.two_level import prior_for
from pytest_specdecode.verdict import Threshold

WATCHED = ("tok_s", "accept_length")
"""Series watched for every test that measures them, margin or not: the two figures the
plugin exists for."""

TARGET = (0.05, 14)
"""The detection target the printed "launches a night" answers: a 5 % drop within 14 nights."""


@dataclass(frozen=True)
class Tonight:
    """Who measured tonight and how, for the newest night of each series."""

    test_id: str
    hardware_key: str
    fingerprint: str
    workload_hash: str
    when: str
    session: str


@dataclass(frozen=True)
class SeriesState:
    """One metric's detector state after tonight, with the nights it was computed on."""

    metric: str
    state: CrossNightState
    nights: tuple[Night, ...]
    changed: tuple[
        str, ...
    ]  # what differs between the estimated first changed night and the one before

    def to_json(self) -> dict[str, Any]:
        s = self.state
        start = self.nights[s.start_index] if s.start_index is not None else None
        return {
            "status": s.status,
            "reason": s.reason,
            "alarm": s.alarm,
            "direction": s.direction,
            "statistic": s.statistic,
            "statistic_up": s.statistic_up,
            "threshold": s.h,
            "k": s.k,
            "reference_nights": s.reference_nights,
            "nights": s.nights,
            "monitored": s.monitored,
            "level": s.level,
            "night_sd": s.sigma,
            "shift": s.shift,
            "shift_low": s.shift_low,
            "shift_high": s.shift_high,
            "start_time_utc": start.when if start is not None else None,
            "start_session": start.session if start is not None else None,
            "changepoint_time_utc": (
                self.nights[s.changepoint_index].when if s.changepoint_index is not None else None
            ),
            "changed": list(self.changed),
        }

    def describe(self) -> str:
        """One line of the verdict: the detector's statement, with what changed that night."""
        text = f"{self.metric}: {self.state.describe(self.nights)}"
        if self.state.direction is not None and self.changed:
            text += "; that night: " + "; ".join(self.changed)
        elif self.state.direction is not None:
            text += "; nothing recorded changed that night (same build, driver and commit)"
        return text


def watched_metrics(
    samples: Mapping[str, Sequence[float]], thresholds: Sequence[Threshold]
) -> list[str]:
    """The series of a test: tok/s and accept length when measured, and every metric with a
    margin against the test's own baseline (a margin against another profile's baseline is a
    claim about two configurations, not a series of this one)."""
    own = [t.metric for t in thresholds if t.reference is None]
    names = [m for m in (*WATCHED, *own) if samples.get(m)]
    return list(dict.fromkeys(names))


def tonight_night(values: Sequence[float], tonight: Tonight) -> Night:
    """Tonight's launch mean of one metric, with its runs' log-SD (the detector's SD floor)."""
    mean = statistics.fmean(values)
    positive = [v for v in values if v > 0]
    run_sd = statistics.stdev([math.log(v) for v in positive]) if len(positive) >= 2 else None
    return Night(mean, runs=len(values), run_sd=run_sd, when=tonight.when, session=tonight.session)


def cross_night(
    history: Sequence[Mapping[str, Any]],
    tonight: Tonight,
    samples: Mapping[str, Sequence[float]],
    thresholds: Sequence[Threshold],
    *,
    reference_nights: int,
) -> list[SeriesState]:
    """The detector's state of each of the test's series after tonight (module docstring)."""
    out = []
    for metric in watched_metrics(samples, thresholds):
        info = METRICS.get(metric)
        nights = series_from_history(
            history,
            test_id=tonight.test_id,
            hardware_key=tonight.hardware_key,
            fingerprint=tonight.fingerprint,
            workload_hash=tonight.workload_hash,
            metric=metric,
        )
        nights.append(tonight_night(samples[metric], tonight))
        config = DetectorConfig(
            reference_nights=reference_nights,
            higher_is_better=info.higher_is_better if info is not None else True,
        )
        state = detect(nights, config)
        changed: tuple[str, ...] = ()
        if state.start_index is not None:
            changed = tuple(what_changed(history, tonight, nights, state.start_index))
        out.append(SeriesState(metric, state, tuple(nights), changed))
    return out


def alarm_message(states: Sequence[SeriesState]) -> str | None:
    """The lines that fail the test, or None when no series raised a regression alarm."""
    alarms = [s for s in states if s.state.alarm]
    if not alarms:
        return None
    lines = ["cross-night alarm: a persistent drop across nights (docs/statistics.md)"]
    lines += [f"  {s.describe()}" for s in alarms]
    lines.append(
        "  acknowledge an intended change by recording new baselines (--update-baselines); the "
        "detector then starts a new reference"
    )
    return "\n".join(lines)


# --------------------------------------------------------------------------- attribution


def _test_entry(record: Mapping[str, Any], tonight: Tonight) -> Mapping[str, Any] | None:
    for test in record.get("tests") or ():
        if (
            isinstance(test, Mapping)
            and test.get("test_id") == tonight.test_id
            and test.get("hardware_key") == tonight.hardware_key
        ):
            return test
    return None


def _facts(record: Mapping[str, Any] | None, test: Mapping[str, Any] | None) -> dict[str, Any]:
    """What a night ran with, as the history line records it."""
    if record is None:
        return {}
    gpu = record.get("gpu") if isinstance(record.get("gpu"), Mapping) else {}
    build = (test or {}).get("build") if isinstance((test or {}).get("build"), Mapping) else {}
    facts: dict[str, Any] = {
        "server version": (test or {}).get("server_version"),
        "driver": gpu.get("driver") if gpu else None,
        "GPUs": ", ".join(gpu.get("names") or []) if gpu else None,
        "test repository commit": record.get("commit"),
        "pytest-specdecode": record.get("plugin_version"),
    }
    for key, value in (build or {}).items():
        if key != "env":
            facts[f"build {key}"] = value
    return facts


def what_changed(
    history: Sequence[Mapping[str, Any]], tonight: Tonight, nights: Sequence[Night], start: int
) -> list[str]:
    """What differs between the night at ``start`` and the measured night before it, as
    ``"server version 0.5.15 -> 0.5.16"``; tonight (not yet in the history) has no record, so a
    change that starts tonight names nothing."""
    by_time = {str(r.get("time_utc")): r for r in history if isinstance(r, Mapping)}
    before = next(
        (
            nights[i]
            for i in range(start - 1, -1, -1)
            if nights[i].mean is not None and not nights[i].acknowledged
        ),
        None,
    )
    if before is None:
        return []
    after_record = by_time.get(str(nights[start].when))
    before_record = by_time.get(str(before.when))
    if after_record is None or before_record is None:
        return []
    now = _facts(after_record, _test_entry(after_record, tonight))
    then = _facts(before_record, _test_entry(before_record, tonight))
    return [
        f"{name} {then.get(name)} -> {now.get(name)}"
        for name in now
        if now.get(name) != then.get(name)
    ]


# --------------------------------------------------------------------------- what a night sees


def night_sensitivity(
    history: Sequence[Mapping[str, Any]],
    tonight: Tonight,
    values: Sequence[float],
    *,
    reference_nights: int,
) -> str | None:
    """What tonight and the detector can catch for tok/s at this test's measured noise, or None
    while the history is too short to measure the launch noise."""
    prior = prior_for(
        history,
        test_id=tonight.test_id,
        hardware_key=tonight.hardware_key,
        fingerprint=tonight.fingerprint,
        workload_hash=tonight.workload_hash,
        metric="tok_s",
    )
    positive = [math.log(v) for v in values if v > 0]
    if prior is None or len(positive) < 2:
        return None
    run_var = statistics.variance(positive)
    launch_sd = math.sqrt(prior.launch_variance(run_var))
    seen = sensitivity(
        launch_sd,
        math.sqrt(run_var),
        len(positive),
        nights=(7, 28),
        target=TARGET,
        config=DetectorConfig(reference_nights=reference_nights, attribute=False),
        paths=2000,
    )
    within = ", ".join(
        f"{drop:.1%} within {count} nights" if math.isfinite(drop) else f"none within {count}"
        for count, drop in seen.within
    )
    launches = (
        f"{seen.launches_needed} launch{'es' if seen.launches_needed != 1 else ''} a night"
        if seen.launches_needed is not None
        else "more than 16 launches a night"
    )
    return (
        f"what a night can see (tok/s; launch CV {launch_sd:.1%} from {prior.nights} nights, run "
        f"CV {math.sqrt(run_var):.1%} over {len(positive)} runs): tonight alone FAILs a drop of "
        f"{seen.one_night:.1%} or more; the detector flags {within}; a {TARGET[0]:.0%} drop within "
        f"{TARGET[1]} nights needs {launches}"
    )
