"""The OpenAI-compatible routes: shapes, usage, streaming deltas and errors as SGLang sends them."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from .conftest import EAGLE3_2STEP, SimProcess, StartSim, sse_events, stream_json


@pytest.fixture(scope="module")
def sim(start_module_sim: StartSim) -> SimProcess:
    return start_module_sim("--served-model-name", "kimi", "--enable-cache-report")


@pytest.fixture
def client(sim: SimProcess) -> Iterator[httpx.Client]:
    with sim.client() as c:
        yield c


COMPLETION = {"model": "kimi", "prompt": "Say something.", "max_tokens": 24, "temperature": 0,
              "ignore_eos": True}  # fmt: skip
CHAT = {"model": "kimi", "messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 24,
        "temperature": 0, "ignore_eos": True}  # fmt: skip


def test_completion_shape_and_usage(client: httpx.Client) -> None:
    body = client.post("/v1/completions", json=COMPLETION).json()
    assert body["object"] == "text_completion"
    assert body["model"] == "kimi"
    choice = body["choices"][0]
    assert choice["index"] == 0
    assert choice["finish_reason"] == "length"
    assert choice["text"].strip()
    usage = body["usage"]
    assert usage["completion_tokens"] == 24
    assert usage["total_tokens"] == usage["prompt_tokens"] + 24
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}  # --enable-cache-report


def test_chat_shape(client: httpx.Client) -> None:
    body = client.post("/v1/chat/completions", json=CHAT).json()
    assert body["object"] == "chat.completion"
    message = body["choices"][0]["message"]
    assert message["role"] == "assistant"
    assert message["content"].strip()
    assert body["usage"]["completion_tokens"] == 24


@pytest.mark.parametrize(
    ("route", "payload"), [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)]
)
def test_streaming_deltas_add_up_and_usage_chunk_comes_last(
    client: httpx.Client, route: str, payload: dict[str, object]
) -> None:
    whole = client.post(route, json=payload).json()
    stream_payload = {**payload, "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", route, json=stream_payload) as response:
        assert response.status_code == 200
        chunks = stream_json(response)
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == 24
    content = chunks[:-1]
    if route.endswith("chat/completions"):
        assert content[0]["choices"][0]["delta"]["role"] == "assistant"
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in content)
        expected = whole["choices"][0]["message"]["content"]
        assert content[-1]["choices"][0]["finish_reason"] == "length"
    else:
        text = "".join(c["choices"][0]["text"] for c in content)
        expected = whole["choices"][0]["text"]
        assert content[-1]["choices"][0]["finish_reason"] == "length"
    assert text == expected  # greedy: the same prompt gives the same text
    assert all(c["choices"][0]["finish_reason"] is None for c in content[:-1])


def test_stream_without_include_usage_has_no_usage_chunk(client: httpx.Client) -> None:
    with client.stream("POST", "/v1/completions", json={**COMPLETION, "stream": True}) as response:
        chunks = stream_json(response)
    assert all(chunk["choices"] for chunk in chunks)


def test_openai_errors_are_error_objects(client: httpx.Client) -> None:
    bad_max = client.post("/v1/completions", json={**COMPLETION, "max_tokens": 0})
    assert bad_max.status_code == 400
    assert bad_max.json()["object"] == "error"
    assert bad_max.json()["code"] == 400
    bad_temp = client.post("/v1/chat/completions", json={**CHAT, "temperature": -1})
    assert bad_temp.status_code == 400
    assert bad_temp.json()["type"] == "BadRequestError"
    assert "temperature" in bad_temp.json()["message"]
    wrong_type = client.post(
        "/v1/completions", content=json.dumps(COMPLETION), headers={"content-type": "text/plain"}
    )
    assert wrong_type.status_code == 400
    assert "application/json" in wrong_type.json()["message"]


def test_error_inside_an_openai_stream(client: httpx.Client) -> None:
    payload = {**COMPLETION, "stream": True, "temperature": -1}
    with client.stream("POST", "/v1/completions", json=payload) as response:
        assert response.status_code == 200
        events = list(sse_events(response.iter_lines()))
    assert events[-1] == "[DONE]"
    error = json.loads(events[0])["error"]
    assert error["object"] == "error"
    assert "temperature" in error["message"]


@pytest.mark.parametrize(("version", "details"), [("0.5.18", False), ("0.5.19", True)])
def test_spec_tokens_details_come_with_0_5_19_as_sglext(
    start_sim: StartSim, version: str, details: bool
) -> None:
    sim = start_sim(*EAGLE3_2STEP, "--sim-sglang-version", version)
    ask = {**COMPLETION, "return_spec_tokens_details": True}
    with sim.client() as client:
        body = client.post("/v1/completions", json=ask).json()
        streamed = {**ask, "stream": True, "stream_options": {"include_usage": True}}
        with client.stream("POST", "/v1/completions", json=streamed) as response:
            events = stream_json(response)
        chat = client.post(
            "/v1/chat/completions", json={**CHAT, "return_spec_tokens_details": True}
        )
    if not details:
        assert "sglext" not in body
        assert not any("sglext" in event for event in events)
        assert "sglext" not in chat.json()
        return
    spec = body["sglext"]["spec_tokens_details"]
    assert spec["spec_verify_ct"] > 0
    assert spec["spec_accept_length"] == pytest.approx(24 / spec["spec_verify_ct"])
    assert sum(spec["spec_correct_drafts_histogram"]) == spec["spec_verify_ct"]
    # Streaming: its own chunk, with no choices, before the usage chunk.
    extension = [event for event in events if "sglext" in event]
    assert len(extension) == 1
    assert extension[0]["choices"] == []
    assert events.index(extension[0]) == len(events) - 2
    assert "spec_verify_ct" in chat.json()["sglext"]["spec_tokens_details"]
