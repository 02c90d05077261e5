"""Local servers: ``python -m sglang.launch_server`` (launcher ``sglang``) and the simulated
server ``python -m pytest_specdecode.sim`` (launcher ``sim``) go through the same code path.

The server starts in a new session, so it leads its own process group: SGLang forks a scheduler
per TP rank and a detokenizer, and killing only the parent orphans them with the GPU memory and
the port still held (sglang-api.md §7.2). Stop = SIGTERM to the group, SIGKILL after a grace
period, then wait until the port is free. Output goes straight to a file, not a pipe, so a server
kept alive after pytest exits never blocks on a full pipe or dies of SIGPIPE.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pytest_specdecode.errors import ServerStartError
from pytest_specdecode.servers.launcher import ServerIdentity, redact_argv, wait_port_free
from pytest_specdecode.servers.ports import proc_stat, session_holds_port, session_listens


class SubprocessLauncher:
    """One local server process (and its process group)."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        host: str,
        port: int,
        log_path: Path,
        kind: str = "subprocess",
        cwd: Path | None = None,
    ) -> None:
        self.argv = list(argv)
        self.env = dict(env)
        self.host = host
        self.port = port
        self.log_path = log_path
        self.kind = kind
        self.cwd = cwd
        self._proc: subprocess.Popen[bytes] | None = None
        self._stopped = False

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> None:
        if self._proc is not None:
            raise RuntimeError(f"{self.argv[:3]} was already started (pid {self._proc.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            log.write(f"$ {' '.join(redact_argv(self.argv))}\n".encode())
            log.flush()
            try:
                self._proc = subprocess.Popen(
                    self.argv,
                    env=self.env,
                    cwd=self.cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as exc:  # the factory checked it, but a file can vanish or lose +x
                raise ServerStartError(
                    f"cannot run {self.argv[0]!r} ({exc.strerror}); check the profile's "
                    "python or binary setting, or that the file is still there",
                    log_path=str(self.log_path),
                ) from None

    def exit_code(self) -> int | None:
        if self._proc is None:
            return None
        code = self._proc.poll()
        return code

    def stop(self, grace: float = 30.0) -> None:
        if self._proc is None or self._stopped:
            return
        self._stopped = True
        stop_process_group(self._proc.pid, grace=grace, wait=self._proc.wait)
        pid, port = self._proc.pid, self.port
        wait_port_free(self.host, port, timeout=30.0, ours=lambda: session_listens(pid, port))

    def serves_port(self) -> bool | None:
        if self._proc is None:
            return None
        # start_new_session: the server leads a session whose id is its pid, and its children
        # (SGLang's schedulers, the detokenizer) stay in it.
        return session_holds_port(self._proc.pid, self.port)

    def identity(self) -> ServerIdentity:
        return {
            "kind": self.kind,
            "pid": self.pid,
            "host": self.host,
            "port": self.port,
            "argv0": " ".join(self.argv[:3]),
        }


def stop_process_group(
    pgid: int,
    *,
    grace: float,
    wait: Callable[..., object] | None = None,
) -> None:
    """SIGTERM the process group ``pgid``; SIGKILL whatever is left after ``grace`` seconds.

    ``wait`` is ``Popen.wait`` when we are the parent, so the leader is reaped instead of left a
    zombie; for a server started by an earlier pytest session we can only poll.
    """
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if wait is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                wait(timeout=0.1)
        else:
            time.sleep(0.1)
        if not group_alive(pgid):
            break
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    if wait is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            wait(timeout=5.0)
    deadline = time.monotonic() + 5.0
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)


def group_alive(pgid: int) -> bool:
    """Whether any non-zombie process is left in the process group."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not _HAVE_PROC:
        return True  # without /proc (macOS) trust killpg; our own leader is reaped by wait()
    # killpg(0) also succeeds for zombies; look for a live member before saying yes.
    return any(_state(pid) not in ("Z", "X", None) for pid in _group_members(pgid))


_HAVE_PROC = os.path.isdir("/proc/self")


def process_alive(pid: int) -> bool:
    if not _HAVE_PROC:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return _state(pid) not in ("Z", "X", None)


def _state(pid: int) -> str | None:
    fields = proc_stat(pid)
    return fields[0] if fields else None


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := proc_stat(int(entry))) and int(fields[2]) == pgid:
            members.append(int(entry))
    return members
