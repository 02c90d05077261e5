"""The simulated server's performance model: pure functions over the constants in ``model.toml``.

The model is deliberately small. It reproduces the seed's table (see the header of
``model.toml``) and the mechanisms behind it, not a GPU.

**Communication share.** Every step has a part that depends on how well NCCL is tuned. The share
``s`` in [0, 1] is the weighted fraction of the six seed variables present in the server's own
environment with the seed's values (``nccl_tuning_share``); a step's fixed cost is interpolated
``untuned + s * (tuned - untuned)``, so a partially lost setting is partially slower. Without
``--disable-custom-all-reduce`` (and tp > 1) small all-reduces use custom all-reduce and bypass
NCCL: the effective share is then ``c + (1 - c) * s`` with ``c = custom_all_reduce_share`` (close
to tuned, the variables barely matter). With tp 1 there is no all-reduce (share 1).

**Steps.** The engine runs one step at a time over all running sequences (a batching server):

- prefill: ``prefill_fixed(s) + prefill_per_token * new prompt tokens`` (+ ``spec_prefill_extra``
  under speculation); it produces each new sequence's first token. Running decodes pause during a
  prefill (SGLang disables mixed chunks under speculation; the sim never mixes).
- decode without speculation: ``decode_fixed(s) + per_token * batch + schedule_gap / N`` where N is
  ``--num-continuous-decode-steps`` (fewer scheduling gaps); one token per sequence.
- speculative cycle: ``num_steps * draft_step + verify_fixed(s) + per_token * batch *
  num_draft_tokens + cycle_overhead``. The draft model is small, so its steps do not grow with the
  batch; verification is mostly fixed overhead plus a per-token term.

``--tp-size`` other than 8 multiplies step times by a crude factor (``[tp] factors``).
``--sim-speed F`` divides every duration by F and ``--sim-slowdown F`` multiplies step durations
by F; ``time_scale`` applies both in one place.

**Acceptance.** Position i of a draft is accepted with conditional probability ``p_i`` (per
algorithm; NEXTN is EAGLE). A cycle accepts the longest accepted prefix, capped at
``num_steps``, plus the bonus token, and never more tokens than the request still needs.
Adjustments, in order: topk > 1 offers ``w = min(topk, (num_draft_tokens - 1) / num_steps)``
candidates per depth, ``p -> 1 - (1 - p)^w`` (crude); temperature T multiplies by
``exp(-temperature_k * T)``; prompts given only as ``input_ids`` multiply by ``input_ids_factor``
(random tokens understate acceptance); ``--sim-accept-scale`` multiplies; the result is capped at 1.
Expected accept length is ``1 + sum_j prod_{i<j} p_i`` (1.871 at 2 steps, 2.074 at 5 for EAGLE3).

**Noise.** Each request draws a speed factor from a lognormal with mean 1 and CV
``--sim-noise-cv`` and keeps it for its lifetime; a batched step runs at the mean factor of its
sequences. Acceptance draws use a per-request RNG seeded by (sim seed, request index), so the same
seed and the same sequential requests give identical token counts.
"""

from __future__ import annotations

import importlib
import math
import random
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

MODEL_CONSTANTS_PATH = Path(__file__).with_name("model.toml")

#: Speculative algorithms that share EAGLE's draft-and-verify machinery.
EAGLE_FAMILY = frozenset({"EAGLE", "EAGLE3", "STANDALONE"})


@dataclass(frozen=True)
class AlgorithmConstants:
    probs: tuple[float, ...]
    draft_step_ms: float


@dataclass(frozen=True)
class ModelConstants:
    """The contents of ``model.toml``, typed."""

    nccl_expected: Mapping[str, str]
    nccl_weights: Mapping[str, float]
    custom_all_reduce_share: float
    decode_fixed_tuned_ms: float
    decode_fixed_untuned_ms: float
    per_token_ms: float
    schedule_gap_ms: float
    verify_fixed_tuned_ms: float
    verify_fixed_untuned_ms: float
    cycle_overhead_ms: float
    prefill_fixed_tuned_ms: float
    prefill_fixed_untuned_ms: float
    prefill_per_token_ms: float
    spec_prefill_extra_ms: float
    tp_factors: Mapping[int, float]
    temperature_k: float
    input_ids_factor: float
    algorithms: Mapping[str, AlgorithmConstants]
    natural_length_median: float
    natural_length_sigma: float
    natural_length_min: int
    memory: Mapping[str, float]
    load_shares: Mapping[str, float]


def _toml_loads(text: str) -> dict[str, Any]:
    # tomllib is stdlib from 3.11; the package depends on tomli for 3.10. Imported by name so the
    # type checker does not need tomli's stubs on 3.11.
    module = importlib.import_module("tomllib" if sys.version_info >= (3, 11) else "tomli")
    loaded: dict[str, Any] = module.loads(text)
    return loaded


