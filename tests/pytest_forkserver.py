"""The suite's pytest runs, forked from one interpreter that has already imported them.

Hundreds of the suite's tests start ``python -m pytest`` on a throwaway project (pytester's
``runpytest_subprocess``), and each such process paid about 1.7 s of CPU before its first test:
the interpreter and pytest (0.7 s), the plugin (0.5 s) and scipy.special at the first
comparison (0.5 s). On the 2-core CI machine the suite's wall time is its CPU work, so that
start-up was a fifth of it. Here one process per xdist worker, the *forkserver*, imports all
of it once and forks a child for each run: the child is still its own process, with its own
pid, exit status, signals, working directory, environment and file descriptors, and it runs
pytest's ``__main__`` as ``-mpytest`` would. What it shares with the others is only what a fresh
interpreter would import anyway, imported the way pytest imports it: the forkserver ran one
empty pytest session first, so the plugins were loaded through pytest's assertion rewriter (a
plugin imported behind its back would warn "Module already imported so cannot be rewritten" in
every run) and no child sees a module its fresh twin would rewrite differently.

What a child cannot be is a fresh interpreter: its hash seed, its ``sys.orig_argv`` and
``/proc/<pid>/cmdline`` and its kernel-level initial environment are the forkserver's, and the
modules are imported before the child's environment was set. The few tests whose claim is about
an interpreter's start (what a plain session imports, what it freezes) ask for a real subprocess
with the ``fresh_interpreter`` marker; ``SPECDECODE_TEST_FORKSERVER=0`` runs the whole suite the
plain way.

Run as a script, this file is the forkserver (``python pytest_forkserver.py SOCKET``); imported,
it is the client that tests/conftest.py plugs into pytester.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_HEADER = struct.Struct("!I")


# ----------------------------------------------------------------------------- the client


class ForkedRun:
    """The part of :class:`subprocess.Popen` that ``Pytester.run`` uses, for a forked run."""

    def __init__(self, connection: socket.socket, argv: list[str]) -> None:
        self._connection = connection
        self._received = b""
        self.args = argv
        self.stdin = None  # Pytester.run closes stdin when there is one; the child's is empty
        self.returncode: int | None = None
        self.pid = int(self._message(None)["pid"])

    def _message(self, timeout: float | None) -> dict[str, Any]:
        """The forkserver's next line; the socket keeps what came after it for the next."""
        self._connection.settimeout(timeout)
        while b"\n" not in self._received:
            try:
                more = self._connection.recv(1 << 12)
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0) from None
            if not more:
                self._connection.close()
                raise RuntimeError(f"the pytest forkserver went away while {self.args} ran")
            self._received += more
        line, self._received = self._received.split(b"\n", 1)
        message: dict[str, Any] = json.loads(line)
        return message

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = int(self._message(timeout)["returncode"])
            self._connection.close()
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            os.kill(self.pid, signal.SIGKILL)


class Forkserver:
    """One forkserver process, started on first use and stopped with :meth:`close`."""

    def __init__(self, preload_args: tuple[str, ...] = ()) -> None:
        """``preload_args``: what the runs add to every pytest command line (``-p no:NAME``),
        so that the empty session that preloads sees the plugins the runs will see."""
        self._preload_args = preload_args
        self._process: subprocess.Popen[bytes] | None = None
        self._folder = ""
        self._socket_path = ""

    def start(self) -> None:
        """Start the forkserver now (else at the first run), with this process's environment;
        one that has died (nothing should kill it, but a test may) is started again."""
        if self._process is not None and self._process.poll() is None:
            return
        self.close()
        self._folder = folder = tempfile.mkdtemp(prefix="pytest-forkserver-")
        self._socket_path = os.path.join(folder, "socket")
        # Its stdin is the pipe it watches: when this process goes, it goes too. Its environment
        # leaves out the test's own settings of the plugin and pytest, which the empty session
        # it starts with would read; each run gets the caller's environment anyway.
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        with open(os.path.join(folder, "log"), "wb") as log:
            self._process = subprocess.Popen(
                [sys.executable, __file__, self._socket_path, *self._preload_args],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=env,
            )
        deadline = time.monotonic() + 120
        while not os.path.exists(self._socket_path + ".ready"):
            if self._process.poll() is not None or time.monotonic() > deadline:
                log = Path(folder, "log").read_text(errors="replace")
                self.close()
                raise RuntimeError(f"the pytest forkserver did not start:\n{log}")
            time.sleep(0.02)

    def run(self, argv: list[str], env: dict[str, str], fds: tuple[int, int, int]) -> ForkedRun:
        """Start ``argv`` (``python -mpytest ...``) in a child, in this process's working
        directory, with ``env`` and ``fds`` as its stdin, stdout and stderr."""
        self.start()
        # What a child inherits from its parent and the tests set: the working directory, the
        # environment and the priority (the live-speed tests run at nice -10, tests/conftest.py).
        request = json.dumps(
            {
                "argv": argv,
                "cwd": os.getcwd(),
                "env": env,
                "nice": os.getpriority(os.PRIO_PROCESS, 0),
            }
        ).encode()
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.connect(self._socket_path)
        socket.send_fds(connection, [_HEADER.pack(len(request)) + request], list(fds))
        return ForkedRun(connection, argv)

    def close(self) -> None:
        """Stop the forkserver (runs it started go on) and remove its socket and log."""
        if self._process is not None:
            assert self._process.stdin is not None
            self._process.stdin.close()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
        if self._folder:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = ""


