"""Repeated looks at a growing sample: how many runs, when to look, and at which alpha.

The plugin takes ``runs`` measurements, judges them, and on INCONCLUSIVE takes more, up to
``max_runs``. Each look is one :func:`pytest_specdecode.stats.comparison.compare`; this module
decides the alpha of every look so that looking repeatedly does not inflate the error.

**Sequential design.** Testing again after every extra run at the full alpha ("peeking") inflates
the error: six looks at 5..10 runs, each at 0.05, FAIL a build that sits exactly on the threshold
8-11 % of the time (baselines of 5-50 runs). A :class:`SequentialPlan` looks at ``initial_runs``,
then every ``step`` runs up to ``max_runs``, and spends alpha across the looks with a Lan-DeMets
spending function on the run fraction n / max_runs, so that the chance of ever crossing the FAIL
bound at the threshold is alpha, and the same for PASS (each non-binding for the other). The
default is O'Brien-Fleming-type: little alpha early (0.0056 at 5 of 10 runs), the last look near
the fixed-sample test (0.033-0.044 at 10 runs depending on the baseline size), because a server
load costs far more than a run, so power at ``max_runs`` matters more than stopping early, and a
large change still stops at the first look. ``pocock`` spends evenly (about 0.015-0.03 per look)
and stops sooner, with less power at the end.

The per-look levels are calibrated by simulation, not by the textbook z-statistic boundaries:
those assume a known variance, but every look re-estimates it, which decorrelates the looks
(0.056 overall instead of 0.05 at 5..10 runs), and Welch's df is itself slightly liberal at
5 vs 20-100 runs (0.052-0.053 for one look at 0.05). So each look's level is set, on 200,000
seeded paths of the actual Welch p-values with the truth on the threshold, equal CVs and the
plan's baseline size, to the value that exactly the spending function's increment of the paths
first crosses (Monte Carlo error of the overall alpha about +-0.0005). ``n_baseline=None``
calibrates for a baseline known exactly. Simulated false-FAIL rates at the threshold are checked
in ``tests/unit/test_stats.py`` and printed by ``benchmarks/bench_verdict.py``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numpy.typing import ArrayLike, NDArray

from pytest_specdecode.stats.calibration_cache import code_digest, library_versions, memoized
from pytest_specdecode.stats.comparison import (
    DEFAULT_RESAMPLES,
    Comparison,
    Verdict,
    compare,
    verdict_codes,
)
from pytest_specdecode.stats.distributions import norm_isf, norm_sf, t_isf, t_sf
from pytest_specdecode.stats.samples import StatsInputError, check_alpha, check_margin
from pytest_specdecode.stats.welch import welch_terms

__all__ = ["SPENDING_FUNCTIONS", "SequentialPlan", "run_sequential", "sequential_verdicts"]

SPENDING_FUNCTIONS = ("obrien-fleming", "pocock")
_CALIBRATION_PATHS = 200_000  # Monte Carlo error of the overall alpha about +-0.0005
_CALIBRATION_SEED = 20_240_601


@dataclass(frozen=True)
class SequentialPlan:
    """How many runs, when to look, and the per-look alpha that keeps the overall error <= alpha.

    Looks at ``initial_runs``, ``initial_runs + step``, ... and always at ``max_runs``.
    ``n_baseline`` is the stored baseline's run count the per-look alphas are calibrated for;
    ``None`` calibrates for a baseline known exactly. :func:`run_sequential` and
    :func:`sequential_verdicts` set it from the baseline they are given; a caller that drives the
    looks itself should use :meth:`for_baseline`.
    """

    initial_runs: int = 5
    max_runs: int = 10
    step: int = 1
    alpha: float = 0.05
    spending: str = "obrien-fleming"
    n_baseline: int | None = None

    def __post_init__(self) -> None:
        if not 2 <= self.initial_runs <= self.max_runs:
            raise StatsInputError(
                f"initial_runs={self.initial_runs}, max_runs={self.max_runs}: need "
                "2 <= initial_runs <= max_runs (one run has no variance)"
            )
        if self.step < 1:
            raise StatsInputError(f"step={self.step} must be at least 1 run")
        check_alpha(self.alpha)
        if self.spending not in SPENDING_FUNCTIONS:
            raise StatsInputError(
                f"spending={self.spending!r}: use one of {', '.join(SPENDING_FUNCTIONS)}"
            )
        if self.n_baseline is not None and self.n_baseline < 2:
            raise StatsInputError(f"n_baseline={self.n_baseline}: a baseline needs >= 2 runs")

    def for_baseline(self, n_baseline: int) -> SequentialPlan:
        """This plan calibrated for a baseline of ``n_baseline`` runs (itself if fewer than 2)."""
        return self if n_baseline < 2 else dataclasses.replace(self, n_baseline=n_baseline)

    def looks(self) -> tuple[int, ...]:
        """Run counts at which the verdict is evaluated."""
        return (*range(self.initial_runs, self.max_runs, self.step), self.max_runs)

    def look_alphas(self) -> tuple[float, ...]:
        """The nominal one-sided alpha of every look, in order."""
        return _nominal_look_alphas(self.looks(), self.alpha, self.spending, self.n_baseline)

    def alpha_at(self, look_index: int) -> float:
        """The nominal one-sided alpha of look ``look_index`` (0-based)."""
        alphas = self.look_alphas()
        if not 0 <= look_index < len(alphas):
            raise StatsInputError(f"look_index={look_index}: this plan has {len(alphas)} looks")
        return alphas[look_index]


def _spent(fractions: NDArray[np.float64], alpha: float, spending: str) -> NDArray[np.float64]:
    """Cumulative alpha spent by information fraction (Lan-DeMets)."""
    if spending == "pocock":
        return np.asarray(alpha * np.log1p((math.e - 1.0) * fractions), dtype=np.float64)
    z = float(norm_isf(alpha / 2.0))
    return np.asarray(2.0 * norm_sf(z / np.sqrt(fractions)), dtype=np.float64)


@lru_cache(maxsize=64)
def _nominal_look_alphas(
    looks: tuple[int, ...], alpha: float, spending: str, n_baseline: int | None
) -> tuple[float, ...]:
    """The calibrated level of every look, computed once per user (calibration_cache.py)."""
    key = {
        "looks": list(looks),
        "alpha": alpha,
        "spending": spending,
        "n_baseline": n_baseline,
        "paths": _CALIBRATION_PATHS,
        "seed": _CALIBRATION_SEED,
        **library_versions(),
        "code": code_digest((_simulate_look_alphas, _spent, welch_terms)),
    }
    return memoized(key, lambda: _simulate_look_alphas(looks, alpha, spending, n_baseline))


def _simulate_look_alphas(
    looks: tuple[int, ...], alpha: float, spending: str, n_baseline: int | None
) -> tuple[float, ...]:
    # Simulate the Welch p-values of the actual test at every look, on seeded paths with the
    # truth exactly at the threshold and equal CVs, and give each look the level that exactly
    # the spending function's increment of the paths first crosses. Boundaries solved for z
    # statistics are not enough: re-estimating the variance at every look decorrelates the looks
    # (overall 0.056 instead of 0.05 at 5..10 runs), and Welch's df is itself slightly liberal at
    # 5 vs 20-100 runs (0.052-0.053 for one look at 0.05).
    spent = _spent(np.asarray(looks, dtype=np.float64) / looks[-1], alpha, spending)
    increments = np.diff(spent, prepend=0.0).tolist()
    rng = np.random.default_rng(_CALIBRATION_SEED)
    paths = _CALIBRATION_PATHS
    if n_baseline is None:
        base_mean, base_var, base_runs = np.zeros(paths), np.zeros(paths), 2
    else:  # the baseline's mean and variance are drawn from their exact distributions
        base_mean = rng.standard_normal(paths) / math.sqrt(n_baseline)
        base_var, base_runs = rng.chisquare(n_baseline - 1, paths) / (n_baseline - 1), n_baseline
    total, total_squares = np.zeros(paths), np.zeros(paths)
    running = np.ones(paths, dtype=bool)
    drawn = 0
    nominal: list[float] = []
    for n_runs, increment in zip(looks, increments, strict=True):
        new = rng.standard_normal((paths, n_runs - drawn))
        drawn = n_runs
        total += new.sum(axis=1)
        total_squares += (new * new).sum(axis=1)
        mean = total / n_runs
        var = (total_squares - n_runs * mean * mean) / (n_runs - 1)
        se, df = welch_terms(var, n_runs, base_var, base_runs)
        p_values = np.asarray(t_sf((mean - base_mean) / se, df))
        if not nominal and n_baseline is None:  # an exact one-sample t: no simulation needed
            level = increment
        else:
            crossings = max(1, round(increment * paths))
            level = float(np.partition(p_values[running], crossings - 1)[crossings - 1])
        running &= p_values > level
        nominal.append(level)
    return tuple(nominal)


def run_sequential(
    plan: SequentialPlan,
    draw: Callable[[int], Sequence[float]],
    baseline: Sequence[float],
    *,
    margin: float,
    higher_is_better: bool = True,
    method: str = "welch-log",
    seed: int | None = None,
    n_resamples: int = DEFAULT_RESAMPLES,
) -> tuple[Comparison, int]:
    """Draw runs look by look until a verdict or ``max_runs``; return it and the runs used.

    ``draw(k)`` must return k new per-run values. The plan is calibrated for ``len(baseline)``.
    The last comparison may be INCONCLUSIVE; the caller applies its policy (fail, pass with a
    warning, xfail).
    """
    plan = plan.for_baseline(len(baseline))
    runs: list[float] = []
    comparison: Comparison | None = None
    for index, n_runs in enumerate(plan.looks()):
        wanted = n_runs - len(runs)
        new = list(draw(wanted))
        if len(new) != wanted:
            raise StatsInputError(f"draw({wanted}) returned {len(new)} values instead of {wanted}")
        runs.extend(new)
        comparison = compare(
            runs,
            baseline,
            margin=margin,
            higher_is_better=higher_is_better,
            alpha=plan.alpha_at(index),
            method=method,
            seed=seed,
            n_resamples=n_resamples,
        )
        if comparison.verdict is not Verdict.INCONCLUSIVE:
            break
    assert comparison is not None  # a plan always has at least one look
    return comparison, len(runs)


def sequential_verdicts(
    plan: SequentialPlan,
    current: ArrayLike,
    baseline: ArrayLike,
    *,
    margin: float,
    higher_is_better: bool = True,
) -> tuple[NDArray[np.str_], NDArray[np.int64]]:
    """Vectorised :func:`run_sequential` with welch-log over many trials, for simulation.

    ``current`` is (trials, >= max_runs) in run order, ``baseline`` is (trials, m >= 2). Returns
    each trial's verdict value ("pass", "fail", "inconclusive") and the runs it used. The per-look
    decision is the same code :func:`compare` uses.
    """
    check_margin(margin)
    cur, base = np.asarray(current, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    if cur.ndim != 2 or base.ndim != 2 or cur.shape[0] != base.shape[0]:
        raise StatsInputError(
            f"current {cur.shape} and baseline {base.shape} must be (trials, runs) arrays with "
            "the same number of trials"
        )
    if cur.shape[1] < plan.max_runs or base.shape[1] < 2:
        raise StatsInputError(
            f"need >= {plan.max_runs} current runs and >= 2 baseline runs per trial, got "
            f"{cur.shape[1]} and {base.shape[1]}"
        )
    for name, values in (("current", cur), ("baseline", base)):
        if not np.all(np.isfinite(values) & (values > 0)):
            trial, run = (int(i) for i in np.argwhere(~(np.isfinite(values) & (values > 0)))[0])
            raise StatsInputError(
                f"{name} trial {trial + 1}, run {run + 1} has value {float(values[trial, run])!r}:"
                " per-run values must be finite and > 0"
            )
    sign = 1.0 if higher_is_better else -1.0
    log_cur, log_base = sign * np.log(cur), sign * np.log(base)
    threshold = math.log1p(margin)
    plan = plan.for_baseline(base.shape[1])
    base_mean, base_var = log_base.mean(axis=1), _row_variance(log_base)
    verdicts = np.full(cur.shape[0], Verdict.INCONCLUSIVE.value, dtype="<U12")
    runs = np.full(cur.shape[0], plan.max_runs, dtype=np.int64)
    undecided = np.ones(cur.shape[0], dtype=bool)
    for look_alpha, n_runs in zip(plan.look_alphas(), plan.looks(), strict=True):
        head = log_cur[:, :n_runs]
        se, df = welch_terms(_row_variance(head), n_runs, base_var, base.shape[1])
        half_width = np.asarray(t_isf(look_alpha, df)) * se
        estimate = head.mean(axis=1) - base_mean
        codes = verdict_codes(estimate - half_width, estimate + half_width, threshold)
        decided = undecided & (codes != 0)
        verdicts[decided & (codes == 1)] = Verdict.PASS.value
        verdicts[decided & (codes == -1)] = Verdict.FAIL.value
        runs[decided] = n_runs
        undecided &= ~decided
    return verdicts, runs


def _row_variance(values: NDArray[np.float64]) -> NDArray[np.float64]:
    variance = values.var(axis=1, ddof=1)
    return np.asarray(np.where(np.ptp(values, axis=1) == 0, 0.0, variance), dtype=np.float64)
