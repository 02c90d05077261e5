"""Who holds a TCP port on this machine: the proof that the server answering is ours.

A 200 from ``http://127.0.0.1:PORT/health_generate`` says that *a* server is ready there, not
that it is the one just launched: with a fixed ``port`` another server (a colleague's, a kept
one of another build) can answer while ours is still loading, and would be measured in its
place. Linux says who listens: ``/proc/net/tcp{,6}`` lists listening sockets by port with their
inode, and ``/proc/PID/fd`` links name the inodes each process holds. A launched server leads
its own session (``start_new_session``), so the listener is ours exactly when a process of that
session holds the socket.

Without ``/proc`` (macOS) nothing can be proven; callers say so instead of guessing.

Before that, a port has to be chosen that no other launch is about to take: :func:`claim`.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_PROC = Path("/proc")
_LISTEN = "0A"  # the TCP state LISTEN in /proc/net/tcp

# -- claiming a port for a launch ----------------------------------------------------------------
#
# A free port is chosen some time before the server binds it: the interpreter's start and, for
# SGLang, the whole load (the simulated server too keeps the port closed while "loading"). Two
# launches that choose in that window can be handed the same port, and the later server dies of
# "address already in use". Sessions that share a state directory never do (the choice and its
# record are one step under the state file's lock), but sessions with different state
# directories do: two users of one box, CI jobs with their own HOME, the plugin's own test suite
# (one state directory per test, dozens of servers starting at once on three xdist workers).
#
# So a launch also claims its port machine-wide, where every session sees it whatever its state
# directory or user: an abstract Unix socket named after the port (Linux; the abstract namespace
# belongs to the network namespace, exactly where the TCP port lives). Binding the name is
# atomic, and the kernel drops it when the process that holds it exits, so a killed session
# leaves no claim behind. A process keeps its last CLAIMS_KEPT claims: a process launches one
# server at a time, and by the time it has chosen that many more ports the server that wanted an
# old one has bound it or is gone (the port checks then speak for it).

CLAIM_PREFIX = "pytest-specdecode.port."
CLAIMS_KEPT = 32
_claims: OrderedDict[int, socket.socket] = OrderedDict()
_claims_lock = threading.Lock()


def claims_available() -> bool:
    """Whether this machine has the abstract socket namespace that :func:`claim` uses."""
    return sys.platform.startswith("linux")


def claim(port: int) -> bool:
    """Claim ``port`` for a launch by this process: ``False`` when another process holds a claim
    on it (another session is about to start a server there), ``True`` otherwise. A port this
    process claimed before is claimed again (its earlier server has bound it or is gone: the
    caller checks that the port is free). Without the abstract namespace (not Linux) every port
    counts as claimed, as before there were claims."""
    if not claims_available():
        return True
    with _claims_lock:
        held = _claims.get(port)
        if held is not None:
            _claims.move_to_end(port)
            return True
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # not inherited by children
        try:
            sock.bind(f"\0{CLAIM_PREFIX}{port}")
        except OSError as exc:
            sock.close()
            # taken by another process; any other error: no claims here (a sandbox without Unix
            # sockets), so the port counts as claimed, as without /proc
            return exc.errno != errno.EADDRINUSE
        _claims[port] = sock
        while len(_claims) > CLAIMS_KEPT:
            _, oldest = _claims.popitem(last=False)
            oldest.close()
        return True


def release_claims() -> None:
    """Drop every claim of this process (its exit does the same)."""
    with _claims_lock:
        while _claims:
            _, sock = _claims.popitem()
            sock.close()


@dataclass(frozen=True)
class Listener:
    """A process listening on the port (``pid`` None: the socket's owner is not visible to
    this user)."""

    pid: int | None
    uid: int
    cmdline: str | None = None
    session: int | None = None

    def describe(self) -> str:
        if self.pid is None:
            return f"a process of uid {self.uid} this user cannot see"
        what = self.cmdline or "?"
        if len(what) > 160:
            what = what[:157] + "..."
        return f"pid {self.pid} ({what})"


def proc_available() -> bool:
    return (_PROC / "net" / "tcp").exists()


def listeners(port: int) -> list[Listener] | None:
    """The processes listening on ``port`` (any address), or ``None`` without ``/proc``."""
    if not proc_available():
        return None
    sockets = _listening_inodes(port)
    if not sockets:
        return []
    found: dict[int, int] = {}
    for pid in _pids():
        for inode in _socket_inodes(pid):
            if inode in sockets and inode not in found:
                found[inode] = pid
        if len(found) == len(sockets):
            break
    out = []
    for inode, uid in sockets.items():
        holder = found.get(inode)
        if holder is None:
            out.append(Listener(pid=None, uid=uid))
        else:
            out.append(
                Listener(
                    pid=holder, uid=uid, cmdline=process_cmdline(holder), session=_session(holder)
                )
            )
    return out


def session_holds_port(session: int, port: int) -> bool | None:
    """Whether the processes of session ``session`` hold every socket listening on ``port``:
    ``True`` ours, ``False`` somebody else's (or nobody's: the listener left), ``None`` when
    this machine cannot tell. Every socket: with ``SO_REUSEPORT`` another server could share
    the port and take some of the connections."""
    if not proc_available():
        return None
    sockets = set(_listening_inodes(port))
    if not sockets:
        return False
    for pid in _pids():
        if _session(pid) == session:
            sockets -= set(_socket_inodes(pid))
            if not sockets:
                return True
    return False


def session_listens(session: int, port: int) -> bool | None:
    """Whether any process of session ``session`` still listens on ``port`` (a stopped
    server's children that have not let go yet); ``None`` when this machine cannot tell."""
    if not proc_available():
        return None
    sockets = set(_listening_inodes(port))
    if not sockets:
        return False
    return any(_session(pid) == session and sockets & set(_socket_inodes(pid)) for pid in _pids())


def pids_hold_port(pids: Iterable[int], port: int) -> bool | None:
    """Whether ``pids`` (a container's processes, as the engine lists them) hold every socket
    listening on ``port``; ``None`` when this machine cannot tell."""
    if not proc_available():
        return None
    sockets = set(_listening_inodes(port))
    if not sockets:
        return False
    for pid in pids:
        sockets -= set(_socket_inodes(pid))
    return not sockets


def describe_holders(port: int) -> str:
    """``pid 123 (python -m http.server 30000)`` for the message about a port in use."""
    found = listeners(port)
    if found is None:
        return "a process this machine cannot name (no /proc)"
    if not found:
        return "a process that accepts connections but is not listed as listening"
    return ", ".join(dict.fromkeys(listener.describe() for listener in found))


def process_cmdline(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def _listening_inodes(port: int) -> dict[int, int]:
    """inode -> uid of every socket listening on ``port``, IPv4 and IPv6."""
    out: dict[int, int] = {}
    for table in ("tcp", "tcp6"):
        try:
            lines = (_PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port:
                out[int(fields[9])] = int(fields[7])
    return out


def _pids() -> list[int]:
    try:
        return [int(name) for name in os.listdir(_PROC) if name.isdigit()]
    except OSError:
        return []


def _socket_inodes(pid: int) -> list[int]:
    fd_dir = _PROC / str(pid) / "fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:  # gone, or another user's
        return []
    out = []
    for name in names:
        try:
            target = os.readlink(fd_dir / name)
        except OSError:
            continue
        if target.startswith("socket:["):
            out.append(int(target[8:-1]))
    return out


def proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state, ppid, pgrp, session,
    ...), or ``None`` when the process is gone or unreadable. The name is in parentheses and may
    itself hold spaces or parentheses, so the fields start after the last ``)``."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def _session(pid: int) -> int | None:
    fields = proc_stat(pid)
    return int(fields[3]) if fields else None
