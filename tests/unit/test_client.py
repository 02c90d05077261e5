"""The measurement client against httpx.MockTransport handlers that answer like SGLang."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import cast

import httpx
import pytest

from pytest_specdecode.adapters import OpenAICompletions, SglangGenerate, adapter_for
from pytest_specdecode.client import SIM_SENT_AT_HEADER, MeasurementClient, _sse_data
from pytest_specdecode.errors import ConfigError, RequestError
from pytest_specdecode.workloads import Prompt, Workload

BASE_URL = "http://127.0.0.1:30000"
PROMPTS = (Prompt("code", "Write a function."), Prompt("chat", "Plan my weekend."))
SPEC_FIELDS = {
    "spec_verify_ct": 3,
    "spec_accept_length": 2.3333,
    "spec_accept_rate": 0.4444,
    "spec_accept_histogram": [1, 0, 2, 0],
}

Handler = Callable[[httpx.Request], httpx.Response | Coroutine[None, None, httpx.Response]]


def workload(api: str = "generate-stream", **changes: object) -> Workload:
    base = Workload("unit", "inline", PROMPTS, api=api, requests_per_run=2, warmup_requests=1)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


@pytest.fixture
def requests_seen() -> list[httpx.Request]:
    return []


def make_client(
    handler: Handler, seen: list[httpx.Request], **options: object
) -> MeasurementClient:
    def recording(
        request: httpx.Request,
    ) -> httpx.Response | Coroutine[None, None, httpx.Response]:
        seen.append(request)
        return handler(request)

    transport = httpx.MockTransport(cast("Callable[[httpx.Request], httpx.Response]", recording))
    return MeasurementClient(BASE_URL, transport=transport, **options)  # type: ignore[arg-type]


# --- realistic SGLang responses ----------------------------------------------------------------


def native_chunk(
    text: str, tokens: int, *, final: bool = False, spec: bool = True
) -> dict[str, object]:
    """One /generate chunk: cumulative text and meta_info; e2e_latency, spec_* only at the end."""
    meta: dict[str, object] = {
        "id": "5f1c",
        "finish_reason": {"type": "length", "length": tokens} if final else None,
        "prompt_tokens": 57,
        "completion_tokens": tokens,
        "cached_tokens": 16,
        "weight_version": "default",
        "total_retractions": 0,
    }
    if final:
        meta["e2e_latency"] = 0.0812
        if spec:
            meta.update(SPEC_FIELDS)
    return {"text": text, "output_ids": list(range(tokens)), "meta_info": meta}


def sse(*events: object, done: bool = True) -> bytes:
    body = "".join(f"data: {json.dumps(event)}\n\n" for event in events)
    return (body + ("data: [DONE]\n\n" if done else "")).encode()


def event_stream(content: bytes | AsyncIterator[bytes], status: int = 200) -> httpx.Response:
    return httpx.Response(status, headers={"content-type": "text/event-stream"}, content=content)


# Seven tokens in four chunks, two of them carrying several tokens (a verify step accepting 2-3).
NATIVE_STREAM = sse(
    native_chunk("def", 1),
    native_chunk("def merge(", 3),
    native_chunk("def merge(", 3),  # a chunk that adds no token is not an arrival
    native_chunk("def merge(a,", 4),
    native_chunk("def merge(a, b):", 7, final=True),
)


def native_handler(request: httpx.Request) -> httpx.Response:
    if json.loads(request.content).get("stream"):
        return event_stream(NATIVE_STREAM)
    return httpx.Response(200, json=native_chunk("def merge(a, b):", 7, final=True))


def openai_chunk(
    text: str, *, finish: str | None = None, usage: int | None = None
) -> dict[str, object]:
    chunk: dict[str, object] = {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1730000000,
        "model": "default",
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
    }
    if usage is not None:
        chunk["usage"] = {
            "prompt_tokens": 57,
            "completion_tokens": usage,
            "total_tokens": 57 + usage,
        }
    return chunk


def openai_usage_chunk(completion_tokens: int) -> dict[str, object]:
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1730000000,
        "model": "default",
        "choices": [],
        "usage": {
            "prompt_tokens": 57,
            "completion_tokens": completion_tokens,
            "total_tokens": 57 + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": 16},
        },
    }


def single_record(client: MeasurementClient, api: str, **changes: object):  # type: ignore[no-untyped-def]
    run = client.run(workload(api, requests_per_run=1, **changes), run_index=0)
    assert len(run.records) == 1
    return run.records[0]


# --- requests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["generate", "generate-stream"])
def test_native_requests_always_carry_temperature_ignore_eos_and_max_new_tokens(
    api: str, requests_seen: list[httpx.Request]
) -> None:
    with make_client(native_handler, requests_seen) as client:
        client.run(workload(api, max_new_tokens=300, temperature=0.0), run_index=0)

    for request in requests_seen:
        body = json.loads(request.content)
        assert (request.method, request.url.path) == ("POST", "/generate")
        assert body["sampling_params"] == {
            "temperature": 0.0,
            "max_new_tokens": 300,
            "ignore_eos": True,
        }
        assert body["stream"] is (api == "generate-stream")
    assert [json.loads(r.content)["text"] for r in requests_seen] == [p.text for p in PROMPTS]


@pytest.mark.parametrize("api", ["completions", "completions-stream"])
def test_openai_requests_carry_the_same_shape_and_ask_for_usage(
    api: str, requests_seen: list[httpx.Request]
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if api == "completions":
            return httpx.Response(
                200,
                json={
                    **openai_chunk("x", finish="length"),
                    "usage": {"prompt_tokens": 57, "completion_tokens": 1, "total_tokens": 58},
                },
            )
        return event_stream(sse(openai_chunk("x", finish="length", usage=1), openai_usage_chunk(1)))

    with make_client(handler, requests_seen, model="served-model") as client:
        single_record(client, api, max_new_tokens=1, ignore_eos=False, temperature=0.5)

    body = json.loads(requests_seen[0].content)
    assert requests_seen[0].url.path == "/v1/completions"
    assert (body["max_tokens"], body["temperature"], body["ignore_eos"]) == (1, 0.5, False)
    assert body["model"] == "served-model"
    assert body["return_spec_tokens_details"] is True
    if api == "completions-stream":
        assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    else:
        assert "stream_options" not in body


@pytest.mark.parametrize("api", ["generate", "generate-stream", "completions-stream"])
def test_only_a_simulated_server_is_told_when_each_request_was_sent(
    api: str, requests_seen: list[httpx.Request]
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if api == "completions-stream":
            return event_stream(sse(openai_chunk("x", finish="length", usage=1)))
        return native_handler(request)

    before = time.monotonic()
    with make_client(handler, requests_seen, simulated=True) as client:
        client.run(workload(api), run_index=0)
    after = time.monotonic()
    with make_client(handler, requests_seen) as client:  # a real server: nothing extra
        client.run(workload(api), run_index=0)

    simulated, real = requests_seen[:2], requests_seen[2:]
    sent = [float(request.headers[SIM_SENT_AT_HEADER]) for request in simulated]
    assert before <= sent[0] <= sent[1] <= after  # the simulator's clock: time.monotonic()
    assert [SIM_SENT_AT_HEADER in request.headers for request in real] == [False, False]


def test_api_key_is_sent_as_bearer_token_and_never_appears_in_errors(
    requests_seen: list[httpx.Request],
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        echoed = request.headers["authorization"]
        return httpx.Response(401, json={"error": {"message": f"bad header {echoed}"}})

    client = make_client(handler, requests_seen, api_key="sk-secret-42")
    with client, pytest.raises(RequestError) as caught:
        client.run(workload(), run_index=0)

    assert requests_seen[0].headers["authorization"] == "Bearer sk-secret-42"
    assert "sk-secret-42" not in str(caught.value)
    assert "HTTP 401" in str(caught.value)
    assert caught.value.status == 401


def test_credentials_in_the_base_url_are_left_out_of_messages() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, text="boom")

    transport = httpx.MockTransport(handler)
    client = MeasurementClient("http://user:hunter2@gpu-box:30000", transport=transport)
    with client, pytest.raises(RequestError) as caught:
        client.run(workload(), run_index=0)

    assert "hunter2" not in str(caught.value)
    assert "http://gpu-box:30000/generate" in str(caught.value)


@pytest.mark.parametrize("bad_url", ["gpu-box:30000", "ftp://gpu-box", "http://"])
def test_a_base_url_that_is_not_http_is_a_config_error(bad_url: str) -> None:
    with pytest.raises(ConfigError, match=r"http:// or https://|not a valid URL"):
        MeasurementClient(bad_url)


# --- native /generate --------------------------------------------------------------------------


def test_native_stream_records_cumulative_tokens_of_each_chunk_and_final_spec_fields(
    requests_seen: list[httpx.Request],
) -> None:
    with make_client(native_handler, requests_seen) as client:
        record = single_record(client, "generate-stream")

    assert record.chunk_tokens == (1, 3, 4, 7)
    assert list(record.chunk_times) == sorted(record.chunk_times)
    assert record.t_start <= record.t_first_token == record.chunk_times[0] <= record.t_end
    assert record.ttft is not None
    assert record.ttft >= 0
    assert (record.prompt_tokens, record.completion_tokens, record.cached_tokens) == (57, 7, 16)
    assert record.spec_verify_ct == 3
    assert record.spec == {
        "spec_accept_length": 2.3333,
        "spec_accept_rate": 0.4444,
        "spec_accept_histogram": [1, 0, 2, 0],
    }
    assert record.finish_reason == "length"
    assert record.server_e2e_latency == 0.0812
    assert record.prompt_kind == "code"


def test_native_non_streaming_records_one_entry_at_the_end_and_no_ttft(
    requests_seen: list[httpx.Request],
) -> None:
    with make_client(native_handler, requests_seen) as client:
        record = single_record(client, "generate")

    assert record.chunk_times == (record.t_end,)
    assert record.chunk_tokens == (7,)
    assert record.t_first_token is None
    assert record.ttft is None
    assert record.spec_verify_ct == 3
    assert record.e2e == record.t_end - record.t_start >= 0


def test_a_server_without_speculation_gives_no_spec_fields(
    requests_seen: list[httpx.Request],
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return event_stream(
            sse(native_chunk("a", 1), native_chunk("ab", 2, final=True, spec=False))
        )

    with make_client(handler, requests_seen) as client:
        record = single_record(client, "generate-stream")

    assert (record.spec_verify_ct, record.spec) == (None, {})


# --- OpenAI /v1/completions --------------------------------------------------------------------


def test_openai_stream_with_usage_on_every_chunk_gives_exact_counts(
    requests_seen: list[httpx.Request],
) -> None:
    stream = sse(
        openai_chunk("def", usage=1),
        openai_chunk(" merge(a,", usage=4),
        openai_chunk(" b):", finish="length", usage=6),
        openai_usage_chunk(6),
    )
    with make_client(lambda request: event_stream(stream), requests_seen) as client:
        record = single_record(client, "completions-stream")

    assert record.chunk_tokens == (1, 4, 6)
    assert (record.completion_tokens, record.prompt_tokens, record.cached_tokens) == (6, 57, 16)
    assert record.finish_reason == "length"
    assert record.spec_verify_ct is None


def test_openai_stream_without_per_chunk_usage_is_scaled_to_the_final_usage(
    requests_seen: list[httpx.Request],
) -> None:
    # Five text chunks but ten tokens: chunk counts are spread evenly over the reported total.
    chunks = [openai_chunk(text) for text in ("a", "b", "c", "d")]
    stream = sse(*chunks, openai_chunk("e", finish="length"), openai_usage_chunk(10))
    with make_client(lambda request: event_stream(stream), requests_seen) as client:
        record = single_record(client, "completions-stream")

    assert record.chunk_tokens == (2, 4, 6, 8, 10)
    assert record.completion_tokens == 10
    assert record.t_first_token == record.chunk_times[0]


def test_openai_stream_with_no_usage_at_all_is_an_error(requests_seen: list[httpx.Request]) -> None:
    stream = sse(openai_chunk("a"), openai_chunk("b", finish="length"))
    client = make_client(lambda request: event_stream(stream), requests_seen)
    with client, pytest.raises(RequestError, match=r"no token counts.*include_usage"):
        single_record(client, "completions-stream")


def test_openai_non_streaming_reads_usage_and_sglang_spec_details(
    requests_seen: list[httpx.Request],
) -> None:
    body = {
        **openai_chunk("def merge(a, b):", finish="length"),
        "usage": {"prompt_tokens": 57, "completion_tokens": 7, "total_tokens": 64},
        "sglext": {"spec_tokens_details": {**SPEC_FIELDS, "spec_num_correct_drafts": 4}},
    }
    with make_client(lambda request: httpx.Response(200, json=body), requests_seen) as client:
        record = single_record(client, "completions")

    assert (record.completion_tokens, record.chunk_tokens, record.ttft) == (7, (7,), None)
    assert record.spec_verify_ct == 3
    assert record.spec["spec_num_correct_drafts"] == 4


# --- errors ------------------------------------------------------------------------------------


def run_error(handler: Handler, api: str = "generate-stream", **options: object) -> RequestError:
    with make_client(handler, [], **options) as client, pytest.raises(RequestError) as caught:
        client.run(workload(api), run_index=3)
    return caught.value


def test_an_error_object_inside_a_200_stream_is_an_error_naming_url_and_message() -> None:
    stream = sse(native_chunk("a", 1), {"error": {"message": "KV cache pool exhausted"}})
    error = run_error(lambda request: event_stream(stream))

    assert "workload 'unit', run 4, request 1 of 2 (code prompt)" in str(error)
    assert f"{BASE_URL}/generate: the server reported an error: KV cache pool exhausted" in str(
        error
    )
    assert error.url == f"{BASE_URL}/generate"


def test_an_openai_error_response_inside_a_stream_is_an_error() -> None:
    error_event = {
        "object": "error",
        "message": "max_tokens is too large",
        "type": "BadRequest",
        "code": 400,
    }
    error = run_error(lambda request: event_stream(sse(error_event)), api="completions-stream")

    assert "the server reported an error: max_tokens is too large" in str(error)


def test_http_500_names_status_and_body_excerpt() -> None:
    error = run_error(lambda request: httpx.Response(500, text="Internal Server Error: CUDA error"))

    assert "HTTP 500 Internal Server Error: Internal Server Error: CUDA error" in str(error)
    assert error.status == 500


def test_http_400_with_sglang_error_body_shows_its_message() -> None:
    body = {"error": {"message": "The input (9000 tokens) is longer than the model's context"}}
    error = run_error(lambda request: httpx.Response(400, json=body), api="generate")

    assert "HTTP 400 Bad Request: The input (9000 tokens) is longer" in str(error)


def test_a_malformed_event_names_its_excerpt() -> None:
    stream = b'data: {"text": "a", "meta_info": {"completion_tokens": 1\n\n'
    error = run_error(lambda request: event_stream(stream))

    assert "malformed event in the stream (not JSON" in str(error)
    assert '{"text": "a", "meta_info": {"completion_tokens": 1' in str(error)


def test_an_event_that_is_not_utf8_is_a_malformed_event() -> None:
    error = run_error(lambda request: event_stream(b'data: {"text": "\xff"}\n\n'))
    assert "malformed event in the stream (not JSON, not UTF-8)" in str(error)


async def _payloads(stream: bytes, cuts: tuple[int, ...]) -> list[bytes]:
    async def chunks() -> AsyncIterator[bytes]:
        start = 0
        for cut in (*cuts, len(stream)):
            if cut > start:
                yield stream[start:cut]
            start = cut

    return [payload async for payload in _sse_data(chunks())]


# Every line ending SSE allows, a comment, other fields, a multi-line event, and characters
# that str.splitlines() would split at: U+2028, U+2029 and U+0085 inside a JSON string.
SSE_FORMS = (
    b": keep-alive comment\r\n"
    b'event: message\r\nid: 1\r\ndata: {"text": "a\xe2\x80\xa8b\xe2\x80\xa9c\xc2\x85d"}\r\n\r\n'
    b"data: first line\rdata: second line\r\r"
    b"data:no space\n\n"
    b"data: [DONE]"  # the last event without its blank line: the body simply ends
)
SSE_PAYLOADS = [
    '{"text": "a\u2028b\u2029c\u0085d"}'.encode(),
    b"first line\nsecond line",
    b"no space",
    b"[DONE]",
]


def test_events_are_split_at_sse_line_ends_only_however_the_body_is_chunked() -> None:
    """Each way of cutting the body in two, and one byte at a time (a CRLF split across two
    reads is one line end, not an empty line that would end the event early)."""
    assert asyncio.run(_payloads(SSE_FORMS, ())) == SSE_PAYLOADS
    for cut in range(1, len(SSE_FORMS)):
        assert asyncio.run(_payloads(SSE_FORMS, (cut,))) == SSE_PAYLOADS, f"cut at {cut}"
    assert asyncio.run(_payloads(SSE_FORMS, tuple(range(1, len(SSE_FORMS))))) == SSE_PAYLOADS


def test_text_with_a_unicode_line_separator_is_measured_not_a_malformed_event(
    requests_seen: list[httpx.Request],
) -> None:
    """SGLang's encoder (orjson) writes U+2028 raw; httpx's aiter_lines split the event there."""
    stream = sse(native_chunk("a\u2028b", 1), native_chunk("a\u2028b\u0085c", 2, final=True))
    stream = stream.replace(b"\\u2028", "\u2028".encode()).replace(b"\\u0085", "\u0085".encode())
    assert "\u2028".encode() in stream  # raw, as orjson sends it
    with make_client(lambda request: event_stream(stream), requests_seen) as client:
        run = client.run(workload(requests_per_run=1), run_index=0)
    assert run.records[0].completion_tokens == 2


def test_a_stream_without_final_chunk_ended_early() -> None:
    stream = sse(native_chunk("a", 1), native_chunk("abc", 3), done=False)
    error = run_error(lambda request: event_stream(stream))

    assert "stream ended early: server closed the connection after 3 tokens" in str(error)


def test_a_stream_with_final_chunk_but_no_done_ended_early() -> None:
    stream = sse(native_chunk("a", 1), native_chunk("ab", 2, final=True), done=False)
    error = run_error(lambda request: event_stream(stream))

    assert "after 2 tokens without [DONE]" in str(error)


def test_a_connection_dropped_mid_stream_ended_early() -> None:
    async def broken() -> AsyncIterator[bytes]:
        yield sse(native_chunk("a", 1), native_chunk("abcd", 4), done=False)
        raise httpx.RemoteProtocolError("peer closed connection without sending complete body")

    error = run_error(lambda request: event_stream(broken()))

    assert "stream ended early: server closed the connection after 4 tokens" in str(error)


def test_an_aborted_request_is_an_error() -> None:
    final = native_chunk("a", 1, final=True)
    final["meta_info"]["finish_reason"] = {"type": "abort", "message": "out of memory"}  # type: ignore[index]
    error = run_error(lambda request: event_stream(sse(final)))

    assert "the server aborted the request: 'out of memory'" in str(error)


def test_a_response_that_is_not_an_event_stream_is_an_error() -> None:
    error = run_error(lambda request: httpx.Response(200, json=native_chunk("a", 1, final=True)))

    assert (
        "expected an event stream (text/event-stream), got content-type 'application/json'"
        in str(error)
    )


def test_a_body_of_the_wrong_shape_is_an_error() -> None:
    error = run_error(lambda request: httpx.Response(200, json={"text": "a"}), api="generate")

    assert "expected meta_info of a /generate response to be a JSON object, got null" in str(error)


def test_a_non_json_body_is_an_error() -> None:
    error = run_error(
        lambda request: httpx.Response(200, text="<html>proxy</html>"), api="generate"
    )

    assert "the response is not JSON: <html>proxy</html>" in str(error)


@pytest.mark.parametrize(
    ("exception", "expected"),
    [
        (httpx.ConnectError("[Errno 111] Connection refused"), "cannot connect ([Errno 111]"),
        (httpx.ConnectTimeout("timed out"), "could not connect within connect_timeout=2.5s"),
        # silence past every bound (the stall bound, here capped by the request timeout)
        (httpx.ReadTimeout("timed out"), "no token for 30s after 0 tokens (request_timeout=30s)"),
    ],
)
def test_transport_failures_say_what_failed_and_which_timeout(
    exception: httpx.HTTPError, expected: str
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exception

    error = run_error(handler, connect_timeout=2.5, request_timeout=30.0)

    assert f"{BASE_URL}/generate: " in str(error)
    assert expected in str(error)


def test_a_request_longer_than_request_timeout_is_cut_off() -> None:
    async def hanging(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(30)
        return event_stream(NATIVE_STREAM)

    error = run_error(hanging, request_timeout=0.05)

    assert "no complete response within request_timeout=0.05s" in str(error)


def test_one_failed_request_fails_the_whole_run(requests_seen: list[httpx.Request]) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if len(requests_seen) == 2:
            return httpx.Response(503, text="")
        return native_handler(request)

    with make_client(handler, requests_seen) as client, pytest.raises(RequestError) as caught:
        client.run(workload(requests_per_run=3), run_index=0)

    assert "request 2 of 3 (chat prompt)" in str(caught.value)
    assert "HTTP 503 Service Unavailable: (empty body); the server is not ready" in str(
        caught.value
    )


# --- runs, concurrency, warm-up ----------------------------------------------------------------


@pytest.mark.parametrize(("concurrency", "requests"), [(1, 4), (3, 8), (8, 8)])
def test_at_most_concurrency_requests_are_in_flight(concurrency: int, requests: int) -> None:
    in_flight = 0
    most = 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return event_stream(NATIVE_STREAM)

    shape = workload(concurrency=concurrency, requests_per_run=requests)
    with make_client(handler, []) as client:
        run = client.run(shape, run_index=2)

    assert most == concurrency
    assert len(run.records) == requests
    assert run.run_index == 2
    assert all(run.t_start <= r.t_start and r.t_end <= run.t_end for r in run.records)
    assert [r.prompt_kind for r in run.records] == [p.kind for p in shape.prompts_for_run(2)]


def test_warmup_sends_the_warmup_prompts_only(requests_seen: list[httpx.Request]) -> None:
    with make_client(native_handler, requests_seen) as client:
        client.warmup(workload(warmup_requests=3))
        assert len(requests_seen) == 3
        client.warmup(workload(warmup_requests=0))
        assert len(requests_seen) == 3


def test_a_closed_client_refuses_work() -> None:
    client = make_client(native_handler, [])
    client.close()
    client.close()  # closing twice is harmless

    with pytest.raises(RuntimeError, match="closed"):
        client.run(workload(), run_index=0)


# --- adapters ----------------------------------------------------------------------------------


def test_adapter_for_maps_every_api_and_refuses_others() -> None:
    assert adapter_for("generate") == SglangGenerate(streaming=False)
    assert adapter_for("generate-stream") == SglangGenerate(streaming=True)
    assert adapter_for("completions", model="m") == OpenAICompletions(streaming=False, model="m")
    assert adapter_for("completions-stream").name == "completions-stream"
    with pytest.raises(ConfigError, match="unknown api 'chat'"):
        adapter_for("chat")
