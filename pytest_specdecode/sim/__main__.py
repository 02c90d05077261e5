"""``python -m pytest_specdecode.sim``: start a simulated SGLang server the way SGLang starts.

The load phases (weights, KV pool, CUDA graphs) run before anything binds the port, so the port
refuses connections while "loading", exactly like SGLang. Then uvicorn serves the app and the
warm-up request runs; ``/health`` answers 503 until it has finished.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence

import uvicorn

from pytest_specdecode import __version__
from pytest_specdecode.sim.app import build_app
from pytest_specdecode.sim.args import StartupError, parse_args
from pytest_specdecode.sim.faults import fail_during_load
from pytest_specdecode.sim.logs import (
    SCHEDULER_LOGGER,
    configure_logging,
    main_log,
    uvicorn_log_config,
)
from pytest_specdecode.sim.model import MODEL_CONSTANTS_PATH, load_constants
from pytest_specdecode.sim.server import SimServer

scheduler_log = logging.getLogger(SCHEDULER_LOGGER)


def log_banner(server: SimServer) -> None:
    sim = server.sim
    main_log.info(
        "[simulated] pytest-specdecode %s simulated SGLang server speaking SGLang %s - figures "
        "are simulated, not measured on hardware",
        __version__,
        server.release,
    )
    if sim.launch_cv > 0:
        main_log.info(
            "[simulated] launch speed factor %.4f (launch CV %g, launch seed %d)",
            server.launch_factor,
            sim.launch_cv,
            sim.launch_seed,
        )
    main_log.info(
        "[simulated] performance model: %s; NCCL tuning share %.2f (communication share %.2f); "
        "sim seed %d, speed x%g, slowdown x%g, accept scale x%g, noise CV %g, fault %s",
        MODEL_CONSTANTS_PATH,
        server.nccl_share,
        server.communication_share,
        sim.seed,
        sim.speed,
        sim.slowdown,
        sim.accept_scale,
        sim.noise_cv,
        sim.fault or "none",
    )
    if sim.noise_choice is not None:
        main_log.info("[simulated] %s", sim.noise_choice.describe())
    if sim.env_knobs:
        main_log.warning(
            "[simulated] injected from the environment (test knobs, not part of any profile): %s",
            " ".join(sim.env_knobs),
        )
    for note in server.resolved.notes:
        main_log.warning("%s", note)
    fields = ", ".join(f"{key}={value!r}" for key, value in server.resolved.fields.items())
    main_log.info("server_args=ServerArgs(%s)", fields)


class _LoadClock:
    """Sleeps through the load phases: ``--sim-load-seconds`` (over ``--sim-speed``) shared out
    by the model's load shares, less the phases this server has not (a draft model, graphs)."""

    def __init__(self, server: SimServer) -> None:
        shares = dict(server.constants.load_shares)
        if not server.speculative:
            shares["draft_weights"] = shares["draft_cuda_graph"] = 0.0
        if server.args.disable_cuda_graph:
            shares["cuda_graph"] = shares["draft_cuda_graph"] = 0.0
        self.shares = shares
        self.total_share = sum(shares.values()) or 1.0
        self.seconds = server.sim.load_seconds / server.sim.speed

    def wait(self, phase: str) -> float:
        """Sleep through ``phase``; its duration (seconds)."""
        duration = self.seconds * self.shares[phase] / self.total_share
        time.sleep(duration)
        return duration


def run_load_phases(server: SimServer) -> None:
    """Log and wait through SGLang's startup phases; nothing listens on the port meanwhile.

    The wording follows the release spoken: the target's and then the draft's weights, one KV
    pool per model, then the CUDA-graph capture (one line pair per graph from 0.5.14 on, skipped
    with ``--disable-cuda-graph``)."""
    clock = _LoadClock(server)
    has_draft_model = server.speculative and server.args.speculative_algorithm != "NGRAM"
    avail = _load_weights(server, clock.wait, has_draft_model)
    avail = _allocate_kv_pools(server, avail, clock.wait, has_draft_model)
    if server.sim.fault == "exit-during-load":
        _die_in_first_capture(server, avail, clock)
    if server.era.graph_capture_per_graph:
        avail = _capture_per_graph(server, avail, clock.wait)
    elif not server.args.disable_cuda_graph:
        avail = _capture_legacy(server, avail, clock.wait)
    _log_memory_summary(server, avail)


