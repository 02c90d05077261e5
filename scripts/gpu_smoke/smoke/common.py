"""What every part of the gpu-smoke driver shares: where the state lives, the rig, the knobs, the
pytest runner, and the readers of what pytest and SGLang wrote.

The state directory ($GPU_SMOKE_STATE, default /tmp/gpu-smoke) holds:

* ``baselines/<card>/...``: the suite's baselines, kept apart by the plugin's hardware key;
* ``cards/<card>/``: what one card gave: ``results/*.json`` (one file per unit: a profile of
  record or check, the attach, a noise batch, the probe), ``logs/`` (pytest output, servers
  started by hand), ``pt-*/`` (the pytest sessions' basetemps, where the plugin's server logs
  are), ``baselines-attach/`` and ``baselines-spread/``;
* ``state.json``: the state's sequence number (``state.py``);
* ``models/``, ``suite/``, ``shim/`` and the plugin's own state dirs: rebuilt by every call,
  never carried out.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]  # scripts/gpu_smoke
REPO = HERE.parents[1]
STATE = Path(os.environ.get("GPU_SMOKE_STATE", "/tmp/gpu-smoke"))
OUT = Path(os.environ.get("OUT") or STATE / "out")
MODELS = STATE / "models"
SUITE = STATE / "suite"
BASELINES = STATE / "baselines"
PROFILES = ("smoke-nospec", "smoke-eagle3-match", "smoke-eagle3-miss")
PROFILE_TESTS = {
    "smoke-nospec": "test_nospec",
    "smoke-eagle3-match": "test_eagle3_match",
    "smoke-eagle3-miss": "test_eagle3_miss",
}
EXPECTED_ACCEPT = {"smoke-eagle3-match": 3.0, "smoke-eagle3-miss": 1.0}
CONTRACT_NOISE = REPO / "tests" / "contract" / "data" / "h200_noise.json"
INCOMPLETE = 3  # a phase that stopped before the call's deadline: run the same command again
SERVER_ENV = {  # every launch: the plugin's env set carries the last three; SGLang sets the first
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "HF_HUB_OFFLINE": "1",
}
DRY_RUN = os.environ.get("GPU_SMOKE_DRY_RUN") == "1"
# The rig: "llama8b" (Llama-3.1-8B's shape and size, built on the GPU, GPU-bound with CUDA
# graphs on) or "tiny" (the 4-layer model of 2026-12-01/02, host-bound; the dry run's folders).
RIG_NAME = os.environ.get("GPU_SMOKE_RIG") or ("tiny" if DRY_RUN else "llama8b")
RIG = {
    "tiny": {"target": "tiny-llama", "prefix": "tiny"},
    "llama8b": {"target": "llama8b", "prefix": "llama8b"},
}[RIG_NAME]
# CUDA graphs on for the target and the draft (decode batch sizes up to 4: the workloads send
# one request at a time); triton attention (no FlashAttention-3 library on the image), no
# grammar backend (no xgrammar).
SGLANG_FLAGS = [
    "--attention-backend", "triton", "--grammar-backend", "none", "--cuda-graph-max-bs", "4",
]  # fmt: skip


def log(msg: str) -> None:
    print(f"gpu-smoke: {msg}", flush=True)


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def deadline() -> float:
    """GPU_SMOKE_DEADLINE, seconds since the epoch: no unit starts that would end after it."""
    return float(os.environ.get("GPU_SMOKE_DEADLINE", "inf"))


def seconds_left() -> float:
    return deadline() - time.time()


def baseline_launches() -> int:
    """Launches per recorded baseline. 1 by default: the rig's launch means spread 0.8-1.6%
    (tests/contract/data/h200_noise.json) against the suite's -25% margins, every launch of
    the 8B rig costs 1.5-2 minutes, and the noise summary measures the launch-to-launch
    difference anyway (record against check). A baseline of one launch is judged with the
    plugin's stated launch prior."""
    return env_int("GPU_SMOKE_BASELINE_LAUNCHES", 1)


@functools.lru_cache(maxsize=1)
def card() -> str:
    """This machine's hardware key as the plugin names the baselines' folder (e.g.
    ``1xNVIDIA-H200``; ``simulated`` in the dry run; PYTEST_SPECDECODE_HARDWARE_KEY wins)."""
    from pytest_specdecode.session.provenance import detect_gpus, hardware_key

    override = os.environ.get("PYTEST_SPECDECODE_HARDWARE_KEY") or None
    gpus = None if DRY_RUN else detect_gpus()
    return str(hardware_key(gpus, simulated=DRY_RUN, override=override))


