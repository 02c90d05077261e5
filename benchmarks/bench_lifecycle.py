"""Server lifecycle figures, measured end to end with real pytest runs (prints figures; not a test).

1. Fail-fast: the time from a simulated server's exit to its test's failure, for an exit while
   loading (``--sim-fault exit-during-load`` at several load lengths, so the exit comes at
   different points of the wait) and a crash while measured (``--sim-fault crash-after:N``).
   The exit time is taken by a watcher in this process polling the server's ``/proc`` entry
   every millisecond; the failure time by a ``pytest_runtest_logreport`` hook in the run.
2. Launches against distinct profiles: suites of N tests over P profiles, plain and under
   ``-n 3`` (with every profile on one GPU, so that workers must take turns), and the example
   suite ``perf_tests`` on the sim. Counts come from the plugin's ``servers:`` summary line.
3. Keep-alive: the wall time of a pytest run on a server with a 60 s (simulated) load, then of a
   second run that reuses the server kept by the first (``--specdecode-keep-server``). The sim
   runs at 50x speed with a 3000 s nominal load, i.e. a 60 s load and fast requests.

``python benchmarks/bench_lifecycle.py [--repeats 3] [--load 60] [--skip-example]
[--sections 1 2 3]``
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tabulate import tabulate

REPO = Path(__file__).resolve().parent.parent
RUNS = ("--specdecode-runs", "3", "--specdecode-max-runs", "3")
FAST = '"--sim-speed", "50", "--sim-load-seconds", "0.2", "--sim-seed", "1"'

WORKLOAD = """
[workloads.fast]
prompt_set = "mixed"
max_new_tokens = 64
concurrency = 1
requests_per_run = 2
warmup_requests = 1
"""

EVENTS_CONFTEST = """
import json, os, time

def pytest_runtest_logreport(report):
    if report.failed:
        with open(os.environ["BENCH_EVENTS"], "a") as out:
            out.write(json.dumps({"test": report.nodeid, "when": report.when,
                                  "t": time.time()}) + "\\n")
"""


@dataclass
class Run:
    returncode: int
    output: str
    seconds: float


class Project:
    """A throwaway pytest project using the plugin, with its own state directory."""

    def __init__(self, root: Path, name: str) -> None:
        self.path = root / name
        self.path.mkdir()
        self.state = self.path / "state"
        (self.path / "pytest.ini").write_text(
            "[pytest]\nspecdecode_config = specdecode.toml\nspecdecode_baselines = baselines\n"
        )
        self.runs = 0

    def write(self, profiles: str, tests: str, conftest: str = "") -> None:
        (self.path / "specdecode.toml").write_text(textwrap.dedent(profiles))
        (self.path / "test_perf.py").write_text(textwrap.dedent(tests))
        if conftest:
            (self.path / "conftest.py").write_text(textwrap.dedent(conftest))

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "PYTEST_SPECDECODE_STATE_DIR": str(self.state), **extra}

    def run(self, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> Run:
        self.runs += 1
        argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly"]
        argv += [f"--basetemp={self.path / f'tmp-{self.runs}'}", *args]
        start = time.perf_counter()
        done = subprocess.run(
            argv,
            cwd=cwd or self.path,
            env=env or self.env(),
            capture_output=True,
            text=True,
            timeout=900,
        )
        return Run(done.returncode, done.stdout + done.stderr, time.perf_counter() - start)

    def stop_leftovers(self) -> None:
        for pid in sim_pids(str(self.state)):
            try:
                os.killpg(pid, 9)
            except (ProcessLookupError, PermissionError):
                pass


def sim_pids(state_dir: str) -> list[int]:
    """Simulated servers whose environment names ``state_dir`` (i.e. started for a project)."""
    wanted = f"PYTEST_SPECDECODE_STATE_DIR={state_dir}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if b"pytest_specdecode.sim" not in (entry / "cmdline").read_bytes():
                continue
            if wanted in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


class ExitWatcher(threading.Thread):
    """Finds the project's server process and records when it stops running (exit or zombie)."""

    def __init__(self, state_dir: str) -> None:
        super().__init__(daemon=True)
        self.state_dir = state_dir
        self.started: float | None = None
        self.exited: float | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        pid = None
        while pid is None and not self._halt.is_set():
            pids = sim_pids(self.state_dir)
            if pids:
                pid, self.started = pids[0], time.time()
            else:
                time.sleep(0.005)
        stat = Path(f"/proc/{pid}/stat")
        while not self._halt.is_set():
            try:
                state = stat.read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                state = "gone"
            if state in ("Z", "X", "gone"):
                self.exited = time.time()
                return
            time.sleep(0.001)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)


