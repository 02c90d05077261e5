"""The suite's harness: a pytester run forked from the forkserver (tests/pytest_forkserver.py) is,
for everything the suite's tests read, the run a fresh ``python -mpytest`` would have been."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from pytest_forkserver import Forkserver

PROBE = """
import json, os, sys

def test_probe(pytestconfig):
    with open("/proc/self/cmdline", "rb") as fh:
        cmdline = fh.read().decode()
    seen = {
        "pid": os.getpid(),
        "cwd": os.getcwd(),
        "sys_path_0": sys.path[0],
        "pythonpath": os.environ["PYTHONPATH"].split(os.pathsep)[0],
        "variable": os.environ.get("FORKSERVER_PROBE"),
        "gone": os.environ.get("FORKSERVER_PROBE_GONE"),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "argv": sys.argv[1:],
        "stdin": os.read(0, 64).decode(),
        "plugin": pytestconfig.pluginmanager.has_plugin("specdecode"),
        "forked": "pytest_forkserver.py" in cmdline,
    }
    with open("seen.json", "w") as fh:
        json.dump(seen, fh)
    print("stdout of the probe")
    sys.stderr.write("stderr of the probe\\n")
    assert os.environ.get("FORKSERVER_PROBE_FAIL") is None
"""

FORKED = pytest.param(False, id="forked")
FRESH = pytest.param(True, id="fresh", marks=pytest.mark.fresh_interpreter)


@pytest.mark.parametrize("fresh", [FORKED, FRESH])
def test_a_run_sees_what_a_fresh_pytest_would(
    fresh: bool, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_probe=PROBE)
    monkeypatch.setenv("FORKSERVER_PROBE", "set by this test")

    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "-s", timeout=120)

    result.assert_outcomes(passed=1)
    seen = json.loads(Path(pytester.path, "seen.json").read_text())
    assert seen["forked"] is not fresh
    assert seen["pid"] != os.getpid()
    assert seen["cwd"] == seen["sys_path_0"] == seen["pythonpath"] == str(pytester.path)
    assert seen["variable"] == "set by this test"
    assert seen["nice"] == os.getpriority(os.PRIO_PROCESS, 0)
    assert seen["argv"][0].startswith("--basetemp=")
    assert seen["argv"][1:] == ["-p", "no:cacheprovider", "-q", "-s"]
    assert seen["stdin"] == ""
    assert seen["plugin"] is True
    result.stdout.fnmatch_lines(["*stdout of the probe*"])
    result.stderr.fnmatch_lines(["stderr of the probe"])
    # The plugins were imported through pytest's assertion rewriter, as a fresh run imports them.
    assert "already imported" not in result.stdout.str() + result.stderr.str()


def run_directly(server: Forkserver, argv: list[str], env: dict[str, str]) -> int:
    """``argv`` through ``server`` itself, its output in ./out; the exit status."""
    with open(os.devnull, "rb") as empty, open("out", "w") as out:
        return server.run(argv, env, (empty.fileno(), out.fileno(), out.fileno())).wait(120)


def test_a_child_has_its_callers_environment_not_the_forkservers(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the forkserver's environment had when it started and the caller's no longer has is
    gone in the child, as in a process started with the caller's environment."""
    pytester.makepyfile(test_probe=PROBE)
    monkeypatch.setenv("FORKSERVER_PROBE_GONE", "the forkserver's")
    server = Forkserver()
    try:
        server.start()  # with the variable
        monkeypatch.delenv("FORKSERVER_PROBE_GONE")
        env = {**os.environ, "PYTHONPATH": str(pytester.path)}
        argv = [sys.executable, "-mpytest", "-p", "no:cacheprovider", "-q"]
        returncode = run_directly(server, argv, env)
    finally:
        server.close()
    assert returncode == 0, Path("out").read_text()
    seen = json.loads(Path(pytester.path, "seen.json").read_text())
    assert seen["forked"] is True
    assert seen["gone"] is None
    assert seen["cwd"] == seen["sys_path_0"] == str(pytester.path)


@pytest.mark.parametrize("fresh", [FORKED, FRESH])
def test_a_failing_run_exits_as_pytest_does(
    fresh: bool, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_probe=PROBE)
    monkeypatch.setenv("FORKSERVER_PROBE_FAIL", "1")

    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", timeout=120)

    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(failed=1)
    # pytest rewrote the test's assert, as in a fresh run
    result.stdout.fnmatch_lines(["E       AssertionError: assert '1' is None"])


HANGS = """
import os, time

def test_hangs():
    with open("pid", "w") as fh:
        fh.write(str(os.getpid()))
    time.sleep(120)
"""


@pytest.mark.parametrize("fresh", [FORKED, FRESH])
def test_a_run_past_its_timeout_is_killed(fresh: bool, pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_hangs=HANGS)
    started = time.monotonic()

    # 20 s, not 5: a fresh interpreter at nice 19 beside the live-speed tests, on a loaded
    # machine, had not yet reached the hanging test (no pid file) when 5 s were up (CI run of
    # 2026-12-06); the test sleeps 120 s, so it is still a run past its timeout that is killed
    with pytest.raises(pytester.TimeoutExpired):
        pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=20)

    assert time.monotonic() - started < 60
    pid = int(Path(pytester.path, "pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_forkserver_that_died_is_started_again(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_probe=PROBE)
    server = Forkserver()
    argv = [sys.executable, "-mpytest", "-p", "no:cacheprovider", "-q"]
    env = {**os.environ, "PYTHONPATH": str(pytester.path)}
    try:
        server.start()
        assert server._process is not None
        first = server._process.pid
        server._process.kill()
        server._process.wait()
        returncode = run_directly(server, argv, env)
        assert server._process.pid != first
    finally:
        server.close()
    assert returncode == 0, Path("out").read_text()
