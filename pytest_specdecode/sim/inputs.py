"""Request bodies → validated generation inputs, with SGLang's defaults and error messages.

Validation failures raise ``ValueError`` with SGLang's wording; the HTTP layer turns them into a
400 (or an error event inside a 200 stream), as SGLang's tokenizer manager does.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_specdecode.sim.logprobs import LogprobRequest
from pytest_specdecode.sim.tokenizer import encode, encode_pieces

_SAMPLING_KEYS = frozenset(
    {
        "max_new_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "min_new_tokens",
        "n",
        "stop",
        "stop_token_ids",
        "stop_regex",
        "ignore_eos",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "no_stop_trim",
        "json_schema",
        "regex",
        "ebnf",
        "structural_tag",
        "custom_params",
        "logit_bias",
        "stream_interval",
        "sampling_seed",
    }
)


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int | None = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    n: int = 1
    ignore_eos: bool = False
    stream_interval: int | None = None


@dataclass(frozen=True)
class GenerationInput:
    """One prompt of a request, ready for the engine."""

    rid: str
    prompt_ids: list[int]
    prompt_is_text: bool
    sampling: SamplingParams
    log_metrics: bool = True
    #: ``return_logprob``: what to report; None = no logprob fields.
    logprobs: LogprobRequest | None = None
    #: The prompt's token texts when it came as text (logprob texts need them).
    prompt_pieces: list[str] | None = None


def _number(params: Mapping[str, Any], key: str, default: float) -> float:
    value = params.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key} must be a number, got {value!r}.")
    return float(value)


def _integer(params: Mapping[str, Any], key: str, default: int | None) -> int | None:
    value = params.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} must be an integer, got {value!r}.")
    return value


def parse_sampling_params(params: Mapping[str, Any] | None) -> SamplingParams:
    """SGLang's ``SamplingParams`` with its ``verify()`` checks."""
    params = params or {}
    if not isinstance(params, Mapping):
        raise ValueError(f"sampling_params must be an object, got {params!r}.")
    unknown = sorted(set(params) - _SAMPLING_KEYS)
    if unknown:
        raise ValueError(f"Unknown sampling parameters: {', '.join(unknown)}.")
    max_new_tokens = _integer(params, "max_new_tokens", 128)
    sampling = SamplingParams(
        max_new_tokens=max_new_tokens,
        temperature=_number(params, "temperature", 1.0),
        top_p=_number(params, "top_p", 1.0),
        top_k=_integer(params, "top_k", -1) or 0,
        min_p=_number(params, "min_p", 0.0),
        frequency_penalty=_number(params, "frequency_penalty", 0.0),
        presence_penalty=_number(params, "presence_penalty", 0.0),
        repetition_penalty=_number(params, "repetition_penalty", 1.0),
        min_new_tokens=_integer(params, "min_new_tokens", 0) or 0,
        n=_integer(params, "n", 1) or 1,
        ignore_eos=bool(params.get("ignore_eos", False)),
        stream_interval=_integer(params, "stream_interval", None),
    )
    verify_sampling_params(sampling)
    return sampling


def verify_sampling_params(s: SamplingParams) -> None:
    if s.temperature < 0.0:
        raise ValueError(f"temperature must be non-negative, got {s.temperature}.")
    if not 0.0 < s.top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {s.top_p}.")
    if not 0.0 <= s.min_p <= 1.0:
        raise ValueError(f"min_p must be in [0, 1], got {s.min_p}.")
    if s.top_k < 1 and s.top_k != -1:
        raise ValueError(f"top_k must be -1 (disable), or at least 1, got {s.top_k}.")
    if not -2.0 <= s.frequency_penalty <= 2.0:
        raise ValueError(f"frequency_penalty must be in [-2, 2], got {s.frequency_penalty}.")
    if not -2.0 <= s.presence_penalty <= 2.0:
        raise ValueError(f"presence_penalty must be in [-2, 2], got {s.presence_penalty}.")
    if not 0.0 <= s.repetition_penalty <= 2.0:
        raise ValueError(f"repetition_penalty must be in [0, 2], got {s.repetition_penalty}.")
    if s.max_new_tokens is not None:
        if s.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be at least 0, got {s.max_new_tokens}.")
        if not 0 <= s.min_new_tokens <= s.max_new_tokens:
            raise ValueError(
                f"min_new_tokens must be in [0, max_new_tokens({s.max_new_tokens})], "
                f"got {s.min_new_tokens}."
            )
    if s.n != 1:
        raise ValueError("n > 1 (parallel sampling) is not supported by the simulated server.")


