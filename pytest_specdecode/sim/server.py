"""The simulated server's state: resolved arguments, the engine, status, faults and info shapes."""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from pytest_specdecode import __version__, sglang_releases
from pytest_specdecode.sim import versions
from pytest_specdecode.sim.args import ResolvedArgs
from pytest_specdecode.sim.engine import Engine, Sequence
from pytest_specdecode.sim.faults import FaultState
from pytest_specdecode.sim.inputs import GenerationInput, SamplingParams
from pytest_specdecode.sim.logprobs import LogprobPlan, logprob_meta_info, plan_logprobs
from pytest_specdecode.sim.logs import SIM_LOGGER
from pytest_specdecode.sim.model import (
    MODEL_CONSTANTS_PATH,
    ModelConstants,
    PerfConfig,
    acceptance_probabilities,
    communication_share,
    natural_length,
    nccl_tuning_share,
    speed_factor,
    step_costs,
)
from pytest_specdecode.sim.prom import SimMetrics
from pytest_specdecode.sim.tokenizer import EOS_TOKEN_ID, OutputTokens, prompt_key

#: What /server_info reports as SGLang's version: the release spoken, with a PEP 440 local
#: label that says "simulated" (``0.5.23+simulated``; its base version is the release).
SIMULATED_VERSION_LABEL = "+simulated"

main_log = logging.getLogger(SIM_LOGGER)


class ServerStatus(enum.Enum):
    STARTING = "Starting"
    UP = "Up"
    UNHEALTHY = "UnHealthy"


@dataclass(frozen=True)
class MemoryPlan:
    """What the server reports about memory; it sizes the KV pool and nothing else."""

    weights_gb: float
    kv_cache_gb: float
    cuda_graph_gb: float
    max_total_num_tokens: int
    context_len: int
    max_req_input_len: int
    max_running_requests: int


