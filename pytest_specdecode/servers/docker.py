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
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import socket
import ssl
import threading
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import docker
import docker.errors
import docker.tls
import docker.types
import requests.exceptions
from docker.models.containers import Container

from pytest_specdecode.errors import EngineUnreachableError, ServerStartError
from pytest_specdecode.fleet import TLS_FILES, EngineTLS
from pytest_specdecode.redaction import is_secret_name
from pytest_specdecode.servers.launcher import ServerIdentity, redact_argv, wait_port_free
from pytest_specdecode.servers.ports import pids_hold_port

log = logging.getLogger(__name__)

LABEL_MANAGED = "pytest-specdecode.managed"
LABEL_FINGERPRINT = "pytest-specdecode.fingerprint"
LABEL_PROFILE = "pytest-specdecode.profile"
LABEL_PORT = "pytest-specdecode.port"

# exit_code() when the container disappeared (removed behind our back, engine restarted) or the
# engine stopped answering: there is no real exit code to report.
VANISHED_EXIT_CODE = -1

# The test image scripts/provision-docker.sh builds; named in the missing-image error.
SIM_IMAGE = "pytest-specdecode-sim:local"

_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1", "0.0.0.0", "::", ""})
# Consecutive failed engine calls exit_code() tolerates before it reports the server gone.
_ENGINE_FAILURES_TOLERATED = 3
# Errors that mean "the engine did not answer" rather than "the engine said no".
_ENGINE_DOWN = (docker.errors.DockerException, requests.exceptions.RequestException, OSError)


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
        self._docker_host = docker_host or _docker_host_of(client)
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
        if self.host not in _LOOPBACK:
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
        except _ENGINE_DOWN as exc:
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
            with contextlib.suppress(*_ENGINE_DOWN):
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
        except _ENGINE_DOWN as exc:
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
        except _ENGINE_DOWN as exc:
            self._note(f"stopping {self.name} failed: {exc}")
        try:
            container.remove(force=True)
            removed = True
        except docker.errors.NotFound:
            removed = True
        except _ENGINE_DOWN as exc:
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
        except _ENGINE_DOWN:
            return None
        titles = [str(t).upper() for t in top.get("Titles") or []]
        if "PID" not in titles:
            return None
        column = titles.index("PID")
        pids = [int(row[column]) for row in top.get("Processes") or [] if row[column].isdigit()]
        return pids_hold_port(pids, self.port)

    def identity(self) -> ServerIdentity:
        """What the pool's state file records, for :func:`docker_server_alive` and
        :func:`stop_docker_server` in a later session."""
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
            except _ENGINE_DOWN as exc:
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
            f"{_image_name(old)}) on the Docker engine at {describe_engine(self._docker_host)}; "
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
            self._docker_host = self._fixed_engine or _docker_host_of(None)  # DOCKER_HOST now
            self._client = connect(self._docker_host, self._tls)
        return self._client

    def _close_client(self) -> None:
        if self._own_client and self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None


# -- servers recorded by an earlier session -------------------------------------------------------


def docker_server_alive(identity: ServerIdentity) -> bool:
    """Whether the recorded container still exists, is running and is one of ours.

    ``False`` also when its engine no longer answers: the server cannot be used then either.
    """
    container_id = identity.get("container_id")
    if not isinstance(container_id, str) or not container_id:
        return False
    try:
        client = connect(*_recorded_engine(identity))
    except ServerStartError:
        return False
    try:
        container = client.containers.get(container_id)
        return container.status == "running" and container.labels.get(LABEL_MANAGED) == "1"
    except _ENGINE_DOWN:  # NotFound included
        return False
    finally:
        client.close()


