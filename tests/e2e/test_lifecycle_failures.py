"""Servers that fail, and pytest runs that end badly, end to end.

A server that exits while loading, never becomes ready, or crashes while measured fails its
tests quickly with the exit code and the log's last lines; Ctrl-C, SIGTERM, an internal error,
a failing fixture or a killed pytest never leave a server process behind.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
from contract.sglang_sources import cache_dir, stubbed_release, write_stub_site
from pytest_runs import durations, suite_of

# where scripts/provision-sglang-client.sh put the SGLang sources (resolved before pytester
# points HOME elsewhere)
SGLANG_SOURCES_CACHE = cache_dir()

RUNS = ("--specdecode-runs", "3", "--specdecode-max-runs", "3")

PROFILES = """
[defaults]
launcher = "sim"
tp_size = 8
model_path = "/models/tiny-llm"
startup_timeout = 60
warmup_requests = 1

[profiles.nospec]
extra_args = ["--sim-speed", "50", "--sim-load-seconds", "0.2", "--sim-seed", "1"]

# Exits about a second into its load, while "capturing the target's prefill CUDA graphs"
# (speed 1: real seconds).
[profiles.dies]
extra_args = ["--sim-speed", "1", "--sim-load-seconds", "1", "--sim-fault", "exit-during-load"]

# Loads for 30 s but may take only 2.
[profiles.slow]
startup_timeout = 2
extra_args = ["--sim-speed", "1", "--sim-load-seconds", "30"]

# Loads for a minute: long enough to be interrupted while loading.
[profiles.minute]
startup_timeout = 120
extra_args = ["--sim-speed", "1", "--sim-load-seconds", "60"]

# Ready, but answers every request with HTTP 500: its warm-up request fails.
[profiles.refuses]
extra_args = ["--sim-speed", "50", "--sim-load-seconds", "0.2", "--sim-fault", "http-500"]

# Ready quickly, then killed while serving its 4th request (the first measured run).
[profiles.crashes]
extra_args = ["--sim-speed", "50", "--sim-load-seconds", "0.2", "--sim-fault", "crash-after:3"]