def _is_int_list(value: object) -> bool:
    return isinstance(value, list) and all(
        isinstance(x, int) and not isinstance(x, bool) for x in value
    )


@dataclass(frozen=True)
class NativeRequest:
    """A parsed ``POST /generate`` body."""

    inputs: list[GenerationInput]
    is_batch: bool
    stream: bool


def parse_generate_request(body: Mapping[str, Any]) -> NativeRequest:
    """Normalise ``text`` / ``input_ids`` (single or batch) like ``GenerateReqInput``."""
    text, input_ids = body.get("text"), body.get("input_ids")
    if body.get("input_embeds") is not None:
        raise ValueError("input_embeds is not supported by the simulated server.")
    if (text is None) == (input_ids is None):
        raise ValueError("Either text, input_ids or input_embeds should be provided.")
    prompts: list[tuple[list[int], bool]]
    if text is not None:
        if isinstance(text, str):
            prompts, is_batch = [(encode(text), True)], False
        elif isinstance(text, list) and text and all(isinstance(t, str) for t in text):
            prompts, is_batch = [(encode(t), True) for t in text], True
        else:
            raise ValueError("text must be a string or a non-empty list of strings.")
    elif _is_int_list(input_ids) and input_ids:
        prompts, is_batch = [(list(input_ids), False)], False
    elif (
        isinstance(input_ids, list)
        and input_ids
        and all(_is_int_list(ids) and ids for ids in input_ids)
    ):
        prompts, is_batch = [(list(ids), False) for ids in input_ids], True
    else:
        raise ValueError("input_ids must be a non-empty list of ints or a list of such lists.")
    raw_params = body.get("sampling_params")
    params_list: Sequence[Any]
    if isinstance(raw_params, list):
        if len(raw_params) != len(prompts):
            raise ValueError("The length of sampling_params does not match the batch size.")
        params_list = raw_params
    else:
        params_list = [raw_params] * len(prompts)
    rid = body.get("rid")
    rids: list[str]
    if isinstance(rid, list):
        if len(rid) != len(prompts):
            raise ValueError("The rid should be a list for batch requests.")
        rids = [str(r) for r in rid]
    elif rid is not None and not is_batch:
        rids = [str(rid)]
    else:
        rids = [uuid.uuid4().hex for _ in prompts]
    log_metrics = bool(body.get("log_metrics", True))
    logprobs = _logprob_requests(body, len(prompts))
    texts: list[str] = text if isinstance(text, list) else [text] if text is not None else []
    inputs = [
        GenerationInput(
            rid=rids[i],
            prompt_ids=ids,
            prompt_is_text=is_text,
            sampling=parse_sampling_params(params_list[i]),
            log_metrics=log_metrics,
            logprobs=logprobs[i],
            prompt_pieces=encode_pieces(texts[i]) if is_text and logprobs[i] else None,
        )
        for i, (ids, is_text) in enumerate(prompts)
    ]
    return NativeRequest(inputs=inputs, is_batch=is_batch, stream=bool(body.get("stream", False)))


def _per_item(body: Mapping[str, Any], key: str, default: Any, count: int) -> list[Any]:
    """A field given once for the batch or as a list with one value per prompt."""
    value = body.get(key)
    if value is None:
        return [default] * count
    if isinstance(value, list):
        if len(value) != count:
            raise ValueError(f"The length of {key} does not match the batch size.")
        return [default if v is None else v for v in value]
    return [value] * count


def _logprob_requests(body: Mapping[str, Any], count: int) -> list[LogprobRequest | None]:
    """``return_logprob`` and its companions, per prompt (``GenerateReqInput`` normalises them
    the same way)."""
    wanted = _per_item(body, "return_logprob", False, count)
    starts = _per_item(body, "logprob_start_len", -1, count)
    tops = _per_item(body, "top_logprobs_num", 0, count)
    texts = _per_item(body, "return_text_in_logprobs", False, count)
    requests: list[LogprobRequest | None] = []
    for i in range(count):
        if not wanted[i]:
            requests.append(None)
            continue
        for key, value in (("logprob_start_len", starts[i]), ("top_logprobs_num", tops[i])):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{key} must be an integer, got {value!r}.")
        if tops[i] < 0:
            raise ValueError(f"top_logprobs_num must be at least 0, got {tops[i]}.")
        requests.append(LogprobRequest(starts[i], tops[i], bool(texts[i])))
    return requests
