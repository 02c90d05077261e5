"""Protocol adapters: what differs between the servers' request APIs, one small class per API.

An adapter builds the path, JSON body and headers of one request and reads one response body or
one stream event into a :class:`ParsedUpdate`. Everything else (HTTP, timeouts, SSE framing,
token timelines, errors, concurrency) is the measurement client's
(:mod:`pytest_specdecode.client`), and which adapter a server gets is its backend's choice
(:mod:`pytest_specdecode.backends`).

* :class:`SglangGenerate`: SGLang's native ``POST /generate``.
* :class:`OpenAICompletions`: OpenAI-compatible ``POST /v1/completions`` as SGLang serves it.
* :class:`LlamaCppCompletions`: ``POST /v1/completions`` as llama.cpp's ``llama-server`` serves
  it, with its per-request speculative counts (``timings.draft_n``/``draft_n_accepted``).

Token counting in OpenAI-style streams (see ``reference/sglang-api.md`` §2.4, §3): the client
asks for ``stream_options.include_usage`` (a final chunk with the usage) and, from SGLang,
``continuous_usage_stats`` (a cumulative ``usage`` in every chunk, giving exact counts). A server
that sends no count per chunk gets each non-empty text chunk counted as one token, and the counts
are then scaled to the final ``usage.completion_tokens``: totals are exact, the per-chunk split
(hence ITL) an even-spread approximation. llama-server sends one chunk per token, so there the
split is exact too.

Parse methods raise ``RequestError`` (without a URL; the client adds it) for an error object or a
body of the wrong shape.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Protocol

from pytest_specdecode.errors import ConfigError, RequestError
from pytest_specdecode.workloads import APIS, Prompt, Workload

_EXCERPT_CHARS = 300
NO_HEADERS: Mapping[str, str] = MappingProxyType({})
#: llama-server answers a streamed response with ``Keep-Alive`` but closes the connection after
#: it, so a pooled client that reuses the connection fails its next request ("Server
#: disconnected without sending a response"; 7 of 180 requests in a loop, 0 of 360 with this).
CLOSE_CONNECTION: Mapping[str, str] = MappingProxyType({"Connection": "close"})
#: The keys of ``timings`` that llama-server adds when the request's slot can speculate.
LLAMACPP_SPEC_KEYS = ("draft_n", "draft_n_accepted")


@dataclass(frozen=True)
class ParsedUpdate:
    """What one response body or one stream event says about a request.

    ``completion_tokens`` is a cumulative count stated by the server. ``summary`` marks counts
    that describe the whole request rather than tokens arriving now (OpenAI's final usage-only
    chunk). ``has_text`` says the event carried generated text (used to count tokens when the
    server states no count per chunk).
    """

    completion_tokens: int | None = None
    has_text: bool = False
    summary: bool = False
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    spec_verify_ct: int | None = None
    spec: Mapping[str, object] = field(default_factory=dict)
    server_e2e_latency: float | None = None


class ProtocolAdapter(Protocol):
    """One server API: how to build a request and read its response or stream events."""

    @property
    def name(self) -> str: ...

    @property
    def streaming(self) -> bool: ...

    @property
    def headers(self) -> Mapping[str, str]:
        """Extra HTTP headers of every request."""
        ...

    def request(self, prompt: Prompt, workload: Workload) -> tuple[str, dict[str, object]]:
        """The path and JSON body of one request."""
        ...

    def parse_final(self, body: object) -> ParsedUpdate:
        """A non-streaming response body."""
        ...

    def parse_event(self, data: object) -> ParsedUpdate | None:
        """One decoded SSE ``data`` object; None if it says nothing about the request."""
        ...


@dataclass(frozen=True)
class SglangGenerate:
    """SGLang's native ``POST /generate``: cumulative ``meta_info`` in every chunk, spec fields
    and ``e2e_latency`` in the final one."""

    streaming: bool

    @property
    def name(self) -> str:
        return "generate-stream" if self.streaming else "generate"

    @property
    def headers(self) -> Mapping[str, str]:
        return NO_HEADERS

    def request(self, prompt: Prompt, workload: Workload) -> tuple[str, dict[str, object]]:
        sampling_params = {
            "temperature": workload.temperature,
            "max_new_tokens": workload.max_new_tokens,
            "ignore_eos": workload.ignore_eos,
        }
        return "/generate", {
            "text": prompt.text,
            "sampling_params": sampling_params,
            "stream": self.streaming,
        }

    def parse_final(self, body: object) -> ParsedUpdate:
        return self.parse_event(body)  # a non-streaming body has the shape of a final chunk

    def parse_event(self, data: object) -> ParsedUpdate:
        obj = _json_object(data, "a /generate response")
        _raise_if_error(obj)
        meta = _json_object(obj.get("meta_info"), "meta_info of a /generate response")
        finish = meta.get("finish_reason")
        finish_reason = None
        if isinstance(finish, Mapping):
            finish_reason = str(finish.get("type"))
            if finish_reason == "abort":
                raise RequestError(f"the server aborted the request: {finish.get('message')!r}")
        elif finish is not None:
            finish_reason = str(finish)
        return ParsedUpdate(
            completion_tokens=_count(meta, "completion_tokens", required=True),
            has_text=bool(obj.get("text")),
            prompt_tokens=_count(meta, "prompt_tokens"),
            cached_tokens=_count(meta, "cached_tokens"),
            finish_reason=finish_reason,
            spec_verify_ct=_count(meta, "spec_verify_ct"),
            spec=_spec_fields(meta),
            server_e2e_latency=_number(meta.get("e2e_latency")),
        )


@dataclass(frozen=True)
class OpenAICompletions:
    """OpenAI-compatible ``POST /v1/completions`` as SGLang serves it (extension ``ignore_eos``).

    Spec fields come only from SGLang 2026+ (era D), as ``sglext.spec_tokens_details`` when the
    request sets ``return_spec_tokens_details``. The adapter always sets it: SGLang's request
    models ignore unknown fields, so older servers simply return no spec fields.
    """

    streaming: bool
    model: str | None = None

    @property
    def name(self) -> str:
        return "completions-stream" if self.streaming else "completions"

    @property
    def headers(self) -> Mapping[str, str]:
        return NO_HEADERS

    def request(self, prompt: Prompt, workload: Workload) -> tuple[str, dict[str, object]]:
        body: dict[str, object] = {
            "prompt": prompt.text,
            "max_tokens": workload.max_new_tokens,
            "temperature": workload.temperature,
            "ignore_eos": workload.ignore_eos,
            "stream": self.streaming,
            "return_spec_tokens_details": True,
        }
        if self.model is not None:
            body["model"] = self.model  # SGLang does not need it
        if self.streaming:
            body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        return "/v1/completions", body

    def parse_final(self, body: object) -> ParsedUpdate:
        return _final(self.parse_event(body))

    def parse_event(self, data: object) -> ParsedUpdate:
        obj = _json_object(data, "a /v1/completions response")
        update = _completions_update(obj)
        sglext = obj.get("sglext")
        spec_details = sglext.get("spec_tokens_details") if isinstance(sglext, Mapping) else None
        spec_details = spec_details if isinstance(spec_details, Mapping) else {}
        return replace(
            update,
            spec_verify_ct=_count(spec_details, "spec_verify_ct"),
            spec=_spec_fields(spec_details),
        )


@dataclass(frozen=True)
class LlamaCppCompletions:
    """``POST /v1/completions`` on llama.cpp's ``llama-server``.

    The body sets ``max_tokens``, ``temperature``, ``ignore_eos`` (llama-server honours it: it
    biases every end-of-generation token to -inf), a ``seed`` derived from the prompt text (so a
    prompt samples, and draws ``--spec-synth-*`` acceptance, the same way in every run and in
    the baseline) and ``cache_prompt = not workload.flush_cache`` (llama-server has no
    ``/flush_cache``; without prompt caching every run starts cold, as after SGLang's flush).
    Streams ask for ``stream_options.include_usage`` and send ``Connection: close`` (see
    :data:`CLOSE_CONNECTION`). The final response or chunk carries ``usage`` and ``timings``;
    ``timings.draft_n`` and ``draft_n_accepted`` (draft tokens proposed and accepted in this
    request, present only when the slot speculates) go into ``RequestRecord.spec``.
    ``spec_verify_ct`` stays None: llama-server reports verification steps only in its
    Prometheus counters, which the llama.cpp backend reads around each run. The server's own
    time for the request (``server_e2e_latency``) is ``timings.prompt_ms + predicted_ms``.
    """

    streaming: bool
    model: str | None = None

    @property
    def name(self) -> str:
        return "llamacpp-completions-stream" if self.streaming else "llamacpp-completions"

    @property
    def headers(self) -> Mapping[str, str]:
        return CLOSE_CONNECTION if self.streaming else NO_HEADERS

    def request(self, prompt: Prompt, workload: Workload) -> tuple[str, dict[str, object]]:
        body: dict[str, object] = {
            "prompt": prompt.text,
            "max_tokens": workload.max_new_tokens,
            "temperature": workload.temperature,
            "ignore_eos": workload.ignore_eos,
            "seed": prompt_seed(prompt),
            "cache_prompt": not workload.flush_cache,
            "stream": self.streaming,
        }
        if self.model is not None:
            body["model"] = self.model  # llama-server serves one model and does not need it
        if self.streaming:
            body["stream_options"] = {"include_usage": True}
        return "/v1/completions", body

    def parse_final(self, body: object) -> ParsedUpdate:
        return _final(self.parse_event(body))

    def parse_event(self, data: object) -> ParsedUpdate:
        obj = _json_object(data, "a /v1/completions response")
        update = _completions_update(obj)
        timings = obj.get("timings")
        timings = _json_object(timings, "timings") if timings is not None else {}
        spec = {key: _count(timings, key) for key in LLAMACPP_SPEC_KEYS if key in timings}
        # llama-server's usage (only in the final chunk) always counts the whole request
        summary = update.summary or update.completion_tokens is not None
        return replace(
            update, spec=spec, summary=summary, server_e2e_latency=_server_seconds(timings)
        )


def _server_seconds(timings: Mapping[str, object]) -> float | None:
    """llama-server's own time for a request: prompt evaluation plus generation (``prompt_ms``
    + ``predicted_ms``; queueing and HTTP are not in it), as SGLang's ``e2e_latency`` is the
    server's account beside the client's wall time."""
    prompt_ms = _number(timings.get("prompt_ms"))
    predicted_ms = _number(timings.get("predicted_ms"))
    if prompt_ms is None or predicted_ms is None:
        return None
    return (prompt_ms + predicted_ms) / 1000.0


def prompt_seed(prompt: Prompt) -> int:
    """A sampling seed fixed by the prompt text: 31 bits of its SHA-256."""
    return int.from_bytes(hashlib.sha256(prompt.text.encode()).digest()[:4], "big") >> 1


def adapter_for(api: str, *, model: str | None = None) -> ProtocolAdapter:
    """SGLang's adapter for a workload's ``api`` (``model`` is sent by OpenAI-style APIs)."""
    if api in ("generate", "generate-stream"):
        return SglangGenerate(streaming=api == "generate-stream")
    if api in ("completions", "completions-stream"):
        return OpenAICompletions(streaming=api == "completions-stream", model=model)
    raise ConfigError(f"unknown api {api!r}; choose one of {', '.join(APIS)}")


def _completions_update(obj: Mapping[str, object]) -> ParsedUpdate:
    """The fields every OpenAI-style completion response or chunk has."""
    _raise_if_error(obj)
    choices = obj.get("choices") or []
    if not isinstance(choices, list):
        raise RequestError(f"'choices' is not a list: {excerpt(choices)}")
    choice = _json_object(choices[0], "a choice") if choices else {}
    text = choice.get("text")
    usage = obj.get("usage")
    usage = _json_object(usage, "usage") if usage is not None else {}
    details = usage.get("prompt_tokens_details")
    cached = _count(details, "cached_tokens") if isinstance(details, Mapping) else None
    finish = choice.get("finish_reason")
    if finish == "abort":
        raise RequestError("the server aborted the request (finish_reason 'abort')")
    return ParsedUpdate(
        completion_tokens=_count(usage, "completion_tokens"),
        has_text=isinstance(text, str) and text != "",
        summary=not choices,
        prompt_tokens=_count(usage, "prompt_tokens"),
        cached_tokens=cached,
        finish_reason=None if finish is None else str(finish),
    )


def _final(update: ParsedUpdate) -> ParsedUpdate:
    """A non-streaming completion: its usage is the whole request's."""
    if update.completion_tokens is None:
        raise RequestError("the response has no usage.completion_tokens")
    return replace(update, summary=True)


