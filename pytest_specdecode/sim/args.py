"""Command line of the simulated server: SGLang's ``launch_server`` flags plus ``--sim-*`` knobs.

The simulator speaks one SGLang release at a time (``--sim-sglang-version``, see ``versions.py``):
its parser holds exactly the flags that release declares (``pytest_specdecode.sglang_releases``,
generated from its wheel), so a flag the release does not know, or no longer knows, is refused as
argparse refuses it (usage message on stderr, exit status 2), and the flags are resolved the way
that release's ``ServerArgs`` does for the settings the simulator cares about.

The parser itself is built in ``parser.py`` and the speculative-decoding rules live in
``speculative.py``; this module parses and resolves (``ServerArgs``, ``SimOptions``, the
``/server_info`` fields, the port checks, the environment's test knobs) and still exports the
names its importers read from it (``build_parser``, ``StartupError``, the ``ENV_*`` names).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_specdecode import sglang_releases
from pytest_specdecode.sim import noise, versions
from pytest_specdecode.sim.launch_script import take_launch_flags
from pytest_specdecode.sim.parser import (
    ENV_ACCEPT_SCALE,
    ENV_KNOBS,
    ENV_LAUNCH_CV,
    ENV_NOISE_CV,
    ENV_SLOWDOWN,
    build_parser,
    non_negative_float,
    positive_float,
)
from pytest_specdecode.sim.speculative import (
    Flags,
    Speculative,
    StartupError,
    resolve_speculative,
    speculative_algorithm,
)

#: The public names, the parser's and the speculative rules' among them: importers (``__main__``,
#: ``server``, the tests) keep reading them from here.
__all__ = [
    "ENV_ACCEPT_SCALE",
    "ENV_KNOBS",
    "ENV_LAUNCH_CV",
    "ENV_NOISE_CV",
    "ENV_SLOWDOWN",
    "REDACTED",
    "RESOLVED_REPLACED",
    "RESOLVED_WHEN_UNSET",
    "ResolvedArgs",
    "ServerArgs",
    "SimOptions",
    "StartupError",
    "apply_env_knobs",
    "build_parser",
    "echo_fields",
    "parse_args",
    "requested_release",
    "resolve",
]

REDACTED = "<redacted>"


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
    grpc_port: int | None
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
    launch_cv: float = 0.0
    launch_seed: int = 0
    """With the sim seed, the seed of this launch's speed factor (random unless given)."""
    noise_choice: noise.Noise | None = None
    """How ``noise_cv`` and ``launch_cv`` were chosen (before the environment's knobs)."""

    @property
    def launch_factor(self) -> float:
        """This launch's speed factor: lognormal, mean 1, CV ``launch_cv``, seeded by
        (sim seed, launch seed), so a given pair always draws the same factor."""
        if self.launch_cv <= 0:
            return 1.0
        sigma = math.sqrt(math.log1p(self.launch_cv**2))
        rng = random.Random(f"{self.seed}:launch:{self.launch_seed}")
        return math.exp(rng.gauss(-0.5 * sigma * sigma, sigma))


