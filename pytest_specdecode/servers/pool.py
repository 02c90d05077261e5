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
  needs their GPUs, and at the end by the controller (:func:`finish_run`).
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
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import httpx
from filelock import FileLock

from pytest_specdecode import net
from pytest_specdecode.backends import backend_for
from pytest_specdecode.errors import (
    ConfigError,
    EngineUnreachableError,
    ServerError,
    ServerStartError,
    SpecdecodeError,
)
from pytest_specdecode.net import is_local_host
from pytest_specdecode.servers.build import BuildKey
from pytest_specdecode.servers.factory import (
    build_of,
    identity_alive,
    identity_serves,
    make_launcher,
    stop_identity,
)
from pytest_specdecode.servers.launcher import (
    Launcher,
    ServerIdentity,
    find_free_port,
    port_in_use,
)
from pytest_specdecode.servers.ports import describe_holders
from pytest_specdecode.servers.preflight import preflight
from pytest_specdecode.servers.readiness import (
    DEFAULT_READY_GRACE,
    LogTail,
    Progress,
    wait_until_ready,
)
from pytest_specdecode.servers.state import Entry, Owner, StateFile, lease_key

if TYPE_CHECKING:
    from pytest_specdecode.profiles.profile import ServerProfile

EventSink = Callable[[str], None]


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

    def exit_code(self) -> int | None:
        """The exit code if the server is gone (-1 when unknowable), ``None`` while it runs."""
        if self.launcher is not None:
            return self.launcher.exit_code()
        if self.identity:
            return None if identity_alive(self.identity) else -1
        return None  # attached: we cannot see the process

    def log_tail(self, n: int = 50) -> list[str]:
        if self.log_path is None or not self.log_path.exists():
            return []
        return LogTail(self.log_path).tail(n)


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
        self.log_dir = log_dir
        self.run_id = run_id
        self.worker = worker
        self.keep_alive = keep_alive
        self.preflight = preflight
        self.env = dict(os.environ if env is None else env)
        self._emit = on_event or (lambda message: None)
        self._on_progress = on_progress
        self._warmup = warmup
        self.stop_grace = stop_grace
        self.poll_interval = poll_interval
        self.ready_grace = ready_grace  # a server that logged "ready" may stay silent this long
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
            self._remember_left_behind(handle.launcher, profile.name)

    def _remember_left_behind(self, launcher: Launcher, profile: str) -> None:
        """A server that could not be removed (its Docker engine did not answer) is recorded
        as ``stale`` under a key of its own, owned by nobody: the next session that reaches
        its engine removes it (:meth:`_prune`), so a box that went down leaks no container."""
        if not getattr(launcher, "left_behind", False):
            return
        identity = launcher.identity()
        with self.state.edit() as entries:
            key = f"stale-{identity.get('container_id') or id(launcher)}"
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
        self._emit(
            f"{profile}: could not remove its container (the engine did not answer); the next "
            "session that reaches the engine removes it"
        )

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
            self._prune(entries, host=profile.placed_on or "")
            entry = entries.get(digest)
            if entry is not None and entry.status == "failed":
                if entry.owner and entry.owner.run == self.run_id:
                    raise ServerStartError(
                        f"{profile.name}: the server failed earlier in this run: {entry.error}"
                    )
                del entries[digest]
                entry = None
            if entry is not None and entry.status == "loading":
                who = f"pid {entry.owner.pid}" if entry.owner else "another session"
                return ("wait", f"{profile.name} is being loaded by {who}")
            if entry is not None:
                if self._held.pop(profile.name, None) is None:  # else: the previous test's
                    entry.leases[self._lease] = entry.leases.get(self._lease, 0) + 1  # carries over
                entry.last_used_unix = time.time()
                if entry.owner is None or not entry.owner.alive():
                    entry.owner = Owner(self.run_id, os.getpid())
                if cached is not None and cached.exit_code() is None:
                    return ("use", cached)
                found = entry
            else:
                found = None
                self._held.pop(profile.name, None)  # its server is gone, and so is the lease
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
                for other in conflicts:
                    if other.status == "loading" or other.live_leases():
                        return ("wait", f"GPUs {other.gpus} are in use by {other.profile}")
                    if other.owner and other.owner.run != self.run_id and other.owner.alive():
                        return (
                            "wait",
                            f"GPUs {other.gpus} belong to another run's {other.profile}",
                        )
                for other in conflicts:
                    del entries[other.digest]
                    to_stop.append(other)
                port = profile.port or _launch_port(profile, entries.values())
                url = f"http://{_connect_host(profile.host)}:{port}"
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
        if found is not None:
            handle = self._adopt(profile, found)
            if handle is not None:
                return ("use", handle)
            return ("retry", f"{profile.name}: the recorded server did not answer; relaunching")
        for other in to_stop:
            self._stop_entry(other, reason=f"{profile.name} needs GPUs {list(profile.gpus)}")
        return ("launch", port, url)

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
        elif _healthy(entry.url, _api_key(profile, self.env)):
            handle = ServerHandle(
                profile=profile,
                base_url=entry.url,
                origin="reused",
                api_key=_api_key(profile, self.env),
                log_path=Path(entry.log_path) if entry.log_path else None,
                identity=entry.identity,
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

    def _launch(self, profile: ServerProfile, digest: str, port: int, url: str) -> ServerHandle:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        log_path = self.log_dir / f"{profile.name}-{stamp}-{os.getpid()}.log"
        try:
            api_key = _api_key(profile, self.env)
            launcher = make_launcher(
                profile, port=port, log_path=log_path, env=self.env, api_key=api_key
            )
        except ConfigError as exc:  # no API key, no llama-server to run: nothing started
            with self.state.edit() as entries:
                entries.pop(digest, None)
            raise ServerStartError(f"server {profile.name!r} cannot be started: {exc}") from None
        self._check_port_free(profile, digest, launcher)
        if self.preflight and profile.launcher == "sglang":
            self._preflight(profile, port, digest)
        self.counts.launched[profile.name] += 1
        self._emit(f"{profile.name}: starting ({profile.launcher}) on {url}; log: {log_path}")
        try:
            with self.gpu_lock(profile, digest):
                launcher.start()
                with self.state.edit() as entries:
                    if digest in entries:
                        entries[digest].identity = launcher.identity()
                        entries[digest].log_path = str(log_path)
                backend = backend_for(profile)
                ready = wait_until_ready(
                    launcher.base_url,
                    name=f"server {profile.name!r}",
                    timeout=profile.startup_timeout,
                    exit_code=launcher.exit_code,
                    log=LogTail(log_path, backend.log_phases),
                    api_key=api_key,
                    on_progress=self._on_progress,
                    paths=backend.health_paths,
                    ready_grace=self.ready_grace,
                )
            self._check_ours(profile, launcher, ready)
            handle = ServerHandle(
                profile=profile,
                base_url=launcher.base_url,
                origin="launched",
                api_key=api_key,
                log_path=log_path,
                ready_seconds=ready,
                launcher=launcher,
                identity=launcher.identity(),
            )
            self._emit(f"{profile.name}: ready after {ready:.1f}s")
            if self._warmup is not None:
                try:
                    self._warmup(handle)
                except ServerError:
                    raise
                except SpecdecodeError as exc:  # e.g. the server answers, but not as expected
                    raise ServerStartError(
                        f"server {profile.name!r} was ready after {ready:.1f}s, but its warm-up "
                        f"request failed: {exc}",
                        log_path=str(log_path),
                        log_tail=LogTail(log_path).tail(),
                    ) from None
        except BaseException as exc:
            # Ctrl-C, a timeout, a crash or a failed warm-up: never leave the process or
            # container behind.
            if isinstance(exc, ServerError):
                self.counts.failed[profile.name] += 1
            elif launcher.exit_code() is None:
                self.counts.stopped[profile.name] += 1
            launcher.stop(grace=5.0)
            self._remember_left_behind(launcher, profile.name)
            with self.state.edit() as entries:
                if isinstance(exc, ServerError):
                    entries[digest].status = "failed"
                    entries[digest].error = str(exc).splitlines()[0]
                    entries[digest].identity = {}
                else:
                    entries.pop(digest, None)
            raise
        with self.state.edit() as entries:
            entry = entries[digest]
            entry.status = "ready"
            entry.url = handle.base_url
            entry.leases[self._lease] = entry.leases.get(self._lease, 0) + 1
        self._handles[profile.name] = handle
        return handle

    def _check_port_free(self, profile: ServerProfile, digest: str, launcher: Launcher) -> None:
        """A port someone already listens on is an error now, naming who, not a 200 from the
        wrong server later (SGLang binds its port last, after a load of minutes)."""
        url = urlsplit(launcher.base_url)
        host, port = url.hostname or "127.0.0.1", url.port or 0
        if not port_in_use(host, port):
            return
        with self.state.edit() as entries:
            entries.pop(digest, None)
            recorded = [e for e in entries.values() if urlsplit(e.url).port == port]
        holder = describe_holders(port) if is_local_host(host) else f"a server on {host}"
        also = "".join(
            f"; it is the server pytest-specdecode recorded for profile {e.profile!r} ({e.status})"
            for e in recorded
        )
        choice = (
            f"the profile's port = {profile.port} ({profile.source or profile.name})"
            if profile.port
            else "the chosen port"
        )
        self.counts.failed[profile.name] += 1
        raise ServerStartError(
            f"server {profile.name!r} cannot be launched on {launcher.base_url}: "
            f"{choice} is already in use by {holder}{also}. Stop that server, give the profile "
            "another port, or leave port unset to have a free one chosen"
        )

    def _check_ours(self, profile: ServerProfile, launcher: Launcher, ready: float) -> None:
        """The server that answered the health probe must be the one launched: its process
        (or container) holds the port. Another server that took the port meanwhile answered
        while ours was loading."""
        ours = launcher.serves_port()
        if ours is None:
            self._emit(
                f"{profile.name}: cannot prove that the server answering at "
                f"{launcher.base_url} is the one launched (its listener is not visible from "
                "here); measuring it"
            )
            return
        if ours:
            return
        port = urlsplit(launcher.base_url).port or 0
        raise ServerStartError(
            f"server {profile.name!r}: a server answered at {launcher.base_url} after "
            f"{ready:.1f}s, but not the one launched: port {port} is held by "
            f"{describe_holders(port)}, while ours (still running: "
            f"{launcher.exit_code() is None}) does not listen there. Stop the other server, "
            "or give the profile another port",
            log_path=str(launcher.log_path),
            log_tail=LogTail(launcher.log_path).tail(),
        )

    def _preflight(self, profile: ServerProfile, port: int, digest: str) -> None:
        """SGLang's own argument handling on the launch command, in the server's interpreter,
        before the load (:mod:`pytest_specdecode.servers.preflight`)."""
        started = time.monotonic()
        result = preflight(
            profile,
            profile.launch_argv(host=profile.host, port=port),
            profile.launch_env(self.env),
        )
        took = time.monotonic() - started
        if result.problem is not None:
            with self.state.edit() as entries:
                entries.pop(digest, None)
            self.counts.failed[profile.name] += 1
            raise ServerStartError(
                f"server {profile.name!r} was not launched: {result.problem} (preflight, "
                f"{took:.1f}s; --specdecode-skip-preflight launches without it)"
            )
        what = f"SGLang {result.version}" if result.version else "SGLang"
        if result.note is not None:
            self._emit(f"{profile.name}: preflight not decisive ({result.note}); launching")
        else:
            self._emit(f"{profile.name}: {what} accepts the launch command ({took:.1f}s)")

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
            self._remember_left_behind(handle.launcher, profile.name)
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
            stop_identity(entry.identity, grace=self.stop_grace)
        else:
            return  # nothing runs any more (it crashed): nothing to stop
        self.counts.stopped[entry.profile] += 1

    def _prune(self, entries: dict[str, Entry], host: str = "") -> None:
        """Forget dead servers and leases; adopt orphans (their owner died) as kept servers.

        Whether a ready server still runs is asked only of ``host``'s servers (this machine's
        for ""): that costs a call to its engine per server, under the state lock, and other
        hosts' entries decide nothing here (benchmarks/bench_fleet.py: at 100 hosts, asking
        every engine would cost 1.3 s per acquire on local sockets, far more over ssh)."""
        for digest, entry in list(entries.items()):
            entry.leases = entry.live_leases()
            owner_alive = entry.owner is not None and entry.owner.alive()
            if entry.status == "stale":
                # left behind by an engine that was down; kept until that engine answers (tried
                # once per process: an engine still down must not slow every acquire)
                if digest not in self._tried_stale:
                    self._tried_stale.add(digest)
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
            stop_identity(entry.identity, grace=grace)
            counts.stopped[entry.profile] += 1
    return counts


# -- launchers and recorded identities ---------------------------------------------------


# -- small helpers -----------------------------------------------------------------------


def _overlap(a: Sequence[int], b: Sequence[int]) -> bool:
    return bool(set(a) & set(b))


def _launch_port(profile: ServerProfile, entries: Iterable[Entry]) -> int:
    """A free port the profile's server kind accepts, with the ports it derives from it, and
    none of the ports this machine's recorded servers were given."""
    backend = backend_for(profile)
    taken = {port for entry in entries if (port := urlsplit(entry.url).port) is not None}
    return find_free_port(
        _bind_host(profile.host),
        port_range=backend.port_range,
        derived=backend.derived_ports,
        avoid=taken,
    )


def _bind_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "") else host


def _connect_host(host: str) -> str:
    return _bind_host(host)


def _api_key(profile: ServerProfile, env: Mapping[str, str]) -> str | None:
    if not profile.api_key_env:
        return None
    key = env.get(profile.api_key_env)
    if not key:
        raise ConfigError(
            f"profile {profile.name!r} sets api_key_env = {profile.api_key_env!r}, but that "
            "environment variable is not set; export it before running pytest",
            source=profile.source,
        )
    return key


def _healthy(url: str, api_key: str | None, timeout: float = 10.0) -> bool:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with httpx.Client(timeout=timeout, headers=headers, trust_env=net.trust_env(url)) as http:
            response = http.get(f"{url}/health_generate")
            if response.status_code == 404:
                response = http.get(f"{url}/health")
    except httpx.HTTPError:
        return False
    return response.status_code == 200
