"""What the cross-night detector can see from tonight: the drop it would flag within 7, 14 and
28 nights if that drop started tomorrow, from the calibration of its own thresholds.

The level is then known from the points since the last acknowledged change (the baseline's
launches and every night, at most the reference window of them), so the figure improves night by
night after a reset: right after a new baseline a drop must be larger to be seen within a week
than after a month of nights. It is simulated (seeded, ``paths`` paths) in night-SD units with
the detector's own k and thresholds: the error of the level from ``m`` points, then the changed
nights; the statistic is taken at the true first changed night only (the scan over every
candidate can only flag sooner), with the noise taken as known (its error is in the
thresholds). A lower bound on what the detector flags, stated as such.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pytest_specdecode.stats.crossnight import CrossNightState
from pytest_specdecode.stats.scan import threshold_at, thresholds

__all__ = ["Horizon", "horizon"]

NIGHTS = (7, 14, 28)
POWER = 0.9
_GRID = np.geomspace(0.05, 15.0, 80)  # drops in night SDs


@dataclass(frozen=True)
class Horizon:
    """The smallest relative drops flagged with ``power`` within each number of nights."""

    nights_since: int
    points: int  # the points the level is known from tonight
    power: float
    within: tuple[tuple[int, float], ...]  # (nights, drop as a positive fraction; inf: none)

    def to_json(self) -> dict[str, object]:
        return {
            "nights_since": self.nights_since,
            "points": self.points,
            "power": self.power,
            "within": {str(n): (d if math.isfinite(d) else None) for n, d in self.within},
        }

    def describe(self) -> str:
        parts = ", ".join(
            f"{drop:.1%} within {count} nights" if math.isfinite(drop) else f"none within {count}"
            for count, drop in self.within
        )
        return f"a drop starting tomorrow is flagged with {self.power:.0%}: {parts}"


def horizon(
    state: CrossNightState,
    *,
    nights: Sequence[int] = NIGHTS,
    power: float = POWER,
    paths: int = 4000,
    seed: int = 0,
) -> Horizon | None:
    """What ``state``'s detector would flag (module docstring); None when it cannot judge yet."""
    plan, sigma = state.plan, state.sigma
    if plan is None or sigma is None or state.k is None or not sigma > 0:
        return None
    found = thresholds(plan)
    tonight = state.nights
    points = min(state.launches + tonight, plan.window)
    longest = max(nights)
    rng = np.random.default_rng(seed)
    level_error = rng.standard_normal(paths) / math.sqrt(points)
    noise = np.cumsum(rng.standard_normal((paths, longest)), axis=1)
    n = np.arange(1, longest + 1, dtype=np.float64)
    h = np.array([threshold_at(found, tonight + i) for i in range(1, longest + 1)])
    weight = 1.0 / (1.0 / points + 1.0 / n)
    # W_n for each drop on the grid (rows), path and night: D = drop + level error - mean noise
    base = level_error[:, None] - noise / n  # (paths, nights)
    hit_by = np.full((_GRID.size, paths), np.inf)
    for row, drop in enumerate(_GRID):
        over = (drop + base - state.k) * weight > h
        hit_by[row] = np.where(over.any(axis=1), over.argmax(axis=1) + 1, np.inf)
    within = []
    for count in nights:
        caught = (hit_by <= count).mean(axis=1)
        enough = np.flatnonzero(caught >= power)
        drop = -math.expm1(-float(_GRID[enough[0]]) * sigma) if enough.size else math.inf
        within.append((count, drop))
    return Horizon(tonight, points, power, tuple(within))
