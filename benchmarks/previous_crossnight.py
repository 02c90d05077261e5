"""The cross-night rule before issue 44, kept as the nightly benchmark's comparator: a CUSUM
against a reference frozen after the first 90 measured nights since an acknowledged change,
blind (warming up) until then. Moved here unchanged from pytest_specdecode/stats/crossnight.py
at c91e736 (docs/statistics.md describes it under "The 90-night rule, before"); only its
history reader and its sensitivity function are left out, and its Night is the package's
(read by attribute: mean, runs, run_sd, acknowledged, when, session)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

from pytest_specdecode.stats.calibration_cache import code_digest, memoized
from pytest_specdecode.stats.changepoint import ChangePoint, e_divisive
from pytest_specdecode.stats.crossnight import Night
from pytest_specdecode.stats.distributions import t_isf

__all__ = ["CrossNightState", "DetectorConfig", "detect", "threshold_for"]

WINSOR = 4.0
"""Robust SDs beyond which a reference night is winsorised."""

Z_CLIP = 3.0
"""A monitored night's z is clipped here, so that one night adds at most ``Z_CLIP - k`` to the
statistic: a crashed or half-warm launch cannot raise the alarm alone while ``h`` exceeds that
(it does at every k the defaults produce), and a real large drop still moves the statistic by
``Z_CLIP - k`` a night (the nightly gate FAILs it the same night anyway). The calibration clips
in the same way, so the false-alarm level is unchanged."""

MIN_STEP = 1.0
"""The least that the largest clipped night adds to the statistic. On a box whose nights vary
less than ``|ln(1 - min_change)| / (2 (Z_CLIP - MIN_STEP))`` (1.3 % at the default 5 %), k is at
least ``Z_CLIP - MIN_STEP`` and a clip at Z_CLIP would let a night add nothing, so the detector
could never fire: the H200's no-speculation nights vary 0.78 % (k = 3.3). There the clip moves to
``k + MIN_STEP`` (:func:`clip_for`) and h is at least the largest step, so that no single night
raises the alarm alone at any k."""

MIN_EARLIER = 10
"""Measured nights an earlier regime needs before its reference adds to the SD's df."""

SIGMA_FLOOR = 0.001
"""The smallest night-to-night log-SD believed (0.1 %): a reference whose nights are all equal
(a deterministic metric, rounding) would otherwise make any difference an infinite z."""

_CALIBRATION_PATHS = 20_000  # Monte Carlo error of the false-alarm level about +-0.0013
_CALIBRATION_SEED = 20_261_203
_K_GRID = 0.05  # k is rounded to this grid for calibration (h varies slowly with k)
_DF_GRID = 30  # df pooled from earlier references, rounded down to this grid
_MAX_EXTRA_DF = 600  # beyond this the SD is as good as known for h


@dataclass(frozen=True)
class DetectorConfig:
    """What the detector is for and how sure it must be."""

    reference_nights: int = 90
    min_change: float = 0.05  # the smallest drop worth a bisect: sets k
    false_alarm: float = 0.035  # P(false alarm within `horizon` monitored nights), regressions
    horizon: int = 30
    higher_is_better: bool = True
    pool: bool = True  # pool the SD with the references of earlier regimes of the series
    attribute: bool = True  # run the E-divisive attribution on an alarm (simulations skip it)

    def __post_init__(self) -> None:
        if self.reference_nights < 5:
            raise ValueError(f"reference_nights={self.reference_nights}: at least 5 nights")
        if not 0 < self.min_change < 1:
            raise ValueError(f"min_change={self.min_change}: a fraction in (0, 1)")
        if not 0 < self.false_alarm < 0.5:
            raise ValueError(f"false_alarm={self.false_alarm}: a probability in (0, 0.5)")
        if self.horizon < 1:
            raise ValueError(f"horizon={self.horizon}: at least one night")


