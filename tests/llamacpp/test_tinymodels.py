"""The real llama-server on generated tiny models: plain decoding, EAGLE-3 and draft-model
speculation with 100 %, ~0 % and synthetic acceptance, and the HTTP contract the backend uses."""

from __future__ import annotations

import hashlib
import json
import re
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from . import conftest as llamacpp_conftest
from .conftest import LlamaServer, LlamaServerBinary, LlamaServers, StartLlamaServer
from .tinymodels import FALLBACK_TEXT, TinyModels, generate, train_vocab

#: Plain English from the tokenizer's own training domain.
PROMPT = "This License applies to any program or other work which contains a notice"
N_TOKENS = 128
LOADING_503 = {"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}
SPEC = "llamacpp:spec_decode_"
#: The per-request log line, e.g. "draft acceptance = 1.00000 (    5 accepted /     5 generated),
#: mean len =  3.50".
ACCEPTANCE_LOG = re.compile(
    r"draft acceptance = ([\d.]+) \(\s*(\d+) accepted /\s*(\d+) generated\), "
    r"mean len =\s*([\d.]+)"
)


def complete(server: LlamaServer, max_tokens: int = N_TOKENS, **extra: Any) -> dict[str, Any]:
    """A greedy, non-streaming ``/v1/completions`` without prompt-cache reuse."""
    body = {
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "temperature": 0,
        "cache_prompt": False,
        **extra,
    }
    with server.client() as client:
        response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def scrape(server: LlamaServer) -> tuple[dict[str, float], dict[str, str]]:
    """``/metrics`` as ({sample name with labels: value}, {metric name: TYPE})."""
    with server.client() as client:
        response = client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    samples: dict[str, float] = {}
    types: dict[str, str] = {}
    for line in response.text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            types[name] = kind
        elif line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples, types


def delta(before: dict[str, float], after: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def get_json(server: LlamaServer, path: str) -> Any:
    with server.client() as client:
        response = client.get(path)
    assert response.status_code == 200, response.text
    return response.json()


def sse_payloads(server: LlamaServer, path: str, body: dict[str, Any]) -> list[str]:
    """The ``data:`` payloads of a streamed response, ``[DONE]`` included.

    ``Connection: close``: llama-server drops the connection after a streamed response although
    it answered ``Keep-Alive: timeout=5, max=100``, so a pooled client that reuses it gets
    "Server disconnected without sending a response" on its next request.
    """
    with (
        server.client() as client,
        client.stream("POST", path, json=body, headers={"Connection": "close"}) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        return [line[6:] for line in response.iter_lines() if line.startswith("data: ")]


def acceptance_totals(results: list[dict[str, Any]]) -> tuple[int, int]:
    drafted = sum(r["timings"]["draft_n"] for r in results)
    accepted = sum(r["timings"]["draft_n_accepted"] for r in results)
    return drafted, accepted


def check_metrics_agree(
    before: dict[str, float], after: dict[str, float], drafted: int, accepted: int
) -> float:
    """The Prometheus counters moved by exactly what the responses reported; returns the
    accept length 1 + accepted / verification steps."""
    assert delta(before, after, f"{SPEC}num_draft_tokens_total") == drafted
    assert delta(before, after, f"{SPEC}num_accepted_tokens_total") == accepted
    steps = delta(before, after, f"{SPEC}num_drafts_total")
    assert steps > 0
    per_pos = sum(
        delta(before, after, name)
        for name in after
        if name.startswith(f"{SPEC}num_accepted_tokens_per_pos_total{{")
    )
    assert per_pos == accepted
    return 1 + accepted / steps


# --- generation ---------------------------------------------------------------------------


def _digests(models: TinyModels) -> dict[str, str]:
    return {
        name: hashlib.sha256((models.directory / name).read_bytes()).hexdigest()
        for name in models.files
    }


def test_generation_takes_seconds_and_is_deterministic(
    tiny_models: TinyModels, tmp_path: Path
) -> None:
    assert tiny_models.seconds < 10, tiny_models.seconds
    again = generate(tmp_path / "again", seed=0)
    assert again.seconds < 10, again.seconds
    assert _digests(again) == _digests(tiny_models)
    other = generate(tmp_path / "other", seed=1)
    assert _digests(other)["target.gguf"] != _digests(tiny_models)["target.gguf"]
    manifest = json.loads((tiny_models.directory / "manifest.json").read_text())
    assert manifest["fixed_token_id"] == tiny_models.fixed_token_id
    assert set(manifest["files"]) == {
        "target.gguf",
        "draft.gguf",
        "eagle3.gguf",
        "fixed-target.gguf",
        "fixed-draft.gguf",
        "fixed-eagle3.gguf",
    }


def test_vocab_is_byte_level_bpe() -> None:
    vocab = train_vocab(512)
    assert vocab.size == 512
    assert len(vocab.merges) == 512 - 4 - 256
    assert [vocab.tokens[i] for i in vocab.special_ids] == [
        "<s>",
        "</s>",
        "<|im_start|>",
        "<|im_end|>",
    ]
    # every byte is a token, so any text can be tokenized
    assert len(set(vocab.tokens[4:260])) == 256
    for merge in vocab.merges:
        left, right = merge.split(" ")
        assert left + right in vocab.tokens
    with pytest.raises(ValueError):
        train_vocab(100)
    # without Debian's GPL-3 the bundled text still fills the vocabulary
    assert train_vocab(512, FALLBACK_TEXT).size == 512


# --- plain decoding and the HTTP contract ----------------------------------------------------


@pytest.fixture(scope="module")
def plain(module_llama_servers: LlamaServers, tiny_models: TinyModels) -> LlamaServer:
    return module_llama_servers.start("-m", tiny_models.target, name="plain")


def test_target_alone_generates_greedily(plain: LlamaServer) -> None:
    before, _ = scrape(plain)
    first = complete(plain)
    second = complete(plain)
    after, _ = scrape(plain)
    assert first["object"] == "text_completion"
    assert first["choices"][0]["finish_reason"] == "length"
    assert first["usage"]["completion_tokens"] == N_TOKENS
    assert first["usage"]["total_tokens"] == N_TOKENS + first["usage"]["prompt_tokens"]
    assert first["timings"]["predicted_n"] == N_TOKENS
    assert first["timings"]["predicted_per_second"] > 0
    assert "draft_n" not in first["timings"]  # only present when speculation is configured
    assert second["choices"][0]["text"] == first["choices"][0]["text"]  # greedy: reproducible
    assert delta(before, after, "llamacpp:tokens_predicted_total") == 2 * N_TOKENS
    assert delta(before, after, f"{SPEC}num_draft_tokens_total") == 0
    assert get_json(plain, "/slots")[0]["speculative"] is False


def test_llama_cpp_tokenizes_with_the_generated_vocab(
    plain: LlamaServer, tiny_models: TinyModels
) -> None:
    text = "You may convey verbatim copies of the Program's source code, 2007."
    with plain.client() as client:
        tokens = client.post("/tokenize", json={"content": text}).json()["tokens"]
        back = client.post("/detokenize", json={"tokens": tokens}).json()["content"]
        fixed = client.post("/tokenize", json={"content": tiny_models.fixed_token_text}).json()
    assert back == text
    assert len(tokens) < len(text.encode()) * 0.7  # the merges are applied, not bytes alone
    assert fixed["tokens"] == [tiny_models.fixed_token_id]


def test_health_is_503_loading_then_200(
    start_llama_server: StartLlamaServer, tiny_models: TinyModels
) -> None:
    server = start_llama_server(
        "-m", tiny_models.fixed_target, "--spec-type", "draft-eagle3", "-md",
        tiny_models.fixed_eagle3, name="health", wait=False,
    )  # fmt: skip
    seen: list[tuple[int, Any]] = []
    deadline = time.monotonic() + 60
    with server.client(timeout=5.0) as client:
        while not seen or seen[-1][0] != 200:
            assert server.proc.poll() is None, server.log()
            assert time.monotonic() < deadline, (seen, server.log())
            try:
                response = client.get("/health")
            except httpx.TransportError:  # not bound yet
                time.sleep(0.001)
                continue
            seen.append((response.status_code, response.json()))
    assert all(body == LOADING_503 for status, body in seen[:-1] if status == 503), seen
    assert {status for status, _ in seen[:-1]} <= {503}, seen
    assert seen[-1] == (200, {"status": "ok"})
    marks = [
        f"load_model: loading model '{tiny_models.fixed_target}'",
        f"loading draft model '{tiny_models.fixed_eagle3}'",
        "llama_server: model loaded",
        f"llama_server: listening on {server.base_url}",
    ]
    log = server.log_when(lambda text: all(mark in text for mark in marks))
    positions = [log.find(mark) for mark in marks]
    assert all(p >= 0 for p in positions), (marks, log)
    assert positions == sorted(positions), log


# --- EAGLE-3 -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fixed_eagle3(module_llama_servers: LlamaServers, tiny_models: TinyModels) -> LlamaServer:
    return module_llama_servers.start(
        "-m", tiny_models.fixed_target, "--spec-type", "draft-eagle3",
        "-md", tiny_models.fixed_eagle3, "--spec-draft-n-max", "4", name="fixed-eagle3",
    )  # fmt: skip


def test_fixed_eagle3_pair_accepts_every_draft(
    fixed_eagle3: LlamaServer, tiny_models: TinyModels
) -> None:
    before, _ = scrape(fixed_eagle3)
    result = complete(fixed_eagle3)
    after, types = scrape(fixed_eagle3)  # the per-position series appear after the first draft
    assert result["choices"][0]["text"] == tiny_models.fixed_token_text * N_TOKENS
    timings = result["timings"]
    assert timings["draft_n"] > 0
    assert timings["draft_n_accepted"] == timings["draft_n"]
    accept_length = check_metrics_agree(
        before, after, timings["draft_n"], timings["draft_n_accepted"]
    )
    # 4 drafted + 1 target token per step; only the last step of the request drafts fewer
    assert 4.5 <= accept_length <= 5.0, accept_length
    steps = delta(before, after, f"{SPEC}num_drafts_total")
    assert delta(before, after, f'{SPEC}num_accepted_tokens_per_pos_total{{position="0"}}') == steps
    for name in ("num_draft_tokens_total", "num_accepted_tokens_total", "num_drafts_total"):
        assert types[f"{SPEC}{name}"] == "counter"
    assert types[f"{SPEC}num_accepted_tokens_per_pos_total"] == "counter"
    # the per-request log line says the same
    expected = (str(timings["draft_n_accepted"]), str(timings["draft_n"]))
    log = fixed_eagle3.log_when(
        lambda text: any(found[1:3] == expected for found in ACCEPTANCE_LOG.findall(text))
    )
    match = ACCEPTANCE_LOG.findall(log)
    assert match, log
    rate, accepted, generated, _mean_len = match[-1]
    assert (int(accepted), int(generated)) == (timings["draft_n_accepted"], timings["draft_n"])
    assert float(rate) == 1.0


def test_streaming_puts_usage_and_timings_in_the_last_chunk(fixed_eagle3: LlamaServer) -> None:
    body = {
        "prompt": PROMPT,
        "max_tokens": 32,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    payloads = sse_payloads(fixed_eagle3, "/v1/completions", body)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["usage"]["completion_tokens"] == 32
    assert last["timings"]["draft_n_accepted"] == last["timings"]["draft_n"] > 0
    assert all("usage" not in c and "timings" not in c for c in chunks[:-1])
    assert "".join(c["choices"][0]["text"] for c in chunks)  # text arrives in the chunks

    chat = {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 16,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    payloads = sse_payloads(fixed_eagle3, "/v1/chat/completions", chat)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == []  # chat: a separate, choice-less usage chunk
    assert chunks[-1]["usage"]["completion_tokens"] == 16
    assert chunks[-1]["timings"]["draft_n"] > 0


def test_props_slots_and_models_describe_the_server(
    fixed_eagle3: LlamaServer, tiny_models: TinyModels, llama_server_binary: LlamaServerBinary
) -> None:
    props = get_json(fixed_eagle3, "/props")
    assert props["model_path"] == str(tiny_models.fixed_target)
    assert props["total_slots"] == 1
    assert props["default_generation_settings"]["n_ctx"] == 1024
    assert props["model_ftype"] == "all F32"
    commit = re.search(r"commit ([0-9a-f]+)", llama_server_binary.version)
    assert commit is not None
    assert props["build_info"].endswith(commit.group(1))
    assert props["endpoint_metrics"] is True
    complete(fixed_eagle3, max_tokens=8)
    (slot,) = get_json(fixed_eagle3, "/slots")
    assert slot["n_ctx"] == 1024
    assert slot["speculative"] is True
    assert slot["params"]["speculative.types"] == "none,draft-eagle3"
    (model,) = get_json(fixed_eagle3, "/v1/models")["data"]
    assert model["id"] == str(tiny_models.fixed_target)
    assert model["meta"]["n_vocab"] == tiny_models.vocab_size
    assert model["meta"]["n_embd"] == 256
    assert model["meta"]["n_ctx"] == 1024


def test_random_eagle3_head_is_almost_never_accepted(
    start_llama_server: StartLlamaServer, tiny_models: TinyModels
) -> None:
    server = start_llama_server(
        "-m", tiny_models.target, "--spec-type", "draft-eagle3", "-md", tiny_models.eagle3,
        name="random-eagle3",
    )  # fmt: skip
    before, _ = scrape(server)
    result = complete(server)
    after, _ = scrape(server)
    assert result["usage"]["completion_tokens"] == N_TOKENS
    drafted, accepted = acceptance_totals([result])
    assert drafted > 0
    assert accepted / drafted <= 0.05, (accepted, drafted)
    accept_length = check_metrics_agree(before, after, drafted, accepted)
    assert accept_length < 1.2


# --- draft model -----------------------------------------------------------------------------


@pytest.mark.parametrize("pair", ["random", "fixed"])
def test_draft_simple(
    start_llama_server: StartLlamaServer, tiny_models: TinyModels, pair: str
) -> None:
    target, draft = (
        (tiny_models.target, tiny_models.draft)
        if pair == "random"
        else (tiny_models.fixed_target, tiny_models.fixed_draft)
    )
    server = start_llama_server(
        "-m", target, "--spec-type", "draft-simple", "-md", draft, "--spec-draft-n-max", "3",
        name=f"draft-simple-{pair}",
    )  # fmt: skip
    before, _ = scrape(server)
    result = complete(server)
    after, _ = scrape(server)
    assert result["usage"]["completion_tokens"] == N_TOKENS
    drafted, accepted = acceptance_totals([result])
    assert drafted > 0
    accept_length = check_metrics_agree(before, after, drafted, accepted)
    if pair == "fixed":
        assert accepted == drafted
        assert 3.5 <= accept_length <= 4.0, accept_length
    else:
        assert accepted / drafted <= 0.05, (accepted, drafted)


# --- synthetic acceptance ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "rate", "length"),
    [
        pytest.param(
            ("--spec-type", "draft-eagle3", "--spec-draft-n-max", "4",
             "--spec-synth-rates", "0.9,0.7,0.5,0.3"),
            0.6, 3.4, id="eagle3-synth-rates",
        ),
        pytest.param(
            ("--spec-type", "draft-simple", "--spec-draft-n-max", "3", "--spec-synth-len", "2.5"),
            None, 2.5, id="draft-simple-synth-len",
        ),
    ],
)  # fmt: skip
def test_synthetic_acceptance_is_near_the_configured_rate(
    start_llama_server: StartLlamaServer,
    tiny_models: TinyModels,
    flags: tuple[str, ...],
    rate: float | None,
    length: float,
) -> None:
    draft = tiny_models.fixed_eagle3 if "draft-eagle3" in flags else tiny_models.draft
    server = start_llama_server("-m", tiny_models.fixed_target, "-md", draft, *flags, name="synth")
    enabled = "synthetic speculative acceptance is enabled for benchmarking"
    log = server.log_when(lambda text: enabled in text and "mean length = " in text)
    assert enabled in log
    assert f"mean length = {length:.6f}" in log
    before, _ = scrape(server)
    # per-request seeds make the synthetic coin flips reproducible
    results = [complete(server, seed=seed) for seed in (1, 2, 3, 4)]
    after, _ = scrape(server)
    drafted, accepted = acceptance_totals(results)
    assert 0 < accepted < drafted
    accept_length = check_metrics_agree(before, after, drafted, accepted)
    assert abs(accept_length - length) <= 0.5, (accept_length, length)
    if rate is not None:
        assert abs(accepted / drafted - rate) <= 0.15, (accepted, drafted)
    again = complete(server, seed=1)
    assert acceptance_totals([again]) == acceptance_totals(results[:1])


def test_a_draft_that_is_not_eagle3_leaves_the_server_up_without_speculation(
    start_llama_server: StartLlamaServer, tiny_models: TinyModels
) -> None:
    """A trap for an adapter: llama-server logs an error and serves plain decoding."""
    server = start_llama_server(
        "-m", tiny_models.target, "--spec-type", "draft-eagle3", "-md", tiny_models.draft,
        name="not-eagle3",
    )  # fmt: skip
    refused = "failed to initialize speculative decoding context: draft model is not eagle3"
    assert refused in server.log_when(lambda text: refused in text)
    assert get_json(server, "/slots")[0]["speculative"] is False
    result = complete(server, max_tokens=16)
    assert "draft_n" not in result["timings"]
    # the requested type is still echoed per slot: only "speculative" tells the truth
    assert get_json(server, "/slots")[0]["params"]["speculative.types"] == "none,draft-eagle3"


def test_a_port_taken_before_the_server_binds_it_is_retried(
    llama_server_binary: LlamaServerBinary,
    tiny_models: TinyModels,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = iter([taken.getsockname()[1]])
        real_free_port = llamacpp_conftest.free_port
        monkeypatch.setattr(
            llamacpp_conftest, "free_port", lambda: next(ports, None) or real_free_port()
        )
        servers = LlamaServers(llama_server_binary, tmp_path)
        try:
            server = servers.start("-m", tiny_models.target, name="retry")
            assert server.port != taken.getsockname()[1]
            assert get_json(server, "/health") == {"status": "ok"}
            first_log = sorted(tmp_path.glob("retry-*.log"))
            assert any("couldn't bind HTTP server socket" in p.read_text() for p in first_log)
        finally:
            servers.stop_all()
