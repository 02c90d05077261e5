"""The machine-wide record of which servers run, shared by pytest sessions and xdist workers.

One JSON file (``servers.json`` in the state directory) guarded by a filelock. Each entry is a
server this plugin started: its profile, fingerprint digest, URL, how to find it again (the
launcher's identity: pid or container id), the GPUs it holds, whether it is still loading, who
owns it (the test run that will stop it) and who is using it right now (leases). Nothing here
talks to a server; :mod:`pytest_specdecode.servers.pool` decides, this module only remembers.

The lock is held only for quick read-modify-write cycles, never while waiting for a server.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock

from pytest_specdecode.servers.subprocess import process_alive

STATE_VERSION = 1


@dataclass
class Owner:
    run: str  # the test run's id (shared by an xdist controller and its workers)
    pid: int  # the process that launched it, or the controller that will stop it

    def alive(self) -> bool:
        return process_alive(self.pid)


@dataclass
class Entry:
    # The server's key: its fingerprint digest and its build (ServerPool.key_for); two launches
    # of one profile by different builds are different servers and never stand for each other.
    digest: str
    profile: str
    url: str
    identity: dict[str, Any]
    gpus: list[int]
    status: str  # "loading" | "ready" | "failed" | "stale" (left behind by an engine that was down)
    owner: Owner | None  # None = kept alive for a later session
    log_path: str | None = None
    started_unix: float = field(default_factory=time.time)
    last_used_unix: float = field(default_factory=time.time)
    leases: dict[str, int] = field(default_factory=dict)  # "run:worker:pid" -> count
    error: str | None = None
    fingerprint: str = ""  # the profile's fingerprint digest alone
    host: str = ""  # the [hosts.NAME] it runs on; "" = this machine's engine or processes
    build: dict[str, Any] = field(default_factory=dict)  # BuildKey.parts, for messages

    def live_leases(self) -> dict[str, int]:
        return {key: n for key, n in self.leases.items() if n > 0 and lease_alive(key)}

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Entry:
        owner = data.get("owner")
        return cls(**{**data, "owner": Owner(**owner) if owner else None})


def lease_key(run: str, worker: str) -> str:
    return f"{run}:{worker}:{os.getpid()}"


def lease_alive(key: str) -> bool:
    try:
        pid = int(key.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return False
    return process_alive(pid)


class StateFile:
    """``servers.json`` under a filelock; use :meth:`edit` for every change."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / "servers.json"
        self._lock_object: FileLock | None = None

    @property
    def _lock(self) -> FileLock:
        # Created on first use: a pytest run that launches nothing leaves no trace on disk.
        if self._lock_object is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._lock_object = FileLock(str(self.path) + ".lock")
        return self._lock_object

    @contextmanager
    def edit(self) -> Iterator[dict[str, Entry]]:
        """Lock, load, yield the entries by digest, write back what the caller changed."""
        with self._lock:
            entries = self._load()
            yield entries
            self._save(entries)

    def snapshot(self) -> dict[str, Entry]:
        with self._lock:
            return self._load()

    def _load(self) -> dict[str, Entry]:
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError):
            # The file is ours, not the user's: a torn or foreign file is moved aside, not fatal.
            self.path.replace(self.path.with_suffix(f".corrupt-{int(time.time())}"))
            return {}
        if not isinstance(raw, dict) or raw.get("version") != STATE_VERSION:
            return {}
        return {d: Entry.from_json(e) for d, e in raw.get("servers", {}).items()}

    def _save(self, entries: dict[str, Entry]) -> None:
        tmp = self.path.with_suffix(f".tmp-{os.getpid()}")
        payload = {
            "version": STATE_VERSION,
            "servers": {d: e.to_json() for d, e in entries.items()},
        }
        tmp.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, self.path)
