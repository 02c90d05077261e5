"""What the pool hands out and what it reports: the types its users see.

A :class:`ServerHandle` is the server a test measures, launched, reused or attached; the session,
the plugin and the launch of a server all pass it around. :class:`ServerCounts` is what happened
to each profile's server in a run, added up over the xdist workers for the terminal summary.
They live apart from :mod:`pytest_specdecode.servers.pool` so that the modules that only carry
them need none of the pool's machinery (state file, locks, launch).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_specdecode.servers.launcher import Launcher, ServerIdentity
from pytest_specdecode.servers.readiness import LogTail

if TYPE_CHECKING:
    from pytest_specdecode.profiles.profile import ServerProfile

EventSink = Callable[[str], None]
"""Where the pool says what it does (starting, reusing, stopping), one line at a time."""


@dataclass
class ServerCounts:
    """What happened to each profile's server in one pytest run, for the terminal summary:
    launched, reused (started by an earlier session or an xdist sibling), stopped by us, failed
    (did not start, or crashed) and left running for the next session."""

    launched: Counter[str] = field(default_factory=Counter)
    reused: Counter[str] = field(default_factory=Counter)
    stopped: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    kept: Counter[str] = field(default_factory=Counter)

    _FIELDS = ("launched", "reused", "stopped", "failed", "kept")

    def add(self, other: ServerCounts) -> None:
        for name in self._FIELDS:
            getattr(self, name).update(getattr(other, name))

    def to_json(self) -> dict[str, dict[str, int]]:
        return {name: dict(getattr(self, name)) for name in self._FIELDS}

    @classmethod
    def from_json(cls, data: Mapping[str, Mapping[str, int]]) -> ServerCounts:
        return cls(**{name: Counter(data.get(name, {})) for name in cls._FIELDS})

    def describe(self) -> str | None:
        """``nospec launched 1, reused 0, stopped 1; eagle3 launched 1, ...`` or ``None``."""
        profiles = list(
            dict.fromkeys([*self.launched, *self.reused, *self.stopped, *self.failed, *self.kept])
        )
        if not profiles:
            return None
        parts = []
        for name in profiles:
            text = (
                f"{name} launched {self.launched[name]}, reused {self.reused[name]}, "
                f"stopped {self.stopped[name]}"
            )
            if self.failed[name]:
                text += f", failed {self.failed[name]}"
            if self.kept[name]:
                text += ", left running"
            parts.append(text)
        return "; ".join(parts)


@dataclass
class ServerHandle:
    """A server a test may measure: where it is and how to tell whether it is still alive."""

    profile: ServerProfile
    base_url: str
    origin: str  # "launched" | "reused" | "attached"
    api_key: str | None = None
    log_path: Path | None = None
    ready_seconds: float | None = None
    launcher: Launcher | None = None
    identity: ServerIdentity = field(default_factory=dict)
    """What the pool records about the server (``{"pid", "port", ...}``, a container's id): a
    user's test may read it, e.g. to signal the server's process."""
    recorded_alive: Callable[[], bool] | None = None
    """A server an earlier session recorded (no launcher of ours): whether its process still
    runs. The pool passes it in, so that a handle needs no knowledge of server kinds."""

    def exit_code(self) -> int | None:
        """The exit code if the server is gone (-1 when unknowable), ``None`` while it runs."""
        if self.launcher is not None:
            return self.launcher.exit_code()
        if self.recorded_alive is not None:
            return None if self.recorded_alive() else -1
        return None  # attached: we cannot see the process

    def log_tail(self, n: int = 50) -> list[str]:
        if self.log_path is None or not self.log_path.exists():
            return []
        return LogTail(self.log_path).tail(n)