def is_pytest_run(argv: list[str]) -> bool:
    """Whether ``argv`` is what ``Pytester.runpytest_subprocess`` starts."""
    return len(argv) >= 2 and argv[0] == sys.executable and argv[1] == "-mpytest"


# ----------------------------------------------------------------------------- the server


def _preload(args: list[str]) -> None:
    """Import what a run of the plugin imports, the way pytest imports it: one empty session with
    the suite's inner-run plugin set, which loads the entry-point plugins through the assertion
    rewriter, and in it the plugin's modules that a run loads later (its comparison, scipy)."""
    import pkgutil

    import pytest

    class ImportTheRest:
        @pytest.hookimpl(trylast=True)
        def pytest_configure(self) -> None:
            import pytest_specdecode  # here, never before pytest has its rewriter in place

            for module in pkgutil.walk_packages(
                pytest_specdecode.__path__, prefix="pytest_specdecode."
            ):
                if not module.name.endswith("__main__"):
                    __import__(module.name)
            # scipy.special's import costs a comparing run 0.5 s (its array-API wrappers).
            import scipy.special
            import scipy.stats  # noqa: F401

    empty = tempfile.mkdtemp(prefix="pytest-forkserver-preload-")
    try:
        pytest.main(
            [*args, "-q", "-p", "no:cacheprovider", "--collect-only", empty],
            plugins=[ImportTheRest()],
        )
    finally:
        os.rmdir(empty)


def _receive(connection: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds, _flags, _address = socket.recv_fds(connection, 1 << 16, 3)
    while len(data) < _HEADER.size or len(data) < _HEADER.size + _HEADER.unpack(data[:4])[0]:
        more = connection.recv(1 << 16)
        if not more:
            raise EOFError("the client went away mid-request")
        data += more
    size = _HEADER.unpack(data[: _HEADER.size])[0]
    return json.loads(data[_HEADER.size : _HEADER.size + size]), fds


def _serve(socket_path: str) -> tuple[dict[str, Any], list[int]]:
    """Fork a child per request and report its exit status; returns only in a child."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)
    Path(socket_path + ".ready").touch()
    children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, connection)
    while True:
        ready, _, _ = select.select([listener, sys.stdin.fileno(), *children], [], [])
        if sys.stdin.fileno() in ready and not os.read(sys.stdin.fileno(), 1 << 12):
            sys.exit(0)  # the test process went away (children already started run on)
        for pidfd in [fd for fd in ready if isinstance(fd, int) and fd in children]:
            pid, connection = children.pop(pidfd)
            _, status = os.waitpid(pid, 0)
            os.close(pidfd)
            try:
                code = os.waitstatus_to_exitcode(status)
                connection.sendall(json.dumps({"returncode": code}).encode() + b"\n")
            except OSError:
                pass  # the client gave up on it (a timeout it handled)
            connection.close()
        if listener not in ready:
            continue
        connection, _ = listener.accept()
        try:
            request, fds = _receive(connection)
        except (OSError, EOFError, ValueError):
            connection.close()
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            listener.close()
            for pidfd, (_, other) in children.items():
                os.close(pidfd)
                other.close()
            connection.close()
            return request, fds
        for fd in fds:
            os.close(fd)
        children[os.pidfd_open(pid)] = (pid, connection)
        connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")


def _become(request: dict[str, Any], fds: list[int]) -> None:
    """Make this child what ``python -mpytest ARGS`` started in ``cwd`` with ``env`` would be."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.setpriority(os.PRIO_PROCESS, 0, request["nice"])
    old_pythonpath = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env: dict[str, str] = request["env"]
    os.environ.clear()
    os.environ.update(env)
    # sys.path as the interpreter builds it: the working directory (-m), PYTHONPATH, the rest.
    new_pythonpath = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    rest = sys.path[1 + len(old_pythonpath) :]
    sys.path[:] = [os.getcwd(), *(os.path.abspath(p) for p in new_pythonpath), *rest]
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    sys.argv = ["-mpytest", *request["argv"][2:]]


def main() -> None:
    # The plain interpreter's sys.path[0] is this file's folder; a child's is its cwd.
    import runpy

    socket_path, preload_args = sys.argv[1], sys.argv[2:]
    _preload(preload_args)
    request, fds = _serve(socket_path)
    _become(request, fds)
    runpy.run_module("pytest", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
