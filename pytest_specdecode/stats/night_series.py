"""One series of nights from the JSON-lines history, as the cross-night detector reads it.

A series is one test's metric on one hardware key, configuration fingerprint and workload (the
same selection as :func:`pytest_specdecode.stats.two_level.prior_for`): a
:class:`~pytest_specdecode.stats.crossnight.Night` per session that measured it, oldest first.

Acknowledged changes, each of which starts a new level, are read from what the history records:

- a session whose outcome for the test is ``recorded`` (``--update-baselines``): the baseline's
  launch means, split from its samples by ``launch_runs``, become the new level's first points;
- an ``acknowledge`` line (``python -m pytest_specdecode acknowledge``): a change accepted as
  the new normal without a launch; the level restarts from the nights after it;
- a night compared against a different stored baseline mean than the previous compared night
  (a baseline recorded outside the history's sessions, or committed from elsewhere).

A crashed night (no mean) is a gap.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_specdecode.stats.crossnight import Night, earlier_regimes_noise, level_start, measured
from pytest_specdecode.stats.two_level import LaunchPrior, prior_for, prior_from_history

__all__ = ["acknowledgement_matches", "launch_means", "launch_prior", "series_from_history"]


def series_from_history(
    history: Sequence[Mapping[str, Any]],
    *,
    test_id: str,
    hardware_key: str,
    fingerprint: str,
    workload_hash: str,
    metric: str,
) -> list[Night]:
    """The series of one test's metric (module docstring), oldest first."""
    nights: list[Night] = []
    last_baseline: float | None = None
    key = (test_id, hardware_key, fingerprint, workload_hash)
    for record in history:
        when, session = record.get("time_utc"), record.get("run_id") or record.get("commit")
        for ack in record.get("acknowledgements") or ():
            if acknowledgement_matches(ack, test_id, hardware_key, metric):
                note = f"acknowledged by {ack.get('by')} ({when}): {ack.get('why')}"
                nights.append(Night(None, when=when, session=session, acknowledged=True,
                                    note=note))  # fmt: skip
                last_baseline = None
        for test in record.get("tests") or ():
            if not isinstance(test, Mapping) or _key(test) != key:
                continue
            if test.get("outcome") == "recorded":
                means = launch_means(test, metric)
                nights.append(
                    Night(None, when=when, session=session, acknowledged=True,
                          launch_means=means, note=f"the baseline recorded {when}")
                )  # fmt: skip
                last_baseline = None
                continue
            baseline = _own_baseline(test, metric)
            changed = (
                baseline is not None
                and last_baseline is not None
                and not math.isclose(baseline, last_baseline, rel_tol=1e-9)
            )
            if baseline is not None:
                last_baseline = baseline
            if changed:  # compared against a new baseline: a change was acknowledged
                nights.append(
                    Night(None, when=when, session=session, acknowledged=True,
                          note=f"a new stored baseline (first compared {when})")
                )  # fmt: skip
            nights.append(_night(test, metric, when, session))
    return nights