@dataclass(frozen=True)
class ResolvedArgs:
    server: ServerArgs
    sim: SimOptions
    notes: tuple[str, ...]
    """Resolution messages SGLang would log (adjusted speculative settings and the like)."""
    release: str = ""
    """The SGLang release spoken (``--sim-sglang-version``, normalised)."""
    fields: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Every ServerArgs field of that release as ``/server_info`` echoes it."""


#: What SGLang's resolution (``__post_init__`` and the arg-group hooks) makes of fields declared
#: ``None``, as the real 0.5.15 ``/server_info`` shows them; applied to every release that has
#: the field and left it unset.
RESOLVED_WHEN_UNSET: dict[str, Any] = {
    "chunked_prefill_size": 8192,
    "custom_weight_loader": [],
    "device": "cuda",
    "enable_fused_qk_norm_rope": False,
    "enable_tf32_matmul": False,
    "expert_distribution_recorder_buffer_size": 1000,
    "file_storage_path": "sglang_storage",
    "grammar_backend": "xgrammar",
    "hicache_ratio": 2.0,
    "mamba_full_memory_ratio": 0.9,
    "mm_enable_dp_encoder": False,
    "mm_process_config": {},
    "page_size": 1,
    "sampling_backend": "flashinfer",
    "swa_full_tokens_ratio": 0.8,
    "attention_backend": "flashinfer",
    "speculative_moe_runner_backend": "auto",
}
RESOLVED_REPLACED: dict[str, tuple[Any, Any]] = {
    "encoder_transfer_backend": ("auto", "zmq_to_scheduler"),
    "load_balance_method": ("auto", "round_robin"),
}
#: The capture sizes SGLang 0.5.15 plans (``cuda_graph_config`` in ``/server_info``).
_DECODE_BS = [1, 2, 3, 4, 5, 6, 7, 8, *range(10, 33, 2), *range(40, 64, 4), *range(64, 257, 8)]
_PREFILL_BS = [
    *range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32), *range(576, 1025, 64),
    *range(1280, 4097, 256), *range(4608, 8193, 512),
]  # fmt: skip


def _cuda_graph_config(server: ServerArgs, values: Mapping[str, Any]) -> dict[str, Any]:
    disabled = server.disable_cuda_graph

    def part(max_bs: int, sizes: list[int], key: str) -> dict[str, Any]:
        backend = values.get(f"cuda_graph_backend_{key}")
        if disabled:
            backend = "disabled"
        return {
            "backend": backend or ("full" if key == "decode" else "breakable"),
            "max_bs": max_bs,
            "bs": [b for b in sizes if b <= max_bs],
            "tc_compiler": "eager",
            "full_prefill_max_req": None,
        }

    prefill_max = int(values.get("cuda_graph_max_bs_prefill") or server.chunked_prefill_size)
    return {
        "decode": part(server.cuda_graph_max_bs, _DECODE_BS, "decode"),
        "prefill": part(prefill_max, _PREFILL_BS, "prefill"),
    }


def echo_fields(release: str, server: ServerArgs, values: Mapping[str, Any]) -> dict[str, Any]:
    """Every ServerArgs field of ``release`` as its ``/server_info`` shows it after resolution:
    the given value, else SGLang's resolved or declared default, then the simulator's resolved
    settings (speculative parameters, overlap, limits) on top."""
    fields: dict[str, Any] = {}
    resolved = server.echo()
    for name, default in sglang_releases.field_defaults(release).items():
        value = values.get(name, default)
        if value is None and name in RESOLVED_WHEN_UNSET:
            value = RESOLVED_WHEN_UNSET[name]
        if name in RESOLVED_REPLACED and value == RESOLVED_REPLACED[name][0]:
            value = RESOLVED_REPLACED[name][1]
        if name in resolved:
            value = resolved[name]
        fields[name] = value
    if "cuda_graph_config" in fields:
        fields["cuda_graph_config"] = _cuda_graph_config(server, values)
    for name in ("cuda_graph_max_bs_decode",):
        if name in fields:
            fields[name] = server.cuda_graph_max_bs
    if "cuda_graph_max_bs_prefill" in fields and fields["cuda_graph_max_bs_prefill"] is None:
        fields["cuda_graph_max_bs_prefill"] = server.chunked_prefill_size
    if server.speculative_draft_model_path and "speculative_draft_model_revision" in fields:
        fields["speculative_draft_model_revision"] = (
            values.get("speculative_draft_model_revision") or "main"
        )
    if fields.get("api_key") is not None:
        fields["api_key"] = REDACTED
    return fields


def _check_ports(release: str, server: ServerArgs, env: Mapping[str, str]) -> None:
    """SGLang's gRPC port checks: 0.5.11-0.5.15 derive ``port + 10000`` and refuse it above
    65535 even with gRPC off; 0.5.16+ check ``--grpc-port`` / ``SGLANG_GRPC_PORT`` when set."""
    era = versions.era(release)
    raw = env.get("SGLANG_GRPC_PORT", "").strip()
    env_port = int(raw) if raw.lstrip("-").isdigit() else None
    if era.derived_grpc_port:
        grpc = env_port if env_port is not None else server.port + 10000
        if not 1 <= grpc <= 65535:
            raise StartupError(f"SGLANG_GRPC_PORT ({grpc}) must be between 1 and 65535")
        if grpc == server.port:
            raise StartupError(f"SGLANG_GRPC_PORT ({grpc}) must differ from --port ({server.port})")
    elif era.grpc_port_flag:
        grpc_port = server.grpc_port if server.grpc_port is not None else env_port
        if grpc_port is not None:
            if not 1 <= grpc_port <= 65535:
                raise StartupError(
                    f"--grpc-port / SGLANG_GRPC_PORT ({grpc_port}) must be between 1 and 65535"
                )
            if grpc_port == server.port:
                raise StartupError(
                    f"--grpc-port ({grpc_port}) must differ from --port ({server.port})"
                )


@dataclass(frozen=True)
class _Seeds:
    """The simulator's seed, SGLang's ``--random-seed`` and this launch's seed."""

    sim: int
    random: int
    launch: int


