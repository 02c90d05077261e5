"""The plugin's own test suite with its pytest runs forked, against the same runs started fresh
(prints figures; not a test).

tests/pytest_forkserver.py forks each pytester run from one process per xdist worker that has
imported pytest, the plugin and scipy already; ``SPECDECODE_TEST_FORKSERVER=0`` starts each one
as a new interpreter instead. This runs the same test files both ways, alternately (so that a
machine whose speed drifts, as the CI kind's does by a fifth within an hour, drifts on both),
and prints each run's wall time and the CPU time of everything it started (pytest, its workers,
the forkservers, the runs, the simulated servers), then the ratio of the means.

``python benchmarks/bench_suite_forkserver.py [--pairs 2] [--workers 3] [FILE ...]``: the
default files are four end-to-end files, about 2.5 minutes a run on a 2-core machine. Nothing
else should run beside it.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tabulate import tabulate

REPO = Path(__file__).resolve().parents[1]
FILES = (
    "tests/e2e/test_lifecycle.py",
    "tests/e2e/test_verdicts.py",
    "tests/e2e/test_baselines_e2e.py",
    "tests/e2e/test_outputs_e2e.py",
)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_run(forked: bool, workers: int, files: list[str]) -> tuple[float, float, int]:
    """(wall s, CPU s, exit status) of ``pytest FILES -n WORKERS``, forked or fresh."""
    env = {**os.environ, "SPECDECODE_TEST_FORKSERVER": "1" if forked else "0"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as scripts/test runs the suite
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-n", str(workers)]
    cpu, started = children_cpu(), time.perf_counter()
    done = subprocess.run([*argv, *files], cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        failed = [line for line in done.stdout.splitlines() if line.startswith("FAILED")]
        print(f"  ({'forked' if forked else 'fresh'} run exit {done.returncode}: {failed})")
    return wall, children_cpu() - cpu, done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("files", nargs="*", default=list(FILES))
    args = parser.parse_args()

    rows: list[list[object]] = []
    by_way: dict[str, list[tuple[float, float]]] = {"forked": [], "fresh": []}
    for pair in range(args.pairs):
        # forked first in even pairs, fresh first in odd ones
        for forked in (pair % 2 == 0, pair % 2 == 1):
            way = "forked" if forked else "fresh"
            wall, cpu, status = one_run(forked, args.workers, args.files)
            by_way[way].append((wall, cpu))
            rows.append([pair + 1, way, f"{wall:.1f}", f"{cpu:.1f}", status])
            print(f"pair {pair + 1} {way}: {wall:.1f} s wall, {cpu:.1f} CPU-s, exit {status}")
    print()
    print(f"{' '.join(args.files)}, -n {args.workers}, {os.cpu_count()} CPUs")
    print(tabulate(rows, headers=["pair", "runs", "wall s", "CPU s", "exit"]))
    wall = [statistics.fmean(v[0] for v in by_way[w]) for w in ("forked", "fresh")]
    cpu = [statistics.fmean(v[1] for v in by_way[w]) for w in ("forked", "fresh")]
    print(
        f"\nforked / fresh, means: wall {wall[0] / wall[1]:.2f} "
        f"({wall[0]:.0f} s / {wall[1]:.0f} s), "
        f"CPU {cpu[0] / cpu[1]:.2f} ({cpu[0]:.0f} s / {cpu[1]:.0f} s)"
    )


if __name__ == "__main__":
    main()
