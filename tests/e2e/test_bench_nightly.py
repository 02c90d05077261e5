"""``benchmarks/bench_nightly.py --ci``: the cross-night operating characteristic through the
plugin's own code (stats.compare each night, the history records, written to and read back from
a real history file in the first trial of every row, crossnight.detect), side by side with the
other rules.

Only what the machine's load cannot change is asserted: the table has every scenario (the
noise measured on one H200 at TP 1 among them), every row and every rule; a 29% drop, which the
nightly gate FAILs the same night, is flagged on the first changed night by the new rule; the
stated prior's first-night table is there. The rates themselves are figures (8 trials a row),
printed, not asserted.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RULES = ["new", "new, R=30", "previous", "mean:5%", "asv-style", "Otava-like", "oracle"]


def test_the_nightly_bench_prints_every_rule_side_by_side() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "SPECDECODE_"))}
    command = [sys.executable, str(REPO / "benchmarks" / "bench_nightly.py"), "--ci"]
    done = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    lines = [line for line in out.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == ["scenario", "row", *RULES], out
    rows = {
        (cells[0], cells[1]): cells[2:]
        for line in lines[1:]
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
        if len(cells) == len(header)
    }
    # the H200's measured noise (tests/contract/data/h200_noise.json) is a scenario of its own
    for scenario in ("launch CV 3%", "launch CV 5%", "measured H200 TP1 (EAGLE3 2-step)"):
        labels = {row for name, row in rows if name == scenario}
        assert labels == {
            "false alarms / 30 nights",
            "-5%: delay median / p95",
            "-10%: delay median / p95",
            "-29%: delay median / p95",
        }, out
        assert rows[scenario, "-29%: delay median / p95"][0].startswith("1 / "), out
    assert "FAIL with the stated prior" in out
    first_night = out.split("first night after a baseline recording", 1)[1]
    assert "| measured H200 TP1 (EAGLE3 2-step) | +0%" in first_night, out
    assert "recording a baseline: 6 launches" in out
