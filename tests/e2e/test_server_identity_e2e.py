"""The server measured is the one launched, and a reused server is the same launch (issue 12.1).

Real pytest subprocesses against real simulated servers: a fixed port that another server
already answers on, a kept server of another build (an injected regression in the environment),
two sessions of one profile with different builds at the same time.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from hand_started import TINY, hand_started_sim

FAST = '["--sim-speed", "50", "--sim-load-seconds", "0.2", "--sim-seed", "1"]'
RUNS = ("--specdecode-runs", "3", "--specdecode-max-runs", "3")

PROFILES = """
[defaults]
launcher = "sim"
tp_size = 8
model_path = "/models/tiny-llm"
startup_timeout = 30
warmup_requests = 1
{port}

[profiles.nospec]
extra_args = {fast}

[workloads.fast]
prompt_set = "mixed"
max_new_tokens = 64
concurrency = 1
requests_per_run = 2
warmup_requests = 1
"""

ONE_TEST = """
import pytest

@pytest.mark.specdecode("nospec", workload="fast")
def test_nospec(): pass
"""

# Holds the server for a few seconds after measuring, so that another session starts meanwhile.
SLOW_TEST = """
import time, pytest

@pytest.mark.specdecode("nospec", workload="fast")
def test_nospec(specdecode):
    specdecode.measure()
    time.sleep({seconds})
"""


@pytest.fixture
def squatter() -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """Another simulated server, same arguments, half the speed, started by someone else on a
    port of its own: (port, process)."""
    with hand_started_sim(*TINY, fast=("--sim-speed", "25", "--sim-load-seconds", "0.2")) as found:
        yield found


def test_a_fixed_port_another_server_answers_on_is_an_error_naming_it(project, squatter):
    port, other = squatter
    project.profiles(PROFILES.format(port=f"port = {port}", fast=FAST))
    project.tests(ONE_TEST)
    started = time.monotonic()
    result = project.run(*RUNS)
    took = time.monotonic() - started
    result.assert_outcomes(errors=1)
    out = result.stdout.str()
    assert f"port = {port}" in out
    assert "is already in use by" in out
    assert f"pid {other.pid} (" in out
    assert "pytest_specdecode.sim" in out
    assert "starting (sim)" not in out  # nothing was launched, nothing measured
    assert "PASSED" not in out
    assert took < 30
    # Somebody else's server (it inherited the state dir's variable): never stopped by us, and
    # nothing else runs.
    assert project.sim_processes() == [other.pid]


def kept_pid(result: pytest.RunResult) -> int:
    match = re.search(
        r"nospec: left running for the next session at http://[^:]+:(\d+)", result.stdout.str()
    )
    assert match, result.stdout.str()
    port = int(match.group(1))
    for pid in pids_of_sims():
        if f"--port {port}" in cmdline(pid):
            return pid
    raise AssertionError(f"no sim on port {port}")


def pids_of_sims() -> list[int]:
    return [
        int(entry)
        for entry in os.listdir("/proc")
        if entry.isdigit() and "pytest_specdecode.sim" in cmdline(int(entry))
    ]


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_a_kept_server_of_another_build_is_not_reused(project):
    project.profiles(PROFILES.format(port="", fast=FAST))
    project.tests(ONE_TEST)
    first = project.run("--specdecode-keep-server", *RUNS)
    first.assert_outcomes(passed=1)
    old = kept_pid(first)

    # Same profile, same fingerprint, but a regression injected into the server's environment:
    # the kept server does not have it, so measuring that server would hide it.
    second = project.run_with_env({"SPECDECODE_SIM_SLOWDOWN": "2"}, *RUNS)
    out = second.stdout.str()
    assert "nospec: not reusing the server at" in out
    assert "another build (environment SPECDECODE_SIM_SLOWDOWN)" in out
    assert "reusing the running server" not in out
    assert "nospec launched 1, reused 0" in out
    # The old one was idle and would never be reused by this build: stopped, not leaked.
    assert old not in project.sim_processes()
    assert project.sim_processes() == []


def test_the_same_build_still_reuses_the_kept_server(project):
    project.profiles(PROFILES.format(port="", fast=FAST))
    project.tests(ONE_TEST)
    project.run_with_env({"SPECDECODE_SIM_SLOWDOWN": "2"}, "--specdecode-keep-server", *RUNS)
    second = project.run_with_env({"SPECDECODE_SIM_SLOWDOWN": "2"}, *RUNS)
    second.stdout.fnmatch_lines(["*nospec: reusing the running server at*"])
    assert "nospec launched 0, reused 1" in second.stdout.str()


def test_two_sessions_of_one_profile_with_different_builds_never_share_a_server(project):
    project.profiles(PROFILES.format(port="", fast=FAST))
    project.tests(SLOW_TEST.format(seconds=8), name="test_slow")
    env = {**os.environ, "PYTEST_SPECDECODE_STATE_DIR": str(project.state_dir)}
    # `with`: the pipe is closed on every path (left to gc, it fails a later test)
    with subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_slow.py", *RUNS],
        cwd=project.path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as first:
        try:
            deadline = time.monotonic() + 60
            while (
                not (project.state_dir / "servers.json").exists()
                or '"ready"' not in (project.state_dir / "servers.json").read_text()
            ):
                assert time.monotonic() < deadline
                assert first.poll() is None
                time.sleep(0.2)
            project.tests(ONE_TEST, name="test_other")
            second = project.run_with_env({"SPECDECODE_SIM_SLOWDOWN": "2"}, "test_other.py", *RUNS)
            second.assert_outcomes(passed=1)
            out = second.stdout.str()
            assert "nospec launched 1, reused 0" in out
            # (pytester's runs set PYTHONPATH as well, which is a difference of build too)
            assert re.search(r"another build \(environment [^)]*SPECDECODE_SIM_SLOWDOWN", out), out
            first_out, _ = first.communicate(timeout=120)
        finally:
            if first.poll() is None:
                first.kill()
    assert first.returncode == 0, first_out
    assert "nospec launched 1, reused 0" in first_out  # its server was never taken away
    assert project.sim_processes() == []