def failure_latency(root: Path, name: str, profile_args: str, tests: int = 2) -> dict[str, float]:
    """One run with a faulty profile: exit time, first failure, last failure (unix seconds)."""
    project = Project(root, name)
    test_source = "import pytest\n" + "".join(
        f'\n@pytest.mark.specdecode("faulty", workload="fast")\ndef test_{i}(): pass\n'
        for i in range(tests)
    )
    project.write(
        f"""
        [defaults]
        launcher = "sim"
        tp_size = 8
        model_path = "/models/tiny-llm"
        startup_timeout = 1800
        warmup_requests = 1

        [profiles.faulty]
        extra_args = [{profile_args}]
        {WORKLOAD}
        """,
        test_source,
        EVENTS_CONFTEST,
    )
    events = project.path / "events.jsonl"
    watcher = ExitWatcher(str(project.state))
    watcher.start()
    try:
        run = project.run(*RUNS, env=project.env(BENCH_EVENTS=str(events)))
    finally:
        watcher.stop()
        project.stop_leftovers()
    lines = events.read_text().splitlines() if events.exists() else []
    failures = [json.loads(line) for line in lines]
    if watcher.exited is None or watcher.started is None or len(failures) != tests:
        raise RuntimeError(f"unexpected run ({len(failures)} failures):\n{run.output[-3000:]}")
    return {
        "exit_after": watcher.exited - watcher.started,
        "first": failures[0]["t"] - watcher.exited,
        "last": failures[-1]["t"] - watcher.exited,
    }


def bench_fail_fast(root: Path, repeats: int) -> None:
    cases = [
        (f"exit while loading, load {load:g} s", f'"--sim-speed", "1", "--sim-load-seconds", '
         f'"{load}", "--sim-fault", "exit-during-load"')
        for load in (0.5, 2, 8)
    ] + [
        (f"crash while measured, after {n} requests", f'{FAST}, "--sim-fault", "crash-after:{n}"')
        for n in (3, 7)
    ]  # fmt: skip
    rows = []
    for label, args in cases:
        samples = [failure_latency(root, f"fault-{len(rows)}-{i}", args) for i in range(repeats)]
        exit_after = statistics.median(s["exit_after"] for s in samples)
        first = [s["first"] for s in samples]
        last = [s["last"] for s in samples]
        rows.append(
            [
                label,
                f"{exit_after:.2f}",
                f"{statistics.median(first):.3f}",
                f"{max(first):.3f}",
                f"{statistics.median(last):.3f}",
            ]
        )
    print("\n1. From the server's exit to the test failure (seconds; 2 tests need the server)")
    print(
        tabulate(
            rows,
            headers=[
                "fault",
                "exit s after start",
                "1st test fails (median)",
                "(max)",
                "2nd test fails (median)",
            ],
            disable_numparse=True,
        )
    )
    print(
        f"   {repeats} runs each. The readiness wait polls the exit code every 0.5 s; a crash "
        "while measured fails the\n   request at once and the exit code is awaited (up to 2 s). "
        "Without fail-fast a load failure would\n   surface at startup_timeout (1800 s here)."
    )


SUITE_PROFILE = """
[profiles.{name}]
extra_args = [{fast}]
{gpus}
"""


def suite(tests: int, profiles: int, gpus: bool) -> tuple[str, str]:
    names = [f"p{i}" for i in range(profiles)]
    toml = (
        '[defaults]\nlauncher = "sim"\ntp_size = 8\nmodel_path = "/models/tiny-llm"\n'
        "startup_timeout = 60\nwarmup_requests = 1\n"
        + "".join(
            SUITE_PROFILE.format(name=n, fast=FAST + f', "--sim-seed", "{i + 2}"',
                                 gpus="gpus = [0]" if gpus else "")
            for i, n in enumerate(names)
        )
        + WORKLOAD
    )  # fmt: skip
    source = "import pytest\n" + "".join(
        f'\n@pytest.mark.specdecode("{names[i % profiles]}", workload="fast")\n'
        f"def test_{i}(): pass\n"
        for i in range(tests)
    )
    return toml, source


