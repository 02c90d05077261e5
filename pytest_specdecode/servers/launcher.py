"""The launcher protocol and the small network helpers every launcher needs."""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pytest_specdecode.redaction import is_secret_flag, redact_url
from pytest_specdecode.servers.ports import claim

# What a launcher records in the pool's state file so that a later pytest session (or another
# xdist worker) can find, check and stop the same server: {"kind": "subprocess", "pid": ...} or
# {"kind": "docker", "container_id": ...}. JSON-shaped on purpose.
ServerIdentity = dict[str, Any]


@runtime_checkable
class Launcher(Protocol):
    """Starts one server and owns it until :meth:`stop`.

    ``start`` returns as soon as the process or container exists; waiting for readiness is the
    job of :mod:`pytest_specdecode.servers.readiness`, which polls :meth:`exit_code` to notice a
    crash.
    """

    kind: str
    log_path: Path

    @property
    def base_url(self) -> str: ...

    def start(self) -> None: ...

    def exit_code(self) -> int | None:
        """The exit code once the server has exited, ``None`` while it runs."""
        ...

    def stop(self, grace: float = 30.0) -> None:
        """Stop the server and everything it started; idempotent; waits until the port is free."""
        ...

    def identity(self) -> ServerIdentity: ...

    def serves_port(self) -> bool | None:
        """Whether the process listening on the server's port is this launch's (``True``),
        another's or nobody's (``False``), or cannot be told from here (``None``): a 200 on the
        port proves only that *a* server is ready there
        (:mod:`pytest_specdecode.servers.ports`)."""
        ...


def redact_argv(argv: Sequence[str]) -> list[str]:
    """The command line as it may be logged: values of credential flags (``--api-key``,
    ``--admin-api-key``, ``--hf-token``, ...; :func:`~pytest_specdecode.redaction.is_secret_flag`)
    replaced by ``***``, and the user info of any URL in it by ``<redacted>``."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        flag, eq, _ = arg.partition("=")
        secret_flag = flag.startswith("-") and is_secret_flag(flag)
        if hide_next:
            out.append("***")
            hide_next = False
        elif secret_flag and not eq:
            out.append(arg)
            hide_next = True
        elif eq and secret_flag:
            out.append(f"{flag}=***")
        else:
            out.append(redact_url(arg))
    return out


def find_free_port(
    host: str = "127.0.0.1",
    *,
    port_range: tuple[int, int] | None = None,
    derived: Callable[[int], Sequence[int]] = lambda port: (),
    avoid: Collection[int] = (),
    attempts: int = 200,
) -> int:
    """A port that is free now: from the OS's ephemeral range, or a random one in
    ``port_range`` (inclusive) for which every port ``derived(port)`` is free as well and none
    is in ``avoid`` (ports other servers of this machine were given), claimed for this launch
    machine-wide (:func:`~pytest_specdecode.servers.ports.claim`): no other session of the
    plugin on this machine is handed it while the server that gets it starts.

    A program that is not this plugin can still bind the port between this check and the server
    binding it (SGLang binds its HTTP port last, after the load): that shows up as the server's
    own "address already in use" exit, reported with its log.
    """
    if port_range is None:
        for _ in range(attempts):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((host, 0))
                port: int = sock.getsockname()[1]
            if claim(port):
                return port
        raise OSError(f"no free port on {host} that another launch has not claimed")
    low, high = port_range
    rng = random.SystemRandom()
    for _ in range(attempts):
        port = rng.randint(low, high)
        ports = [port, *derived(port)]
        if any(p in avoid or not 0 < p < 65536 for p in ports):
            continue
        if all(_bindable(host, p) for p in ports) and all(claim(p) for p in ports):
            return port
    raise OSError(
        f"no free port in {low}-{high} on {host} after {attempts} tries (with the ports the "
        "server derives from it, and none that another launch on this machine has claimed); "
        "free some, or set the profile's port"
    )


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host if host not in ("0.0.0.0", "") else "127.0.0.1", port)) == 0


def wait_port_free(
    host: str,
    port: int,
    timeout: float = 30.0,
    *,
    ours: Callable[[], bool | None] | None = None,
) -> bool:
    """Wait until nothing accepts connections on ``host:port``; ``False`` on timeout.

    A server's orphaned children can hold the port after the parent died (sglang-api.md §7.2-3),
    so a launcher only reports a server stopped once its port is free. ``ours`` says whether
    the stopped server's processes still listen there (``None``: cannot tell): once it says
    ``False``, whoever holds the port is somebody else (a server that took the port while ours
    loaded), and waiting for it would only cost the timeout.
    """
    deadline = time.monotonic() + timeout
    while port_in_use(host, port):
        if ours is not None and ours() is False:
            return False
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True
