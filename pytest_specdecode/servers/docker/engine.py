"""The Docker engine: which one a container runs on, how to reach it, what to say when it can't.

Apart from the container lifecycle (:mod:`~pytest_specdecode.servers.docker.launcher`) because more
than a launcher talks to an engine, and all of it through :func:`connect`: the build reads an
image's id before a launch, and a later session checks and stops the containers an earlier one
recorded (:mod:`~pytest_specdecode.servers.docker.recorded`).

The engine is the one ``DOCKER_HOST`` names, with ``DOCKER_TLS_VERIFY``/``DOCKER_CERT_PATH``, as
:func:`docker.from_env` reads them, unless a host of the fleet names its own engine and, over
``tcp://``, brings TLS client certificates of its own (:class:`~pytest_specdecode.fleet.EngineTLS`),
which then replace those two variables and hold whatever ``REQUESTS_CA_BUNDLE`` says. A remote
engine's host name is where its servers are reached (:func:`engine_hostname`) and decides what
they bind (:func:`container_bind_host`). An engine that does not answer is an
:class:`~pytest_specdecode.errors.EngineUnreachableError` whose message says what to do: start
it, give its host the certificates it speaks TLS with, or fix those.
"""

from __future__ import annotations

import os
import socket
import ssl
from typing import Any
from urllib.parse import urlsplit

import docker
import docker.errors
import docker.tls
import requests.exceptions

from pytest_specdecode.errors import EngineUnreachableError
from pytest_specdecode.fleet import TLS_FILES, EngineTLS

# Host names that mean "this machine": a server there is reached at 127.0.0.1.
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1", "0.0.0.0", "::", ""})
# Errors that mean "the engine did not answer" rather than "the engine said no".
ENGINE_DOWN = (docker.errors.DockerException, requests.exceptions.RequestException, OSError)


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
    except ENGINE_DOWN as exc:
        raise EngineUnreachableError(unreachable_message(docker_host, exc, tls)) from None
    try:
        client.ping()
    except ENGINE_DOWN as exc:
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
    if not name or name in LOOPBACK:
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


def docker_host_of(client: docker.DockerClient | None) -> str | None:
    """The engine address to record: the client's when it talks TCP, else ``DOCKER_HOST``."""
    if client is not None:
        base = str(client.api.base_url)
        if base.startswith(("http://", "https://")):
            return "tcp://" + base.split("://", 1)[1]
    return os.environ.get("DOCKER_HOST") or None


__all__ = [
    "ENGINE_DOWN",
    "LOOPBACK",
    "connect",
    "container_bind_host",
    "describe_engine",
    "docker_host_of",
    "engine_hostname",
    "unreachable_message",
]
