"""SGLang's native ``POST /generate``: single or batch, blocking or streamed (SSE)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from pytest_specdecode.sim.engine import Sequence
from pytest_specdecode.sim.faults import malformed_event
from pytest_specdecode.sim.httputil import (
    SSE_DONE,
    BadRequestBody,
    client_sent_at,
    error_stream,
    native_error_response,
    read_json_object,
    validation_error_response,
)
from pytest_specdecode.sim.inputs import GenerationInput, parse_generate_request
from pytest_specdecode.sim.logs import SIM_LOGGER
from pytest_specdecode.sim.server import SimServer

log = logging.getLogger(SIM_LOGGER)

#: After how many chunks the ``malformed-sse`` fault breaks one event.
MALFORMED_AFTER_CHUNKS = 2


def check_prompt_lengths(server: SimServer, inputs: list[GenerationInput]) -> None:
    limit = server.memory.max_req_input_len
    for item in inputs:
        if len(item.prompt_ids) > limit:
            raise ValueError(
                f"The input ({len(item.prompt_ids)} tokens) is longer than the model's context "
                f"length ({server.memory.context_len} tokens)."
            )


def native_result(
    server: SimServer, seq: Sequence, count: int, sent_ids: int = 0
) -> dict[str, Any]:
    """``{"text", "output_ids", "meta_info"}`` as of ``count`` tokens (text is cumulative)."""
    ids = seq.output.ids
    output_ids = ids[sent_ids:count] if server.args.stream_output else ids[:count]
    return {
        "text": seq.output.text(count),
        "output_ids": output_ids,
        "meta_info": server.meta_info(seq, count),
    }


def encode_native_chunk(
    server: SimServer, seq: Sequence, count: int, sent_ids: int, index: int | None
) -> bytes:
    """The same object as ``native_result`` as JSON bytes, with the cumulative ids pre-encoded."""
    if server.args.stream_output:
        ids_json = json.dumps(seq.output.ids[sent_ids:count])
    else:
        ids_json = seq.output.ids_json(count)
    tail = "" if index is None else f',"index":{index}'
    return (
        f'{{"text":{json.dumps(seq.output.text(count), ensure_ascii=False)},'
        f'"output_ids":{ids_json},"meta_info":{json.dumps(server.meta_info(seq, count))}{tail}}}'
    ).encode()


async def generate(request: Request) -> Response:
    server: SimServer = request.app.state.sim
    try:
        body = await read_json_object(request)
    except BadRequestBody as exc:
        return validation_error_response(str(exc))
    if server.faults.active("http-500"):
        return native_error_response(
            "Internal server error (simulated fault: --sim-fault http-500)", status=500
        )
    doomed = server.faults.count_generate_request()
    try:
        parsed = parse_generate_request(body)
        check_prompt_lengths(server, parsed.inputs)
        logprobs = [server.plan_logprobs(item) for item in parsed.inputs]
    except ValueError as exc:
        log.error("[http_server] Error: %s", exc)
        if body.get("stream"):
            # Upstream validates inside the streaming generator: the error arrives in a 200.
            return error_stream({"message": str(exc)})
        return native_error_response(str(exc))
    sent_at = client_sent_at(request, asyncio.get_running_loop().time())
    seqs = [
        server.new_sequence(item, doomed=doomed and i == 0, logprobs=logprobs[i], arrival=sent_at)
        for i, item in enumerate(parsed.inputs)
    ]
    intervals = [item.sampling.stream_interval for item in parsed.inputs]
    if parsed.stream:
        return StreamingResponse(
            _stream(server, seqs, intervals, parsed.is_batch), media_type="text/event-stream"
        )
    await asyncio.gather(*(server.wait_finished(seq) for seq in seqs))
    results = [native_result(server, seq, seq.completion_tokens) for seq in seqs]
    return JSONResponse(results if parsed.is_batch else results[0])


async def _stream(
    server: SimServer, seqs: list[Sequence], intervals: list[int | None], is_batch: bool
) -> AsyncIterator[bytes]:
    malformed = server.faults.active("malformed-sse")
    chunks = 0
    try:
        async for index, seq, count, sent in _merged_updates(server, seqs, intervals):
            payload = encode_native_chunk(server, seq, count, sent, index if is_batch else None)
            chunks += 1
            if malformed and chunks == MALFORMED_AFTER_CHUNKS + 1:
                yield malformed_event(payload)
            yield b"data: " + payload + b"\n\n"
        yield SSE_DONE
    finally:
        # A client that went away aborts its requests, as upstream's abort task does.
        for seq in seqs:
            server.engine.abort(seq)


async def _merged_updates(
    server: SimServer, seqs: list[Sequence], intervals: list[int | None]
) -> AsyncIterator[tuple[int, Sequence, int, int]]:
    """(index, sequence, tokens now, tokens already sent) whenever a chunk is due."""
    if len(seqs) == 1:
        sent = 0
        async for count in server.updates(seqs[0], intervals[0]):
            yield 0, seqs[0], count, sent
            sent = count
        return
    queue: asyncio.Queue[tuple[int, int] | None] = asyncio.Queue()

    async def pump(index: int) -> None:
        async for count in server.updates(seqs[index], intervals[index]):
            await queue.put((index, count))
        await queue.put(None)

    tasks = [asyncio.create_task(pump(i)) for i in range(len(seqs))]
    sent_per_seq = [0] * len(seqs)
    try:
        remaining = len(seqs)
        while remaining:
            item = await queue.get()
            if item is None:
                remaining -= 1
                continue
            index, count = item
            yield index, seqs[index], count, sent_per_seq[index]
            sent_per_seq[index] = count
    finally:
        for task in tasks:
            task.cancel()
