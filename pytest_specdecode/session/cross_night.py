"""Tonight against earlier nights: the cross-night detector of one test, as the session runs it.

A nightly job has one launch per profile, so one night cannot prove a 5-10 % drop
(docs/statistics.md, "Across nights"). After a test's verdict, each of its series (tok/s,
accept length, and every metric the marker puts a margin on against the test's own baseline) is
read from the history (:func:`~pytest_specdecode.stats.crossnight.series_from_history`), tonight's
launch mean is added as the newest night, and the change scan of
:mod:`pytest_specdecode.stats.crossnight` gives its state. A regression alarm fails the test,
with the size of the change, the night it is estimated to have started and what changed that
night (:func:`what_changed`: the SGLang version and build, the driver, the test repository's
commit, the plugin). The state of every series goes into the result, so the history line of
tonight carries it: the detector's state lives with the history and is recomputed from it.

What the detector can see from tonight (:func:`night_sensitivity`) is printed with the verdict
from the first night after a baseline: how many nights since the last acknowledged change, and
the drops it would flag within 7, 14 and 28 nights, from its own calibration.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_specdecode.metrics import METRICS
from pytest_specdecode.result import Outcome
from pytest_specdecode.stats.crossnight import CrossNightState, DetectorConfig, Night, detect
from pytest_specdecode.stats.horizon import Horizon, horizon
from pytest_specdecode.stats.night_series import series_from_history
from pytest_specdecode.stats.two_level import STATED_LAUNCH_CV, STATED_PRIOR_DF, TIMING_METRICS
from pytest_specdecode.verdict import Threshold

WATCHED = ("tok_s", "accept_length")
"""Series watched for every test that measures them, margin or not: the two figures the
plugin exists for."""


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
    config: DetectorConfig = field(default_factory=DetectorConfig)
    seen: Horizon | None = None  # what it would flag from tonight on

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
            "launches": s.launches,
            "opened_by": s.opened_by,
            "level": s.level,
            "night_sd": s.sigma,
            "night_sd_df": s.sigma_df,
            "night_sd_source": s.sigma_source,
            "config": self.config.to_json(),
            "horizon": self.seen.to_json() if self.seen is not None else None,
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
    launches_vary: bool = True,
) -> list[SeriesState]:
    """The detector's state of each of the test's series after tonight (module docstring).
    ``launches_vary``: the server's launches vary (a real server, or the simulated one with a
    launch CV), so that a speed's noise has the gate's stated prior where nothing earlier
    gives it."""
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
        stated = launches_vary and metric in TIMING_METRICS
        config = DetectorConfig(
            reference_nights=reference_nights,
            higher_is_better=info.higher_is_better if info is not None else True,
            stated_launch_cv=STATED_LAUNCH_CV if stated else None,
            stated_df=STATED_PRIOR_DF,
        )
        state = detect(nights, config)
        changed: tuple[str, ...] = ()
        if state.start_index is not None:
            changed = tuple(what_changed(history, tonight, nights, state.start_index))
        out.append(SeriesState(metric, state, tuple(nights), changed, config, horizon(state)))
    return out


def judge_across_nights(
    history: Sequence[Mapping[str, Any]],
    tonight: Tonight,
    samples: Mapping[str, Sequence[float]],
    thresholds: Sequence[Threshold],
    verdict: tuple[Outcome, str],
    *,
    reference_nights: int,
    launches_vary: bool,
) -> tuple[Outcome, str, dict[str, Any]]:
    """Tonight's verdict (outcome, message) with the cross-night detector's word added: the
    outcome, the message, and each series' state as the history records it."""
    outcome, text = verdict
    states = cross_night(
        history,
        tonight,
        samples,
        thresholds,
        reference_nights=reference_nights,
        launches_vary=launches_vary,
    )
    alarm = alarm_message(states)
    if alarm is not None:
        # A persistent drop fails the night whatever tonight's own verdict was: a PASS or
        # INCONCLUSIVE night of a real regression must not show green.
        outcome = Outcome.FAIL
        text = f"{text}\n{alarm}"
    else:
        text += "".join(f"\n{s.describe()}" for s in states if s.state.direction)
    seen = night_sensitivity(states)
    if seen is not None:
        text += f"\n{seen}"
    return outcome, text, {s.metric: s.to_json() for s in states}


def alarm_message(states: Sequence[SeriesState]) -> str | None:
    """The lines that fail the test, or None when no series raised a regression alarm."""
    alarms = [s for s in states if s.state.alarm]
    if not alarms:
        return None
    lines = ["cross-night alarm: a persistent drop across nights (docs/statistics.md)"]
    lines += [f"  {s.describe()}" for s in alarms]
    lines.append(
        "  acknowledge an intended change without a launch (python -m pytest_specdecode "
        "acknowledge HISTORY --test TEST --by WHO --why WHY), or record new baselines "
        "(--update-baselines): the detector then starts a new level"
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


def night_sensitivity(states: Sequence[SeriesState]) -> str | None:
    """One line per series of what the detector can see from tonight: the nights since the
    last acknowledged change and the drops it would flag within 7, 14 and 28 nights (from its
    own calibration, :mod:`pytest_specdecode.stats.horizon`); None when no series is judged."""
    lines = []
    for series in states:
        s, seen = series.state, series.seen
        if seen is None:
            continue
        since = s.opened_by or "the start of the history"
        lines.append(
            f"cross-night watch, {series.metric}: night {s.nights} since {since} (level from "
            f"{seen.points} points, night SD {s.sigma or 0:.1%}); {seen.describe()}"
        )
    return "\n".join(lines) if lines else None