@cache
def read_model_file(path: Path = MODEL_CONSTANTS_PATH) -> Mapping[str, Any]:
    """The parsed model constants file, read once per process (the constants and the noise
    presets both come from it); callers only read it."""
    return _toml_loads(path.read_text(encoding="utf-8"))


def load_constants(path: Path = MODEL_CONSTANTS_PATH) -> ModelConstants:
    """Read the model constants file."""
    data = read_model_file(path)
    step = data["step"]
    acceptance = data["acceptance"]
    algorithms = {
        name: AlgorithmConstants(
            probs=tuple(float(p) for p in table["probs"]),
            draft_step_ms=float(table.get("draft_step", step["draft_step"])),
        )
        for name, table in acceptance.items()
        if isinstance(table, dict)
    }
    return ModelConstants(
        nccl_expected={k: str(v) for k, v in data["nccl"]["expected"].items()},
        nccl_weights={k: float(v) for k, v in data["nccl"]["weights"].items()},
        custom_all_reduce_share=float(data["nccl"]["custom_all_reduce_share"]),
        decode_fixed_tuned_ms=float(step["decode_fixed_tuned"]),
        decode_fixed_untuned_ms=float(step["decode_fixed_untuned"]),
        per_token_ms=float(step["per_token"]),
        schedule_gap_ms=float(step["schedule_gap"]),
        verify_fixed_tuned_ms=float(step["verify_fixed_tuned"]),
        verify_fixed_untuned_ms=float(step["verify_fixed_untuned"]),
        cycle_overhead_ms=float(step["cycle_overhead"]),
        prefill_fixed_tuned_ms=float(step["prefill_fixed_tuned"]),
        prefill_fixed_untuned_ms=float(step["prefill_fixed_untuned"]),
        prefill_per_token_ms=float(step["prefill_per_token"]),
        spec_prefill_extra_ms=float(step["spec_prefill_extra"]),
        tp_factors={int(k): float(v) for k, v in data["tp"]["factors"].items()},
        temperature_k=float(acceptance["temperature_k"]),
        input_ids_factor=float(acceptance["input_ids_factor"]),
        algorithms=algorithms,
        natural_length_median=float(data["requests"]["natural_length_median"]),
        natural_length_sigma=float(data["requests"]["natural_length_sigma"]),
        natural_length_min=int(data["requests"]["natural_length_min"]),
        memory={k: float(v) for k, v in data["memory"].items()},
        load_shares={k: float(v) for k, v in data["load"].items()},
    )


def nccl_tuning_share(env: Mapping[str, str], constants: ModelConstants) -> float:
    """Weighted share of the seed's NCCL variables present in ``env`` with the tuned values."""
    total = sum(constants.nccl_weights.values())
    present = sum(
        weight
        for name, weight in constants.nccl_weights.items()
        if env.get(name, "").strip().lower() == constants.nccl_expected[name].lower()
    )
    return present / total if total else 0.0


def communication_share(
    nccl_share: float, tp_size: int, disable_custom_all_reduce: bool, constants: ModelConstants
) -> float:
    """The share of "tuned" communication the server effectively gets (see module docstring)."""
    if tp_size <= 1:
        return 1.0
    if not disable_custom_all_reduce:
        base = constants.custom_all_reduce_share
        return base + (1.0 - base) * nccl_share
    return nccl_share


def tp_factor(tp_size: int, constants: ModelConstants) -> float:
    nearest = min(constants.tp_factors, key=lambda size: (abs(size - tp_size), size))
    return constants.tp_factors[nearest]


@dataclass(frozen=True)
class PerfConfig:
    """The server settings the step costs depend on."""

    tp_size: int
    disable_custom_all_reduce: bool
    num_continuous_decode_steps: int
    speculative_algorithm: str | None
    num_steps: int
    eagle_topk: int
    num_draft_tokens: int
    nccl_share: float
    speed: float = 1.0
    slowdown: float = 1.0


@dataclass(frozen=True)
class StepCosts:
    """Step durations in wall seconds, already scaled by speed and slowdown."""

    prefill_fixed: float
    prefill_per_token: float
    decode_fixed: float
    per_token: float
    spec_fixed: float
    num_draft_tokens: int
    speculative: bool

    def prefill(self, new_tokens: int) -> float:
        return self.prefill_fixed + self.prefill_per_token * new_tokens

    def decode(self, batch: int) -> float:
        """One engine step over ``batch`` running sequences (a verify cycle under speculation)."""
        if self.speculative:
            return self.spec_fixed + self.per_token * batch * self.num_draft_tokens
        return self.decode_fixed + self.per_token * batch


def time_scale(speed: float, slowdown: float) -> float:
    """Factor from model milliseconds to wall seconds: the one place speed and slowdown apply."""
    return slowdown / speed / 1000.0


