"""How often the shipped suite's borderline claim FAILs an unchanged build, from the statistics
(prints figures; not a test).

Issue 45, item 2. ``perf_tests/test_seed.py::test_eagle3_2step_nccl_beats_no_speculation``
claims EAGLE3 2-step at least 5% over no speculation's stored baseline; the committed simulated
baselines put it at +5.5%. Its checks, each judged look by look at 5..10 runs as the session
does (the plugin's own ``verdict.evaluate``, the sequential plan's per-look alpha, the no-change
guard spent in the same proportion): tok/s at most 3% below its own baseline, accept length at
most 5% below, tok/s at least 5% over ``nospec-nccl``'s baseline. The baselines are the
committed files, as they are; each trial draws the current runs lognormal around the own
baseline's mean (times 1 + SHIFT: a machine that measures every run that much slower) with the
own baseline's run-to-run CV, the accept length around its own baseline's. SHIFT 0 is an
unchanged build on a machine as fast as the one that recorded the baselines: what FAILs there
is the statistics' false-FAIL rate.

``python benchmarks/bench_seed_claim.py [--trials 4000] [--seed 1] [--alpha-no-change 0.01]
[--shifts 0,-0.005,-0.01,-0.015,-0.02]``: the guard's level and the machine's slowdowns to try.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import numpy as np
from tabulate import tabulate

from pytest_specdecode.settings import OPTIONS_BY_NAME
from pytest_specdecode.stats.comparison import Verdict
from pytest_specdecode.stats.sequential import SequentialPlan
from pytest_specdecode.verdict import BaselineRef, Threshold, evaluate

REPO = Path(__file__).resolve().parents[1]
BASELINES = REPO / "baselines" / "simulated" / "perf_tests" / "test_seed"
ALPHA = float(OPTIONS_BY_NAME["alpha"].default)
ALPHA_NO_CHANGE = float(OPTIONS_BY_NAME["alpha_no_change"].default)
RUNS = int(OPTIONS_BY_NAME["runs"].default)
MAX_RUNS = int(OPTIONS_BY_NAME["max_runs"].default)
THRESHOLDS = (
    Threshold("tok_s", -0.03),
    Threshold("accept_length", -0.05),
    Threshold("tok_s", 0.05, "nospec-nccl"),
)
CLAIM = 2  # the index of the claim in THRESHOLDS
SHIFTS = (0.0, -0.005, -0.01, -0.015, -0.02)


def samples(name: str) -> dict[str, list[float]]:
    data = json.loads((BASELINES / f"{name}.json").read_text())
    return {k: list(v) for k, v in data["samples"].items() if k in ("tok_s", "accept_length")}


def lognormal(rng: np.random.Generator, mean: float, cv: float, n: int) -> np.ndarray:
    sigma = math.sqrt(math.log1p(cv**2))
    return mean * np.exp(rng.normal(-(sigma**2) / 2, sigma, n))


def cv(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.fmean(values)


def trial(
    rng: np.random.Generator,
    shift: float,
    own: dict[str, list[float]],
    refs: dict[str | None, BaselineRef],
    plan: SequentialPlan,
    alpha_no_change: float,
) -> tuple[Verdict | None, ...]:
    """The verdict of each threshold, decided look by look as the session decides them."""
    current = {
        "tok_s": lognormal(rng, statistics.fmean(own["tok_s"]) * (1 + shift), cv(own["tok_s"]),
                           MAX_RUNS),
        "accept_length": lognormal(rng, statistics.fmean(own["accept_length"]),
                                   cv(own["accept_length"]), MAX_RUNS),
    }  # fmt: skip
    decided: dict[int, Verdict | None] = {}
    looks = plan.looks()
    verdicts: tuple[Verdict | None, ...] = ()
    for index, n in enumerate(looks):
        look_alpha = plan.alpha_at(index)
        checks = evaluate(
            THRESHOLDS,
            {name: list(values[:n]) for name, values in current.items()},
            refs,
            alpha=look_alpha,
            method="welch-log",
            alpha_no_change=alpha_no_change * look_alpha / ALPHA,
        )
        for i, check in enumerate(checks):
            if i not in decided and check.verdict is not Verdict.INCONCLUSIVE:
                decided[i] = check.verdict
        verdicts = tuple(decided.get(i, c.verdict) for i, c in enumerate(checks))
        if all(v is not Verdict.INCONCLUSIVE for v in verdicts):
            break
    return verdicts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--alpha-no-change", type=float, default=ALPHA_NO_CHANGE)
    parser.add_argument("--shifts", default=",".join(str(s) for s in SHIFTS))
    args = parser.parse_args()
    shifts = [float(s) for s in args.shifts.split(",")]
    started = time.monotonic()
    own = samples("test_eagle3_2step_nccl_beats_no_speculation")
    nospec = samples("test_no_speculation_nccl_tuned")
    refs: dict[str | None, BaselineRef] = {
        None: BaselineRef("its own baseline", own, launch_runs=(len(own["tok_s"]),)),
        "nospec-nccl": BaselineRef(
            "nospec-nccl's baseline", nospec, launch_runs=(len(nospec["tok_s"]),)
        ),
    }
    plan = SequentialPlan(initial_runs=RUNS, max_runs=MAX_RUNS, step=1, alpha=ALPHA)
    plan = plan.for_baseline(len(own["tok_s"]))
    recorded = statistics.fmean(own["tok_s"]) / statistics.fmean(nospec["tok_s"])
    print(
        f"committed baselines: 2-step {statistics.fmean(own['tok_s']):.1f} tok/s (n "
        f"{len(own['tok_s'])}, CV {cv(own['tok_s']):.2%}), nospec-nccl "
        f"{statistics.fmean(nospec['tok_s']):.1f} (n {len(nospec['tok_s'])}, CV "
        f"{cv(nospec['tok_s']):.2%}): the claim recorded at {recorded:.4f} against 1.05 "
        f"required; accept length {statistics.fmean(own['accept_length']):.3f} (CV "
        f"{cv(own['accept_length']):.2%})"
    )
    print(
        f"policy: alpha {ALPHA}, no-change guard {args.alpha_no_change}, runs {RUNS}..{MAX_RUNS}; "
        f"{args.trials} trials per row, seed {args.seed}\n"
    )
    rows = []
    for shift in shifts:
        rng = np.random.default_rng([args.seed, round(-shift * 1e4)])
        claim = dict.fromkeys(Verdict, 0)
        test_fail = test_inconclusive = 0
        for _ in range(args.trials):
            verdicts = trial(rng, shift, own, refs, plan, args.alpha_no_change)
            v = verdicts[CLAIM]
            if v is not None:
                claim[v] += 1
            if Verdict.FAIL in verdicts:
                test_fail += 1
            elif Verdict.INCONCLUSIVE in verdicts:
                test_inconclusive += 1
        n = args.trials
        upper = 3.0 / n if claim[Verdict.FAIL] == 0 else None  # the rule of three, 95%
        rows.append(
            [
                f"{shift:+.1%}",
                f"{claim[Verdict.FAIL] / n:.2%}" + (f" (< {upper:.2%})" if upper else ""),
                f"{claim[Verdict.INCONCLUSIVE] / n:.1%}",
                f"{claim[Verdict.PASS] / n:.1%}",
                f"{test_fail / n:.2%}",
                f"{test_inconclusive / n:.1%}",
            ]
        )
    headers = [
        "current vs the recording machine", "claim FAIL", "claim INCONCL.", "claim PASS",
        "test FAIL (any check)", "test INCONCL.",
    ]  # fmt: skip
    print(tabulate(rows, headers=headers, tablefmt="github"))
    print(f"({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
