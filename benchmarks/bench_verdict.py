"""Operating characteristics of the verdict on seeded synthetic runs (prints figures; not a test).

For per-run throughput with a CV of 1, 3 and 5 % and a true change of 0, -2, -5 and -10 % against
a margin of -2 %, it simulates the default sequential plan (welch-log, looks at 5, 6, ... 10 runs,
O'Brien-Fleming-type alpha spending, alpha 0.05 for FAIL and for PASS) against stored baselines of
5, 10 and 20 runs, and prints P(FAIL), P(PASS), P(INCONCLUSIVE) and the mean number of runs, next
to pytest-benchmark's compare-fail rule ("fail if the mean dropped by more than the margin") at
5 and 10 runs. Then it checks the goal (CV 3 %: a true 5 % drop FAILs in >= 95 % of trials within
10 runs; no change FAILs in <= 1 %), shows the best any valid test could do, and searches for
designs that do meet it.

Run samples are lognormal (log-normal per-run throughput, equal CV on both sides), level 88.8
tok/s. Every cell uses the same seeded random numbers, shifted by the true change, so cells differ
only by what they vary. ``python benchmarks/bench_verdict.py [--trials 2000] [--seed 1]``.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import stats
from tabulate import tabulate

from pytest_specdecode.sequential import SequentialPlan, sequential_verdicts

LEVEL = 88.8  # tok/s, the seed's NCCL-tuned baseline
MARGIN = -0.02
CVS = (0.01, 0.03, 0.05)
CHANGES = (0.0, -0.02, -0.05, -0.10)
BASELINE_SIZES = (5, 10, 20)
DEFAULT_PLAN = SequentialPlan(initial_runs=5, max_runs=10, step=1, alpha=0.05)
GOAL_CV, GOAL_DROP, GOAL_POWER, GOAL_FALSE_ALARM = 0.03, -0.05, 0.95, 0.01
SEARCH_BASELINES = (10, 20, 30, 50)
SEARCH_MAX_RUNS = (10, 12, 15, 20, 25, 30)


@dataclass(frozen=True)
class Cell:
    """Operating characteristics of one (plan, baseline size, CV, true change)."""

    p_fail: float
    p_pass: float
    p_inconclusive: float
    mean_runs: float
    naive_fail_5: float
    naive_fail_10: float


def simulate(
    plan: SequentialPlan, n_baseline: int, cv: float, change: float, trials: int, seed: int
) -> Cell:
    """Seeded trials of one cell; the same seed gives the same noise for every change."""
    rng = np.random.default_rng([seed, n_baseline, round(cv * 1e4), plan.max_runs])
    sigma = math.sqrt(math.log1p(cv * cv))
    noise_current = rng.standard_normal((trials, plan.max_runs))
    noise_baseline = rng.standard_normal((trials, n_baseline))
    current: NDArray[np.float64] = np.exp(math.log(LEVEL * (1 + change)) + sigma * noise_current)
    baseline: NDArray[np.float64] = np.exp(math.log(LEVEL) + sigma * noise_baseline)
    verdicts, runs = sequential_verdicts(plan, current, baseline, margin=MARGIN)
    baseline_mean = baseline.mean(axis=1)

    def naive_fail(n_runs: int) -> float:
        ratio = current[:, :n_runs].mean(axis=1) / baseline_mean
        return float(np.mean(ratio < 1 + MARGIN))

    return Cell(
        p_fail=float(np.mean(verdicts == "fail")),
        p_pass=float(np.mean(verdicts == "pass")),
        p_inconclusive=float(np.mean(verdicts == "inconclusive")),
        mean_runs=float(runs.mean()),
        naive_fail_5=naive_fail(5),
        naive_fail_10=naive_fail(min(10, plan.max_runs)),
    )


def percent(value: float) -> str:
    return f"{value:.1%}"


def operating_characteristics(trials: int, seed: int) -> dict[tuple[int, float, float], Cell]:
    cells: dict[tuple[int, float, float], Cell] = {}
    for n_baseline in BASELINE_SIZES:
        rows = []
        for cv in CVS:
            for change in CHANGES:
                cell = simulate(DEFAULT_PLAN, n_baseline, cv, change, trials, seed)
                cells[n_baseline, cv, change] = cell
                note = "boundary: FAIL = false alarm" if change == MARGIN else ""
                rows.append(
                    [
                        percent(cv),
                        f"{change:+.0%}",
                        percent(cell.p_fail),
                        percent(cell.p_pass),
                        percent(cell.p_inconclusive),
                        f"{cell.mean_runs:.2f}",
                        percent(cell.naive_fail_5),
                        percent(cell.naive_fail_10),
                        note,
                    ]
                )
        print(
            f"\nBaseline of {n_baseline} runs (plan alphas per look: "
            + ", ".join(f"{a:.4f}" for a in DEFAULT_PLAN.for_baseline(n_baseline).look_alphas())
            + ")"
        )
        print(
            tabulate(
                rows,
                headers=[
                    "CV",
                    "true change",
                    "P(FAIL)",
                    "P(PASS)",
                    "P(INCONCL.)",
                    "mean runs",
                    "naive FAIL @5",
                    "naive FAIL @10",
                    "",
                ],
                stralign="right",
                disable_numparse=True,
            )
        )
    return cells


class _EveryLookAtFullAlpha(SequentialPlan):
    """Naive peeking: re-test after every run at the full alpha."""

    def look_alphas(self) -> tuple[float, ...]:
        return (self.alpha,) * len(self.looks())


def error_at_the_threshold(trials: int, seed: int) -> None:
    print(
        f"\nError at the threshold (true change = margin = {MARGIN:+.0%}, CV {GOAL_CV:.0%}, "
        f"{trials} trials each; alpha {DEFAULT_PLAN.alpha}, binomial SD "
        f"{math.sqrt(0.05 * 0.95 / trials):.2%}):"
    )
    designs = (
        ("default plan", DEFAULT_PLAN),
        ("pocock spending", SequentialPlan(5, 10, 1, DEFAULT_PLAN.alpha, "pocock")),
        ("peeking: every look at 0.05", _EveryLookAtFullAlpha(5, 10, 1, DEFAULT_PLAN.alpha)),
        ("one look at 10 runs", SequentialPlan(10, 10, 1, DEFAULT_PLAN.alpha)),
    )
    rows = []
    for n_baseline in (5, 10, 20, 50):
        row: list[object] = [n_baseline]
        for _, plan in designs:
            cell = simulate(plan, n_baseline, GOAL_CV, MARGIN, trials, seed)
            row += (
                [percent(cell.p_fail), percent(cell.p_pass)]
                if plan is DEFAULT_PLAN
                else [percent(cell.p_fail)]
            )
        rows.append(row)
    headers = ["baseline runs", "FAIL: default plan", "PASS: default plan"]
    headers += [f"FAIL: {name}" for name, _ in designs[1:]]
    print(tabulate(rows, headers=headers, disable_numparse=True))


def spending_choice(trials: int, seed: int) -> None:
    print(f"\nWhy O'Brien-Fleming (baseline 20 runs, CV {GOAL_CV:.0%}, looks 5..10):")
    rows = []
    for spending in ("obrien-fleming", "pocock"):
        plan = SequentialPlan(5, 10, 1, DEFAULT_PLAN.alpha, spending)
        for change in (0.0, GOAL_DROP, -0.10):
            cell = simulate(plan, 20, GOAL_CV, change, trials, seed)
            rows.append(
                [
                    spending,
                    f"{change:+.0%}",
                    percent(cell.p_fail),
                    percent(cell.p_pass),
                    f"{cell.mean_runs:.2f}",
                ]
            )
    print(
        tabulate(
            rows,
            headers=["spending", "true change", "P(FAIL)", "P(PASS)", "mean runs"],
            disable_numparse=True,
        )
    )


def best_possible_power(n_current: float, n_baseline: float) -> tuple[float, float]:
    """(distance in standard errors, power) of the one-sided z test with a known sigma.

    For normal log values this test is the most powerful of all tests whose FAIL rate at the
    threshold is at most alpha (Neyman-Pearson), so no valid test at this n does better.
    """
    sigma = math.sqrt(math.log1p(GOAL_CV**2))
    distance = math.log((1 + MARGIN) / (1 + GOAL_DROP))
    se = sigma * math.sqrt(1 / n_current + (0 if math.isinf(n_baseline) else 1 / n_baseline))
    z_alpha = float(stats.norm.isf(DEFAULT_PLAN.alpha))
    return distance / se, float(stats.norm.sf(z_alpha - distance / se))


def goal_met(drop: Cell, unchanged: Cell) -> bool:
    return drop.p_fail >= GOAL_POWER and unchanged.p_fail <= GOAL_FALSE_ALARM


def check_goal(cells: dict[tuple[int, float, float], Cell]) -> None:
    print(
        f"\nGoal at CV {GOAL_CV:.0%}: a true {-GOAL_DROP:.0%} drop FAILs in >= {GOAL_POWER:.0%}"
        f" of trials within {DEFAULT_PLAN.max_runs} runs; no change FAILs in <= "
        f"{GOAL_FALSE_ALARM:.0%}"
    )
    rows = []
    for n_baseline in BASELINE_SIZES:
        drop, unchanged = cells[n_baseline, GOAL_CV, GOAL_DROP], cells[n_baseline, GOAL_CV, 0.0]
        distance, power = best_possible_power(DEFAULT_PLAN.max_runs, n_baseline)
        rows.append(
            [
                n_baseline,
                percent(drop.p_fail),
                percent(unchanged.p_fail),
                "MET" if goal_met(drop, unchanged) else "NOT MET",
                f"{distance:.2f}",
                percent(power),
            ]
        )
    distance, power = best_possible_power(DEFAULT_PLAN.max_runs, math.inf)
    rows.append(["unlimited", "", "", "", f"{distance:.2f}", percent(power)])
    print(
        tabulate(
            rows,
            headers=[
                "baseline runs",
                "P(FAIL) -5%",
                "P(FAIL) 0%",
                "goal",
                "SE from margin at n=10",
                "best valid test, n=10",
            ],
            disable_numparse=True,
        )
    )
    print(
        f"\nThe best valid test here is a single look at {DEFAULT_PLAN.max_runs} runs with sigma "
        f"known: a -5% truth lies {distance:.2f} standard errors below the -2% threshold even "
        f"against an unlimited baseline, so its power is {power:.1%} < {GOAL_POWER:.0%} at "
        f"alpha {DEFAULT_PLAN.alpha}. No test that keeps its false-FAIL rate at the margin "
        f"<= {DEFAULT_PLAN.alpha} can meet the goal within {DEFAULT_PLAN.max_runs} runs; with a "
        "real baseline (its own noise counts) and an estimated sigma it is further out of reach."
        " The 'no change' half is met with room to spare."
    )


def search_designs(trials: int, seed: int) -> dict[int, tuple[int, Cell, Cell] | None]:
    print(
        f"\nDesigns that do meet the goal (initial 5, step 1, O'Brien-Fleming, alpha "
        f"{DEFAULT_PLAN.alpha}, CV {GOAL_CV:.0%}); the first max_runs that meets it per "
        f"baseline size (binomial SD near 95%: {math.sqrt(0.95 * 0.05 / trials):.1%}, so a "
        "design just above 95% is borderline):"
    )
    found: dict[int, tuple[int, Cell, Cell] | None] = {}
    rows = []
    for n_baseline in SEARCH_BASELINES:
        found[n_baseline] = None
        for max_runs in SEARCH_MAX_RUNS:
            plan = SequentialPlan(5, max_runs, 1, DEFAULT_PLAN.alpha)
            drop = simulate(plan, n_baseline, GOAL_CV, GOAL_DROP, trials, seed)
            unchanged = simulate(plan, n_baseline, GOAL_CV, 0.0, trials, seed)
            boundary = simulate(plan, n_baseline, GOAL_CV, MARGIN, trials, seed)
            met = goal_met(drop, unchanged)
            rows.append(
                [
                    n_baseline,
                    max_runs,
                    percent(drop.p_fail),
                    f"{drop.mean_runs:.1f}",
                    percent(unchanged.p_fail),
                    percent(unchanged.p_pass),
                    f"{unchanged.mean_runs:.1f}",
                    percent(boundary.p_fail),
                    "MET" if met else "",
                ]
            )
            if met:
                found[n_baseline] = (max_runs, drop, unchanged)
                break
    print(
        tabulate(
            rows,
            headers=[
                "baseline runs",
                "max runs",
                "P(FAIL) -5%",
                "runs -5%",
                "P(FAIL) 0%",
                "P(PASS) 0%",
                "runs 0%",
                "P(FAIL) at margin",
                "goal",
            ],
            disable_numparse=True,
        )
    )
    return found


def recommend(
    cells: dict[tuple[int, float, float], Cell], found: dict[int, tuple[int, Cell, Cell] | None]
) -> None:
    default = cells[20, GOAL_CV, GOAL_DROP]
    ten = cells[20, GOAL_CV, -0.10]
    print("\nRecommendation:")
    print(
        "- Default plan: initial 5, step 1, max 10, O'Brien-Fleming, alpha 0.05, and record "
        "baselines with >= 20 runs (recorded once, so cheap next to every test's runs). "
        f"At CV 3% it FAILs a 5% drop in {default.p_fail:.0%} of "
        f"trials (mean {default.mean_runs:.1f} runs), a 10% drop in {ten.p_fail:.0%} "
        f"(mean {ten.mean_runs:.1f} runs), and an unchanged build in "
        f"{cells[20, GOAL_CV, 0.0].p_fail:.1%}; the naive mean rule fails an unchanged build in "
        f"{cells[20, GOAL_CV, 0.0].naive_fail_5:.0%} of trials at 5 runs."
    )
    met = [(n_base, design) for n_base, design in found.items() if design is not None]
    if met:
        listed = "; ".join(
            f"baseline {n_base} runs + max {max_runs} runs "
            f"(P(FAIL) -5% = {drop.p_fail:.1%}, mean {drop.mean_runs:.1f} runs)"
            for n_base, (max_runs, drop, _) in met
        )
        print(f"- Where the 95% goal matters (CV ~3%, 5% drop vs -2% margin): {listed}.")
    else:
        print("- No searched design met the 95% goal; more runs or a larger baseline are needed.")
    print(
        "- At CV 5% the runs needed grow with the square of the CV; check the printed MDE and "
        "lower the CV (warm-up, pinned clocks, longer runs) before adding runs."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=2000, help="trials per cell")
    parser.add_argument("--seed", type=int, default=1, help="seed of the synthetic runs")
    args = parser.parse_args()
    started = time.perf_counter()
    print(
        f"Verdict operating characteristics: margin {MARGIN:+.0%}, {args.trials} seeded "
        f"trials per cell, lognormal runs at {LEVEL} tok/s; default plan looks "
        f"{DEFAULT_PLAN.looks()}, O'Brien-Fleming spending, alpha {DEFAULT_PLAN.alpha} for FAIL "
        "and for PASS. Naive = fail if mean(current)/mean(baseline) < 1 + margin "
        "(pytest-benchmark --benchmark-compare-fail=mean:2%)."
    )
    cells = operating_characteristics(args.trials, args.seed)
    error_at_the_threshold(10 * args.trials, args.seed)
    spending_choice(args.trials, args.seed)
    check_goal(cells)
    found = search_designs(args.trials, args.seed)
    recommend(cells, found)
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
