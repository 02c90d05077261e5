"""Is the current build better or worse than its baseline by a margin? Pure statistics, no pytest.

**Scale and margin.** Every comparison works on the higher-is-better scale: the ratio is
current/baseline, or baseline/current for a lower-is-better metric such as TTFT, so a signed
margin means the same thing everywhere: ``+0.05`` must beat the baseline by 5 %, ``-0.03`` may be
at most 3 % worse. The claim tested is "ratio >= 1 + margin" (the threshold).

**Verdict.** From the two one-sided (1 - alpha) bounds of the ratio: PASS when the lower bound is
at or above the threshold, FAIL when the upper bound is below it, INCONCLUSIVE otherwise. PASS and
FAIL use the same alpha, so the false-PASS rate at the threshold equals the false-FAIL rate. An
exact tie (a bound equal to the threshold within a relative 1e-9, so that 97/100 against -3 % is not
decided by floating-point rounding) counts for PASS: "may be at most 3 % worse" includes exactly
3 % worse. Ties have probability zero for continuous data, so this breaks the symmetry only where
it has to be broken one way or the other (constant samples).

**Methods.**

- ``welch-log`` (default): Welch's t on log values, so the interval is for the ratio of geometric
  means and maps straight onto a relative margin; per-run throughput at a CV of a few percent is
  close to lognormal, where this is the most powerful of the three.
- ``bootstrap``: seeded percentile bootstrap of log(mean current / mean baseline), two independent
  resamples, through ``scipy.stats.bootstrap``. The plain percentile interval under-covers at
  small n (simulated, lognormal, nominal one-sided 95 %: 90.9 % at 5 vs 5, 93.3 % at 10 vs 10,
  93.7 % at 20 vs 20) because the plug-in variance divides by n and the normal quantile replaces
  the t quantile; BCa does not fix that (about 93 % from 5 to 30 runs in a smaller simulation).
  We use Hesterberg's *expanded* percentile interval (The American Statistician 69(4), 2015): the
  quantile level alpha' = Phi(-f * t(1 - alpha, df)), with f the ratio of the unbiased to the
  plug-in standard error and Welch's df; simulated coverage is then 94.6-95.7 % from 5 to 20 runs
  per side. Below 10 runs on either side the bootstrap distribution is too lumpy to carry shape
  information (126 distinct resamples of 5 runs), so ``welch-log`` is used instead, with a
  warning. ``seed=None`` derives the seed from the sample values, so the same numbers always give
  the same verdict. p is the level at which the expanded bound would touch the threshold, from
  the bootstrap tail fraction; it agrees with the interval up to 1 / (n_resamples + 1).
- ``rank``: the Hodges-Lehmann shift of the logs (median of all pairwise log-ratios) with the
  distribution-free interval from the Mann-Whitney U null distribution (Lehmann's order-statistic
  interval), exact up to 2,500 pairs (computed by the classic recursion; scipy has no public
  quantile function for U) and normal-approximated beyond. It is robust to a single throttled run
  but discrete: with n vs m runs the smallest attainable one-sided p is 1/C(n+m, n) (0.05 at
  3 vs 3, 0.004 at 5 vs 5); when alpha is below that, the interval is unbounded and the verdict
  INCONCLUSIVE, with a warning. Ties among the pairwise differences make it approximate.
- ``exact``: used automatically when both sides have at least 2 runs and no variation at all
  (accept length at temperature 0 can be deterministic): the ratio is known, the bounds equal it,
  p is 0 or 1, and the MDE is 0.

**Degenerate samples.** One constant side (with the other varying) needs no special case: Welch's
standard error and degrees of freedom reduce to the one-sample t on the varying side, and a note
says so. A side with a single run carries no information on run-to-run variance, so no interval can
be formed: the verdict is INCONCLUSIVE with bounds (0, inf), p = 1 and a warning, never a crash.
Values must be finite and > 0 (every metric here is a rate or a duration): anything else raises
:class:`StatsInputError` naming the side, the run and the value.

**Minimum detectable effect.** The relative distance from the threshold at which the one-sided
Welch-log test at this alpha and n reaches power 0.8: a true ratio of threshold * (1 + MDE) or
more PASSes, threshold / (1 + MDE) or less FAILs, with probability 0.8. It is computed exactly for
normal log values with equal CVs on both sides (Gauss-Laguerre quadrature over both sample
variances, which carries the randomness of Welch's df; the noncentral t with a fixed df promises
0.8 where Welch delivers 0.74 at 3 vs 3). It is a planning figure for all methods (the rank test
needs about 5 % more runs, ARE 3/pi). When MDE > |margin|, even an unchanged build cannot be told
from the threshold, and a warning says so with the number of runs that would.

Repeated looks at a growing sample (the adaptive extra runs) are in
:mod:`pytest_specdecode.sequential`.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pytest_specdecode.distributions import (
    chi2_ppf,
    norm_cdf,
    norm_isf,
    norm_ppf,
    norm_sf,
    t_cdf,
    t_isf,
    t_ppf,
    t_sf,
)
from pytest_specdecode.errors import SpecdecodeError
from pytest_specdecode.launches import LaunchPrior, TwoLevelInterval, two_level
from pytest_specdecode.lazy import LazyModule

# scipy is imported at the first comparison, not when pytest loads the plugin (lazy.py says why);
# scipy.stats only for the bootstrap (distributions.py says why)
optimize: Any = LazyModule("scipy.optimize")
special: Any = LazyModule("scipy.special")
stats: Any = LazyModule("scipy.stats")

__all__ = [
    "BOOTSTRAP_MIN_RUNS",
    "MDE_POWER",
    "METHODS",
    "Comparison",
    "SampleSummary",
    "StatsInputError",
    "Verdict",
    "check_alpha",
    "check_margin",
    "compare",
    "confidence_text",
    "describe",
    "min_detectable_effect",
    "required_runs",
    "summarize",
    "verdict_codes",
    "welch_terms",
]

METHODS = ("welch-log", "bootstrap", "rank")
MDE_POWER = 0.8
BOOTSTRAP_MIN_RUNS = 10
DEFAULT_RESAMPLES = 9999
_TIE_TOLERANCE = 1e-9  # on the log scale, i.e. relative
_EXACT_RANK_MAX_PAIRS = 2500
_QUADRATURE_NODES = 48


class StatsInputError(SpecdecodeError, ValueError):
    """Bad input to a statistics function: a non-positive value, a margin <= -100 %, ..."""


class Verdict(str, enum.Enum):
    """Outcome of one comparison against a margin."""

    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"

    def __str__(self) -> str:
        return self.value


_CODE_TO_VERDICT = {1: Verdict.PASS, -1: Verdict.FAIL, 0: Verdict.INCONCLUSIVE}


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


def confidence_text(fraction: float) -> str:
    """A confidence level as people read it: 85%, 99.4%, 99.96%. Never "100%" from rounding: a
    level below 1 keeps the digits that show it is below (a per-look level of 1 - 0.0004 is
    99.96%, not 100.0%), and one too close to 1 for 12 digits reads ">99.9999999999%"."""
    value = fraction * 100
    for significant in range(3, 13):
        text = f"{value:.{significant}g}"
        if value >= 100 or float(text) < 100:
            return text + "%"
    return ">99.9999999999%"


def describe(samples: Sequence[float], confidence: float = 0.95) -> SampleSummary:
    """n, mean, std (ddof=1), CV, t interval of the mean, median, min and max of per-run values
    (at least one, each finite); see :class:`SampleSummary` for one run and constant runs."""
    values = np.asarray(samples, dtype=np.float64)
    if values.size == 0 or not np.all(np.isfinite(values)):
        raise StatsInputError(f"a summary needs at least one finite value, got {list(samples)!r}")
    constant = _is_constant(values)
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
    return describe(_positive_values(samples, "samples").tolist())


@dataclass(frozen=True)
class Comparison:
    """Current against baseline on the higher-is-better scale, and the verdict against a margin."""

    method: str
    higher_is_better: bool
    margin: float
    alpha: float
    current: SampleSummary
    baseline: SampleSummary
    ratio: float
    ci_low: float
    ci_high: float
    p_pass: float
    p_fail: float
    mde: float | None
    verdict: Verdict
    warnings: tuple[str, ...]
    launches: int = 1  # baseline launches the interval accounts for
    launch_cv: float | None = None  # the launch-to-launch CV in the interval (two-level only)
    df: float | None = None
    alpha_no_change: float | None = None
    history_nights: int = 0  # earlier nights whose launch variance is in the interval

    @property
    def threshold(self) -> float:
        """The ratio the claim is about: 1 + margin."""
        return 1.0 + self.margin

    def describe(self) -> str:
        """One paragraph with n, means, CVs, ratio, CI, margin, p, MDE, verdict and warnings."""
        cur, base = self.current, self.baseline
        scale = (
            "current/baseline" if self.higher_is_better else "baseline/current (lower is better)"
        )
        mde = "undefined" if self.mde is None else mde_text(self.mde)
        text = (
            f"n={cur.n} current vs n={base.n} baseline; mean {cur.mean:.4g} vs {base.mean:.4g} "
            f"(CV {cur.cv_text()} vs {base.cv_text()}); ratio {scale} {self.ratio:.4f}, "
            f"CI [{self.ci_low:.4f}, {self.ci_high:.4f}] (two one-sided "
            f"{confidence_text(1 - self.alpha)} bounds, {self.method}); margin "
            f"{self.margin:+.1%} (threshold {self.threshold:.4f}); {p_values_text(self)}; "
            f"MDE {mde}; "
            f"verdict {self.verdict.value.upper()}."
        )
        return " ".join([text, *(f"Warning: {warning}." for warning in self.warnings)])


@dataclass(frozen=True)
class _Interval:
    """A method's answer on the signed log scale (log of the higher-is-better ratio)."""

    method: str
    estimate: float
    low: float
    high: float
    p_pass: float
    p_fail: float
    notes: tuple[str, ...] = ()
    df: float | None = None  # the t interval's degrees of freedom, where there is one


