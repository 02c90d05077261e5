"""What the session says on the terminal, as text: the report header, the progress of a server
that is loading, and the end-of-session summary. The plugin writes these lines where pytest
writes its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from pytest_specdecode.outputs import terminal
from pytest_specdecode.profiles.values import counted
from pytest_specdecode.redaction import redact_url
from pytest_specdecode.servers.readiness import Progress

if TYPE_CHECKING:
    from pytest_specdecode.session.orchestrator import SpecdecodeSession


def header_lines(session: SpecdecodeSession) -> list[str]:
    """The ``specdecode:`` lines of pytest's report header (none without a profile file);
    an unreadable profile file raises its :class:`~pytest_specdecode.errors.SpecdecodeError`."""
    settings = session.settings
    if not settings.config.exists():
        return []
    target = session.target
    lines = [
        f"specdecode: profiles {settings.config} ({settings.config_source}), target {target} "
        f"({session.target_reason}), baselines {settings.baselines}"
    ]
    if settings.server_host:
        shown = redact_url(settings.server_host)  # a password in the URL stays off the screen
        lines.append(f"specdecode: measuring the server at {shown} (attached)")
    if settings.update_baselines:
        lines.append("specdecode: --update-baselines: measured runs become the new baselines")
    lines.extend(f"specdecode: warning: {warning}" for warning in counted(session.warnings))
    return lines


class ProgressLine:
    """The seed's "Still loading... 180s", done properly: elapsed time and the phase read from
    the log, on a phase change and every 30 s (every 5 s on a terminal)."""

    def __init__(self, say: Callable[[str], None], *, is_tty: Callable[[], bool]) -> None:
        self._say = say
        self._is_tty = is_tty
        self._last: tuple[str, str] = ("", "")
        self._last_time = 0.0

    def __call__(self, progress: Progress) -> None:
        interval = 5.0 if self._is_tty() else 30.0
        key = (progress.name, progress.phase)
        now = time.monotonic()
        if key == self._last and now - self._last_time < interval:
            return
        if progress.phase == "ready":
            return  # the log says so a moment before the health probe does; "ready after" follows
        if progress.elapsed < 1.0 and key[1] in ("starting", "waiting"):
            return  # a fast server needs no progress line
        self._last, self._last_time = key, now
        self._say(
            f"specdecode: {progress.name} loading... {progress.elapsed:.0f}s "
            f"(timeout {progress.timeout:.0f}s), phase: {progress.phase}"
        )


def summary_lines(session: SpecdecodeSession) -> list[str] | None:
    """The lines of the terminal summary's ``specdecode`` section, or None when there is
    nothing to say (no section then)."""
    results, updates, outputs = session.results, session.updates, session.output_lines
    servers = session.servers.describe()
    if not results and not updates and not servers and not outputs and not session.warnings:
        return None
    lines = list(terminal.results_table(results))
    detail = terminal.details(results)
    if detail:
        lines.append("")
        lines.extend(detail)
    if updates:
        lines.append("")
        lines.append("baselines updated (old -> new):")
        lines.extend("  " + line for line in updates)
    if servers:
        if results or updates:
            lines.append("")
        lines.append(f"servers: {servers}")
    placement = session.placement_seen or session.placement_lines()
    lines.extend(f"placed on {line}" for line in placement)
    lines.extend(outputs)
    lines.extend(f"warning: {warning}" for warning in counted(session.warnings))
    return lines
