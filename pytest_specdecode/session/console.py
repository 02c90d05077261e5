"""What the session says on the terminal, as text: the report header, the progress of a server
that is loading, and the end-of-session summary. The plugin writes these lines where pytest
writes its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from pytest_specdecode.backends import backend_for
from pytest_specdecode.net import is_local_host
from pytest_specdecode.outputs import terminal
from pytest_specdecode.profiles.values import counted
from pytest_specdecode.redaction import redact_url
from pytest_specdecode.servers.readiness import Progress
from pytest_specdecode.session.baseline_launches import baseline_cost

if TYPE_CHECKING:
    from pytest_specdecode.profiles.profile import ServerProfile
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
        lines.extend(f"specdecode: {line}" for line in attached_lines(session))
    if settings.update_baselines:
        lines.append("specdecode: --update-baselines: measured runs become the new baselines")
        if not settings.server_host:  # an attached server is measured as it is, not launched
            profiles = list(session.profiles().profiles.values())
            cost = baseline_cost(profiles, settings.baseline_launches)
            lines.append(f"specdecode: recording cost if every profile is selected: {cost}")
    lines.extend(f"specdecode: warning: {warning}" for warning in counted(session.warnings))
    return lines


def attached_lines(session: SpecdecodeSession) -> list[str]:
    """With ``--server-host``: which server serves which profiles, what no server can show
    about itself (once here, not per test), and whose baselines each server is compared with."""
    hosts = session.settings.server_host
    assert hosts is not None
    lines = []
    for spec in hosts.specs:
        named = [name for name, url in hosts.named.items() if url == spec]
        serves = [f"profile {', '.join(named)}"] if named else []
        if spec == hosts.default:
            among = " among the other selected ones" if hosts.named else ""
            serves.append(
                f"the tests of the profile it runs{among} (by its /server_info; the rest are "
                "skipped)"
            )
        shown = redact_url(spec)  # a password in the URL stays off the screen
        lines.append(f"measuring the server at {shown} (attached) for {' and '.join(serves)}")
    loaded = session.profiles()
    by_backend: dict[str, list[ServerProfile]] = {}
    for each in loaded.profiles.values():
        by_backend.setdefault(backend_for(each).name, []).append(each)
    for profiles in by_backend.values():
        lines.append(f"attached: {backend_for(profiles[0]).unverifiable(profiles)}")
    simulated = all(p.simulated for p in loaded.profiles.values())
    for spec in hosts.specs:
        profile = next((loaded.profiles[n] for n, url in hosts.named.items() if url == spec), None)
        key = session.hardware_key(simulated, profile)
        host = session.attached_host(profile) or ""
        if session.settings.hardware_key is not None:
            why = "--specdecode-hardware-key"
        elif simulated:
            why = "the simulated server's"
        elif key.startswith("host-"):
            why = (
                "another host's own; --specdecode-hardware-key names the class of box it "
                "shares with"
                if not is_local_host(host)
                else "no GPU found on this machine"
            )
        else:
            why = "the server runs on this machine: its GPUs'"
        lines.append(f"baselines of the server at {redact_url(spec)}: {key} ({why})")
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
    late = terminal.failed_after_tests(results)
    if late:
        lines.append("")
        lines.extend(late)
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
