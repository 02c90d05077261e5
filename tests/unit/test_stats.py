"""The verdict statistics: exact cases, interval coverage, sequential error rates and power.

Every statistical test uses a fixed seed. Rates estimated from T trials are checked against their
target with a tolerance of three binomial standard deviations, sqrt(p (1 - p) / T) * 3.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy import optimize
from scipy import stats as scipy_stats

from pytest_specdecode.errors import SpecdecodeError
from pytest_specdecode.stats.comparison import BOOTSTRAP_MIN_RUNS, Comparison, Verdict, compare
from pytest_specdecode.stats.power_analysis import min_detectable_effect, required_runs
from pytest_specdecode.stats.samples import StatsInputError, describe, summarize
from pytest_specdecode.stats.sequential import SequentialPlan, run_sequential, sequential_verdicts

CV = 0.03
SIGMA = math.sqrt(math.log1p(CV * CV))  # sd of log values for a lognormal with CV 3 %


def binomial_tolerance(p: float, trials: int) -> float:
    return 3.0 * math.sqrt(p * (1.0 - p) / trials)


def lognormal_runs(
    rng: np.random.Generator, ratio: float, shape: tuple[int, ...], level: float = 90.0
) -> NDArray[np.float64]:
    """Per-run values whose geometric (and arithmetic) mean is ``level * ratio``."""
    return np.exp(rng.normal(math.log(level * ratio), SIGMA, shape))


# --- summaries and exact cases -------------------------------------------------------------


def test_summarize_reports_sample_statistics() -> None:
    summary = summarize([88.0, 90.0, 92.0])
    assert (summary.n, summary.mean, summary.median, summary.min, summary.max) == (
        3,
        90.0,
        90.0,
        88.0,
        92.0,
    )
    assert summary.std == pytest.approx(2.0)
    assert summary.cv == pytest.approx(2.0 / 90.0)


def test_a_single_run_has_no_spread_and_constant_runs_have_exactly_zero() -> None:
    single = summarize([88.8])
    assert (single.std, single.cv, single.ci_low, single.ci_high) == (None, None, None, None)
    assert single.cv_text() == "n/a"
    # 0.1 summed three times is not 0.3: the spread of identical runs must still be exactly 0.
    constant = summarize([0.1, 0.1, 0.1])
    assert (constant.mean, constant.std, constant.cv) == (0.1, 0.0, 0.0)
    assert (constant.ci_low, constant.ci_high) == (0.1, 0.1)


def test_describe_gives_the_t_interval_of_the_mean() -> None:
    values = [88.0, 90.0, 92.0]
    summary = describe(values)
    half = scipy_stats.t.ppf(0.975, 2) * 2.0 / 3**0.5
    assert summary.ci_low == pytest.approx(90.0 - half)
    assert summary.ci_high == pytest.approx(90.0 + half)
    assert describe([0.0, 0.0]).cv is None  # a CV of a zero mean is undefined, not 0
    with pytest.raises(StatsInputError):
        describe([])


@pytest.mark.parametrize(
    ("current", "verdict"),
    [([2.0] * 5, Verdict.PASS), ([1.95] * 5, Verdict.PASS), ([1.9] * 5, Verdict.FAIL)],
)
def test_constant_samples_are_compared_exactly(current: list[float], verdict: Verdict) -> None:
    result = compare(current, [2.0] * 10, margin=-0.03)
    assert result.method == "exact"
    assert result.verdict is verdict
    assert result.ci_low == result.ci_high == pytest.approx(current[0] / 2.0)
    assert result.mde == 0.0
    assert {result.p_pass, result.p_fail} == {0.0, 1.0}


@pytest.mark.parametrize("method", ["welch-log", "bootstrap", "rank"])
def test_equality_at_the_boundary_passes(method: str) -> None:
    # 97/100 is 0.97 only up to rounding; "at most 3 % worse" includes exactly 3 % worse.
    at_boundary = compare([97.0] * 3, [100.0] * 4, margin=-0.03, method=method)
    assert at_boundary.verdict is Verdict.PASS
    assert at_boundary.ratio == pytest.approx(0.97)
    just_below = compare([96.99] * 3, [100.0] * 4, margin=-0.03, method=method)
    assert just_below.verdict is Verdict.FAIL
    improving = compare([105.0] * 2, [100.0] * 2, margin=+0.05)
    assert improving.verdict is Verdict.PASS


@pytest.mark.parametrize("method", ["welch-log", "bootstrap", "rank"])
@pytest.mark.parametrize(
    ("current", "baseline"),
    [([88.0], [90.0, 91.0, 89.0]), ([88.0, 87.0, 89.0], [90.0]), ([88.0], [90.0]), ([1.0], [1.0])],
)
def test_a_single_run_is_inconclusive_with_a_warning(
    method: str, current: list[float], baseline: list[float]
) -> None:
    result = compare(current, baseline, margin=-0.02, method=method)
    assert result.verdict is Verdict.INCONCLUSIVE
    assert (result.ci_low, result.ci_high, result.p_pass, result.p_fail) == (0.0, math.inf, 1, 1)
    assert result.mde is None
    assert any("single run" in warning for warning in result.warnings)
    assert "vs n/a" in result.describe() or "CV n/a" in result.describe()


def test_one_constant_side_reduces_to_a_one_sample_t_interval() -> None:
    current = [1.95, 2.05, 2.01, 1.99, 2.03]
    result = compare(current, [2.0] * 8, margin=-0.03, alpha=0.05)
    logs = np.log(current) - math.log(2.0)
    two_sided_90 = scipy_stats.ttest_1samp(logs, 0.0).confidence_interval(0.90)
    assert math.log(result.ci_low) == pytest.approx(two_sided_90.low)
    assert math.log(result.ci_high) == pytest.approx(two_sided_90.high)
    assert result.method == "welch-log"
    assert any("one-sample" in warning for warning in result.warnings)
    assert result.mde == pytest.approx(
        min_detectable_effect(5, math.inf, float(np.sqrt(np.expm1(np.var(logs, ddof=1)))), 0.05)
    )


def test_welch_log_matches_scipy_welch_test_on_logs() -> None:
    rng = np.random.default_rng(11)
    current, baseline = lognormal_runs(rng, 0.97, (6,)), lognormal_runs(rng, 1.0, (9,))
    result = compare(current.tolist(), baseline.tolist(), margin=-0.02)
    shifted = np.log(current) - math.log(0.98)
    welch = scipy_stats.ttest_ind(shifted, np.log(baseline), equal_var=False, alternative="less")
    assert result.p_fail == pytest.approx(welch.pvalue)
    assert result.p_pass == pytest.approx(1.0 - welch.pvalue)
    assert result.ratio == pytest.approx(scipy_stats.gmean(current) / scipy_stats.gmean(baseline))


@pytest.mark.parametrize("method", ["welch-log", "bootstrap", "rank"])
def test_lower_is_better_flips_the_ratio(method: str) -> None:
    rng = np.random.default_rng(3)
    ttft_current = lognormal_runs(rng, 1.10, (12,)).tolist()
    ttft_baseline = lognormal_runs(rng, 1.0, (12,)).tolist()
    flipped = compare(
        ttft_current, ttft_baseline, margin=-0.03, higher_is_better=False, method=method, seed=1
    )
    as_is = compare(ttft_current, ttft_baseline, margin=-0.03, method=method, seed=1)
    assert flipped.verdict is Verdict.FAIL  # 10 % slower to first token, allowed 3 % worse
    assert flipped.ratio == pytest.approx(1 / as_is.ratio, rel=1e-9)
    assert flipped.ci_low == pytest.approx(1 / as_is.ci_high, rel=1e-9)
    assert flipped.ci_high == pytest.approx(1 / as_is.ci_low, rel=1e-9)
    assert "lower is better" in flipped.describe()


@pytest.mark.parametrize("method", ["welch-log", "rank"])
def test_lower_is_better_equals_comparing_reciprocals_for_log_methods(method: str) -> None:
    rng = np.random.default_rng(4)
    ttft_current, ttft_baseline = lognormal_runs(rng, 1.03, (8,)), lognormal_runs(rng, 1, (9,))
    flipped = compare(
        ttft_current.tolist(),
        ttft_baseline.tolist(),
        margin=-0.02,
        higher_is_better=False,
        method=method,
    )
    as_rates = compare(
        (1 / ttft_current).tolist(), (1 / ttft_baseline).tolist(), margin=-0.02, method=method
    )
    for field in ("ratio", "ci_low", "ci_high", "p_pass", "p_fail"):
        assert getattr(flipped, field) == pytest.approx(getattr(as_rates, field), rel=1e-9)
    assert flipped.verdict is as_rates.verdict


@pytest.mark.parametrize("bad", [0.0, -88.0, math.nan, math.inf])
@pytest.mark.parametrize("side", ["current", "baseline"])
def test_non_positive_or_non_finite_values_are_rejected(bad: float, side: str) -> None:
    values = [90.0, bad, 91.0]
    good = [90.0, 89.0, 91.0]
    current, baseline = (values, good) if side == "current" else (good, values)
    with pytest.raises(ValueError, match=rf"{side} run 2 has value {bad!r}") as info:
        compare(current, baseline, margin=-0.02)
    assert isinstance(info.value, SpecdecodeError)
    with pytest.raises(StatsInputError, match="run 2"):
        summarize(values)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"margin": -1.0}, "margin=-1.0"),
        ({"margin": math.nan}, "margin=nan"),
        ({"margin": 0.0, "alpha": 0.5}, "alpha=0.5"),
        ({"margin": 0.0, "alpha": 0.0}, "alpha=0.0"),
        ({"margin": 0.0, "method": "median"}, "'median'"),
    ],
)
def test_bad_parameters_are_rejected(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(StatsInputError, match=message):
        compare([1.0, 2.0], [1.0, 2.0], **kwargs)  # type: ignore[arg-type]


def test_verdict_prints_as_its_value() -> None:
    assert str(Verdict.FAIL) == "fail"
    assert f"{Verdict.INCONCLUSIVE}" == "inconclusive"


# --- methods ---------------------------------------------------------------------------------


def test_rank_p_values_match_scipy_exact_mann_whitney() -> None:
    rng = np.random.default_rng(5)
    current, baseline = lognormal_runs(rng, 0.96, (6,)), lognormal_runs(rng, 1.0, (7,))
    result = compare(current.tolist(), baseline.tolist(), margin=-0.02, method="rank")
    shifted = np.log(current) - math.log(0.98)
    for alternative, p_value in (("greater", result.p_pass), ("less", result.p_fail)):
        expected = scipy_stats.mannwhitneyu(
            shifted, np.log(baseline), alternative=alternative, method="exact"
        ).pvalue
        assert p_value == pytest.approx(expected)
    pairwise = np.log(current)[:, None] - np.log(baseline)[None, :]
    assert result.ratio == pytest.approx(math.exp(np.median(pairwise)))


def test_rank_cannot_reach_a_small_alpha_with_few_runs() -> None:
    # 3 vs 3: the smallest one-sided p is 1/C(6, 3) = 0.05, so alpha = 0.01 is out of reach.
    result = compare([80.0, 81.0, 82.0], [90.0, 91.0, 92.0], margin=0, alpha=0.01, method="rank")
    assert result.verdict is Verdict.INCONCLUSIVE
    assert (result.ci_low, result.ci_high) == (0.0, math.inf)
    assert any("smallest attainable one-sided p is 0.05" in w for w in result.warnings)
    assert compare([80.0, 81.0, 82.0], [90.0, 91.0, 92.0], margin=0, method="rank").verdict == (
        Verdict.FAIL
    )


def test_bootstrap_falls_back_to_welch_below_its_minimum_and_is_reproducible() -> None:
    rng = np.random.default_rng(9)
    small = lognormal_runs(rng, 1.0, (BOOTSTRAP_MIN_RUNS - 1,)).tolist()
    large = lognormal_runs(rng, 1.0, (BOOTSTRAP_MIN_RUNS,)).tolist()
    fallback = compare(small, large, margin=-0.02, method="bootstrap")
    assert fallback.method == "welch-log"
    welch = compare(small, large, margin=-0.02)
    assert dataclasses.replace(fallback, warnings=welch.warnings) == welch
    assert any("bootstrap needs 10 runs per side" in w for w in fallback.warnings)
    first = compare(large, [*large[::-1][:-1], 91.0], margin=-0.02, method="bootstrap")
    again = compare(large, [*large[::-1][:-1], 91.0], margin=-0.02, method="bootstrap")
    assert first.method == "bootstrap"
    assert first == again  # seed derived from the data


@pytest.mark.parametrize(
    ("method", "n_current", "n_baseline"),
    [("welch-log", 5, 10), ("bootstrap", 12, 15), ("rank", 6, 8)],
)
def test_one_sided_bounds_cover_the_true_ratio(
    method: str, n_current: int, n_baseline: int
) -> None:
    trials, alpha, true_ratio = 1000, 0.05, 0.97
    rng = np.random.default_rng(2024)
    current = lognormal_runs(rng, true_ratio, (trials, n_current))
    baseline = lognormal_runs(rng, 1.0, (trials, n_baseline))
    results = [
        compare(
            c.tolist(),
            b.tolist(),
            margin=-0.02,
            alpha=alpha,
            method=method,
            seed=i,
            n_resamples=1999,
        )
        for i, (c, b) in enumerate(zip(current, baseline, strict=True))
    ]
    assert {r.method for r in results} == {method}
    tolerance = binomial_tolerance(1 - alpha, trials)
    for covered in (
        np.mean([r.ci_low <= true_ratio for r in results]),
        np.mean([r.ci_high >= true_ratio for r in results]),
    ):
        assert covered >= 1 - alpha - tolerance
        if method != "rank":  # rank is conservative by its discreteness; the others are not
            assert covered <= 1 - alpha + tolerance
    # The verdict is the interval read against the threshold, and p agrees with it.
    for r in results:
        assert (r.verdict is Verdict.PASS) == (r.ci_low >= r.threshold)
        assert (r.verdict is Verdict.FAIL) == (r.ci_high < r.threshold)
        if method != "bootstrap":  # bootstrap p agrees only up to 1/(n_resamples + 1)
            assert (r.verdict is Verdict.PASS) == (r.p_pass <= alpha)
            assert (r.verdict is Verdict.FAIL) == (r.p_fail < alpha)


def test_the_methods_agree_on_large_samples() -> None:
    # 60 vs 60 runs: 3,600 pairs, so the rank interval uses the normal approximation of U.
    rng = np.random.default_rng(60)
    current, baseline = lognormal_runs(rng, 0.99, (60,)), lognormal_runs(rng, 1.0, (60,))
    results = [
        compare(current.tolist(), baseline.tolist(), margin=-0.02, method=method, seed=0)
        for method in ("welch-log", "bootstrap", "rank")
    ]
    for result in results:
        assert result.ci_low == pytest.approx(results[0].ci_low, abs=0.002)
        assert result.ci_high == pytest.approx(results[0].ci_high, abs=0.002)
        assert result.verdict is results[0].verdict


# --- sequential design -----------------------------------------------------------------------


def test_plan_looks_and_alphas() -> None:
    plan = SequentialPlan()
    assert plan.looks() == (5, 6, 7, 8, 9, 10)
    alphas = plan.look_alphas()
    assert alphas == tuple(plan.alpha_at(i) for i in range(6))
    assert list(alphas) == sorted(alphas)  # O'Brien-Fleming: strict early, lenient late
    assert alphas[0] == pytest.approx(0.00557, abs=1e-4)
    assert alphas[-1] == pytest.approx(0.0329, abs=1e-3)
    assert SequentialPlan(5, 10, step=2).looks() == (5, 7, 9, 10)
    assert SequentialPlan(8, 8).look_alphas() == pytest.approx((0.05,))
    assert SequentialPlan(5, 10, step=5).look_alphas()[1] > alphas[-1]  # fewer looks, less split
    with pytest.raises(StatsInputError, match="look_index=6"):
        plan.alpha_at(6)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial_runs": 1},
        {"initial_runs": 11},
        {"step": 0},
        {"alpha": 0.7},
        {"spending": "x"},
        {"n_baseline": 1},
    ],
)
def test_invalid_plans_are_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(StatsInputError):
        SequentialPlan(**kwargs)  # type: ignore[arg-type]


class _PeekingPlan(SequentialPlan):
    """Every look at the full alpha: what the plan exists to prevent."""

    def look_alphas(self) -> tuple[float, ...]:
        return (self.alpha,) * len(self.looks())


@pytest.mark.parametrize("spending", ["obrien-fleming", "pocock"])
@pytest.mark.parametrize("n_baseline", [5, 10, 30])
def test_sequential_false_fail_rate_at_the_boundary_stays_below_alpha(
    spending: str, n_baseline: int
) -> None:
    trials, margin = 20000, -0.02
    rng = np.random.default_rng(n_baseline)
    current = lognormal_runs(rng, 1 + margin, (trials, 10))
    baseline = lognormal_runs(rng, 1.0, (trials, n_baseline))
    plan = SequentialPlan(5, 10, spending=spending)
    verdicts, _ = sequential_verdicts(plan, current, baseline, margin=margin)
    tolerance = binomial_tolerance(plan.alpha, trials)
    assert np.mean(verdicts == "fail") <= plan.alpha + tolerance
    assert np.mean(verdicts == "pass") <= plan.alpha + tolerance
    peeking, _ = sequential_verdicts(_PeekingPlan(5, 10), current, baseline, margin=margin)
    assert np.mean(peeking == "fail") > 0.08  # naive re-testing inflates the error


def test_run_sequential_agrees_with_the_vectorised_simulation() -> None:
    trials, margin = 600, -0.02
    rng = np.random.default_rng(77)
    current = lognormal_runs(rng, 1 + margin, (trials, 10))
    baseline = lognormal_runs(rng, 1.0, (trials, 10))
    plan = SequentialPlan()
    verdicts, runs = sequential_verdicts(plan, current, baseline, margin=margin)
    outcomes = []
    for row, base in zip(current, baseline, strict=True):
        pending = iter(row.tolist())

        def draw(k: int, pending: Iterator[float] = pending) -> list[float]:
            return [next(pending) for _ in range(k)]

        result, used = run_sequential(plan, draw, base.tolist(), margin=margin)
        outcomes.append((result.verdict.value, used))
    assert outcomes == list(zip(verdicts.tolist(), runs.tolist(), strict=True))
    false_fail = np.mean(verdicts == "fail")
    assert false_fail <= plan.alpha + binomial_tolerance(plan.alpha, trials)


def test_sequential_verdicts_rejects_bad_arrays() -> None:
    plan = SequentialPlan()
    good = np.full((3, 10), 90.0)
    with pytest.raises(StatsInputError, match=r"current trial 2, run 5 has value 0\.0"):
        sequential_verdicts(
            plan, np.where(np.arange(30).reshape(3, 10) == 14, 0.0, good), good, margin=-0.02
        )
    with pytest.raises(StatsInputError, match=">= 10 current runs"):
        sequential_verdicts(plan, good[:, :8], good, margin=-0.02)
    with pytest.raises(StatsInputError, match="same number of trials"):
        sequential_verdicts(plan, good, good[:2], margin=-0.02)


def test_run_sequential_stops_at_the_first_decisive_look() -> None:
    drawn: list[int] = []

    def draw(k: int) -> list[float]:
        drawn.append(k)
        return [80.0 + i % 3 for i in range(k)]

    result, used = run_sequential(SequentialPlan(), draw, [90.0, 91.0, 89.0, 90.5], margin=-0.02)
    assert (result.verdict, used, drawn) == (Verdict.FAIL, 5, [5])
    assert result.alpha == SequentialPlan(n_baseline=4).alpha_at(0)  # calibrated for 4 runs


# --- minimum detectable effect and power ------------------------------------------------------


@pytest.mark.parametrize(
    ("cv", "effect", "runs"), [(0.03, 0.05, 6), (0.02, 0.02, 14), (0.05, 0.05, 14)]
)
def test_required_runs_matches_the_noncentral_t_table(cv: float, effect: float, runs: int) -> None:
    # Per-side n for a one-sided t test, alpha 0.05, power 0.8 (anchors.md section 7).
    assert required_runs(cv, effect, 0.05) == runs
    assert min_detectable_effect(runs, runs, cv, 0.05) <= effect
    assert min_detectable_effect(runs - 1, runs - 1, cv, 0.05) > effect


def test_required_runs_refuses_an_effect_a_small_baseline_cannot_resolve() -> None:
    assert required_runs(0.03, 0.03, 0.05, n_baseline=30) == 10
    with pytest.raises(StatsInputError, match="baseline of 5 runs"):
        required_runs(0.03, 0.02, 0.05, n_baseline=5)
    assert required_runs(0.0, 0.01, 0.05) == 2


@pytest.mark.parametrize(("n_current", "n_baseline"), [(10, 20), (6, 6)])
def test_power_at_an_injected_slowdown_is_what_the_mde_promises(
    n_current: int, n_baseline: int
) -> None:
    trials, alpha, slowdown = 8000, 0.05, 0.95
    mde = min_detectable_effect(n_current, n_baseline, CV, alpha)
    # Put the threshold exactly one MDE above the slowed-down truth: FAIL with power 0.8.
    margin = slowdown * (1 + mde) - 1
    rng = np.random.default_rng(n_current)
    current = lognormal_runs(rng, slowdown, (trials, n_current))
    baseline = lognormal_runs(rng, 1.0, (trials, n_baseline))
    single_look = SequentialPlan(n_current, n_current, alpha=alpha)
    verdicts, _ = sequential_verdicts(single_look, current, baseline, margin=margin)
    assert np.mean(verdicts == "fail") == pytest.approx(0.8, abs=binomial_tolerance(0.8, trials))
    # ... and symmetrically for PASS one MDE above the threshold.
    margin = slowdown / (1 + mde) - 1
    verdicts, _ = sequential_verdicts(single_look, current, baseline, margin=margin)
    assert np.mean(verdicts == "pass") == pytest.approx(0.8, abs=binomial_tolerance(0.8, trials))


def test_mde_shrinks_with_runs_and_a_known_baseline() -> None:
    mdes = [min_detectable_effect(n, 10, CV, 0.05) for n in (3, 5, 10, 20)]
    assert mdes == sorted(mdes, reverse=True)
    assert min_detectable_effect(10, math.inf, CV, 0.05) < min_detectable_effect(10, 10, CV, 0.05)
    assert min_detectable_effect(5, 5, 0.0, 0.05) == 0.0
    with pytest.raises(StatsInputError, match="n_current=1"):
        min_detectable_effect(1, 10, CV, 0.05)


# --- the message ----------------------------------------------------------------------------


def _noisy_comparison(margin: float = -0.02, alpha: float = 0.0056) -> Comparison:
    rng = np.random.default_rng(1)
    current, baseline = lognormal_runs(rng, 0.98, (5,)), lognormal_runs(rng, 1.0, (10,))
    return compare(current.tolist(), baseline.tolist(), margin=margin, alpha=alpha)


def test_describe_names_everything_a_reader_needs() -> None:
    result = _noisy_comparison()
    text = result.describe()
    for fragment in (
        "n=5 current",
        "n=10 baseline",
        f"CV {result.current.cv:.1%}",
        f"CI [{result.ci_low:.4f}, {result.ci_high:.4f}]",
        "99.4%",
        f"p(pass)={result.p_pass:.3g}",
        f"p(fail)={result.p_fail:.3g}",
        f"MDE {result.mde:.1%}",
        "margin -2.0%",
        "verdict INCONCLUSIVE",
    ):
        assert fragment in text


def test_a_large_mde_is_warned_about_with_the_runs_that_would_suffice() -> None:
    result = _noisy_comparison(margin=-0.02, alpha=0.05)
    assert result.mde is not None
    assert result.mde > 0.02
    (warning,) = [w for w in result.warnings if w.startswith("MDE")]
    assert f"MDE {result.mde:.1%} is larger than the margin 2.0%" in warning
    needed = int(warning.split("about ")[1].split()[0])
    mde = result.mde
    # The pooled CV is the one that reproduces this MDE at 5 vs 10 runs.
    cv = optimize.brentq(lambda c: min_detectable_effect(5, 10, c, 0.05) - mde, 1e-4, 0.5)
    assert needed == required_runs(cv, 0.02, 0.05, n_baseline=10)
    assert "current runs would (with this baseline of 10 runs)" in warning
    assert warning in result.describe()
    # At alpha 0.0056 even unlimited current runs cannot beat the 10 baseline runs' own noise.
    strict = _noisy_comparison(margin=-0.02, alpha=0.0056)
    assert any(
        "no number of current runs would against 10 baseline runs" in w for w in strict.warnings
    )
    quiet = compare([90.0, 90.1, 89.9, 90.05, 89.95], [90.0, 90.1, 89.9], margin=-0.05)
    assert not any(w.startswith("MDE") for w in quiet.warnings)
