"""From a test's thresholds, its measured samples and the baselines to one outcome and message.

Each :class:`Threshold` (a marker's demand, parsed in :mod:`pytest_specdecode.markers`) becomes a
:class:`Check`: a statistical comparison (:mod:`pytest_specdecode.stats.comparison`) when a
comparable baseline exists, or the reason it cannot be compared (no baseline, a hard fingerprint
mismatch, a metric the run did not produce). The test's outcome is the worst of its checks, in this
order: a mismatch (never compared silently), a FAIL, a missing baseline, INCONCLUSIVE, PASS.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from statistics import fmean
from typing import TYPE_CHECKING, Any

from pytest_specdecode.metrics import METRICS
from pytest_specdecode.result import Outcome
from pytest_specdecode.stats.comparison import (
    Comparison,
    Verdict,
    compare,
    confidence_text,
    mde_text,
)
from pytest_specdecode.stats.two_level import LaunchPrior, guard_alpha

if TYPE_CHECKING:
    from pytest_specdecode.stats.sequential import SequentialPlan


@dataclass(frozen=True)
class Threshold:
    """One demand: ``metric`` against the baseline of ``reference`` (None = the test's own)."""

    metric: str
    margin: float
    reference: str | None = None

    def describe(self) -> str:
        what = "its own baseline" if self.reference is None else f"{self.reference}'s baseline"
        sign = "+" if self.margin >= 0 else "-"
        return f"{self.metric} {sign}{abs(self.margin) * 100:g}% vs {what}"


@dataclass(frozen=True)
class BaselineRef:
    """The baseline samples one reference resolves to, or why there are none to compare."""

    label: str  # "its own baseline" / "nospec-nccl's baseline"
    samples: Mapping[str, Sequence[float]] | None
    path: str | None = None
    problem: str | None = None  # set when samples is None
    mismatch: bool = False  # the problem is a hard fingerprint or workload mismatch
    notes: Mapping[str, str] = field(default_factory=dict)  # metric -> why it has no samples
    launch_runs: tuple[int, ...] = ()  # runs per server launch of the baseline, in order
    machine_load: object = None  # the baseline's provenance["machine_load"], as stored


@dataclass(frozen=True)
class Check:
    threshold: Threshold
    ref: BaselineRef
    comparison: Comparison | None
    problem: str | None = None

    @property
    def verdict(self) -> Verdict | None:
        return self.comparison.verdict if self.comparison else None

    def describe(self, *, brief: bool = False) -> str:
        """The check's paragraph; ``brief``: its verdict, ratio and bounds without the
        warnings (an undecided check beside a FAIL, which it does not change)."""
        info = METRICS[self.threshold.metric]
        head = f"{info.label} vs {self.ref.label}"
        if self.comparison is None:
            return f"{head}: {self.problem}"
        c = self.comparison
        scale, unit = info.display_scale, info.unit
        required = 1.0 + self.threshold.margin
        direction = "at least" if self.threshold.margin >= 0 else "no worse than"
        bounds = (
            f"one-sided {confidence_text(1 - c.alpha)} bounds [{c.ci_low:.3f}, {c.ci_high:.3f}]"
        )
        if brief:
            # A FAIL held back by the no-change guard reads, in one line, like a FAIL that was
            # called INCONCLUSIVE for no reason (bounds under the margin): say which reason.
            guard = ""
            if c.no_change_high is not None and c.alpha_no_change is not None:
                level = confidence_text(1 - c.alpha_no_change)
                guard = (
                    f"; not distinguishable from no change at {level}: "
                    f"upper bound {c.no_change_high:.3f}"
                )
            return (
                f"{head}: {c.verdict.value.upper()} as well (ratio {c.ratio:.3f}, {bounds}, "
                f"{direction} {required:.3f} required, n={c.current.n}{guard}); it does not "
                "change the FAIL above."
            )
        launches = ""
        if c.launch_cv is not None:
            nights = f" and {c.history_nights} nights of history" if c.history_nights else ""
            launches = (
                f" over {c.launches} baseline launch{'es' if c.launches != 1 else ''}{nights}"
                f" (launch-to-launch CV {c.launch_cv:.1%} in the interval)"
            )
        text = (
            f"{head}: {c.verdict.value.upper()}. Baseline {c.baseline.mean * scale:.4g} {unit} "
            f"(n={c.baseline.n}, CV {c.baseline.cv_text()}), current {c.current.mean * scale:.4g} "
            f"{unit} (n={c.current.n}, CV {c.current.cv_text()}); ratio {c.ratio:.3f} with "
            f"{bounds}{launches}; margin {self.threshold.margin:+.1%} ({direction} "
            f"{required:.3f} required)"
        )
        if not info.higher_is_better:
            text += "; lower is better, so the ratio is baseline/current"
        level = f"{c.alpha:.3g}"
        if c.verdict is Verdict.FAIL:
            text += (
                f"; p(fail)={c.p_fail:.3g} (the chance that a build exactly at the margin "
                f"measures this low; FAIL needs at most {level})"
            )
        else:
            text += (
                f"; p(pass)={c.p_pass:.3g} (the chance that a build exactly at the margin "
                f"measures this high; PASS needs at most {level})"
            )
        if c.mde is not None:
            text += f", MDE {mde_text(c.mde)}"
        text += f" [{c.method}]."
        if c.warnings:
            text += " " + " ".join(c.warnings)
        return text


def evaluate(
    thresholds: Sequence[Threshold],
    current: Mapping[str, Sequence[float]],
    refs: Mapping[str | None, BaselineRef],
    *,
    alpha: float,
    method: str,
    seed: int | None = None,
    alpha_no_change: float | None = None,
    priors: Mapping[tuple[str | None, str], LaunchPrior] | None = None,
    warn_single_launch: bool = False,
) -> tuple[Check, ...]:
    """One :class:`Check` per threshold. ``priors`` holds the launch variance from history per
    (reference, metric); ``alpha_no_change`` and ``warn_single_launch`` go to
    :func:`~pytest_specdecode.stats.comparison.compare`."""
    checks = []
    for threshold in thresholds:
        ref = refs[threshold.reference]
        info = METRICS[threshold.metric]
        values = current.get(threshold.metric)
        if ref.samples is None:
            checks.append(Check(threshold, ref, None, ref.problem))
            continue
        stored = ref.samples.get(threshold.metric)
        if not values:
            problem = (
                f"this run produced no {threshold.metric} values (accept length needs a "
                "speculative server, and SGLang before 0.5.19 reports no speculative details "
                'on its OpenAI-compatible routes: use a workload with api = "generate"; TTFT '
                "and ITL need a streaming workload)"
            )
            checks.append(Check(threshold, ref, None, problem))
            continue
        if not stored:
            problem = f"the baseline {ref.path or ''} has no {threshold.metric} samples"
            if threshold.metric in ref.notes:
                problem += f": {ref.notes[threshold.metric]}"
            checks.append(Check(threshold, ref, None, problem.replace("  ", " ")))
            continue
        prior = (priors or {}).get((threshold.reference, threshold.metric))
        comparison = compare(
            values,
            stored,
            margin=threshold.margin,
            higher_is_better=info.higher_is_better,
            alpha=alpha,
            method=method,
            seed=seed,
            launch_runs=ref.launch_runs,
            prior=prior,
            # stricter once the history has enough nights: two_level.guard_alpha
            alpha_no_change=(
                None if alpha_no_change is None else guard_alpha(alpha_no_change, prior)
            ),
            warn_single_launch=warn_single_launch,
        )
        if comparison.verdict is Verdict.FAIL and threshold.reference is not None:
            comparison = _claim_guard(
                threshold, comparison, values, refs, alpha_no_change, priors, method, seed
            )
        checks.append(Check(threshold, ref, comparison))
    return tuple(checks)


def _claim_guard(
    threshold: Threshold,
    comparison: Comparison,
    values: Sequence[float],
    refs: Mapping[str | None, BaselineRef],
    alpha_no_change: float | None,
    priors: Mapping[tuple[str | None, str], LaunchPrior] | None,
    method: str,
    seed: int | None,
) -> Comparison:
    """The no-change guard of a claim against another profile's baseline ("at least 5% over
    nospec's"): a FAIL of such a claim also needs this build to be worse than its own
    baseline at the guard's level, when that baseline met the claim as recorded. Otherwise the
    build is as it was when the claim held, the claim sits within the noise of its line, and a
    FAIL would be the margin's error rate (``alpha``, 15% by default) at an unchanged build,
    which is what the guard keeps a negative margin from too. A claim that already missed its
    line when recorded, or a test without its own baseline, is not guarded."""
    own = refs.get(None)
    own_stored = own.samples.get(threshold.metric) if own and own.samples else None
    reference = refs[threshold.reference].samples or {}
    ref_stored = reference.get(threshold.metric)
    if alpha_no_change is None or own is None or not own_stored or not ref_stored:
        return comparison
    info = METRICS[threshold.metric]
    own_mean, ref_mean = fmean(own_stored), fmean(ref_stored)
    recorded = own_mean / ref_mean if info.higher_is_better else ref_mean / own_mean
    if recorded < 1.0 + threshold.margin:
        return comparison  # the claim missed its line already when recorded: no news to guard
    prior = (priors or {}).get((None, threshold.metric))
    level = guard_alpha(alpha_no_change, prior)
    versus_own = compare(
        values,
        own_stored,
        margin=0.0,
        higher_is_better=info.higher_is_better,
        alpha=level,
        method=method,
        seed=seed,
        launch_runs=own.launch_runs,
        prior=prior,
    )
    guarded = replace(comparison, alpha_no_change=level)
    if versus_own.verdict is Verdict.FAIL:
        return guarded  # worse than its own baseline beyond doubt: the FAIL is news
    note = (
        f"below the claim at {confidence_text(1 - comparison.alpha)}, but not distinguishable "
        f"from its own baseline at {confidence_text(1 - level)} (ratio {versus_own.ratio:.3f}, "
        f"upper bound {versus_own.ci_high:.3f}), which met the claim when recorded "
        f"({recorded:.3f} of {refs[threshold.reference].label}): the claim sits within the "
        "noise of its line, not called a FAIL"
    )
    return replace(guarded, verdict=Verdict.INCONCLUSIVE, warnings=(*comparison.warnings, note))


def outcome_of(checks: Sequence[Check]) -> Outcome:
    if any(c.comparison is None and c.ref.mismatch for c in checks):
        return Outcome.MISMATCH
    if any(c.verdict is Verdict.FAIL for c in checks):
        return Outcome.FAIL
    if any(c.comparison is None and c.ref.samples is None for c in checks):
        return Outcome.NO_BASELINE
    if any(c.comparison is None for c in checks):
        return Outcome.FAIL  # a demanded metric that cannot be computed is a failure, not a pass
    if any(c.verdict is Verdict.INCONCLUSIVE for c in checks):
        return Outcome.INCONCLUSIVE
    return Outcome.PASS if checks else Outcome.MEASURED


class SequentialChecks:
    """The checks of one test, judged at each look of its sequential plan.

    A check decided at one look stays decided (that is what the per-look alphas were
    calibrated for); the undecided ones are looked at again, even when another check has
    already failed, so every check gets its verdict. :meth:`look` is asked after every run."""

    def __init__(
        self,
        thresholds: Sequence[Threshold],
        refs: Mapping[str | None, BaselineRef],
        plan: SequentialPlan,
        *,
        method: str,
        alpha_no_change: float,
        priors: Mapping[tuple[str | None, str], LaunchPrior],
        warn_single_launch: bool,
        first_look_decides: bool = False,
    ) -> None:
        self.thresholds = thresholds
        self.refs = refs
        self.plan = plan
        self.method = method
        self.alpha_no_change = alpha_no_change
        self.priors = priors
        self.warn_single_launch = warn_single_launch
        self.first_look_decides = first_look_decides  # recording: the runs are all there is
        self.checks: tuple[Check, ...] = ()
        self._looks = plan.looks()
        self._decided: dict[int, Check] = {}

    def look(self, samples: Mapping[str, Sequence[float]], n: int) -> bool:
        """After the n-th run: judge if n is a look; whether the runs may stop here."""
        if n not in self._looks:
            return False
        look_alpha = self.plan.alpha_at(self._looks.index(n))
        fresh = evaluate(
            self.thresholds,
            samples,
            self.refs,
            alpha=look_alpha,
            method=self.method,
            # the no-change guard spends its level across the looks as alpha does
            alpha_no_change=self.alpha_no_change * look_alpha / self.plan.alpha,
            priors=self.priors,
            warn_single_launch=self.warn_single_launch,
        )
        for index, check in enumerate(fresh):
            if index not in self._decided and check.verdict is not Verdict.INCONCLUSIVE:
                self._decided[index] = check
        self.checks = tuple(self._decided.get(i, check) for i, check in enumerate(fresh))
        undecided = any(check.verdict is Verdict.INCONCLUSIVE for check in self.checks)
        return self.first_look_decides or not undecided


def needs_more_runs(checks: Sequence[Check]) -> bool:
    """Whether extra runs could change the outcome: only INCONCLUSIVE comparisons qualify."""
    outcome = outcome_of(checks)
    return outcome is Outcome.INCONCLUSIVE


def message(checks: Sequence[Check], outcome: Outcome) -> str:
    """The failure/skip/xfail text: one paragraph per check that is not a clean PASS.

    A FAIL leads with what failed; a check left undecided beside it gets one line after them,
    without the "cannot be decided at n=..." advice, which is about adding runs and would read
    as if the FAIL itself were in doubt."""
    relevant = [c for c in checks if c.verdict is not Verdict.PASS]
    if not relevant:
        relevant = list(checks)
    if outcome is Outcome.FAIL:
        failed = [c for c in relevant if c.verdict is not Verdict.INCONCLUSIVE]
        undecided = [c for c in relevant if c.verdict is Verdict.INCONCLUSIVE]
        return "\n\n".join(
            [c.describe() for c in failed] + [c.describe(brief=True) for c in undecided]
        )
    return "\n\n".join(c.describe() for c in relevant)


def check_json(check: Check) -> dict[str, Any]:
    """A check as the JSON report, the history and the xdist hand-over carry it."""
    c = check.comparison
    out: dict[str, Any] = {
        "metric": check.threshold.metric,
        "margin": check.threshold.margin,
        "reference": check.threshold.reference,
        "baseline_path": check.ref.path,
        "problem": check.problem,
        "verdict": c.verdict.value if c else None,
    }
    if c is not None:
        out.update(
            ratio=c.ratio,
            ci_low=c.ci_low,
            ci_high=c.ci_high,
            p_pass=c.p_pass,
            p_fail=c.p_fail,
            mde=c.mde,
            method=c.method,
            alpha=c.alpha,
            n_current=c.current.n,
            n_baseline=c.baseline.n,
            baseline_mean=c.baseline.mean,
            baseline_std=c.baseline.std,
            current_mean=c.current.mean,
            launches=c.launches,
            launch_cv=c.launch_cv,
            history_nights=c.history_nights,
            df=c.df,
            alpha_no_change=c.alpha_no_change,
            warnings=list(c.warnings),
        )
    return out
