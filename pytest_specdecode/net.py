"""How the plugin reaches a server: one rule for proxies, used by every HTTP client it builds.

A server on this machine (a launched server, the simulator, ``--server-host localhost``) is
reached directly, whatever the proxy variables say: a corporate ``HTTP_PROXY`` rarely lists
127.0.0.1 in ``NO_PROXY``, and a proxy between the plugin and a local server either refuses the
connection or adds its own latency to every measured token (see the SGLang reference, §7.4). A
server on another machine (``--server-host gpu-box``, a remote docker engine) is reached the way
the user's environment says: ``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY`` and ``NO_PROXY``
apply exactly as httpx applies them, since that is the route the user chose for that host.

Readiness probes, the measurement client and the pool's health checks all ask :func:`trust_env`,
so one server is never probed one way and measured another, and take their certificate check
from :func:`tls_context`, built once per process.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import socket
import ssl

import certifi
import httpx

# Names that resolve to this machine on every system we run on (RFC 6761 reserves *.localhost).
_LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


def is_local_host(host: str) -> bool:
    """Whether ``host`` (a name or an IP address, IPv6 with or without brackets) is this
    machine: ``localhost`` and ``*.localhost``, a loopback address (127.0.0.0/8, ``::1``), the
    unspecified address (``0.0.0.0``, ``::``: a client connecting to it reaches this machine),
    or this machine's own host name. No name is resolved: a DNS lookup would cost time on every
    client and could itself hang."""
    name = host.strip().strip("[]").rstrip(".").lower()
    if not name:
        return False
    if name in _LOCAL_NAMES or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name.partition("%")[0])  # fe80::1%eth0: drop the zone
    except ValueError:
        return name == socket.gethostname().rstrip(".").lower()
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback or address.is_unspecified


def trust_env(url: str | httpx.URL) -> bool:
    """httpx's ``trust_env`` for a client of the server at ``url``: ``False`` for a server on
    this machine (:func:`is_local_host`: reached directly, proxy variables ignored), ``True``
    for any other host (the user's proxy settings, ``NO_PROXY`` included, as httpx reads them)."""
    return not is_local_host(httpx.URL(str(url)).host)


def tls_context(url: str | httpx.URL) -> ssl.SSLContext:
    """The certificate check of a client of the server at ``url``: the one httpx's default
    ``verify=True`` builds (the CA file ``SSL_CERT_FILE`` or directory ``SSL_CERT_DIR`` where the
    client trusts the environment, :func:`trust_env`; else certifi's bundle), built once per
    process for each such source and shared. httpx builds a new context for every client, which
    parses certifi's bundle again (about 30 ms of CPU), and a session makes a client for every
    probe and every test, mostly of plain ``http://`` servers. A context is safe to share
    between clients and threads."""
    cafile = capath = None
    if trust_env(url):
        cafile = os.environ.get("SSL_CERT_FILE") or None
        capath = None if cafile else os.environ.get("SSL_CERT_DIR") or None
    return _tls_context(cafile, capath)


@functools.lru_cache(maxsize=8)
def _tls_context(cafile: str | None, capath: str | None) -> ssl.SSLContext:
    if cafile is None and capath is None:
        cafile = certifi.where()
    return ssl.create_default_context(cafile=cafile, capath=capath)
