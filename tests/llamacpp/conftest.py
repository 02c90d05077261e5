"""Fixtures for tests against a real llama.cpp ``llama-server`` and generated tiny models.

The binary comes from ``bash scripts/build-llama-server.sh`` (about 5 minutes on 2 cores, cached
outside the clone) or from ``SPECDECODE_LLAMA_SERVER``. Without it these tests are skipped,
unless ``SPECDECODE_REQUIRE_LLAMACPP=1`` (CI, after building): then they fail, so a missing
build cannot turn into a quietly green run. The models are generated once per session into a
temporary directory (``tinymodels.generate``, well under a second); nothing is downloaded.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import httpx
import pytest

from .tinymodels import TinyModels, generate

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "build-llama-server.sh"
BUILD = "bash scripts/build-llama-server.sh"
ENV_BINARY = "SPECDECODE_LLAMA_SERVER"
ENV_REQUIRE = "SPECDECODE_REQUIRE_LLAMACPP"
#: Small and fast on a shared 2-core box: 1 thread, a 1024-token context, one slot, Prometheus on.
#: One thread because llama.cpp's threads spin-wait on each other: with 2 threads beside another
#: busy process a 0.4 s completion took up to 61 s here, and past the 60 s timeout in CI.
BASE_ARGS = ("-t", "1", "-c", "1024", "-np", "1", "--metrics")


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get(ENV_REQUIRE) == "1":
        pytest.fail(
            f"{reason}, and {ENV_REQUIRE}=1 says it must be there (did `{BUILD}` run?)",
            pytrace=False,
        )
    pytest.skip(f"{reason}; run `{BUILD}` to build it (or set {ENV_BINARY})")


def default_binary_path() -> Path:
    """Where ``scripts/build-llama-server.sh`` puts (and prints) the binary.

    Same rule as the script: ``$SPECDECODE_CACHE`` (default ``$XDG_CACHE_HOME`` or ``~/.cache``,
    plus ``pytest-specdecode``) ``/llama.cpp/<version>/build/bin/llama-server``, where the version
    is ``$LLAMA_CPP_PYTHON_VERSION`` or the script's own default.
    """
    match = re.search(r'LLAMA_CPP_PYTHON_VERSION:-([^}"]+)', BUILD_SCRIPT.read_text())
    if match is None:
        raise RuntimeError(f"no default llama-cpp-python version found in {BUILD_SCRIPT}")
    version = os.environ.get("LLAMA_CPP_PYTHON_VERSION", match.group(1))
    cache = os.environ.get("SPECDECODE_CACHE")
    if not cache:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        cache = str(Path(xdg) / "pytest-specdecode")
    return Path(cache) / "llama.cpp" / version / "build" / "bin" / "llama-server"


@dataclass(frozen=True)
class LlamaServerBinary:
    path: Path
    #: First line of ``--version``, e.g. ``version: 0.5.0-dev (build 1, commit 0c1e570)``.
    version: str


@pytest.fixture(scope="session")
def llama_server_binary() -> LlamaServerBinary:
    configured = os.environ.get(ENV_BINARY)
    path = Path(configured) if configured else default_binary_path()
    where = f"{ENV_BINARY}={configured}" if configured else str(path)
    if not (path.is_file() and os.access(path, os.X_OK)):
        _unavailable(f"no llama-server binary at {where}")
    try:
        done = subprocess.run(
            [str(path), "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        _unavailable(f"llama-server at {where} does not run: {exc}")
    output = (done.stdout + done.stderr).strip()
    if done.returncode != 0:
        _unavailable(f"`{path} --version` exited {done.returncode}: {output[-500:]}")
    first = next((line for line in output.splitlines() if line.startswith("version:")), output)
    return LlamaServerBinary(path=path, version=first)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    """All tiny models, generated once per session (``TinyModels.seconds`` says how long)."""
    return generate(tmp_path_factory.mktemp("tiny-models"), seed=0)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class LlamaServer:
    """One llama-server process in its own process group, logging to a file."""

    def __init__(
        self, proc: subprocess.Popen[bytes], port: int, log_path: Path, argv: list[str]
    ) -> None:
        self.proc = proc
        self.port = port
        self.log_path = log_path
        self.argv = argv
        self.base_url = f"http://127.0.0.1:{port}"
        #: What ``wait_ready`` saw, in order: ``(seconds since start, status or error name)``.
        self.health_seen: list[tuple[float, int | str]] = []
        self.started = time.monotonic()

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def log_when(self, ready: Callable[[str], bool], timeout: float = 10.0) -> str:
        """The log once ``ready(log)`` holds, or as it is after ``timeout`` seconds.

        llama.cpp writes its log from a worker thread (``common_log``), so a line can reach the
        file a little after the HTTP answer it belongs to: reading the log once right after
        ``/health`` says 200, or after a response, races with that thread.
        """
        deadline = time.monotonic() + timeout
        while True:
            log = self.log()
            if ready(log) or time.monotonic() > deadline:
                return log
            time.sleep(0.02)

    def _dead(self, what: str) -> AssertionError:
        return AssertionError(f"llama-server {what}; argv {self.argv}\n--- log ---\n{self.log()}")

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Poll ``GET /health`` until 200; 503 means "Loading model", refused means not bound."""
        deadline = self.started + timeout
        with httpx.Client(base_url=self.base_url, timeout=5.0) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise self._dead(f"exited with {self.proc.returncode} before it was ready")
                try:
                    status: int | str = client.get("/health").status_code
                except httpx.TransportError as exc:
                    status = type(exc).__name__
                if not self.health_seen or self.health_seen[-1][1] != status:
                    self.health_seen.append((time.monotonic() - self.started, status))
                if status == 200:
                    return
                time.sleep(0.01)
        raise self._dead(f"not ready within {timeout}s")

    def client(self, **kwargs: Any) -> httpx.Client:
        kwargs.setdefault("timeout", 60.0)
        return httpx.Client(base_url=self.base_url, **kwargs)

    def stop(self) -> None:
        """SIGTERM the whole group, SIGKILL it if it lingers; idempotent."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=10)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


StartLlamaServer = Callable[..., LlamaServer]


class LlamaServers:
    """Starts servers and remembers them, so the fixture that owns it can always stop them."""

    def __init__(self, binary: LlamaServerBinary, log_dir: Path) -> None:
        self.binary = binary
        self.log_dir = log_dir
        self.running: list[LlamaServer] = []

    def start(
        self, *args: str | Path, name: str = "llama-server", wait: bool = True
    ) -> LlamaServer:
        """Start on a free port; if another process takes the port first, llama-server exits
        with "couldn't bind HTTP server socket" and this retries on a new port (twice)."""
        for attempt in range(3):
            server = self._spawn(args, name)
            if not wait:
                return server
            try:
                server.wait_ready()
            except AssertionError:
                if attempt < 2 and "couldn't bind HTTP server socket" in server.log():
                    continue
                raise
            return server
        raise AssertionError("unreachable")

    def _spawn(self, args: tuple[str | Path, ...], name: str) -> LlamaServer:
        port = free_port()
        argv = [str(self.binary.path), "--host", "127.0.0.1", "--port", str(port)]
        argv += [*BASE_ARGS, *map(str, args)]
        log_path = self.log_dir / f"{name}-{port}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: killpg reaches any child
            )
        server = LlamaServer(proc, port, log_path, argv)
        self.running.append(server)
        return server

    def stop_all(self) -> None:
        while self.running:
            self.running.pop().stop()


@pytest.fixture
def start_llama_server(
    llama_server_binary: LlamaServerBinary, tmp_path: Path
) -> Iterator[StartLlamaServer]:
    """``start_llama_server(*args, name=...)``: a ready server on a free port, killed after
    the test whatever happens. ``BASE_ARGS`` (``-t 1 -c 1024 -np 1 --metrics``) come first."""
    servers = LlamaServers(llama_server_binary, tmp_path)
    try:
        yield servers.start
    finally:
        servers.stop_all()


@pytest.fixture(scope="module")
def module_llama_servers(
    llama_server_binary: LlamaServerBinary, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LlamaServers]:
    """Like ``start_llama_server`` for servers that several tests of one module share."""
    servers = LlamaServers(llama_server_binary, tmp_path_factory.mktemp("llama-server-logs"))
    try:
        yield servers
    finally:
        servers.stop_all()
