"""Servers: how a server process comes to exist, is reused, becomes ready and goes away.

``launcher`` is the small protocol each kind of launch implements, one module a kind
(``subprocess``: local processes; ``docker``: containers), and ``factory`` picks one for a
profile; ``readiness`` waits until a server is really ready; ``state`` is the machine-wide record
of running servers; ``pool`` decides which server runs when, reuses them, and never leaves an
orphan, ``startup`` carries out one launch for it, ``cleanup`` does what needs only the state
file, and ``handle`` is a running server as a test sees it. The Docker launcher has its engine
(``docker_engine``), its containers' names and messages (``docker_container``) and a recorded
container's checks (``docker_recorded``) beside it. The pool never needs to know whether a
server is a local process, a container or someone else's server.
"""

from __future__ import annotations

from pytest_specdecode.servers.launcher import (
    Launcher,
    ServerIdentity,
    find_free_port,
    wait_port_free,
)

__all__ = ["Launcher", "ServerIdentity", "find_free_port", "wait_port_free"]
