"""SGLang's own client code against the simulated server (DESIGN.md section 5).

Each test runs real SGLang 0.5.6 client code (``sglang.bench_serving``, the frontend language's
``RuntimeEndpoint``) or the official ``openai`` SDK at the version SGLang pins, in the venv that
``scripts/provision-sglang-client.sh`` makes, as a subprocess, against the sim started as a real
subprocess. Without that venv these tests skip, or fail under
``SPECDECODE_REQUIRE_SGLANG_CLIENT=1`` (CI). Nothing is downloaded: the tokenizer and the
ShareGPT-format dataset are made in the session (``sglang_client`` in conftest.py).

The sim emits one word per output token, so a client's text tells how many tokens it received.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from .conftest import CORPUS, EAGLE3_2STEP, NCCL_TUNED, SglangClient, SimProcess, StartSim

#: The seed's EAGLE3 2-step + NCCL figure at speed 1 (DESIGN.md section 1; model.toml fits it).
SEED_EAGLE3_2STEP_TOK_S = 94.0
SPEED = 10.0
NUM_PROMPTS = 6


def run_bench(
    client: SglangClient, sim: SimProcess, out_dir: Path, backend: str, *extra: str
) -> tuple[dict[str, Any], str]:
    """``python -m sglang.bench_serving`` against ``sim``: its JSON result and its stdout."""
    output_file = out_dir / f"bench-{backend}.jsonl"
    done = client.run(
        "-m", "sglang.bench_serving", "--backend", backend, "--base-url", sim.base_url,
        "--tokenizer", client.tokenizer, "--dataset-name", "sharegpt",
        "--dataset-path", client.sharegpt, "--num-prompts", str(NUM_PROMPTS), "--seed", "1",
        "--output-file", output_file, "--output-details", "--disable-tqdm", *extra,
    )  # fmt: skip
    lines = output_file.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 1, f"{output_file} holds {len(lines)} results:\n{done.stdout}"
    result: dict[str, Any] = json.loads(lines[0])
    return result, done.stdout


def server_accept_length(sim: SimProcess) -> float:
    with sim.client() as http:
        state = http.get("/server_info").json()["internal_states"][0]
    assert "avg_spec_accept_length" in state, f"no avg_spec_accept_length in {state}"
    value: float = state["avg_spec_accept_length"]
    return value


def per_request_accept_length(sim: SimProcess, max_new_tokens: int) -> float:
    """The plugin's own measure: Σ completion_tokens / Σ spec_verify_ct of fresh requests."""
    sampling = {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}
    completion = verify = 0
    for prompt in CORPUS[:4]:
        meta = sim.generate({"text": prompt, "sampling_params": sampling}).json()["meta_info"]
        completion += meta["completion_tokens"]
        verify += meta["spec_verify_ct"]
    return completion / verify


def assert_all_succeeded(result: dict[str, Any], stdout: str, output_len: int) -> None:
    assert result["completed"] == NUM_PROMPTS, stdout
    assert result["errors"] == [""] * NUM_PROMPTS, result["errors"]
    # The sim's text has one word per token: the client received every token, in order.
    words = [len(text.split()) for text in result["generated_texts"]]
    assert words == [output_len] * NUM_PROMPTS, result["generated_texts"]


@pytest.fixture
def eagle3_sim(start_sim: StartSim) -> SimProcess:
    return start_sim(*EAGLE3_2STEP, env=NCCL_TUNED, speed=SPEED)