[workloads.fast]
prompt_set = "mixed"
max_new_tokens = 64
concurrency = 1
requests_per_run = 2
warmup_requests = 1
"""


def section(result: pytest.RunResult, test: str) -> str:
    """The failure or error report of ``test``: from its ``___ title ___`` to the next one."""
    text = result.stdout.str()
    match = re.search(
        rf"^_+ (?:ERROR at setup of )?{test} _+$(.*?)(?=^_{{3,}} |^=+ )", text, re.M | re.S
    )
    assert match is not None, text
    return match.group(1)


def server_counts(result: pytest.RunResult) -> str:
    lines = [line for line in result.outlines if line.startswith("servers: ")]
    assert len(lines) == 1, result.stdout.str()
    return lines[0]


def state_entries(project) -> dict[str, object]:
    path = project.state_dir / "servers.json"
    if not path.exists():
        return {}
    servers: dict[str, object] = json.loads(path.read_text())["servers"]
    return servers


def test_exit_during_load_fails_every_test_of_that_server_within_seconds(project):
    project.profiles(PROFILES)
    project.tests(suite_of("dies", "dies", "nospec"))
    result = project.run("--durations=0", "-vv", *RUNS)
    result.assert_outcomes(errors=2, passed=1)

    first = section(result, "test_1_dies")
    assert re.search(
        r"server 'dies' exited with code -9 after [\d.]+s while capturing the target's prefill "
        r"CUDA graphs",
        first,
    )
    tail = re.search(r"last (\d+) log lines:", first)
    assert tail is not None
    assert 0 < int(tail.group(1)) <= 50
    # The tail is the end of the server's log: its traceback and its dying words.
    assert "Capture cuda graph failed: CUDA out of memory" in first
    assert first.rstrip().endswith("It usually means the child failed.")
    # Once reported, not twice through a chained exception.
    assert "During handling of the above exception" not in result.stdout.str()

    # Detected within seconds of the exit (about 1 s into the load), not at the 60 s timeout;
    # the second test of the same server fails at once, with the same error, and no new launch.
    times = durations(result)
    assert times[("test_1_dies", "setup")] < 5.0
    assert times[("test_2_dies", "setup")] < 0.5
    assert "server 'dies' exited with code -9" in section(result, "test_2_dies")
    assert "dies launched 1, reused 0, stopped 0, failed 1" in server_counts(result)
    assert "nospec launched 1, reused 0, stopped 1" in server_counts(result)
    assert project.sim_processes() == []
    assert state_entries(project) == {}


def test_startup_timeout_fails_with_the_phase_and_the_log_tail(project):
    project.profiles(PROFILES)
    project.tests(suite_of("slow", "slow"))
    result = project.run("--durations=0", "-vv", *RUNS)
    result.assert_outcomes(errors=2)
    first = section(result, "test_1_slow")
    # The wait ends at the first poll past the timeout: on a loaded CI box that poll can end
    # past 2.5 s, which the message rounds to "3s" (it says how long it waited, not the bound).
    assert re.search(
        r"server 'slow' was not ready after [23]s \(startup_timeout 2s\); last phase: loading "
        r"the target model's weights\. Raise the profile's startup_timeout",
        first,
    )
    assert re.search(r"server log: \S+/slow-[\d-]+\.log", first)
    assert re.search(r"last \d+ log lines:", first)
    assert "Load weight begin" in first
    times = durations(result)
    assert 2.0 <= times[("test_1_slow", "setup")] < 10.0
    assert times[("test_2_slow", "setup")] < 0.5
    # The server that was still loading is killed, not left to finish its load.
    assert "slow launched 1, reused 0, stopped 0, failed 1" in server_counts(result)
    assert project.sim_processes() == []


def test_a_failed_warm_up_fails_that_server_and_stops_it(project):
    project.profiles(PROFILES)
    project.tests(suite_of("refuses", "refuses", "nospec"))
    result = project.run("--durations=0", "-vv", *RUNS)
    result.assert_outcomes(errors=2, passed=1)
    first = section(result, "test_1_refuses")
    assert re.search(
        r"server 'refuses' was ready after [\d.]+s, but its warm-up request failed: workload "
        r"'inline', run 1, request 1 of 1 \(code prompt\): http://127\.0\.0\.1:\d+/generate: "
        r"HTTP 500 Internal Server Error",
        first,
    )
    assert re.search(r"server log: \S+/refuses-[\d-]+\.log", first)
    assert "last " in first
    second = section(result, "test_2_refuses")
    assert "server 'refuses' was ready after" in second
    assert durations(result)[("test_2_refuses", "setup")] < 0.5
    # Stopped at once, not left running until the end of the session (or forever).
    assert "refuses launched 1, reused 0, stopped 0, failed 1" in server_counts(result)
    assert project.sim_processes() == []
    assert state_entries(project) == {}


def test_crash_while_measured_fails_that_test_and_later_ones_fast(project):
    project.profiles(PROFILES)
    project.tests(suite_of("crashes", "crashes", "nospec"))
    result = project.run("--durations=0", "-vv", *RUNS)
    result.assert_outcomes(failed=1, errors=1, passed=1)

    first = section(result, "test_1_crashes")
    assert re.search(
        r"server 'crashes' died during run 1 \(exit code -9\); the request failed", first
    )
    # The run is counted the same way twice in one message (#12, item 8: it said run 1, run 0).
    assert re.search(r"died during run 1 .*the request failed with: workload 'fast', run 1,", first)
    assert re.search(r"last \d+ log lines:", first)
    assert "--sim-fault crash-after:3" in first  # the log's first line: the command
    # The message appears once: no chain of "direct cause" / "during handling" repeats.
    output = result.stdout.str()
    assert "During handling of the above exception" not in output
    assert "The above exception was the direct cause" not in output
    assert len(re.findall(r"last \d+ log lines:", first)) == 1

    second = section(result, "test_2_crashes")
    assert "server 'crashes' died during run 1 (exit code -9)" in second
    times = durations(result)
    assert times[("test_1_crashes", "call")] < 5.0
    assert times[("test_2_crashes", "setup")] < 0.5
    assert "crashes launched 1, reused 0, stopped 0, failed 1" in server_counts(result)
    assert project.sim_processes() == []


class _Reader:
    """Collects a process's output lines in a thread; ``wait_for`` a line matching a regex."""

    def __init__(self, stream) -> None:
        self.lines: list[str] = []
        self._stream = stream
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if re.search(pattern, line):
                    return line
            time.sleep(0.05)
        raise AssertionError(f"no line matching {pattern!r} in:\n" + "\n".join(self.lines))

    def text(self) -> str:
        """Everything, once the process has exited (closes the pipe)."""
        self._thread.join(timeout=10)
        self._stream.close()
        return "\n".join(self.lines)


def start_pytest(project, *args: str) -> tuple[subprocess.Popen[str], _Reader]:
    # The environment pytester's own runs get (it puts its directory first on PYTHONPATH): a
    # server launched with another PYTHONPATH is another build, which the next run would not
    # reuse.
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", *args],
        cwd=project.path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return proc, _Reader(proc.stdout)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_the_load_leaves_no_process(project, signum):
    project.profiles(PROFILES)
    project.tests(suite_of("minute"))
    proc, out = start_pytest(project, *RUNS)
    try:
        # The live progress line: elapsed time, timeout and the phase read from the log.
        out.wait_for(
            r"^specdecode: server 'minute' loading\.\.\. \d+s \(timeout 120s\), "
            r"phase: loading the target model's weights$",
            timeout=30,
        )
        assert len(project.sim_processes()) == 1
        proc.send_signal(signum)
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        text = out.text()  # closes the pipe on every path: left to gc, it fails a later test
    assert code == pytest.ExitCode.INTERRUPTED, text
    assert "KeyboardInterrupt" in text
    assert project.sim_processes() == []
    assert state_entries(project) == {}