def servers_line(output: str) -> dict[str, dict[str, int]]:
    match = re.search(r"^servers: (.*)$", output, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"no servers line in:\n{output[-3000:]}")
    counts: dict[str, dict[str, int]] = {}
    for part in match.group(1).split("; "):
        name, _, rest = part.partition(" ")
        counts[name] = {
            key: int(value)
            for key, value in (item.rsplit(" ", 1) for item in rest.split(", ") if " " in item)
            if value.isdigit()
        }
    return counts


def outcome(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith("=")]
    return lines[-1].strip("= ") if lines else "?"


def bench_launches(root: Path, example: bool) -> None:
    rows: list[list[str]] = []
    for tests, profiles in ((6, 3), (8, 4), (6, 1), (12, 3)):
        for mode, args, gpus in (
            ("plain", (), False),
            ("-n 3", ("-n", "3"), False),
            ("-n 3, one GPU", ("-n", "3"), True),
        ):
            project = Project(root, f"suite-{tests}-{profiles}-{len(rows)}")
            project.write(*suite(tests, profiles, gpus))
            try:
                run = project.run(*args, *RUNS)
            finally:
                project.stop_leftovers()
            counts = servers_line(run.output)
            rows.append(
                [
                    str(tests),
                    str(profiles),
                    mode,
                    str(sum(c.get("launched", 0) for c in counts.values())),
                    str(sum(c.get("stopped", 0) for c in counts.values())),
                    f"{run.seconds:.1f}",
                    outcome(run.output),
                ]
            )
    if example:
        for mode, args in (("plain", ()), ("-n 2", ("-n", "2"))):
            project = Project(root, f"example-{mode.replace(' ', '')}")
            try:
                run = project.run("perf_tests", "--specdecode-target", "sim", *args, cwd=REPO)
            finally:
                project.stop_leftovers()
            counts = servers_line(run.output)
            rows.append(
                [
                    "perf_tests",
                    str(len(counts)),
                    mode,
                    str(sum(c.get("launched", 0) for c in counts.values())),
                    str(sum(c.get("stopped", 0) for c in counts.values())),
                    f"{run.seconds:.1f}",
                    outcome(run.output),
                ]
            )
    print("\n2. Server launches against distinct profiles")
    print(
        tabulate(
            rows,
            headers=["tests", "profiles", "mode", "launches", "stops", "wall s", "outcome"],
            disable_numparse=True,
        )
    )


def bench_keep_alive(root: Path, load: float) -> None:
    project = Project(root, "keep-alive")
    project.write(
        f"""
        [defaults]
        launcher = "sim"
        tp_size = 8
        model_path = "/models/tiny-llm"
        startup_timeout = {load * 3:g}
        warmup_requests = 1

        [profiles.big]
        extra_args = ["--sim-speed", "50", "--sim-load-seconds", "{load * 50:g}"]
        {WORKLOAD}
        """,
        """
        import pytest

        @pytest.mark.specdecode("big", workload="fast")
        def test_big(): pass
        """,
    )
    try:
        first = project.run("--specdecode-keep-server", *RUNS)
        second = project.run(*RUNS)
    finally:
        project.stop_leftovers()
    rows = []
    for label, run in (("first (loads, keeps)", first), ("second (reuses)", second)):
        counts = servers_line(run.output)["big"]
        rows.append(
            [
                label,
                f"{run.seconds:.1f}",
                str(counts.get("launched", 0)),
                str(counts.get("reused", 0)),
                outcome(run.output),
            ]
        )
    print(f"\n3. Keep-alive: a server with a {load:g} s load, two pytest runs of one test")
    print(
        tabulate(
            rows,
            headers=["run", "wall s", "launched", "reused", "outcome"],
            disable_numparse=True,
        )
    )
    print(f"   second / first: {second.seconds / first.seconds:.1%}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--load", type=float, default=60.0, help="keep-alive load, seconds")
    parser.add_argument("--skip-example", action="store_true", help="skip perf_tests")
    parser.add_argument("--sections", type=int, nargs="+", default=[1, 2, 3])
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="bench-lifecycle-"))
    print(f"bench_lifecycle: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, in {root}")
    try:
        if 1 in args.sections:
            bench_fail_fast(root, args.repeats)
        if 2 in args.sections:
            bench_launches(root, not args.skip_example)
        if 3 in args.sections:
            bench_keep_alive(root, args.load)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