def test_bench_serving_sglang_backend_measures_the_sims_speed_and_accept_length(
    sglang_client: SglangClient, eagle3_sim: SimProcess, tmp_path: Path
) -> None:
    output_len = 256
    # One request at a time, as the seed measured; --flush-cache after bench_serving's warm-up
    # resets the sim's cumulative accept length, so it covers the measured requests only.
    result, stdout = run_bench(
        sglang_client, eagle3_sim, tmp_path, "sglang",
        "--sharegpt-output-len", str(output_len), "--max-concurrency", "1", "--flush-cache",
    )  # fmt: skip
    assert_all_succeeded(result, stdout, output_len)
    # output_lens come from meta_info.completion_tokens of the last streamed chunk.
    assert result["output_lens"] == [output_len] * NUM_PROMPTS
    assert result["total_output_tokens"] == output_len * NUM_PROMPTS

    # Streamed as generated: the first text of every request arrives long before the request
    # ends (unstreamed, it would arrive with the end). Half the time, not a fifth: on a loaded
    # 2-core machine one request of six waited 60 ms for its first text, of a 285 ms request.
    e2e_seconds = result["median_e2e_latency_ms"] / 1000
    assert max(result["ttfts"]) < 0.5 * e2e_seconds, (result["ttfts"], e2e_seconds)

    # Throughput at the sim's speed lands near the seed's figure; client overhead costs a
    # little, a loaded 2-core machine a little more, nothing makes it faster.
    per_speed = result["output_throughput"] / SPEED
    assert 0.75 * SEED_EAGLE3_2STEP_TOK_S < per_speed < 1.10 * SEED_EAGLE3_2STEP_TOK_S, (
        f"bench_serving measured {result['output_throughput']:.1f} tok/s at --sim-speed {SPEED} "
        f"= {per_speed:.1f} tok/s at speed 1; the seed's EAGLE3 2-step + NCCL is "
        f"{SEED_EAGLE3_2STEP_TOK_S}\n{stdout}"
    )

    # "Accept length" comes from /get_server_info internal_states[0].avg_spec_accept_length.
    accept = result["accept_length"]
    assert isinstance(accept, float), f"bench_serving found no accept length:\n{stdout}"
    printed = re.search(r"^Accept length:\s+(\S+)\s*$", stdout, re.MULTILINE)
    assert printed is not None, f"no 'Accept length:' line in bench_serving's output:\n{stdout}"
    assert printed.group(1) == f"{accept:.2f}"
    assert accept == pytest.approx(server_accept_length(eagle3_sim), rel=1e-9)
    truth = per_request_accept_length(eagle3_sim, output_len)
    assert 1.0 < truth < 3.0  # 2 draft steps: at most 3 tokens per verify
    assert accept == pytest.approx(truth, abs=0.15), (accept, truth)


@pytest.mark.parametrize("backend", ["sglang-oai", "sglang-oai-chat"])
def test_bench_serving_openai_backends_stream_every_token(
    sglang_client: SglangClient, eagle3_sim: SimProcess, tmp_path: Path, backend: str
) -> None:
    output_len = 64
    result, stdout = run_bench(
        sglang_client, eagle3_sim, tmp_path, backend, "--sharegpt-output-len", str(output_len)
    )
    assert_all_succeeded(result, stdout, output_len)
    # One inter-chunk gap per streamed chunk after the first: many chunks, not one blob (at
    # most 3 tokens per verify step; a slow client may see a few steps coalesced).
    chunks = [len(itl) + 1 for itl in result["itls"]]
    assert min(chunks) >= 8, chunks
    accept = result["accept_length"]
    assert isinstance(accept, float), f"bench_serving found no accept length:\n{stdout}"
    assert accept == pytest.approx(server_accept_length(eagle3_sim), rel=1e-9)
    assert 1.0 < accept < 3.0


RUNTIME_ENDPOINT_SCRIPT = """
import json, sys
import sglang as sgl
from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint

base_url, api_key = sys.argv[1], sys.argv[2] or None
backend = RuntimeEndpoint(base_url, api_key=api_key)  # GET /get_model_info
sgl.set_default_backend(backend)


@sgl.function
def qa(s, question):
    s += "Q: " + question + "\\nA:"
    s += sgl.gen("answer", max_tokens=24, temperature=0, ignore_eos=True)


@sgl.function
def pick(s):
    s += "Is Paris the capital city of France? Answer:"
    s += sgl.select("choice", choices=[" yes", " no", " not sure"])  # scores by logprobs


state = qa.run(question="What is the capital city of France?")
picked = pick.run()
streamed = qa.run(question="Why does NCCL tuning matter?", stream=True)
chunks = list(streamed.text_iter("answer"))
batch = qa.run_batch([{"question": "one"}, {"question": "two"}])
backend.flush_cache()  # POST /flush_cache
print(json.dumps({
    "model": backend.get_model_name(),
    "answer": state["answer"],
    "text": state.text(),
    "meta": state.get_meta_info("answer"),
    "chunks": chunks,
    "streamed": streamed["answer"],
    "batch": [s["answer"] for s in batch],
    "choice": picked["choice"],
    "choice_meta": picked.get_meta_info("choice"),
    "server_info": backend.get_server_info(),  # GET /get_server_info
}))
"""


def run_runtime_endpoint(
    client: SglangClient, sim: SimProcess, tmp_path: Path, api_key: str = ""
) -> dict[str, Any]:
    script = tmp_path / "runtime_endpoint_program.py"
    script.write_text(RUNTIME_ENDPOINT_SCRIPT, encoding="utf-8")
    done = client.run(script, sim.base_url, api_key, timeout=120)
    output: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return output