def card_dir(key: str | None = None) -> Path:
    return STATE / "cards" / (key or card())


def results_dir(key: str | None = None) -> Path:
    return card_dir(key) / "results"


def logs_dir() -> Path:
    return card_dir() / "logs"


@functools.lru_cache(maxsize=1)
def boot_id() -> str:
    """Which boot of which machine this is: the first server launched on a boot compiles its
    triton kernels (a minute or more), later ones find them in the cache."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return f"pid-{os.getppid()}"


def save(name: str, result: dict[str, Any]) -> None:
    d = results_dir()
    d.mkdir(parents=True, exist_ok=True)
    result.setdefault("boot", boot_id())
    result.setdefault("card", card())
    (d / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")


def load(name: str) -> dict[str, Any] | None:
    path = results_dir() / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def ready_times(output: str) -> list[float]:
    return [float(v) for v in re.findall(r"ready after ([0-9.]+)s", output)]


def preflight_times(output: str) -> list[float]:
    """The plugin's 'SGLang 0.5.15 accepts the launch command (27.2s)' lines."""
    return [float(v) for v in re.findall(r"accepts the launch command \(([0-9.]+)s\)", output)]


def plugin_args() -> list[str]:
    names = {ep.name for ep in metadata.entry_points(group="pytest11")}
    return [] if "specdecode" in names else ["-p", "pytest_specdecode.plugin"]


def run_pytest(
    tag: str, args: list[str], *, timeout: float = 1500, env: dict[str, str] | None = None
) -> tuple[int, str, float]:
    """pytest in the suite directory; its output to the console and logs/<tag>.txt."""
    logs = logs_dir()
    logs.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pytest", *plugin_args(), "--specdecode-target", "real",
        "--specdecode-config", str(SUITE / "specdecode.toml"), *args,
    ]  # fmt: skip
    skip = "--specdecode-skip-preflight"
    if os.environ.get("GPU_SMOKE_SKIP_PREFLIGHT") == "1" and skip not in cmd:
        cmd.append(skip)
    log(f"[{tag}] $ {' '.join(cmd)}")
    full_env = dict(os.environ, **SERVER_ENV, **(env or {}))
    start = time.monotonic()
    with (logs / f"{tag}.txt").open("w") as f:
        proc = subprocess.Popen(
            cmd, cwd=SUITE, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            f.write(line)
            if tag.startswith(("record", "check", "attach", "spread")):
                sys.stdout.write(line)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = -9
    return rc, "".join(lines), time.monotonic() - start


def sglang_accept_lens(basetemp: Path) -> dict[str, list[float]]:
    """SGLang's own 'accept len' per profile, from the server logs the plugin wrote."""
    found: dict[str, list[float]] = {}
    for path in sorted(basetemp.rglob("*.log")):
        profile = next((p for p in (*PROFILES, "smoke-launch") if path.name.startswith(p)), None)
        if profile is None:
            continue
        text = path.read_text("utf-8", "replace")
        values = [float(v) for v in re.findall(r"accept len: ([0-9.]+)", text)]
        found.setdefault(profile, []).extend(values)
    return found


def report_tests(report: Path) -> list[dict[str, Any]]:
    if not report.exists():
        return []
    tests: list[dict[str, Any]] = json.loads(report.read_text()).get("tests", [])
    return tests


def report_rows(report: Path) -> dict[str, dict[str, Any]]:
    """profile -> what the table shows of its test in a plugin JSON report."""
    rows: dict[str, dict[str, Any]] = {}
    for t in report_tests(report):
        summary = t.get("summary") or {}
        tok = summary.get("tok_s") or {}
        rows[t.get("profile", "?")] = {
            "test": t.get("test_id"),
            "outcome": t.get("outcome"),
            "tok_s": tok.get("mean"),
            "tok_s_cv": tok.get("cv"),
            "accept_length": (summary.get("accept_length") or {}).get("mean"),
            "runs": tok.get("n"),
            "hardware_key": t.get("hardware_key"),
            "message": (t.get("message") or "")[:400],
        }
    return rows


def fmt(v: object, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec) if isinstance(v, (int, float)) else str(v)