def stop_docker_server(identity: ServerIdentity, grace: float = 30.0) -> bool:
    """Stop and remove a container recorded by an earlier session; wait until its port is free.

    Quiet when it is already gone. A container without our ``managed`` label is left alone. When
    the engine does not answer, nothing can be done: a warning is logged and the call returns
    ``False`` (the caller keeps the record, to try again once the engine is back); else ``True``.
    """
    container_id = identity.get("container_id")
    if isinstance(container_id, str) and container_id:
        try:
            client = connect(*_recorded_engine(identity))
        except ServerStartError as exc:
            log.warning("cannot stop container %s: %s", container_id[:12], exc)
            return False
        try:
            container = client.containers.get(container_id)
            if container.labels.get(LABEL_MANAGED) != "1":
                log.warning("container %s is not managed by pytest-specdecode", container_id[:12])
                return True
            container.stop(timeout=max(0, math.ceil(grace)))
            container.remove(force=True)
        except docker.errors.NotFound:
            pass
        except _ENGINE_DOWN as exc:
            log.warning("stopping container %s failed: %s", container_id[:12], exc)
            return False
        finally:
            client.close()
    host, port = identity.get("host"), identity.get("port")
    if isinstance(host, str) and isinstance(port, int):
        wait_port_free(host, port, timeout=30.0)
    return True


# -- the engine ----------------------------------------------------------------------------------


def connect(docker_host: str | None = None, tls: EngineTLS | None = None) -> docker.DockerClient:
    """A client for the engine ``DOCKER_HOST`` names (or ``docker_host``), checked with a ping.

    ``tls``: the engine's own client certificates (a host of the fleet), in place of pytest's
    ``DOCKER_TLS_VERIFY``/``DOCKER_CERT_PATH``; ``None`` leaves those to apply."""
    environment = dict(os.environ)
    if docker_host is not None:
        environment["DOCKER_HOST"] = docker_host
    _probe_unix_socket(environment.get("DOCKER_HOST") or None)
    try:
        if tls is None:
            client = docker.from_env(environment=environment)
        else:
            client = _OwnTLSClient(environment.get("DOCKER_HOST"), _tls_config(tls, docker_host))
    except _ENGINE_DOWN as exc:
        raise EngineUnreachableError(unreachable_message(docker_host, exc, tls)) from None
    try:
        client.ping()
    except _ENGINE_DOWN as exc:
        client.close()
        raise EngineUnreachableError(unreachable_message(docker_host, exc, tls)) from None
    return client


class _OwnTLSAPIClient(docker.APIClient):
    """An API client that keeps its TLS settings whatever the environment says: requests lets
    ``REQUESTS_CA_BUNDLE`` or ``CURL_CA_BUNDLE`` replace a session's ``verify`` on every
    request (docker/docker-py#2433), so a box that points them at the system's CAs (CI images
    do) would check the engine's certificate against those, not the host's ca.pem, and fail."""

    def merge_environment_settings(
        self, url: Any, proxies: Any, stream: Any, verify: Any, cert: Any
    ) -> Any:
        settings = super().merge_environment_settings(url, proxies, stream, verify, cert)
        if verify is None:  # the call named none: the client's (the CA file, or False)
            settings["verify"] = self.verify
        return settings


class _OwnTLSClient(docker.DockerClient):
    """``docker.DockerClient`` over :class:`_OwnTLSAPIClient` (proxies still from the
    environment, as the CLI takes them)."""

    def __init__(self, base_url: str | None, tls: docker.tls.TLSConfig) -> None:
        self.api = _OwnTLSAPIClient(base_url=base_url, tls=tls)


def _tls_config(tls: EngineTLS, docker_host: str | None) -> docker.tls.TLSConfig:
    """The SDK's TLS settings for ``tls``; its files missing (a certificate directory removed
    since the server was recorded) is an :class:`EngineUnreachableError` that names them."""
    missing = tls.missing()
    if missing:
        raise EngineUnreachableError(
            f"cannot reach the Docker engine at {describe_engine(docker_host)} over TLS: "
            f"{', '.join(missing)} {'does' if len(missing) == 1 else 'do'} not exist (the client "
            f"certificate directory must hold {', '.join(TLS_FILES)}); restore them, or fix the "
            "host's tls_cert_path"
        )
    return docker.tls.TLSConfig(client_cert=tls.client_cert, ca_cert=tls.ca_cert, verify=tls.verify)


