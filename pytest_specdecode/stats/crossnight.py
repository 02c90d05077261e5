"""Detection across nights, from the first night after an acknowledged change.

One night is one server launch: its mean has log-SD ``sigma_night = sqrt(sigma_L^2 +
sigma_w^2 / n)``, 3-5 % on the boxes measured so far, so no single night can prove a 5-10 % drop
(docs/statistics.md, "Across nights"). A persistent drop shows up only as a run of slightly low
nights; this module accumulates that evidence.

**Series.** Per (test, hardware key, configuration fingerprint, workload, metric): the nightly
launch means, log scale, oriented so that higher is better, oldest first
(:mod:`pytest_specdecode.stats.night_series` reads them from the history). A night without a
measurement is a gap. An *acknowledged change* (a baseline recorded with ``--update-baselines``,
an ``acknowledge`` line, or a night compared with a different stored baseline than the night
before) starts a new level.

**The new level's evidence** is everything since that change: the recorded baseline's own launch
means first (three points on the first night, where a reset used to leave the detector blind for
90 nights), then every night. The statistic (:mod:`pytest_specdecode.stats.scan`) compares,
for every candidate first changed night, the nights from it on with every point before it, so
the level is never estimated from changed nights and never frozen from too few.

**The noise** is the night-to-night SD carried over from the same series' earlier regimes
(pooled by df: an acknowledged change within one configuration fingerprint moves the level, an
SGLang release or a new baseline, seldom the box's noise; a change that can change the noise,
NCCL settings, TP, CUDA graphs, the hardware, is a different fingerprint and so a different
series, which carries nothing), pooled with what the points since show. Where nothing earlier
exists (a box's first baseline) a stated prior stands in for the earlier regimes when the
caller gives one (the gate's launch-CV prior plus the runs' noise), with its pseudo-df. When the
points since vary clearly more than what was carried (an F test at 10 %), the carried noise is
dropped and the verdict says so.

**Alarm.** The statistic's thresholds are calibrated for a constant false-alarm hazard: 3.5 %
per any 30 nights, the first 30 after a reset included; the nightly gate's tightened guard
spends about 1.5 % more, 5 % in all (:func:`pytest_specdecode.stats.two_level.guard_alpha`). A
regression alarm stays until the change is acknowledged. Its start is the candidate night that
maximises the statistic tonight (the E-divisive split of :mod:`changepoint` nearest to it when
one lies in the regime), its size the mean of the nights from then on against the points
before, with a t interval (biased away from zero, as any estimate taken at an alarm is).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from pytest_specdecode.stats.changepoint import ChangePoint, e_divisive
from pytest_specdecode.stats.distributions import f_isf, t_isf
from pytest_specdecode.stats.scan import (
    ScanPath,
    ScanPlan,
    first_crossing,
    grid_k,
    scan,
    threshold_at,
    thresholds,
)

__all__ = [
    "CrossNightState",
    "DetectorConfig",
    "Night",
    "detect",
    "earlier_regimes_noise",
    "level_start",
    "measured",
    "plan_df",
]

MIN_EARLIER = 10
"""Points an earlier regime needs before its noise is carried over."""

EARLIER_POINTS = 90
"""The points of each earlier regime its noise is taken from: the first, nearest its own
baseline (a slow drift later in a long regime would only inflate it)."""

SIGMA_FLOOR = 0.001
"""The smallest night-to-night log-SD believed (0.1 %): a regime whose nights are all equal
(a deterministic metric, rounding) would otherwise make any difference an infinite z."""

CONFLICT_LEVEL = 0.01
"""The noise known before is dropped when the points since vary more than its F quantile at
this level allows (strict: at 10 % it was dropped by chance in one regime in ten, and with it
most of the first weeks' power)."""

MIN_CONFLICT_DIFFERENCES = 8
"""The points since must give this many successive differences before they can overrule."""

_MAX_EXTRA_DF = 384
_DF_GRID = (0, 3, 6, 9, 12, 15, 18, 21, 24, 30, 36, 48, 60, 90, 120, 180, 240, 384)
"""The carried df are rounded down to this grid for the calibration (fewer df: higher
thresholds, so the rounding errs towards fewer alarms)."""


def plan_df(df: float) -> int:
    """The carried ``df`` as the scan's plan holds them: rounded down to :data:`_DF_GRID`."""
    return max(d for d in _DF_GRID if d <= df)


@dataclass(frozen=True)
class Night:
    """One session's value of one series, or an acknowledged change.

    ``mean`` is the launch mean in the metric's unit (None or not finite: not measured that
    night, a gap); ``runs`` and ``run_sd`` (log scale, within the launch) set the SD floor.
    ``acknowledged`` marks a change accepted as the new normal: ``launch_means`` then holds the
    recorded baseline's launch means (the new level's first points; empty for an
    ``acknowledge`` line) and ``note`` says what it was."""

    mean: float | None
    runs: int = 0
    run_sd: float | None = None
    when: str | None = None  # the session's time_utc
    session: str | None = None  # its run_id or commit
    acknowledged: bool = False
    launch_means: tuple[float, ...] = ()
    note: str | None = None


@dataclass(frozen=True)
class DetectorConfig:
    """What the detector is for and how sure it must be; each night's record keeps it
    (:meth:`to_json`), so that every reader judges with the settings the night ran with."""

    reference_nights: int = 90  # the most points a candidate change's level is taken from
    min_change: float = 0.05  # the smallest drop worth a bisect: sets k
    false_alarm: float = 0.035  # P(false alarm within `horizon` nights), any `horizon` nights
    horizon: int = 30
    higher_is_better: bool = True
    pool: bool = True  # carry the noise over from earlier regimes of the series
    attribute: bool = True  # run the E-divisive attribution on an alarm (simulations skip it)
    stated_launch_cv: float | None = None  # the noise prior where nothing earlier exists
    stated_df: float = 6.0

    def __post_init__(self) -> None:
        if self.reference_nights < 5:
            raise ValueError(f"reference_nights={self.reference_nights}: at least 5 nights")
        if not 0 < self.min_change < 1:
            raise ValueError(f"min_change={self.min_change}: a fraction in (0, 1)")
        if not 0 < self.false_alarm < 0.5:
            raise ValueError(f"false_alarm={self.false_alarm}: a probability in (0, 0.5)")
        if self.horizon < 1:
            raise ValueError(f"horizon={self.horizon}: at least one night")

    def to_json(self) -> dict[str, Any]:
        return {
            "reference_nights": self.reference_nights,
            "min_change": self.min_change,
            "false_alarm": self.false_alarm,
            "horizon": self.horizon,
            "stated_launch_cv": self.stated_launch_cv,
            "stated_df": self.stated_df,
        }

    def with_recorded(self, recorded: Mapping[str, Any] | None) -> DetectorConfig:
        """This config with the settings a night's record kept (unknown keys ignored, bad
        values left at this config's)."""
        if not isinstance(recorded, Mapping):
            return self
        changes: dict[str, Any] = {}
        kinds: tuple[tuple[str, type], ...] = (
            ("reference_nights", int), ("min_change", float), ("false_alarm", float),
            ("horizon", int), ("stated_df", float),
        )  # fmt: skip
        for name, kind in kinds:
            value = recorded.get(name)
            if isinstance(value, int | float) and not isinstance(value, bool):
                changes[name] = kind(value)
        cv = recorded.get("stated_launch_cv", self.stated_launch_cv)
        if cv is None or (isinstance(cv, int | float) and cv > 0):
            changes["stated_launch_cv"] = cv
        try:
            return replace(self, **changes)
        except ValueError:
            return self


@dataclass(frozen=True)
class CrossNightState:
    """The detector's state after the last night of a series; recomputed from the series alone.

    ``status`` is "warming up" (not judged yet: ``reason`` says why), "watching" or "alarm".
    Indices refer to the input sequence of nights."""

    status: str
    reason: str
    since: int  # index of the first night after the last acknowledged change
    nights: int  # measured nights since then
    launches: int  # the recorded baseline's launches that opened the level
    reference_nights: int
    level: float | None  # the level since the change (all its points), in the metric's unit
    sigma: float | None  # night-to-night log-SD used tonight
    sigma_df: float | None
    sigma_source: str
    k: float | None
    h: float | None  # tonight's threshold
    statistic: float  # regression side tonight
    statistic_up: float  # improvement side tonight
    alarm: bool  # a regression alarm (the improvement side is only reported)
    direction: str | None  # "regression" / "improvement" / None
    alarm_index: int | None  # the night the statistic first crossed its threshold
    start_index: int | None  # estimated first changed night
    shift: float | None  # estimated relative change from start_index on (ratio - 1)
    shift_low: float | None  # 95 % interval of the shift
    shift_high: float | None
    changepoint: ChangePoint | None = None
    changepoint_index: int | None = None
    opened_by: str | None = None  # what started the level ("baseline recorded", an ack's note)
    plan: ScanPlan | None = field(default=None, compare=False)

    def describe(self, nights: Sequence[Night] = ()) -> str:
        """One line for the report; ``nights`` (the input) names the start night."""
        if self.status == "warming up":
            return f"cross-night detector warming up: {self.reason}"
        head = (
            f"cross-night scan {self.statistic:.2f} of h {self.h:.2f} (night {self.nights} since "
            f"{self.opened_by or 'the start of the history'}, level from {self.launches} "
            f"launches and the nights since, night SD {self.sigma or 0:.1%} {self.sigma_source})"
        )
        if self.direction is None:
            return f"{head}: no change"
        start = ""
        if self.start_index is not None:
            night = nights[self.start_index] if self.start_index < len(nights) else None
            label = night.when or night.session if night is not None else None
            start = f", estimated to start at night {self.start_index + 1}" + (
                f" ({label})" if label else ""
            )
        size = ""
        if self.shift is not None:
            size = f" of {self.shift:+.1%} (95% CI {self.shift_low:+.1%} to {self.shift_high:+.1%})"
        return f"{head}: {self.direction}{size}{start}"


# --------------------------------------------------------------------------- detection


def level_start(nights: Sequence[Night]) -> int:
    """The index of the first night after the last acknowledged change (0: none)."""
    for index in range(len(nights) - 1, -1, -1):
        if nights[index].acknowledged:
            return index + 1
    return 0


def measured(night: Night) -> bool:
    """Whether ``night`` has a usable mean (a finite, positive launch mean; else a gap)."""
    return night.mean is not None and math.isfinite(night.mean) and night.mean > 0


def _log(value: float, sign: float) -> float:
    return sign * math.log(value)


@dataclass(frozen=True)
class _Noise:
    """The noise known before the reset: sum of squares, df, and where it came from."""

    ss: float
    df: float
    source: str
    carried: bool = False  # from earlier regimes of the series (else a stated prior, or none)


@dataclass(frozen=True)
class _Regime:
    """The points since the last acknowledged change, log scale, higher is better: the
    recorded baseline's launch means first, then the measured nights (``indices`` in the input)."""

    since: int
    indices: list[int]
    values: list[float]
    launches: int
    points: np.ndarray
    opened_by: str | None
    sign: float

    @classmethod
    def of(cls, nights: Sequence[Night], config: DetectorConfig) -> _Regime:
        sign = 1.0 if config.higher_is_better else -1.0
        since = level_start(nights)
        opening = nights[since - 1] if since else None
        launch_points = [_log(v, sign) for v in (opening.launch_means if opening else ()) if v > 0]
        indices = [i for i in range(since, len(nights)) if measured(nights[i])]
        values = [_log(float(nights[i].mean or 1.0), sign) for i in indices]
        opened_by = (opening.note or "an acknowledged change") if opening else None
        points = np.array([*launch_points, *values])
        return cls(since, indices, values, len(launch_points), points, opened_by, sign)


def detect(nights: Sequence[Night], config: DetectorConfig | None = None) -> CrossNightState:
    """The detector's state after the last of ``nights`` (oldest first; module docstring)."""
    config = config or DetectorConfig()
    regime = _Regime.of(nights, config)
    state = CrossNightState(
        status="warming up", reason="", since=regime.since, nights=len(regime.indices),
        launches=regime.launches, reference_nights=config.reference_nights, level=None,
        sigma=None, sigma_df=None, sigma_source="", k=None, h=None, statistic=0.0,
        statistic_up=0.0, alarm=False, direction=None, alarm_index=None, start_index=None,
        shift=None, shift_low=None, shift_high=None, opened_by=regime.opened_by,
    )  # fmt: skip
    if not regime.indices:
        return replace(state, reason=f"no night measured since {regime.opened_by or 'the start'}")
    noise = _noise_before(nights[: regime.since], nights[regime.since :], regime.sign, config)
    noise, conflict = _unless_contradicted(noise, regime.points)
    learn = not noise.carried
    own_df = 2.0 * (regime.points.size - 1) / 3.0 if learn else 0.0
    if noise.df + own_df <= 0 or (regime.launches == 0 and len(regime.values) < 2):
        return replace(state, reason=_waiting_reason(regime.launches, regime.values, noise))
    floor = _sigma_floor([nights[i] for i in regime.indices])
    rough = _pooled_sd(regime.points, noise, learn)
    plan = ScanPlan(
        launches=regime.launches,
        k=grid_k(abs(math.log1p(-config.min_change)) / (2.0 * max(rough, floor))),
        extra_df=plan_df(noise.df),
        window=config.reference_nights,
        false_alarm=config.false_alarm,
        horizon=config.horizon,
        learn=learn,
    )
    path = scan(regime.points[None, :], plan.launches, plan.k, plan.window, np.array([noise.ss]),
                noise.df, sigma_floor=floor, learn=learn)  # fmt: skip
    tonight = len(regime.values)
    state = replace(
        state,
        status="watching",
        reason=f"judged on the {tonight} nights since {regime.opened_by or 'the start'}",
        level=math.exp(regime.sign * float(regime.points.mean())),
        sigma=float(path.sigma[0, -1]),
        sigma_df=float(path.df[0, -1]),
        sigma_source=noise.source + (f"; {conflict}" if conflict else ""),
        k=plan.k,
        h=threshold_at(thresholds(plan), tonight),
        statistic=max(0.0, float(path.down[0, -1])),
        statistic_up=max(0.0, float(path.up[0, -1])),
        plan=plan,
    )
    return _alarmed(state, regime, path, config)


def _alarmed(
    state: CrossNightState, regime: _Regime, path: ScanPath, config: DetectorConfig
) -> CrossNightState:
    """``state`` with the alarm, when either side's statistic crossed its threshold on some
    night: its side, the night it crossed, the estimated start and size of the change."""
    if state.plan is None or state.sigma is None or state.sigma_df is None:
        return state  # not judged: nothing to alarm on
    found = thresholds(state.plan)
    regression = first_crossing(path.down[0], found)
    improvement = first_crossing(path.up[0], found)
    if regression is None and improvement is None:
        return state
    # A regression crossing alarms whatever the improvement side did (an improvement, then a
    # loss, still fails the build); the improvement side alone is only reported.
    first = regression if regression is not None else improvement
    assert first is not None
    side = path.start if regression is not None else path.start_up
    began = int(side[0, -1]) - 1  # 0-based, among the nights since the change
    chosen = None
    if config.attribute:
        split = _nearest(e_divisive(np.array(regime.values)), began)
        if split is not None and (0 if regime.launches else 1) <= split.index <= first:
            chosen, began = split, split.index
    shift, low, high = _shift(path.clipped[0], regime.launches, began, config.reference_nights,
                              state.sigma, state.sigma_df)  # fmt: skip
    return replace(
        state,
        status="alarm",
        alarm=regression is not None,
        direction="regression" if regression is not None else "improvement",
        alarm_index=regime.indices[first],
        start_index=regime.indices[began],
        changepoint=chosen,
        changepoint_index=regime.indices[chosen.index] if chosen is not None else None,
        shift=shift,
        shift_low=low,
        shift_high=high,
    )


def _shift(
    points: np.ndarray, launches: int, began: int, window: int, sigma: float, df: float
) -> tuple[float | None, float | None, float | None]:
    """The relative change from night ``began`` (0-based) on against the points before it,
    with its 95 % t interval, on the higher-is-better scale as every ratio here."""
    end = launches + began
    before = points[max(0, end - window) : end]
    after = points[end:]
    if not before.size or not after.size:
        return None, None, None
    shift = float(after.mean() - before.mean())
    half = float(t_isf(0.025, max(df, 1.0))) * sigma * math.sqrt(1 / before.size + 1 / after.size)
    return math.expm1(shift), math.expm1(shift - half), math.expm1(shift + half)


def _waiting_reason(launches: int, values: Sequence[float], noise: _Noise) -> str:
    if launches == 0 and len(values) < 2:
        return (
            "the level restarted without a recorded baseline; it is judged from the second "
            "night on, against the nights before"
        )
    return (
        f"{launches + len(values)} point(s) since the change and no earlier noise to carry: the "
        "night-to-night SD is not known yet"
    )


def _pooled_sd(points: np.ndarray, noise: _Noise, learn: bool) -> float:
    own_df = 2.0 * (points.size - 1) / 3.0 if learn else 0.0
    own = float(np.mean(np.diff(points) ** 2) / 2.0) * own_df if own_df > 0 else 0.0
    return math.sqrt((noise.ss + own) / (noise.df + own_df))


def _noise_before(
    earlier: Sequence[Night], current: Sequence[Night], sign: float, config: DetectorConfig
) -> _Noise:
    """The noise known before this regime: the earlier regimes' (pooled), else the stated prior
    (launch CV plus the runs' noise of this regime's nights), else nothing."""
    if config.pool:
        ss, df, regimes = earlier_regimes_noise(earlier, sign)
        if df > 0:
            return _Noise(
                ss, df, f"carried over from {regimes} earlier regime(s) ({df:.0f} df)", True
            )
    if config.stated_launch_cv is not None:
        run_vars = [
            n.run_sd**2 / n.runs
            for n in current
            if n.run_sd is not None and n.runs > 0 and math.isfinite(n.run_sd)
        ]
        variance = math.log1p(config.stated_launch_cv**2) + (
            float(np.median(run_vars)) if run_vars else 0.0
        )
        return _Noise(
            variance * config.stated_df,
            config.stated_df,
            f"from a stated prior of launch CV {config.stated_launch_cv:.1%} "
            f"({config.stated_df:g} pseudo-df) and the nights since",
        )
    return _Noise(0.0, 0.0, "from the points since the change alone")


def _unless_contradicted(noise: _Noise, points: np.ndarray) -> tuple[_Noise, str]:
    """``noise``, or none when the points since vary clearly more than it allows: their robust
    SD (the median absolute successive difference, which the step being looked for moves by
    one difference only) against the carried one, F at :data:`CONFLICT_LEVEL` with the df of
    that estimator (about 0.4 a difference)."""
    diffs = np.abs(np.diff(points))
    if noise.df <= 0 or diffs.size < MIN_CONFLICT_DIFFERENCES:
        return noise, ""
    own = (1.4826 * float(np.median(diffs)) / math.sqrt(2.0)) ** 2
    carried = noise.ss / noise.df
    limit = float(f_isf(CONFLICT_LEVEL, 0.4 * diffs.size, noise.df))
    if carried > 0 and own / carried > limit:
        return _Noise(0.0, 0.0, "from the points since the change alone"), (
            f"the noise {noise.source.split(' (')[0]} was not used: the points since vary more "
            f"(robust SD {math.sqrt(own):.1%} against {math.sqrt(carried):.1%})"
        )
    return noise, ""


def earlier_regimes_noise(nights: Sequence[Night], sign: float) -> tuple[float, float, int]:
    """Sum of squares, df and count of the regimes before the last acknowledged change that
    have :data:`MIN_EARLIER` points: each regime's first :data:`EARLIER_POINTS` points (its
    baseline's launches, then its nights), winsorised at 4 robust SDs of their median, about
    their own mean. The sample SD, not the von Neumann estimate: a regime ends at an
    acknowledged change, so a step inside it is rare, and the sample SD's n - 1 df against
    about 2 (n - 1) / 3 are worth a week of the first month after a reset (a 10 % drop at
    launch CV 5 % landing on the second night: flagged within 14 nights in 69 % of trials
    with 32 df, 60 % with 19)."""
    total, df, count = 0.0, 0.0, 0
    regime: list[float] = []
    for night in [*nights, Night(None, acknowledged=True)]:
        if night.acknowledged:
            if len(regime) >= MIN_EARLIER:
                values = _winsorised(np.array(regime[:EARLIER_POINTS]))
                total += float(np.sum((values - values.mean()) ** 2))
                df += values.size - 1
                count += 1
            regime = [_log(v, sign) for v in night.launch_means if v > 0]
        elif measured(night):
            regime.append(_log(float(night.mean or 1.0), sign))
    if df > _MAX_EXTRA_DF:
        total, df = total * _MAX_EXTRA_DF / df, float(_MAX_EXTRA_DF)
    return total, df, count


def _winsorised(values: np.ndarray, spread: float = 4.0) -> np.ndarray:
    median = float(np.median(values))
    robust = 1.4826 * float(np.median(np.abs(np.diff(values)))) / math.sqrt(2.0)
    if robust <= 0:
        return values
    clipped: np.ndarray = np.clip(values, median - spread * robust, median + spread * robust)
    return clipped


def _nearest(points: Sequence[ChangePoint], position: int) -> ChangePoint | None:
    """The significant split closest to the scan's estimate (several may exist in a long
    series: an earlier change is not this alarm's cause)."""
    if not points:
        return None
    return min(points, key=lambda point: abs(point.index - position))


def _sigma_floor(nights: Sequence[Night]) -> float:
    """The run noise of one night's mean when known (a launch mean cannot vary less than its
    runs do), never below :data:`SIGMA_FLOOR`."""
    known = [
        night.run_sd / math.sqrt(night.runs)
        for night in nights
        if night.run_sd is not None and night.runs > 0 and math.isfinite(night.run_sd)
    ]
    return max(SIGMA_FLOOR, float(np.median(known)) if known else 0.0)
