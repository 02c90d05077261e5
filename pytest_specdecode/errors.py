"""The exceptions pytest-specdecode raises.

Every message names the bad value, where it came from and what to do about it.

    SpecdecodeError
    ├── ConfigError            a profile file, an option, an ini key or a marker is wrong
    ├── ServerError            a server could not be started, reached or trusted
    │   ├── ServerStartError   the process or container exited while loading
    │   │   └── EngineUnreachableError   the Docker engine does not answer
    │   ├── ServerTimeoutError not ready within the startup timeout
    │   ├── ServerMismatchError
    │   │                      an attached server runs another configuration
    │   ├── ServerCrashedError the server died while it was being measured
    │   ├── ServerHungError    it is alive but stopped answering (frozen after ready, no token)
    │   └── AttachError        --server-host is not a ready server of the profile's kind
    ├── RequestError           a measurement request failed (status, error event, bad body)
    └── BaselineError          a baseline file is missing, corrupt or incomparable
"""

from __future__ import annotations

from collections.abc import Sequence


class SpecdecodeError(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigError(SpecdecodeError):
    """Bad user input: a profile file, a command-line flag, an ini key or a marker."""

    def __init__(self, message: str, *, source: str | None = None) -> None:
        self.source = source
        super().__init__(f"{source}: {message}" if source else message)


class ServerError(SpecdecodeError):
    """A server could not be started, reached or trusted."""

    def __init__(
        self,
        message: str,
        *,
        log_path: str | None = None,
        log_tail: Sequence[str] = (),
        exit_code: int | None = None,
    ) -> None:
        self.log_path = log_path
        self.log_tail = list(log_tail)
        self.exit_code = exit_code
        parts = [message]
        if log_path:
            parts.append(f"server log: {log_path}")
        if self.log_tail:
            parts.append(f"last {len(self.log_tail)} log lines:")
            parts.extend("    " + line for line in self.log_tail)
        super().__init__("\n".join(parts))


class ServerStartError(ServerError):
    """The server process or container exited before it became ready."""


class EngineUnreachableError(ServerStartError):
    """The Docker engine that would run the server does not answer (a host of the fleet down,
    a daemon stopped): every server that engine would run fails the same way."""


class ServerTimeoutError(ServerError):
    """The server did not become ready within its startup timeout."""


class ServerMismatchError(ServerError):
    """An attached server reports a configuration other than its profile's."""


class ServerCrashedError(ServerError):
    """The server died while it was being measured."""


class ServerHungError(ServerError):
    """The server is alive but stopped answering: ready in its log with the health probe
    silent, or no token for the stall bound while it was measured."""


class AttachError(ServerError):
    """``--server-host`` does not lead to a ready server of the profile's kind: nothing
    listens, something else answers, or it is still loading."""


class NotServedHere(SpecdecodeError):
    """With ``--server-host``: no server given runs the test's profile (another profile's
    server, or none named for it). The test is skipped with this reason, not failed."""


class RequestError(SpecdecodeError):
    """A measurement request failed: an HTTP error, an error event in a stream, a bad body."""

    def __init__(
        self,
        message: str,
        *,
        url: str | None = None,
        status: int | None = None,
        stalled: bool = False,
        timed_out: bool = False,
    ) -> None:
        self.url = url
        self.status = status
        self.stalled = stalled
        """No token arrived within the stall bound: the server, not this request, is stuck."""
        self.timed_out = timed_out or stalled
        """The request ran out of time (the request timeout, a read or connect timeout): the
        server may be hung or only slow; a health probe tells which."""
        super().__init__(message)


class BaselineError(SpecdecodeError):
    """A baseline file is missing, corrupt, or may not be compared with this run."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        self.path = path
        super().__init__(f"{path}: {message}" if path else message)
