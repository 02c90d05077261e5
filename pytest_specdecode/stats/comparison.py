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

**Methods.** ``welch-log`` (default), ``bootstrap`` and ``rank``; ``exact`` is used automatically
when both sides have at least 2 runs and no variation at all, and the two-level t interval when the
baseline spans launches or a history prior is given (any method: the others have no launch level).
``bootstrap`` needs :data:`BOOTSTRAP_MIN_RUNS` runs per side and ``rank`` variation on both sides;
short of that, ``welch-log`` answers, with a warning. How each method computes its interval, and
why, is in :mod:`pytest_specdecode.stats.intervals`; this module chooses the method and draws the
verdict.

**Degenerate samples.** One constant side (with the other varying) needs no special case: Welch's
standard error and degrees of freedom reduce to the one-sample t on the varying side, and a note
says so. A side with a single run carries no information on run-to-run variance, so no interval can
be formed: the verdict is INCONCLUSIVE with bounds (0, inf), p = 1 and a warning, never a crash.
Values must be finite and > 0 (every metric here is a rate or a duration): anything else raises
:class:`~pytest_specdecode.stats.samples.StatsInputError` naming the side, the run and the value.

**Minimum detectable effect.** Every comparison reports the MDE of its design, and an undecided
one whose MDE exceeds its margin says so with the number of runs that would decide it:
:mod:`pytest_specdecode.stats.power_analysis`.

Repeated looks at a growing sample (the adaptive extra runs) are in
:mod:`pytest_specdecode.stats.sequential`.
"""

from __future__ import annotations

import enum
import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

from pytest_specdecode.stats.intervals import (
    TIE_TOLERANCE,
    LogInterval,
    bootstrap_interval,
    exact_interval,
    no_variance_interval,
    rank_interval,
    t_interval,
    welch_log_interval,
    with_note,
)
from pytest_specdecode.stats.power_analysis import (
    mde_design,
    mde_warning,
    min_detectable_effect,
    two_level_mde,
)
from pytest_specdecode.stats.samples import (
    SampleSummary,
    StatsInputError,
    check_alpha,
    check_margin,
    is_constant,
    positive_values,
    summarize,
)
from pytest_specdecode.stats.two_level import LaunchPrior, TwoLevelInterval, two_level

__all__ = [
    "BOOTSTRAP_MIN_RUNS",
    "DEFAULT_RESAMPLES",
    "METHODS",
    "Comparison",
    "Verdict",
    "compare",
    "confidence_text",
    "mde_text",
    "p_values_text",
    "verdict_codes",
]

METHODS = ("welch-log", "bootstrap", "rank")
BOOTSTRAP_MIN_RUNS = 10
DEFAULT_RESAMPLES = 9999


class Verdict(str, enum.Enum):
    """Outcome of one comparison against a margin."""

    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"

    def __str__(self) -> str:
        return self.value


_CODE_TO_VERDICT = {1: Verdict.PASS, -1: Verdict.FAIL, 0: Verdict.INCONCLUSIVE}


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
    # The no-change guard's upper bound, where it held back a FAIL (the interval cleared the
    # margin, not "no change"): what a one-line summary of the check must still say.
    no_change_high: float | None = None
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


@lru_cache(maxsize=16)
def _baseline_summary(values: tuple[float, ...]) -> SampleSummary:
    """The stored baseline's summary: the same at every look of every check of a test (and a
    frozen value), so computed once."""
    return summarize(values)


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
    :class:`~pytest_specdecode.stats.sequential.SequentialPlan`); ``seed`` and ``n_resamples`` only
    matter for ``method="bootstrap"``.

    ``launch_runs`` (runs per baseline launch) and ``prior`` (the launch variance from earlier
    nights) switch to the two-level model of :mod:`pytest_specdecode.stats.two_level`: the current
    runs are one launch, and launch-to-launch variance is in the interval. ``alpha_no_change``
    (for a negative margin) is the no-change guard: a FAIL also needs the current build to be
    worse than the baseline itself at that level, so an unchanged build fails at most that
    often, however close the margin sits to 1 against the noise. ``warn_single_launch`` adds a
    warning when the interval cannot carry the launch variance (one baseline launch, no prior).
    """
    cur, base = _checked_samples(current, baseline, margin, alpha, alpha_no_change, method)
    check = _Check.of(
        cur,
        base,
        higher_is_better=higher_is_better,
        margin=margin,
        method=method,
        seed=seed,
        n_resamples=n_resamples,
        launch_runs=launch_runs,
        prior=prior,
    )
    interval = check.interval_at(alpha)
    code = int(verdict_codes(np.asarray(interval.low), np.asarray(interval.high), check.threshold))
    warnings = [*interval.notes, *_launch_notes(check, warn_single_launch)]
    code, no_change_high, held_back = _no_change_guard(check, code, alpha, alpha_no_change)
    warnings.extend(held_back)
    mde, undecidable = _mde_and_note(check, code, alpha)
    warnings.extend(undecidable)
    return _comparison(
        check,
        interval,
        code,
        alpha=alpha,
        alpha_no_change=alpha_no_change,
        no_change_high=no_change_high,
        mde=mde,
        warnings=warnings,
    )