def plan_memory(resolved: ResolvedArgs, constants: ModelConstants) -> MemoryPlan:
    args = resolved.server
    memory = constants.memory
    tp = max(1, args.tp_size)
    weights = memory["weights_gb_per_gpu_at_tp8"] * 8 / tp
    if args.speculative_algorithm is not None:
        weights += memory["draft_weights_gb_per_gpu"]
    kv_gb = max(0.0, args.mem_fraction_static * memory["gpu_memory_gb"] - weights)
    per_token = memory["kv_bytes_per_token_per_gpu"] * 8 / tp
    tokens = max(int(memory["min_total_num_tokens"]), int(kv_gb * 1e9 / per_token))
    if args.max_total_tokens is not None:
        tokens = min(tokens, args.max_total_tokens)
    context_len = args.context_length or int(memory["context_len"])
    max_running = args.max_running_requests
    if max_running is None:  # SGLang sizes the request pool from the token pool
        max_running = min(max(tokens * 512 // context_len, 2048), 4096)
    return MemoryPlan(
        weights_gb=weights,
        kv_cache_gb=kv_gb,
        cuda_graph_gb=memory["cuda_graph_gb"],
        max_total_num_tokens=tokens,
        context_len=context_len,
        max_req_input_len=min(context_len - 1, tokens - 1),
        max_running_requests=max_running,
    )


class SimServer:
    def __init__(
        self, resolved: ResolvedArgs, constants: ModelConstants, env: Mapping[str, str]
    ) -> None:
        self.resolved = resolved
        self.args = resolved.server
        self.sim = resolved.sim
        self.constants = constants
        self.release = resolved.release or sglang_releases.newest()
        self.era = versions.era(self.release)
        self.started_at = time.time()
        args = self.args
        self.speculative = args.speculative_algorithm is not None
        self.nccl_share = nccl_tuning_share(env, constants)
        self.communication_share = communication_share(
            self.nccl_share, args.tp_size, args.disable_custom_all_reduce, constants
        )
        self.num_draft_tokens = args.speculative_num_draft_tokens or 1
        # NGRAM drafts a token tree without draft-model steps: its depth is the draft budget.
        self.num_steps = args.speculative_num_steps or 0
        if args.speculative_algorithm == "NGRAM":
            self.num_steps = max(1, self.num_draft_tokens - 1)
        #: This launch's speed factor (``--sim-launch-cv``): every step of the launch is
        #: faster or slower by it, as two launches of one profile differ on real hardware.
        self.launch_factor = self.sim.launch_factor
        self.costs = step_costs(
            PerfConfig(
                tp_size=args.tp_size,
                disable_custom_all_reduce=args.disable_custom_all_reduce,
                num_continuous_decode_steps=args.num_continuous_decode_steps,
                speculative_algorithm=args.speculative_algorithm,
                num_steps=self.num_steps,
                eagle_topk=args.speculative_eagle_topk or 1,
                num_draft_tokens=self.num_draft_tokens,
                nccl_share=self.nccl_share,
                speed=self.sim.speed * self.launch_factor,
                slowdown=self.sim.slowdown,
            ),
            constants,
        )
        self.memory = plan_memory(resolved, constants)
        self.metrics = SimMetrics(args.served_model_name) if args.enable_metrics else None
        self.faults = FaultState(self.sim.fault, self.sim.crash_after)
        self.engine = Engine(
            costs=self.costs,
            max_running_requests=self.memory.max_running_requests,
            max_prefill_tokens=args.max_prefill_tokens,
            max_total_num_tokens=self.memory.max_total_num_tokens,
            decode_log_interval=args.decode_log_interval,
            speculative=self.speculative,
            num_draft_tokens=self.num_draft_tokens,
            disable_radix_cache=args.disable_radix_cache,
            metrics=self.metrics,
            on_doomed_progress=self._crash,
            cuda_graph=not args.disable_cuda_graph,
        )
        self.status = ServerStatus.STARTING
        self._next_index = 0
        self._deprecations_logged: set[str] = set()
        self.health_check_timeout = float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))
        self.health_generates = os.environ.get(
            "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "true"
        ).strip().lower() not in ("0", "false", "no", "off")

    # -- requests -------------------------------------------------------------------------------

    def new_sequence(
        self,
        item: GenerationInput,
        *,
        doomed: bool = False,
        logprobs: LogprobPlan | None = None,
        arrival: float | None = None,
    ) -> Sequence:
        """Plan one request: index, RNG, speed factor, length and acceptance, then submit it.

        ``arrival`` (event-loop seconds) is when its schedule starts: the client's send time
        when it told us (:func:`~pytest_specdecode.sim.httputil.client_sent_at`), else now."""
        index = self._next_index
        self._next_index += 1
        rng = random.Random(f"{self.sim.seed}:{index}")
        return self._submit(item, index, rng, doomed=doomed, logprobs=logprobs, arrival=arrival)

    def plan_logprobs(self, item: GenerationInput) -> LogprobPlan | None:
        """The request's logprob reporting, or None; ``ValueError`` (a 400) for a bad start.

        Prefill-only (no token to generate) holds only without speculation, as upstream's
        ``Req.is_prefill_only``."""
        if item.logprobs is None:
            return None
        prefill_only = item.sampling.max_new_tokens == 0 and not self.speculative
        return plan_logprobs(
            item.logprobs, item.prompt_ids, item.prompt_pieces, prefill_only=prefill_only
        )

    def new_health_probe(self) -> Sequence:
        """SGLang's 1-token probe; it consumes no request index, so probes never shift seeds."""
        probe = GenerationInput(
            rid=f"HEALTH_CHECK_{time.time()}",
            prompt_ids=[0],
            prompt_is_text=False,
            sampling=_PROBE_SAMPLING,
            log_metrics=False,
        )
        return self._submit(probe, -1, random.Random(0), doomed=False, noise=False)

    def _submit(
        self,
        item: GenerationInput,
        index: int,
        rng: random.Random,
        *,
        doomed: bool,
        noise: bool = True,
        logprobs: LogprobPlan | None = None,
        arrival: float | None = None,
    ) -> Sequence:
        sampling = item.sampling
        key = prompt_key(item.prompt_ids)
        greedy = sampling.temperature < 1e-6
        speed = speed_factor(rng, self.sim.noise_cv) if noise else 1.0
        # Greedy decoding is a function of the prompt: same text and same natural length.
        content_rng = random.Random(key) if greedy else rng
        token_seed = content_rng.getrandbits(64)
        natural = natural_length(content_rng, self.constants)
        budget = sampling.max_new_tokens
        if budget is None:
            budget = max(0, self.memory.context_len - len(item.prompt_ids))
        stops_naturally = not sampling.ignore_eos and natural < budget
        target = max(natural, sampling.min_new_tokens) if stops_naturally else budget
        probs: tuple[float, ...] = ()
        if self.speculative:
            # Random weights (--load-format dummy) make every draft wrong: accept length 1.
            dummy_weights = self.args.load_format == "dummy"
            probs = acceptance_probabilities(
                algorithm=self.args.speculative_algorithm or "",
                num_steps=self.num_steps,
                eagle_topk=self.args.speculative_eagle_topk or 1,
                num_draft_tokens=self.num_draft_tokens,
                temperature=sampling.temperature,
                prompt_is_text=item.prompt_is_text,
                accept_scale=0.0 if dummy_weights else self.sim.accept_scale,
                constants=self.constants,
            )
        seq = Sequence(
            rid=item.rid,
            index=index,
            prompt_tokens=len(item.prompt_ids),
            prompt_key=key,
            target_tokens=min(target, budget),
            stops_naturally=stops_naturally,
            probs=probs,
            speed=speed,
            rng=rng,
            output=OutputTokens(token_seed),
            arrival=asyncio.get_running_loop().time() if arrival is None else arrival,
            log_metrics=item.log_metrics,
            doomed=doomed,
            logprobs=logprobs,
        )
        self.engine.submit(seq)
        return seq

    def _crash(self, seq: Sequence) -> None:
        # Stop producing tokens first, so the doomed request is still being served at the kill.
        self.engine.freeze()
        if self.faults.kind == "hang-after":
            return  # alive and listening, and never another token: a hung scheduler
        self.faults.crash_while_serving()

    async def updates(
        self, seq: Sequence, stream_interval: int | None = None
    ) -> AsyncIterator[int]:
        """Yield the completion count whenever a client should get a chunk; ends after the last.

        The count is read when the consumer wakes, so a slow consumer coalesces steps.
        """
        interval = stream_interval or self.args.stream_interval
        sent = 0
        while True:
            await seq.changed.wait()
            seq.changed.clear()
            count = seq.completion_tokens
            if seq.finished:
                yield count
                return
            if count - sent >= interval:
                sent = count
                yield count

    async def wait_finished(self, seq: Sequence) -> None:
        while not seq.finished:
            await seq.changed.wait()
            seq.changed.clear()

    # -- response pieces ------------------------------------------------------------------------

    def finish_reason(self, seq: Sequence) -> dict[str, Any] | None:
        if not seq.finished:
            return None
        if seq.aborted:
            return {"type": "abort", "message": "Abort before the request finished."}
        if seq.stops_naturally:
            return {"type": "stop", "matched": EOS_TOKEN_ID}
        return {"type": "length", "length": seq.target_tokens}

    def meta_info(self, seq: Sequence, count: int) -> dict[str, Any]:
        """``meta_info`` for a response showing ``count`` tokens, in the shape and key order of
        the release spoken; final fields once finished."""
        era = self.era
        final = seq.finished and count == seq.completion_tokens
        timing = self.args.enable_metrics
        info: dict[str, Any] = {
            "id": seq.rid,
            "finish_reason": self.finish_reason(seq) if final else None,
            "prompt_tokens": seq.prompt_tokens,
            "weight_version": self.args.weight_version,
            era.retractions_key: 0,
        }
        if era.modern_meta:
            if timing:
                info["queue_time"] = seq.queue_time
            info["reasoning_tokens"] = 0
        info["completion_tokens"] = count
        info["cached_tokens"] = seq.cached_tokens
        if era.cached_tokens_details:
            # Upstream sends the breakdown once something was cached (null before).
            info["cached_tokens_details"] = (
                {"device": seq.cached_tokens, "host": 0} if seq.cached_tokens else None
            )
        if era.modern_meta:
            info["dp_rank"] = None
        if seq.logprobs is not None:
            info.update(logprob_meta_info(seq.logprobs, seq.output, count))
        if not final:
            if era.modern_meta and timing:
                info["response_sent_to_client_ts"] = time.time()
            return info
        end = seq.finish_time if seq.finish_time is not None else seq.last_token_time
        info["e2e_latency"] = end - seq.arrival
        if self.speculative:
            info.update(spec_meta_info(seq, self.num_draft_tokens, era))
        if timing:
            info.update(timing_meta_info(seq, end, modern=era.modern_meta))
        return info

    # -- info routes ----------------------------------------------------------------------------

    def log_deprecated_once(self, old: str, new: str) -> None:
        if old not in self._deprecations_logged:
            self._deprecations_logged.add(old)
            main_log.warning(
                "Endpoint '%s' is deprecated and will be removed in a future version. "
                "Please use '%s' instead.",
                old,
                new,
            )

    def model_info(self) -> dict[str, Any]:
        model_type, architectures = guess_architecture(self.args.model_path)
        return {
            "model_path": self.args.model_path,
            "tokenizer_path": self.args.tokenizer_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": self.args.weight_version,
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": model_type,
            "architectures": architectures,
        }

    def internal_state(self) -> dict[str, Any]:
        """One DP rank's scheduler state: the resolved server args plus live figures, as the
        scheduler's ``get_internal_state`` answers."""
        stats = self.engine.stats
        state: dict[str, Any] = dict(self.resolved.fields)
        if self.era.derived_grpc_port:
            state["enable_grpc"] = False
            state["grpc_port"] = self.args.port + 10000
        if self.speculative:
            state["max_speculative_num_draft_tokens"] = self.num_draft_tokens
        state["last_gen_throughput"] = stats.last_gen_throughput
        state["memory_usage"] = {
            "weight": round(self.memory.weights_gb, 2),
            "kvcache": round(self.memory.kv_cache_gb, 2),
            "token_capacity": self.memory.max_total_num_tokens,
            "graph": 0 if self.args.disable_cuda_graph else self.memory.cuda_graph_gb,
        }
        state["effective_max_running_requests_per_dp"] = self.memory.max_running_requests
        # Present only with speculation on and a count folded in, as upstream.
        if self.speculative and stats.avg_spec_accept_length is not None:
            state["avg_spec_accept_length"] = stats.avg_spec_accept_length
        return state

    def noise_source(self) -> dict[str, Any]:
        """Where the run and launch noise come from, for ``/server_info``: a preset measured on
        real hardware (its label), or figures set by hand or the fixed defaults."""
        choice = self.sim.noise_choice
        preset = choice.preset if choice is not None else None
        return {
            "sim_noise_preset": preset.name if preset is not None else None,
            "sim_noise_source": (
                f"noise: {preset.label}"
                if preset is not None
                else "noise: set by hand or the simulator's fixed defaults"
            ),
        }

    def server_info(self) -> dict[str, Any]:
        """``/server_info`` of the release spoken: every ServerArgs field of that release, the
        scheduler's figures, then the simulator's own ``simulated``/``sim_*`` fields."""
        patch = self.era.patch
        info: dict[str, Any] = dict(self.resolved.fields)
        if patch >= 20:
            info["launch_command"] = None
        info["status"] = "ready"
        info["max_total_num_tokens"] = self.memory.max_total_num_tokens
        info["max_req_input_len"] = self.memory.max_req_input_len
        if patch >= 13:
            info["kv_events"] = None
        if patch >= 20:
            info["startup_time"] = self.started_at
        info["internal_states"] = [self.internal_state()]
        info["version"] = self.release + SIMULATED_VERSION_LABEL
        if patch >= 23:
            info["frontend"] = "python"
        info.update(
            {
                "simulated": True,
                "sim_version": __version__,
                "sim_sglang_version": self.release,
                "sim_seed": self.sim.seed,
                "sim_speed": self.sim.speed,
                "sim_slowdown": self.sim.slowdown,
                "sim_accept_scale": self.sim.accept_scale,
                "sim_noise_cv": self.sim.noise_cv,
                "sim_launch_cv": self.sim.launch_cv,
                **self.noise_source(),
                "sim_launch_seed": self.sim.launch_seed,
                "sim_launch_speed_factor": self.launch_factor,
                "sim_env_knobs": list(self.sim.env_knobs),
                "sim_nccl_tuning": self.nccl_share,
                "sim_communication_share": self.communication_share,
                "sim_fault": self.sim.fault,
                "sim_unknown_args": list(self.sim.unknown_args),
                "sim_engine_max_lag_seconds": self.engine.max_lag,
                "sim_model_constants": str(MODEL_CONSTANTS_PATH),
            }
        )
        return info

    def load(self) -> list[dict[str, Any]]:
        """``/get_load``: one entry per DP rank."""
        running = self.engine.num_running
        return [
            {
                "dp_rank": 0,
                "num_reqs": running + self.engine.num_waiting,
                "num_waiting_reqs": self.engine.num_waiting,
                "num_tokens": self.engine.num_tokens,
                "num_pending_tokens": 0,
                "ts_tic": time.perf_counter(),
            }
        ]

    # -- health ---------------------------------------------------------------------------------

    async def health_status(self) -> int:
        """SGLang's merged /health and /health_generate handler (era B/C)."""
        if self.status is ServerStatus.STARTING:
            return 503
        if self.faults.health_flaps_down():
            return 503
        if not self.health_generates:
            return 200
        tic = asyncio.get_running_loop().time()
        self.new_health_probe()
        # Upstream polls once a second; scaled by --sim-speed to keep simulated runs fast.
        poll = min(1.0, 1.0 / self.sim.speed)
        deadline = tic + self.health_check_timeout
        while asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(poll)
            if self.engine.last_output_time > tic:
                self.status = ServerStatus.UP
                return 200
        main_log.error(
            "Health check failed. Server couldn't get a response from detokenizer for last "
            "%d seconds. tic start time: %s. last_heartbeat time: %s",
            int(self.health_check_timeout),
            time.strftime("%H:%M:%S", time.localtime(time.time() - self.health_check_timeout)),
            time.strftime("%H:%M:%S", time.localtime()),
        )
        self.status = ServerStatus.UNHEALTHY
        return 503


