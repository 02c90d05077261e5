"""``benchmarks/bench_verdict_e2e.py`` in a small configuration: the operating characteristic
measured through the real plugin on the simulated server (record, then nightly sessions with an
injected slowdown), printed side by side with pytest-benchmark's rules.

Only what cannot depend on the machine's load is asserted: the table covers every change and
every test, it is labelled simulated, and a 20% slowdown (about 15 standard errors at run CV 3%)
FAILs every test. The rates themselves are figures, printed, not asserted here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_end_to_end_bench_prints_the_operating_characteristic() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "SPECDECODE_"))}
    command = [
        sys.executable, str(REPO / "benchmarks" / "bench_verdict_e2e.py"),
        "--trials", "2", "--nights", "1", "--baseline-runs", "10", "--changes", "0", "-0.2",
        # Its tokens come every 1.3 ms, paced by the CPU: under a load that comes in bursts (run
        # at nice 19 beside the live-speed tests, an arrangement tried and not kept) one
        # recording measured a tok/s CV of 10.6%, over the plugin's 8% limit, and the benchmark
        # stopped. What this test claims is the table, so the recording keeps what it measured.
        "--max-baseline-cv", "0.3",
    ]  # fmt: skip
    done = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert out.startswith("SIMULATED (python -m pytest_specdecode.sim"), out
    assert "baselines of 10 runs over 1 launch(es)" in out
    rows = {
        cells[0]: cells
        for line in out.splitlines()
        if line.startswith("| ") and not line.startswith("| true change")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    assert set(rows) == {"+0%", "-20%"}, out
    assert all(row[1] == "2" for row in rows.values()), out
    fail, passed, inconclusive = (float(x.rstrip("%")) for x in rows["-20%"][2:5])
    assert (fail, passed, inconclusive) == (100.0, 0.0, 0.0), out
    # every test of the unchanged night got one of the three verdicts (rounded percentages)
    assert abs(sum(float(x.rstrip("%")) for x in rows["+0%"][2:5]) - 100.0) <= 1.5, out
