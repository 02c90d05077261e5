"""The dashboard's size and speed at a year of nights x 50 tests (prints figures; not a test).

The history is written in the shape ``outputs/history.history_record`` gives (checked line by
line by ``history.parse_record``): 365 nightly sessions, 50 tests (10 tests x 5 profiles, two
algorithms) on one hardware key, 10 runs a night with their run-level values, tok/s 5 % lower
from night 200 for one profile, a baseline re-recorded on night 300. The numbers are made up
(labelled simulated); what is measured is the dashboard: the time to build it from the history
file (``report --html``'s work: read, the trend and its cross-night detector, the pages), the
folder's size, and in headless Chromium (``--dump-dom`` with a virtual-time budget) the time
from navigation to the first contentful paint and to the frame after the script drew everything,
as the page records them (``performance`` entries written into the DOM).

    python benchmarks/bench_dashboard.py [--nights 365] [--tests 50] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import shutil
import subprocess
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from pytest_specdecode.outputs.dashboard.site import write_site
from pytest_specdecode.outputs.history import parse_record, read_history

PROFILES = ("eagle3", "eagle3-tuned", "nospec", "ngram", "eagle3-tp4")
START = datetime(2026, 1, 1, 3, 0, tzinfo=timezone.utc)
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def _summary(values: list[float]) -> dict[str, float]:
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    half = 2.262 * sd / math.sqrt(len(values))
    return {"n": len(values), "mean": mean, "cv": sd / mean, "ci_low": mean - half,
            "ci_high": mean + half}  # fmt: skip


def _test(rng: random.Random, night: int, index: int) -> dict[str, Any]:
    profile = PROFILES[index % len(PROFILES)]
    level = 600.0 + 10 * index
    rerecorded = night >= 300
    if profile == "eagle3" and night >= 200:
        level *= 0.95
    if rerecorded and profile == "eagle3":
        level *= 0.98
    launch = math.exp(rng.gauss(0, 0.03))
    runs = {
        "tok_s": [level * launch * math.exp(rng.gauss(0, 0.03)) for _ in range(10)],
        "accept_length": [2.4 * math.exp(rng.gauss(0, 0.02)) for _ in range(10)],
        "ttft": [0.03 * math.exp(rng.gauss(0, 0.05)) for _ in range(10)],
        "tpot": [0.01 * math.exp(rng.gauss(0, 0.03)) for _ in range(10)],
        "itl_p50": [0.009 * math.exp(rng.gauss(0, 0.02)) for _ in range(10)],
        "itl_p99": [0.02 * math.exp(rng.gauss(0, 0.04)) for _ in range(10)],
    }
    baseline = 600.0 + 10 * index
    if rerecorded and profile == "eagle3":
        baseline *= 0.95 * 0.98
    return {
        "test_id": f"perf_tests/test_suite.py::test_{index // len(PROFILES):02d}[{profile}]",
        "profile": profile, "outcome": "pass", "simulated": True, "hardware_key": "8xH200",
        "host": None, "workload_hash": "w", "fingerprint": f"f{profile}",
        "server_version": "0.5.15", "algorithm": None if profile == "nospec" else
        ("NGRAM" if profile == "ngram" else "EAGLE3"), "build": {"launcher": "sglang"},
        "runs": 10, "metrics": {m: _summary(v) for m, v in runs.items()},
        "samples": {m: [float(f"{x:.5g}") for x in v] for m, v in runs.items()},
        "checks": [{"metric": "tok_s", "reference": None, "margin": -0.05, "compared": True,
                    "verdict": "pass", "ratio": 1.0, "ci_low": 0.97, "ci_high": 1.03,
                    "n_baseline": 30, "baseline_mean": baseline, "baseline_std": baseline * 0.03,
                    "threshold": baseline * 0.95}],
        "error": None, "crossnight": {},
    }  # fmt: skip


def write_history(path: Path, nights: int, tests: int) -> None:
    rng = random.Random(1)
    with path.open("w") as out:
        for night in range(nights):
            record = {
                "schema_version": 1,
                "time_utc": (START + timedelta(days=night)).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "run_id": f"night-{night + 1}", "commit": f"{night:040x}", "dirty": False,
                "plugin_version": "0.1.0", "target": "real", "hardware_keys": ["8xH200"],
                "gpu": None, "exit_status": 0, "simulated": True,
                "tests": [_test(rng, night, i) for i in range(tests)],
            }  # fmt: skip
            line = json.dumps(record, separators=(",", ":"))
            parse_record(line, where=f"night {night + 1}")
            out.write(line + "\n")


def paint(page: Path, profile: Path) -> tuple[float | None, float | None, float]:
    """First contentful paint and the drawn frame (ms after navigation, as the page recorded
    them), and the wall time of the Chromium process."""
    started = time.perf_counter()
    done = subprocess.run(
        [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--virtual-time-budget=20000",
         f"--user-data-dir={profile}", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    wall = time.perf_counter() - started

    def number(name: str) -> float | None:
        found = re.search(rf'{name}="([\d.]+)"', done.stdout)
        return float(found.group(1)) if found else None

    return number("data-first-paint-ms"), number("data-drawn-ms"), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nights", type=int, default=365)
    parser.add_argument("--tests", type=int, default=50)
    parser.add_argument("--keep", type=Path, help="leave the site here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        history = work / "history.jsonl"
        write_history(history, args.nights, args.tests)
        site = args.keep or work / "site"
        started = time.perf_counter()
        records = read_history(history)
        read_s = time.perf_counter() - started
        written = write_site(records, site, reference_nights=90)
        build_s = time.perf_counter() - started
        pages = sorted((site / "tests").glob("*.html"))
        print(
            f"{args.nights} nights x {args.tests} tests (made-up, simulated figures): history "
            f"{history.stat().st_size / 1e6:.1f} MB"
        )
        print(
            f"build: {build_s:.1f} s (reading the history {read_s:.1f} s); folder "
            f"{written.size_bytes / 1e6:.1f} MB: index.html "
            f"{(site / 'index.html').stat().st_size / 1e3:.0f} kB, {len(pages)} test pages of "
            f"{max(p.stat().st_size for p in pages) / 1e3:.0f} kB at most"
        )
        for name, page in (("overview", site / "index.html"), ("a test page", pages[0])):
            first, drawn, wall = paint(page, work / "chromium")
            print(
                f"{name}: first contentful paint {first if first is not None else '-'} ms, "
                f"drawn {drawn if drawn is not None else '-'} ms after navigation "
                f"(headless Chromium, whole process {wall:.1f} s)"
            )


if __name__ == "__main__":
    main()
