"""The README's main job on a quiet and on a busy machine (prints figures; not a test).

Issues 27 (item 2) and 45 (item 2): ``pytest perf_tests`` against the committed baselines must
never FAIL where nothing regressed, whether the machine is quiet or another process keeps its
cores busy. This runs the main job exactly as the README does (``python -m pytest perf_tests``,
the simulated server, the committed ``baselines/``): first Q times on its own ("quiet": nothing
of this benchmark beside it, whatever else the machine runs), then N times each with K busy-loop
processes started just before it and killed after it. It prints per run each test's verdict, its
tok/s against its own baseline, and the run queue per CPU and the CPU time a hypervisor stole
that the plugin recorded (``provenance["machine_load"]``); then, per phase, how often each
verdict came out, the runs that FAILed and the share of INCONCLUSIVE rows (tests) and of the
seed's 2-step claim, with the load average before and after the phase.

``python benchmarks/bench_busy_main_job.py [--quiet-runs 30] [--runs 20] [--spinners 2]``:
about 80 s a run on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench_sim_load import busy_loops
from tabulate import tabulate

REPO = Path(__file__).resolve().parents[1]
CLAIM_TEST = "test_eagle3_2step_nccl_beats_no_speculation"
CLAIM_REFERENCE = "nospec-nccl"


def baseline_means() -> dict[str, float]:
    """Test name -> the committed simulated baseline's mean tok/s."""
    means = {}
    for path in (REPO / "baselines" / "simulated").rglob("*.json"):
        samples = json.loads(path.read_text())["samples"]["tok_s"]
        means[path.stem] = statistics.fmean(samples)
    return means


def one_run(spinners: int, report: Path) -> tuple[int, float, dict[str, Any]]:
    with busy_loops(spinners):
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "perf_tests", "-q", "-p", "no:cacheprovider",
             f"--specdecode-report={report}"],
            cwd=REPO, capture_output=True, text=True, check=False,
        )  # fmt: skip
        seconds = time.monotonic() - started
    data = json.loads(report.read_text()) if report.exists() else {"tests": []}
    return done.returncode, seconds, data


@dataclass
class Phase:
    name: str
    spinners: int
    runs: list[tuple[int, int, float, dict[str, str]]] = field(default_factory=list)
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    claim: Counter[str] = field(default_factory=Counter)  # the 2-step claim's own check
    failed_runs: list[int] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # each FAILed check, described
    held: list[str] = field(default_factory=list)  # each FAIL held back for the load, described
    load_before: float = 0.0
    load_after: float = 0.0

    def rows(self) -> int:
        return sum(self.outcomes.values())

    def inconclusive_rows(self) -> int:
        return sum(n for (_, outcome), n in self.outcomes.items() if outcome == "inconclusive")

    def fail_rows(self) -> int:
        return sum(n for (_, outcome), n in self.outcomes.items() if outcome == "fail")


def run_phase(phase: Phase, count: int, base: dict[str, float], tmp: Path) -> None:
    phase.load_before = os.getloadavg()[0]
    for index in range(1, count + 1):
        code, seconds, data = one_run(phase.spinners, tmp / f"{phase.name}-{index}.json")
        cells: dict[str, str] = {}
        failed = code != 0 or not data["tests"]
        for test in data["tests"]:
            name = test["test_id"].split("::")[-1]
            mean = statistics.fmean(test["samples"]["tok_s"])
            machine = test["provenance"].get("machine_load") or {}
            load, steal = machine.get("runnable_per_cpu"), machine.get("cpu_steal")
            phase.outcomes[(test["profile"], test["outcome"])] += 1
            failed = failed or test["outcome"] == "fail"
            for check in test["checks"]:
                claim = (name, check["metric"], check["reference"])
                if claim == (CLAIM_TEST, "tok_s", CLAIM_REFERENCE):
                    phase.claim[check["verdict"]] += 1
                if check["verdict"] == "fail":
                    phase.failures.append(f"run {index}: {name}: {describe(check)}")
                if any(w.startswith(HELD_BACK) for w in check.get("warnings") or ()):
                    phase.held.append(f"run {index}: {name}: {describe(check)}")
            cells[test["profile"]] = (
                f"{test['outcome'].upper()} {mean / base[name] - 1:+.1%}"
                + (f" @{load:.1f}" if load is not None else "")
                + (f" st{steal:.1%}" if steal else "")
            )
        if failed:
            phase.failed_runs.append(index)
        phase.runs.append((index, code, seconds, cells))
        print(f"{phase.name} run {index}: exit {code}, {seconds:.0f}s: {cells}", flush=True)
    phase.load_after = os.getloadavg()[0]


