"""The two-level model: runs nested in server launches (pytest_specdecode.stats.two_level), and what
it
does to a comparison (stats.compare with launch_runs, a history prior, the no-change guard)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pytest_specdecode.settings import OPTIONS_BY_NAME
from pytest_specdecode.stats.comparison import Verdict, compare
from pytest_specdecode.stats.night_series import launch_prior
from pytest_specdecode.stats.two_level import (
    HISTORY_GUARD_FACTOR,
    HISTORY_GUARD_NIGHTS,
    STRICT_GUARD_DF,
    STRICT_GUARD_FACTOR,
    LaunchPrior,
    bridged,
    guard_alpha,
    prior_for,
    prior_from_history,
    prior_too_loud,
    stated_prior,
    two_level,
)

RNG_SEED = 20261201
DEFAULT_ALPHA = float(OPTIONS_BY_NAME["alpha"].default)  # type: ignore[arg-type]
DEFAULT_GUARD = float(OPTIONS_BY_NAME["alpha_no_change"].default)  # type: ignore[arg-type]


def launches(
    rng: np.random.Generator, k: int, runs: int, *, launch_cv: float, run_cv: float, level=100.0
) -> list[float]:
    """k launches of ``runs`` runs each, lognormal at both levels, in launch order."""
    sl, sw = math.sqrt(math.log1p(launch_cv**2)), math.sqrt(math.log1p(run_cv**2))
    values: list[float] = []
    for _ in range(k):
        offset = rng.normal(0.0, sl)
        values.extend(level * np.exp(offset + rng.normal(0.0, sw, runs)))
    return values


def test_one_baseline_launch_without_history_is_the_run_level_interval_with_a_warning() -> None:
    rng = np.random.default_rng(RNG_SEED)
    current, baseline = (
        launches(rng, 1, 10, launch_cv=0, run_cv=0.03),
        launches(rng, 1, 40, launch_cv=0, run_cv=0.03),
    )
    plain = compare(current, baseline, margin=-0.02, alpha=0.15)
    warned = compare(
        current, baseline, margin=-0.02, alpha=0.15, launch_runs=[40], warn_single_launch=True
    )
    assert warned.method == plain.method == "welch-log"
    assert (warned.ci_low, warned.ci_high) == (plain.ci_low, plain.ci_high)
    assert warned.launch_cv is None
    assert any("recorded in one server launch" in w for w in warned.warnings)
    assert not any("one server launch" in w for w in plain.warnings)


def test_launch_to_launch_variance_widens_the_interval_and_is_named() -> None:
    rng = np.random.default_rng(RNG_SEED)
    baseline = launches(rng, 3, 13, launch_cv=0.05, run_cv=0.02)
    current = launches(rng, 1, 10, launch_cv=0.05, run_cv=0.02)
    flat = compare(current, baseline, margin=-0.02, alpha=0.15)
    nested = compare(current, baseline, margin=-0.02, alpha=0.15, launch_runs=[13, 13, 13])
    assert nested.method == "two-level"
    assert nested.launches == 3
    assert nested.launch_cv is not None
    assert nested.launch_cv > 0.01
    width = math.log(nested.ci_high / nested.ci_low)
    assert width > 2 * math.log(flat.ci_high / flat.ci_low)
    assert nested.df is not None
    assert nested.df < 10  # the launch term has 2 df


def test_the_two_level_estimate_weighs_each_launch_the_same() -> None:
    log_base = np.log(np.array([100.0] * 2 + [120.0] * 20))  # 2 runs of one launch, 20 of another
    result = two_level(np.log(np.array([110.0, 110.0])), log_base, [2, 20])
    assert result.launches == 2
    level = (math.log(100.0) + math.log(120.0)) / 2
    assert result.estimate == pytest.approx(math.log(110.0) - level)


@pytest.mark.parametrize(
    ("launch_cv", "run_cv", "limit"),
    [(0.05, 0.02, 0.01), (0.03, 0.02, 0.015), (0.0, 0.03, 0.01)],
    ids=["launch-cv-5", "launch-cv-3", "launch-cv-0"],
)
def test_an_unchanged_build_relaunched_fails_at_most_1_percent(
    launch_cv: float, run_cv: float, limit: float
) -> None:
    # The H200's situation (launch CV 5%, run CV 2%) with the default policy (alpha at the
    # margin, the no-change guard), a baseline of 3 launches, one current launch. At
    # launch CV 3% the rate sits near 1% (benchmarks/bench_verdict.py measures it on 20,000
    # trials); 1,500 trials have a Monte Carlo error of about 0.25%, hence its looser limit.
    rng = np.random.default_rng(RNG_SEED)
    trials, fails = 1500, 0
    for _ in range(trials):
        baseline = launches(rng, 3, 13, launch_cv=launch_cv, run_cv=run_cv)
        current = launches(rng, 1, 10, launch_cv=launch_cv, run_cv=run_cv)
        verdict = compare(
            current,
            baseline,
            margin=-0.02,
            alpha=DEFAULT_ALPHA,
            launch_runs=[13, 13, 13],
            alpha_no_change=DEFAULT_GUARD,
        ).verdict
        fails += verdict is Verdict.FAIL
    assert fails / trials <= limit


def test_ignoring_the_launches_fails_an_unchanged_build_often() -> None:
    # Why the model exists: 3 launches of 13 runs compared as 39 independent runs.
    rng = np.random.default_rng(RNG_SEED)
    trials, fails = 600, 0
    for _ in range(trials):
        baseline = launches(rng, 3, 13, launch_cv=0.05, run_cv=0.02)
        current = launches(rng, 1, 10, launch_cv=0.05, run_cv=0.02)
        fails += compare(current, baseline, margin=-0.02, alpha=0.15).verdict is Verdict.FAIL
    assert fails / trials > 0.15


def test_the_no_change_guard_needs_a_fail_to_be_worse_than_the_baseline_itself() -> None:
    # Five noisy runs about 5% down: worse than "at most 2% worse" at 85%, but 1.0 is still
    # inside the 99.25% bound, so not clearly worse than the baseline itself.
    baseline = [100.0, 100.5, 99.5, 100.2, 99.8] * 8
    current = [92.0, 99.0, 96.0, 90.0, 98.0]
    without = compare(current, baseline, margin=-0.02, alpha=0.15)
    guarded = compare(current, baseline, margin=-0.02, alpha=0.15, alpha_no_change=0.0075)
    assert without.verdict is Verdict.FAIL
    assert guarded.verdict is Verdict.INCONCLUSIVE
    assert any("not distinguishable from no change at 99.2%" in w for w in guarded.warnings)
    # a clear regression still fails
    clear = [v * 0.85 for v in current]
    assert (
        compare(clear, baseline, margin=-0.02, alpha=0.15, alpha_no_change=0.0075).verdict
        is Verdict.FAIL
    )
    # and a claim to beat the baseline is not guarded: no change fails "+5%"
    assert (
        compare(
            [v * 1.035 for v in current], baseline, margin=0.05, alpha_no_change=0.0075
        ).alpha_no_change
        is None
    )


def test_history_from_successive_nights_is_not_fooled_by_a_slow_drift() -> None:
    rng = np.random.default_rng(RNG_SEED)
    nights = 30
    noise = rng.normal(0.0, 0.05, nights)  # launch CV about 5%
    drift = np.linspace(0.0, 0.3, nights)  # the build got 35% faster over the month
    prior = prior_from_history(list(noise + drift), [10.0] * nights)
    assert prior is not None
    assert prior.nights == nights
    spread = float(np.var(noise + drift, ddof=1))
    assert prior.variance < spread / 2  # the plain spread would count the drift
    assert prior.variance == pytest.approx(0.05**2, rel=0.6)
    assert prior_from_history([0.1, 0.2], [10.0, 10.0]) is None  # too few nights


def test_a_prior_from_history_gives_a_launch_term_to_a_one_launch_baseline() -> None:
    rng = np.random.default_rng(RNG_SEED)
    baseline = launches(rng, 1, 40, launch_cv=0, run_cv=0.02)
    current = launches(rng, 1, 10, launch_cv=0, run_cv=0.02)
    prior = LaunchPrior(variance=0.05**2, df=20.0, nights=30, runs=10.0)
    result = compare(current, baseline, margin=-0.02, alpha=0.15, launch_runs=[40], prior=prior)
    assert result.method == "two-level"
    assert result.launch_cv == pytest.approx(0.05, rel=0.1)
    assert result.df is not None
    assert result.df == pytest.approx(20, rel=0.3)


def _night(test_id: str, mean: float, **changes: object) -> dict[str, object]:
    test = {
        "test_id": test_id,
        "hardware_key": "8xH200",
        "fingerprint": "abc",
        "workload_hash": "w1",
        "outcome": "pass",
        "metrics": {"tok_s": {"n": 10, "mean": mean, "cv": 0.02}},
    }
    test.update(changes)
    return {"tests": [test]}


def test_prior_for_uses_only_nights_of_the_same_test_hardware_configuration_and_workload() -> None:
    history = [_night("t", 100.0 + i % 3) for i in range(6)]
    history += [
        _night("other", 50.0),
        _night("t", 10.0, fingerprint="changed"),
        _night("t", 10.0, workload_hash="w2"),
        _night("t", 10.0, hardware_key="1xH200"),
        _night("t", 10.0, outcome="recorded"),  # a baseline recording, not a night's launch
        {"tests": [{"test_id": "t", "outcome": "error"}]},  # a crashed night: nothing measured
    ]
    prior = prior_for(
        history, test_id="t", hardware_key="8xH200", fingerprint="abc", workload_hash="w1",
        metric="tok_s",
    )  # fmt: skip
    assert prior is not None
    assert prior.nights == 6
    assert prior.variance < 0.001  # the 10.0 nights were all left out


def test_the_noise_guard_judges_each_launch_on_its_own() -> None:
    # An H200's situation: launches 12-28% apart, each with a low run-to-run CV. That spread is
    # what the two-level verdict models, not noise to refuse; a noisy launch still is refused.
    from pytest_specdecode.baselines.store import noise_problem

    rng = np.random.default_rng(RNG_SEED)
    steady = [
        level * (1 + 0.02 * rng.standard_normal()) for level in (100, 125, 90) for _ in "abcde"
    ]
    assert noise_problem({"tok_s": steady}, 0.08) is not None  # pooled: the launches' spread
    assert noise_problem({"tok_s": steady}, 0.08, launch_runs=(5, 5, 5)) is None
    noisy = steady[:5] + [125 * (1 + 0.3 * rng.standard_normal()) for _ in "abcde"] + steady[10:]
    problem = noise_problem({"tok_s": noisy}, 0.08, launch_runs=(5, 5, 5))
    assert problem is not None
    assert "over 5 runs in launch 2 of 3" in problem


def test_two_noisy_launches_against_a_steady_current_launch_is_a_verdict_not_a_crash() -> None:
    # What real SGLang gave on an H200 (tiny models, CUDA graphs off): a baseline of 2 launches
    # of 8 runs at run CV 13-20%, against 5 current runs at CV 1.5%. The launch variance's
    # Satterthwaite df fell to 0.23 and the MDE overflowed (OverflowError: math range error);
    # the df is at least 1, and an MDE too large to compute is infinite ("unbounded").
    rng = np.random.default_rng(7)
    baseline = [249.2 * math.exp(0.13 * z) for z in rng.standard_normal(8)]
    baseline += [228.2 * math.exp(0.19 * z) for z in rng.standard_normal(8)]
    current = [298.0 * math.exp(0.015 * z) for z in rng.standard_normal(5)]
    for alpha in (0.0386, 0.15):
        result = compare(
            current, baseline, margin=-0.5, alpha=alpha, launch_runs=[8, 8],
            alpha_no_change=DEFAULT_GUARD,
        )  # fmt: skip
        assert result.df is not None
        assert result.df >= 1.0
        assert result.mde is not None
        assert result.mde > 0
        assert result.verdict in (Verdict.PASS, Verdict.INCONCLUSIVE)


# --------------------------------------------------------------------------- the first night


def _first_night_fail_rate(
    change: float, launch_cv: float, trials: int, prior: LaunchPrior | None, seed: int
) -> float:
    """P(FAIL) of one nightly launch (10 runs, one look at the last look's alpha and guard)
    against 3 baseline launches of 60 runs, at run CV 4 % (the seed's), no history."""
    from pytest_specdecode.stats.sequential import SequentialPlan

    plan = SequentialPlan(5, 10, alpha=DEFAULT_ALPHA).for_baseline(180)
    look = plan.alpha_at(len(plan.looks()) - 1)
    rng = np.random.default_rng(seed)
    fails = 0
    for _ in range(trials):
        baseline = launches(rng, 3, 60, launch_cv=launch_cv, run_cv=0.04)
        current = np.array(launches(rng, 1, 10, launch_cv=launch_cv, run_cv=0.04)) * (1 + change)
        result = compare(
            list(current), baseline, margin=-0.02, alpha=look, launch_runs=[60, 60, 60],
            prior=prior, alpha_no_change=DEFAULT_GUARD * look / DEFAULT_ALPHA,
        )  # fmt: skip
        fails += result.verdict is Verdict.FAIL
    return fails / trials


def test_the_stated_prior_lets_the_seeds_29_percent_regression_fail_on_the_first_night() -> None:
    # Without it 3 launches give the guard 2 df (t about 8.6): about a third of first nights.
    without = _first_night_fail_rate(-0.29, 0.05, 150, None, RNG_SEED)
    with_prior = _first_night_fail_rate(-0.29, 0.05, 150, stated_prior(), RNG_SEED)
    assert without < 0.6
    assert with_prior >= 0.93  # 96.5 % over 400 trials (docs/statistics.md)


def test_the_stated_prior_keeps_an_unchanged_builds_first_night_fails_under_1_percent() -> None:
    assert _first_night_fail_rate(0.0, 0.05, 400, stated_prior(), RNG_SEED + 1) <= 0.01


def test_the_stated_prior_is_named_in_the_verdict_and_dropped_when_the_launches_disagree() -> None:
    rng = np.random.default_rng(RNG_SEED)
    current = launches(rng, 1, 10, launch_cv=0, run_cv=0.03)
    steady = launches(rng, 3, 20, launch_cv=0.0, run_cv=0.03)
    used = compare(current, steady, margin=-0.02, alpha=0.15, launch_runs=[20] * 3,
                   prior=stated_prior(where="test"))  # fmt: skip
    assert any("stated prior of launch CV 6.0% with 6 pseudo-df (test)" in w for w in used.warnings)
    assert used.df is not None
    assert used.df > 4  # 2 df of the launches and 6 of the prior
    # launch means 100, 130, 75: far more than 6 % allows
    wild = [v * f for f, v in zip([1.0] * 20 + [1.3] * 20 + [0.75] * 20, steady, strict=True)]
    dropped = compare(current, wild, margin=-0.02, alpha=0.15, launch_runs=[20] * 3,
                      prior=stated_prior())  # fmt: skip
    assert any("was not used" in w for w in dropped.warnings)
    assert dropped.df is not None
    assert dropped.df <= 2.0 + 1e-9


def test_the_stated_prior_bridges_the_first_ten_nights_of_history() -> None:
    stated = stated_prior(where="test")
    assert bridged(None, stated) is stated
    short = LaunchPrior(variance=0.0026, df=1.3, nights=3, runs=10.0)
    pooled = bridged(short, stated)
    assert pooled.stated_prior is stated  # pooled, not replaced
    assert not pooled.stated  # the history's nights count for the guard
    long = LaunchPrior(variance=0.0026, df=6.0, nights=HISTORY_GUARD_NIGHTS, runs=10.0)
    assert bridged(long, stated) is long


def test_the_seeds_29_percent_fails_on_the_fourth_night_after_a_first_baseline() -> None:
    """The fourth night after a box's first baseline, three nights of history: the stated
    prior is pooled with them, so the guard's bound of a measured 0.67 is nowhere near the
    "upper bound 1.529" it had when three nights replaced the prior (issue 44)."""
    rng = np.random.default_rng(RNG_SEED + 7)
    baseline = launches(rng, 3, 60, launch_cv=0.05, run_cv=0.03)
    nights = [float(np.mean(launches(rng, 1, 10, launch_cv=0.05, run_cv=0.03)))
              for _ in range(3)]  # fmt: skip
    history = prior_from_history([math.log(v) for v in nights], [10.0] * 3)
    assert history is not None
    assert history.df < 2  # what three nights alone give
    current = [v * 0.669 / np.mean(baseline) * 100 for v in
               launches(rng, 1, 10, launch_cv=0.0, run_cv=0.03)]  # fmt: skip
    alone = compare(current, baseline, margin=-0.02, alpha=0.0386, launch_runs=[60] * 3,
                    prior=history, alpha_no_change=0.0066)  # fmt: skip
    pooled = compare(current, baseline, margin=-0.02, alpha=0.0386, launch_runs=[60] * 3,
                     prior=bridged(history, stated_prior(where="test")),
                     alpha_no_change=0.0066)  # fmt: skip
    assert alone.df is not None
    assert pooled.df is not None
    assert pooled.df > alone.df + 5
    assert pooled.verdict is Verdict.FAIL
    assert any("3 nights of history is pooled with a stated prior" in w for w in pooled.warnings)


def quiet_first_nights(seed: int, *, launch_cv: float, run_cv: float, nights: int, drop: float):
    """A box's first baseline (3 launches x 60 runs at 100), then ``nights`` nights of one
    launch x 10 runs ``drop`` slower from the first night on, and tonight's launch."""
    rng = np.random.default_rng(seed)
    baseline = launches(rng, 3, 60, launch_cv=launch_cv, run_cv=run_cv)
    level = 100.0 * (1 + drop)
    means = [float(np.mean(launches(rng, 1, 10, launch_cv=launch_cv, run_cv=run_cv, level=level)))
             for _ in range(nights)]  # fmt: skip
    history = prior_from_history([math.log(v) for v in means], [10.0] * nights)
    current = launches(rng, 1, 10, launch_cv=launch_cv, run_cv=run_cv, level=level)
    return baseline, history, current


def test_a_quiet_box_is_judged_by_its_own_launch_variance_from_its_first_nights() -> None:
    """An H200's no-speculation noise (launch CV 0.8 %, run CV 0.6 %), a 10 % drop from the
    first night after the box's first baseline: pooled with the stated 6 % the fifth night was
    not a FAIL (the prior kept it blind until the history had ten nights); the baseline's
    launches and five nights refute the 6 %, and the box's own figure FAILs it."""
    stated = stated_prior(where="test")
    fails = 0
    for seed in range(20):
        baseline, history, current = quiet_first_nights(
            RNG_SEED + 100 + seed, launch_cv=0.008, run_cv=0.006, nights=5, drop=-0.10
        )
        assert history is not None
        assert history.nights == 5
        verdict = compare(current, baseline, margin=-0.02, alpha=0.0386, launch_runs=[60] * 3,
                          prior=bridged(history, stated), alpha_no_change=0.0066)  # fmt: skip
        if verdict.verdict is Verdict.FAIL:
            fails += 1
            assert any(
                "a stated prior of launch CV 6.0%" in w
                and "vary far less than it allows" in w
                and "this box's own launch variance decides" in w
                for w in verdict.warnings
            ), verdict.warnings
        else:  # the F test kept the prior: then it says it pooled
            assert any("5 nights of history is pooled with" in w for w in verdict.warnings)
    assert fails >= 16  # 86 % of such draws drop the prior at five nights (its docstring)


def test_the_stated_prior_stays_on_a_box_at_its_own_noise() -> None:
    """Launch CV 5 % (under the stated 6 %): the same five nights pool the prior, as before."""
    stated = stated_prior(where="test")
    for seed in range(20):
        baseline, history, _ = quiet_first_nights(
            RNG_SEED + 200 + seed, launch_cv=0.05, run_cv=0.03, nights=5, drop=0.0
        )
        assert history is not None
        spread = float(np.var(np.log(baseline).reshape(3, 60).mean(axis=1), ddof=1))
        assert not prior_too_loud(stated, spread, 3, history)


def test_a_stated_prior_is_never_dropped_as_too_loud_on_the_baseline_alone() -> None:
    """Three launch means alone lie close together by chance too often: without at least
    three nights of history the prior stays, however quiet the launches look."""
    stated = stated_prior(where="test")
    assert not prior_too_loud(stated, 1e-12, 3, None)
    two_nights = LaunchPrior(variance=1e-12, df=0.7, nights=2, runs=10.0)
    assert not prior_too_loud(stated, 1e-12, 3, two_nights)
    three_nights = LaunchPrior(variance=1e-8, df=1.3, nights=3, runs=10.0)
    assert prior_too_loud(stated, 1e-8, 3, three_nights)
    assert not prior_too_loud(three_nights, 1e-8, 3, three_nights)  # a history prior: never


def test_stated_prior_rejects_nonsense_and_has_no_run_noise_to_subtract() -> None:
    with pytest.raises(ValueError):
        stated_prior(0.0)
    with pytest.raises(ValueError):
        stated_prior(0.05, 0.0)
    prior = stated_prior(0.05, 6)
    assert prior.stated
    assert prior.launch_variance(0.01) == pytest.approx(math.log1p(0.05**2))


def test_the_guard_tightens_only_with_enough_nights_of_measured_history() -> None:
    history = LaunchPrior(variance=0.0025, df=20.0, nights=30, runs=10.0)
    short = LaunchPrior(variance=0.0025, df=4.0, nights=HISTORY_GUARD_NIGHTS - 1, runs=10.0)
    assert guard_alpha(0.01, history) == pytest.approx(0.01 * HISTORY_GUARD_FACTOR)
    assert guard_alpha(0.01, short) == 0.01
    assert guard_alpha(0.01, stated_prior()) == 0.01
    assert guard_alpha(0.01, None) == 0.01


def test_the_guard_is_stricter_still_once_the_history_has_the_df_of_a_carried_noise() -> None:
    carried = LaunchPrior(variance=0.0025, df=STRICT_GUARD_DF, nights=33, runs=8.0, regimes=1)
    thin = LaunchPrior(variance=0.0025, df=STRICT_GUARD_DF - 0.5, nights=33, runs=8.0)
    assert guard_alpha(0.01, carried) == pytest.approx(0.01 * STRICT_GUARD_FACTOR)
    assert guard_alpha(0.01, thin) == pytest.approx(0.01 * HISTORY_GUARD_FACTOR)
    few_nights = LaunchPrior(variance=0.0025, df=40.0, nights=HISTORY_GUARD_NIGHTS - 1, runs=8.0)
    assert guard_alpha(0.01, few_nights) == 0.01  # the first nights keep the whole guard
    # von Neumann over the most recent 30 nights (a box's first regime) never reaches it
    assert prior_from_history([0.01 * (i % 3) for i in range(60)], [8.0] * 60).df < STRICT_GUARD_DF


def _recorded(launch_means: list[float], runs: int = 60) -> dict[str, object]:
    test = _night("t", float(np.mean(launch_means)), outcome="recorded")["tests"][0]  # type: ignore[index]
    test["samples"] = {"tok_s": [m for m in launch_means for _ in range(runs)]}
    test["launch_runs"] = [runs] * len(launch_means)
    return {"tests": [test]}


def _regimes(seed: int, *, earlier: int, since: int, step: float) -> list[dict[str, object]]:
    """A first baseline and ``earlier`` nights at launch CV 5 %, then a baseline recorded
    ``step`` higher (an accepted upgrade) and ``since`` nights after it."""
    rng = np.random.default_rng(seed)

    def level(base: float, count: int) -> list[float]:
        return list(base * np.exp(rng.normal(0.0, 0.05, count)))

    history = [_recorded(level(100.0, 3))] + [_night("t", v) for v in level(100.0, earlier)]
    upgraded = 100.0 * (1 + step)
    history.append(_recorded(level(upgraded, 3)))
    return history + [_night("t", v) for v in level(upgraded, since)]


KEY = {"test_id": "t", "hardware_key": "8xH200", "fingerprint": "abc", "workload_hash": "w1",
       "metric": "tok_s"}  # fmt: skip


def test_the_gate_carries_the_noise_of_earlier_regimes_as_the_detector_does() -> None:
    """After a reset, the gate's launch variance is the earlier regime's points about their own
    mean (32 df from 3 launches and 30 nights), not von Neumann's 19 df over the last 30 nights,
    which straddle the reset's step and take it in as one of their differences."""
    history = _regimes(RNG_SEED, earlier=30, since=2, step=0.20)
    carried = launch_prior(history, **KEY)
    assert carried is not None
    assert (carried.df, carried.regimes, carried.nights) == (32.0, 1, 32)
    assert math.sqrt(carried.variance) == pytest.approx(0.05, rel=0.25)
    straddling = prior_for(history, **KEY)
    assert straddling is not None
    assert straddling.df < 20
    # the same nights without the step: the carried noise does not see it, von Neumann does
    no_step = _regimes(RNG_SEED, earlier=30, since=2, step=0.0)
    assert launch_prior(no_step, **KEY) == carried
    assert prior_for(no_step, **KEY) != straddling
    assert guard_alpha(0.01, carried) == pytest.approx(0.01 * STRICT_GUARD_FACTOR)
    # the nights since the reset add their own von Neumann df once there are three
    later = launch_prior(_regimes(RNG_SEED, earlier=30, since=12, step=0.20), **KEY)
    assert later is not None
    assert later.df == pytest.approx(32.0 + 2.0 * 11 / 3)


def test_a_first_regime_has_nothing_to_carry_and_keeps_the_von_neumann_prior() -> None:
    history = [_recorded([100.0, 103.0, 98.0])] + [_night("t", 100.0 + i % 3) for i in range(12)]
    assert launch_prior(history, **KEY) == prior_for(history, **KEY)
    short_earlier = _regimes(RNG_SEED, earlier=5, since=6, step=0.0)  # 8 points: not a regime
    assert launch_prior(short_earlier, **KEY) == prior_for(short_earlier, **KEY)


def test_the_stricter_guard_keeps_the_seeds_29_percent_and_fails_no_unchanged_night() -> None:
    """30 earlier nights, then a 3-launch baseline at launch CV 5 %: with the carried noise and
    the stricter guard the seed's -29 % still FAILs the night it lands, and an unchanged night
    FAILs less often than with von Neumann's prior and the tenfold guard."""
    rng = np.random.default_rng(RNG_SEED + 11)
    fails = {"-29%": [0, 0], "unchanged": [0, 0]}
    for trial in range(120):
        history = _regimes(RNG_SEED + 100 + trial, earlier=30, since=0, step=0.04)
        baseline = launches(rng, 3, 60, launch_cv=0.05, run_cv=0.03, level=104.0)
        for name, factor in (("-29%", 0.71), ("unchanged", 1.0)):
            current = launches(rng, 1, 10, launch_cv=0.05, run_cv=0.03, level=104.0 * factor)
            carried, before = launch_prior(history, **KEY), prior_for(history, **KEY)
            for index, prior in enumerate((carried, before)):
                result = compare(current, baseline, margin=-0.02, alpha=DEFAULT_ALPHA,
                                 launch_runs=[60] * 3, prior=prior,
                                 alpha_no_change=guard_alpha(DEFAULT_GUARD, prior))  # fmt: skip
                fails[name][index] += result.verdict is Verdict.FAIL
    assert fails["-29%"][0] >= 0.92 * 120
    assert fails["-29%"][0] >= fails["-29%"][1] - 3
    assert fails["unchanged"][0] <= 1
