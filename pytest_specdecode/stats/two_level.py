"""Runs nest in launches: the two-level model behind comparisons across server launches.

A relaunch of the same SGLang server is a source of variance of its own: on one H200 the same
no-speculation profile measured 298.0 and 262.4 tok/s in two launches (run-to-run CV about 2 %
inside each), and 173.7 and 218.1 tok/s in two launches of the GPU smoke. A nightly run always
relaunches, so its runs and the baseline's come from different launches, and 20 runs of one launch
say little about the next launch. Following Kalibera and Jones ("Rigorous Benchmarking in
Reasonable Time", ISMM 2013): repeat at every level that varies, and let the highest level carry
the uncertainty. docs/statistics.md has the derivation and the simulated error rates.

**Model** (log values, oriented so that higher is better): run j of launch k is
``y_kj = mu + a_k + e_kj`` with launch effects ``a_k ~ N(0, sigma_L^2)`` and run noise
``e_kj ~ N(0, sigma_w^2)``. The baseline has K launches with ``r_k`` runs each; the current side
is one launch of n runs (the nightly case).

**Estimates.** Baseline level: the mean of the K launch means (each launch weighs the same).
Launch means vary with ``S_M^2`` (K - 1 df), whose expectation is ``sigma_L^2 + h sigma_b^2``
with ``h = mean(1 / r_k)``; the within-launch variances ``s_b^2`` (baseline, pooled) and ``s_c^2``
(current) come from the runs. The launch variance is ``sigma_L^2 = max(0, S_M^2 - h s_b^2)``
(method of moments), pooled, when the history gives one, with its own estimate
(:func:`prior_from_history`), weighted by degrees of freedom.

**Interval.** The difference ``d = mean(current) - mean(launch means)`` has variance
``sigma_L^2 (1 + 1/K) + h s_b^2 / K + s_c^2 / n``: the current launch's own effect, the
baseline level's launch and run uncertainty, the current runs. Its degrees of freedom are
Satterthwaite's over the three estimated terms, the launch term counting ``K - 1`` (plus the
history's). With one baseline launch and no history the launch variance cannot be estimated: the
interval is the run-level one (Welch) and says so in a warning.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

HISTORY_WINDOW = 30
"""Nights of history used for the launch variance: the most recent ones, so that a slow drift
of the build (which the successive differences mostly cancel) has little room to grow."""

MIN_HISTORY_NIGHTS = 3

STATED_LAUNCH_CV = 0.06
"""The launch CV of the stated prior used when a test has no history (:func:`stated_prior`):
above the 5 % that the first-night target is set for, so that a box at or below it is judged
conservatively, and below the 8.9 % and 16 % two-launch spreads seen on tiny models with CUDA
graphs off (docs/statistics.md, "The first night"), where the conflict check drops it."""

STATED_PRIOR_DF = 6.0
"""Pseudo degrees of freedom of the stated prior: it weighs as much as 7 launches' means would.
With the baseline's 2 df the guard's t has 8 df instead of 2 (t quantile about 3.2 instead of
8.6 at the guard's level), which is what lets the seed's -29 % FAIL on the first night."""

TIMING_METRICS = frozenset({"tok_s", "decode_tok_s", "ttft", "tpot", "itl_p50", "itl_p99"})
"""The metrics the stated prior is about: speeds and latencies, which a relaunch moves (GPU
clocks, placement, CUDA graph capture). Accept length under greedy decoding barely varies by
launch; a 6 % prior would only blur its first-night verdicts, so it keeps its own launches'."""

HISTORY_GUARD_NIGHTS = 10
"""Nights of history from which the no-change guard tightens (:func:`guard_alpha`)."""

HISTORY_GUARD_FACTOR = 0.1
"""The no-change guard is ten times stricter once the history has :data:`HISTORY_GUARD_NIGHTS`
nights (:func:`guard_alpha`): the default 0.01 becomes 0.001. The nightly gate then only has to
catch large drops the same night, and the cross-night detector
(:mod:`pytest_specdecode.stats.crossnight`) gets most of the false-alarm budget of 5 % per check per
30 nights (0.04-0.05 % false FAILs a
night at 0.001, about 1.5 % a month, leaves 3.5 %)."""

STRICT_GUARD_DF = 24.0
"""Degrees of freedom of the history's launch variance from which the guard is stricter still
(:data:`STRICT_GUARD_FACTOR`). Only a variance carried over from earlier regimes reaches them
(:func:`pytest_specdecode.stats.night_series.launch_prior`: 30 earlier nights and a 3-launch
baseline give 32); the von Neumann estimate of 30 nights has about 19."""

STRICT_GUARD_FACTOR = 0.03
"""The guard's factor from :data:`STRICT_GUARD_DF` on: the default 0.01 becomes 0.0003. The t
quantile at 0.0003 with 32 df (3.81) is near that at 0.001 with 19 (3.58), so the seed's -29 %
still FAILs the night it lands (launch CV 5 %: 96.8 % in the model, 97.6 % before); the
nightly gate's false FAILs fall from 1-2 % to about 0.5 % a month, and the union with the
cross-night scan's 3.5 % stays inside the 5 % budget in every month (docs/statistics.md)."""

CONFLICT_LEVEL = 0.10
"""Prior-data conflict: a stated prior is dropped when the baseline's own launch means vary more
than its upper ``1 - CONFLICT_LEVEL`` F quantile allows (:func:`two_level`)."""

QUIET_LEVEL = 0.001
"""Prior-data conflict the other way: a stated prior is dropped when the baseline's launch means
and the history's nights together vary less than its lower ``QUIET_LEVEL`` F quantile allows
(:func:`prior_too_loud`). Far stricter than :data:`CONFLICT_LEVEL`: dropping a prior on a
variance that is small by chance makes the t test that follows liberal."""


@dataclass(frozen=True)
class LaunchPrior:
    """The variance of one launch's mean (log scale) from earlier nights of the same test, the
    same fingerprint and workload: ``variance`` estimates ``sigma_L^2 + sigma_w^2 / runs``."""

    variance: float
    df: float
    nights: int
    runs: float  # runs per night (their mean); inf for a stated prior on sigma_L^2 alone
    source: str = "history"  # "history", or the stated prior's description for the verdict
    stated_prior: LaunchPrior | None = None
    """A stated prior pooled with this history's nights while they are few (:func:`bridged`)."""
    regimes: int = 0
    """Earlier regimes (levels before an acknowledged change) whose noise is carried in
    (:func:`pytest_specdecode.stats.night_series.launch_prior`); 0: this level's nights alone."""

    @property
    def stated(self) -> bool:
        """A prior stated in advance (:func:`stated_prior`), not measured on this test."""
        return self.source != "history"

    def launch_variance(self, within: float) -> float:
        """``sigma_L^2`` alone, given the run-to-run variance ``within`` (log scale)."""
        return max(0.0, self.variance - within / self.runs)


def prior_from_history(
    log_means: Sequence[float], runs: Sequence[float], *, window: int = HISTORY_WINDOW
) -> LaunchPrior | None:
    """The launch-mean variance from successive nights (oldest first), or None with fewer than
    :data:`MIN_HISTORY_NIGHTS`.

    Successive differences, not the spread around the mean: half the mean squared successive
    difference (von Neumann) estimates the variance of one night's mean without the drift of a
    build that gets slowly faster or slower, and a step change (a real regression that was then
    fixed) inflates it by one difference only. Its degrees of freedom are taken as two thirds of
    the number of differences (successive differences overlap; for independent nights the
    estimator's efficiency against the sample variance is about 2/3).
    """
    values = np.asarray(log_means, dtype=np.float64)[-window:]
    counts = np.asarray(runs, dtype=np.float64)[-window:]
    if values.size < MIN_HISTORY_NIGHTS or not np.all(np.isfinite(values)):
        return None
    diffs = np.diff(values)
    variance = float(np.mean(diffs**2) / 2.0)
    return LaunchPrior(
        variance=variance,
        df=max(1.0, 2.0 * diffs.size / 3.0),
        nights=int(values.size),
        runs=float(np.mean(counts)),
    )


def stated_prior(
    launch_cv: float = STATED_LAUNCH_CV, df: float = STATED_PRIOR_DF, *, where: str = ""
) -> LaunchPrior:
    """A scaled-inverse-chi-square prior on the launch variance: ``sigma_L^2`` is believed to be
    about ``ln(1 + launch_cv^2)`` with the weight of ``df`` degrees of freedom. Pooled by df with
    the baseline's launch means (:func:`two_level`) it is the conjugate posterior's point
    estimate, and the t quantile gets ``K - 1 + df`` degrees of freedom instead of ``K - 1``.

    Used only when a test has no history of its own (the first nights after a baseline is
    recorded): 2 df from three baseline launches put the no-change guard's t quantile near 8.6,
    so the seed's -29 % regression FAILed on the first night in only about a third of nights at
    launch CV 5 %. ``where`` says where the figure came from; the verdict names it."""
    if not (launch_cv > 0 and math.isfinite(launch_cv)) or not df > 0:
        raise ValueError(f"a stated prior needs launch_cv > 0 and df > 0, got {launch_cv}, {df}")
    origin = f" ({where})" if where else ""
    return LaunchPrior(
        variance=math.log1p(launch_cv**2),
        df=float(df),
        nights=0,
        runs=math.inf,  # a prior on sigma_L^2 itself: no run noise to subtract
        source=f"a stated prior of launch CV {launch_cv:.1%} with {df:g} pseudo-df{origin}",
    )


def bridged(history: LaunchPrior | None, stated: LaunchPrior) -> LaunchPrior:
    """The prior of a test whose history is still short: the stated prior alone without
    history, pooled with the history's nights while they are fewer than
    :data:`HISTORY_GUARD_NIGHTS`, the history alone from then on.

    Pooling, not replacing: three nights of history give the launch variance about 1.3 df, and
    a history prior that replaced the stated one on the fourth night after a box's first
    baseline put the no-change guard's t near 20 again (the seed's -29 % went unflagged on
    nights 4-6, "upper bound 1.529" for a measured 0.669; issue 44). Pooled, the df only grow.
    From ten nights the history's own df (about six) match the stated prior's weight and its
    figure is the box's own: a stated 6 % would otherwise blur a quiet box's verdicts for good
    (an H200's launch CV is about 1 %)."""
    if history is None:
        return stated
    if history.nights >= HISTORY_GUARD_NIGHTS:
        return history
    return replace(history, stated_prior=stated)


def guard_alpha(alpha_no_change: float, prior: LaunchPrior | None) -> float:
    """The no-change guard's level for a check with this prior: ``alpha_no_change`` times
    :data:`HISTORY_GUARD_FACTOR` once the history has :data:`HISTORY_GUARD_NIGHTS` nights, times
    :data:`STRICT_GUARD_FACTOR` once its launch variance also has :data:`STRICT_GUARD_DF` df (noise
    carried over from earlier regimes), else ``alpha_no_change``. A factor, not a fixed level,
    so that a guard already spent across the sequential looks (the session passes each look its
    share) keeps its proportions.

    With history the launch variance has enough df that a stricter guard costs little same-night
    power against large drops, and the cross-night detector carries the small ones; right after
    a (re)recording it would cost the first night its power (-29 % at guard 0.002 and no
    history FAILs in only 67 % with 6 launches)."""
    if prior is None or prior.stated or prior.nights < HISTORY_GUARD_NIGHTS:
        return alpha_no_change
    if prior.df >= STRICT_GUARD_DF:
        return alpha_no_change * STRICT_GUARD_FACTOR
    return alpha_no_change * HISTORY_GUARD_FACTOR


def prior_conflicts(
    prior: LaunchPrior,
    launch_means_variance: float,
    launches: int,
    history: LaunchPrior | None = None,
) -> bool:
    """Whether the baseline's launch means (``launches`` of them, variance of their means
    ``launch_means_variance``, run noise included), pooled by df with the ``history``'s nights
    when given, vary more than a stated prior allows: the ratio to the prior's variance beyond
    the F(df, prior df) quantile at :data:`CONFLICT_LEVEL`. A history prior measured this test
    and is never in conflict by construction."""
    if not prior.stated or prior.variance <= 0:
        return False
    variance, df = _measured_spread(launch_means_variance, launches, history)
    if df <= 0:
        return False
    from pytest_specdecode.stats.distributions import f_isf

    limit = float(f_isf(CONFLICT_LEVEL, df, prior.df))
    return variance / prior.variance > limit


def prior_too_loud(
    prior: LaunchPrior,
    launch_means_variance: float,
    launches: int,
    history: LaunchPrior | None,
) -> bool:
    """Whether the baseline's launch means and the history's nights, pooled by df, vary so much
    less than a stated prior that it is refuted at :data:`QUIET_LEVEL`: a box quieter than
    stated. An H200's no-speculation launches vary 0.8 %; pooled with a stated 6 % until the
    history had ten nights, a 10 % drop landing the night after a box's first baseline was not
    FAILed before its eleventh night (benchmarks/bench_nightly.py), where the box's own figure
    FAILs it within a few.

    Only with at least :data:`MIN_HISTORY_NIGHTS` nights of history: three launch means alone
    lie close together by chance too often, and the t of two df that follows is liberal on
    exactly those draws. Simulated with 3 baseline launches and 3-8 nights of history: a box at
    launch CV 5 % drops the prior on at most 0.1 % of such nights, one at 3 % on 0.4-1.5 % (run
    CV 3 %, 8 runs a night); the H200's no-speculation noise (launch CV 0.8 %, run CV 0.6 %)
    on 38 % at three nights, 86 % at five, 96 % at six."""
    if not prior.stated or prior.variance <= 0 or history is None:
        return False
    if history.nights < MIN_HISTORY_NIGHTS:
        return False
    variance, df = _measured_spread(launch_means_variance, launches, history)
    from pytest_specdecode.stats.distributions import f_isf

    limit = float(f_isf(1.0 - QUIET_LEVEL, df, prior.df))
    return variance / prior.variance < limit


def _measured_spread(
    launch_means_variance: float, launches: int, history: LaunchPrior | None
) -> tuple[float, float]:
    """The variance of one launch's mean measured on this test, pooled by df: the baseline's
    launch means (run noise included) and the history's nights; and its df."""
    total, df = 0.0, 0.0
    if launches >= 2:
        total, df = launch_means_variance * (launches - 1), float(launches - 1)
    if history is not None:
        total, df = total + history.variance * history.df, df + history.df
    return (total / df if df > 0 else 0.0), df


@dataclass(frozen=True)
class TwoLevelInterval:
    """The estimated log ratio, its standard error and degrees of freedom."""

    estimate: float
    se: float
    df: float
    launches: int
    launch_variance: float  # sigma_L^2 used (log scale)
    within_current: float
    within_baseline: float
    notes: tuple[str, ...]

    @property
    def launch_cv(self) -> float:
        return math.sqrt(math.expm1(self.launch_variance))


def two_level(
    log_current: NDArray[np.float64],
    log_baseline: NDArray[np.float64],
    launch_runs: Sequence[int],
    prior: LaunchPrior | None = None,
) -> TwoLevelInterval:
    """The two-level estimate of ``mean(current) - baseline level`` (module docstring).

    ``log_baseline`` holds the baseline's runs in launch order, ``launch_runs`` how many each
    launch contributed (they add up to its length); ``log_current`` is one launch."""
    runs = _run_level(log_current, log_baseline, launch_runs)
    history, prior, notes = _priors_in_use(prior, runs.spread, runs.k)
    pool = _launch_pool(runs, history, prior)
    if not pool.parts:
        notes.append(
            "the baseline was recorded in one server launch and there is no history of "
            "this test, so the launch-to-launch variance is not in the interval (on real "
            "GPUs it is often larger than the run-to-run one); record the baseline with "
            "--specdecode-baseline-launches 3"
        )
    variance, df = _satterthwaite(_mean_squares(runs, pool))
    if pool.measured:
        # Never more than the launch level's own df: Satterthwaite's df is estimated from the
        # same draw as the standard error and is liberal exactly when the launch means happen to
        # lie close together (an unchanged build then failed 1% instead of 0.4% at launch CV
        # 5%; docs/statistics.md). This is Kalibera and Jones's t on the launch means.
        df = min(df, pool.df)
    return TwoLevelInterval(
        estimate=runs.estimate,
        se=math.sqrt(variance),
        df=df,
        launches=runs.k,
        launch_variance=pool.launch_var if pool.measured else 0.0,
        within_current=runs.s_c,
        within_baseline=runs.s_b,
        notes=tuple(notes),
    )


@dataclass(frozen=True)
class _RunLevel:
    """What the runs alone give :func:`two_level`: the difference ``d``, the within-launch
    variances and the spread of the baseline's launch means."""

    k: int  # baseline launches
    n: int  # current runs
    means: NDArray[np.float64]  # the baseline's launch means
    estimate: float  # d = mean(current) - mean(launch means)
    s_c: float  # s_c^2, within the current launch (0 with one run)
    s_b: float  # s_b^2, within the baseline's launches, pooled (s_c^2 with no df of its own)
    within_df: float  # s_b^2's df (inf with none)
    h: float  # mean(1 / r_k)
    spread: float  # S_M^2, the variance of the launch means (0 with one launch)


def _run_level(
    log_current: NDArray[np.float64], log_baseline: NDArray[np.float64], launch_runs: Sequence[int]
) -> _RunLevel:
    """The run-level estimates of :func:`two_level`, the baseline split into its launches."""
    groups = _split(log_baseline, launch_runs)
    k = len(groups)
    n = log_current.size
    means = np.array([group.mean() for group in groups])
    level = float(means.mean())
    estimate = float(log_current.mean()) - level
    s_c = float(np.var(log_current, ddof=1)) if n > 1 else 0.0
    within_df = sum(group.size - 1 for group in groups)
    s_b = (
        sum(float(np.sum((group - group.mean()) ** 2)) for group in groups) / within_df
        if within_df > 0
        else s_c
    )
    h = float(np.mean([1.0 / group.size for group in groups]))
    spread = float(np.var(means, ddof=1)) if k >= 2 else 0.0
    return _RunLevel(
        k=k,
        n=n,
        means=means,
        estimate=estimate,
        s_c=s_c,
        s_b=s_b,
        within_df=float(within_df) if within_df > 0 else math.inf,
        h=h,
        spread=spread,
    )


@dataclass(frozen=True)
class _LaunchPool:
    """The launch variance of :func:`two_level`, pooled by df over its sources."""

    parts: list[tuple[float, float, float]]  # (variance of launch means, df, runs each)
    df: float  # the parts' df together
    launch_var: float  # sigma_L^2 (log scale) by the method of moments; <= 0: none measured
    subtract: float  # the run noise the pooled launch means carry, per unit of s_b^2

    @property
    def measured(self) -> bool:
        """A launch variance beyond the run noise: the interval carries a launch term."""
        return bool(self.parts) and self.launch_var > 0


def _launch_pool(
    runs: _RunLevel, history: LaunchPrior | None, prior: LaunchPrior | None
) -> _LaunchPool:
    """The launch variance from the baseline's launch means, the history and the stated prior
    in use (:func:`_priors_in_use`)."""
    k, means, h, s_b = runs.k, runs.means, runs.h, runs.s_b
    # The launch variance: from the baseline's launch means (K - 1 df), pooled by df with the
    # history's, as a linear combination of independent mean squares: (value, df, weight).
    # S_M^2 - h s_b^2 estimates sigma_L^2 from the launch means; V_h - s_b^2 / runs from history.
    parts: list[tuple[float, float, float]] = []  # (variance of launch means, df, runs each)
    if k >= 2:
        parts.append((float(np.var(means, ddof=1)), float(k - 1), 1.0 / h))
    for part in (history, prior):
        if part is not None:
            parts.append((part.variance, part.df, part.runs))
    pooled_df = sum(df for _, df, _ in parts)
    launch_var = 0.0
    subtract = 0.0  # the run noise the pooled launch means carry, per unit of s_b^2
    for value, df, runs_each in parts:
        launch_var += df / pooled_df * value
        subtract += df / pooled_df / runs_each
    launch_var -= subtract * s_b
    return _LaunchPool(parts=parts, df=pooled_df, launch_var=launch_var, subtract=subtract)


def _mean_squares(runs: _RunLevel, pool: _LaunchPool) -> list[tuple[float, float, float]]:
    """The variance of ``d`` as a linear combination of independent mean squares,
    (coefficient, value, df): the launch term (the current launch's own effect and the baseline
    level's), the baseline's run noise, the current runs (module docstring: Interval)."""
    k, h, s_b = runs.k, runs.h, runs.s_b
    mean_squares: list[tuple[float, float, float]] = []  # (coefficient, value, df)
    if pool.measured:
        factor = 1.0 + 1.0 / k
        for value, df, _ in pool.parts:
            mean_squares.append((factor * df / pool.df, value, df))
        mean_squares.append((h / k - factor * pool.subtract, s_b, runs.within_df))
    elif k >= 2:  # no launch variance beyond the run noise: the baseline level's own spread
        mean_squares.append((1.0 / k, float(np.var(runs.means, ddof=1)), float(k - 1)))
    else:
        mean_squares.append((h / k, s_b, runs.within_df))
    n = runs.n
    mean_squares.append((1.0 / n, runs.s_c, float(n - 1) if n > 1 else math.inf))
    return mean_squares


def _satterthwaite(mean_squares: list[tuple[float, float, float]]) -> tuple[float, float]:
    """The variance of the combination of ``mean_squares`` and Satterthwaite's df for it (at
    least 1)."""
    variance = max(0.0, sum(c * value for c, value, _ in mean_squares))
    denominator = sum(
        (c * value) ** 2 / df for c, value, df in mean_squares if value > 0 and math.isfinite(df)
    )
    df = variance**2 / denominator if denominator > 0 else math.inf
    # Satterthwaite's df falls below 1 when a term is subtracted (the run noise inside the
    # launch means) and that term is large: real SGLang gave 0.23 with two noisy launches, a t
    # quantile past overflow. Below 1 the t distribution has no mean; 1 (Cauchy) is the floor.
    df = max(df, 1.0)
    return variance, df


def _priors_in_use(
    prior: LaunchPrior | None, spread: float, k: int
) -> tuple[LaunchPrior | None, LaunchPrior | None, list[str]]:
    """The history and the stated prior that :func:`two_level` pools with the baseline's ``k``
    launch means (``spread``: the variance of those means), and what the verdict says of them: a
    stated prior is dropped when this box's own launches and nights refute it either way."""
    notes: list[str] = []
    history: LaunchPrior | None = None
    if prior is not None and not prior.stated:
        history, prior = prior, prior.stated_prior
    if prior is not None and prior_conflicts(prior, spread, k, history):
        # The baseline's own launches disagree with the stated figure: this box varies more than
        # it says, and trusting it would make false FAILs (a prior stated at 6 % on a box at
        # 10 % FAILed an unchanged build in 1.5 % of first nights). Its own 2 df are honest.
        measured = "baseline launches" + (" and the history's nights" if history else "")
        notes.append(
            f"{prior.source} was not used: the {k} {measured} vary more than it allows "
            f"(launch CV about {math.sqrt(math.expm1(spread)):.1%})"
        )
        prior = None
    elif prior is not None and history is not None and prior_too_loud(prior, spread, k, history):
        # A quiet box: trusting the stated figure would keep it blind to a 10 % drop for ten
        # nights. The baseline's launches and the nights since are its own evidence.
        quiet, _ = _measured_spread(spread, k, history)
        notes.append(
            f"{prior.source} was not used: the {k} baseline launch{'es' if k != 1 else ''} and "
            f"{history.nights} nights of history vary far less than it allows (launch CV about "
            f"{math.sqrt(math.expm1(quiet)):.1%}): this box's own launch variance decides"
        )
        prior = None
    elif prior is not None and history is not None:
        notes.append(
            f"the launch variance of {history.nights} nights of history is pooled with "
            f"{prior.source} until the history has {HISTORY_GUARD_NIGHTS} nights"
        )
    elif prior is not None:
        # One baseline launch measures no launch variance at all: the prior is all there is,
        # and the remedy is still to measure it.
        remedy = (
            "; the baseline was recorded in one server launch: record it with "
            "--specdecode-baseline-launches 3 to measure this box's own"
            if k < 2
            else ""
        )
        notes.append(f"the launch variance is pooled with {prior.source}{remedy}")
    return history, prior, notes


def _split(values: NDArray[np.float64], launch_runs: Sequence[int]) -> list[NDArray[np.float64]]:
    if sum(launch_runs) != values.size or any(n < 1 for n in launch_runs):
        return [values]  # not split as recorded (e.g. a metric missing in some runs)
    groups, start = [], 0
    for count in launch_runs:
        groups.append(values[start : start + count])
        start += count
    return groups


def prior_for(
    history: Sequence[Mapping[str, Any]],
    *,
    test_id: str,
    hardware_key: str,
    fingerprint: str,
    workload_hash: str,
    metric: str,
) -> LaunchPrior | None:
    """The launch prior of one test's metric from history records (oldest first; the JSON-lines
    history of :mod:`pytest_specdecode.outputs.history`): the nights that measured the same test
    on the same hardware key, configuration fingerprint and workload, each one launch. A night
    whose test was not measured (crashed) or measured the metric in one run is left out."""
    log_means: list[float] = []
    runs: list[float] = []
    for night in history:
        for test in night.get("tests") or ():
            if not isinstance(test, Mapping) or (
                test.get("test_id"),
                test.get("hardware_key"),
                test.get("fingerprint"),
                test.get("workload_hash"),
            ) != (test_id, hardware_key, fingerprint, workload_hash):
                continue
            if test.get("outcome") == "recorded":
                continue  # a baseline recording (several launches) is not one night's launch
            summary = (test.get("metrics") or {}).get(metric)
            if not isinstance(summary, Mapping):
                continue
            mean, n = summary.get("mean"), summary.get("n")
            if isinstance(mean, int | float) and mean > 0 and isinstance(n, int) and n >= 2:
                log_means.append(math.log(mean))
                runs.append(float(n))
    return prior_from_history(log_means, runs)