def compare(
    current: Sequence[float],
    baseline: Sequence[float],
    *,
    margin: float,
    higher_is_better: bool = True,
    alpha: float = 0.05,
    method: str = "welch-log",
    seed: int | None = None,
    n_resamples: int = DEFAULT_RESAMPLES,
    launch_runs: Sequence[int] | None = None,
    prior: LaunchPrior | None = None,
    alpha_no_change: float | None = None,
    warn_single_launch: bool = False,
) -> Comparison:
    """Compare per-run values of the current build with the baseline's against a signed margin.

    ``alpha`` is the one-sided error rate of this one look (repeated looks:
    :class:`~pytest_specdecode.sequential.SequentialPlan`); ``seed`` and ``n_resamples`` only
    matter for ``method="bootstrap"``.

    ``launch_runs`` (runs per baseline launch) and ``prior`` (the launch variance from earlier
    nights) switch to the two-level model of :mod:`pytest_specdecode.launches`: the current
    runs are one launch, and launch-to-launch variance is in the interval. ``alpha_no_change``
    (for a negative margin) is the no-change guard: a FAIL also needs the current build to be
    worse than the baseline itself at that level, so an unchanged build fails at most that
    often, however close the margin sits to 1 against the noise. ``warn_single_launch`` adds a
    warning when the interval cannot carry the launch variance (one baseline launch, no prior).
    """
    check_margin(margin)
    check_alpha(alpha)
    if alpha_no_change is not None:
        check_alpha(alpha_no_change)
    if method not in METHODS:
        raise StatsInputError(f"unknown method {method!r}: use one of {', '.join(METHODS)}")
    cur = _positive_values(current, "current")
    base = _positive_values(baseline, "baseline")
    sign = 1.0 if higher_is_better else -1.0
    log_cur, log_base = sign * np.log(cur), sign * np.log(base)
    threshold = math.log1p(margin)
    cur_constant, base_constant = _is_constant(cur), _is_constant(base)
    launches = [n for n in (launch_runs or ()) if n > 0]
    levels = two_level(log_cur, log_base, launches or [base.size], prior)
    two_levels = levels.launches >= 2 or prior is not None

    def interval_at(level: float) -> _Interval:
        if cur.size == 1 or base.size == 1:
            return _no_variance_information(log_cur, log_base, method)
        if cur_constant and base_constant:
            return _exact(log_cur, log_base, threshold)
        if two_levels:
            interval = _t_interval("two-level", levels.estimate, levels.se, levels.df,
                                   threshold, level)  # fmt: skip
            if method != "welch-log":
                interval = _with_note(
                    interval, f"{method} has no launch level: used the two-level t interval"
                )
            return interval
        if method == "bootstrap" and min(cur.size, base.size) >= BOOTSTRAP_MIN_RUNS:
            seed_ = seed if seed is not None else zlib.crc32(np.concatenate([cur, base]).tobytes())
            return _bootstrap(cur, base, sign, threshold, level, seed_, n_resamples)
        if method == "rank" and not (cur_constant or base_constant):
            return _rank(log_cur, log_base, threshold, level)
        interval = _welch_log(log_cur, log_base, cur_constant, base_constant, threshold, level)
        if method == "bootstrap":
            return _with_note(interval, _bootstrap_fallback_note(cur.size, base.size))
        if method == "rank":
            return _with_note(interval, "rank method needs variation on both sides")
        return interval

    interval = interval_at(alpha)
    code = int(verdict_codes(np.asarray(interval.low), np.asarray(interval.high), threshold))
    warnings = list(interval.notes)
    if warn_single_launch and not two_levels and cur.size > 1 and base.size > 1:
        warnings.extend(levels.notes)
    if code == -1 and margin < 0 and alpha_no_change is not None:
        guard = interval_at(alpha_no_change)
        if guard.high >= -_TIE_TOLERANCE:
            code = 0
            warnings.append(
                f"worse than the margin at {confidence_text(1 - alpha)} but not distinguishable "
                f"from no change at {confidence_text(1 - alpha_no_change)} (upper bound "
                f"{math.exp(guard.high):.3f}): "
                "not called a regression"
            )
    design = _mde_design(log_cur, log_base, cur_constant, base_constant)
    mde = None if design is None else min_detectable_effect(*design, alpha)
    if two_levels and mde is not None:
        mde = _two_level_mde(levels, alpha)
    # Only an undecided check needs to hear that it could not have been decided.
    if code == 0 and design is not None and mde is not None and mde > abs(margin) + _TIE_TOLERANCE:
        if two_levels:
            warnings.append(
                f"MDE {mde_text(mde)} is larger than the margin {abs(margin):.1%}: the "
                f"launch-to-launch variation (CV {levels.launch_cv:.1%} over {levels.launches} "
                f"baseline launches{' and the history' if prior is not None else ''}) limits "
                "what one launch can "
                "show; more baseline launches or nights of history narrow it"
            )
        else:
            warnings.append(
                _mde_warning(mde, margin, alpha, design, cur.size, base.size, cur_constant)
            )
    return Comparison(
        method=interval.method,
        higher_is_better=higher_is_better,
        margin=margin,
        alpha=alpha,
        current=summarize(cur.tolist()),
        baseline=summarize(base.tolist()),
        ratio=math.exp(interval.estimate),
        ci_low=math.exp(interval.low),
        ci_high=math.exp(interval.high),
        p_pass=interval.p_pass,
        p_fail=interval.p_fail,
        mde=mde,
        verdict=_CODE_TO_VERDICT[code],
        warnings=tuple(warnings),
        launches=levels.launches,
        launch_cv=levels.launch_cv if two_levels else None,
        df=interval.df,
        alpha_no_change=alpha_no_change if margin < 0 else None,
        history_nights=prior.nights if prior is not None else 0,
    )