def launch_prior(
    history: Sequence[Mapping[str, Any]],
    *,
    test_id: str,
    hardware_key: str,
    fingerprint: str,
    workload_hash: str,
    metric: str,
) -> LaunchPrior | None:
    """The nightly gate's launch prior from the same series the cross-night detector reads.

    With an earlier regime of ten points or more (a series that has lived through an
    acknowledged change), the detector's carried noise: each earlier regime's points about their
    own mean, pooled (:func:`~pytest_specdecode.stats.crossnight.earlier_regimes_noise`), pooled
    by df with the von Neumann estimate of the nights since the change. Thirty earlier nights
    and a 3-launch baseline give 32 df from the first night after a reset, where the von Neumann
    estimate over the last 30 nights gave about 19 and straddled the reset's step; with them
    the no-change guard can be stricter at the same power (:func:`~pytest_specdecode.stats.
    two_level.guard_alpha`), which frees false-alarm budget. A box's first regime has nothing
    carried: :func:`~pytest_specdecode.stats.two_level.prior_for`, as before."""
    key = {"test_id": test_id, "hardware_key": hardware_key, "fingerprint": fingerprint,
           "workload_hash": workload_hash, "metric": metric}  # fmt: skip
    nights = series_from_history(history, **key)
    since = level_start(nights)
    carried_ss, carried_df, regimes = earlier_regimes_noise(nights[:since], 1.0)
    if carried_df <= 0:
        return prior_for(history, **key)
    before = [n for n in nights[:since] if _usable(n)]
    after = [n for n in nights[since:] if _usable(n)]
    own = prior_from_history(
        [math.log(float(n.mean or 1.0)) for n in after], [float(n.runs) for n in after]
    )
    ss = carried_ss + (own.variance * own.df if own else 0.0)
    df = carried_df + (own.df if own else 0.0)
    used = before + after
    return LaunchPrior(
        variance=ss / df,
        df=df,
        nights=len(used),
        runs=sum(n.runs for n in used) / len(used) if used else math.inf,
        regimes=regimes,
    )


def _usable(night: Night) -> bool:
    """A measured night of at least two runs (what :func:`prior_for` counts)."""
    return measured(night) and night.runs >= 2


def _key(test: Mapping[str, Any]) -> tuple[Any, ...]:
    return (
        test.get("test_id"),
        test.get("hardware_key"),
        test.get("fingerprint"),
        test.get("workload_hash"),
    )


def _night(test: Mapping[str, Any], metric: str, when: Any, session: Any) -> Night:
    summary = (test.get("metrics") or {}).get(metric)
    mean = n = cv = None
    if isinstance(summary, Mapping):
        mean, n, cv = summary.get("mean"), summary.get("n"), summary.get("cv")
    usable = isinstance(mean, int | float) and mean > 0 and isinstance(n, int) and n >= 1
    return Night(
        float(mean) if usable else None,  # type: ignore[arg-type]
        runs=int(n) if usable else 0,  # type: ignore[arg-type]
        run_sd=math.sqrt(math.log1p(float(cv) ** 2))
        if isinstance(cv, int | float) and cv >= 0
        else None,
        when=when,
        session=session,
    )


def acknowledgement_matches(
    ack: Any, test_id: str, hardware_key: str | None, metric: str | None
) -> bool:
    """Whether an ``acknowledge`` entry applies to this series (``*`` or the test's id; the
    hardware key and metric when the entry names them)."""
    if not isinstance(ack, Mapping):
        return False
    if ack.get("test_id") not in ("*", test_id):
        return False
    if ack.get("hardware_key") not in (None, hardware_key):
        return False
    return ack.get("metric") in (None, metric)


def launch_means(test: Mapping[str, Any], metric: str) -> tuple[float, ...]:
    """The launch means of a recorded baseline's ``metric``: its samples split by
    ``launch_runs`` (empty when the record has no launch split or the counts do not add up)."""
    samples = (test.get("samples") or {}).get(metric)
    runs = test.get("launch_runs")
    if not isinstance(samples, list) or not isinstance(runs, list) or not runs:
        return ()
    if any(not isinstance(n, int) or n < 1 for n in runs) or sum(runs) != len(samples):
        return ()
    means, start = [], 0
    for count in runs:
        part = samples[start : start + count]
        start += count
        if not all(isinstance(v, int | float) and v > 0 for v in part):
            return ()
        means.append(sum(part) / count)
    return tuple(means)


def _own_baseline(test: Mapping[str, Any], metric: str) -> float | None:
    for check in test.get("checks") or ():
        if (
            isinstance(check, Mapping)
            and check.get("metric") == metric
            and check.get("reference") is None
            and isinstance(check.get("baseline_mean"), int | float)
        ):
            return float(check["baseline_mean"])
    return None