def _load_weights(server: SimServer, wait: Callable[[str], float], has_draft_model: bool) -> float:
    """The target's weights, then the draft model's (NGRAM has none); the GPU memory left (GB)."""
    memory = server.memory
    gpu = server.constants.memory["gpu_memory_gb"] - 1.4
    architecture = server.model_info()["architectures"][0]
    target_weights = memory.weights_gb - (
        server.constants.memory["draft_weights_gb_per_gpu"] if server.speculative else 0.0
    )
    avail = _load_model_weights(
        wait,
        "weights",
        architecture,
        gpu,
        target_weights,
        "Init torch distributed ends. elapsed=0.19 s, mem usage=0.09 GB",
    )
    if has_draft_model:
        eagle3 = server.args.speculative_algorithm == "EAGLE3"
        draft_type = f"{architecture}{'Eagle3' if eagle3 else 'NextN'}"
        avail = _load_model_weights(
            wait,
            "draft_weights",
            draft_type,
            avail,
            memory.weights_gb - target_weights,
            "Init torch distributed ends. elapsed=0.00 s, mem usage=0.00 GB",
        )
    return avail


def _load_model_weights(
    wait: Callable[[str], float],
    phase: str,
    model_type: str,
    avail: float,
    usage: float,
    distributed_ends: str,
) -> float:
    """One model's torch-distributed init (``distributed_ends``: its closing line) and weight
    load, ``usage`` GB of the ``avail`` GB; the GPU memory left (GB)."""
    scheduler_log.info("Init torch distributed begin.")
    scheduler_log.info(distributed_ends)
    scheduler_log.info("Load weight begin. avail mem=%.2f GB", avail)
    elapsed = wait(phase)
    avail -= usage
    scheduler_log.info(
        "Load weight end. elapsed=%.2f s, type=%s, dtype=torch.bfloat16, avail mem=%.2f GB, "
        "mem usage=%.2f GB.",
        elapsed,
        model_type,
        avail,
        usage,
    )
    return avail


def _allocate_kv_pools(
    server: SimServer, avail: float, wait: Callable[[str], float], has_draft_model: bool
) -> float:
    """The KV cache: one pool, or from 0.5.14 on one per model (target 80 %, draft 20 %); the
    GPU memory left (GB)."""
    memory, era = server.memory, server.era
    wait("kv_pool")
    pools = [memory.kv_cache_gb]
    if has_draft_model and era.graph_capture_per_graph:
        pools = [memory.kv_cache_gb * 0.8, memory.kv_cache_gb * 0.2]  # target, draft
    for pool in pools:
        half = pool / 2
        if era.graph_capture_per_graph:
            scheduler_log.info(
                "KV Cache is allocated. dtype: torch.bfloat16, #tokens: %d, K size: %.2f GB, "
                "V size: %.2f GB",
                memory.max_total_num_tokens,
                half,
                half,
            )
        else:
            scheduler_log.info(
                "KV Cache is allocated. #tokens: %d, K size: %.2f GB, V size: %.2f GB",
                memory.max_total_num_tokens,
                half,
                half,
            )
        avail -= pool
        scheduler_log.info("Memory pool end. avail mem=%.2f GB", avail)
    return avail


def _die_in_first_capture(server: SimServer, avail: float, clock: _LoadClock) -> None:
    """The ``exit-during-load`` fault: the first CUDA-graph capture begins, and half-way
    through it the server dies."""
    # dies inside the first capture, as real SGLang does when capture runs out of memory
    if server.era.graph_capture_per_graph:
        scheduler_log.info(
            "Capture target prefill CUDA graph begin. backend=breakable, avail mem=%.2f GB",
            avail,
        )
    else:
        scheduler_log.info(
            "Capture cuda graph begin. This can take up to several minutes. avail mem=%.2f GB",
            avail,
        )
    time.sleep(clock.seconds * server.constants.load_shares["cuda_graph"] / clock.total_share / 2)
    fail_during_load()


def _log_memory_summary(server: SimServer, avail: float) -> None:
    """SGLang's closing line of the load: token and request limits, GPU memory left."""
    args, memory = server.args, server.memory
    scheduler_log.info(
        "max_total_num_tokens=%d, chunked_prefill_size=%d, max_prefill_tokens=%d, "
        "max_running_requests=%d, context_len=%d, available_gpu_mem=%.2f GB",
        memory.max_total_num_tokens,
        args.chunked_prefill_size,
        args.max_prefill_tokens,
        memory.max_running_requests,
        memory.context_len,
        avail,
    )