def _t_interval(
    method: str, estimate: float, se: float, df: float, threshold: float, alpha: float
) -> _Interval:
    if se <= 0:
        return _Interval(method, estimate, estimate, estimate, 0.0, 0.0, (), df)
    t_crit = float(t_isf(alpha, df))
    t_stat = (estimate - threshold) / se
    return _Interval(
        method,
        estimate,
        estimate - t_crit * se,
        estimate + t_crit * se,
        float(t_sf(t_stat, df)),
        float(t_cdf(t_stat, df)),
        (),
        df,
    )


def p_values_text(comparison: Comparison) -> str:
    """Both p-values, each named: what it is the chance of, and what the verdict needs of it."""
    level = f"{comparison.alpha:.3g}"
    return (
        f"p(pass)={comparison.p_pass:.3g} and p(fail)={comparison.p_fail:.3g} (the chances that a "
        "build exactly at the margin measures this high and this low; PASS needs p(pass) <= "
        f"{level}, FAIL p(fail) <= {level})"
    )


def mde_text(mde: float) -> str:
    """An MDE as a percentage; "unbounded" where no finite change would be detected."""
    return "unbounded" if math.isinf(mde) else f"{mde:.1%}"


def _two_level_mde(levels: TwoLevelInterval, alpha: float) -> float:
    """The distance a one-sided t test with the two-level standard error and df detects with
    power :data:`MDE_POWER` (treating the standard error as known: a planning figure)."""
    t_alpha = float(t_isf(alpha, levels.df))
    t_power = float(t_isf(1.0 - MDE_POWER, levels.df))
    distance = (t_alpha - t_power) * levels.se
    return math.expm1(distance) if distance < 50 else math.inf  # past that: unbounded


