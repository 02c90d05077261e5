"""The change scan behind the cross-night detector: a CUSUM against every earlier point.

A persistent drop must be flagged soon after it lands, and most land days or weeks after a
baseline was recorded (a team re-records at every change it accepts), when the new level is
known from a few points only. A CUSUM against a reference frozen after 90 nights was blind for
those 90 nights; a CUSUM against a level learnt as the nights come in absorbs the drop into the
level it is compared with. This statistic does neither.

**Points.** The log values of one series since the last acknowledged change, oriented so that
higher is better: the baseline's launch means first (``launches`` of them, the new level's
first evidence), then one value a night.

**Statistic.** On night ``t`` (1-based, counting nights only), for every candidate first
changed night ``tau`` (``1 <= tau <= t``, and ``tau >= 2`` when no launch came before the
nights), the points before ``tau`` (at most ``window`` of them) are the level and the nights
from ``tau`` to ``t`` the changed ones:

    D = (mean(before) - mean(from tau on)) / sigma,   V = 1/m + 1/n
    W_t = max over tau of (D - k) / V

the log-likelihood ratio of a drop of ``2k`` night SDs against none when the level is only
known from the ``m`` points before (divided by ``2k``). With many points before, ``V`` tends to
``1/n`` and ``W_t`` to Page's CUSUM ``max_tau sum(mu - x_i)/sigma - n k`` with the level known;
right after a reset ``V`` carries the level's own error, so a level known from four points is
not trusted like one known from ninety. ``k = |ln(1 - min_change)| / (2 sigma)``, rounded down
to :data:`K_GRID` (a smaller k is tuned to a slightly smaller drop). The mirror image (``-D``)
watches for an improvement.

**Noise.** ``sigma`` is, on each night, the estimate from ``extra_df`` degrees of freedom known
before the reset (the same series' earlier regimes, or a stated prior: the caller's choice,
crossnight.py), pooled, where the caller asks (``learn``), with the von Neumann estimate of the
points since (half the mean squared successive difference, about two thirds of a df per
difference). Noise carried over from earlier regimes is not pooled with the points since: while
they are few, the step being looked for is one of their few differences and inflated the
estimate by a third in the first week. A night more than ``max(3, k + 1)`` night SDs from the
mean of all the points before it is winsorised there, so that one crashed or half-warm launch
adds at most about one step; the thresholds are never below that step.

**Thresholds.** Calibrated by simulation (:func:`thresholds`) for a constant hazard: an
unchanged build that has not alarmed by night ``t - 1`` alarms on night ``t`` with probability
``1 - (1 - false_alarm) ** (1 / horizon)``, so any ``horizon`` nights (30) see a false alarm with
probability ``false_alarm`` (3.5 %), nights 1-30 after a reset as much as nights 91-120. The
thresholds are constant over blocks of nights (:data:`BLOCKS`) and solved block by block on
null paths drawn and estimated exactly as above (seeded, kept on disk by calibration_cache.py);
after the last block the last threshold holds (the level is then known from ``window`` points
and the statistic is close to stationary).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

from pytest_specdecode.stats.calibration_cache import code_digest, memoized

__all__ = ["BLOCKS", "K_GRID", "ScanPath", "ScanPlan", "clip_for", "scan", "thresholds"]

Z_CLIP = 3.0
"""A night is winsorised this many night SDs from the level before it (module docstring)."""

MIN_STEP = 1.0
"""The least one clipped night may add beyond k: on a quiet box k exceeds :data:`Z_CLIP` (an
H200's no-speculation nights vary 0.78 %: k = 3.3 for a 5 % drop), and a clip at 3 would let a
night add nothing, so nothing could ever be flagged there."""

BLOCKS: tuple[tuple[int, int], ...] = (
    (1, 1), (2, 2), (3, 3), (4, 5), (6, 10), (11, 20), (21, 30), (31, 45), (46, 60), (61, 90),
    (91, 120),
)  # fmt: skip
"""Nights (first, last) that share one threshold: single nights at first, where the level's
error shrinks fastest, then longer blocks, whose thresholds are estimated from more alarms."""

CALIBRATED_NIGHTS = BLOCKS[-1][1]
K_GRID = 1.12
"""k is rounded down to a power of this ratio from 0.2 (to at most 12 % below: tuned to a drop
up to 12 % smaller than ``min_change``), so that the calibrations are a few dozen keys."""

_PATHS = 20_000  # the hazard of a block is estimated from about 24-600 null alarms
_SEED = 20_261_206


def clip_for(k: float) -> float:
    """How many night SDs from the level a night is winsorised at, for reference value ``k``."""
    return max(Z_CLIP, k + MIN_STEP)


def one_night_step(k: float, window: int) -> float:
    """The most one winsorised night can raise the statistic alone: a night at the clip,
    ``clip * sqrt(1 + 1/m)`` night SDs below the level of the ``m`` points before it, gives
    ``(clip * sqrt(1 + 1/m) - k) / (1/m + 1)``, largest for the smallest ``m`` on a quiet box
    (k near the clip) and for the largest on a noisy one. Thresholds are never below it (a
    half-warm launch must not alarm alone)."""
    clip = clip_for(k)
    steps = ((clip * math.sqrt(1 + 1 / m) - k) / (1 / m + 1) for m in range(1, window + 1))
    return max(max(steps), clip - k)


def grid_k(k: float) -> float:
    """``k`` rounded down to the calibration grid (powers of :data:`K_GRID` from 0.2)."""
    k = min(max(k, 0.2), 6.0)
    steps = math.floor(math.log(k / 0.2) / math.log(K_GRID) + 1e-9)
    value: float = 0.2 * math.pow(K_GRID, steps)
    return round(value, 6)


@dataclass(frozen=True)
class ScanPlan:
    """What the thresholds depend on."""

    launches: int  # baseline launch points before the first night (0: an acknowledged level)
    k: float  # on the grid (grid_k)
    extra_df: int  # df of the noise known before the reset, rounded down to its grid
    learn: bool  # whether the points since the reset add to the noise estimate
    window: int  # the most points before a candidate start that its level is taken from
    false_alarm: float  # per `horizon` nights
    horizon: int

    @property
    def hazard(self) -> float:
        """The conditional false-alarm probability of one night."""
        return 1.0 - math.pow(1.0 - self.false_alarm, 1.0 / self.horizon)


@dataclass(frozen=True)
class ScanPath:
    """The statistic along the nights of one or many series (rows); columns are nights."""

    down: NDArray[np.float64]  # regression side W_t (-inf: not judged yet)
    up: NDArray[np.float64]  # improvement side
    start: NDArray[np.int64]  # the tau (1-based night) that maximises the regression side
    start_up: NDArray[np.int64]  # and the improvement side
    sigma: NDArray[np.float64]  # the night SD used on each night
    df: NDArray[np.float64]  # its degrees of freedom
    clipped: NDArray[np.float64]  # the points as winsorised (launches first)


def scan(
    points: NDArray[np.float64],
    launches: int,
    k: float,
    window: int,
    extra_ss: NDArray[np.float64],
    extra_df: float,
    *,
    sigma_floor: float = 0.0,
    full: bool = True,
    learn: bool = True,
) -> ScanPath:
    """The statistic on every night of each row of ``points`` (rows: series or simulated paths;
    the first ``launches`` columns are the baseline's launch means, the rest one per night).
    ``extra_ss``: per row, the sum of squares of the noise known before the reset (``extra_df``
    df of it). ``sigma_floor``: the smallest night SD believed. ``full=False`` computes the
    regression side alone (the calibration needs nothing else). ``learn=False``: the noise is
    the one known before alone (carried over: a step in the points since, the very thing looked
    for, would otherwise inflate it while they are few)."""
    x, sigma, df = _winsorised(points, launches, k, extra_ss, extra_df, sigma_floor, learn)
    rows, total = x.shape
    sums = np.zeros((rows, total + 1))  # sums[:, j]: the sum of the first j winsorised points
    sums[:, 1:] = np.cumsum(x, axis=1)
    nights = total - launches
    if rows * nights * nights <= 4_000_000:  # a series, or a few paths: every night at once
        sides = _all_nights(sums, sigma, launches, k, window)
    else:  # the calibration's paths: night by night, to keep the memory small
        sides = _night_by_night(sums, sigma, launches, k, window, full)
    return ScanPath(*sides, sigma, df, x)


def _winsorised(
    points: NDArray[np.float64], launches: int, k: float, extra_ss: NDArray[np.float64],
    extra_df: float, floor: float, learn: bool,
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:  # fmt: skip
    """The points with each night winsorised against the mean of every point before it (at
    ``clip_for(k)`` night SDs of the SD known before that night), and the night SD and its df
    on each night (that night included)."""
    x = np.array(np.atleast_2d(points), dtype=np.float64)
    rows, total = x.shape
    if rows == 1:  # a series: the same steps in plain floats, without numpy's per-call cost
        known = float(np.ravel(extra_ss)[0])
        return _winsorised_series(x[0], launches, k, known, extra_df, floor, learn)
    nights = total - launches
    sigma_out = np.full((rows, nights), np.nan)
    df_out = np.zeros((rows, nights))
    running = x[:, :launches].sum(axis=1)
    squares = np.zeros(rows)  # the sum of squared successive differences so far
    if launches >= 2:
        squares = np.sum(np.diff(x[:, :launches], axis=1) ** 2, axis=1)
    extra = np.broadcast_to(np.asarray(extra_ss, dtype=np.float64), (rows,))
    clip = clip_for(k)
    sigma = _sigma(extra, extra_df, squares, launches, floor, learn)
    for t in range(nights):
        column = launches + t  # this night's column in x
        if column:
            reach = clip * sigma * math.sqrt(1.0 + 1.0 / column)
            before = running / column
            x[:, column] = np.where(
                np.isfinite(reach),
                np.clip(x[:, column], before - reach, before + reach),
                x[:, column],
            )
            squares = squares + (x[:, column] - x[:, column - 1]) ** 2
        running = running + x[:, column]
        sigma = _sigma(extra, extra_df, squares, column + 1, floor, learn)
        sigma_out[:, t] = sigma
        df_out[:, t] = extra_df + _vn_df(column + 1, learn)
    return x, sigma_out, df_out


def _winsorised_series(
    row: NDArray[np.float64], launches: int, k: float, extra: float, extra_df: float,
    floor: float, learn: bool,
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:  # fmt: skip
    """:func:`_winsorised` for one series (tests/unit/test_scan.py holds them equal)."""
    x = [float(v) for v in row]
    nights = len(x) - launches
    sigmas, dfs = [], []
    running = sum(x[:launches])
    squares = sum((x[i] - x[i - 1]) ** 2 for i in range(1, launches))

    def sigma_at(count: int) -> float:
        own_df = _vn_df(count, learn)
        if extra_df + own_df <= 0:
            return math.nan
        own = squares / 2.0 / (count - 1) * own_df if own_df > 0 else 0.0
        return max(math.sqrt((extra + own) / (extra_df + own_df)), floor)

    clip = clip_for(k)
    sigma = sigma_at(launches)
    for t in range(nights):
        column = launches + t
        if column:
            reach = clip * sigma * math.sqrt(1.0 + 1.0 / column)
            if math.isfinite(reach):
                before = running / column
                x[column] = min(max(x[column], before - reach), before + reach)
            squares += (x[column] - x[column - 1]) ** 2
        running += x[column]
        sigma = sigma_at(column + 1)
        sigmas.append(sigma)
        dfs.append(extra_df + _vn_df(column + 1, learn))
    return np.array([x]), np.array([sigmas]), np.array([dfs])


Sides = tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.int64], NDArray[np.int64]]
"""The regression and improvement statistics, and the candidate that maximises each."""


def _candidates(
    launches: int, window: int, night: NDArray[np.int64] | np.int64, tau: NDArray[np.int64]
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.float64], NDArray[np.bool_]]:
    """For nights and candidate first changed nights (1-based, broadcast together): the
    points before the candidate (end), where its level's window begins, 1 / V, and which
    pairs are candidates at all."""
    ends = launches + tau - 1
    begins = np.maximum(0, ends - window)
    valid = (tau >= (1 if launches else 2)) & (tau <= night)
    m = np.maximum(ends - begins, 1)
    n = np.maximum(launches + night - ends, 1)
    return ends, begins, 1.0 / (1.0 / m + 1.0 / n), valid


def _all_nights(
    sums: NDArray[np.float64], sigma: NDArray[np.float64], launches: int, k: float, window: int
) -> Sides:
    nights = sigma.shape[1]
    night = np.arange(1, nights + 1)[:, None]  # rows of the (night, tau) plane
    tau = np.arange(1, nights + 1)[None, :]
    ends, begins, weight, valid = _candidates(launches, window, night, tau)
    m = np.maximum(ends - begins, 1)
    count = launches + night
    level = (sums[:, ends] - sums[:, begins]) / m  # (rows, 1, tau)
    changed = (sums[:, count] - sums[:, ends]) / np.maximum(count - ends, 1)  # (rows, night, tau)
    with np.errstate(invalid="ignore"):
        d = (level - changed) / sigma[:, :, None]
    usable = valid[None, :, :] & np.isfinite(d)
    w_down = np.where(usable, (d - k) * weight, -np.inf)
    w_up = np.where(usable, (-d - k) * weight, -np.inf)
    best, best_up = np.argmax(w_down, axis=2), np.argmax(w_up, axis=2)
    down = np.take_along_axis(w_down, best[:, :, None], axis=2)[:, :, 0]
    up = np.take_along_axis(w_up, best_up[:, :, None], axis=2)[:, :, 0]
    judged = np.isfinite(down)
    return down, up, np.where(judged, best + 1, 0), np.where(judged, best_up + 1, 0)


def _night_by_night(
    sums: NDArray[np.float64], sigma: NDArray[np.float64], launches: int, k: float,
    window: int, full: bool,
) -> Sides:  # fmt: skip
    rows, nights = sigma.shape
    down = np.full((rows, nights), -np.inf)
    up = np.full((rows, nights), -np.inf)
    start = np.zeros((rows, nights), dtype=np.int64)
    start_up = np.zeros((rows, nights), dtype=np.int64)
    for t in range(nights):
        tau = np.arange(1, t + 2)
        ends, begins, weight, valid = _candidates(launches, window, np.int64(t + 1), tau)
        if not valid.any() or not np.isfinite(sigma[:, t]).any():
            continue
        ends, begins, weight, tau = ends[valid], begins[valid], weight[valid], tau[valid]
        count = launches + t + 1
        level = (sums[:, ends] - sums[:, begins]) / (ends - begins)
        changed = (sums[:, count : count + 1] - sums[:, ends]) / (count - ends)
        known = np.isfinite(sigma[:, t])
        d = (level - changed) * np.where(known, 1.0 / np.where(known, sigma[:, t], 1.0), 0.0)[
            :, None
        ]
        w_down = (d - k) * weight
        if full:
            best = np.argmax(w_down, axis=1)
            down[:, t] = np.take_along_axis(w_down, best[:, None], axis=1)[:, 0]
            w_up = (-d - k) * weight
            best_up = np.argmax(w_up, axis=1)
            up[:, t] = np.take_along_axis(w_up, best_up[:, None], axis=1)[:, 0]
            start[:, t], start_up[:, t] = tau[best], tau[best_up]
        else:
            down[:, t] = np.max(w_down, axis=1)
        down[~known, t] = -np.inf
        up[~known, t] = -np.inf
    return down, up, start, start_up


def _vn_df(count: int, learn: bool = True) -> float:
    """The df of the von Neumann estimate from ``count`` points (two thirds of a df per
    difference), or none when the points do not add to the noise estimate."""
    return 2.0 * (count - 1) / 3.0 if count > 1 and learn else 0.0


def _sigma(
    extra: NDArray[np.float64], extra_df: float, squares: NDArray[np.float64], count: int,
    floor: float, learn: bool,
) -> NDArray[np.float64]:  # fmt: skip
    own_df = _vn_df(count, learn)
    total_df = extra_df + own_df
    if total_df <= 0:
        return np.full(extra.shape, np.nan)
    own = squares / 2.0 / (count - 1) * own_df if own_df > 0 else np.zeros(extra.shape)
    return np.maximum(np.sqrt((extra + own) / total_df), floor)


# --------------------------------------------------------------------------- thresholds


def _simulate(plan: ScanPlan) -> tuple[float, ...]:
    # Null paths in night-SD units, estimated exactly as the detector estimates them; the block
    # thresholds are the quantiles of each block's largest statistic among the paths that have
    # not alarmed before it, so the hazard is the same in every block.
    rng = np.random.default_rng(_SEED)
    points = rng.standard_normal((_PATHS, plan.launches + CALIBRATED_NIGHTS))
    extra = rng.chisquare(plan.extra_df, _PATHS) if plan.extra_df else np.zeros(_PATHS)
    path = scan(points, plan.launches, plan.k, plan.window, extra, plan.extra_df, full=False,
                learn=plan.learn)  # fmt: skip
    alive = np.ones(_PATHS, dtype=bool)
    floor = one_night_step(plan.k, plan.window)  # one winsorised night alone never alarms
    found = []
    for first, last in BLOCKS:
        peak = path.down[:, first - 1 : last].max(axis=1)
        target = 1.0 - (1.0 - plan.hazard) ** (last - first + 1)
        judged = alive & np.isfinite(peak)
        h = float(np.quantile(peak[judged], 1.0 - target)) if judged.any() else math.inf
        h = max(h, floor)
        found.append(h)
        alive &= ~(peak > h)
    return tuple(found)


@lru_cache(maxsize=128)
def thresholds(plan: ScanPlan) -> tuple[float, ...]:
    """The threshold of each block of :data:`BLOCKS` for ``plan``, computed once per user and
    kept on disk (about 2-4 s of CPU for each plan)."""
    key = {
        "what": "crossnight-scan-h",
        "launches": plan.launches,
        "k": plan.k,
        "extra_df": plan.extra_df,
        "learn": plan.learn,
        "window": plan.window,
        "false_alarm": plan.false_alarm,
        "horizon": plan.horizon,
        "blocks": [list(block) for block in BLOCKS],
        "paths": _PATHS,
        "seed": _SEED,
        "numpy": np.__version__,
        "code": code_digest(
            (
                _simulate,
                scan,
                _winsorised,
                _candidates,
                _night_by_night,
                _sigma,
                _vn_df,
                clip_for,
                one_night_step,
            )
        ),
    }
    return tuple(memoized(key, lambda: _simulate(plan)))


def threshold_at(found: Sequence[float], night: int) -> float:
    """The threshold of night ``night`` (1-based) from a block list (the last beyond it)."""
    for (first, last), h in zip(BLOCKS, found, strict=True):
        if first <= night <= last:
            return h
    return found[-1]


def per_night(found: Sequence[float], nights: int) -> NDArray[np.float64]:
    """The threshold of each of the first ``nights`` nights."""
    return np.array([threshold_at(found, night) for night in range(1, nights + 1)])


def first_crossing(values: NDArray[np.float64], found: Sequence[float]) -> int | None:
    """The first night (0-based column) whose statistic exceeds its threshold, or None."""
    over = np.flatnonzero(values > per_night(found, values.size))
    return int(over[0]) if over.size else None
