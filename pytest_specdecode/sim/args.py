"""Command line of the simulated server: SGLang's ``launch_server`` flags plus ``--sim-*`` knobs.

SGLang flags are parsed with SGLang's names and defaults and resolved the way SGLang's
``ServerArgs.__post_init__`` does for the settings the simulator cares about. Unknown flags are
tolerated (a real launcher may pass flags of a newer SGLang) and reported back to the caller.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SPECULATIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")
#: Algorithms for which SGLang caps max_running_requests at 48 when it is not given.
CAPPED_ALGORITHMS = frozenset({"EAGLE", "EAGLE3", "STANDALONE"})
FAULT_KINDS = (
    "exit-during-load",
    "crash-after:N",
    "hang",
    "http-500",
    "malformed-sse",
    "flap-health",
)
REDACTED = "<redacted>"

#: Test knobs read from the environment, deliberately outside every profile and fingerprint.
#: A real regression (a slower SGLang build, a broken draft model) changes speed without
#: changing the configuration; setting these for the server's process does the same to the
#: simulated server, so a baseline recorded without them is still compared, and must catch it.
#: ``SPECDECODE_SIM_SLOWDOWN`` and ``SPECDECODE_SIM_ACCEPT_SCALE`` multiply ``--sim-slowdown``
#: and ``--sim-accept-scale`` (an injected change on top of what the command line configures);
#: ``SPECDECODE_SIM_NOISE_CV`` replaces ``--sim-noise-cv``. They apply to servers started with
#: them (a kept-alive server keeps the values it was started with), and the effective values
#: are logged at startup and reported by ``/server_info``.
ENV_SLOWDOWN = "SPECDECODE_SIM_SLOWDOWN"
ENV_ACCEPT_SCALE = "SPECDECODE_SIM_ACCEPT_SCALE"
ENV_NOISE_CV = "SPECDECODE_SIM_NOISE_CV"
ENV_KNOBS = (ENV_SLOWDOWN, ENV_ACCEPT_SCALE, ENV_NOISE_CV)


@dataclass(frozen=True)
class ServerArgs:
    """The resolved SGLang server arguments, with SGLang's field names (echoed by /server_info)."""

    model_path: str
    tokenizer_path: str
    tokenizer_mode: str
    skip_tokenizer_init: bool
    load_format: str
    trust_remote_code: bool
    dtype: str
    kv_cache_dtype: str
    context_length: int | None
    device: str
    served_model_name: str
    host: str
    port: int
    nccl_port: int | None
    mem_fraction_static: float
    max_running_requests: int | None
    max_total_tokens: int | None
    chunked_prefill_size: int
    max_prefill_tokens: int
    schedule_policy: str
    schedule_conservativeness: float
    cuda_graph_max_bs: int
    disable_cuda_graph: bool
    tp_size: int
    dp_size: int
    pp_size: int
    base_gpu_id: int
    gpu_id_step: int
    stream_interval: int
    stream_output: bool
    random_seed: int
    watchdog_timeout: float
    log_level: str
    log_level_http: str | None
    log_requests: bool
    decode_log_interval: int
    enable_metrics: bool
    enable_cache_report: bool
    api_key: str | None
    speculative_algorithm: str | None
    speculative_draft_model_path: str | None
    speculative_num_steps: int | None
    speculative_eagle_topk: int | None
    speculative_num_draft_tokens: int | None
    speculative_accept_threshold_single: float
    speculative_accept_threshold_acc: float
    speculative_token_map: str | None
    speculative_attention_mode: str
    num_continuous_decode_steps: int
    disable_custom_all_reduce: bool
    disable_radix_cache: bool
    disable_overlap_schedule: bool
    enable_mixed_chunk: bool
    attention_backend: str | None
    skip_server_warmup: bool
    weight_version: str

    def echo(self) -> dict[str, Any]:
        """The fields as /server_info shows them; the API key never leaves the process."""
        fields = dataclasses.asdict(self)
        if fields["api_key"] is not None:
            fields["api_key"] = REDACTED
        return fields


@dataclass(frozen=True)
class SimOptions:
    """The simulation knobs (``--sim-*``)."""

    load_seconds: float
    speed: float
    slowdown: float
    accept_scale: float
    noise_cv: float
    seed: int
    fault: str | None
    crash_after: int | None
    unknown_args: tuple[str, ...]
    env_knobs: tuple[str, ...] = ()
    """The ``SPECDECODE_SIM_*`` settings that were applied, as ``NAME=value``."""