def resolve(
    namespace: argparse.Namespace,
    unknown: Sequence[str] = (),
    release: str | None = None,
    env: Mapping[str, str] | None = None,
) -> ResolvedArgs:
    """Apply SGLang ``release``'s defaults and speculative-decoding rules to the parsed flags.

    ``StartupError`` for what that release refuses while resolving (the gRPC port range)."""
    release = release or sglang_releases.newest()
    era = versions.era(release)
    ns = vars(namespace)
    values = _sglang_values(ns)
    flags = Flags(values, sglang_releases.field_defaults(release))
    algorithm = speculative_algorithm(flags)
    model_path: str = values["model_path"]
    spec = resolve_speculative(algorithm, flags, model_path, era)
    seeds = _seeds(ns, flags)
    crash_after = _crash_after(ns["sim_fault"])
    server = _server_args(flags, model_path, spec, seeds.random)
    _check_ports(release, server, env or {})
    return ResolvedArgs(
        server=server,
        sim=_sim_options(ns, unknown, server, seeds, crash_after),
        notes=tuple(spec.notes),
        release=release,
        fields=echo_fields(release, server, values),
    )


def _sglang_values(ns: Mapping[str, Any]) -> dict[str, Any]:
    """The SGLang flags given (``--sim-*`` left out), under the dests this simulator reads."""
    values: dict[str, Any] = {k: v for k, v in ns.items() if not k.startswith("sim_")}
    # Aliases across releases: old dests and deprecated spellings of the same setting.
    if "tensor_parallel_size" in values:
        values.setdefault("tp_size", values["tensor_parallel_size"])
    if values.get("incremental_streaming_output"):
        values.setdefault("stream_output", True)
    if values.get("cuda_graph_max_bs_decode") is not None:
        values.setdefault("cuda_graph_max_bs", values["cuda_graph_max_bs_decode"])
    return values


def _seeds(ns: Mapping[str, Any], flags: Flags) -> _Seeds:
    """The sim seed (``--sim-seed``, else ``--random-seed``, else random), SGLang's random seed
    (else the sim seed) and the launch seed (``--sim-launch-seed``, else random)."""
    sim_seed = ns["sim_seed"] if ns["sim_seed"] is not None else flags.get("random_seed")
    if sim_seed is None:
        sim_seed = random.SystemRandom().randint(0, (1 << 30) - 1)
    random_seed = flags.get("random_seed", sim_seed)
    launch_seed = ns["sim_launch_seed"]
    if launch_seed is None:
        launch_seed = random.SystemRandom().randint(0, (1 << 30) - 1)
    return _Seeds(sim=sim_seed, random=random_seed, launch=launch_seed)


