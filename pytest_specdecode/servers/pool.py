"""Which servers run: start or reuse one per profile, one server per GPU set, clean teardown.

* **Reuse.** A server recorded in the state file whose fingerprint digest matches, that is alive
  and answers its health probe, is reused, from this session, an xdist sibling, or a session
  that ran with ``--specdecode-keep-server``. A server whose digest differs is never reused.
* **One server per GPU set.** Before launching, every recorded server on overlapping GPUs is
  stopped, but only once nobody is using it (no live lease) and it is not loading; until then
  the caller waits. That is also what keeps an xdist worker from measuring while another
  worker loads the same GPUs.
* **Teardown.** Without xdist the pool knows how many collected tests still need each profile
  (``set_demand``) and stops a server after its last test. Under xdist a worker cannot know what
  its siblings will need, so it stops nothing itself; servers are stopped when another profile
  needs their GPUs, and at the end by the controller
  (:func:`~pytest_specdecode.servers.cleanup.finish_run`).
* **Keep-alive.** With ``keep_alive`` the last server is left running and recorded without an
  owner - the last one of each fleet host (``[hosts.NAME]``), so every box has its server
  waiting for the next night, and one for this machine; the next session reuses it if the
  fingerprint still matches, or stops it if it needs the GPUs for something else. A server
  whose owning process died (pytest was killed) is treated the same way, so it is adopted or
  stopped, never leaked.
* **No gap between two tests.** A test that is followed by another test of the same profile in
  the same process keeps its lease over the gap (``release(hold=True)``), so an xdist sibling
  waiting for the same GPUs cannot stop the server between the two and force a second load.
* **Failures stick.** A server that failed to start or crashed fails every later test of the
  same run that needs it at once, with the same message, instead of burning another load.

This module decides. One launch, from the port check to the warm-up, is carried out by
:class:`~pytest_specdecode.servers.startup.ServerStarter`; what is left of servers whose process
or owner is gone (pruning, a container left behind, the xdist controller's end of run) is
:mod:`pytest_specdecode.servers.cleanup`'s; the handle and counts the pool gives out are in
:mod:`pytest_specdecode.servers.handle`.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from filelock import FileLock

from pytest_specdecode.errors import EngineUnreachableError, ServerError, ServerStartError
from pytest_specdecode.servers.build import BuildKey
from pytest_specdecode.servers.cleanup import prune, remember_left_behind, remember_stale
from pytest_specdecode.servers.factory import (
    build_of,
    identity_alive,
    identity_serves,
    stop_identity,
)
from pytest_specdecode.servers.handle import EventSink, ServerCounts, ServerHandle
from pytest_specdecode.servers.ports import describe_holders
from pytest_specdecode.servers.readiness import DEFAULT_READY_GRACE, Progress
from pytest_specdecode.servers.startup import (
    ServerStarter,
    api_key,
    connect_host,
    launch_port,
    probe_health,
)
from pytest_specdecode.servers.state import Entry, Owner, StateFile, lease_key

if TYPE_CHECKING:
    from pytest_specdecode.profiles.profile import ServerProfile

REPROBE_PAUSE = 2.0
"""Seconds between a recorded server's missed health probe and the second one."""


