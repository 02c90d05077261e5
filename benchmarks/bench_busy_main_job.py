"""The README's main job on a busy machine (prints figures; not a test).

Issue 27, item 2: ``pytest perf_tests`` against the committed baselines must not FAIL on a
machine whose cores another process keeps busy. This runs the main job exactly as the README
does (``python -m pytest perf_tests``, the simulated server, the committed ``baselines/``) N
times, each with K busy-loop processes started just before it and killed after it, and prints
per run each test's verdict, its tok/s against its own baseline, and the run queue per CPU and
the CPU time a hypervisor stole that the plugin recorded (``provenance["machine_load"]``), then
how often each verdict came out.

``python benchmarks/bench_busy_main_job.py [--runs 20] [--spinners 2]``: about 80 s a run on a
2-core machine. Nothing else should run beside it (the figures are then that load's, not K's).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench_sim_load import busy_loops
from tabulate import tabulate

REPO = Path(__file__).resolve().parents[1]


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--spinners", type=int, default=2, help="busy-loop processes")
    args = parser.parse_args()
    base = baseline_means()
    runs: list[tuple[int, int, float, dict[str, str]]] = []
    verdicts: Counter[tuple[str, str]] = Counter()
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(1, args.runs + 1):
            code, seconds, data = one_run(args.spinners, Path(tmp) / f"r{index}.json")
            cells: dict[str, str] = {}
            for test in data["tests"]:
                name = test["test_id"].split("::")[-1]
                mean = statistics.fmean(test["samples"]["tok_s"])
                machine = test["provenance"].get("machine_load") or {}
                load, steal = machine.get("runnable_per_cpu"), machine.get("cpu_steal")
                verdicts[(test["profile"], test["outcome"])] += 1
                cells[test["profile"]] = (
                    f"{test['outcome'].upper()} {mean / base[name] - 1:+.1%}"
                    + (f" @{load:.1f}" if load is not None else "")
                    + (f" st{steal:.1%}" if steal else "")
                )
            runs.append((index, code, seconds, cells))
            print(f"run {index}: exit {code}, {seconds:.0f}s: {cells}", flush=True)
    profiles = sorted({p for p, _ in verdicts})
    rows = [
        [i, code, f"{s:.0f}", *(cells.get(p, "-") for p in profiles)] for i, code, s, cells in runs
    ]
    print(
        f"\nSIMULATED server: `pytest perf_tests` against the committed baselines, {args.runs} "
        f"runs, each beside {args.spinners} busy-loop processes. Cells: verdict, tok/s against "
        "the test's own baseline, run queue per CPU the plugin recorded (st: CPU time a "
        "hypervisor stole, when any)."
    )
    print(tabulate(rows, headers=["run", "exit", "s", *profiles], tablefmt="github"))
    outcomes = sorted({o for _, o in verdicts})
    summary = [[p, *(verdicts[(p, o)] for o in outcomes)] for p in profiles]
    print()
    print(tabulate(summary, headers=["profile", *outcomes], tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