def _server_args(flags: Flags, model_path: str, spec: Speculative, random_seed: int) -> ServerArgs:
    """The resolved ``ServerArgs``: the given flags, else SGLang's defaults, with the speculative
    settings as resolved."""
    get = flags.get
    cuda_graph_max_bs = get("cuda_graph_max_bs")
    return ServerArgs(
        model_path=model_path,
        tokenizer_path=get("tokenizer_path", model_path),
        tokenizer_mode=get("tokenizer_mode", "auto"),
        skip_tokenizer_init=bool(get("skip_tokenizer_init", False)),
        load_format=get("load_format", "auto"),
        trust_remote_code=bool(get("trust_remote_code", False)),
        dtype=get("dtype", "auto"),
        kv_cache_dtype=get("kv_cache_dtype", "auto"),
        context_length=get("context_length"),
        device=get("device", "cuda"),
        served_model_name=get("served_model_name", model_path),
        host=get("host", "127.0.0.1"),
        port=int(get("port", 30000)),
        nccl_port=get("nccl_port"),
        grpc_port=get("grpc_port"),
        # SGLang derives these from the GPU's memory; the simulated GPU is a 96 GB card.
        mem_fraction_static=float(get("mem_fraction_static", 0.88)),
        max_running_requests=spec.max_running,
        max_total_tokens=get("max_total_tokens"),
        chunked_prefill_size=int(get("chunked_prefill_size", 8192)),
        max_prefill_tokens=int(get("max_prefill_tokens", 16384)),
        schedule_policy=get("schedule_policy", "fcfs"),
        schedule_conservativeness=float(get("schedule_conservativeness", 1.0)),
        cuda_graph_max_bs=int(cuda_graph_max_bs)
        if cuda_graph_max_bs is not None
        else min(spec.max_running or 160, 160),
        disable_cuda_graph=bool(get("disable_cuda_graph", False)),
        tp_size=int(get("tp_size", 1)),
        dp_size=int(get("dp_size", 1)),
        pp_size=int(get("pp_size", 1)),
        base_gpu_id=int(get("base_gpu_id", 0)),
        gpu_id_step=int(get("gpu_id_step", 1)),
        stream_interval=max(1, int(get("stream_interval", 1))),
        stream_output=bool(get("stream_output", False)),
        random_seed=random_seed,
        watchdog_timeout=float(get("watchdog_timeout", 300.0)),
        log_level=get("log_level", "info"),
        log_level_http=get("log_level_http"),
        log_requests=bool(get("log_requests", False)),
        decode_log_interval=max(1, int(get("decode_log_interval", 40))),
        enable_metrics=bool(get("enable_metrics", False)),
        enable_cache_report=bool(get("enable_cache_report", False)),
        api_key=get("api_key"),
        speculative_algorithm=spec.algorithm,
        speculative_draft_model_path=get("speculative_draft_model_path"),
        speculative_num_steps=spec.steps,
        speculative_eagle_topk=spec.topk,
        speculative_num_draft_tokens=spec.draft_tokens,
        speculative_accept_threshold_single=float(get("speculative_accept_threshold_single", 1.0)),
        speculative_accept_threshold_acc=float(get("speculative_accept_threshold_acc", 1.0)),
        speculative_token_map=get("speculative_token_map"),
        speculative_attention_mode=get("speculative_attention_mode", "prefill"),
        num_continuous_decode_steps=max(1, int(get("num_continuous_decode_steps", 1))),
        disable_custom_all_reduce=bool(get("disable_custom_all_reduce", False)),
        disable_radix_cache=bool(get("disable_radix_cache", False)),
        disable_overlap_schedule=spec.disable_overlap,
        enable_mixed_chunk=spec.enable_mixed_chunk,
        attention_backend=get("attention_backend"),
        skip_server_warmup=bool(get("skip_server_warmup", False)),
        weight_version=get("weight_version", "default"),
    )


def _crash_after(fault: str | None) -> int | None:
    """The N of a ``crash-after:N`` or ``hang-after:N`` fault: requests served before it."""
    if fault and re.match(r"(crash|hang)-after:", fault):
        return int(fault.split(":", 1)[1])
    return None