def test_runtime_endpoint_runs_an_sgl_program(
    sglang_client: SglangClient, eagle3_sim: SimProcess, tmp_path: Path
) -> None:
    out = run_runtime_endpoint(sglang_client, eagle3_sim, tmp_path)
    assert out["model"] == "/shared/kimi-k2.5-int4"
    assert len(out["answer"].split()) == 24, out["answer"]
    assert out["text"].startswith("Q: What is the capital city of France?\nA:")
    assert out["text"].endswith(out["answer"])
    meta = out["meta"]
    assert meta["finish_reason"] == {"type": "length", "length": 24}
    assert meta["completion_tokens"] == 24
    assert 1.0 < meta["completion_tokens"] / meta["spec_verify_ct"] <= 3.0
    # Streaming (POST /generate with stream) arrives in pieces that add up to the answer.
    assert len(out["chunks"]) > 1, out["chunks"]
    assert "".join(out["chunks"]) == out["streamed"]
    assert len(out["streamed"].split()) == 24
    assert [len(answer.split()) for answer in out["batch"]] == [24, 24]
    # sgl.select scores each choice by its prompt logprobs (return_logprob on /generate).
    normalized = out["choice_meta"]["normalized_prompt_logprobs"]
    assert len(normalized) == 3
    assert all(isinstance(x, float) and x < 0 for x in normalized), normalized
    choices = [" yes", " no", " not sure"]
    assert out["choice"] == choices[normalized.index(max(normalized))]
    # The flush reset the server-wide accept length: the key is absent, as upstream.
    assert out["server_info"]["simulated"] is True
    assert "avg_spec_accept_length" not in out["server_info"]["internal_states"][0]


def test_runtime_endpoint_sends_the_api_key(
    sglang_client: SglangClient, start_sim: StartSim, tmp_path: Path
) -> None:
    sim = start_sim("--api-key", "sk-sim-test")
    out = run_runtime_endpoint(sglang_client, sim, tmp_path, api_key="sk-sim-test")
    assert len(out["answer"].split()) == 24
    with pytest.raises(AssertionError, match="Unauthorized"):
        run_runtime_endpoint(sglang_client, sim, tmp_path, api_key="sk-wrong")


OPENAI_SDK_SCRIPT = """
import json, sys
import openai

client = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="sk-unused", max_retries=0)
model = client.models.list().data[0].id
result = {"model": model, "retrieved": client.models.retrieve(model).id}

stream = client.completions.create(
    model=model, prompt="The capital city of France is", max_tokens=20, temperature=0,
    stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
)
chunks = [chunk.model_dump() for chunk in stream]
result["completion_chunks"] = chunks

chat = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Say hello to the simulator."}],
    max_tokens=12, temperature=0, extra_body={"ignore_eos": True},
)
result["chat"] = chat.model_dump()

chat_stream = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Say hello to the simulator."}],
    max_tokens=12, temperature=0, stream=True, stream_options={"include_usage": True},
    extra_body={"ignore_eos": True},
)
result["chat_chunks"] = [chunk.model_dump() for chunk in chat_stream]
print(json.dumps(result))
"""


def test_openai_sdk_parses_completions_and_chat_with_usage(
    sglang_client: SglangClient, eagle3_sim: SimProcess, tmp_path: Path
) -> None:
    script = tmp_path / "openai_sdk.py"
    script.write_text(OPENAI_SDK_SCRIPT, encoding="utf-8")
    done = sglang_client.run(script, eagle3_sim.base_url, timeout=120)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["model"] == out["retrieved"] == "/shared/kimi-k2.5-int4"

    # Completions, streamed: text deltas, "length" on the last one, then one usage-only chunk.
    chunks = out["completion_chunks"]
    *deltas, usage_chunk = chunks
    assert len(deltas) > 1, chunks
    text = "".join(c["choices"][0]["text"] for c in deltas)
    assert len(text.split()) == 20, text
    assert [c["choices"][0]["finish_reason"] for c in deltas][-1] == "length"
    assert all(c["usage"] is None for c in deltas)
    assert usage_chunk["choices"] == []
    usage = usage_chunk["usage"]
    assert usage["completion_tokens"] == 20
    assert usage["prompt_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + 20

    # Chat, not streamed.
    chat = out["chat"]
    message = chat["choices"][0]["message"]
    assert message["role"] == "assistant"
    assert len(message["content"].split()) == 12
    assert chat["choices"][0]["finish_reason"] == "length"
    assert chat["usage"]["completion_tokens"] == 12
    assert chat["usage"]["total_tokens"] == chat["usage"]["prompt_tokens"] + 12

    # Chat, streamed: the role first, content deltas, a finish, then usage.
    *chat_deltas, chat_usage = out["chat_chunks"]
    assert chat_deltas[0]["choices"][0]["delta"]["role"] == "assistant"
    content = "".join(c["choices"][0]["delta"]["content"] or "" for c in chat_deltas)
    assert content == message["content"]  # greedy: the same prompt gives the same text
    assert chat_deltas[-1]["choices"][0]["finish_reason"] == "length"
    assert chat_usage["choices"] == []
    assert chat_usage["usage"]["completion_tokens"] == 12
