"""Each method's interval of current/baseline: two one-sided bounds and both p-values.

Each function answers on the signed log scale (the log of the higher-is-better ratio, so the
threshold is ``log1p(margin)``) with a :class:`LogInterval`. Which method answers, the verdict drawn
from its bounds, the no-change guard and the MDE are decided in
:func:`pytest_specdecode.stats.comparison.compare`; the arithmetic of each method lives here, apart
from those decisions, so either can be read without the other.

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
- ``two-level``: the t interval of :mod:`pytest_specdecode.stats.two_level`' estimate, when the
  baseline
  spans launches or the history gives a launch variance (:func:`t_interval`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pytest_specdecode.stats.distributions import (
    LazyModule,
    norm_cdf,
    norm_isf,
    norm_sf,
    t_cdf,
    t_isf,
    t_sf,
)
from pytest_specdecode.stats.welch import log_variance, welch_terms

# scipy is imported at the first comparison, not when pytest loads the plugin;
# scipy.stats only for the bootstrap (distributions.py says why)
stats: Any = LazyModule("scipy.stats")

__all__ = [
    "TIE_TOLERANCE",
    "LogInterval",
    "bootstrap_interval",
    "exact_interval",
    "no_variance_interval",
    "rank_interval",
    "t_interval",
    "welch_log_interval",
    "with_note",
]

# A bound this close to the threshold counts as on it, and on it PASSes (stats.verdict_codes); the
# p-values and the exact verdict here draw the same line.
TIE_TOLERANCE = 1e-9  # on the log scale, i.e. relative
_EXACT_RANK_MAX_PAIRS = 2500


@dataclass(frozen=True)
class LogInterval:
    """A method's answer on the signed log scale (log of the higher-is-better ratio)."""

    method: str
    estimate: float
    low: float
    high: float
    p_pass: float
    p_fail: float
    notes: tuple[str, ...] = ()
    df: float | None = None  # the t interval's degrees of freedom, where there is one


def with_note(interval: LogInterval, note: str) -> LogInterval:
    return dataclasses.replace(interval, notes=(*interval.notes, note))


def t_interval(
    method: str, estimate: float, se: float, df: float, threshold: float, alpha: float
) -> LogInterval:
    if se <= 0:
        return LogInterval(method, estimate, estimate, estimate, 0.0, 0.0, (), df)
    t_crit = float(t_isf(alpha, df))
    t_stat = (estimate - threshold) / se
    return LogInterval(
        method,
        estimate,
        estimate - t_crit * se,
        estimate + t_crit * se,
        float(t_sf(t_stat, df)),
        float(t_cdf(t_stat, df)),
        (),
        df,
    )


def no_variance_interval(
    log_cur: NDArray[np.float64], log_base: NDArray[np.float64], method: str
) -> LogInterval:
    side = "current" if log_cur.size == 1 else "baseline"
    note = (
        f"{side} has a single run, so its run-to-run variance is unknown and no confidence "
        "interval can be formed; take at least 2 runs (5 or more to resolve a few percent)"
    )
    estimate = float(np.mean(log_cur) - np.mean(log_base))
    return LogInterval(method, estimate, -math.inf, math.inf, 1.0, 1.0, (note,))


def exact_interval(
    log_cur: NDArray[np.float64], log_base: NDArray[np.float64], threshold: float
) -> LogInterval:
    # Both sides constant: the ratio is known without error, so the verdict is a plain comparison.
    estimate = float(log_cur[0] - log_base[0])
    passes = estimate >= threshold - TIE_TOLERANCE
    return LogInterval(
        "exact", estimate, estimate, estimate, 0.0 if passes else 1.0, 1.0 if passes else 0.0
    )


def welch_log_interval(
    log_cur: NDArray[np.float64],
    log_base: NDArray[np.float64],
    cur_constant: bool,
    base_constant: bool,
    threshold: float,
    alpha: float,
) -> LogInterval:
    estimate = float(np.mean(log_cur) - np.mean(log_base))
    se_arr, df_arr = welch_terms(
        np.asarray(log_variance(log_cur, cur_constant)),
        log_cur.size,
        np.asarray(log_variance(log_base, base_constant)),
        log_base.size,
    )
    interval = t_interval("welch-log", estimate, float(se_arr), float(df_arr), threshold, alpha)
    if cur_constant or base_constant:
        flat, other = ("current", "baseline") if cur_constant else ("baseline", "current")
        interval = with_note(
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


def bootstrap_interval(
    cur: NDArray[np.float64],
    base: NDArray[np.float64],
    sign: float,
    threshold: float,
    alpha: float,
    seed: int,
    n_resamples: int,
) -> LogInterval:
    log_cur, log_base = np.log(cur), np.log(base)
    var_cur, var_base = log_variance(log_cur, False), log_variance(log_base, False)
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
    below = (np.count_nonzero(boots < threshold - TIE_TOLERANCE) + 1) / (boots.size + 1)
    at_or_above = (np.count_nonzero(boots >= threshold - TIE_TOLERANCE) + 1) / (boots.size + 1)

    def p_value(tail: float) -> float:
        # The alpha at which the expanded percentile bound would sit exactly on the threshold.
        return float(t_sf(float(norm_isf(tail)) / expansion, df))

    return LogInterval(
        "bootstrap",
        float(statistic(cur, base, -1)),
        float(result.confidence_interval.low),
        float(result.confidence_interval.high),
        p_value(below),
        p_value(at_or_above),
    )


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


def rank_interval(
    log_cur: NDArray[np.float64], log_base: NDArray[np.float64], threshold: float, alpha: float
) -> LogInterval:
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

    at_or_above = int(np.count_nonzero(diffs >= threshold - TIE_TOLERANCE))
    return LogInterval(
        "rank",
        float(np.median(diffs)),
        low,
        high,
        tail(at_or_above),
        tail(n * m - at_or_above),
        notes,
    )
