"""Start the simulated SGLang server as a real subprocess and always kill its process group."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import httpx
import pytest

from pytest_specdecode.backends import SGLANG_PORT_RANGE
from pytest_specdecode.servers.launcher import find_free_port

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
    """A free port the way the plugin picks one for SGLang: where every release accepts it."""
    return find_free_port("127.0.0.1", port_range=SGLANG_PORT_RANGE)


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


# -- SGLang's own client code, in a venv of its own ----------------------------------------------

REPO = Path(__file__).resolve().parents[2]
PROVISION_SCRIPT = REPO / "scripts" / "provision-sglang-client.sh"
PROVISION = "bash scripts/provision-sglang-client.sh"
ENV_CLIENT_PYTHON = "SPECDECODE_SGLANG_CLIENT_PYTHON"
ENV_REQUIRE_CLIENT = "SPECDECODE_REQUIRE_SGLANG_CLIENT"
#: The modules the tests run; importing them is the provisioning script's own completeness check.
CLIENT_IMPORTS = "import sglang.bench_serving, sglang.lang.backend.runtime_endpoint, openai"

#: Realistic English for the tokenizer and the ShareGPT-format dataset (no downloads at test time).
CORPUS = (
    "Speculative decoding lets a small draft model propose several tokens that the target model "
    "verifies in a single forward pass.",
    "When the draft guesses right, the server emits more than one token per step, so decode "
    "throughput goes up without changing the output.",
    "EAGLE3 drafts from the target model's own hidden states; its accept length is usually "
    "between two and four tokens per verify step.",
    "At tensor parallel eight, NCCL tuning matters: the ring algorithm with the low-latency "
    "protocol cuts the time of every small all-reduce.",
    "What is the capital city of France? The capital city of France is Paris, on the Seine.",
    "Explain how a radix cache reuses the prefix of a prompt that many requests share, and why "
    "the first request after a flush is slower.",
    "Write a short poem about a GPU that never sleeps and a benchmark that never ends.",
    "A baseline is only worth comparing against when it was measured under the same "
    "configuration, with the same prompts and the same output length.",
    "Why does a server that says it is healthy still answer the first requests slowly? Because "
    "CUDA graphs and caches are still warming up.",
    "Summarise the difference between time to first token and time per output token for a "
    "chat user who streams long answers.",
    "The verify step costs mostly fixed overhead, so drafting three tokens is barely cheaper "
    "than drafting six when the acceptance is low.",
    "List three reasons why two runs of the same benchmark on the same machine can differ by "
    "five percent or more.",
)

#: Trains a byte-level BPE tokenizer on the corpus and saves it where AutoTokenizer finds it.
TOKENIZER_SCRIPT = """
import json, sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

out, corpus = sys.argv[1], json.loads(sys.argv[2])
tokenizer = Tokenizer(models.BPE())
tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tokenizer.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(
    vocab_size=512, special_tokens=["<s>", "</s>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
)
tokenizer.train_from_iterator(corpus, trainer)
fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>")
fast.save_pretrained(out)
"""


def _client_unavailable(reason: str) -> NoReturn:
    if os.environ.get(ENV_REQUIRE_CLIENT) == "1":
        pytest.fail(
            f"{reason}, and {ENV_REQUIRE_CLIENT}=1 says it must be there (did `{PROVISION}` run?)",
            pytrace=False,
        )
    pytest.skip(f"{reason}; run `{PROVISION}` to provision it (or set {ENV_CLIENT_PYTHON})")


def default_client_python() -> tuple[Path, Path]:
    """Where ``scripts/provision-sglang-client.sh`` puts the venv's python, and its stamp file.

    Same rule as the script: ``$SPECDECODE_CACHE`` (default ``$XDG_CACHE_HOME`` or ``~/.cache``,
    plus ``pytest-specdecode``) ``/sglang-client/<version>/``, where the version is
    ``$SGLANG_CLIENT_VERSION`` or the script's own default.
    """
    match = re.search(r'SGLANG_CLIENT_VERSION:-([^}"]+)', PROVISION_SCRIPT.read_text())
    if match is None:
        raise RuntimeError(f"no default sglang version found in {PROVISION_SCRIPT}")
    version = os.environ.get("SGLANG_CLIENT_VERSION", match.group(1))
    cache = os.environ.get("SPECDECODE_CACHE")
    if not cache:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        cache = str(Path(xdg) / "pytest-specdecode")
    root = Path(cache) / "sglang-client" / version
    return root / "venv" / "bin" / "python", root / "complete"


@dataclass(frozen=True)
class SglangClient:
    """SGLang's client code in its venv, plus a local tokenizer and dataset for it."""

    python: Path
    tokenizer: Path
    sharegpt: Path

    def env(self) -> dict[str, str]:
        """Offline, and free of this process's Python settings and API keys."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PYTHON", "NCCL_")) and k not in ("OPENAI_API_KEY", "API_KEY")
        }
        env.update(
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            HF_DATASETS_OFFLINE="1",
            TRANSFORMERS_VERBOSITY="error",
            NO_PROXY="127.0.0.1,localhost",
            no_proxy="127.0.0.1,localhost",
        )
        return env

    def run(self, *args: str | Path, timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
        """Run the venv's python with ``args``; a non-zero exit fails with its output."""
        argv = [str(self.python), *map(str, args)]
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout, env=self.env(), check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"{argv} did not finish within {timeout}s:\n{exc.stdout}") from exc
        if done.returncode != 0:
            raise AssertionError(
                f"{argv} exited {done.returncode}\n--- stdout ---\n{done.stdout[-4000:]}"
                f"\n--- stderr ---\n{done.stderr[-4000:]}"
            )
        return done


@pytest.fixture(scope="session")
def sglang_client(tmp_path_factory: pytest.TempPathFactory) -> SglangClient:
    """The provisioned venv (skip, or fail under ``SPECDECODE_REQUIRE_SGLANG_CLIENT=1``, without
    it), a byte-level BPE tokenizer trained on ``CORPUS`` and a ShareGPT-format file of it."""
    configured = os.environ.get(ENV_CLIENT_PYTHON)
    if configured:
        python, where = Path(configured), f"{ENV_CLIENT_PYTHON}={configured}"
    else:
        python, stamp = default_client_python()
        where = str(python)
        if not stamp.is_file():
            _client_unavailable(f"no finished SGLang client venv ({stamp} is missing)")
    if not (python.is_file() and os.access(python, os.X_OK)):
        _client_unavailable(f"no SGLang client python at {where}")
    root = tmp_path_factory.mktemp("sglang-client")
    client = SglangClient(python, root / "tokenizer", root / "sharegpt.json")
    try:
        subprocess.run(
            [str(python), "-c", CLIENT_IMPORTS],
            capture_output=True, text=True, timeout=120, env=client.env(), check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        output = getattr(exc, "stderr", None) or exc
        _client_unavailable(f"the python at {where} cannot run `{CLIENT_IMPORTS}`: {output}")
    client.run("-c", TOKENIZER_SCRIPT, client.tokenizer, json.dumps(CORPUS))
    # ShareGPT's shape: each line of the corpus asked, and the next one answered.
    conversations = [
        {
            "id": f"sim-{i}",
            "conversations": [
                {"from": "human", "value": line},
                {"from": "gpt", "value": CORPUS[(i + 1) % len(CORPUS)]},
            ],
        }
        for i, line in enumerate(CORPUS)
    ]
    client.sharegpt.write_text(json.dumps(conversations), encoding="utf-8")
    return client