def _no_variance_information(
    log_cur: NDArray[np.float64], log_base: NDArray[np.float64], method: str
) -> _Interval:
    side = "current" if log_cur.size == 1 else "baseline"
    note = (
        f"{side} has a single run, so its run-to-run variance is unknown and no confidence "
        "interval can be formed; take at least 2 runs (5 or more to resolve a few percent)"
    )
    estimate = float(np.mean(log_cur) - np.mean(log_base))
    return _Interval(method, estimate, -math.inf, math.inf, 1.0, 1.0, (note,))


def _exact(
    log_cur: NDArray[np.float64], log_base: NDArray[np.float64], threshold: float
) -> _Interval:
    # Both sides constant: the ratio is known without error, so the verdict is a plain comparison.
    estimate = float(log_cur[0] - log_base[0])
    passes = estimate >= threshold - _TIE_TOLERANCE
    return _Interval(
        "exact", estimate, estimate, estimate, 0.0 if passes else 1.0, 1.0 if passes else 0.0
    )


def welch_terms(
    var_cur: NDArray[np.float64], n_cur: int, var_base: NDArray[np.float64], n_base: int
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Welch's standard error and Satterthwaite df, elementwise; df = inf where se = 0."""
    q_cur, q_base = var_cur / n_cur, var_base / n_base
    se = np.sqrt(q_cur + q_base)
    with np.errstate(divide="ignore", invalid="ignore"):
        df = (q_cur + q_base) ** 2 / (q_cur**2 / (n_cur - 1) + q_base**2 / (n_base - 1))
    return se, np.where(se > 0, df, np.inf)


def verdict_codes(
    low: NDArray[np.float64], high: NDArray[np.float64], threshold: float
) -> NDArray[np.int8]:
    """+1 PASS, -1 FAIL, 0 INCONCLUSIVE; a bound on the threshold (within tolerance) passes."""
    passes = low >= threshold - _TIE_TOLERANCE
    fails = high < threshold - _TIE_TOLERANCE
    return np.where(passes, 1, np.where(fails, -1, 0)).astype(np.int8)


def _log_variance(log_values: NDArray[np.float64], constant: bool) -> float:
    # np.var of identical values can be a few ulps above 0; constant data must give exactly 0.
    return 0.0 if constant else float(np.var(log_values, ddof=1))


def _welch_log(
    log_cur: NDArray[np.float64],
    log_base: NDArray[np.float64],
    cur_constant: bool,
    base_constant: bool,
    threshold: float,
    alpha: float,
) -> _Interval:
    estimate = float(np.mean(log_cur) - np.mean(log_base))
    se_arr, df_arr = welch_terms(
        np.asarray(_log_variance(log_cur, cur_constant)),
        log_cur.size,
        np.asarray(_log_variance(log_base, base_constant)),
        log_base.size,
    )
    interval = _t_interval("welch-log", estimate, float(se_arr), float(df_arr), threshold, alpha)
    if cur_constant or base_constant:
        flat, other = ("current", "baseline") if cur_constant else ("baseline", "current")
        interval = _with_note(
            interval,
            f"{flat} has no run-to-run variation, so the Welch interval reduces to a one-sample "
            f"t interval on the {other} runs",
        )
    return interval


def _log_ratio_of_means(
    current: NDArray[np.float64], baseline: NDArray[np.float64], axis: int, *, sign: float
) -> NDArray[np.float64]:
    ratio = np.log(np.mean(current, axis=axis)) - np.log(np.mean(baseline, axis=axis))
    return np.asarray(sign * ratio, dtype=np.float64)


def _bootstrap(
    cur: NDArray[np.float64],
    base: NDArray[np.float64],
    sign: float,
    threshold: float,
    alpha: float,
    seed: int,
    n_resamples: int,
) -> _Interval:
    log_cur, log_base = np.log(cur), np.log(base)
    var_cur, var_base = _log_variance(log_cur, False), _log_variance(log_base, False)
    se, df_arr = welch_terms(np.asarray(var_cur), cur.size, np.asarray(var_base), base.size)
    df = float(df_arr)
    # Expansion: unbiased over plug-in standard error (the bootstrap's spread divides by n).
    plug_in = math.sqrt(
        var_cur * (cur.size - 1) / cur.size**2 + var_base * (base.size - 1) / base.size**2
    )
    expansion = float(se) / plug_in
    level = float(norm_sf(expansion * float(t_isf(alpha, df))))
    statistic = partial(_log_ratio_of_means, sign=sign)
    result = stats.bootstrap(
        (cur, base),
        statistic,
        n_resamples=n_resamples,
        vectorized=True,
        axis=-1,
        method="percentile",
        confidence_level=1.0 - 2.0 * level,
        rng=np.random.default_rng(seed),
    )
    boots = np.asarray(result.bootstrap_distribution)
    below = (np.count_nonzero(boots < threshold - _TIE_TOLERANCE) + 1) / (boots.size + 1)
    at_or_above = (np.count_nonzero(boots >= threshold - _TIE_TOLERANCE) + 1) / (boots.size + 1)

    def p_value(tail: float) -> float:
        # The alpha at which the expanded percentile bound would sit exactly on the threshold.
        return float(t_sf(float(norm_isf(tail)) / expansion, df))

    return _Interval(
        "bootstrap",
        float(statistic(cur, base, -1)),
        float(result.confidence_interval.low),
        float(result.confidence_interval.high),
        p_value(below),
        p_value(at_or_above),
    )


def _bootstrap_fallback_note(n_cur: int, n_base: int) -> str:
    return (
        f"bootstrap needs {BOOTSTRAP_MIN_RUNS} runs per side (it under-covers below that), got "
        f"{n_cur} current and {n_base} baseline; used welch-log"
    )


def _with_note(interval: _Interval, note: str) -> _Interval:
    return dataclasses.replace(interval, notes=(*interval.notes, note))


@lru_cache(maxsize=64)
def _mann_whitney_cdf(n: int, m: int) -> NDArray[np.float64]:
    """cdf of U = #{(i, j): x_i > y_j} under H0, for u = 0 .. n*m (read-only: it is cached)."""
    pairs = n * m
    if pairs > _EXACT_RANK_MAX_PAIRS:
        sd = math.sqrt(pairs * (n + m + 1) / 12.0)
        cdf = np.asarray(norm_cdf((np.arange(pairs + 1) + 0.5 - pairs / 2.0) / sd))
    else:
        # pmf(i, j): the largest of the i + j values is an x with probability i / (i + j), and
        # then it beats all j y's (U shifts by j); otherwise it is a y that beats nothing.
        previous = [np.ones(1) for _ in range(m + 1)]
        for i in range(1, n + 1):
            row = [np.ones(1)]
            for j in range(1, m + 1):
                pmf = np.zeros(i * j + 1)
                pmf[j:] += i / (i + j) * previous[j]
                pmf[: i * (j - 1) + 1] += j / (i + j) * row[j - 1]
                row.append(pmf)
            previous = row
        cdf = np.cumsum(previous[m])
    cdf = np.asarray(cdf, dtype=np.float64)
    cdf.setflags(write=False)
    return cdf


def _rank(
    log_cur: NDArray[np.float64], log_base: NDArray[np.float64], threshold: float, alpha: float
) -> _Interval:
    n, m = log_cur.size, log_base.size
    diffs = np.sort((log_cur[:, None] - log_base[None, :]).ravel())
    cdf = _mann_whitney_cdf(n, m)
    # k = the largest count with P(U <= k - 1) <= alpha; the bounds are the k-th smallest and
    # k-th largest pairwise differences (1e-12 absorbs rounding in the recursion at exact levels).
    k = int(np.searchsorted(cdf, alpha + 1e-12, side="right"))
    notes: tuple[str, ...] = ()
    if k == 0:
        low, high = -math.inf, math.inf
        notes = (
            f"rank method: with {n} vs {m} runs the smallest attainable one-sided p is "
            f"{cdf[0]:.3g}, above alpha={alpha:.3g}, so the interval is unbounded; take more "
            "runs or use welch-log",
        )
    else:
        low, high = float(diffs[k - 1]), float(diffs[n * m - k])

    def tail(count: int) -> float:  # P(U >= count); U is symmetric about n*m/2
        return 1.0 if count <= 0 else float(1.0 - cdf[count - 1])

    at_or_above = int(np.count_nonzero(diffs >= threshold - _TIE_TOLERANCE))
    return _Interval(
        "rank",
        float(np.median(diffs)),
        low,
        high,
        tail(at_or_above),
        tail(n * m - at_or_above),
        notes,
    )


def _mde_design(
    log_cur: NDArray[np.float64],
    log_base: NDArray[np.float64],
    cur_constant: bool,
    base_constant: bool,
) -> tuple[int, float, float] | None:
    """(runs on the varying side, runs on the other side, CV) to plan with; None if unknown."""
    n, m = log_cur.size, log_base.size
    if n == 1 or m == 1:
        return None
    if cur_constant and base_constant:
        return n, m, 0.0
    if cur_constant or base_constant:  # the test is a one-sample t on the varying side
        varying = log_base if cur_constant else log_cur
        return varying.size, math.inf, math.sqrt(math.expm1(_log_variance(varying, False)))
    pooled = ((n - 1) * np.var(log_cur, ddof=1) + (m - 1) * np.var(log_base, ddof=1)) / (n + m - 2)
    return n, m, math.sqrt(math.expm1(float(pooled)))


def _mde_warning(
    mde: float,
    margin: float,
    alpha: float,
    design: tuple[int, float, float],
    n_cur: int,
    n_base: int,
    cur_constant: bool,
) -> str:
    text = (
        f"MDE {mde:.1%} is larger than the margin {abs(margin):.1%}: this check cannot be "
        f"decided either way at n={n_cur}"
    )
    if margin == 0.0:
        return text + " (a zero margin is only ever resolved when the true ratio differs from 1)"
    if cur_constant:
        return text + "; the baseline's own variation limits it: record more baseline runs"
    _, n_other, cv = design
    try:
        needed = required_runs(cv, abs(margin), alpha, n_baseline=n_other)
    except StatsInputError:
        return (
            text + f"; no number of current runs would against {n_base} baseline runs: record more"
        )
    return text + f"; about {needed} current runs would (with this baseline of {n_base} runs)"


def _scaled_variance_nodes(runs: float) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Quadrature nodes and weights of s^2 / sigma^2 = chi2(runs - 1) / (runs - 1)."""
    if math.isinf(runs):  # known exactly: no variance left to estimate
        return np.zeros(1), np.ones(1)
    df = runs - 1.0
    if df > 150:  # Laguerre weights overflow; the distribution is narrow, midpoints suffice
        levels = (np.arange(_QUADRATURE_NODES) + 0.5) / _QUADRATURE_NODES
        nodes = np.asarray(chi2_ppf(levels, df) / df, dtype=np.float64)
        return nodes, np.full(_QUADRATURE_NODES, 1.0 / _QUADRATURE_NODES)
    # chi2(df) = 2 Y, Y ~ Gamma(df / 2): generalized Gauss-Laguerre, weight y^(df/2 - 1) e^-y
    nodes, weights = special.roots_genlaguerre(_QUADRATURE_NODES, df / 2.0 - 1.0)
    return np.asarray(2.0 * nodes / df), np.asarray(weights / weights.sum())


@lru_cache(maxsize=4096)
def _noncentrality_for_power(
    n_current: float, n_baseline: float, alpha: float, power: float
) -> float:
    """Standardised distance (effect / (sigma sqrt(1/n + 1/m))) the Welch test detects.

    Exact for normal log values with equal variances: given the two sample variances the mean
    difference is normal and independent of them, so the power is the expectation, over both
    scaled chi-square variances, of Phi(noncentrality - t_crit(Welch df) * se_hat / se).
    """
    cur_var, cur_w = _scaled_variance_nodes(n_current)
    base_var, base_w = _scaled_variance_nodes(n_baseline)
    inv_base = 0.0 if math.isinf(n_baseline) else 1.0 / n_baseline
    base_runs = int(n_baseline) if inv_base else 2  # any count: its variance is 0
    se_hat, df = welch_terms(cur_var[:, None], int(n_current), base_var[None, :], base_runs)
    offsets = np.asarray(t_isf(alpha, df)) * se_hat / math.sqrt(1.0 / n_current + inv_base)
    weights = cur_w[:, None] * base_w[None, :]

    def shortfall(noncentrality: float) -> float:
        return float(np.sum(weights * norm_cdf(noncentrality - offsets))) - power

    upper = float(offsets.max()) + float(norm_ppf(power)) + 1.0
    return float(optimize.brentq(shortfall, 0.0, upper, xtol=1e-10))


def min_detectable_effect(
    n_current: int, n_baseline: float, cv: float, alpha: float, power: float = MDE_POWER
) -> float:
    """Smallest relative distance from the threshold a one-sided Welch-log test detects.

    ``n_baseline`` may be ``math.inf`` (a baseline known without error); ``cv`` is the per-run
    coefficient of variation, taken equal on both sides. Returns e.g. 0.041 for 4.1 %.
    """
    if n_current < 2 or n_baseline < 2:
        raise StatsInputError(
            f"min_detectable_effect needs >= 2 runs per side, got n_current={n_current}, "
            f"n_baseline={n_baseline}: a single run has no variance to plan from"
        )
    if not (math.isfinite(cv) and cv >= 0):
        raise StatsInputError(f"cv={cv!r} must be a finite fraction >= 0 (0.03 for 3 %)")
    check_alpha(alpha)
    if not alpha < power < 1.0:
        raise StatsInputError(f"power={power!r} must lie between alpha={alpha} and 1")
    sigma = math.sqrt(math.log1p(cv * cv))  # sd of log values for a lognormal with this CV
    se = sigma * math.sqrt(1.0 / n_current + (0.0 if math.isinf(n_baseline) else 1.0 / n_baseline))
    noncentrality = _noncentrality_for_power(n_current, n_baseline, alpha, power)
    return math.expm1(noncentrality * se)


def required_runs(
    cv: float,
    effect: float,
    alpha: float,
    power: float = MDE_POWER,
    n_baseline: float | None = None,
) -> int:
    """Fewest current runs whose MDE is at most ``effect`` (both sides that size if no baseline).

    Raises :class:`StatsInputError` when a finite baseline is too small for any number of runs.
    """
    if not (math.isfinite(effect) and effect > 0):
        raise StatsInputError(f"effect={effect!r} must be a fraction > 0 (0.05 for 5 %)")
    min_detectable_effect(2, 2, cv, alpha, power)  # validates cv, alpha, power
    if cv == 0.0:
        return 2

    def mde(n: int) -> float:
        return min_detectable_effect(n, n if n_baseline is None else n_baseline, cv, alpha, power)

    if n_baseline is not None and not math.isinf(n_baseline):
        # With unlimited current runs only the baseline is uncertain: a one-sample t on it.
        limit = min_detectable_effect(int(n_baseline), math.inf, cv, alpha, power)
        if effect <= limit:
            raise StatsInputError(
                f"an effect of {effect:.1%} at CV {cv:.1%} cannot be detected against a baseline "
                f"of {n_baseline:g} runs with any number of current runs (limit {limit:.1%}); "
                "record a larger baseline"
            )
    high = 2
    while mde(high) > effect:
        high *= 2
    low = high // 2 if high > 2 else 1  # mde(low) > effect, or low is below the minimum of 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if mde(middle) <= effect else (middle, high)
    return high


def _positive_values(samples: Sequence[float], side: str) -> NDArray[np.float64]:
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


def _is_constant(values: NDArray[np.float64]) -> bool:
    return bool(np.all(values == values[0]))


def check_margin(margin: float) -> None:
    if not (math.isfinite(margin) and margin > -1.0):
        raise StatsInputError(
            f"margin={margin!r} must be a finite fraction above -1 (-0.03 for 'at most 3 % worse')"
        )


def check_alpha(alpha: float) -> None:
    if not (0.0 < alpha < 0.5):
        raise StatsInputError(f"alpha={alpha!r} must lie strictly between 0 and 0.5")
