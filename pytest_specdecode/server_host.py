"""``--server-host``: measuring a server somebody else started, in plain Python.

The option names a server as ``HOST``, ``HOST:PORT`` or a URL (:func:`attach_url`). With target
``auto`` the server itself says whether it is the simulator (:func:`attached_target`), and a
test's server is the one found there once it answers (:func:`attach`). Nothing is launched or
stopped: the session asks this module instead of the pool.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from pytest_specdecode.backends import backend_for
from pytest_specdecode.errors import ConfigError
from pytest_specdecode.net import trust_env
from pytest_specdecode.profiles.profile import ProfileFile, ServerProfile
from pytest_specdecode.redaction import redact_url
from pytest_specdecode.servers.attach import wait_attached
from pytest_specdecode.servers.handle import ServerHandle

SGLANG_DEFAULT_PORT = 30000
ATTACH_KINDS = {"sglang": "SGLang", "llamacpp": "llama-server"}
"""The server kinds' names in the attach messages, by backend name."""


def attach(profile: ServerProfile, server_host: str, env: Mapping[str, str]) -> ServerHandle:
    """The server at ``server_host`` for ``profile``'s tests, once it answers its health probe
    (:func:`~pytest_specdecode.servers.attach.wait_attached` names the cause when it does not)."""
    backend = backend_for(profile)
    url = attach_url(server_host, profile.port or backend.default_port)
    api_key = None
    if profile.api_key_env:
        api_key = env.get(profile.api_key_env)
    wait_attached(
        url,
        kind=ATTACH_KINDS.get(backend.name, backend.name),
        health_paths=backend.health_paths,
        timeout=min(60.0, profile.startup_timeout),
        api_key=api_key,
    )
    return ServerHandle(profile=profile, base_url=url, origin="attached", api_key=api_key)


def attached_target(server_host: str, probe: ProfileFile, config: Path) -> tuple[str, str]:
    """With --server-host and target auto: the attached server says whether it is the
    simulator (``"simulated": true`` in its /server_info; real SGLang has no such field),
    so its tests compare with the simulated baselines instead of all failing on the
    fingerprint's launcher class. Returns the target and why it was chosen."""
    url = attach_url(server_host, SGLANG_DEFAULT_PORT)
    simulated, problem = reports_simulated(url)
    if simulated:
        if "sim" in probe.targets:
            return "sim", f'the server at {url} reports "simulated": true'
        return "real", (
            f'the server at {url} reports "simulated": true, but '
            f"{config} has no [targets.sim]: its real profiles are compared"
        )
    if problem is None:
        return "real", f"the server at {url} is not simulated"
    return "real", (
        f"a --server-host is given and its /server_info could not be read ({problem}); "
        "add --specdecode-target sim if it is the simulated server"
    )


def reports_simulated(url: str, timeout: float = 5.0) -> tuple[bool, str | None]:
    """Whether the server at ``url`` says it is simulated, or why that could not be read."""
    problem = "no /server_info or /get_server_info"
    try:
        with httpx.Client(timeout=timeout, trust_env=trust_env(url)) as client:
            for route in ("/server_info", "/get_server_info"):
                response = client.get(url + route)
                if response.status_code == 404:
                    continue
                if response.status_code != 200:
                    problem = f"GET {route} answered HTTP {response.status_code}"
                    break
                info = response.json()
                return isinstance(info, dict) and info.get("simulated") is True, None
    except (httpx.HTTPError, ValueError) as exc:
        problem = f"{type(exc).__name__}: {exc}"
    return False, problem


def attach_url(spec: str, default_port: int) -> str:
    """``gpu-box``, ``gpu-box:30000`` or ``http://gpu-box:30000`` → ``http://gpu-box:30000``."""
    text = spec.strip().rstrip("/")
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if not parts.hostname:
        raise ConfigError(
            f"--server-host {redact_url(spec)!r} has no host name; use HOST[:PORT] or a URL"
        )
    try:
        port = parts.port or default_port
    except ValueError:
        raise ConfigError(f"--server-host {redact_url(spec)!r} has an invalid port") from None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}:{port}"
