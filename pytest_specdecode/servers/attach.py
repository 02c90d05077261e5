"""``--server-host``: wait for the attached server, and when it is not a ready server of the
profile's kind, say which of the causes it is within seconds.

An attached server is somebody else's process: there is no exit code to poll and no log to
read phases from. What its port answers still tells the causes apart:

* **nothing listens** (connection refused): no server there, or SGLang still loading its
  weights (it opens its HTTP port only after the load);
* **unreachable** (connect timeouts, unknown host): the host or a proxy is in the way;
* **not this kind of server**: it answers HTTP, but none of the health routes exists (a
  plain web server, another service's port), with what each route it was asked answered;
* **still starting**: the health route answers 503 (SGLang warming up, llama-server loading
  its model); waited for, up to the attach timeout, then reported as such;
* **wants an API key**: 401/403.

The option names a server as ``HOST``, ``HOST:PORT`` or a URL (:func:`attach_url`). With target
``auto`` the server itself says whether it is the simulator (:func:`attached_target`), and a
test's server is the one found there once it answers (:func:`attach`). Nothing is launched or
stopped: the session asks this module instead of the pool.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from pytest_specdecode import net
from pytest_specdecode.backends import backend_for
from pytest_specdecode.errors import AttachError, ConfigError
from pytest_specdecode.profiles.profile import TARGET_SIM, ProfileFile, ServerProfile
from pytest_specdecode.redaction import redact_url
from pytest_specdecode.servers.handle import ServerHandle

REFUSED_GRACE = 5.0
"""Seconds of refused (or failed) connections before the cause is reported: long enough for a
server restarting its listener, short enough that a wrong port costs seconds, not a minute."""
# Routes asked about when no health route exists, to say what the port does serve.
_OTHER_ROUTES = ("/server_info", "/get_server_info", "/v1/models", "/")


def wait_attached(
    url: str,
    *,
    kind: str,
    health_paths: Sequence[str],
    timeout: float,
    api_key: str | None = None,
    poll_interval: float = 0.5,
    probe_timeout: float = 5.0,
    transport: httpx.BaseTransport | None = None,
) -> float:
    """Block until ``url`` answers one of ``health_paths`` with 200; return the seconds waited.
    ``kind`` names the server kind in messages (``SGLang``). Raises :class:`AttachError`."""
    start = time.monotonic()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    paths = list(health_paths)
    failing_since: float | None = None
    status_since: float | None = None
    with httpx.Client(
        base_url=url,
        headers=headers,
        timeout=httpx.Timeout(probe_timeout, connect=min(probe_timeout, 2.0)),
        transport=transport,
        trust_env=net.trust_env(url),
        verify=net.tls_context(url),
    ) as http:
        while True:
            now = time.monotonic()
            try:
                response = http.get(paths[0])
            except httpx.TransportError as exc:
                failing_since = failing_since or now
                if now - failing_since >= REFUSED_GRACE:
                    raise AttachError(
                        _cannot_connect(url, kind, exc, now - failing_since)
                    ) from None
            else:
                failing_since = None
                code = response.status_code
                if code == 200:
                    return time.monotonic() - start
                if code == 404 and len(paths) > 1:
                    paths.pop(0)
                    continue
                if code == 404:
                    raise AttachError(_not_this_kind(http, url, kind, health_paths))
                if code in (401, 403):
                    raise AttachError(
                        f"the server at {url} refused {paths[0]} with HTTP {code}: it requires "
                        "an API key; set the profile's api_key_env to the name of an "
                        "environment variable that holds it"
                    )
                status_since = status_since or now
                if now - start >= timeout:
                    raise AttachError(
                        f"the {kind} server at {url} is still starting: GET {paths[0]} "
                        f"answered HTTP {code} for {now - status_since:.0f}s ({_status_hint(code)}"
                        f"); wait until it answers 200 before running the tests, or launch it "
                        "from the profile instead of attaching"
                    )
            time.sleep(poll_interval)


def _cannot_connect(url: str, kind: str, exc: httpx.TransportError, seconds: float) -> str:
    if isinstance(exc, httpx.ConnectError) and "refused" in str(exc).lower():
        return (
            f"nothing accepts connections at {url} (connection refused for {seconds:.0f}s): no "
            f"server listens on that port, or {kind} is still loading (SGLang opens its port "
            "only after its weights are loaded). Check --server-host's host and port, or "
            "start the server and wait until it is ready"
        )
    return (
        f"cannot connect to {url} for {seconds:.0f}s ({type(exc).__name__}: {exc}): is the "
        "host reachable from here, and the port open? A proxy from HTTP_PROXY/HTTPS_PROXY "
        "applies to remote hosts; add the host to NO_PROXY to go direct"
    )


def _not_this_kind(http: httpx.Client, url: str, kind: str, health_paths: Sequence[str]) -> str:
    """What the port answered instead: every health route and a few others, by status."""
    answers = [f"{path} 404" for path in health_paths]
    for path in _OTHER_ROUTES:
        try:
            answers.append(f"{path} {http.get(path).status_code}")
        except httpx.TransportError as exc:
            answers.append(f"{path} {type(exc).__name__}")
    return (
        f"the server at {url} answers HTTP but is not {kind}: GET {', '.join(answers)}. Point "
        f"--server-host at the {kind} server's port"
    )


def _status_hint(code: int) -> str:
    if code == 503:
        return "SGLang answers 503 while it warms up; llama-server while it loads its model"
    return "neither ready nor an error the plugin knows"


SGLANG_DEFAULT_PORT = 30000


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
        kind=profile.kind.server_name,
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
        if TARGET_SIM in probe.targets:
            return TARGET_SIM, f'the server at {url} reports "simulated": true'
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
        with httpx.Client(
            timeout=timeout, trust_env=net.trust_env(url), verify=net.tls_context(url)
        ) as client:
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
