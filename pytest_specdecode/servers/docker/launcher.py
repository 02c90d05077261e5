"""Servers in containers: the ``docker`` launcher, through the Docker SDK (never the CLI).

The container runs the server's own command line (``python3 -m sglang.launch_server ...``) the way
SGLang's docs run it (sglang-api.md §5 "Docker"): GPUs through a device request, ``ipc=host``, a
large ``/dev/shm``, the profile's environment (NCCL variables included) and volumes, and labels
that carry the profile's fingerprint, so a later session can tell what a container runs.

Networking: ``network="host"`` (the default, and the only mode the CI machines support: their
engine runs without the default bridge) has the server bind the host's port directly; any other
network publishes ``port/tcp`` on the same host port.

Remote engines: the client comes from :func:`docker.from_env`, so ``DOCKER_HOST`` (with
``DOCKER_TLS_VERIFY``/``DOCKER_CERT_PATH``) points it at another machine; a host of the fleet
names its engine and, over ``tcp://``, may bring TLS client certificates of its own
(:class:`~pytest_specdecode.fleet.EngineTLS`), which then replace those two variables for
every call to that engine, including the later sessions' checks and stops of its servers.
The server then runs on *that* machine, and :attr:`DockerLauncher.base_url` uses the engine's
host name (``DOCKER_HOST=tcp://gpu-box:2376`` → ``http://gpu-box:<port>``) instead of
``127.0.0.1``, unless the caller's ``host`` names a specific non-loopback host, which wins.
Volume paths are paths on the engine's machine.

The container's output is copied into ``log_path`` by a daemon thread while it runs, so the
readiness watcher reads the load phase live; the file starts with a line naming the container,
its image and id. The launcher never pulls an image: a missing image is a
:class:`~pytest_specdecode.errors.ServerStartError` that says how to get it.

This module is the lifecycle of one container, :class:`DockerLauncher`, from :meth:`start` to
:meth:`stop`. What needs no launcher lives next to it: reaching the engine, TLS included, in
:mod:`~pytest_specdecode.servers.docker.engine`; the labels, name, GPUs and failure messages of
a container in :mod:`~pytest_specdecode.servers.docker.container`; and a later session's checks
and stops of the containers an earlier one recorded in
:mod:`~pytest_specdecode.servers.docker.recorded`.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.models.containers import Container

from pytest_specdecode.errors import EngineUnreachableError, ServerStartError
from pytest_specdecode.fleet import EngineTLS
from pytest_specdecode.servers.docker.container import (
    LABEL_MANAGED,
    LABEL_PORT,
    container_name,
    describe_gpus,
    device_requests,
    image_name,
    missing_image_message,
    redact_env,
    start_failure_message,
)
from pytest_specdecode.servers.docker.engine import (
    ENGINE_DOWN,
    LOOPBACK,
    connect,
    describe_engine,
    docker_host_of,
    engine_hostname,
    unreachable_message,
)
from pytest_specdecode.servers.launcher import ServerIdentity, redact_argv, wait_port_free
from pytest_specdecode.servers.ports import pids_hold_port

# exit_code() when the container disappeared (removed behind our back, engine restarted) or the
# engine stopped answering: there is no real exit code to report.
VANISHED_EXIT_CODE = -1

# Consecutive failed engine calls exit_code() tolerates before it reports the server gone.
_ENGINE_FAILURES_TOLERATED = 3


class DockerLauncher:
    """One server in one container, owned from :meth:`start` until :meth:`stop`."""

    kind = "docker"

    def __init__(
        self,
        *,
        image: str,
        command: Sequence[str],
        env: Mapping[str, str],
        host: str,
        port: int,
        log_path: Path,
        gpus: Sequence[int] | int | None,
        shm_size: str = "32g",
        volumes: Mapping[str, str] | None = None,
        network: str = "host",
        labels: Mapping[str, str] | None = None,
        name: str | None = None,
        client: docker.DockerClient | None = None,
        init: bool = True,
        docker_host: str | None = None,
        tls: EngineTLS | None = None,
    ) -> None:
        """``command`` is the server's argv inside the container; ``env`` its whole environment
        (``PYTHONUNBUFFERED=1`` is added unless set, so its log reaches us line by line);
        ``host`` is where the caller reaches the server (see the module doc for remote
        engines); ``gpus`` is a count (``-1`` = all), explicit device indices, or ``None``/0/empty
        for none; ``volumes`` maps host paths to container paths (mounted read-write);
        ``init`` runs docker's tiny init as PID 1 so SIGTERM reaches the server and its
        children are reaped. ``docker_host`` and ``tls``: a host of the fleet's engine and the
        TLS its client speaks there (``None``: ``DOCKER_HOST`` and pytest's TLS variables).
        """
        self.image = image
        self.command = list(command)
        self.env = dict(env)
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        self.host = host
        self.port = port
        self.log_path = log_path
        self.gpus = gpus
        self.shm_size = shm_size
        self.volumes = dict(volumes or {})
        self.network = network
        self.labels = dict(labels or {})
        self.name = container_name(name, port)
        self.init = init
        self._client = client
        self._own_client = client is None
        # A host of the fleet names its engine; otherwise DOCKER_HOST (or the client's).
        self._fixed_engine = docker_host
        self._docker_host = docker_host or docker_host_of(client)
        self._tls = tls
        self._container: Container | None = None
        self._container_id: str | None = None
        self._final_code: int | None = None
        self._engine_failures = 0
        self._stopped = False
        self.left_behind = False
        """After :meth:`stop`: the container could not be removed (its engine did not answer)."""
        self._log_lock = threading.Lock()
        self._log_thread: threading.Thread | None = None
        self._log_stream: Any = None

    # -- where the server is -------------------------------------------------------------------

    @property
    def connect_host(self) -> str:
        """The host name the server is reached at (see the module doc)."""
        if self.host not in LOOPBACK:
            return self.host
        return engine_hostname(self._docker_host) or "127.0.0.1"

    @property
    def base_url(self) -> str:
        host = self.connect_host
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    @property
    def container_id(self) -> str | None:
        return self._container_id

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        if self._container is not None or self._stopped:
            raise RuntimeError(f"container {self.name} was already started")
        client = self._get_client()
        try:
            image = client.images.get(self.image)
        except docker.errors.ImageNotFound:
            raise ServerStartError(missing_image_message(self.image, self._docker_host)) from None
        except ENGINE_DOWN as exc:
            raise EngineUnreachableError(
                unreachable_message(self._docker_host, exc, self._tls)
            ) from None
        kwargs = self.create_kwargs()
        container = self._create(client, kwargs)
        self._container = container
        self._container_id = container.id
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.write_text(self._header(container, image.id))
        try:
            container.start()
        except docker.errors.APIError as exc:
            reason = exc.explanation or str(exc)
            self._note(f"the engine could not start the container: {reason}")
            with contextlib.suppress(*ENGINE_DOWN):
                container.remove(force=True)
            self._stopped = True
            self._final_code = VANISHED_EXIT_CODE
            raise ServerStartError(
                start_failure_message(self.name, self.image, reason, self.gpus),
                log_path=str(self.log_path),
            ) from None
        self._log_thread = threading.Thread(
            target=self._pump_logs,
            args=(container,),
            name=f"docker-logs-{self.name}",
            daemon=True,
        )
        self._log_thread.start()

    def exit_code(self) -> int | None:
        """``None`` while the container is created or running; its exit code once it exited;
        :data:`VANISHED_EXIT_CODE` when it disappeared or the engine stopped answering."""
        if self._final_code is not None or self._container is None:
            return self._final_code
        try:
            self._container.reload()
        except docker.errors.NotFound:
            self._note(
                f"container {self.name} ({self._short_id}) vanished: removed by someone else?"
            )
            return self._finish(VANISHED_EXIT_CODE)
        except ENGINE_DOWN as exc:
            self._engine_failures += 1
            if self._engine_failures < _ENGINE_FAILURES_TOLERATED:
                return None
            self._note(f"the Docker engine stopped answering ({exc}); giving up on {self.name}")
            return self._finish(VANISHED_EXIT_CODE)
        self._engine_failures = 0
        state: Mapping[str, Any] = self._container.attrs.get("State", {})
        if state.get("Status") in ("exited", "dead", "removing"):
            code = int(state.get("ExitCode", VANISHED_EXIT_CODE))
            oom = " (killed by the kernel: out of memory)" if state.get("OOMKilled") else ""
            self._join_logs(timeout=2.0)  # the last lines first: the caller shows the log tail
            self._note(f"container {self.name} exited with code {code}{oom}")
            return self._finish(code)
        return None

    def stop(self, grace: float = 30.0) -> None:
        """``docker stop`` (SIGTERM, SIGKILL after ``grace`` s), remove, wait for the port."""
        if self._stopped:
            return
        self._stopped = True
        container = self._container
        if container is None:
            self._close_client()
            return
        removed = False
        try:
            container.stop(timeout=max(0, math.ceil(grace)))
            if self._final_code is None:
                container.reload()
                self._final_code = int(container.attrs.get("State", {}).get("ExitCode", -1))
        except docker.errors.NotFound:
            pass
        except ENGINE_DOWN as exc:
            self._note(f"stopping {self.name} failed: {exc}")
        try:
            container.remove(force=True)
            removed = True
        except docker.errors.NotFound:
            removed = True
        except ENGINE_DOWN as exc:
            self._note(f"removing {self.name} failed: {exc}")
        # The engine did not answer: the container may be back with it (exited, not removed).
        self.left_behind = not removed
        if self._final_code is None:
            self._final_code = VANISHED_EXIT_CODE
        self._close_log_stream()
        self._join_logs(timeout=5.0)
        self._note(f"container {self.name} stopped and removed")
        self._close_client()
        wait_port_free(self.connect_host, self.port, timeout=30.0)

    def serves_port(self) -> bool | None:
        """On host networking with a local engine, whether a process of the container listens
        on the port (the engine lists the container's processes with host pids); on a published
        port, the engine bound it when the container started (and would have failed to, had
        it been taken), so a running container proves it; a remote engine: unknown."""
        if self._container is None or self.exit_code() is not None:
            return None
        if self.network != "host":
            return True
        if engine_hostname(self._docker_host) is not None:
            return None
        try:
            top = self._container.top()
        except ENGINE_DOWN:
            return None
        titles = [str(t).upper() for t in top.get("Titles") or []]
        if "PID" not in titles:
            return None
        column = titles.index("PID")
        pids = [int(row[column]) for row in top.get("Processes") or [] if row[column].isdigit()]
        return pids_hold_port(pids, self.port)

    def identity(self) -> ServerIdentity:
        """What the pool's state file records, for a later session's
        :func:`~pytest_specdecode.servers.docker.recorded.docker_server_alive` and
        :func:`~pytest_specdecode.servers.docker.recorded.stop_docker_server`."""
        return {
            "kind": self.kind,
            "container_id": self._container_id,
            "name": self.name,
            "image": self.image,
            "host": self.connect_host,
            "port": self.port,
            "network": self.network,
            "docker_host": self._docker_host,
            **(self._tls.identity() if self._tls is not None else {}),
        }

    # -- what the container looks like ---------------------------------------------------------

    def create_kwargs(self) -> dict[str, Any]:
        """The arguments of ``client.containers.create`` (no engine needed; tests read them)."""
        kwargs: dict[str, Any] = {
            "image": self.image,
            "command": list(self.command),
            "name": self.name,
            "environment": dict(self.env),
            "labels": {
                **self.labels,
                LABEL_MANAGED: "1",
                LABEL_PORT: str(self.port),
            },
            "ipc_mode": "host",
            "shm_size": self.shm_size,
            "init": self.init,
            "detach": True,
            "stdin_open": False,
            "tty": False,
        }
        if self.volumes:
            kwargs["volumes"] = {
                os.path.expanduser(src): {"bind": dst, "mode": "rw"}
                for src, dst in self.volumes.items()
            }
        if self.network == "host":
            kwargs["network_mode"] = "host"
        else:
            kwargs["network_mode"] = self.network
            kwargs["ports"] = {f"{self.port}/tcp": self.port}
        requests_ = device_requests(self.gpus)
        if requests_:
            kwargs["device_requests"] = requests_
        return kwargs

    def _create(self, client: docker.DockerClient, kwargs: dict[str, Any]) -> Container:
        for attempt in (1, 2):
            try:
                return client.containers.create(**kwargs)
            except docker.errors.APIError as exc:
                if exc.status_code == 409 and attempt == 1 and self._remove_stale(client):
                    continue
                reason = exc.explanation or str(exc)
                raise ServerStartError(
                    f"the Docker engine refused to create container {self.name} from "
                    f"{self.image}: {reason}"
                ) from None
            except ENGINE_DOWN as exc:
                raise EngineUnreachableError(
                    unreachable_message(self._docker_host, exc, self._tls)
                ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _remove_stale(self, client: docker.DockerClient) -> bool:
        """A container of ours with this name that is not running is removed; else refuse."""
        try:
            old = client.containers.get(self.name)
        except docker.errors.NotFound:
            return True  # gone meanwhile: just retry
        if old.labels.get(LABEL_MANAGED) == "1" and old.status != "running":
            old.remove(force=True)
            return True
        raise ServerStartError(
            f"a container named {self.name} already exists ({old.status}, image "
            f"{image_name(old)}) on the Docker engine at {describe_engine(self._docker_host)}; "
            f"remove it (`docker rm -f {self.name}`) or give this profile another name"
        )

    # -- the log file --------------------------------------------------------------------------

    def _header(self, container: Container, image_id: str | None) -> str:
        env = " ".join(f"{k}={redact_env(k, v)}" for k, v in sorted(self.env.items()))
        return (
            f"# pytest-specdecode: container {self.name} (id {container.id}) from image "
            f"{self.image} ({image_id}) on {describe_engine(self._docker_host)}; "
            f"network {self.network}; gpus {describe_gpus(self.gpus)}; url {self.base_url}\n"
            f"# env: {env}\n"
            f"# $ {' '.join(redact_argv(self.command))}\n"
        )

    def _pump_logs(self, container: Container) -> None:
        """Copy the container's output into the log file until it ends (daemon thread)."""
        try:
            stream = container.logs(stream=True, follow=True)
            self._log_stream = stream
            with open(self.log_path, "ab") as fh:
                for chunk in stream:
                    with self._log_lock:
                        fh.write(chunk)
                        fh.flush()
        except Exception as exc:  # the thread must never die with a traceback on stderr
            if not self._stopped:
                self._note(f"reading the container's log stopped: {exc}")

    def _note(self, message: str) -> None:
        """Append one line of ours to the log, marked so it is not taken for the server's."""
        with self._log_lock, contextlib.suppress(OSError), open(self.log_path, "a") as fh:
            fh.write(f"# pytest-specdecode: {message}\n")

    def _join_logs(self, timeout: float) -> None:
        thread = self._log_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _close_log_stream(self) -> None:
        stream = self._log_stream
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.close()

    # -- small helpers -------------------------------------------------------------------------

    @property
    def _short_id(self) -> str:
        return (self._container_id or "?")[:12]

    def _finish(self, code: int) -> int:
        self._final_code = code
        return code

    def _get_client(self) -> docker.DockerClient:
        if self._client is None:
            self._docker_host = self._fixed_engine or docker_host_of(None)  # DOCKER_HOST now
            self._client = connect(self._docker_host, self._tls)
        return self._client

    def _close_client(self) -> None:
        if self._own_client and self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None


__all__ = ["VANISHED_EXIT_CODE", "DockerLauncher"]