def step_costs(config: PerfConfig, constants: ModelConstants) -> StepCosts:
    share = communication_share(
        config.nccl_share, config.tp_size, config.disable_custom_all_reduce, constants
    )

    def interpolate(tuned: float, untuned: float) -> float:
        return untuned + share * (tuned - untuned)

    scale = time_scale(config.speed, config.slowdown) * tp_factor(config.tp_size, constants)
    speculative = config.speculative_algorithm is not None
    prefill_fixed = interpolate(
        constants.prefill_fixed_tuned_ms, constants.prefill_fixed_untuned_ms
    )
    if speculative:
        prefill_fixed += constants.spec_prefill_extra_ms
    steps_between_gaps = max(1, config.num_continuous_decode_steps)
    decode_fixed = (
        interpolate(constants.decode_fixed_tuned_ms, constants.decode_fixed_untuned_ms)
        + constants.schedule_gap_ms / steps_between_gaps
    )
    spec_fixed = 0.0
    if speculative:
        algorithm = constants.algorithms[resolve_algorithm(config.speculative_algorithm)]
        spec_fixed = (
            config.num_steps * algorithm.draft_step_ms
            + interpolate(constants.verify_fixed_tuned_ms, constants.verify_fixed_untuned_ms)
            + constants.cycle_overhead_ms
        )
    return StepCosts(
        prefill_fixed=prefill_fixed * scale,
        prefill_per_token=constants.prefill_per_token_ms * scale,
        decode_fixed=decode_fixed * scale,
        per_token=constants.per_token_ms * scale,
        spec_fixed=spec_fixed * scale,
        num_draft_tokens=config.num_draft_tokens,
        speculative=speculative,
    )


def resolve_algorithm(algorithm: str | None) -> str:
    """The acceptance table an algorithm uses (NEXTN is an alias of EAGLE)."""
    if algorithm is None:
        raise ValueError("no speculative algorithm")
    return "EAGLE" if algorithm == "NEXTN" else algorithm


def acceptance_probabilities(
    *,
    algorithm: str,
    num_steps: int,
    eagle_topk: int,
    num_draft_tokens: int,
    temperature: float,
    prompt_is_text: bool,
    accept_scale: float,
    constants: ModelConstants,
) -> tuple[float, ...]:
    """Per-position conditional acceptance probabilities for one request (module docstring)."""
    base = constants.algorithms[resolve_algorithm(algorithm)].probs
    width = max(1.0, min(float(eagle_topk), (num_draft_tokens - 1) / max(1, num_steps)))
    factor = math.exp(-constants.temperature_k * max(0.0, temperature)) * accept_scale
    if not prompt_is_text:
        factor *= constants.input_ids_factor
    probs = []
    for position in range(num_steps):
        p = base[min(position, len(base) - 1)]
        p = 1.0 - (1.0 - p) ** width
        probs.append(min(1.0, max(0.0, p * factor)))
    return tuple(probs)


def draw_accepted_drafts(rng: random.Random, probs: Sequence[float]) -> int:
    """Number of draft tokens one verify accepts: the longest accepted prefix."""
    accepted = 0
    for p in probs:
        if rng.random() >= p:
            break
        accepted += 1
    return accepted


def expected_accept_length(probs: Sequence[float]) -> float:
    """Expected tokens per verify (bonus included) without the end-of-request cap."""
    total, run = 1.0, 1.0
    for p in probs:
        run *= p
        total += run
    return total


def expected_cycles(probs: Sequence[float], tokens: int) -> float:
    """Expected verify cycles to produce ``tokens`` tokens, with the end-of-request cap."""
    steps = len(probs)
    outcome: list[float] = []
    run = 1.0
    for k in range(steps + 1):
        outcome.append(run * (1.0 - probs[k]) if k < steps else run)
        if k < steps:
            run *= probs[k]
    cycles = [0.0] * (tokens + 1)
    for remaining in range(1, tokens + 1):
        cycles[remaining] = 1.0 + sum(
            outcome[k] * cycles[remaining - min(k + 1, remaining)] for k in range(steps + 1)
        )
    return cycles[tokens]


def expected_request_seconds(
    costs: StepCosts, probs: Sequence[float], prompt_tokens: int, output_tokens: int
) -> float:
    """Expected wall time of one request running alone (no noise): prefill plus decode steps."""
    decode_steps = float(output_tokens - 1)
    if costs.speculative:
        decode_steps = expected_cycles(probs, output_tokens - 1)
    return costs.prefill(prompt_tokens) + decode_steps * costs.decode(1)


def speed_factor(rng: random.Random, cv: float) -> float:
    """A lognormal factor with mean 1 and coefficient of variation ``cv``."""
    if cv <= 0:
        return 1.0
    sigma = math.sqrt(math.log1p(cv * cv))
    return math.exp(rng.gauss(-0.5 * sigma * sigma, sigma))


def natural_length(rng: random.Random, constants: ModelConstants) -> int:
    """Where a request without ignore_eos would meet its end-of-sequence token."""
    drawn = rng.lognormvariate(
        math.log(constants.natural_length_median), constants.natural_length_sigma
    )
    return max(constants.natural_length_min, int(drawn))
