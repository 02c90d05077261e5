"""One proxy rule for every HTTP client (issue #12, item 5): a server on this machine is reached
directly whatever the proxy variables say; a remote one through the user's proxy settings.

Real sockets, no mocks: a tiny HTTP server plays the SGLang server, another plays the proxy (it
answers every request itself and records the request line, which for a proxied request is the
absolute URL).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import certifi
import httpx
import pytest

from pytest_specdecode.client import MeasurementClient
from pytest_specdecode.errors import ServerTimeoutError
from pytest_specdecode.net import is_local_host, tls_context, trust_env
from pytest_specdecode.servers.readiness import wait_until_ready
from pytest_specdecode.servers.startup import healthy

REMOTE = "http://gpu-box.invalid:30000"  # .invalid never resolves: only a proxy can reach it


class _Answering(BaseHTTPRequestHandler):
    """200 "ok" to every GET, recording the request line on the server object."""

    def do_GET(self) -> None:
        self.server.lines.append(self.requestline)  # type: ignore[attr-defined]
        body = b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def answering() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on 127.0.0.1 (as server or as proxy): its URL and the request lines."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answering)
    server.lines = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", server.lines  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()


def dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def set_proxy(monkeypatch: pytest.MonkeyPatch, proxy: str) -> None:
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, proxy)


# --- the rule ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        "127.10.0.3",
        "localhost",
        "LOCALHOST.",
        "api.localhost",
        "::1",
        "[::1]",
        "0.0.0.0",
        "::",
        "::ffff:127.0.0.1",
        socket.gethostname(),
    ],
)
def test_this_machine_is_local(host: str) -> None:
    assert is_local_host(host)


@pytest.mark.parametrize(
    "host", ["gpu-box", "10.0.0.7", "192.168.1.20", "2001:db8::1", "localhost.example.com", ""]
)
def test_other_hosts_are_remote(host: str) -> None:
    assert not is_local_host(host)


def test_trust_env_is_false_for_local_urls_and_true_for_remote_ones() -> None:
    assert trust_env("http://127.0.0.1:30000") is False
    assert trust_env("http://user:pw@localhost:30000/x") is False
    assert trust_env("http://[::1]:30000") is False
    assert trust_env(REMOTE) is True
    assert trust_env("https://10.1.2.3") is True


# --- every client follows it -------------------------------------------------------------------


def test_a_local_server_is_reached_directly_despite_a_dead_proxy(
    answering: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, lines = answering
    set_proxy(monkeypatch, f"http://127.0.0.1:{dead_port()}")

    assert wait_until_ready(url, name="local", timeout=5, paths=["/health"]) < 5
    assert healthy(url, None, timeout=5)
    with MeasurementClient(url) as client:
        assert client.get("/health").status_code == 200
    # origin-form request lines, each client's: no proxy in between
    assert lines == [
        "GET /health HTTP/1.1",
        "GET /health_generate HTTP/1.1",
        "GET /health HTTP/1.1",
    ]


def test_a_remote_server_is_reached_through_the_users_proxy(
    answering: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy, lines = answering
    set_proxy(monkeypatch, proxy)

    wait_until_ready(REMOTE, name="remote", timeout=5, paths=["/health"], poll_interval=0.05)
    assert healthy(REMOTE, None, timeout=5)
    with MeasurementClient(REMOTE) as client:
        assert client.get("/health").status_code == 200
    # absolute-form request lines: each client went through the proxy
    assert lines[-3:] == [
        f"GET {REMOTE}/health HTTP/1.1",
        f"GET {REMOTE}/health_generate HTTP/1.1",
        f"GET {REMOTE}/health HTTP/1.1",
    ]


def test_no_proxy_lets_a_remote_host_bypass_the_proxy(
    answering: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy, lines = answering
    set_proxy(monkeypatch, proxy)
    monkeypatch.setenv("NO_PROXY", "gpu-box.invalid")

    with pytest.raises(ServerTimeoutError):
        wait_until_ready(REMOTE, name="remote", timeout=0.3, paths=["/health"], poll_interval=0.05)
    assert lines == []


# -- the certificate check, built once per process ---------------------------------------------


def _first_certificate(path: Path) -> str:
    bundle = Path(certifi.where()).read_text()
    end = "-----END CERTIFICATE-----\n"
    path.write_text(
        bundle[bundle.index("-----BEGIN CERTIFICATE-----") : bundle.index(end) + len(end)]
    )
    return str(path)


def test_every_client_of_local_servers_shares_one_context_with_httpxs_certificates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    shared = tls_context("http://127.0.0.1:30000")
    assert tls_context("https://localhost:30001") is shared
    assert tls_context(REMOTE) is shared  # no CA variables: certifi's bundle for every host
    # what httpx's default verify=True would have loaded, parsed once instead of per client
    expected = httpx.create_ssl_context(trust_env=False).get_ca_certs()
    assert len(shared.get_ca_certs()) == len(expected) > 100


def test_ssl_cert_file_applies_to_remote_servers_as_httpx_reads_it_not_to_local_ones(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", _first_certificate(tmp_path / "ca.pem"))
    monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path))  # the file wins, as in httpx
    remote = tls_context(REMOTE)
    assert len(remote.get_ca_certs()) == 1
    assert tls_context(REMOTE) is remote
    # trust_env=False for this machine: httpx ignores the variables there, so do we
    assert len(tls_context("http://127.0.0.1:30000").get_ca_certs()) > 100
