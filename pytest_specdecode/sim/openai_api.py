"""OpenAI-compatible ``/v1/completions`` and ``/v1/chat/completions`` (SGLang's shapes)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from pytest_specdecode.sim.engine import Sequence
from pytest_specdecode.sim.faults import malformed_event
from pytest_specdecode.sim.httputil import (
    SSE_DONE,
    BadRequestBody,
    client_sent_at,
    dumps,
    error_stream,
    openai_error,
    openai_error_response,
    read_json_object,
    require_json_content_type,
    validation_error_response,
)
from pytest_specdecode.sim.inputs import GenerationInput, SamplingParams, verify_sampling_params
from pytest_specdecode.sim.logs import SIM_LOGGER
from pytest_specdecode.sim.native import MALFORMED_AFTER_CHUNKS, check_prompt_lengths
from pytest_specdecode.sim.server import SimServer, spec_meta_info
from pytest_specdecode.sim.tokenizer import apply_chat_template, encode

log = logging.getLogger(SIM_LOGGER)


@dataclass(frozen=True)
class _OpenAIRequest:
    rid: str
    model: str
    inputs: list[GenerationInput]
    stream: bool
    include_usage: bool
    continuous_usage: bool
    spec_details: bool = False  # return_spec_tokens_details (honoured from 0.5.19 on)


def _sampling_from_openai(body: dict[str, Any], max_tokens: int | None) -> SamplingParams:
    def number(key: str, default: float) -> float:
        value = body.get(key, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BadRequestBody(f"{key}: Input should be a valid number, got {value!r}")
        return float(value)

    sampling = SamplingParams(
        max_new_tokens=max_tokens,
        temperature=number("temperature", 1.0),
        top_p=number("top_p", 1.0),
        top_k=int(number("top_k", -1)),
        min_p=number("min_p", 0.0),
        frequency_penalty=number("frequency_penalty", 0.0),
        presence_penalty=number("presence_penalty", 0.0),
        repetition_penalty=number("repetition_penalty", 1.0),
        min_new_tokens=int(number("min_tokens", 0)),
        n=int(number("n", 1)),
        ignore_eos=bool(body.get("ignore_eos", False)),
    )
    return sampling


def _max_tokens(body: dict[str, Any], *keys: str, default: int | None) -> int | None:
    for key in keys:
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadRequestBody(f"{key}: Input should be a valid integer, got {value!r}")
        if value <= 0:
            raise BadRequestBody(f"Value error, {key} must be positive")
        return value
    return default


def _stream_options(body: dict[str, Any]) -> tuple[bool, bool]:
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequestBody("stream_options: Input should be a valid dictionary")
    return bool(options.get("include_usage")), bool(options.get("continuous_usage_stats"))


def _completion_prompts(prompt: object) -> list[tuple[list[int], bool]]:
    if isinstance(prompt, str):
        return [(encode(prompt), True)]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return [(encode(p), True) for p in prompt if isinstance(p, str)]
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return [([t for t in prompt if isinstance(t, int)], False)]
        if all(isinstance(p, list) and p for p in prompt):
            return [(list(p), False) for p in prompt if isinstance(p, list)]
    raise BadRequestBody("prompt: Input should be a string, a list of strings or of token ids")


def _parse_completion(body: dict[str, Any]) -> _OpenAIRequest:
    if "prompt" not in body:
        raise BadRequestBody("prompt: Field required")
    prompts = _completion_prompts(body["prompt"])
    sampling = _sampling_from_openai(body, _max_tokens(body, "max_tokens", default=16))
    include_usage, continuous = _stream_options(body)
    rid = str(body.get("rid") or f"cmpl-{uuid.uuid4().hex}")
    inputs = [
        GenerationInput(
            rid=rid if len(prompts) == 1 else f"{rid}-{i}",
            prompt_ids=ids,
            prompt_is_text=is_text,
            sampling=sampling,
        )
        for i, (ids, is_text) in enumerate(prompts)
    ]
    return _OpenAIRequest(
        rid,
        str(body.get("model", "default")),
        inputs,
        bool(body.get("stream")),
        include_usage,
        continuous,
        bool(body.get("return_spec_tokens_details")),
    )


def _parse_chat(body: dict[str, Any]) -> _OpenAIRequest:
    messages = body.get("messages")
    if (
        not isinstance(messages, list)
        or not messages
        or not all(isinstance(m, dict) for m in messages)
    ):
        raise BadRequestBody("messages: Input should be a non-empty list of messages")
    # No max_tokens means "until the context is full" for chat, as upstream.
    max_tokens = _max_tokens(body, "max_completion_tokens", "max_tokens", default=None)
    sampling = _sampling_from_openai(body, max_tokens)
    include_usage, continuous = _stream_options(body)
    rid = str(body.get("rid") or f"chatcmpl-{uuid.uuid4().hex}")
    item = GenerationInput(
        rid=rid,
        prompt_ids=encode(apply_chat_template(messages)),
        prompt_is_text=True,
        sampling=sampling,
    )
    return _OpenAIRequest(
        rid,
        str(body.get("model", "default")),
        [item],
        bool(body.get("stream")),
        include_usage,
        continuous,
        bool(body.get("return_spec_tokens_details")),
    )


def _usage(server: SimServer, seqs: list[Sequence]) -> dict[str, Any]:
    prompt = sum(seq.prompt_tokens for seq in seqs)
    completion = sum(seq.completion_tokens for seq in seqs)
    details = None
    if server.args.enable_cache_report:
        details = {"cached_tokens": sum(seq.cached_tokens for seq in seqs)}
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": details,
        "reasoning_tokens": 0,
    }


def _sglext(server: SimServer, parsed: _OpenAIRequest, seqs: list[Sequence]) -> dict[str, Any]:
    """``{"sglext": {"spec_tokens_details": ...}}`` where the release returns it (0.5.19+, asked
    with ``return_spec_tokens_details``, on a speculative server), else ``{}``: SGLang builds it
    from each request's final ``meta_info`` spec fields (``spec_tokens_details_from_meta_info``
    in ``entrypoints/openai/utils.py``), one object per request, a list for several."""
    if not (parsed.spec_details and server.era.openai_spec_details and server.speculative):
        return {}
    details = []
    for seq in seqs:
        meta = spec_meta_info(seq, server.num_draft_tokens, server.era)
        if not meta:
            continue  # no verify step: SGLang 0.5.23 sends no spec fields, hence no details
        details.append(
            {
                "spec_accept_rate": meta.get("spec_accept_rate") or 0.0,
                "spec_accept_length": meta.get("spec_accept_length") or 0.0,
                "spec_cap_length": 0.0,
                "spec_block_accept_length": 0.0,
                "spec_num_correct_drafts": meta.get("spec_num_correct_drafts") or 0,
                "spec_num_proposed_drafts": meta.get("spec_num_proposed_drafts") or 0,
                "spec_verify_ct": meta.get("spec_verify_ct") or 0,
                "spec_correct_drafts_histogram": meta.get("spec_correct_drafts_histogram") or [],
                "spec_cap_lens_histogram": [],
            }
        )
    if not details:
        return {}
    return {"sglext": {"spec_tokens_details": details if len(seqs) > 1 else details[0]}}


def _finish(server: SimServer, seq: Sequence) -> tuple[str | None, int | None]:
    reason = server.finish_reason(seq)
    if reason is None:
        return None, None
    matched = reason.get("matched")
    return str(reason["type"]), matched if isinstance(matched, int) else None


async def completions(request: Request) -> Response:
    return await _handle(request, _parse_completion, chat=False)


async def chat_completions(request: Request) -> Response:
    return await _handle(request, _parse_chat, chat=True)


async def _handle(
    request: Request, parse: Callable[[dict[str, Any]], _OpenAIRequest], *, chat: bool
) -> Response:
    server: SimServer = request.app.state.sim
    try:
        require_json_content_type(request)
        body = await read_json_object(request)
        parsed = parse(body)
    except BadRequestBody as exc:
        return validation_error_response(str(exc))
    if parsed.stream and len(parsed.inputs) > 1:
        return openai_error_response(
            "Streaming a batch of prompts is not supported by the simulated server."
        )
    if server.faults.active("http-500"):
        return openai_error_response(
            "Internal server error: simulated fault (--sim-fault http-500)",
            err_type="InternalServerError",
            status=500,
        )
    doomed = server.faults.count_generate_request()
    try:
        for item in parsed.inputs:
            verify_sampling_params(item.sampling)
        check_prompt_lengths(server, parsed.inputs)
    except ValueError as exc:
        log.error("Error in request: %s", exc)
        if parsed.stream:
            return error_stream(openai_error(str(exc)))
        return openai_error_response(str(exc))
    sent_at = client_sent_at(request, asyncio.get_running_loop().time())
    seqs = [
        server.new_sequence(item, doomed=doomed and i == 0, arrival=sent_at)
        for i, item in enumerate(parsed.inputs)
    ]
    created = int(time.time())
    if parsed.stream:
        return StreamingResponse(
            _stream(server, parsed, seqs, created, chat=chat), media_type="text/event-stream"
        )
    await asyncio.gather(*(server.wait_finished(seq) for seq in seqs))
    choices = []
    for index, seq in enumerate(seqs):
        finish_reason, matched = _finish(server, seq)
        choice: dict[str, Any] = {"index": index}
        text = seq.output.text()
        if chat:
            choice["message"] = {
                "role": "assistant",
                "content": text,
                "reasoning_content": None,
                "tool_calls": None,
            }
        else:
            choice["text"] = text
        choice.update(logprobs=None, finish_reason=finish_reason, matched_stop=matched)
        choices.append(choice)
    return JSONResponse(
        {
            "id": parsed.rid,
            "object": "chat.completion" if chat else "text_completion",
            "created": created,
            "model": parsed.model,
            "choices": choices,
            "usage": _usage(server, seqs),
            "metadata": {"weight_version": server.args.weight_version},
            **_sglext(server, parsed, seqs),
        }
    )


async def _stream(
    server: SimServer, parsed: _OpenAIRequest, seqs: list[Sequence], created: int, *, chat: bool
) -> AsyncIterator[bytes]:
    """Delta chunks; chat opens with the assistant role and closes with an empty finish delta."""
    seq = seqs[0]  # a streamed request carries one prompt (checked in _handle)
    header = {
        "id": parsed.rid,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": parsed.model,
    }
    malformed = server.faults.active("malformed-sse")

    def chunk(delta: str | None, finish: str | None, matched: int | None, role: bool) -> bytes:
        choice: dict[str, Any] = {"index": 0}
        if chat:
            if delta is None:
                choice["delta"] = {}
            elif role:  # upstream's opening chunk also carries an empty reasoning field
                choice["delta"] = {"reasoning_content": None, "role": "assistant", "content": delta}
            else:
                choice["delta"] = {"role": None, "content": delta}
        else:
            choice["text"] = delta or ""
        choice.update(logprobs=None, finish_reason=finish, matched_stop=matched)
        usage = _usage(server, [seq]) if parsed.continuous_usage else None
        return dumps({**header, "choices": [choice], "usage": usage})

    try:
        if chat:
            yield b"data: " + chunk("", None, None, role=True) + b"\n\n"
        sent = 0
        chunks = 0
        async for count in server.updates(seq):
            finish, matched = (
                _finish(server, seq) if count == seq.completion_tokens else (None, None)
            )
            if count > sent or (finish and not chat):
                payload = chunk(
                    seq.output.text_between(sent, count),
                    None if chat else finish,
                    None if chat else matched,
                    role=False,
                )
                chunks += 1
                if malformed and chunks == MALFORMED_AFTER_CHUNKS + 1:
                    yield malformed_event(payload)
                yield b"data: " + payload + b"\n\n"
                sent = count
            if chat and finish:
                yield b"data: " + chunk(None, finish, matched, role=False) + b"\n\n"
        extension = _sglext(server, parsed, seqs)
        if extension:  # its own chunk, "choices": [] (sglext is at response level), as upstream
            yield b"data: " + dumps({**header, "choices": [], **extension}) + b"\n\n"
        if parsed.include_usage:
            # The closing usage drops unset fields (real 0.5.15: no prompt_tokens_details).
            usage = {k: v for k, v in _usage(server, [seq]).items() if v is not None}
            yield b"data: " + dumps({**header, "choices": [], "usage": usage}) + b"\n\n"
        yield SSE_DONE
    finally:
        for each in seqs:
            server.engine.abort(each)