_PROBE_SAMPLING = SamplingParams(max_new_tokens=1, temperature=0.0)


def spec_meta_info(seq: Sequence, num_draft_tokens: int, era: versions.Era) -> dict[str, Any]:
    """The final-response ``spec_*`` fields under the release's names.

    ``spec_accept_length`` is per request: completion tokens (the first one from prefill
    included) / verify steps. From 0.5.7 on nothing is sent for a request without a verify
    step; 0.5.6 sends zeros and the count."""
    verify_ct = seq.verify_ct
    if verify_ct == 0:
        if era.spec_meta_always:
            return {"spec_accept_rate": 0.0, "spec_accept_length": 0, "spec_verify_ct": 0}
        return {}
    proposed = verify_ct * max(1, num_draft_tokens - 1)
    accepted = seq.accepted_drafts
    info: dict[str, Any] = {
        "spec_accept_rate": accepted / proposed,
        "spec_accept_length": seq.completion_tokens / verify_ct,
    }
    histogram = list(seq.accept_histogram)
    names = era.spec_names
    if names == "token_num":
        info.update(
            spec_accept_token_num=accepted, spec_draft_token_num=proposed, spec_verify_ct=verify_ct
        )
        if era.accept_histogram:
            info["spec_accept_histogram"] = histogram
        return info
    if names == "drafts":
        info.update(
            spec_accepted_drafts=accepted, spec_proposed_drafts=proposed, spec_verify_ct=verify_ct
        )
        info["spec_accept_histogram"] = histogram
        return info
    info.update(
        spec_num_correct_drafts=accepted,
        spec_num_proposed_drafts=proposed,
        spec_verify_ct=verify_ct,
    )
    if names == "correct":
        info.update(spec_accepted_drafts=accepted, spec_proposed_drafts=proposed)
    info["spec_correct_drafts_histogram"] = histogram
    if names == "correct":
        info["spec_accept_histogram"] = histogram
    return info


