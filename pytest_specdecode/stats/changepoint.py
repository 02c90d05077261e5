"""Which night did it start? E-divisive change points over one series of nightly values.

The cross-night alarm (:mod:`pytest_specdecode.stats.crossnight`) says *that* a series has moved;
this module says *where*, for the report and the bisect. It is Matteson and James's E-divisive with
means (JASA 2014, "A Nonparametric Approach for Multiple Change Point Analysis of Multivariate
Data"), the method MongoDB (Daly et al., ICPE 2020) and Hunter/Apache Otava use for exactly this
job: the split that maximises the energy statistic

    Q(tau) = tau (n - tau) / n * (2 E|X - Y| - E|X - X'| - E|Y - Y'|)

(X the values before the split, Y after; power 1), found by recursive bisection, each split kept
only when a permutation test says it is unlikely under "no change" (the stopping rule of the
paper and of MongoDB's ``signal-processing-algorithms``; Otava's t-test shortcut ignores that the
split was chosen as the argmax, which is why it raises about 10 % false alarms a month at its
"0.1 %" setting; docs/statistics.md).

Why not a library: ``ruptures`` (numpy and scipy only) has no E-divisive and no significance
test, only penalised costs whose penalty would need calibrating anyway; Apache Otava pins numpy
2.2 and pulls service clients, far beyond a pytest plugin's dependencies. The series here are
short (tens to a few hundred nights), so the O(n^2) statistic in numpy costs milliseconds.

Pure and deterministic: the permutations come from a fixed seed, so the same history always
names the same night.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = ["ChangePoint", "e_divisive", "energy_split"]

MIN_SEGMENT = 3
"""Nights on each side of a split: with fewer, one outlier night is a "segment"."""


@dataclass(frozen=True)
class ChangePoint:
    """A split of the series: ``index`` is the first value after the change."""

    index: int
    statistic: float  # Q at the split
    p_value: float  # permutation p-value of the split within its segment
    before: float  # mean of the segment's values before the split
    after: float  # mean after it


def _q_all(values: NDArray[np.float64], min_segment: int) -> NDArray[np.float64]:
    """Q(tau) for every split tau of ``values`` (rows: permutations), -inf where not allowed.

    With D the matrix of |x_i - x_j|, the three sums are read off two-dimensional cumulative
    sums, so all splits cost O(n^2) together instead of O(n^3)."""
    x = np.atleast_2d(values)
    n = x.shape[1]
    distances = np.abs(x[:, :, None] - x[:, None, :])
    cumulative = distances.cumsum(axis=1).cumsum(axis=2)
    total = cumulative[:, -1, -1]
    taus = np.arange(1, n)
    within_left = cumulative[:, taus - 1, taus - 1]  # both indices < tau (each pair twice)
    left_rows = cumulative[:, taus - 1, -1]  # first index < tau, second anything
    across = left_rows - within_left
    within_right = total[:, None] - 2 * left_rows + within_left
    left, right = taus.astype(np.float64), (n - taus).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        energy = (
            2.0 * across / (left * right)
            - within_left / (left * np.maximum(left - 1, 1))
            - within_right / (right * np.maximum(right - 1, 1))
        )
    q = left * right / n * energy
    allowed = (taus >= min_segment) & (n - taus >= min_segment)
    return np.where(allowed[None, :], q, -np.inf)


def energy_split(
    values: Sequence[float] | NDArray[np.float64],
    *,
    permutations: int = 199,
    seed: int = 0,
    min_segment: int = MIN_SEGMENT,
) -> ChangePoint | None:
    """The single most likely change point of ``values`` and its permutation p-value (the share
    of ``permutations`` random orders, plus the observed one, whose best Q is at least the
    observed best Q), or None when the series is too short for two segments."""
    x = np.asarray(values, dtype=np.float64)
    n = x.size
    if n < 2 * min_segment or not np.all(np.isfinite(x)):
        return None
    observed = _q_all(x, min_segment)[0]
    tau = int(np.argmax(observed)) + 1
    best = float(observed[tau - 1])
    rng = np.random.default_rng(seed)
    shuffled = np.stack([rng.permutation(x) for _ in range(permutations)]) if permutations else x
    exceed = 0
    if permutations:
        # In chunks, so that a long series does not build permutations x n x n at once.
        for start in range(0, permutations, 50):
            chunk = shuffled[start : start + 50]
            exceed += int(np.sum(_q_all(chunk, min_segment).max(axis=1) >= best - 1e-12))
    p_value = (exceed + 1) / (permutations + 1)
    return ChangePoint(
        index=tau,
        statistic=best,
        p_value=p_value,
        before=float(x[:tau].mean()),
        after=float(x[tau:].mean()),
    )


def e_divisive(
    values: Sequence[float] | NDArray[np.float64],
    *,
    significance: float = 0.05,
    permutations: int = 199,
    seed: int = 0,
    min_segment: int = MIN_SEGMENT,
    max_points: int = 10,
) -> tuple[ChangePoint, ...]:
    """All significant change points of ``values`` in index order, by recursive bisection: the
    segment with the strongest split is split when its permutation p-value is at most
    ``significance``, and the search stops at the first segment that is not (Matteson and
    James's procedure). Indices are in ``values``' coordinates; ``before`` and ``after`` are the
    means of the neighbouring segments at the time of the split."""
    x = np.asarray(values, dtype=np.float64)
    segments = [(0, x.size)]
    found: list[ChangePoint] = []
    for round_ in range(max_points):
        candidates = []
        for start, end in segments:
            split = energy_split(x[start:end], permutations=0, seed=seed, min_segment=min_segment)
            if split is not None:
                candidates.append((split.statistic, start, end))
        if not candidates:
            break
        _, start, end = max(candidates)
        split = energy_split(
            x[start:end], permutations=permutations, seed=seed + round_, min_segment=min_segment
        )
        if split is None or split.p_value > significance:
            break
        found.append(
            ChangePoint(
                index=start + split.index,
                statistic=split.statistic,
                p_value=split.p_value,
                before=split.before,
                after=split.after,
            )
        )
        segments.remove((start, end))
        segments += [(start, start + split.index), (start + split.index, end)]
    return tuple(sorted(found, key=lambda point: point.index))