def _probe_unix_socket(docker_host: str | None) -> None:
    """Fail early, and without leaking a socket, when a local engine's socket does not answer.

    The SDK leaves the socket of a refused connection unclosed (a ResourceWarning), and its
    client cannot be closed when its constructor fails; probing first avoids both.
    """
    if docker_host and not docker_host.startswith("unix://"):
        return
    path = docker_host[len("unix://") :] if docker_host else "/var/run/docker.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5.0)
        try:
            sock.connect(path)
        except OSError as exc:
            raise EngineUnreachableError(unreachable_message(docker_host, exc)) from None


def describe_engine(docker_host: str | None) -> str:
    host = docker_host or os.environ.get("DOCKER_HOST")
    if host:
        return f"DOCKER_HOST={host}"
    return "the local socket unix:///var/run/docker.sock (DOCKER_HOST is not set)"


def engine_hostname(docker_host: str | None) -> str | None:
    """The machine a remote engine runs on (``tcp://gpu-box:2376`` → ``gpu-box``), or ``None``
    for a local one (unix socket, npipe, loopback)."""
    host = docker_host if docker_host is not None else os.environ.get("DOCKER_HOST")
    if not host:
        return None
    parts = urlsplit(host if "://" in host else f"tcp://{host}")
    if parts.scheme not in ("tcp", "http", "https", "ssh"):
        return None
    name = parts.hostname
    if not name or name in _LOOPBACK:
        return None
    return name


def container_bind_host(network: str = "host", docker_host: str | None = None) -> str:
    """The ``--host`` a server in a container should bind.

    ``127.0.0.1`` on host networking with a local engine (nothing leaves the machine);
    ``0.0.0.0`` when the port is published from a bridge network, or when the engine is remote
    (``DOCKER_HOST=tcp://gpu-box:...``), where 127.0.0.1 would be loopback on the GPU box and
    out of the test machine's reach.
    """
    if network != "host" or engine_hostname(docker_host) is not None:
        return "0.0.0.0"
    return "127.0.0.1"


def unreachable_message(
    docker_host: str | None, exc: BaseException, tls: EngineTLS | None = None
) -> str:
    where = describe_engine(docker_host)
    if tls is not None:
        where += f" ({tls.describe()})"
        if _tls_failed(exc):
            return (
                f"cannot reach the Docker engine at {where}: the TLS handshake failed: {exc}. "
                f"The engine's certificate must be signed by {tls.ca_cert}, and the engine must "
                f"trust the CA that signed {tls.client_cert[0]}: give the host the certificate "
                "directory made for that engine (tls_cert_path, or its Docker context's TLS "
                "material)"
            )
    elif "HTTP request to an HTTPS server" in str(exc):
        return (
            f"cannot reach the Docker engine at {where}: {exc}. The engine speaks TLS: give its "
            "host tls_cert_path, the directory of its client certificates (ca.pem, cert.pem, "
            "key.pem), or export DOCKER_CERT_PATH and DOCKER_TLS_VERIFY=1 for every host"
        )
    return (
        f"cannot reach the Docker engine at {where}: {exc}. "
        "Start the engine (on a CI machine without one: `bash scripts/provision-docker.sh` "
        "installs and starts it), or point DOCKER_HOST at one that runs "
        "(e.g. DOCKER_HOST=tcp://gpu-box:2376)"
    )