def _checked_samples(
    current: Sequence[float],
    baseline: Sequence[float],
    margin: float,
    alpha: float,
    alpha_no_change: float | None,
    method: str,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """The data check: the settings, then both sides' values (finite and > 0), as arrays;
    :class:`~pytest_specdecode.stats.samples.StatsInputError` on the first that is not."""
    check_margin(margin)
    check_alpha(alpha)
    if alpha_no_change is not None:
        check_alpha(alpha_no_change)
    if method not in METHODS:
        raise StatsInputError(f"unknown method {method!r}: use one of {', '.join(METHODS)}")
    cur = positive_values(current, "current")
    base = positive_values(baseline, "baseline")
    return cur, base


@dataclass(frozen=True)
class _Check:
    """One comparison's samples on the log, higher-is-better scale, its threshold and the
    two-level model of its baseline: what every interval it forms shares (the verdict's at alpha,
    the no-change guard's at its own level)."""

    cur: NDArray[np.float64]
    base: NDArray[np.float64]
    higher_is_better: bool
    margin: float
    sign: float
    log_cur: NDArray[np.float64]
    log_base: NDArray[np.float64]
    threshold: float
    cur_constant: bool
    base_constant: bool
    levels: TwoLevelInterval
    two_levels: bool  # launch variance in the interval: several baseline launches or a prior
    prior: LaunchPrior | None
    method: str
    seed: int | None
    n_resamples: int

    @classmethod
    def of(
        cls,
        cur: NDArray[np.float64],
        base: NDArray[np.float64],
        *,
        higher_is_better: bool,
        margin: float,
        method: str,
        seed: int | None,
        n_resamples: int,
        launch_runs: Sequence[int] | None,
        prior: LaunchPrior | None,
    ) -> _Check:
        """The checked samples oriented so that higher is better, and their two-level model."""
        sign = 1.0 if higher_is_better else -1.0
        log_cur, log_base = sign * np.log(cur), sign * np.log(base)
        threshold = math.log1p(margin)
        cur_constant, base_constant = is_constant(cur), is_constant(base)
        launches = [n for n in (launch_runs or ()) if n > 0]
        levels = two_level(log_cur, log_base, launches or [base.size], prior)
        two_levels = levels.launches >= 2 or prior is not None
        return cls(
            cur=cur,
            base=base,
            higher_is_better=higher_is_better,
            margin=margin,
            sign=sign,
            log_cur=log_cur,
            log_base=log_base,
            threshold=threshold,
            cur_constant=cur_constant,
            base_constant=base_constant,
            levels=levels,
            two_levels=two_levels,
            prior=prior,
            method=method,
            seed=seed,
            n_resamples=n_resamples,
        )

    def interval_at(self, level: float) -> LogInterval:
        """The ratio and its interval of two one-sided ``level`` bounds, by the method these
        samples allow (module docstring: Methods), with a note where it is not the one asked."""
        cur, base, method = self.cur, self.base, self.method
        log_cur, log_base, threshold = self.log_cur, self.log_base, self.threshold
        cur_constant, base_constant, levels = self.cur_constant, self.base_constant, self.levels
        if cur.size == 1 or base.size == 1:
            return no_variance_interval(log_cur, log_base, method)
        if cur_constant and base_constant:
            return exact_interval(log_cur, log_base, threshold)
        if self.two_levels:
            interval = t_interval("two-level", levels.estimate, levels.se, levels.df,
                                   threshold, level)  # fmt: skip
            if method != "welch-log":
                interval = with_note(
                    interval, f"{method} has no launch level: used the two-level t interval"
                )
            return interval
        if method == "bootstrap" and min(cur.size, base.size) >= BOOTSTRAP_MIN_RUNS:
            seed = self.seed
            seed_ = seed if seed is not None else zlib.crc32(np.concatenate([cur, base]).tobytes())
            return bootstrap_interval(
                cur, base, self.sign, threshold, level, seed_, self.n_resamples
            )
        if method == "rank" and not (cur_constant or base_constant):
            return rank_interval(log_cur, log_base, threshold, level)
        interval = welch_log_interval(
            log_cur, log_base, cur_constant, base_constant, threshold, level
        )
        if method == "bootstrap":
            return with_note(interval, _bootstrap_fallback_note(cur.size, base.size))
        if method == "rank":
            return with_note(interval, "rank method needs variation on both sides")
        return interval


def _launch_notes(check: _Check, warn_single_launch: bool) -> list[str]:
    """What the two-level model says of the launch variance, where the verdict repeats it: that
    the interval cannot carry it (asked for, one baseline launch, no prior), or a stated prior's
    source, or why it was not used."""
    two_levels, prior, notes = check.two_levels, check.prior, check.levels.notes
    if warn_single_launch and not two_levels and check.cur.size > 1 and check.base.size > 1:
        return list(notes)
    if two_levels and prior is not None and (prior.stated or prior.stated_prior is not None):
        return list(notes)  # the stated prior's source, or why it was not used
    return []


def _no_change_guard(
    check: _Check, code: int, alpha: float, alpha_no_change: float | None
) -> tuple[int, float | None, list[str]]:
    """The no-change guard: a FAIL against a negative margin stands only if the current build is
    also worse than the baseline itself at ``alpha_no_change``. Else it is INCONCLUSIVE, with the
    guard's upper bound and a warning saying why. Returns (verdict code, that bound, warnings)."""
    if code == -1 and check.margin < 0 and alpha_no_change is not None:
        guard = check.interval_at(alpha_no_change)
        if guard.high >= -TIE_TOLERANCE:
            no_change_high = math.exp(guard.high)
            held_back = (
                f"worse than the margin at {confidence_text(1 - alpha)} but not distinguishable "
                f"from no change at {confidence_text(1 - alpha_no_change)} (upper bound "
                f"{no_change_high:.3f}): "
                "not called a regression"
            )
            return 0, no_change_high, [held_back]
    return code, None, []


def _mde_and_note(check: _Check, code: int, alpha: float) -> tuple[float | None, list[str]]:
    """The minimum detectable effect of the check's design (None where unknown), and for an
    undecided check whose MDE exceeds its margin, the warning that says what limits it."""
    cur_constant, levels, margin = check.cur_constant, check.levels, check.margin
    design = mde_design(check.log_cur, check.log_base, cur_constant, check.base_constant)
    mde = None if design is None else min_detectable_effect(*design, alpha)
    if check.two_levels and mde is not None:
        mde = two_level_mde(levels, alpha)
    # Only an undecided check needs to hear that it could not have been decided.
    if code == 0 and design is not None and mde is not None and mde > abs(margin) + TIE_TOLERANCE:
        if check.two_levels:
            return mde, [
                f"MDE {mde_text(mde)} is larger than the margin {abs(margin):.1%}: the "
                f"launch-to-launch variation (CV {levels.launch_cv:.1%} over {levels.launches} "
                f"baseline launches{' and the history' if check.prior is not None else ''}) "
                "limits what one launch can "
                "show; more baseline launches or nights of history narrow it"
            ]
        return mde, [
            mde_warning(mde, margin, alpha, design, check.cur.size, check.base.size, cur_constant)
        ]
    return mde, []


def _comparison(
    check: _Check,
    interval: LogInterval,
    code: int,
    *,
    alpha: float,
    alpha_no_change: float | None,
    no_change_high: float | None,
    mde: float | None,
    warnings: list[str],
) -> Comparison:
    """The verdict and its message: the interval back on the ratio scale, with the summaries."""
    levels, margin, prior = check.levels, check.margin, check.prior
    return Comparison(
        method=interval.method,
        higher_is_better=check.higher_is_better,
        margin=margin,
        alpha=alpha,
        current=summarize(check.cur.tolist()),
        baseline=_baseline_summary(tuple(check.base.tolist())),
        ratio=math.exp(interval.estimate),
        ci_low=math.exp(interval.low),
        ci_high=math.exp(interval.high),
        p_pass=interval.p_pass,
        p_fail=interval.p_fail,
        mde=mde,
        verdict=_CODE_TO_VERDICT[code],
        warnings=tuple(warnings),
        launches=levels.launches,
        launch_cv=levels.launch_cv if check.two_levels else None,
        df=interval.df,
        alpha_no_change=alpha_no_change if margin < 0 else None,
        no_change_high=no_change_high,
        history_nights=prior.nights if prior is not None else 0,
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


def verdict_codes(
    low: NDArray[np.float64], high: NDArray[np.float64], threshold: float
) -> NDArray[np.int8]:
    """+1 PASS, -1 FAIL, 0 INCONCLUSIVE; a bound on the threshold (within tolerance) passes."""
    passes = low >= threshold - TIE_TOLERANCE
    fails = high < threshold - TIE_TOLERANCE
    return np.where(passes, 1, np.where(fails, -1, 0)).astype(np.int8)


def _bootstrap_fallback_note(n_cur: int, n_base: int) -> str:
    return (
        f"bootstrap needs {BOOTSTRAP_MIN_RUNS} runs per side (it under-covers below that), got "
        f"{n_cur} current and {n_base} baseline; used welch-log"
    )
