"""Start the simulated SGLang server as a real subprocess and always kill its process group."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

#: The seed's NCCL tuning (DESIGN.md section 1).
NCCL_TUNED = {
    "NCCL_PROTO": "LL",
    "NCCL_ALGO": "Ring",
    "NCCL_P2P_LEVEL": "SYS",
    "NCCL_MAX_NCHANNELS": "16",
    "NCCL_BUFFSIZE": "16777216",
    "NCCL_NTHREADS": "512",
}
#: The seed's server flags (TP8, 4 continuous decode steps, custom all-reduce off).
SEED_FLAGS = (
    "--model-path", "/shared/kimi-k2.5-int4", "--trust-remote-code", "--tp-size", "8",
    "--mem-fraction-static", "0.88", "--num-continuous-decode-steps", "4",
    "--disable-custom-all-reduce",
)  # fmt: skip
EAGLE3_2STEP = (
    "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/data/eagle3",
    "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "3",
)  # fmt: skip
EAGLE3_5STEP = (
    "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/data/eagle3",
    "--speculative-num-steps", "5", "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "6",
)  # fmt: skip


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def port_is_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class SimProcess:
    """One running simulator: its process, port and log file."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, log_path: Path) -> None:
        self.proc = proc
        self.port = port
        self.log_path = log_path
        self.base_url = f"http://127.0.0.1:{port}"

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def wait_for_log(self, text: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log():
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} not logged within {timeout}s:\n{self.log()}")
            if self.proc.poll() is not None and text not in self.log():
                raise AssertionError(f"sim exited ({self.proc.returncode}):\n{self.log()}")
            time.sleep(0.02)

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Ready = process alive and GET /health_generate answers 200 (the plugin's rule)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"sim exited ({self.proc.returncode}):\n{self.log()}")
            try:
                if httpx.get(f"{self.base_url}/health_generate", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"sim not ready within {timeout}s:\n{self.log()}")

    def client(self, **kwargs: Any) -> httpx.Client:
        kwargs.setdefault("timeout", 30.0)
        return httpx.Client(base_url=self.base_url, **kwargs)

    def generate(self, payload: dict[str, Any], **kwargs: Any) -> httpx.Response:
        with self.client() as client:
            return client.post("/generate", json=payload, **kwargs)

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=10)


def sse_events(lines: Iterator[str]) -> Iterator[str]:
    """The payloads of ``data:`` lines."""
    for line in lines:
        if line.startswith("data: "):
            yield line[len("data: ") :]


def stream_json(response: httpx.Response) -> list[Any]:
    """All JSON events of a finished SSE stream (stops at [DONE])."""
    events: list[Any] = []
    for payload in sse_events(response.iter_lines()):
        if payload == "[DONE]":
            break
        events.append(json.loads(payload))
    return events


StartSim = Callable[..., SimProcess]


class SimLauncher:
    def __init__(self, log_dir: Path) -> None:
        self._log_dir = log_dir
        self._started: list[SimProcess] = []

    def __call__(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        load_seconds: float = 0.2,
        speed: float = 20.0,
        ready: bool = True,
        base: tuple[str, ...] = SEED_FLAGS,
    ) -> SimProcess:
        port = free_port()
        log_path = self._log_dir / f"sim-{port}.log"
        argv = [
            sys.executable, "-m", "pytest_specdecode.sim", *base, "--port", str(port),
            "--sim-load-seconds", str(load_seconds), "--sim-speed", str(speed), *args,
        ]  # fmt: skip
        # The server's environment decides NCCL tuning: start from one without NCCL_*.
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
        full_env.update(env or {})
        with log_path.open("wb") as log_file:
            proc = subprocess.Popen(
                argv, stdout=log_file, stderr=subprocess.STDOUT, env=full_env,
                start_new_session=True,
            )  # fmt: skip
        sim = SimProcess(proc, port, log_path)
        self._started.append(sim)
        if ready:
            sim.wait_ready()
        return sim

    def close(self) -> None:
        for sim in self._started:
            sim.kill()


@pytest.fixture
def start_sim(tmp_path: Path) -> Iterator[StartSim]:
    launcher = SimLauncher(tmp_path)
    yield launcher
    launcher.close()


@pytest.fixture(scope="module")
def start_module_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartSim]:
    launcher = SimLauncher(tmp_path_factory.mktemp("sim"))
    yield launcher
    launcher.close()