@dataclass(frozen=True)
class ResolvedArgs:
    server: ServerArgs
    sim: SimOptions
    notes: tuple[str, ...]
    """Resolution messages SGLang would log (adjusted speculative settings and the like)."""


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


def _fault(text: str) -> str:
    if text in FAULT_KINDS or re.fullmatch(r"crash-after:\d+", text):
        return text
    raise argparse.ArgumentTypeError(
        f"unknown fault {text!r}; choose one of {', '.join(FAULT_KINDS)} "
        "(N = requests served before the crash)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pytest_specdecode.sim",
        description=(
            "A simulated SGLang server (no GPU): SGLang's HTTP API, load phases and log lines, "
            "with token timing from a small performance model fitted to measured figures. "
            "Every figure it produces is simulated."
        ),
        epilog=(
            "Unknown flags are accepted with a warning, so a real SGLang command line works. "
            f"Test knobs from the environment, outside any profile or fingerprint: {ENV_SLOWDOWN} "
            f"and {ENV_ACCEPT_SCALE} multiply --sim-slowdown and --sim-accept-scale, "
            f"{ENV_NOISE_CV} replaces --sim-noise-cv (inject a regression of the same "
            "configuration)."
        ),
    )
    sglang = parser.add_argument_group(
        "SGLang server arguments (as python -m sglang.launch_server)"
    )
    add = sglang.add_argument
    add("--model-path", "--model", dest="model_path", required=True, help="model repo id or path")
    add("--tokenizer-path", default=None)
    add("--served-model-name", default=None, help="name in /v1/models (default: the model path)")
    add("--trust-remote-code", action="store_true")
    add("--load-format", default="auto", help="'dummy' means random weights (accept length ~1)")
    add("--dtype", default="auto")
    add("--kv-cache-dtype", default="auto")
    add("--context-length", type=int, default=None)
    add("--device", default="cuda")
    add("--skip-tokenizer-init", action="store_true")
    add("--host", default="127.0.0.1")
    add("--port", type=int, default=30000)
    add("--nccl-port", type=int, default=None)
    add("--tp-size", "--tp", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    add("--dp-size", type=int, default=1)
    add("--pp-size", type=int, default=1)
    add("--base-gpu-id", type=int, default=0)
    add("--gpu-id-step", type=int, default=1)
    add("--mem-fraction-static", type=float, default=None)
    add("--max-running-requests", type=int, default=None)
    add("--max-total-tokens", type=int, default=None)
    add("--chunked-prefill-size", type=int, default=None)
    add("--max-prefill-tokens", type=int, default=16384)
    add("--schedule-policy", default="fcfs")
    add("--schedule-conservativeness", type=float, default=1.0)
    add("--cuda-graph-max-bs", type=int, default=None)
    add("--disable-cuda-graph", action="store_true")
    add("--stream-interval", type=int, default=1)
    add("--stream-output", action="store_true")
    add("--random-seed", type=int, default=None)
    add("--watchdog-timeout", type=float, default=300.0)
    add("--log-level", default="info")
    add("--log-level-http", default=None)
    add("--log-requests", action="store_true")
    add("--decode-log-interval", type=int, default=40)
    add("--enable-metrics", action="store_true")
    add("--enable-cache-report", action="store_true")
    add("--api-key", default=None)
    add("--speculative-algorithm", choices=SPECULATIVE_ALGORITHMS, default=None)
    add(
        "--speculative-draft-model-path",
        "--speculative-draft-model",
        dest="speculative_draft_model_path",
        default=None,
    )
    add("--speculative-num-steps", type=int, default=None)
    add("--speculative-eagle-topk", type=int, default=None)
    add("--speculative-num-draft-tokens", type=int, default=None)
    add("--speculative-accept-threshold-single", type=float, default=1.0)
    add("--speculative-accept-threshold-acc", type=float, default=1.0)
    add("--speculative-token-map", default=None)
    add("--speculative-attention-mode", default="prefill")
    add("--num-continuous-decode-steps", type=int, default=1)
    add("--disable-custom-all-reduce", action="store_true")
    add("--disable-radix-cache", action="store_true")
    add("--disable-overlap-schedule", action="store_true")
    add("--enable-mixed-chunk", action="store_true")
    add("--attention-backend", default=None)
    add("--skip-server-warmup", action="store_true")
    add("--weight-version", default="default")

    sim = parser.add_argument_group("simulation knobs (pytest-specdecode only)")
    sim.add_argument(
        "--sim-load-seconds",
        type=_non_negative_float,
        default=5.0,
        help="total time of the load phases, port closed (default 5; divided by --sim-speed)",
    )
    sim.add_argument(
        "--sim-speed",
        type=_positive_float,
        default=1.0,
        help="run F times faster than the model: all rates x F, all durations / F (CI speed-up)",
    )
    sim.add_argument(
        "--sim-slowdown",
        type=_positive_float,
        default=1.0,
        help="inject a regression: prefill/decode/verify rates divided by F",
    )
    sim.add_argument(
        "--sim-accept-scale",
        type=_non_negative_float,
        default=1.0,
        help="multiply draft acceptance probabilities by F (capped at 1)",
    )
    sim.add_argument(
        "--sim-noise-cv",
        type=_non_negative_float,
        default=0.03,
        help="run-to-run noise: CV of each request's lognormal speed factor (default 0.03)",
    )
    sim.add_argument(
        "--sim-seed",
        type=int,
        default=None,
        help="seed of all simulated randomness (default: --random-seed, else random)",
    )
    sim.add_argument(
        "--sim-fault",
        type=_fault,
        default=None,
        metavar="KIND",
        help=(
            "inject a fault: exit-during-load, crash-after:N (die while serving request N+1), "
            "hang, http-500, malformed-sse, flap-health; all but exit-during-load start after "
            "the warm-up"
        ),
    )
    return parser


def _looks_like_llama_or_grok(model_path: str) -> bool:
    lowered = model_path.lower()
    return "llama" in lowered or "grok" in lowered


def resolve(namespace: argparse.Namespace, unknown: Sequence[str]) -> ResolvedArgs:
    """Apply SGLang's defaults and speculative-decoding rules to the parsed flags."""
    ns = namespace
    notes: list[str] = []
    algorithm: str | None = ns.speculative_algorithm
    steps, topk, draft_tokens = (
        ns.speculative_num_steps,
        ns.speculative_eagle_topk,
        ns.speculative_num_draft_tokens,
    )
    max_running = ns.max_running_requests
    disable_overlap = bool(ns.disable_overlap_schedule)
    enable_mixed_chunk = bool(ns.enable_mixed_chunk)
    if algorithm == "NEXTN":
        algorithm = "EAGLE"
    if algorithm is not None:
        auto = (5, 4, 8) if _looks_like_llama_or_grok(ns.model_path) else (3, 1, 4)
        if steps is None and topk is None and draft_tokens is None:
            steps, topk, draft_tokens = auto
            notes.append(
                "Auto choose speculative parameters: "
                f"{steps=}, {topk=}, num_draft_tokens={draft_tokens}. "
                "Set --speculative-num-steps, --speculative-eagle-topk and "
                "--speculative-num-draft-tokens together to override."
            )
        else:
            steps = auto[0] if steps is None else steps
            topk = auto[1] if topk is None else topk
            draft_tokens = auto[2] if draft_tokens is None else draft_tokens
        if topk == 1 and draft_tokens != steps + 1:
            notes.append(
                "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
                f"speculative_eagle_topk == 1 ({draft_tokens} -> {steps + 1})"
            )
            draft_tokens = steps + 1
        if algorithm in CAPPED_ALGORITHMS:
            if max_running is None:
                max_running = 48
                notes.append("Max running requests is reset to 48 for speculative decoding.")
            disable_overlap = True
            enable_mixed_chunk = False
    sim_seed = ns.sim_seed if ns.sim_seed is not None else ns.random_seed
    if sim_seed is None:
        sim_seed = random.SystemRandom().randint(0, (1 << 30) - 1)
    random_seed = ns.random_seed if ns.random_seed is not None else sim_seed
    crash_after = None
    if ns.sim_fault and ns.sim_fault.startswith("crash-after:"):
        crash_after = int(ns.sim_fault.split(":", 1)[1])
    server = ServerArgs(
        model_path=ns.model_path,
        tokenizer_path=ns.tokenizer_path or ns.model_path,
        tokenizer_mode="auto",
        skip_tokenizer_init=bool(ns.skip_tokenizer_init),
        load_format=ns.load_format,
        trust_remote_code=bool(ns.trust_remote_code),
        dtype=ns.dtype,
        kv_cache_dtype=ns.kv_cache_dtype,
        context_length=ns.context_length,
        device=ns.device,
        served_model_name=ns.served_model_name or ns.model_path,
        host=ns.host,
        port=ns.port,
        nccl_port=ns.nccl_port,
        # SGLang derives these from the GPU's memory; the simulated GPU is a 96 GB card.
        mem_fraction_static=ns.mem_fraction_static if ns.mem_fraction_static is not None else 0.88,
        max_running_requests=max_running,
        max_total_tokens=ns.max_total_tokens,
        chunked_prefill_size=ns.chunked_prefill_size
        if ns.chunked_prefill_size is not None
        else 8192,
        max_prefill_tokens=ns.max_prefill_tokens,
        schedule_policy=ns.schedule_policy,
        schedule_conservativeness=ns.schedule_conservativeness,
        cuda_graph_max_bs=ns.cuda_graph_max_bs
        if ns.cuda_graph_max_bs is not None
        else min(max_running or 160, 160),
        disable_cuda_graph=bool(ns.disable_cuda_graph),
        tp_size=ns.tp_size,
        dp_size=ns.dp_size,
        pp_size=ns.pp_size,
        base_gpu_id=ns.base_gpu_id,
        gpu_id_step=ns.gpu_id_step,
        stream_interval=max(1, ns.stream_interval),
        stream_output=bool(ns.stream_output),
        random_seed=random_seed,
        watchdog_timeout=ns.watchdog_timeout,
        log_level=ns.log_level,
        log_level_http=ns.log_level_http,
        log_requests=bool(ns.log_requests),
        decode_log_interval=max(1, ns.decode_log_interval),
        enable_metrics=bool(ns.enable_metrics),
        enable_cache_report=bool(ns.enable_cache_report),
        api_key=ns.api_key,
        speculative_algorithm=algorithm,
        speculative_draft_model_path=ns.speculative_draft_model_path,
        speculative_num_steps=steps,
        speculative_eagle_topk=topk,
        speculative_num_draft_tokens=draft_tokens,
        speculative_accept_threshold_single=ns.speculative_accept_threshold_single,
        speculative_accept_threshold_acc=ns.speculative_accept_threshold_acc,
        speculative_token_map=ns.speculative_token_map,
        speculative_attention_mode=ns.speculative_attention_mode,
        num_continuous_decode_steps=max(1, ns.num_continuous_decode_steps),
        disable_custom_all_reduce=bool(ns.disable_custom_all_reduce),
        disable_radix_cache=bool(ns.disable_radix_cache),
        disable_overlap_schedule=disable_overlap,
        enable_mixed_chunk=enable_mixed_chunk,
        attention_backend=ns.attention_backend,
        skip_server_warmup=bool(ns.skip_server_warmup),
        weight_version=ns.weight_version,
    )
    sim = SimOptions(
        load_seconds=ns.sim_load_seconds,
        speed=ns.sim_speed,
        slowdown=ns.sim_slowdown,
        accept_scale=ns.sim_accept_scale,
        noise_cv=ns.sim_noise_cv,
        seed=sim_seed,
        fault=ns.sim_fault,
        crash_after=crash_after,
        unknown_args=tuple(unknown),
    )
    return ResolvedArgs(server=server, sim=sim, notes=tuple(notes))


def apply_env_knobs(sim: SimOptions, env: Mapping[str, str]) -> SimOptions:
    """``sim`` with the :data:`ENV_KNOBS` of ``env`` applied; a bad value is a ``ValueError``
    naming the variable. Unset or empty variables change nothing."""
    applied: list[str] = []

    def read(name: str, parse: Callable[[str], float]) -> float | None:
        raw = env.get(name, "").strip()
        if not raw:
            return None
        try:
            value = parse(raw)
        except (ValueError, argparse.ArgumentTypeError) as exc:
            raise ValueError(f"environment variable {name}={raw!r}: {exc}") from None
        applied.append(f"{name}={raw}")
        return value

    slowdown = read(ENV_SLOWDOWN, _positive_float)
    accept_scale = read(ENV_ACCEPT_SCALE, _non_negative_float)
    noise_cv = read(ENV_NOISE_CV, _non_negative_float)
    if not applied:
        return sim
    return dataclasses.replace(
        sim,
        slowdown=sim.slowdown * (1.0 if slowdown is None else slowdown),
        accept_scale=sim.accept_scale * (1.0 if accept_scale is None else accept_scale),
        noise_cv=sim.noise_cv if noise_cv is None else noise_cv,
        env_knobs=tuple(applied),
    )


def parse_args(
    argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> ResolvedArgs:
    """Parse a command line; unknown flags are kept in ``sim.unknown_args``, never fatal.

    ``env`` (the server's environment; ``None`` = none) supplies the :data:`ENV_KNOBS`; a bad
    value there is a usage error, like a bad flag."""
    parser = build_parser()
    namespace, unknown = parser.parse_known_args(argv)
    resolved = resolve(namespace, unknown)
    try:
        sim = apply_env_knobs(resolved.sim, env or {})
    except ValueError as exc:
        parser.error(str(exc))
    return dataclasses.replace(resolved, sim=sim)
