"""Detection across nights: a calibrated CUSUM on the nightly launch means of one check.

One night is one server launch: its mean has log-SD ``sigma_night = sqrt(sigma_L^2 +
sigma_w^2 / n)``, 3-5 % on the boxes measured so far, so no single night can prove a 5-10 % drop
(docs/statistics.md, "Across nights"). A persistent drop shows up only as a run of slightly low
nights. This module accumulates that evidence.

**Series.** Per (test, hardware key, configuration fingerprint, workload, metric): the nightly
launch means, log scale, oriented so that higher is better, oldest first
(:func:`series_from_history` reads them from the JSON-lines history). A night without a
measurement is a gap and is passed over. An *acknowledged change* (a baseline recorded with
``--update-baselines``, which the history records as outcome ``recorded``, or a night compared
with a different stored baseline mean than the night before) restarts everything after it.

**Reference.** The first :attr:`DetectorConfig.reference_nights` (90) measured nights after the
last acknowledged change, *frozen*: not a rolling window, which would absorb a persistent step
within a few nights (Bencher and Conbench's weakness; nightly-detection.md §3). Its level is the
mean and its noise the sample SD, both after winsorising the nights that lie more than
:data:`WINSOR` robust SDs (from the median absolute successive difference, which a step or a
drift barely moves) from the median: a crashed or half-warm launch must not set the scale. The
SD is pooled by df with the reference windows of earlier regimes of the same series (an
acknowledged change moves the level, seldom the box's noise). Why 90 nights and the sample SD:
the error of the estimated level and SD is what separates this detector from the known-noise
oracle, and at 30 nights it cost 4 nights at -5 % / launch CV 3 % and 20 at launch CV 5 %
(docs/statistics.md). Until the reference is complete the detector is *warming up* and says how
many nights it still needs; the nightly gate's verdict covers large drops meanwhile.

**Statistic.** Page's one-sided CUSUM on ``z_t = (x_t - mu) / sigma`` (clipped at
±max(Z_CLIP, k + MIN_STEP), so one outlier night contributes at most max(Z_CLIP - k, MIN_STEP)):

    S_t = max(0, S_{t-1} - z_t - k),   k = |ln(1 + min_change)| / (2 sigma)

the likelihood-ratio-optimal detector for a drop of ``min_change`` (Moustakides 1986). Its mirror
image watches for an improvement, reported but not an alarm that fails anything.

**Threshold.** ``h`` is chosen by simulation so that an unchanged build alarms (regression side)
within :attr:`DetectorConfig.horizon` monitored nights with probability
:attr:`DetectorConfig.false_alarm`, *with the reference estimated* from ``reference_nights`` nights
exactly as above (the oracle with known mu and sigma needs a lower h, and the estimated reference's
error is most of the gap to it). Seeded, cached on disk per (reference length, k, level, horizon)
with :mod:`pytest_specdecode.stats.calibration_cache`, as the sequential plan's looks are. The
default budget is 3.5 % per check per 30 nights, leaving about 1.5 % to the nightly gate's guard
once history exists (:func:`pytest_specdecode.stats.two_level.guard_alpha`): 5 % in all.

**When it fires:** the estimated start is the E-divisive split of the series since the
acknowledged change (:mod:`pytest_specdecode.stats.changepoint`) nearest to Page's estimator (the
night after the CUSUM last left zero), when one lies between the reference and the alarm; else
Page's estimate. The shift is the mean of the nights from the start on against the reference,
with a t interval (it is biased away from zero, as any estimate taken at an alarm is).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pytest_specdecode.stats.calibration_cache import code_digest, memoized
from pytest_specdecode.stats.changepoint import ChangePoint, e_divisive
from pytest_specdecode.stats.distributions import norm_isf, t_isf

__all__ = [
    "CrossNightState",
    "DetectorConfig",
    "Night",
    "Sensitivity",
    "detect",
    "sensitivity",
    "series_from_history",
    "threshold_for",
]

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
class Night:
    """One session's value of one series.

    ``mean`` is the launch mean in the metric's unit (None or not finite: not measured that
    night, a gap); ``runs`` and ``run_sd`` (log scale, within the launch) when known set the SD
    floor; ``acknowledged`` marks a baseline recording or ``--update-baselines``: the reference
    restarts after it."""

    mean: float | None
    runs: int = 0
    run_sd: float | None = None
    when: str | None = None  # the session's time_utc
    session: str | None = None  # its run_id or commit
    acknowledged: bool = False


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
        "what": "crossnight-cusum-h",
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


# --------------------------------------------------------------------------- history


def series_from_history(
    history: Sequence[Mapping[str, Any]],
    *,
    test_id: str,
    hardware_key: str,
    fingerprint: str,
    workload_hash: str,
    metric: str,
) -> list[Night]:
    """One series from history records (oldest first): a Night per session that ran the test
    with this hardware key, configuration fingerprint and workload (the same selection as
    :func:`pytest_specdecode.stats.two_level.prior_for`).

    Acknowledged changes are read from what the history records today: a session whose outcome
    for the test is ``recorded`` (``--update-baselines``: the new baseline's launches are not one
    night's launch, so that night has no value), and a night whose own-baseline check compared
    against a different ``baseline_mean`` than the previous compared night (a baseline recorded
    outside the history's sessions). A crashed night (no mean) is a gap."""
    nights: list[Night] = []
    last_baseline: float | None = None
    key = (test_id, hardware_key, fingerprint, workload_hash)
    for record in history:
        for test in record.get("tests") or ():
            if (
                not isinstance(test, Mapping)
                or (
                    test.get("test_id"),
                    test.get("hardware_key"),
                    test.get("fingerprint"),
                    test.get("workload_hash"),
                )
                != key
            ):
                continue
            when, session = record.get("time_utc"), record.get("run_id") or record.get("commit")
            if test.get("outcome") == "recorded":
                nights.append(Night(None, when=when, session=session, acknowledged=True))
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
            if changed:  # the night compared against a new baseline: a change was acknowledged
                nights.append(Night(None, when=when, session=session, acknowledged=True))
            summary = (test.get("metrics") or {}).get(metric)
            mean = n = cv = None
            if isinstance(summary, Mapping):
                mean, n, cv = summary.get("mean"), summary.get("n"), summary.get("cv")
            usable = isinstance(mean, int | float) and mean > 0 and isinstance(n, int) and n >= 1
            nights.append(
                Night(
                    float(mean) if usable else None,  # type: ignore[arg-type]
                    runs=int(n) if usable else 0,  # type: ignore[arg-type]
                    run_sd=math.sqrt(math.log1p(float(cv) ** 2))
                    if isinstance(cv, int | float) and cv >= 0
                    else None,
                    when=when,
                    session=session,
                )
            )
    return nights


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


# --------------------------------------------------------------------------- what a night sees


@dataclass(frozen=True)
class Sensitivity:
    """What one check can catch at its measured noise (relative drops, positive numbers)."""

    night_sd: float  # log-SD of one night's value at the given launches per night
    one_night: float  # smallest drop the nightly gate FAILs the same night with `power`
    within: tuple[tuple[int, float], ...]  # (nights, smallest drop the detector flags by then)
    launches_needed: int | None  # launches a night for the stated target; None: > max_launches
    target: tuple[float, int] | None  # (drop, nights) the launches are for


def _detector_power(
    shift_sd: float, nights: int, config: DetectorConfig, sigma: float, paths: int, seed: int
) -> float:
    """P(regression alarm within ``nights`` changed nights) for a drop of ``shift_sd`` night
    SDs, with the reference estimated (the change starts right after the reference)."""
    rng = np.random.default_rng(seed)
    r = config.reference_nights
    reference = rng.standard_normal((paths, r))
    monitored = rng.standard_normal((paths, nights)) - shift_sd
    mu, sd = _reference(reference)
    sd = np.maximum(sd, SIGMA_FLOOR / sigma)
    k = _k_for(config, sigma)
    h = threshold_for(r, k, config.false_alarm, config.horizon)
    # k in units of the estimated SD, fixed, as the calibration has it (the detector's own k
    # follows its estimated SD; h is calibrated per k, so conditionally on it this is the same).
    k_paths = k
    clip = clip_for(k)
    z = np.clip((monitored - mu[:, None]) / sd[:, None], -clip, clip)
    s = np.zeros(paths)
    hit = np.zeros(paths, dtype=bool)
    for t in range(nights):
        s = np.maximum(0.0, s - z[:, t] - k_paths)
        hit |= s > h
    return float(hit.mean())


def sensitivity(
    launch_sd: float,
    run_sd: float,
    runs: int,
    *,
    launches: int = 1,
    baseline_launches: int = 3,
    baseline_runs: int = 60,
    margin: float = -0.02,
    alpha: float = 0.15,
    alpha_no_change: float = 0.001,
    power: float = 0.95,
    nights: Sequence[int] = (3, 7, 14, 28),
    target: tuple[float, int] | None = None,
    max_launches: int = 16,
    config: DetectorConfig | None = None,
    paths: int = 4000,
    seed: int = 0,
) -> Sensitivity:
    """The smallest drops one check can catch at launch log-SD ``launch_sd`` and run log-SD
    ``run_sd`` with ``runs`` runs per launch and ``launches`` launches a night.

    ``one_night``: the nightly gate (the two-level verdict with history, whose launch variance
    is then well estimated: a normal approximation) FAILs the drop with ``power`` when both the
    margin's bound at ``alpha`` and the no-change guard at ``alpha_no_change`` are crossed.
    ``within``: the detector (``config``) raises its alarm within each number of ``nights`` after
    the change with ``power``, by simulation with the reference estimated (seeded, ``paths``
    paths, bisection on the drop). ``launches_needed``: for ``target = (drop, nights)``, the
    fewest launches a night whose detector reaches it."""
    config = config or DetectorConfig()
    if launch_sd < 0 or run_sd < 0 or runs < 1 or launches < 1:
        raise ValueError("need launch_sd >= 0, run_sd >= 0, runs >= 1 and launches >= 1")

    def night_sd(count: int) -> float:
        return max(math.sqrt((launch_sd**2 + run_sd**2 / runs) / count), SIGMA_FLOOR)

    sd = night_sd(launches)
    base_var = (launch_sd**2 + run_sd**2 / baseline_runs) / baseline_launches
    se = math.sqrt(sd**2 + base_var)
    z_power = float(norm_isf(1.0 - power))
    guard = (float(norm_isf(alpha_no_change)) + z_power) * se
    margin_bound = abs(math.log1p(margin)) + (float(norm_isf(alpha)) + z_power) * se
    one_night = -math.expm1(-max(guard, margin_bound))

    def smallest(count_nights: int, sigma: float) -> float:
        low, high = 0.0, 12.0  # in night SDs
        if _detector_power(high, count_nights, config, sigma, paths, seed) < power:
            return math.inf
        for _ in range(14):
            middle = (low + high) / 2
            if _detector_power(middle, count_nights, config, sigma, paths, seed) >= power:
                high = middle
            else:
                low = middle
        return -math.expm1(-high * sigma)

    within = tuple((n, smallest(n, sd)) for n in nights)
    needed = None
    if target is not None:
        drop, count_nights = target
        for count in range(1, max_launches + 1):
            if smallest(count_nights, night_sd(count)) <= drop:
                needed = count
                break
    return Sensitivity(
        night_sd=sd,
        one_night=one_night,
        within=within,
        launches_needed=needed,
        target=target,
    )