def _tls_failed(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is a failed TLS handshake. A reset counts:
    an engine that refuses the client certificate under TLS 1.3 does so after the client has
    sent its request, which the peer may then reset rather than answer with an alert."""
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            return False
        if isinstance(seen, (ssl.SSLError, requests.exceptions.SSLError, ConnectionResetError)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def missing_image_message(image: str, docker_host: str | None) -> str:
    how = (
        "build it with `bash scripts/provision-docker.sh`"
        if image == SIM_IMAGE
        else f"pull it (`docker pull {image}`) or build it"
    )
    return (
        f"Docker image {image!r} is not present on the engine at {describe_engine(docker_host)}; "
        f"{how}. The launcher never pulls images itself: a multi-GB pull must not eat the "
        "server's startup timeout. (The simulated server's test image, "
        f"{SIM_IMAGE}, is built by scripts/provision-docker.sh.)"
    )


def start_failure_message(
    name: str, image: str, reason: str, gpus: Sequence[int] | int | None
) -> str:
    message = f"the Docker engine could not start container {name} ({image}): {reason}"
    if device_requests(gpus) and ("device driver" in reason or "gpu" in reason.lower()):
        message += (
            f". The container asks for GPUs {describe_gpus(gpus)}: the engine needs the NVIDIA "
            "Container Toolkit (nvidia-ctk runtime configure --runtime=docker, then restart "
            "dockerd); or set the profile's gpus to none"
        )
    return message


# -- pure helpers --------------------------------------------------------------------------------


def device_requests(gpus: Sequence[int] | int | None) -> list[docker.types.DeviceRequest]:
    """GPUs as docker device requests: a count (``-1`` = all) or explicit device ids."""
    if gpus is None or isinstance(gpus, bool):
        return []
    if isinstance(gpus, int):
        if gpus == 0:
            return []
        return [docker.types.DeviceRequest(count=gpus, capabilities=[["gpu"]])]
    if not gpus:
        return []
    return [docker.types.DeviceRequest(device_ids=[str(g) for g in gpus], capabilities=[["gpu"]])]


def describe_gpus(gpus: Sequence[int] | int | None) -> str:
    if not device_requests(gpus):
        return "none"
    if isinstance(gpus, int):
        return "all" if gpus < 0 else f"any {gpus}"
    return ",".join(str(g) for g in gpus or ())


def container_name(name: str | None, port: int) -> str:
    """A valid container name (``[a-zA-Z0-9][a-zA-Z0-9_.-]*``) from the caller's ``name``."""
    if not name:
        return f"pytest-specdecode-{port}-{uuid.uuid4().hex[:8]}"
    cleaned = re.sub(r"[^a-zA-Z0-9_.-]+", "-", name).strip("-.")
    if not cleaned or not cleaned[0].isalnum():
        cleaned = f"specdecode-{cleaned}".rstrip("-")
    return cleaned[:128]


def redact_env(name: str, value: str) -> str:
    return "***" if is_secret_name(name) else value


def _docker_host_of(client: docker.DockerClient | None) -> str | None:
    """The engine address to record: the client's when it talks TCP, else ``DOCKER_HOST``."""
    if client is not None:
        base = str(client.api.base_url)
        if base.startswith(("http://", "https://")):
            return "tcp://" + base.split("://", 1)[1]
    return os.environ.get("DOCKER_HOST") or None


def _recorded_engine(identity: ServerIdentity) -> tuple[str | None, EngineTLS | None]:
    """The engine a recorded server runs on and the TLS it was reached with (none recorded:
    ``DOCKER_HOST`` and pytest's TLS variables, as when it was launched)."""
    value = identity.get("docker_host")
    return (value if isinstance(value, str) and value else None), EngineTLS.from_identity(identity)


def _image_name(container: Container) -> str:
    with contextlib.suppress(Exception):
        return str(container.attrs["Config"]["Image"])
    return "?"


__all__ = [
    "LABEL_FINGERPRINT",
    "LABEL_MANAGED",
    "LABEL_PROFILE",
    "VANISHED_EXIT_CODE",
    "DockerLauncher",
    "container_bind_host",
    "docker_server_alive",
    "stop_docker_server",
]