def _sim_options(
    ns: Mapping[str, Any],
    unknown: Sequence[str],
    server: ServerArgs,
    seeds: _Seeds,
    crash_after: int | None,
) -> SimOptions:
    """The ``--sim-*`` knobs, with the noise chosen for this server's configuration."""
    chosen = noise.resolve_noise(
        ns["sim_noise_preset"],
        ns["sim_noise_cv"],
        ns["sim_launch_cv"],
        tp_size=server.tp_size,
        cuda_graph=not server.disable_cuda_graph,
        speculative_steps=(server.speculative_num_steps or 0)
        if server.speculative_algorithm
        else 0,
    )
    return SimOptions(
        load_seconds=ns["sim_load_seconds"],
        speed=ns["sim_speed"],
        slowdown=ns["sim_slowdown"],
        accept_scale=ns["sim_accept_scale"],
        noise_cv=chosen.run_cv,
        seed=seeds.sim,
        fault=ns["sim_fault"],
        crash_after=crash_after,
        unknown_args=tuple(unknown),
        launch_cv=chosen.launch_cv,
        launch_seed=seeds.launch,
        noise_choice=chosen,
    )


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

    slowdown = read(ENV_SLOWDOWN, positive_float)
    accept_scale = read(ENV_ACCEPT_SCALE, non_negative_float)
    noise_cv = read(ENV_NOISE_CV, non_negative_float)
    launch_cv = read(ENV_LAUNCH_CV, non_negative_float)
    if not applied:
        return sim
    return dataclasses.replace(
        sim,
        slowdown=sim.slowdown * (1.0 if slowdown is None else slowdown),
        accept_scale=sim.accept_scale * (1.0 if accept_scale is None else accept_scale),
        noise_cv=sim.noise_cv if noise_cv is None else noise_cv,
        launch_cv=sim.launch_cv if launch_cv is None else launch_cv,
        env_knobs=tuple(applied),
    )


def requested_release(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """The release named by ``--sim-sglang-version`` (last one wins), else by
    ``SPECDECODE_SIM_SGLANG_VERSION``, else the newest; ``ValueError`` if unsupported."""
    requested = None
    for i, arg in enumerate(argv):
        if arg == "--sim-sglang-version" and i + 1 < len(argv):
            requested = argv[i + 1]
        elif arg.startswith("--sim-sglang-version="):
            requested = arg.split("=", 1)[1]
    if requested is None:
        requested = env.get(versions.ENV_SGLANG_VERSION, "").strip() or sglang_releases.newest()
    return sglang_releases.normalize(requested)


def parse_args(
    argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> ResolvedArgs:
    """Parse a command line as the chosen SGLang release does: a flag it does not accept is a
    usage error (exit status 2, argparse's message on stderr), as in SGLang.

    ``env`` (the server's environment; ``None`` = none) supplies the :data:`ENV_KNOBS`, the
    default SGLang version and ``SGLANG_GRPC_PORT``; a bad knob value is a usage error, like a
    bad flag. ``StartupError`` for what the release itself refuses while resolving."""
    args = list(sys.argv[1:] if argv is None else argv)
    environ = env or {}
    try:
        scripted, script_note = take_launch_flags(environ)
    except ValueError as exc:
        build_parser().error(str(exc))
    args += scripted  # after the command's own: this launch's line wins
    try:
        release = requested_release(args, environ)
    except ValueError as exc:
        build_parser().error(f"argument --sim-sglang-version: {exc}")
    parser = build_parser(release)
    namespace = parser.parse_args(args)
    resolved = resolve(namespace, release=release, env=environ)
    try:
        sim = apply_env_knobs(resolved.sim, environ)
    except ValueError as exc:
        parser.error(str(exc))
    if script_note is not None:
        sim = dataclasses.replace(sim, env_knobs=(*sim.env_knobs, script_note))
    return dataclasses.replace(resolved, sim=sim)
