"""Where a busy machine puts its time into a measured run (prints figures; not a test).

Issue 27, item 2. One run of the README's main job is four sequential 500-token requests to the
simulated SGLang server; its tok/s is 2,000 tokens over the client's wall time W of the run.
This runs the plugin's own :class:`~pytest_specdecode.client.MeasurementClient` against a sim
subprocess of the 2-step profile (``eagle3-2step-nccl`` at ``--sim-speed 10``, run-to-run noise
on as in the suite) beside K busy-loop processes, and splits each run's W against the sim's own
account (``--enable-metrics``: when its schedule began, ``request_received_ts``, and its
``e2e_latency``), in ms per run:

* ``send->start``: from the client's send of each request to the start of the sim's schedule
  (its receipt without the send-time header, the send itself with it), summed over the run;
* ``end->read``: from the sim's model time of each request's last token to the client reading
  the end of its stream, summed;
* ``between``: the client's own time before the first send, between requests and after the
  last read;
* ``host share``: W minus the sim's summed e2e_latency, over W: how much of the measured time is
  the host's rather than the model's;
* ``client CPU``: CPU seconds of this process per run.

``--no-send-time`` runs the client as for a real server (no ``x-specdecode-sent-monotonic``
header): the simulator then starts each request at its receipt, as before issue 27's fix.
``python benchmarks/bench_busy_request_time.py [--runs 15] [--spinners 0 2] [--no-send-time]``:
about 40 s per spinner count on a 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench_measurement import NCCL_TUNED, SEED_FLAGS, free_port
from bench_sim_load import busy_loops
from tabulate import tabulate

from pytest_specdecode.adapters import ParsedUpdate, ProtocolAdapter, adapter_for
from pytest_specdecode.client import MeasurementClient
from pytest_specdecode.servers.readiness import wait_until_ready
from pytest_specdecode.workloads import BUILTIN_WORKLOADS

EAGLE3_2STEP = (
    "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/data/eagle3",
    "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "3",
)  # fmt: skip


def recording_adapters(started: list[float]) -> Any:
    """SGLang's adapters, also noting each request's ``request_received_ts`` (Unix s)."""

    def factory(api: str, *, model: str | None = None) -> ProtocolAdapter:
        adapter = adapter_for(api, model=model)
        parse = adapter.parse_event

        def parse_event(data: Mapping[str, Any]) -> ParsedUpdate | None:
            meta = data.get("meta_info") or {}
            if meta.get("finish_reason") and "request_received_ts" in meta:
                started.append(meta["request_received_ts"])
            return parse(data)

        object.__setattr__(adapter, "parse_event", parse_event)  # a frozen dataclass
        return adapter

    return factory


def measure(spinners: int, runs: int, send_time: bool, log: Path) -> dict[str, list[float]]:
    port = free_port()
    argv = [
        sys.executable, "-m", "pytest_specdecode.sim", *SEED_FLAGS, *EAGLE3_2STEP,
        "--port", str(port), "--sim-speed", "10", "--sim-load-seconds", "0.1",
        "--enable-metrics", "--log-level", "warning",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "SPECDECODE_SIM_"))}
    env.update(NCCL_TUNED)
    with log.open("wb") as out:
        sim = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    figures: dict[str, list[float]] = {}
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_ready(url, name="sim", timeout=60, exit_code=sim.poll)
        workload = BUILTIN_WORKLOADS["seed"]
        to_unix = time.time() - time.perf_counter()
        started: list[float] = []
        adapters = recording_adapters(started)
        with (
            busy_loops(spinners),
            MeasurementClient(url, adapters=adapters, simulated=send_time) as client,
        ):
            client.warmup(workload)
            for index in range(runs):
                started.clear()
                cpu = time.process_time()
                run = client.run(workload, index)
                cpu = time.process_time() - cpu
                records = run.records
                e2e = [r.server_e2e_latency or 0.0 for r in records]
                wall = run.t_end - run.t_start
                between = wall - sum(r.t_end - r.t_start for r in records)
                send = [s - (r.t_start + to_unix) for s, r in zip(started, records, strict=True)]
                read = [
                    (r.t_end + to_unix) - (s + d)
                    for s, d, r in zip(started, e2e, records, strict=True)
                ]
                for name, value in (
                    ("tok/s", run_tok_s(records, wall)),
                    ("send->start ms", 1e3 * sum(send)),
                    ("end->read ms", 1e3 * sum(read)),
                    ("between ms", 1e3 * between),
                    ("host share %", 100 * (wall - sum(e2e)) / wall),
                    ("client CPU ms", 1e3 * cpu),
                ):
                    figures.setdefault(name, []).append(value)
    finally:
        os.killpg(sim.pid, signal.SIGTERM)
        sim.wait()
    return figures


def run_tok_s(records: Any, wall: float) -> float:
    return float(sum(r.completion_tokens for r in records)) / wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--spinners", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--no-send-time", action="store_true", help="as for a real server")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for spinners in args.spinners:
            figures = measure(spinners, args.runs, not args.no_send_time, Path(tmp) / "sim.log")
            for name, values in figures.items():
                rows.append(
                    [spinners, name, f"{statistics.fmean(values):.2f}",
                     f"{statistics.stdev(values):.2f}", f"{max(values):.2f}"]
                )  # fmt: skip
    header = "with" if not args.no_send_time else "WITHOUT"
    print(
        f"SIMULATED server (eagle3-2step-nccl, --sim-speed 10), {args.runs} runs of the seed "
        f"workload per spinner count, client {header} the send-time header; per run:"
    )
    print(tabulate(rows, headers=["spinners", "figure", "mean", "SD", "max"], tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
