"""Containers an earlier session recorded: whether one still serves, and stopping it.

The pool keeps what :meth:`~pytest_specdecode.servers.docker.launcher.DockerLauncher.identity`
returns in the machine-wide state file; a later session, with no launcher of its own, checks or
stops the container from that record alone, on the engine and with the TLS it was launched with.
Apart from the launcher because none is needed here: only the engine
(:func:`~pytest_specdecode.servers.docker.engine.connect`) and the label that marks a container as
ours.
"""

from __future__ import annotations

import logging
import math
import time

import docker.errors

from pytest_specdecode.errors import ServerStartError
from pytest_specdecode.fleet import EngineTLS
from pytest_specdecode.servers.docker.container import LABEL_MANAGED
from pytest_specdecode.servers.docker.engine import ENGINE_DOWN, connect
from pytest_specdecode.servers.launcher import ServerIdentity, wait_port_free

log = logging.getLogger(__name__)

# Tries to stop a recorded container, and the pause before the n-th retry (n x this).
STOP_ATTEMPTS = 3
RETRY_PAUSE_S = 2.0


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
    except ENGINE_DOWN:  # NotFound included
        return False
    finally:
        client.close()


def stop_docker_server(identity: ServerIdentity, grace: float = 30.0) -> bool:
    """Stop and remove a container recorded by an earlier session; wait until its port is free.

    Quiet when it is already gone. A container without our ``managed`` label is left alone. An
    engine that does not answer is asked again (:data:`STOP_ATTEMPTS` times in all: on a busy box
    a call to it can time out once, and this is often the last chance before the session ends);
    if it never does, a warning is logged and the call returns ``False`` (the caller records the
    container, to try again once the engine is back); else ``True``.
    """
    container_id = identity.get("container_id")
    if isinstance(container_id, str) and container_id:
        for attempt in range(1, STOP_ATTEMPTS + 1):
            failure = _stop_and_remove(identity, container_id, grace)
            if failure is None:
                break
            if attempt == STOP_ATTEMPTS:
                log.warning(
                    "stopping container %s failed %d times, last: %s",
                    container_id[:12],
                    STOP_ATTEMPTS,
                    failure,
                )
                return False
            time.sleep(RETRY_PAUSE_S * attempt)
    host, port = identity.get("host"), identity.get("port")
    if isinstance(host, str) and isinstance(port, int):
        wait_port_free(host, port, timeout=30.0)
    return True


def _stop_and_remove(identity: ServerIdentity, container_id: str, grace: float) -> str | None:
    """One try: ``None`` once the container is gone (or is not ours), else why not."""
    try:
        client = connect(*_recorded_engine(identity))
    except ServerStartError as exc:
        return str(exc)
    try:
        container = client.containers.get(container_id)
        if container.labels.get(LABEL_MANAGED) != "1":
            log.warning("container %s is not managed by pytest-specdecode", container_id[:12])
            return None
        container.stop(timeout=max(0, math.ceil(grace)))
        container.remove(force=True)
    except docker.errors.NotFound:
        pass
    except ENGINE_DOWN as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        client.close()
    return None


def _recorded_engine(identity: ServerIdentity) -> tuple[str | None, EngineTLS | None]:
    """The engine a recorded server runs on and the TLS it was reached with (none recorded:
    ``DOCKER_HOST`` and pytest's TLS variables, as when it was launched)."""
    value = identity.get("docker_host")
    return (value if isinstance(value, str) and value else None), EngineTLS.from_identity(identity)


__all__ = ["docker_server_alive", "stop_docker_server"]
