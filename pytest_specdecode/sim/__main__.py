"""``python -m pytest_specdecode.sim``: start a simulated SGLang server the way SGLang starts.

The load phases (weights, KV pool, CUDA graphs) run before anything binds the port, so the port
refuses connections while "loading", exactly like SGLang. Then uvicorn serves the app and the
warm-up request runs; ``/health`` answers 503 until it has finished.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections.abc import Sequence

import uvicorn

from pytest_specdecode import __version__
from pytest_specdecode.sim.app import build_app
from pytest_specdecode.sim.args import parse_args
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
        "[simulated] pytest-specdecode %s simulated SGLang server - figures are simulated, "
        "not measured on hardware",
        __version__,
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
    if sim.env_knobs:
        main_log.warning(
            "[simulated] injected from the environment (test knobs, not part of any profile): %s",
            " ".join(sim.env_knobs),
        )
    if sim.unknown_args:
        main_log.warning(
            "WARNING: unrecognized arguments ignored by the simulated server: %s",
            " ".join(sim.unknown_args),
        )
    for note in server.resolved.notes:
        main_log.warning("%s", note)
    fields = ", ".join(f"{key}={value!r}" for key, value in server.args.echo().items())
    main_log.info("server_args=ServerArgs(%s)", fields)


def run_load_phases(server: SimServer) -> None:
    """Log and wait through SGLang's startup phases; nothing listens on the port meanwhile."""
    args, memory = server.args, server.memory
    shares = dict(server.constants.load_shares)
    if not server.speculative:
        shares["draft_weights"] = shares["draft_cuda_graph"] = 0.0
    total_share = sum(shares.values()) or 1.0
    seconds = server.sim.load_seconds / server.sim.speed

    def wait(phase: str) -> float:
        duration = seconds * shares[phase] / total_share
        time.sleep(duration)
        return duration

    gpu = server.constants.memory["gpu_memory_gb"] - 1.4
    architecture = server.model_info()["architectures"][0]
    scheduler_log.info("Init torch distributed begin.")
    scheduler_log.info("Init torch distributed ends. mem usage=0.12 GB")
    scheduler_log.info("Load weight begin. avail mem=%.2f GB", gpu)
    elapsed = wait("weights")
    target_weights = memory.weights_gb - (
        server.constants.memory["draft_weights_gb_per_gpu"] if server.speculative else 0.0
    )
    scheduler_log.info(
        "Load weight end. elapsed=%.2f s, type=%s, dtype=torch.bfloat16, avail mem=%.2f GB, "
        "mem usage=%.2f GB.",
        elapsed,
        architecture,
        gpu - target_weights,
        target_weights,
    )
    avail = gpu - target_weights
    if server.speculative:
        scheduler_log.info("Load weight begin. avail mem=%.2f GB", avail)
        elapsed = wait("draft_weights")
        draft = memory.weights_gb - target_weights
        avail -= draft
        scheduler_log.info(
            "Load weight end. elapsed=%.2f s, type=%s, dtype=torch.bfloat16, avail mem=%.2f GB, "
            "mem usage=%.2f GB.",
            elapsed,
            f"{architecture}{'Eagle3' if args.speculative_algorithm == 'EAGLE3' else 'NextN'}",
            avail,
            draft,
        )
    wait("kv_pool")
    half = memory.kv_cache_gb / 2
    scheduler_log.info(
        "KV Cache is allocated. #tokens: %d, K size: %.2f GB, V size: %.2f GB",
        memory.max_total_num_tokens,
        half,
        half,
    )
    avail -= memory.kv_cache_gb
    scheduler_log.info("Memory pool end. avail mem=%.2f GB", avail)
    scheduler_log.info(
        "Capture cuda graph begin. This can take up to several minutes. avail mem=%.2f GB", avail
    )
    if server.sim.fault == "exit-during-load":
        time.sleep(seconds * shares["cuda_graph"] / total_share / 2)
        fail_during_load()
    elapsed = wait("cuda_graph")
    avail -= memory.cuda_graph_gb
    scheduler_log.info(
        "Capture cuda graph end. Time elapsed: %.2f s. mem usage=%.2f GB. avail mem=%.2f GB.",
        elapsed,
        memory.cuda_graph_gb,
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


def main(argv: Sequence[str] | None = None) -> int:
    resolved = parse_args(argv, os.environ)
    configure_logging(resolved.server.log_level)
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
    asyncio.run(uvicorn_server.serve())
    # uvicorn returns (rather than raising) when it cannot bind the port.
    return 0 if uvicorn_server.started else 1


if __name__ == "__main__":
    sys.exit(main())
