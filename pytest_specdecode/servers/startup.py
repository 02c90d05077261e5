"""Starting one server for the pool, and proving that the server that answers is the one started.

:class:`ServerStarter` does one launch from start to finish: the port must be free (or the error
names who holds it), SGLang's preflight must accept the command, the launcher starts, the server
becomes ready under the profile's GPU lock, its process must hold the port (not a squatter that
answered the probe while ours loaded), and the profile's warm-up must go through. Whatever fails
on the way, Ctrl-C included, stops what was started and marks the state file's entry. *Which*
server to start, and when, is :class:`~pytest_specdecode.servers.pool.ServerPool`'s decision;
the starter only carries one out.

The small facts about a profile's server that both a launch and a reuse need live here too:
the free port a launch takes, the host it is reached on, its API key, whether it answers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import httpx

from pytest_specdecode import net
from pytest_specdecode.backends import backend_for
from pytest_specdecode.errors import ConfigError, ServerError, ServerStartError, SpecdecodeError
from pytest_specdecode.net import is_local_host
from pytest_specdecode.servers.cleanup import remember_left_behind
from pytest_specdecode.servers.factory import make_launcher
from pytest_specdecode.servers.handle import EventSink, ServerCounts, ServerHandle
from pytest_specdecode.servers.launcher import Launcher, find_free_port, port_in_use
from pytest_specdecode.servers.ports import describe_holders
from pytest_specdecode.servers.preflight import preflight
from pytest_specdecode.servers.readiness import LogTail, Progress, wait_until_ready
from pytest_specdecode.servers.state import Entry, StateFile

if TYPE_CHECKING:
    from pytest_specdecode.profiles.profile import ServerProfile

GpuLock = Callable[["ServerProfile", str], AbstractContextManager[None]]
"""The pool's lock on a profile's GPUs (:meth:`ServerPool.gpu_lock`), held while a server loads."""


class ServerStarter:
    """Launches servers for one :class:`~pytest_specdecode.servers.pool.ServerPool`, one at a
    time, counting into the pool's :class:`ServerCounts` and marking its state file."""

    def __init__(
        self,
        state: StateFile,
        counts: ServerCounts,
        *,
        log_dir: Path,
        env: Mapping[str, str],
        emit: EventSink,
        gpu_lock: GpuLock,
        preflight: bool = True,
        on_progress: Callable[[Progress], None] | None = None,
        warmup: Callable[[ServerHandle], None] | None = None,
        ready_grace: float,
    ) -> None:
        self.state = state
        self.counts = counts
        self.log_dir = log_dir
        self.env = env
        self._emit = emit
        self._gpu_lock = gpu_lock
        self.preflight = preflight
        self._on_progress = on_progress
        self._warmup = warmup
        self.ready_grace = ready_grace  # a server that logged "ready" may stay silent this long

    def start(self, profile: ServerProfile, digest: str, port: int, url: str) -> ServerHandle:
        """Launch ``profile``'s server on ``port`` (its state entry ``digest`` is ``loading``)
        and return it ready and warmed up; on any failure nothing is left running, and the
        entry is marked failed (a :class:`ServerError`) or forgotten."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        log_path = self.log_dir / f"{profile.name}-{stamp}-{os.getpid()}.log"
        key, launcher = self._launcher(profile, digest, port, log_path)
        self._check_port_free(profile, digest, launcher)
        if self.preflight and profile.kind.sglang_preflight:
            self._preflight(profile, port, digest)
        self.counts.launched[profile.name] += 1
        self._emit(f"{profile.name}: starting ({profile.launcher}) on {url}; log: {log_path}")
        try:
            ready = self._load(profile, digest, launcher, log_path, key)
            self._check_ours(profile, launcher, ready)
            handle = ServerHandle(
                profile=profile,
                base_url=launcher.base_url,
                origin="launched",
                api_key=key,
                log_path=log_path,
                ready_seconds=ready,
                launcher=launcher,
                identity=launcher.identity(),
            )
            self._emit(f"{profile.name}: ready after {ready:.1f}s")
            self._warm_up(handle, ready, log_path)
        except BaseException as exc:
            # Ctrl-C, a timeout, a crash or a failed warm-up: never leave the process or
            # container behind.
            self._give_up(profile, digest, launcher, exc)
            raise
        return handle

    def _launcher(
        self, profile: ServerProfile, digest: str, port: int, log_path: Path
    ) -> tuple[str | None, Launcher]:
        """The API key the server is started with and its (not yet started) launcher; a
        profile that cannot be started is forgotten from the state file."""
        try:
            key = api_key(profile, self.env)
            launcher = make_launcher(
                profile, port=port, log_path=log_path, env=self.env, api_key=key
            )
        except ConfigError as exc:  # no API key, no llama-server to run: nothing started
            with self.state.edit() as entries:
                entries.pop(digest, None)
            raise ServerStartError(f"server {profile.name!r} cannot be started: {exc}") from None
        return key, launcher

    def _load(
        self,
        profile: ServerProfile,
        digest: str,
        launcher: Launcher,
        log_path: Path,
        key: str | None,
    ) -> float:
        """Start the server under the profile's GPU lock, record who it is, and wait until it
        is ready: the seconds that took."""
        with self._gpu_lock(profile, digest):
            launcher.start()
            with self.state.edit() as entries:
                if digest in entries:
                    entries[digest].identity = launcher.identity()
                    entries[digest].log_path = str(log_path)
            backend = backend_for(profile)
            return wait_until_ready(
                launcher.base_url,
                name=f"server {profile.name!r}",
                timeout=profile.startup_timeout,
                exit_code=launcher.exit_code,
                log=LogTail(log_path, backend.log_phases),
                api_key=key,
                on_progress=self._on_progress,
                paths=backend.health_paths,
                ready_grace=self.ready_grace,
            )

    def _warm_up(self, handle: ServerHandle, ready: float, log_path: Path) -> None:
        """The profile's warm-up on the ready server; a failure that is not already a
        :class:`ServerError` is one of the start."""
        if self._warmup is None:
            return
        try:
            self._warmup(handle)
        except ServerError:
            raise
        except SpecdecodeError as exc:  # e.g. the server answers, but not as expected
            raise ServerStartError(
                f"server {handle.profile.name!r} was ready after {ready:.1f}s, but its warm-up "
                f"request failed: {exc}",
                log_path=str(log_path),
                log_tail=LogTail(log_path).tail(),
            ) from None

    def _give_up(
        self, profile: ServerProfile, digest: str, launcher: Launcher, exc: BaseException
    ) -> None:
        """After a failed start: count it, stop what was started, and mark the state entry
        failed (a :class:`ServerError`) or forget it (anything else, Ctrl-C included)."""
        if isinstance(exc, ServerError):
            self.counts.failed[profile.name] += 1
        elif launcher.exit_code() is None:
            self.counts.stopped[profile.name] += 1
        launcher.stop(grace=5.0)
        remember_left_behind(self.state, launcher, profile.name, self._emit)
        with self.state.edit() as entries:
            if isinstance(exc, ServerError):
                entries[digest].status = "failed"
                entries[digest].error = str(exc).splitlines()[0]
                entries[digest].identity = {}
            else:
                entries.pop(digest, None)

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


def launch_port(profile: ServerProfile, entries: Iterable[Entry]) -> int:
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


def connect_host(host: str) -> str:
    return _bind_host(host)


def api_key(profile: ServerProfile, env: Mapping[str, str]) -> str | None:
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


def healthy(url: str, api_key: str | None, timeout: float = 10.0) -> bool:
    return probe_health(url, api_key, timeout=timeout) is None


def probe_health(
    url: str,
    api_key: str | None,
    *,
    timeout: float = 10.0,
    paths: Sequence[str] = ("/health_generate", "/health"),
) -> str | None:
    """One health probe of the server at ``url``: ``None`` when it answers 200, else what it
    did instead (``GET /health_generate: HTTP 503``, ``...: no answer within 5s``), for the
    message that says why the server is given up. A 404 moves on to the next of ``paths``."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    path = paths[0]
    try:
        with httpx.Client(
            timeout=httpx.Timeout(timeout, connect=min(timeout, 5.0)),
            headers=headers,
            trust_env=net.trust_env(url),
            verify=net.tls_context(url),
        ) as http:
            for path in paths:
                response = http.get(f"{url}{path}")
                if response.status_code != 404:
                    break
    except httpx.TimeoutException:
        return f"GET {path}: no answer within {timeout:g}s"
    except httpx.HTTPError as exc:
        return f"GET {path}: {type(exc).__name__}: {exc or 'no connection'}"
    if response.status_code == 200:
        return None
    return f"GET {path}: HTTP {response.status_code}"
