"""Launchers: how a server process comes to exist and how it goes away.

Each launcher kind lives in its own module behind the :class:`~.base.Launcher` protocol; the pool
never needs to know whether a server is a local process, a container or someone else's server.
"""

from __future__ import annotations

from pytest_specdecode.launch.base import Launcher, ServerIdentity, find_free_port, wait_port_free

__all__ = ["Launcher", "ServerIdentity", "find_free_port", "wait_port_free"]