def timing_meta_info(seq: Sequence, end: float, *, modern: bool) -> dict[str, Any]:
    """``--enable-metrics`` timing fields (final response only), Unix timestamps as upstream.

    Engine times are event-loop (monotonic) seconds; they are mapped to the wall clock now.
    Before 0.5.10 the fields were those of the tokenizer manager (prefill/decode finish, inference
    time); from 0.5.10 on the request's dispatch and finish timestamps."""
    to_unix = time.time() - asyncio.get_running_loop().time()
    admitted = seq.admitted_at if seq.admitted_at is not None else seq.arrival
    first = seq.first_token_time if seq.first_token_time is not None else end
    decode_seconds = end - first
    throughput = seq.completion_tokens / decode_seconds if decode_seconds > 0 else 0.0
    if modern:
        return {
            "request_received_ts": seq.arrival + to_unix,
            "api_server_dispatch_finish_ts": seq.arrival + to_unix,
            "request_finished_ts": end + to_unix,
            "decode_throughput": throughput,
            "response_sent_to_client_ts": time.time(),
        }
    return {
        "queue_time": admitted - seq.arrival,
        "request_received_ts": seq.arrival + to_unix,
        "prefill_finished_ts": first + to_unix,
        "decode_finished_ts": end + to_unix,
        "response_sent_to_client_ts": time.time(),
        "inference_time": end - admitted,
        "decode_throughput": throughput,
    }


_ARCHITECTURES = (
    ("llama", "llama", "LlamaForCausalLM"),
    ("kimi", "kimi_k2", "DeepseekV3ForCausalLM"),
    ("deepseek", "deepseek_v3", "DeepseekV3ForCausalLM"),
    ("qwen", "qwen3_moe", "Qwen3MoeForCausalLM"),
    ("grok", "grok-1", "Grok1ForCausalLM"),
)


def guess_architecture(model_path: str) -> tuple[str, list[str]]:
    lowered = model_path.lower()
    for needle, model_type, architecture in _ARCHITECTURES:
        if needle in lowered:
            return model_type, [architecture]
    return "simulated", ["SimulatedForCausalLM"]
