"""A simulated server started by hand, as an operator (or a colleague) would run it: in a session
of its own, outside the plugin's control. For the end-to-end tests that attach to a running
server, or that need somebody else's server on a port."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from pytest_specdecode.servers.launcher import find_free_port

TINY = ("--model-path", "/models/tiny-llm", "--tp-size", "8")
EAGLE3 = (
    *TINY,
    "--speculative-algorithm", "EAGLE3",
    "--speculative-draft-model-path", "/models/tiny-eagle3",
    "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "3", "--disable-custom-all-reduce",
)  # fmt: skip
"""The server arguments of the attach tests' ``eagle3`` profiles."""
FAST = ("--sim-speed", "50", "--sim-load-seconds", "0.2", "--sim-seed", "1")


@contextmanager
def hand_started_sim(
    *args: str,
    log: Path | None = None,
    fast: tuple[str, ...] = FAST,
    env: Mapping[str, str] | None = None,
) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """``python -m pytest_specdecode.sim ARGS`` on a free port, ready: (port, process); killed
    (its whole session) on exit. ``env``: variables added to this process's environment for
    it (an operator's exported NCCL tuning)."""
    port = find_free_port()
    argv = [sys.executable, "-m", "pytest_specdecode.sim", *args, *fast]
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    out = open(log, "wb") if log is not None else subprocess.DEVNULL  # noqa: SIM115
    try:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    finally:
        if log is not None:
            out.close()  # type: ignore[union-attr]
    try:
        _wait_ready(port, proc)
        yield port, proc
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


def _wait_ready(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """Until ``/health_generate`` answers 200. urllib, not httpx: pytester restores
    ``sys.modules`` after each of its tests, and an httpcore re-imported in between raises
    exceptions that httpx no longer maps (a refused connection escaping as httpcore's)."""
    deadline = time.monotonic() + timeout
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy
    while True:
        try:
            with opener.open(f"http://127.0.0.1:{port}/health_generate", timeout=5) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"the hand-started sim exited with code {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the hand-started sim was not ready after {timeout:g}s")
        time.sleep(0.1)
