"""Operating characteristics of the verdict, with and without launch-to-launch variance (prints
figures; not a test).

Seeded synthetic nights: a baseline of K launches x r runs and one current launch, lognormal at
both levels (launch CV between launches, run CV between runs of a launch), a true change of 0,
-2, -5 or -10 % against a margin of -2 %. Each trial is judged by the plugin's own code path, look
by look as the session does (``stats.compare`` with the launch structure, the sequential plan's
per-look alpha, the no-change guard spent in proportion), and, on the same samples, by the rules
users compare us with:

* pytest-benchmark's ``--benchmark-compare-fail=mean:5%`` and ``mean:2%``: fail when the mean of
  the current runs (10) is more than 5 % / 2 % below the baseline's mean;
* a single run against a fixed bound: fail when one run is below 0.95x / 0.98x the baseline mean.

With history, 30 earlier nights of the unchanged build (one launch of 10 runs each) give the
launch variance more degrees of freedom (``launches.prior_from_history``), as
``--specdecode-history`` does.

GPU minutes per verdict count a launch at 900 s (the seed's load) and a run at 5.5 s (500
tokens at 90 tok/s): a nightly verdict is one launch plus its runs; recording the baseline costs
K launches and K x r runs once.

    python benchmarks/bench_verdict.py [--trials 1000] [--seed 1]
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

import numpy as np
from tabulate import tabulate

from pytest_specdecode.settings import OPTIONS_BY_NAME
from pytest_specdecode.stats.comparison import Verdict, compare
from pytest_specdecode.stats.sequential import SequentialPlan
from pytest_specdecode.stats.two_level import LaunchPrior, prior_from_history

LEVEL = 88.8  # tok/s, the seed's NCCL-tuned baseline
MARGIN = -0.02
CHANGES = (0.0, -0.02, -0.05, -0.10)
LOAD_S, RUN_S = 900.0, 5.5
ALPHA = float(OPTIONS_BY_NAME["alpha"].default)
ALPHA_NO_CHANGE = float(OPTIONS_BY_NAME["alpha_no_change"].default)
RUNS = int(OPTIONS_BY_NAME["runs"].default)
MAX_RUNS = int(OPTIONS_BY_NAME["max_runs"].default)
BASELINE_RUNS = int(OPTIONS_BY_NAME["baseline_runs"].default)


@dataclass(frozen=True)
class Scenario:
    name: str
    launches: int  # baseline launches K
    runs: int  # baseline runs per launch
    launch_cv: float
    run_cv: float
    history: int = 0  # earlier nights (one launch of MAX_RUNS runs each) in the history


SCENARIOS = (
    # the power goal: one launch each side, no launch variance, run CV 3%
    Scenario("goal: 1 launch each side", 1, BASELINE_RUNS, 0.0, 0.03),
    Scenario("3 launches, launch CV 0", 3, BASELINE_RUNS, 0.0, 0.03),
    Scenario("3 launches, launch CV 3%", 3, BASELINE_RUNS, 0.03, 0.02),
    Scenario("3 launches, launch CV 5% (H200)", 3, BASELINE_RUNS, 0.05, 0.02),
    Scenario("3 launches + 30 nights, CV 3%", 3, BASELINE_RUNS, 0.03, 0.02, history=30),
    Scenario("3 launches + 30 nights, CV 5%", 3, BASELINE_RUNS, 0.05, 0.02, history=30),
    Scenario("launches ignored, launch CV 3%", 1, BASELINE_RUNS, 0.03, 0.02),
    Scenario("launches ignored, launch CV 5%", 1, BASELINE_RUNS, 0.05, 0.02),
)


def launches(rng: np.random.Generator, k: int, r: int, launch_cv: float, run_cv: float):
    sl, sw = math.sqrt(math.log1p(launch_cv**2)), math.sqrt(math.log1p(run_cv**2))
    return LEVEL * np.exp(rng.normal(0.0, sl, (k, 1)) + rng.normal(0.0, sw, (k, r)))


def plugin_verdict(
    current: np.ndarray,
    baseline: list[float],
    launch_runs: list[int],
    plan: SequentialPlan,
    prior: LaunchPrior | None,
) -> tuple[Verdict, int]:
    """What the session decides: looks at 5, 6, ... 10 runs, each at the plan's alpha."""
    looks = plan.looks()
    verdict = Verdict.INCONCLUSIVE
    for index, n in enumerate(looks):
        look_alpha = plan.alpha_at(index)
        verdict = compare(
            list(current[:n]),
            baseline,
            margin=MARGIN,
            alpha=look_alpha,
            launch_runs=launch_runs,
            alpha_no_change=ALPHA_NO_CHANGE * look_alpha / ALPHA,
            prior=prior,
        ).verdict
        if verdict is not Verdict.INCONCLUSIVE:
            return verdict, n
    return verdict, looks[-1]


