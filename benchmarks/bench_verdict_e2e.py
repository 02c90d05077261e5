"""Operating characteristics through the real plugin on the simulated server (prints figures; not
a test). The reduced, end-to-end twin of ``bench_verdict.py``: the same question, answered by
``pytest`` itself launching ``python -m pytest_specdecode.sim``, recording baselines with
``--update-baselines`` and judging nightly runs, so that the session's look-by-look logic, the
baseline files, the launch structure and the report are all in the loop.

Each trial is one test (``test_trial[i]``, margin ``tok_s=-0.02``) with a baseline of its own; a
"night" is one pytest session, so every trial of a night shares that night's server launch, as
the tests of one profile do on a GPU box. A true change is injected the way a slower build
would be, through ``SPECDECODE_SIM_SLOWDOWN`` (the profile's fingerprint does not move). On the
same samples (read back from the JSON report and the baseline files) it also applies
pytest-benchmark's ``mean:5%`` / ``mean:2%`` rules and a single run against 0.95x / 0.98x.

    python benchmarks/bench_verdict_e2e.py [--trials 8] [--nights 2] [--launch-cv 0.05]
        [--max-baseline-cv 0.08]

``tests/e2e/test_bench_verdict_e2e.py`` runs a small configuration of it in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tabulate import tabulate

MARGIN = -0.02
CHANGES = (0.0, -0.05, -0.10)

PROFILES = """
[defaults]
launcher = "sim"
model_path = "/models/tiny-llm"
startup_timeout = 60
warmup_requests = 1

[profiles.trial]
extra_args = ["--sim-speed", "{speed}", "--sim-load-seconds", "0.2", "--sim-noise-cv", "{run_cv}",
              "--sim-launch-cv", "{launch_cv}"]

[workloads.trial]
prompt_set = "mixed"
max_new_tokens = 128
concurrency = 1
requests_per_run = 2
warmup_requests = 1
"""

TESTS = """
import pytest

@pytest.mark.parametrize("trial", range({trials}))
@pytest.mark.specdecode("trial", workload="trial", tok_s={margin})
def test_trial(trial):
    pass
"""


def pytest_session(
    project: Path, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args]
    return subprocess.run(
        command, cwd=project, env=env, capture_output=True, text=True, timeout=1800, check=False
    )


def make_project(root: Path, args: argparse.Namespace) -> None:
    (root / "specdecode.toml").write_text(
        PROFILES.format(speed=args.speed, run_cv=args.run_cv, launch_cv=args.launch_cv)
    )
    (root / "test_trials.py").write_text(TESTS.format(trials=args.trials, margin=MARGIN))
    (root / "pytest.ini").write_text(
        textwrap.dedent(
            """\
            [pytest]
            specdecode_config = specdecode.toml
            specdecode_baselines = baselines
            """
        )
    )


def base_env(root: Path) -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("PYTEST_", "SPECDECODE_SIM_"))
    }
    env["PYTEST_SPECDECODE_STATE_DIR"] = str(root / "state")
    return env


def baseline_samples(root: Path) -> dict[str, list[float]]:
    """test name → the baseline's tok/s runs (all launches)."""
    out = {}
    for path in (root / "baselines").rglob("*.json"):
        data = json.loads(path.read_text())
        out[path.stem] = [float(v) for v in data["samples"]["tok_s"]]
    return out


def night(root: Path, env: dict[str, str], change: float, index: int) -> list[dict[str, Any]]:
    report = root / f"report-{change:+.2f}-{index}.json"
    night_env = {**env, "SPECDECODE_SIM_SLOWDOWN": f"{1.0 / (1.0 + change):.6f}"}
    done = pytest_session(root, night_env, f"--specdecode-report={report}")
    if done.returncode not in (0, 1) or not report.exists():
        raise SystemExit(f"the nightly session failed (exit {done.returncode}):\n{done.stdout}")
    tests: list[dict[str, Any]] = json.loads(report.read_text())["tests"]
    return tests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8, help="tests per night (default 8)")
    parser.add_argument("--nights", type=int, default=2, help="nights per change (default 2)")
    parser.add_argument("--baseline-runs", type=int, default=None, help="default: the plugin's")
    parser.add_argument(
        "--max-baseline-cv", type=float, default=None,
        help="the recording's --specdecode-max-baseline-cv (default: the plugin's)",
    )  # fmt: skip
    parser.add_argument("--launch-cv", type=float, default=0.0)
    parser.add_argument("--run-cv", type=float, default=0.03)
    parser.add_argument("--speed", type=float, default=20.0, help="--sim-speed (default 20)")
    parser.add_argument("--changes", type=float, nargs="+", default=list(CHANGES))
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-verdict-e2e-") as tmp:
        root = Path(tmp)
        make_project(root, args)
        env = base_env(root)
        record = ["--update-baselines"]
        if args.baseline_runs is not None:
            record += ["--specdecode-baseline-runs", str(args.baseline_runs)]
        if args.max_baseline_cv is not None:
            record += ["--specdecode-max-baseline-cv", str(args.max_baseline_cv)]
        recorded = pytest_session(root, env, *record)
        if recorded.returncode != 0:
            raise SystemExit(f"recording the baselines failed:\n{recorded.stdout}")
        baselines = baseline_samples(root)
        launches = {len(json.loads(p.read_text()).get("launch_runs") or [1])
                    for p in (root / "baselines").rglob("*.json")}  # fmt: skip
        print(
            f"SIMULATED (python -m pytest_specdecode.sim, run CV {args.run_cv:.0%}, launch CV "
            f"{args.launch_cv:.0%}): {args.trials} tests x {args.nights} nights per change, "
            f"margin {MARGIN:+.0%}; baselines of {len(next(iter(baselines.values())))} runs over "
            f"{'/'.join(map(str, sorted(launches)))} launch(es), recorded in "
            f"{time.monotonic() - started:.0f} s\n"
        )
        rows = []
        for change in args.changes:
            verdicts: Counter[str] = Counter()
            runs = mean5 = mean2 = single95 = single98 = 0
            total = 0
            for index in range(args.nights):
                for test in night(root, env, change, index):
                    name = test["test_id"].rsplit("::", 1)[-1]
                    base = baselines[name]
                    current = [float(v) for v in test["samples"]["tok_s"]]
                    verdicts[test["outcome"]] += 1
                    runs += len(current)
                    level = sum(base) / len(base)
                    ratio = sum(current) / len(current) / level
                    mean5 += ratio < 0.95
                    mean2 += ratio < 0.98
                    single95 += current[0] / level < 0.95
                    single98 += current[0] / level < 0.98
                    total += 1
            rows.append(
                [
                    f"{change:+.0%}",
                    total,
                    *(f"{verdicts[o] / total:.0%}" for o in ("fail", "pass", "inconclusive")),
                    f"{runs / total:.1f}",
                    *(f"{k / total:.0%}" for k in (mean5, mean2, single95, single98)),
                ]
            )
        headers = [
            "true change", "tests", "FAIL", "PASS", "INCONCL.", "runs",
            "mean:5% FAIL", "mean:2% FAIL", "1 run <0.95x", "1 run <0.98x",
        ]  # fmt: skip
        print(tabulate(rows, headers=headers, tablefmt="github"))
        print(f"({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
