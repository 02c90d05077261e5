"""How much a busy machine moves the simulated server's tok/s (prints figures; not a test).

Issue 13, item 3: a baseline recorded during a busy minute hid a 6% slowdown. This benchmark runs
the simulated SGLang server (the seed's EAGLE3 2-step NCCL-tuned profile at ``--sim-speed 10``,
as ``perf_tests`` runs it) and the plugin's own measurement path
(:class:`~pytest_specdecode.client.MeasurementClient` and
:func:`~pytest_specdecode.metrics.compute_run_metrics`, the seed workload: 4 sequential
streamed requests of 500 tokens per run) against one sim process, idle and while N busy-loop
processes load the machine. Conditions are interleaved in blocks (idle, load N, ..., idle, load
N, ...) in one run, so drift of the shared machine falls on every condition alike, and each
loaded condition is shown as a ratio to the idle one measured beside it.

Per condition it prints:

* ``client tok/s`` (the plugin's ``tok_s``: Σ completion tokens / the run's wall time, what
  baselines store) with its CV over the runs and its ratio to idle;
* ``server tok/s``: the server's own schedule, Σ c_i / Σ ``e2e_latency`` (real SGLang reports
  ``e2e_latency`` in every final ``meta_info`` too), CV and ratio to idle;
* where the client's time goes beyond the server's: ``overhead ms/req`` (client e2e minus server
  e2e: HTTP, SSE parsing on both sides, the last wake-up) and ``gap ms/req`` (run wall time not
  inside any request: between one response and the next request);
* ``engine lag``: the engine's largest delay behind its own model clock so far
  (``/server_info`` ``sim_engine_max_lag_seconds``, a running maximum);
* ``server vs model`` and ``client vs model (sd)``: the model's time for exactly the draws of
  each run (prefill plus one verify cycle per ``spec_verify_ct``; needs ``--noise-cv 0``) over
  the server's and the client's time, minus one. Acceptance luck cancels, so these say what
  the machine does to each side's timing;
* what the plugin records (:class:`~pytest_specdecode.session.machine_load.LoadSampler`, the same
  sampler the plugin runs around each test's runs): ``load/CPU`` (the run queue per CPU over
  the block, this benchmark's client and sim included, the figure the plugin's warning rule
  compares), ``loadavg/CPU`` (1-minute load average at the end of the block, which lags a
  load that started seconds before) and ``busy`` (share of all CPUs' time not idle).

``python benchmarks/bench_sim_load.py [--loads 2 4] [--blocks 2] [--runs 3] [--noise-cv 0]``;
the defaults take about 90 s on a 2-core machine (keep it short: the loaded blocks slow
everything else on the machine).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tabulate import tabulate

from pytest_specdecode.client import MeasurementClient
from pytest_specdecode.metrics import compute_run_metrics
from pytest_specdecode.request_log import RunRecord
from pytest_specdecode.servers.readiness import wait_until_ready
from pytest_specdecode.session.machine_load import LoadSampler
from pytest_specdecode.sim import model
from pytest_specdecode.workloads import Workload, resolve_workload

NCCL_TUNED = {
    "NCCL_PROTO": "LL",
    "NCCL_ALGO": "Ring",
    "NCCL_P2P_LEVEL": "SYS",
    "NCCL_MAX_NCHANNELS": "16",
    "NCCL_BUFFSIZE": "16777216",
    "NCCL_NTHREADS": "512",
}
PROFILE_FLAGS = (
    "--model-path", "/shared/kimi-k2.5-int4", "--trust-remote-code", "--tp-size", "8",
    "--mem-fraction-static", "0.88", "--num-continuous-decode-steps", "4",
    "--disable-custom-all-reduce", "--speculative-algorithm", "EAGLE3",
    "--speculative-draft-model-path", "/data/eagle3/output_100k_sglang/4",
    "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "3",
)  # fmt: skip
SPEED = 10.0
#: The profile's step costs, for the model time of each request's own draws (noise CV 0 only).
COSTS = model.step_costs(
    model.PerfConfig(8, True, 4, "EAGLE3", 2, 1, 3, nccl_share=1.0, speed=SPEED),
    model.load_constants(),
)
LOAD_CODE = {
    "spin": "while True: pass",
    "memory": "b = bytearray(64 << 20)\nwhile True: c = bytes(b)",
}


@dataclass
class Condition:
    name: str
    busy_loops: int
    client: list[float] = field(default_factory=list)
    server: list[float] = field(default_factory=list)
    client_vs_model: list[float] = field(default_factory=list)
    server_vs_model: list[float] = field(default_factory=list)
    overhead_ms: list[float] = field(default_factory=list)
    gap_ms: list[float] = field(default_factory=list)
    loadavg: list[float] = field(default_factory=list)
    runnable: list[float] = field(default_factory=list)
    busy: list[float] = field(default_factory=list)
    lag_s: float = 0.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def simulated_server(noise_cv: float, log_dir: Path) -> Iterator[str]:
    """A sim subprocess in its own session; its process group is killed on exit."""
    port = free_port()
    argv = [
        sys.executable, "-m", "pytest_specdecode.sim", *PROFILE_FLAGS, "--port", str(port),
        "--sim-speed", str(SPEED), "--sim-load-seconds", "0.1", "--sim-seed", "1",
        "--sim-noise-cv", str(noise_cv), "--log-level", "warning",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "SPECDECODE_SIM_"))}
    env.update(NCCL_TUNED)
    with (log_dir / f"sim-{port}.log").open("wb") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_ready(url, name="sim", timeout=60, exit_code=proc.poll)
        yield url
    finally:
        _kill_group(proc)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextmanager
def busy_loops(count: int, kind: str = "spin") -> Iterator[None]:
    """``count`` processes busy on a CPU each, for as long as the block lasts: ``spin`` (a
    bare loop, nothing but CPU time) or ``memory`` (copying 64 MB over and over: CPU time plus
    memory bandwidth and caches, closer to a compiler or a test suite)."""
    code = LOAD_CODE[kind]
    procs = [
        subprocess.Popen([sys.executable, "-c", code], start_new_session=True) for _ in range(count)
    ]
    try:
        time.sleep(0.5 if count else 0.0)  # let the scheduler spread them before measuring
        yield
    finally:
        for proc in procs:
            _kill_group(proc)


def seed_workload() -> Workload:
    return resolve_workload(
        {
            "prompt_set": "mixed",
            "max_new_tokens": 500,
            "concurrency": 1,
            "requests_per_run": 4,
            "warmup_requests": 2,
            "flush_cache": False,
        },
        source="bench_sim_load",
    )


def measure_run(client: MeasurementClient, workload: Workload, index: int, cond: Condition) -> None:
    run: RunRecord = client.run(workload, index)
    metrics = compute_run_metrics(run)
    tokens = metrics.completion_tokens
    server_seconds = sum(float(r.server_e2e_latency or 0.0) for r in run.records)
    # The model's time for exactly these draws (prefill of the uncached prompt, then one verify
    # cycle per spec_verify_ct at batch 1): takes acceptance luck out of the comparison.
    model_seconds = sum(
        COSTS.prefill(r.prompt_tokens - (r.cached_tokens or 0))
        + (r.spec_verify_ct or 0) * COSTS.decode(1)
        for r in run.records
    )
    cond.client.append(metrics.values["tok_s"])
    cond.server.append(tokens / server_seconds)
    cond.client_vs_model.append(model_seconds / run.wall_s - 1.0)
    cond.server_vs_model.append(model_seconds / server_seconds - 1.0)
    n = len(run.records)
    cond.overhead_ms.append(1000.0 * (sum(r.e2e for r in run.records) - server_seconds) / n)
    cond.gap_ms.append(1000.0 * (run.wall_s - sum(r.e2e for r in run.records)) / n)


def measure(
    loads: Sequence[int], blocks: int, runs: int, noise_cv: float, kind: str, log_dir: Path
) -> list[Condition]:
    conditions = [Condition("idle", 0)] + [Condition(f"{n} x {kind}", n) for n in loads]
    workload = seed_workload()
    # simulated=True: each request carries its send time, as the plugin's runner sends it.
    with (
        simulated_server(noise_cv, log_dir) as url,
        MeasurementClient(url, simulated=True) as client,
    ):
        client.warmup(workload)
        index = 0
        for block in range(blocks):
            for cond in conditions:
                with busy_loops(cond.busy_loops, kind), LoadSampler() as sampler:
                    for _ in range(runs):
                        measure_run(client, workload, index, cond)
                        index += 1
                load = sampler.result()
                assert load is not None
                cond.runnable.append(load.per_cpu or float("nan"))
                cond.loadavg.append(load.loadavg[0] / load.cpus if load.loadavg else float("nan"))
                cond.busy.append(load.cpu_busy if load.cpu_busy is not None else float("nan"))
                cond.lag_s = float(client.get("/server_info").json()["sim_engine_max_lag_seconds"])
                print(
                    f"block {block + 1}/{blocks} {cond.name}: client "
                    f"{statistics.fmean(cond.client[-runs:]):.1f} tok/s, server "
                    f"{statistics.fmean(cond.server[-runs:]):.1f} tok/s",
                    flush=True,
                )
    return conditions


def _cv(values: Sequence[float]) -> float:
    return statistics.stdev(values) / statistics.fmean(values) if len(values) > 1 else 0.0


def _sd(values: Sequence[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def report(conditions: Sequence[Condition]) -> str:
    idle = conditions[0]
    idle_client, idle_server = statistics.fmean(idle.client), statistics.fmean(idle.server)
    rows = []
    for cond in conditions:
        client, server = statistics.fmean(cond.client), statistics.fmean(cond.server)
        rows.append(
            [
                cond.name,
                len(cond.client),
                f"{client:.1f}",
                f"{_cv(cond.client):.2%}",
                f"{client / idle_client - 1:+.2%}",
                f"{server:.1f}",
                f"{_cv(cond.server):.2%}",
                f"{server / idle_server - 1:+.2%}",
                f"{statistics.fmean(cond.server_vs_model):+.2%}",
                f"{statistics.fmean(cond.client_vs_model):+.2%} ({_sd(cond.client_vs_model):.2%})",
                f"{statistics.fmean(cond.overhead_ms):.1f}",
                f"{statistics.fmean(cond.gap_ms):.1f}",
                f"{cond.lag_s * 1000:.1f} ms",
                f"{statistics.fmean(cond.loadavg):.2f}",
                f"{statistics.fmean(cond.runnable):.2f}",
                f"{statistics.fmean(cond.busy):.0%}",
            ]
        )
    headers = [
        "condition",
        "runs",
        "client tok/s",
        "CV",
        "vs idle",
        "server tok/s",
        "CV",
        "vs idle",
        "server vs model",
        "client vs model (sd)",
        "overhead ms/req",
        "gap ms/req",
        "engine lag (max so far)",
        "loadavg/CPU",
        "load/CPU (plugin)",
        "busy",
    ]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--loads", type=int, nargs="+", default=[2, 4], help="busy loops")
    parser.add_argument("--blocks", type=int, default=2, help="interleaved blocks")
    parser.add_argument("--runs", type=int, default=3, help="runs per condition per block")
    parser.add_argument("--kind", choices=sorted(LOAD_CODE), default="spin", help="load kind")
    parser.add_argument("--noise-cv", type=float, default=0.0, help="the sim's run noise")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-sim-load-") as tmp:
        conditions = measure(
            args.loads, args.blocks, args.runs, args.noise_cv, args.kind, Path(tmp)
        )
    print()
    print(
        f"SIMULATED server (pytest_specdecode.sim), EAGLE3 2-step NCCL-tuned at --sim-speed "
        f"{SPEED:g}, seed workload (4 x 500 tokens, streamed), --sim-noise-cv {args.noise_cv:g}, "
        f"on {os.cpu_count()} CPUs; {args.blocks} interleaved blocks of {args.runs} runs"
    )
    print(report(conditions))
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