class ServerPool:
    """Starts, reuses and stops servers for one pytest process (controller or xdist worker)."""

    def __init__(
        self,
        *,
        state_dir: Path,
        log_dir: Path,
        run_id: str,
        worker: str = "main",
        keep_alive: bool = False,
        preflight: bool = True,
        env: Mapping[str, str] | None = None,
        on_event: EventSink | None = None,
        on_progress: Callable[[Progress], None] | None = None,
        warmup: Callable[[ServerHandle], None] | None = None,
        stop_grace: float = 30.0,
        poll_interval: float = 0.5,
        ready_grace: float = DEFAULT_READY_GRACE,
    ) -> None:
        self.state = StateFile(state_dir)
        self.run_id = run_id
        self.worker = worker
        self.keep_alive = keep_alive
        self.env = dict(os.environ if env is None else env)
        self._emit = on_event or (lambda message: None)
        self.stop_grace = stop_grace
        self.poll_interval = poll_interval
        self._lease = lease_key(run_id, worker)
        self._handles: dict[str, ServerHandle] = {}
        self._demand: Counter[str] | None = None
        self._host_of: dict[str, str] = {}  # profile -> its fleet host ("" = this machine)
        self._failures: dict[str, ServerError] = {}
        self._gpu_locks: dict[str, FileLock] = {}
        self._held: dict[str, ServerProfile] = {}  # leases kept for this process's next test
        self._builds: dict[str, BuildKey] = {}
        self._told: set[str] = set()  # other builds already named on the terminal
        self._host_failures: dict[str, ServerError] = {}  # hosts whose engine did not answer
        self._tried_stale: set[str] = set()
        self.counts = ServerCounts()
        self._starter = ServerStarter(
            self.state,
            self.counts,
            log_dir=log_dir,
            env=self.env,
            emit=self._emit,
            gpu_lock=self.gpu_lock,
            preflight=preflight,
            on_progress=on_progress,
            warmup=warmup,
            ready_grace=ready_grace,  # a server that logged "ready" may stay silent this long
        )

    # -- which server is which -------------------------------------------------------------

    def build_for(self, profile: ServerProfile) -> BuildKey:
        """The build a launch of ``profile`` runs here (computed once per process)."""
        build = self._builds.get(profile.name)
        if build is None:
            build = self._builds[profile.name] = build_of(profile, self.env)
        return build

    def key_for(self, profile: ServerProfile) -> str:
        """The state file's key of ``profile``'s server: fingerprint and build. A server is
        reused only under the same key: same configuration, same SGLang (or image, or binary),
        same speed-relevant environment."""
        return f"{profile.fingerprint().digest}-{self.build_for(profile).key}"

    # -- demand --------------------------------------------------------------------------

    def set_demand(
        self, demand: Mapping[str, int] | None, *, hosts: Mapping[str, str] | None = None
    ) -> None:
        """How many collected tests need each profile; ``None`` (xdist) = never stop early.
        ``hosts``: the fleet host each placed profile runs on (keep-alive keeps one per host)."""
        self._demand = None if demand is None else Counter(demand)
        self._host_of = dict(hosts or {})

    # -- acquire / release ---------------------------------------------------------------

    def acquire(self, profile: ServerProfile) -> ServerHandle:
        """A ready server for ``profile``, reused or launched; the caller holds a lease on it."""
        self.drop_holds(keep=profile.name)  # a test skipped: nobody took them over
        if profile.name in self._failures:
            self._drop_held(profile)
            raise self._failures[profile.name]
        if profile.placed_on in self._host_failures:  # its engine did not answer another
            raise self._host_failures[profile.placed_on]
        try:
            handle = self._acquire(profile)
        except ServerError as exc:
            self._failures[profile.name] = exc
            if isinstance(exc, EngineUnreachableError) and profile.placed_on:
                self._host_failures[profile.placed_on] = EngineUnreachableError(
                    f"host {profile.placed_on!r}: its Docker engine did not answer for profile "
                    f"{profile.name!r}, so none of its servers can start: "
                    f"{str(exc).splitlines()[0]}"
                )
            self._drop_held(profile)
            raise
        return handle

    def mark_failed(self, profile: ServerProfile, error: ServerError) -> None:
        """The server crashed while measured: later tests of this run fail fast with ``error``."""
        self._failures[profile.name] = error
        self.counts.failed[profile.name] += 1
        digest = self.key_for(profile)
        with self.state.edit() as entries:
            entry = entries.get(digest)
            if entry is not None:
                entry.status = "failed"
                entry.error = str(error).splitlines()[0]
                entry.owner = Owner(self.run_id, os.getpid())
        handle = self._handles.pop(profile.name, None)
        if handle is not None and handle.launcher is not None:
            handle.launcher.stop(grace=5.0)  # reap it and whatever it left in its group
            remember_left_behind(self.state, handle.launcher, profile.name, self._emit)

    def release(self, profile: ServerProfile, *, hold: bool = False) -> None:
        """The test using ``profile``'s server is done with it.

        ``hold``: this process's next test needs the same server; the lease is kept over the
        gap and taken over by the next :meth:`acquire`, so nobody stops the server in between.
        """
        if hold:
            self._held[profile.name] = profile
            with self.state.edit() as entries:
                entry = entries.get(self.key_for(profile))
                if entry is not None:
                    entry.last_used_unix = time.time()
        else:
            self._drop_held(profile)
            self._drop_lease(profile)
        if self._demand is None:
            return
        self._demand[profile.name] -= 1
        if hold or self._demand[profile.name] > 0:
            return
        here = self._host_of.get(profile.name, "")
        others_pending = any(
            n > 0
            for name, n in self._demand.items()
            if name != profile.name and self._host_of.get(name, "") == here
        )
        if self.keep_alive and not others_pending:
            return  # the last server of the session on its host: close() leaves it running
        self._stop_profile(profile, reason="its last test has finished")

    def relaunch(self, profile: ServerProfile, *, reason: str) -> ServerHandle:
        """Stop ``profile``'s server and launch it anew (never reuse one): another launch of the
        same configuration, for a baseline recorded over several launches. The caller holds a
        lease on the new server and gives it back with :meth:`release`."""
        self._drop_held(profile)
        self._stop_profile(profile, reason=reason)
        return self.acquire(profile)

    def _drop_lease(self, profile: ServerProfile) -> None:
        with self.state.edit() as entries:
            entry = entries.get(self.key_for(profile))
            if entry and entry.leases.get(self._lease, 0) > 0:
                entry.leases[self._lease] -= 1
                if entry.leases[self._lease] == 0:
                    del entry.leases[self._lease]
                entry.last_used_unix = time.time()

    def _drop_held(self, profile: ServerProfile) -> None:
        """Give back a lease kept by ``release(hold=True)`` that no test will take over."""
        if self._held.pop(profile.name, None) is not None:
            self._drop_lease(profile)

    def drop_holds(self, keep: str | None = None) -> None:
        """Give back the leases kept for a next test that turned out not to need them (it was
        skipped, or needs another profile), except ``keep``'s."""
        for name, profile in list(self._held.items()):
            if name != keep:
                self._drop_held(profile)

    def _acquire(self, profile: ServerProfile) -> ServerHandle:
        digest = self.key_for(profile)
        waiting_since: float | None = None
        while True:
            plan = self._plan(profile, digest)
            kind = plan[0]
            if kind == "use":
                handle: ServerHandle = plan[1]
                return handle
            if kind == "launch":
                return self._launch(profile, digest, plan[1], plan[2])
            # Someone else is loading this server or still using the GPUs: wait and look again.
            now = time.monotonic()
            if waiting_since is None:
                waiting_since = now
                self._emit(f"{profile.name}: waiting: {plan[1]}")
            if now - waiting_since > profile.startup_timeout + 600:
                raise ServerStartError(
                    f"{profile.name}: gave up after {now - waiting_since:.0f}s waiting: {plan[1]}"
                )
            time.sleep(self.poll_interval)

    def _plan(self, profile: ServerProfile, digest: str) -> tuple:  # type: ignore[type-arg]
        """Decide under the state lock; act (stop, launch, probe) outside it."""
        cached = self._handles.get(profile.name)
        to_stop: list[Entry] = []
        with self.state.edit() as entries:
            prune(entries, host=profile.placed_on or "", tried_stale=self._tried_stale)
            entry = self._recorded(profile, digest, entries)
            if entry is not None and entry.status == "loading":
                who = f"pid {entry.owner.pid}" if entry.owner else "another session"
                return ("wait", f"{profile.name} is being loaded by {who}")
            if entry is not None:
                self._take_lease(profile, entry)
                if cached is not None and cached.exit_code() is None:
                    return ("use", cached)
            else:
                self._held.pop(profile.name, None)  # its server is gone, and so is the lease
                conflicts = self._conflicts(profile, digest, entries)
                busy = self._busy(conflicts)
                if busy is not None:
                    return ("wait", busy)
                for other in conflicts:
                    del entries[other.digest]
                    to_stop.append(other)
                port, url = self._record_launch(profile, digest, entries)
        if entry is not None:
            handle = self._adopt(profile, entry)
            if handle is not None:
                return ("use", handle)
            return ("retry", f"{profile.name}: the recorded server did not answer; relaunching")
        for other in to_stop:
            self._stop_entry(other, reason=f"{profile.name} needs GPUs {list(profile.gpus)}")
        return ("launch", port, url)

    def _recorded(
        self, profile: ServerProfile, digest: str, entries: dict[str, Entry]
    ) -> Entry | None:
        """The recorded entry of ``profile``'s server, if any: one that failed in this run fails
        this acquire too; one that failed in another run is forgotten and tried again."""
        entry = entries.get(digest)
        if entry is not None and entry.status == "failed":
            if entry.owner and entry.owner.run == self.run_id:
                raise ServerStartError(
                    f"{profile.name}: the server failed earlier in this run: {entry.error}"
                )
            del entries[digest]
            entry = None
        return entry

    def _take_lease(self, profile: ServerProfile, entry: Entry) -> None:
        """Lease the recorded server for this process, and own it if its owner is gone."""
        if self._held.pop(profile.name, None) is None:  # else: the previous test's
            entry.leases[self._lease] = entry.leases.get(self._lease, 0) + 1  # carries over
        entry.last_used_unix = time.time()
        if entry.owner is None or not entry.owner.alive():
            entry.owner = Owner(self.run_id, os.getpid())

    def _conflicts(
        self, profile: ServerProfile, digest: str, entries: dict[str, Entry]
    ) -> list[Entry]:
        """The recorded servers a launch of ``profile`` must stop first: those on its GPUs, and
        idle other builds of the same configuration; other builds are named once on the way."""
        # Servers on other hosts share neither GPUs nor anything else with this one
        # (the same configuration on two boxes is two servers, each kept by its own).
        here = profile.placed_on or ""
        others = [e for e in entries.values() if e.digest != digest and e.host == here]
        conflicts = [e for e in others if _overlap(e.gpus, profile.gpus)]
        fingerprint = profile.fingerprint().digest
        for other in others:
            if other.fingerprint == fingerprint and other.digest not in self._told:
                self._told.add(other.digest)
                self._emit(self._other_build(profile, other))
        # Another build of this profile on no shared GPUs (the simulator): stopped when
        # idle, left to its session when in use; either way ours is a server of its own.
        conflicts += [
            e
            for e in others
            if e.fingerprint == fingerprint
            and e not in conflicts
            and e.status != "loading"
            and not e.live_leases()
            and not (e.owner and e.owner.run != self.run_id and e.owner.alive())
        ]
        return conflicts

    def _busy(self, conflicts: Sequence[Entry]) -> str | None:
        """Why the servers in the way cannot be stopped yet (one is loading, in use, or another
        live run's), or ``None`` when all of them can."""
        for other in conflicts:
            if other.status == "loading" or other.live_leases():
                return f"GPUs {other.gpus} are in use by {other.profile}"
            if other.owner and other.owner.run != self.run_id and other.owner.alive():
                return f"GPUs {other.gpus} belong to another run's {other.profile}"
        return None

    def _record_launch(
        self, profile: ServerProfile, digest: str, entries: dict[str, Entry]
    ) -> tuple[int, str]:
        """Record ``profile``'s server as loading, owned by this process, on the port it will
        take: the port and URL of the launch."""
        port = profile.port or launch_port(profile, entries.values())
        url = f"http://{connect_host(profile.host)}:{port}"
        entries[digest] = Entry(
            digest=digest,
            fingerprint=profile.fingerprint().digest,
            build=dict(self.build_for(profile).parts),
            host=profile.placed_on or "",
            profile=profile.name,
            url=url,
            identity={},
            gpus=list(profile.gpus),
            status="loading",
            owner=Owner(self.run_id, os.getpid()),
        )
        return port, url

    def _other_build(self, profile: ServerProfile, other: Entry) -> str:
        """Why the running server of the same configuration is not reused."""
        build = self.build_for(profile)
        diffs = "; ".join(build.differences(other.build)) or "recorded by an older plugin"
        return (
            f"{profile.name}: not reusing the server at {other.url}: it runs the same "
            f"configuration but another build ({diffs}); this session launches "
            f"{build.describe()}"
        )

    def _adopt(self, profile: ServerProfile, entry: Entry) -> ServerHandle | None:
        """Reuse a recorded ready server if it still answers and still holds its port;
        otherwise forget and stop it."""
        if identity_serves(entry.identity) is False:
            self._emit(
                f"{profile.name}: the recorded server (pid {entry.identity.get('pid')}) no longer "
                f"holds {entry.url}; {describe_holders(int(entry.identity['port']))} does"
            )
        elif self._answers(profile, entry):
            handle = ServerHandle(
                profile=profile,
                base_url=entry.url,
                origin="reused",
                api_key=api_key(profile, self.env),
                log_path=Path(entry.log_path) if entry.log_path else None,
                identity=entry.identity,
                recorded_alive=partial(identity_alive, entry.identity) if entry.identity else None,
            )
            cached = self._handles.get(profile.name)
            if cached is not None and cached.base_url == entry.url and cached.launcher:
                handle = cached  # our own server, still running: keep its launcher
            else:
                self.counts.reused[profile.name] += 1
                self._emit(f"{profile.name}: reusing the running server at {entry.url}")
            self._handles[profile.name] = handle
            return handle
        with self.state.edit() as entries:
            entries.pop(entry.digest, None)
        self._stop_entry(entry, reason="it no longer answers its health probe")
        return None

    def _answers(self, profile: ServerProfile, entry: Entry) -> bool:
        """Whether a recorded server answers its health probe; one miss is probed again before
        the server is given up (a reload costs 15-30 minutes on a real box), and either way
        what the probes got is printed."""
        key = api_key(profile, self.env)
        first = probe_health(entry.url, key)
        if first is None:
            return True
        self._emit(
            f"{profile.name}: the recorded server at {entry.url} missed a health probe "
            f"({first}); probing again in {REPROBE_PAUSE:g}s before giving it up"
        )
        time.sleep(REPROBE_PAUSE)
        second = probe_health(entry.url, key)
        if second is None:
            self._emit(
                f"{profile.name}: the recorded server at {entry.url} answered the second probe"
            )
            return True
        self._emit(
            f"{profile.name}: giving up the recorded server at {entry.url}: it missed two "
            f"health probes ({first}; then {second})"
        )
        return False

    def _launch(self, profile: ServerProfile, digest: str, port: int, url: str) -> ServerHandle:
        handle = self._starter.start(profile, digest, port, url)
        with self.state.edit() as entries:
            entry = entries[digest]
            entry.status = "ready"
            entry.url = handle.base_url
            entry.leases[self._lease] = entry.leases.get(self._lease, 0) + 1
        self._handles[profile.name] = handle
        return handle

    # -- measurement lock ----------------------------------------------------------------

    @contextlib.contextmanager
    def gpu_lock(self, profile: ServerProfile, digest: str | None = None) -> Iterator[None]:
        """Exclusive use of the profile's GPUs (or of the server, when it has none).

        Held while a server loads and while it is measured, so no two xdist workers measure on
        the same GPUs at once and nobody measures while the same GPUs are loading.
        """
        host = f"{profile.placed_on}-" if profile.placed_on else ""  # each box its own GPUs
        names = [f"gpu-{host}{g}" for g in sorted(profile.gpus)] or [
            f"server-{digest or self.key_for(profile)}"
        ]
        with contextlib.ExitStack() as stack:
            for name in names:  # sorted: every process takes them in the same order
                lock = self._gpu_locks.get(name)
                if lock is None:
                    self.state.directory.mkdir(parents=True, exist_ok=True)
                    lock = FileLock(str(self.state.directory / f"{name}.lock"))
                    self._gpu_locks[name] = lock
                stack.enter_context(lock)
            yield

    # -- stopping ------------------------------------------------------------------------

    def _stop_profile(self, profile: ServerProfile, *, reason: str) -> None:
        digest = self.key_for(profile)
        with self.state.edit() as entries:
            entry = entries.get(digest)
            if entry is not None:
                foreign = [k for k in entry.live_leases() if k != self._lease]
                if foreign:
                    # Another session is measuring it right now: hand it over instead.
                    run, _, pid = foreign[0].split(":")
                    entry.owner = Owner(run, int(pid))
                    self._handles.pop(profile.name, None)
                    return
                del entries[digest]
        handle = self._handles.pop(profile.name, None)
        if handle is not None and handle.launcher is not None:
            if handle.launcher.exit_code() is None:
                self._emit(f"{profile.name}: stopping ({reason})")
                self.counts.stopped[profile.name] += 1
            handle.launcher.stop(grace=self.stop_grace)
            remember_left_behind(self.state, handle.launcher, profile.name, self._emit)
        elif entry is not None:
            self._stop_entry(entry, reason=reason)

    def _stop_entry(self, entry: Entry, *, reason: str) -> None:
        handle = self._handles.get(entry.profile)
        if handle is not None and handle.launcher is not None and handle.base_url == entry.url:
            self._handles.pop(entry.profile)
            self._emit(f"{entry.profile}: stopping ({reason})")
            handle.launcher.stop(grace=self.stop_grace)
        elif entry.identity and identity_alive(entry.identity):
            self._emit(f"{entry.profile}: stopping the recorded server at {entry.url} ({reason})")
            if not stop_identity(entry.identity, grace=self.stop_grace):
                remember_stale(self.state, entry.identity, entry.profile, self._emit)
                return
        else:
            return  # nothing runs any more (it crashed): nothing to stop
        self.counts.stopped[entry.profile] += 1

    def close(self) -> None:
        """End of this process's session: stop what it owns, or keep the last one alive."""
        if not self.state.path.exists():
            return  # nothing was ever launched or recorded: leave no state directory behind
        with self.state.edit() as entries:
            for entry in entries.values():
                entry.leases.pop(self._lease, None)
            if self._demand is not None:  # not an xdist worker: finish_run will not run
                for digest, entry in list(entries.items()):
                    # A failure sticks for the rest of its run only (nothing runs any more).
                    if entry.status == "failed" and entry.owner and entry.owner.run == self.run_id:
                        del entries[digest]
        if self._demand is None:
            self._handles.clear()  # xdist worker: the controller decides (finish_run)
            return
        keep = self._last_running_per_host() if self.keep_alive else set()
        for name, handle in list(self._handles.items()):
            if handle.origin == "attached":
                continue
            digest = self.key_for(handle.profile)
            if name in keep:
                with self.state.edit() as entries:
                    if digest in entries:
                        entries[digest].owner = None
                self._emit(f"{name}: left running for the next session at {handle.base_url}")
                self.counts.kept[name] += 1
                continue
            self._stop_profile(handle.profile, reason="end of the test session")
        self._handles.clear()

    def _last_running_per_host(self) -> set[str]:
        """The profiles whose server keep-alive leaves running: on each host (this machine
        counting as one), the one started or reused last that is still alive."""
        last: dict[str, str] = {}
        for name, handle in self._handles.items():  # in the order they were acquired
            if handle.origin != "attached" and handle.exit_code() is None:
                last[handle.profile.placed_on or ""] = name
        return set(last.values())


def _overlap(a: Sequence[int], b: Sequence[int]) -> bool:
    return bool(set(a) & set(b))