def _json_object(value: object, what: str) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise RequestError(f"expected {what} to be a JSON object, got {excerpt(value)}")
    return value


def _raise_if_error(obj: Mapping[str, object]) -> None:
    # SGLang sends {"error": {...}} inside a 200 stream; OpenAI-style servers may send an
    # ErrorResponse ({"object": "error", "message": ...}).
    if obj.get("error") is not None or obj.get("object") == "error":
        raise RequestError(f"the server reported an error: {error_message(obj)}")


def error_message(obj: Mapping[str, object]) -> str:
    """The message of an error object (``{"error": {"message": ...}}`` or a bare one)."""
    error = obj.get("error", obj)
    if isinstance(error, Mapping) and isinstance(error.get("message"), str):
        return str(error["message"])
    return excerpt(error)


def _count(mapping: Mapping[str, object], key: str, *, required: bool = False) -> int | None:
    value = mapping.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise RequestError(f"expected {key} to be a count, got {excerpt(value)}")
    return value


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _spec_fields(mapping: Mapping[str, object]) -> dict[str, object]:
    return {k: v for k, v in mapping.items() if k.startswith("spec_") and k != "spec_verify_ct"}


def excerpt(value: object) -> str:
    """At most 300 characters of ``value`` (JSON unless a string), whitespace collapsed."""
    text = value if isinstance(value, str) else json.dumps(value, default=repr)
    text = " ".join(text.split())
    return text if len(text) <= _EXCERPT_CHARS else text[:_EXCERPT_CHARS] + "…"
