"""What every statistic starts from: per-run values checked and described, alpha and margin checked.

A comparison (:mod:`pytest_specdecode.stats.comparison`), the power analysis
(:mod:`pytest_specdecode.stats.power_analysis`) and the sequential plan
(:mod:`pytest_specdecode.stats.sequential`) all refuse bad input the same way, with
:class:`StatsInputError`: a per-run value must be finite and > 0 (every metric here is a rate or
a duration), and the error names the side, the run and the value. Baselines, reports and the
terminal table summarise a sample with the one :func:`describe`, so a single run or constant runs
read the same everywhere. This module needs only :mod:`pytest_specdecode.stats.distributions`, so it
sits below all of them: the power analysis checks its inputs without importing the comparison.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from pytest_specdecode.errors import SpecdecodeError
from pytest_specdecode.stats.distributions import t_ppf

__all__ = [
    "SampleSummary",
    "StatsInputError",
    "check_alpha",
    "check_margin",
    "describe",
    "is_constant",
    "positive_values",
    "summarize",
]


class StatsInputError(SpecdecodeError, ValueError):
    """Bad input to a statistics function: a non-positive value, a margin <= -100 %, ..."""


@dataclass(frozen=True)
class SampleSummary:
    """One metric's per-run values, described once for every consumer (verdicts, baselines,
    reports, the terminal table).

    With a single run, ``std``, ``cv`` and the interval are ``None``: reporting 0 would claim a
    noise level nobody measured. Runs that are all equal (a deterministic accept length) have
    ``std`` and ``cv`` exactly 0 and a zero-width interval. ``cv`` is also ``None`` for a mean of
    0. The interval is the two-sided t interval of the mean at ``confidence``.
    """

    n: int
    mean: float
    std: float | None
    cv: float | None
    ci_low: float | None
    ci_high: float | None
    median: float
    min: float
    max: float

    def cv_text(self) -> str:
        """The CV as a percentage, or ``n/a`` where it is not measured."""
        return "n/a" if self.cv is None else f"{self.cv:.1%}"


def describe(samples: Sequence[float], confidence: float = 0.95) -> SampleSummary:
    """n, mean, std (ddof=1), CV, t interval of the mean, median, min and max of per-run values
    (at least one, each finite); see :class:`SampleSummary` for one run and constant runs."""
    values = np.asarray(samples, dtype=np.float64)
    if values.size == 0 or not np.all(np.isfinite(values)):
        raise StatsInputError(f"a summary needs at least one finite value, got {list(samples)!r}")
    constant = is_constant(values)
    mean = float(values[0]) if constant else float(np.mean(values))
    std: float | None = None
    ci_low = ci_high = cv = None
    if values.size >= 2:
        std = 0.0 if constant else float(np.std(values, ddof=1))
        half = float(t_ppf(0.5 + confidence / 2, values.size - 1)) * std
        half /= math.sqrt(values.size)
        ci_low, ci_high = mean - half, mean + half
        cv = std / abs(mean) if mean != 0 else None
    return SampleSummary(
        n=int(values.size),
        mean=mean,
        std=std,
        cv=cv,
        ci_low=ci_low,
        ci_high=ci_high,
        median=float(np.median(values)),
        min=float(values.min()),
        max=float(values.max()),
    )


def summarize(samples: Sequence[float]) -> SampleSummary:
    """:func:`describe` of the per-run values of one side of a comparison (each > 0)."""
    return describe(positive_values(samples, "samples").tolist())


def positive_values(samples: Sequence[float], side: str) -> NDArray[np.float64]:
    try:
        values = np.asarray(samples, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise StatsInputError(f"{side} values {samples!r} are not numbers: {exc}") from None
    if values.ndim != 1 or values.size == 0:
        raise StatsInputError(f"{side} must be a non-empty flat sequence of per-run values")
    for index, value in enumerate(values.tolist()):
        if not (math.isfinite(value) and value > 0):
            raise StatsInputError(
                f"{side} run {index + 1} has value {value!r}: per-run values must be finite and "
                "> 0 (tok/s, accept length and latencies all are); a 0 usually means a failed "
                "run was recorded, so check that run's requests"
            )
    return values


def is_constant(values: NDArray[np.float64]) -> bool:
    return bool(np.all(values == values[0]))


def check_margin(margin: float) -> None:
    if not (math.isfinite(margin) and margin > -1.0):
        raise StatsInputError(
            f"margin={margin!r} must be a finite fraction above -1 (-0.03 for 'at most 3 % worse')"
        )


def check_alpha(alpha: float) -> None:
    if not (0.0 < alpha < 0.5):
        raise StatsInputError(f"alpha={alpha!r} must lie strictly between 0 and 0.5")
