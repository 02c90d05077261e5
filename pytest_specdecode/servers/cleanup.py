"""What is left of servers whose process, or whose owner, is gone, read from the state file.

* :func:`prune`, on every acquire: dead servers and leases are forgotten, a server whose owning
  pytest died is adopted as a kept one, a half-loaded one is stopped, and a container its engine
  would not remove is tried again.
* :func:`remember_left_behind` and :func:`remember_stale`: such a container is recorded, so that
  a later session finds it.
* :func:`finish_run`: the xdist controller's end of run, stopping what its workers started.

All three work on the state file without a :class:`~pytest_specdecode.servers.pool.ServerPool`
(the controller never has one; its workers do). Together they keep the pool's promise that no
server is leaked.
"""

from __future__ import annotations

from pathlib import Path

from pytest_specdecode.servers.factory import identity_alive, stop_identity
from pytest_specdecode.servers.handle import EventSink, ServerCounts
from pytest_specdecode.servers.launcher import Launcher, ServerIdentity
from pytest_specdecode.servers.state import Entry, StateFile


def prune(entries: dict[str, Entry], *, host: str = "", tried_stale: set[str]) -> None:
    """Forget dead servers and leases; adopt orphans (their owner died) as kept servers.

    Whether a ready server still runs is asked only of ``host``'s servers (this machine's
    for ""): that costs a call to its engine per server, under the state lock, and other
    hosts' entries decide nothing here (benchmarks/bench_fleet.py: at 100 hosts, asking
    every engine would cost 1.3 s per acquire on local sockets, far more over ssh).
    ``tried_stale``: the stale entries this process has already tried to remove."""
    for digest, entry in list(entries.items()):
        entry.leases = entry.live_leases()
        owner_alive = entry.owner is not None and entry.owner.alive()
        if entry.status == "stale":
            # left behind by an engine that was down; kept until that engine answers (tried
            # once per process: an engine still down must not slow every acquire)
            if digest not in tried_stale:
                tried_stale.add(digest)
                if stop_identity(entry.identity, grace=5.0):
                    del entries[digest]
        elif entry.status == "loading" and not owner_alive:
            if entry.identity:
                stop_identity(entry.identity, grace=5.0)
            del entries[digest]
        elif entry.status == "failed" and not owner_alive:
            del entries[digest]
        elif entry.status == "ready" and entry.host == host:
            if not entry.identity or not identity_alive(entry.identity):
                del entries[digest]
            elif not owner_alive:
                entry.owner = None


def finish_run(
    state_dir: Path,
    run_id: str,
    *,
    keep_alive: bool,
    on_event: EventSink | None = None,
    grace: float = 30.0,
) -> ServerCounts:
    """The xdist controller's teardown: stop the servers its workers started (all but, with
    ``keep_alive``, the most recently used one of each host, this machine counting as one).
    Returns what it stopped and kept."""
    emit = on_event or (lambda message: None)
    counts = ServerCounts()
    state = StateFile(state_dir)
    if not state.path.exists():
        return ServerCounts()  # the workers launched nothing
    with state.edit() as entries:
        owned = sorted(
            (e for e in entries.values() if e.owner and e.owner.run == run_id),
            key=lambda e: e.last_used_unix,
        )
        newest: dict[str, Entry] = {}
        for entry in owned:  # oldest first: the last one seen on a host is its newest
            newest[entry.host] = entry
        kept = [e for e in newest.values() if e.status == "ready"] if keep_alive else []
        for entry in kept:
            entry.owner = None
            counts.kept[entry.profile] += 1
            emit(f"{entry.profile}: left running for the next session at {entry.url}")
        owned = [e for e in owned if e not in kept]
        for entry in owned:
            del entries[entry.digest]
    for entry in owned:
        if entry.identity and identity_alive(entry.identity):  # not one that crashed
            emit(f"{entry.profile}: stopping (end of the test session)")
            if stop_identity(entry.identity, grace=grace):
                counts.stopped[entry.profile] += 1
            else:
                remember_stale(state, entry.identity, entry.profile, emit)
    return counts


def remember_left_behind(
    state: StateFile, launcher: Launcher, profile: str, emit: EventSink
) -> None:
    """A server that could not be removed (its Docker engine did not answer) is recorded
    as ``stale`` under a key of its own, owned by nobody: the next session that reaches
    its engine removes it (:func:`prune`), so a box that went down leaks no container."""
    if getattr(launcher, "left_behind", False):
        remember_stale(state, launcher.identity(), profile, emit, fallback_key=str(id(launcher)))


def remember_stale(
    state: StateFile,
    identity: ServerIdentity,
    profile: str,
    emit: EventSink,
    fallback_key: str = "",
) -> None:
    """Record a container that could not be removed under a ``stale`` key, owned by nobody
    (``fallback_key`` names it when the identity holds no container id)."""
    with state.edit() as entries:
        key = f"stale-{identity.get('container_id') or fallback_key or profile}"
        entries[key] = Entry(
            digest=key,
            profile=profile,
            url="",
            identity=identity,
            gpus=[],
            status="stale",
            owner=None,
            error="its Docker engine did not answer when it was to be removed",
        )
    emit(
        f"{profile}: could not remove its container (the engine did not answer); the next "
        "session that reaches the engine removes it"
    )
