"""Answering like SGLang: native routes, shapes, status codes, streaming, metrics, API key."""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from .conftest import EAGLE3_2STEP, NCCL_TUNED, SimProcess, StartSim, sse_events, stream_json

GREEDY_500 = {"max_new_tokens": 500, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def spec_sim(start_module_sim: StartSim) -> SimProcess:
    return start_module_sim(
        *EAGLE3_2STEP, "--enable-metrics", "--decode-log-interval", "5", "--sim-seed", "11",
        env=NCCL_TUNED,
    )  # fmt: skip


@pytest.fixture(scope="module")
def plain_sim(start_module_sim: StartSim) -> SimProcess:
    return start_module_sim("--served-model-name", "kimi", "--sim-seed", "5")


@pytest.fixture
def client(spec_sim: SimProcess) -> Iterator[httpx.Client]:
    with spec_sim.client() as c:
        yield c


def test_model_info_routes(client: httpx.Client, spec_sim: SimProcess) -> None:
    info = client.get("/model_info").json()
    assert info["model_path"] == "/shared/kimi-k2.5-int4"
    assert info["is_generation"] is True
    assert {"tokenizer_path", "weight_version", "architectures", "model_type"} <= set(info)
    assert client.get("/get_model_info").json() == info
    client.get("/get_model_info")
    assert spec_sim.log().count("Endpoint '/get_model_info' is deprecated") == 1


def test_server_info_echoes_resolved_args_and_sim_keys(client: httpx.Client) -> None:
    info = client.get("/server_info").json()
    assert info["speculative_algorithm"] == "EAGLE3"
    assert info["speculative_num_steps"] == 2
    assert info["speculative_eagle_topk"] == 1
    assert info["speculative_num_draft_tokens"] == 3
    assert info["max_running_requests"] == 48
    assert info["tp_size"] == 8
    assert info["mem_fraction_static"] == 0.88
    assert info["num_continuous_decode_steps"] == 4
    assert info["disable_custom_all_reduce"] is True
    assert info["enable_metrics"] is True
    assert info["api_key"] is None
    assert info["max_total_num_tokens"] > info["max_req_input_len"] > 0
    assert "simulated" in info["version"]
    assert info["simulated"] is True
    assert info["sim_seed"] == 11
    assert info["sim_nccl_tuning"] == 1.0
    assert {"sim_speed", "sim_slowdown", "sim_accept_scale", "sim_noise_cv", "sim_fault"} <= set(
        info
    )
    assert isinstance(info["internal_states"], list)
    assert len(info["internal_states"]) == 1
    assert "last_gen_throughput" in info["internal_states"][0]
    assert client.get("/get_server_info").json()["sim_seed"] == 11


def test_generate_meta_info_and_accept_length(client: httpx.Client) -> None:
    body = client.post(
        "/generate", json={"text": "Tell me a story.", "sampling_params": GREEDY_500}
    )
    assert body.status_code == 200
    result = body.json()
    meta = result["meta_info"]
    assert meta["completion_tokens"] == 500 == len(result["output_ids"])
    assert meta["finish_reason"] == {"type": "length", "length": 500}
    assert meta["prompt_tokens"] > 0
    assert meta["cached_tokens"] == 0
    assert meta["e2e_latency"] > 0
    verify_ct = meta["spec_verify_ct"]
    assert meta["spec_accept_length"] == pytest.approx(500 / verify_ct)
    assert 1.6 < 500 / verify_ct < 2.15  # model expectation 1.87 for EAGLE3 2-step, greedy
    histogram = meta["spec_correct_drafts_histogram"]  # SGLang 0.5.23's names (the default)
    assert sum(histogram) == verify_ct
    assert len(histogram) == 3  # 0..num_steps drafts accepted
    accepted = sum(i * n for i, n in enumerate(histogram))
    assert meta["spec_num_correct_drafts"] == accepted
    assert meta["spec_num_proposed_drafts"] == verify_ct * 2
    assert not {"spec_accept_token_num", "spec_accepted_drafts", "spec_accept_histogram"} & set(
        meta
    )
    assert meta["spec_accept_rate"] == pytest.approx(accepted / (verify_ct * 2))
    assert result["text"].strip()


def test_batch_of_texts_and_input_ids(client: httpx.Client) -> None:
    batch = client.post(
        "/generate",
        json={"text": ["one", "two", "three"], "sampling_params": {"max_new_tokens": 5}},
    ).json()
    assert isinstance(batch, list)
    assert [item["meta_info"]["completion_tokens"] <= 5 for item in batch] == [True] * 3
    assert len({item["meta_info"]["id"] for item in batch}) == 3
    ids = client.post(
        "/generate",
        json={
            "input_ids": [5, 6, 7, 8],
            "sampling_params": {"max_new_tokens": 4, "ignore_eos": True},
        },
    ).json()
    assert ids["meta_info"]["prompt_tokens"] == 4
    assert ids["meta_info"]["completion_tokens"] == 4


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        ({"text": "a", "input_ids": [1, 2]}, "Either text, input_ids"),
        ({"sampling_params": {"max_new_tokens": 4}}, "Either text, input_ids"),
        ({"text": "a", "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
        ({"text": "a", "sampling_params": {"temperature": -0.5}}, "temperature"),
    ],
)
def test_bad_input_is_a_native_400(
    client: httpx.Client, payload: dict[str, Any], fragment: str
) -> None:
    response = client.post("/generate", json=payload)
    assert response.status_code == 400
    assert fragment in response.json()["error"]["message"]


def test_bad_input_in_a_stream_is_an_error_event_inside_a_200(client: httpx.Client) -> None:
    payload = {"text": "a", "stream": True, "sampling_params": {"temperature": -1}}
    with client.stream("POST", "/generate", json=payload) as response:
        assert response.status_code == 200
        events = list(sse_events(response.iter_lines()))
    assert events[-1] == "[DONE]"
    assert "temperature" in json.loads(events[0])["error"]["message"]


def test_non_json_body_is_a_400(client: httpx.Client) -> None:
    response = client.post("/generate", content=b"{not json")
    assert response.status_code == 400


def test_streaming_is_cumulative_with_final_fields_last(client: httpx.Client) -> None:
    payload = {"text": "Stream this.", "stream": True, "sampling_params": GREEDY_500}
    with client.stream("POST", "/generate", json=payload) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = list(response.iter_lines())
    data = list(sse_events(iter(lines)))
    assert data[-1] == "[DONE]"
    chunks = [json.loads(p) for p in data[:-1]]
    counts = [c["meta_info"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts)
    assert counts[-1] == 500
    for previous, current in itertools.pairwise(chunks):
        assert current["text"].startswith(previous["text"])  # cumulative text
        assert current["output_ids"][: len(previous["output_ids"])] == previous["output_ids"]
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert all("e2e_latency" not in c["meta_info"] for c in chunks[:-1])
    assert all("spec_verify_ct" not in c["meta_info"] for c in chunks[:-1])
    final = chunks[-1]["meta_info"]
    assert final["finish_reason"]["type"] == "length"
    assert {"e2e_latency", "spec_verify_ct", "spec_correct_drafts_histogram"} <= set(final)
    # Under speculation one verify adds several tokens, so some chunk carries more than one.
    assert max(b - a for a, b in itertools.pairwise(counts)) > 1


def test_greedy_output_depends_on_the_prompt_only(client: httpx.Client) -> None:
    def text(prompt: str) -> str:
        payload = {"text": prompt, "sampling_params": {"max_new_tokens": 20, "temperature": 0}}
        result: str = client.post("/generate", json=payload).json()["text"]
        return result

    assert text("same prompt") == text("same prompt")
    assert text("same prompt") != text("another prompt")


def test_without_ignore_eos_requests_stop_naturally(client: httpx.Client) -> None:
    payload = {"text": [f"q{i}" for i in range(6)], "sampling_params": {"max_new_tokens": 4000}}
    results = client.post("/generate", json=payload).json()
    stopped = [r for r in results if r["meta_info"]["finish_reason"]["type"] == "stop"]
    # Natural lengths are lognormal with median 180: all six stop long before 4000 tokens.
    assert len(stopped) == 6
    assert all(r["meta_info"]["completion_tokens"] < 4000 for r in stopped)


def test_prefix_cache_and_flush_cache(client: httpx.Client) -> None:
    payload = {
        "text": "a cached prompt with several words",
        "sampling_params": {"max_new_tokens": 2},
    }
    client.post("/generate", json=payload)
    second = client.post("/generate", json=payload).json()["meta_info"]
    assert second["cached_tokens"] == second["prompt_tokens"] - 1
    flushed = client.post("/flush_cache")
    assert flushed.status_code == 200
    assert flushed.text.startswith("Cache flushed.")
    assert client.post("/generate", json=payload).json()["meta_info"]["cached_tokens"] == 0


@pytest.mark.quiet_machine  # the request must still run when the flush arrives
def test_flush_cache_refused_while_a_request_runs(
    spec_sim: SimProcess, client: httpx.Client
) -> None:
    payload = {"text": "long", "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
    worker = threading.Thread(target=spec_sim.generate, args=(payload,))
    worker.start()
    try:
        time.sleep(0.3)  # the request runs for ~1.7 s at speed 20
        assert client.get("/flush_cache").status_code == 400
    finally:
        worker.join()
    assert client.get("/flush_cache").status_code == 200


def test_avg_spec_accept_length_is_cumulative_and_reset_by_flush(client: httpx.Client) -> None:
    assert client.get("/flush_cache").status_code == 200
    state = client.get("/server_info").json()["internal_states"][0]
    assert "avg_spec_accept_length" not in state
    client.post("/generate", json={"text": "x", "sampling_params": GREEDY_500})
    state = client.get("/server_info").json()["internal_states"][0]
    assert 1.0 <= state["avg_spec_accept_length"] <= 3.0
    assert state["last_gen_throughput"] > 0


def test_metrics_exposition(client: httpx.Client) -> None:
    before = _metric(client.get("/metrics").text, "sglang:generation_tokens_total")
    client.post(
        "/generate",
        json={"text": "m", "sampling_params": {"max_new_tokens": 50, "ignore_eos": True}},
    )
    text = client.get("/metrics").text
    assert _metric(text, "sglang:generation_tokens_total") == before + 50
    for name in (
        "sglang:prompt_tokens_total",
        "sglang:num_requests_total",
        "sglang:spec_accept_length",
        "sglang:gen_throughput",
        "sglang:num_running_reqs",
        "sglang:time_to_first_token_seconds_bucket",
        "sglang:inter_token_latency_seconds_bucket",
    ):
        assert re.search(
            rf'^{re.escape(name)}\{{.*model_name="/shared/kimi-k2.5-int4"', text, re.M
        ), name


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} ([\d.e+]+)$", text, re.M)
    assert match, name
    return float(match.group(1))


def test_plain_server_has_no_spec_fields_and_no_metrics(plain_sim: SimProcess) -> None:
    with plain_sim.client() as client:
        meta = client.post(
            "/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 8}}
        )
        assert not any(key.startswith("spec_") for key in meta.json()["meta_info"])
        assert client.get("/metrics").status_code == 404
        models = client.get("/v1/models").json()
        assert models["object"] == "list"
        assert models["data"][0]["id"] == "kimi"
        assert models["data"][0]["owned_by"] == "sglang"
        missing = client.get("/v1/models/other")
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "model_not_found"
        assert client.get("/v1/models/kimi").json()["id"] == "kimi"
        assert client.get("/no/such/route").status_code == 404


def test_api_key_is_enforced_except_on_health_and_metrics(start_sim: StartSim) -> None:
    sim = start_sim("--api-key", "s3cret", "--enable-metrics")
    with sim.client() as client:
        denied = client.post("/generate", json={"text": "x"})
        assert denied.status_code == 401
        assert denied.json() == {"error": "Unauthorized"}
        assert client.get("/server_info").status_code == 401
        assert client.get("/health").status_code == 200
        assert client.get("/metrics").status_code == 200
        auth = {"Authorization": "Bearer s3cret"}
        info = client.get("/server_info", headers=auth).json()
        assert info["api_key"] == "<redacted>"
        assert "s3cret" not in json.dumps(info)
        payload = {"text": "x", "sampling_params": {"max_new_tokens": 3}}
        assert client.post("/generate", json=payload, headers=auth).status_code == 200
    assert "s3cret" not in sim.log()


def test_stream_chunks_parse_with_stream_json(spec_sim: SimProcess) -> None:
    payload = {
        "text": "x",
        "stream": True,
        "sampling_params": {"max_new_tokens": 9, "ignore_eos": True},
    }
    with spec_sim.client() as client, client.stream("POST", "/generate", json=payload) as response:
        chunks = stream_json(response)
    assert chunks[-1]["meta_info"]["completion_tokens"] == 9
