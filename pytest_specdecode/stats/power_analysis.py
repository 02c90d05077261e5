"""How large a change a check can see, and how many runs it takes: the minimum detectable effect.

**Minimum detectable effect.** The relative distance from the threshold at which the one-sided
Welch-log test at this alpha and n reaches power 0.8: a true ratio of threshold * (1 + MDE) or
more PASSes, threshold / (1 + MDE) or less FAILs, with probability 0.8. It is computed exactly for
normal log values with equal CVs on both sides (Gauss-Laguerre quadrature over both sample
variances, which carries the randomness of Welch's df; the noncentral t with a fixed df promises
0.8 where Welch delivers 0.74 at 3 vs 3). It is a planning figure for all methods (the rank test
needs about 5 % more runs, ARE 3/pi). When MDE > |margin|, even an unchanged build cannot be told
from the threshold, and a warning says so with the number of runs that would.

Every comparison (:func:`pytest_specdecode.stats.comparison.compare`) reports its MDE, so this
module sits below it: it needs only the input checks (:mod:`pytest_specdecode.stats.samples`) and
Welch's terms (:mod:`pytest_specdecode.stats.welch`), never the comparison. A baseline spanning
launches plans with the two-level standard error of :mod:`pytest_specdecode.stats.two_level` instead
(:func:`two_level_mde`).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pytest_specdecode.stats.calibration_cache import code_digest, library_versions, memoized
from pytest_specdecode.stats.distributions import LazyModule, chi2_ppf, norm_cdf, norm_ppf, t_isf
from pytest_specdecode.stats.samples import StatsInputError, check_alpha
from pytest_specdecode.stats.two_level import TwoLevelInterval
from pytest_specdecode.stats.welch import log_variance, welch_terms

# scipy is imported at the first comparison, not when pytest loads the plugin (distributions.py)
optimize: Any = LazyModule("scipy.optimize")
special: Any = LazyModule("scipy.special")

__all__ = [
    "MDE_POWER",
    "mde_design",
    "mde_warning",
    "min_detectable_effect",
    "required_runs",
    "two_level_mde",
]

MDE_POWER = 0.8
_QUADRATURE_NODES = 48


def mde_design(
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
        return varying.size, math.inf, math.sqrt(math.expm1(log_variance(varying, False)))
    pooled = ((n - 1) * np.var(log_cur, ddof=1) + (m - 1) * np.var(log_base, ddof=1)) / (n + m - 2)
    return n, m, math.sqrt(math.expm1(float(pooled)))


def mde_warning(
    mde: float,
    margin: float,
    alpha: float,
    design: tuple[int, float, float],
    n_cur: int,
    n_base: int,
    cur_constant: bool,
) -> str:
    """Why a check whose MDE exceeds its margin could not be decided, and what would decide it."""
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
    """:func:`_solve_noncentrality`, solved once per user (calibration_cache.py): a pure function
    of four numbers, whose root finder's import costs every comparing process 0.17 s of CPU."""
    key = {
        "noncentrality_for_power": [n_current, n_baseline, alpha, power],
        "nodes": _QUADRATURE_NODES,
        **library_versions(),
        "code": code_digest(
            (_solve_noncentrality, _scaled_variance_nodes, welch_terms, t_isf, norm_cdf, norm_ppf)
        ),
    }
    (noncentrality,) = memoized(
        key, lambda: (_solve_noncentrality(n_current, n_baseline, alpha, power),)
    )
    return noncentrality


def _solve_noncentrality(n_current: float, n_baseline: float, alpha: float, power: float) -> float:
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


def two_level_mde(levels: TwoLevelInterval, alpha: float) -> float:
    """The distance a one-sided t test with the two-level standard error and df detects with
    power :data:`MDE_POWER` (treating the standard error as known: a planning figure)."""
    t_alpha = float(t_isf(alpha, levels.df))
    t_power = float(t_isf(1.0 - MDE_POWER, levels.df))
    distance = (t_alpha - t_power) * levels.se
    return math.expm1(distance) if distance < 50 else math.inf  # past that: unbounded