def _capture_legacy(server: SimServer, avail: float, wait: Callable[[str], float]) -> float:
    """0.5.6-0.5.13: one capture for the target, one for the draft."""
    scheduler_log.info(
        "Capture cuda graph begin. This can take up to several minutes. avail mem=%.2f GB", avail
    )
    elapsed = wait("cuda_graph")
    avail -= server.memory.cuda_graph_gb
    scheduler_log.info(
        "Capture cuda graph end. Time elapsed: %.2f s. mem usage=%.2f GB. avail mem=%.2f GB.",
        elapsed,
        server.memory.cuda_graph_gb,
        avail,
    )
    if server.speculative:
        scheduler_log.info(
            "Capture draft cuda graph begin. This can take up to several minutes. "
            "avail mem=%.2f GB",
            avail,
        )
        elapsed = wait("draft_cuda_graph")
        avail -= 0.3
        scheduler_log.info(
            "Capture draft cuda graph end. Time elapsed: %.2f s. mem usage=0.30 GB. "
            "avail mem=%.2f GB.",
            elapsed,
            avail,
        )
    return avail


def _capture_per_graph(server: SimServer, avail: float, wait: Callable[[str], float]) -> float:
    """0.5.14+: a begin/end pair per graph (target prefill, target decode or verify, draft
    prefill, draft decode), as the real 0.5.15 log shows; none with --disable-cuda-graph."""
    args, fields = server.args, server.resolved.fields
    config = fields.get("cuda_graph_config") or {}
    decode = config.get("decode", {})
    prefill = config.get("prefill", {})
    if args.disable_cuda_graph:
        for _ in (0, 1) if server.speculative else (0,):
            main_log.info(
                "Disable prefill CUDA graph because cuda_graph_config resolved "
                "prefill.backend='disabled' (e.g. via --cuda-graph-backend-prefill=disabled or "
                "auto-disable rules)."
            )
        return avail
    bs = [b for b in decode.get("bs", [1]) if b <= (args.max_running_requests or 160)]
    tokens = prefill.get("bs", [4])
    graphs = [
        ("target prefill", f"backend=breakable, num_tokens={tokens}", "cuda_graph", 0.6),
        (
            "target verify" if server.speculative else "target decode",
            f"backend=full, num_tokens_per_bs={server.num_draft_tokens}, bs={bs}",
            "cuda_graph",
            0.4,
        ),
    ]
    if server.speculative and args.speculative_algorithm != "NGRAM":
        graphs += [
            ("draft prefill", f"backend=breakable, num_tokens={tokens}", "draft_cuda_graph", 0.2),
            (
                "draft decode",
                f"backend=full, num_tokens_per_bs=1, bs={bs}",
                "draft_cuda_graph",
                0.8,
            ),
        ]
    for name, detail, phase, part in graphs:
        scheduler_log.info(
            "Capture %s CUDA graph begin. %s, avail mem=%.2f GB", name, detail, avail
        )
        elapsed = wait(phase) * part
        usage = server.memory.cuda_graph_gb * part / 2
        avail -= usage
        scheduler_log.info(
            "Capture %s CUDA graph end. elapsed=%.2f s, mem usage=%.2f GB, avail mem=%.2f GB.",
            name,
            elapsed,
            usage,
            avail,
        )
    return avail


def startup_failure(error: StartupError) -> int:
    """What SGLang prints when its argument resolution raises: a traceback, exit status 1."""
    print(
        "Traceback (most recent call last):\n"
        '  File "sglang/launch_server.py", in <module>\n'
        "    server_args = prepare_server_args(sys.argv[1:])\n"
        '  File "sglang/srt/server_args.py", in __post_init__\n'
        "    self._handle_deprecated_args()\n"
        '  File "sglang/srt/server_args.py", in _handle_deprecated_args\n'
        "    raise ValueError(\n"
        f"ValueError: {error}",
        file=sys.stderr,
        flush=True,
    )
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    try:
        resolved = parse_args(argv, os.environ)
    except StartupError as exc:
        return startup_failure(exc)
    configure_logging(resolved.server.log_level, rank=resolved.server.tp_size > 1)
    server = SimServer(resolved, load_constants(), os.environ)
    log_banner(server)
    run_load_phases(server)
    level = resolved.server.log_level_http or resolved.server.log_level
    config = uvicorn.Config(
        build_app(server),
        host=server.args.host,
        port=server.args.port,
        loop="asyncio",
        http="h11",
        lifespan="on",
        log_config=uvicorn_log_config(level),
        timeout_keep_alive=5,
        # A hung stream (the ``hang`` fault) must not keep SIGTERM from ending the server.
        timeout_graceful_shutdown=5,
    )
    uvicorn_server = uvicorn.Server(config)
    # What start-up made lives as long as the server: out of the collector's reach, a full
    # collection while serving walks only what requests made (shorter pauses between tokens).
    gc.freeze()
    asyncio.run(uvicorn_server.serve())
    # uvicorn returns (rather than raising) when it cannot bind the port.
    return 0 if uvicorn_server.started else 1


if __name__ == "__main__":
    sys.exit(main())