HELD_BACK = "Not called a FAIL"  # machine_load.held_back_by_load's note


def describe(check: dict[str, Any]) -> str:
    """A FAILed check as the JSON report has it: metric, reference, ratio and bounds."""
    reference = check["reference"] or "its own baseline"
    return (
        f"{check['metric']} vs {reference} (margin {check['margin']:+}): ratio "
        f"{check['ratio']:.4f}, one-sided bounds [{check['ci_low']:.4f}, {check['ci_high']:.4f}] "
        f"at alpha {check['alpha']:.3g}, n {check['n_current']} against {check['n_baseline']}, "
        f"no-change guard at {check['alpha_no_change']}"
    )


def share(part: int, whole: int) -> str:
    return f"{part}/{whole} ({part / whole:.0%})" if whole else "-"


def print_phase(phase: Phase) -> None:
    profiles = sorted({p for p, _ in phase.outcomes})
    rows = [
        [i, code, f"{s:.0f}", *(cells.get(p, "-") for p in profiles)]
        for i, code, s, cells in phase.runs
    ]
    beside = f"beside {phase.spinners} busy-loop processes" if phase.spinners else "alone"
    print(
        f"\n{phase.name}: SIMULATED server, `pytest perf_tests` against the committed "
        f"baselines, {len(phase.runs)} runs, each {beside} (load average "
        f"{phase.load_before:.2f} before, {phase.load_after:.2f} after). Cells: verdict, tok/s "
        "against the test's own baseline, run queue per CPU the plugin recorded (st: CPU time a "
        "hypervisor stole, when any)."
    )
    print(tabulate(rows, headers=["run", "exit", "s", *profiles], tablefmt="github"))
    outcomes = sorted({o for _, o in phase.outcomes})
    summary = [[p, *(phase.outcomes[(p, o)] for o in outcomes)] for p in profiles]
    print()
    print(tabulate(summary, headers=["profile", *outcomes], tablefmt="github"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quiet-runs", type=int, default=30, help="runs with no busy loop")
    parser.add_argument("--runs", type=int, default=20, help="runs beside the busy loops")
    parser.add_argument("--spinners", type=int, default=2, help="busy-loop processes")
    args = parser.parse_args()
    base = baseline_means()
    phases = []
    if args.quiet_runs:
        phases.append((Phase("quiet", 0), args.quiet_runs))
    if args.runs:
        phases.append((Phase(f"busy ({args.spinners} loops)", args.spinners), args.runs))
    with tempfile.TemporaryDirectory() as tmp:
        for phase, count in phases:
            run_phase(phase, count, base, Path(tmp))
    for phase, _ in phases:
        print_phase(phase)
    print()
    table = [
        [
            phase.name,
            len(phase.runs),
            f"{phase.load_before:.2f} / {phase.load_after:.2f}",
            share(len(phase.failed_runs), len(phase.runs)),
            share(phase.fail_rows(), phase.rows()),
            share(phase.inconclusive_rows(), phase.rows()),
            share(len(phase.held), phase.rows()),
            ", ".join(f"{v} {n}" for v, n in sorted(phase.claim.items())) or "-",
            share(phase.claim["inconclusive"], sum(phase.claim.values())),
        ]
        for phase, _ in phases
    ]
    headers = [
        "phase", "runs", "load avg before / after", "runs with a FAIL", "FAIL rows",
        "INCONCLUSIVE rows", "of them FAILs held back for the load",
        "2-step claim (+5% vs nospec-nccl)", "claim INCONCLUSIVE",
    ]  # fmt: skip
    print(tabulate(table, headers=headers, tablefmt="github"))
    for phase, _ in phases:
        if phase.failed_runs:
            print(f"{phase.name}: runs with a FAIL or a non-zero exit: {phase.failed_runs}")
            for failure in phase.failures:
                print(f"  {failure}")
        if phase.held:
            print(f"{phase.name}: FAILs held back as INCONCLUSIVE for the machine's load:")
            for held in phase.held:
                print(f"  {held}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