@dataclass(frozen=True)
class CrossNightState:
    """The detector's state after the last night of a series; recomputed from the series alone.

    ``status`` is "warming up" (reference incomplete; ``reason`` says how many nights are
    missing), "watching" or "alarm". Indices refer to the input sequence of nights."""

    status: str
    reason: str
    since: int  # index of the first night after the last acknowledged change
    nights: int  # measured nights since then
    reference_nights: int
    monitored: int  # measured nights after the reference
    level: float | None  # reference level in the metric's unit
    sigma: float | None  # night-to-night log-SD of the reference
    k: float | None
    h: float | None
    statistic: float  # regression-side CUSUM now
    statistic_up: float  # improvement-side CUSUM now
    alarm: bool  # a regression alarm (the improvement side is only reported)
    direction: str | None  # "regression" / "improvement" / None
    alarm_index: int | None  # the night the statistic first crossed h
    start_index: int | None  # estimated first changed night (the E-divisive split, else Page)
    shift: float | None  # estimated relative change from start_index on (ratio - 1)
    shift_low: float | None  # 95 % interval of the shift
    shift_high: float | None
    changepoint: ChangePoint | None  # E-divisive attribution over the nights since `since`
    changepoint_index: int | None  # its index in the input sequence

    def describe(self, nights: Sequence[Night] = ()) -> str:
        """One line for the report; ``nights`` (the input) names the start night."""
        if self.status == "warming up":
            return f"cross-night detector warming up: {self.reason}"
        head = (
            f"cross-night CUSUM {self.statistic:.2f} of h {self.h:.2f} (k {self.k:.2f}, "
            f"reference {self.reference_nights} nights, night SD {self.sigma or 0:.1%})"
        )
        if self.direction is None:
            return f"{head}: no change"
        start = ""
        if self.start_index is not None:
            night = nights[self.start_index] if self.start_index < len(nights) else None
            label = night.when or night.session if night is not None else None
            # counted from 1, as a person counts the nights of the series
            start = f", estimated to start at night {self.start_index + 1}" + (
                f" ({label})" if label else ""
            )
        size = ""
        if self.shift is not None:
            size = f" of {self.shift:+.1%} (95% CI {self.shift_low:+.1%} to {self.shift_high:+.1%})"
        return f"{head}: {self.direction}{size}{start}"


# --------------------------------------------------------------------------- reference