def simulate(scenario: Scenario, change: float, trials: int, seed: int) -> dict[str, float]:
    rng = np.random.default_rng([seed, scenario.launches, round(scenario.launch_cv * 1e4)])
    plan = SequentialPlan(initial_runs=RUNS, max_runs=MAX_RUNS, alpha=ALPHA).for_baseline(
        scenario.launches * scenario.runs
    )
    counts = {"fail": 0, "pass": 0, "inconclusive": 0}
    runs_used = 0
    mean5 = mean2 = single95 = single98 = 0
    for _ in range(trials):
        base = launches(rng, scenario.launches, scenario.runs, scenario.launch_cv, scenario.run_cv)
        cur = launches(rng, 1, MAX_RUNS, scenario.launch_cv, scenario.run_cv)[0] * (1 + change)
        prior = None
        if scenario.history:  # earlier nights of the unchanged build, as the session reads them
            nights = launches(rng, scenario.history, MAX_RUNS, scenario.launch_cv, scenario.run_cv)
            prior = prior_from_history(
                list(np.log(nights).mean(axis=1)), [MAX_RUNS] * scenario.history
            )
        verdict, n = plugin_verdict(
            cur, list(base.ravel()), [scenario.runs] * scenario.launches, plan, prior
        )
        counts[verdict.value] += 1
        runs_used += n
        ratio = float(cur.mean() / base.mean())
        mean5 += ratio < 0.95
        mean2 += ratio < 0.98
        single95 += float(cur[0] / base.mean()) < 0.95
        single98 += float(cur[0] / base.mean()) < 0.98
    mean_runs = runs_used / trials
    return {
        "fail": counts["fail"] / trials,
        "pass": counts["pass"] / trials,
        "inconclusive": counts["inconclusive"] / trials,
        "runs": mean_runs,
        "mean5": mean5 / trials,
        "mean2": mean2 / trials,
        "single95": single95 / trials,
        "single98": single98 / trials,
        "gpu_min": (LOAD_S + mean_runs * RUN_S) / 60,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    started = time.monotonic()
    print(
        f"policy: alpha {ALPHA} at the margin (false FAIL and false PASS of a build exactly at "
        f"the margin), no-change guard {ALPHA_NO_CHANGE}, runs {RUNS}..{MAX_RUNS} "
        f"(O'Brien-Fleming), baseline {BASELINE_RUNS} runs per launch; margin {MARGIN:+.0%}; "
        f"{args.trials} trials per row\n"
    )
    rows = []
    for scenario in SCENARIOS:
        for change in CHANGES:
            cell = simulate(scenario, change, args.trials, args.seed)
            rows.append(
                [
                    scenario.name,
                    f"{change:+.0%}",
                    f"{cell['fail']:.1%}",
                    f"{cell['pass']:.1%}",
                    f"{cell['inconclusive']:.1%}",
                    f"{cell['runs']:.1f}",
                    f"{cell['gpu_min']:.1f}",
                    f"{cell['mean5']:.1%}",
                    f"{cell['mean2']:.1%}",
                    f"{cell['single95']:.1%}",
                    f"{cell['single98']:.1%}",
                ]
            )
    headers = [
        "scenario", "true change", "FAIL", "PASS", "INCONCL.", "runs", "GPU min",
        "mean:5% FAIL", "mean:2% FAIL", "1 run <0.95x", "1 run <0.98x",
    ]  # fmt: skip
    print(tabulate(rows, headers=headers, tablefmt="github"))
    print(
        "\nrecording a baseline: "
        + "; ".join(
            f"{k} launch{'es' if k > 1 else ''} x {BASELINE_RUNS} runs = "
            f"{(k * LOAD_S + k * BASELINE_RUNS * RUN_S) / 60:.0f} GPU min"
            for k in (1, 3)
        )
    )
    print(f"({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