def test_a_failing_fixture_leaves_no_process(project):
    project.profiles(PROFILES)
    project.pytester.makeconftest(
        """
        import pytest

        @pytest.fixture
        def broken(specdecode_server):
            raise RuntimeError("a fixture failed after the server started")
        """
    )
    project.tests(
        """
        import pytest

        @pytest.mark.specdecode("nospec", workload="fast")
        def test_uses_broken(broken): pass
        """
    )
    result = project.run(*RUNS)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*RuntimeError: a fixture failed after the server started"])
    assert "nospec launched 1, reused 0, stopped 1" in server_counts(result)
    assert project.sim_processes() == []
    assert state_entries(project) == {}


def test_an_internal_error_leaves_no_process(project):
    project.profiles(PROFILES)
    project.pytester.makeconftest(
        """
        def pytest_runtest_logreport(report):
            if report.when == "call":
                raise RuntimeError("a plugin broke")
        """
    )
    project.tests(suite_of("nospec", "nospec"))
    result = project.run(*RUNS)
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR
    result.stdout.fnmatch_lines(["INTERNALERROR*RuntimeError: a plugin broke"])
    assert any(line.startswith("specdecode: nospec: starting") for line in result.outlines)
    assert project.sim_processes() == []
    assert state_entries(project) == {}


def test_a_server_orphaned_by_a_killed_pytest_is_adopted_and_stopped_later(project):
    project.profiles(PROFILES)
    started = project.path / "started"
    project.tests(
        f"""
        import pathlib, time
        import pytest

        @pytest.mark.specdecode("nospec", workload="fast")
        def test_hangs():
            pathlib.Path({str(started)!r}).write_text("x")
            time.sleep(60)
        """
    )
    proc, out = start_pytest(project, *RUNS)
    try:
        deadline = time.monotonic() + 30
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), "\n".join(out.lines)
        proc.kill()  # SIGKILL: no cleanup can run in that process
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out.text()
    orphans = project.sim_processes()
    assert len(orphans) == 1  # its server survives it (it leads its own process group)

    project.tests(suite_of("nospec"))
    result = project.run(*RUNS)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["specdecode: nospec: reusing the running server at *"])
    assert "nospec launched 0, reused 1, stopped 1" in server_counts(result)
    assert project.sim_processes() == []
    assert state_entries(project) == {}


def test_a_flag_the_servers_sglang_rejects_fails_in_the_preflight_without_a_load(
    project, monkeypatch, tmp_path
):
    # SGLang 0.5.23's real argument parser (its own sources, third-party modules stubbed: see
    # tests/contract/sglang_sources.py) stands in for the GPU box's SGLang. --stream-output
    # existed up to 0.5.19 and is gone in 0.5.23: a 900-second load would die of it at its end
    # of imports; the preflight says so before anything starts.
    monkeypatch.setenv("SPECDECODE_CACHE", str(SGLANG_SOURCES_CACHE))  # pytester moved HOME
    site = tmp_path / "site"
    site.mkdir()
    release = stubbed_release("0.5.23", write_stub_site(site))
    # The profile's interpreter: this Python with that SGLang on its path (pytest itself must
    # not see the stubs).
    python = tmp_path / "sglang-python"
    python.write_text(
        "#!/bin/sh\n"
        f"export PYTHONPATH={release.env['PYTHONPATH']} SGLANG_SRC={release.env['SGLANG_SRC']}\n"
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    project.profiles(
        PROFILES
        + f"""
        [profiles.old-flag]
        launcher = "sglang"
        python = "{python}"
        model_path = "/models/tiny-llm"
        startup_timeout = 600
        extra_args = ["--stream-output"]
        """
    )
    project.tests(suite_of("old-flag"))
    started = time.monotonic()
    result = project.run(*RUNS)
    took = time.monotonic() - started
    result.assert_outcomes(errors=1)
    text = section(result, "test_1_old_flag")
    assert re.search(
        r"server 'old-flag' was not launched: SGLang 0\.5\.23 \(.*python.*\) rejects the launch "
        r"command: .*unrecognized arguments: --stream-output\. Fix the flag",
        text,
    ), text
    assert "--specdecode-skip-preflight" in text
    assert server_counts(result) == "servers: old-flag launched 0, reused 0, stopped 0, failed 1"
    assert took < 60  # seconds, not a load's startup timeout