def _reference(values: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Level and night SD of each row's reference nights (rows: paths; the detector uses one).

    Winsorised at WINSOR robust SDs around the median (the robust SD from the median absolute
    successive difference, which a step or a drift barely moves), then the mean and the sample
    SD: the reference is frozen right after an acknowledged change, short enough for drift to
    matter less than efficiency (the sample SD's R - 1 df against the von Neumann estimate's
    about 2 (R - 1) / 3 cost 3-4 nights of delay at -5 % and launch CV 5 %; a drift inflates it,
    which errs towards fewer alarms)."""
    x = np.atleast_2d(values)
    median = np.median(x, axis=1, keepdims=True)
    diffs = np.diff(x, axis=1)
    robust = 1.4826 * np.median(np.abs(diffs), axis=1, keepdims=True) / math.sqrt(2.0)
    spread = np.where(robust > 0, WINSOR * robust, np.inf)
    clipped = np.clip(x, median - spread, median + spread)
    return clipped.mean(axis=1), clipped.std(axis=1, ddof=1)


def clip_for(k: float) -> float:
    """Where a night's z is clipped for reference value ``k`` (:data:`Z_CLIP`, :data:`MIN_STEP`)."""
    return max(Z_CLIP, k + MIN_STEP)


def _cusum_paths(
    z: NDArray[np.float64], k: float
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """The regression-side CUSUM along each row of ``z`` (winsorised), and its running max."""
    clip = clip_for(k)
    z = np.clip(z, -clip, clip)
    s = np.zeros(z.shape[0])
    path = np.empty_like(z)
    for t in range(z.shape[1]):
        s = np.maximum(0.0, s - z[:, t] - k)
        path[:, t] = s
    return path, np.maximum.accumulate(path, axis=1)


# --------------------------------------------------------------------------- threshold


def _simulate_threshold(
    reference_nights: int, k: float, level: float, horizon: int, extra_df: int
) -> float:
    # Null paths in standard units: the reference is drawn and estimated as the detector does
    # (so h carries the error of the estimated level and SD), its variance pooled with
    # `extra_df` df from earlier references, then `horizon` monitored nights. h is the
    # (1 - level) quantile of the largest regression-side CUSUM over the horizon.
    rng = np.random.default_rng(_CALIBRATION_SEED)
    paths = _CALIBRATION_PATHS
    reference = rng.standard_normal((paths, reference_nights))
    monitored = rng.standard_normal((paths, horizon))
    mu, sigma = _reference(reference)
    if extra_df:
        extra = rng.chisquare(extra_df, paths)  # the earlier references' sum of squares
        own = reference_nights - 1
        sigma = np.sqrt((own * sigma**2 + extra) / (own + extra_df))
    z = (monitored - mu[:, None]) / np.maximum(sigma, 1e-12)[:, None]
    _, running = _cusum_paths(z, k)
    # never below one night's largest step: one outlier night must not alarm alone (MIN_STEP)
    return max(float(np.quantile(running[:, -1], 1.0 - level)), clip_for(k) - k)


@lru_cache(maxsize=256)
def threshold_for(
    reference_nights: int, k: float, false_alarm: float, horizon: int, extra_df: int = 0
) -> float:
    """The calibrated h (module docstring) for ``k`` rounded to the calibration grid and
    ``extra_df`` (df of the SD pooled from earlier references) rounded down to a multiple of
    :data:`_DF_GRID` (fewer df, a higher h: the rounding errs towards fewer alarms); computed
    once per user and kept on disk (calibration_cache.py)."""
    grid_k = round(round(min(max(k, _K_GRID), 4.0) / _K_GRID) * _K_GRID, 6)
    grid_df = min(extra_df, _MAX_EXTRA_DF) // _DF_GRID * _DF_GRID
    key = {
        "what": "crossnight-cusum-h",  # the same key as before the move: caches stay valid
        "reference_nights": reference_nights,
        "k": grid_k,
        "false_alarm": false_alarm,
        "horizon": horizon,
        "extra_df": grid_df,
        "paths": _CALIBRATION_PATHS,
        "seed": _CALIBRATION_SEED,
        "winsor": WINSOR,
        "clip": Z_CLIP,
        "min_step": MIN_STEP,
        "numpy": np.__version__,
        "code": code_digest((_simulate_threshold, _reference, _cusum_paths, clip_for)),
    }
    return memoized(
        key,
        lambda: (_simulate_threshold(reference_nights, grid_k, false_alarm, horizon, grid_df),),
    )[0]


def _k_for(config: DetectorConfig, sigma: float) -> float:
    return abs(math.log1p(-config.min_change)) / (2.0 * sigma)


# --------------------------------------------------------------------------- detection


def _acknowledged_since(nights: Sequence[Night]) -> int:
    for index in range(len(nights) - 1, -1, -1):
        if nights[index].acknowledged:
            return index + 1
    return 0


def _measured(night: Night) -> bool:
    return night.mean is not None and math.isfinite(night.mean) and night.mean > 0


def detect(nights: Sequence[Night], config: DetectorConfig | None = None) -> CrossNightState:
    """The detector's state after the last of ``nights`` (oldest first; module docstring)."""
    config = config or DetectorConfig()
    since = _acknowledged_since(nights)
    sign = 1.0 if config.higher_is_better else -1.0
    indices = [i for i in range(since, len(nights)) if _measured(nights[i])]
    values = np.array([sign * math.log(float(nights[i].mean or 1.0)) for i in indices])
    r = config.reference_nights
    state = CrossNightState(
        status="warming up", reason="", since=since, nights=len(indices), reference_nights=r,
        monitored=0, level=None, sigma=None, k=None, h=None, statistic=0.0, statistic_up=0.0,
        alarm=False, direction=None, alarm_index=None, start_index=None, shift=None,
        shift_low=None, shift_high=None, changepoint=None, changepoint_index=None,
    )  # fmt: skip
    if len(indices) < r:
        origin = "the acknowledged change" if since else "the start of the history"
        missing = r - len(indices)
        return replace(
            state,
            reason=(
                f"{len(indices)} of the {r} reference nights since {origin}; active after "
                f"{missing} more measured night{'s' if missing != 1 else ''}"
            ),
        )
    mu_arr, sigma_arr = _reference(values[:r])
    mu = float(mu_arr[0])
    extra_ss, extra_df = (0.0, 0)
    if config.pool:
        extra_ss, extra_df = _earlier_references(nights[:since], sign, r)
    sigma = math.sqrt(((r - 1) * float(sigma_arr[0]) ** 2 + extra_ss) / (r - 1 + extra_df))
    floor = _sigma_floor([nights[i] for i in indices[:r]])
    floored = sigma < floor
    sigma = max(sigma, floor)
    k = _k_for(config, sigma)
    h = threshold_for(r, k, config.false_alarm, config.horizon, extra_df)
    z = (values[r:] - mu) / sigma
    down_path = _cusum_paths(z[None, :], k)[0][0]
    up_path = _cusum_paths(-z[None, :], k)[0][0]
    reason = f"reference of {r} nights frozen at night {indices[r - 1]}"
    if extra_df:
        reason += f"; its SD pooled with {extra_df} df from earlier references"
    if floored:
        reason += f"; its night-to-night SD is below the floor, {floor:.2%} used"
    state = replace(
        state,
        status="watching",
        reason=reason,
        monitored=int(z.size),
        level=math.exp(sign * mu),
        sigma=sigma,
        k=k,
        h=h,
        statistic=float(down_path[-1]) if z.size else 0.0,
        statistic_up=float(up_path[-1]) if z.size else 0.0,
    )
    crossed_down = np.flatnonzero(down_path > h)
    crossed_up = np.flatnonzero(up_path > h)
    if not crossed_down.size and not crossed_up.size:
        return state
    # A regression crossing alarms whatever the improvement side did (an improvement, then a
    # loss, still fails the build); the improvement side alone is only reported.
    regression = bool(crossed_down.size)
    path = down_path if regression else up_path
    first = int(crossed_down[0] if regression else crossed_up[0])
    # Page's estimator: the change began right after the statistic last stood at zero.
    zeros = np.flatnonzero(path[:first] == 0.0)
    page = r + (int(zeros[-1]) + 1 if zeros.size else 0)
    chosen = _nearest(e_divisive(values), page) if config.attribute else None
    # The night it started: the E-divisive split nearest to Page's estimate when there is one
    # after the reference (it weighs the whole series on both sides; Page's estimate is where
    # the statistic last stood at zero, which a low night before a change pulls early), else
    # Page's. The shift is measured from there on.
    began = chosen.index if chosen is not None and r <= chosen.index <= r + first else page
    changed = values[began:]
    shift = float(changed.mean() - mu)
    se = sigma * math.sqrt(1.0 / changed.size + 1.0 / r)
    half = float(t_isf(0.025, r - 1 + extra_df)) * se
    return replace(
        state,
        status="alarm",
        alarm=regression,
        direction="regression" if regression else "improvement",
        alarm_index=indices[r + first],
        start_index=indices[began],
        shift=math.expm1(shift),  # on the higher-is-better scale, as every ratio here
        shift_low=math.expm1(shift - half),
        shift_high=math.expm1(shift + half),
        changepoint=chosen,
        changepoint_index=indices[chosen.index] if chosen is not None else None,
    )


def _earlier_references(nights: Sequence[Night], sign: float, r: int) -> tuple[float, int]:
    """Sum of squares and df of the reference windows (first ``r`` measured nights) of every
    regime before the last acknowledged change, each about its own mean. An acknowledged change
    moves the level (a new baseline) but seldom the box's night-to-night noise, and the SD's df
    are what the delay at launch CV 5 % is most sensitive to (docs/statistics.md)."""
    total, df = 0.0, 0
    regime: list[float] = []
    for night in [*nights, Night(None, acknowledged=True)]:
        if night.acknowledged:
            if len(regime) >= MIN_EARLIER:
                _, sd = _reference(np.array(regime[:r]))
                total += (min(len(regime), r) - 1) * float(sd[0]) ** 2
                df += min(len(regime), r) - 1
            regime = []
        elif _measured(night):
            regime.append(sign * math.log(float(night.mean or 1.0)))
    return total, df


def _nearest(points: Sequence[ChangePoint], position: int) -> ChangePoint | None:
    """The significant split closest to the CUSUM's estimate (several may exist in a long
    series: an earlier, acknowledged-in-practice change is not this alarm's cause)."""
    if not points:
        return None
    return min(points, key=lambda point: abs(point.index - position))


def _sigma_floor(reference: Sequence[Night]) -> float:
    """The run noise of one night's mean when known (a launch mean cannot vary less than its
    runs do), never below :data:`SIGMA_FLOOR`."""
    known = [
        night.run_sd / math.sqrt(night.runs)
        for night in reference
        if night.run_sd is not None and night.runs > 0 and math.isfinite(night.run_sd)
    ]
    return max(SIGMA_FLOOR, float(np.median(known)) if known else 0.0)
