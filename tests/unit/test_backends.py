"""The backends against httpx.MockTransport servers: SGLang's housekeeping routes, and a fake
llama-server that answers with the JSON, SSE and Prometheus text captured from the real one
(tests/llamacpp/tinymodels.py) and keeps its speculative counters the way it does."""

from __future__ import annotations

import dataclasses
import json
import socket
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from pytest_specdecode.adapters import LlamaCppCompletions, SglangGenerate, prompt_seed
from pytest_specdecode.backends import (
    LLAMACPP_PHASES,
    SGLANG_PHASES,
    SGLANG_PORT_RANGE,
    LlamaCppBackend,
    SglangBackend,
    SpecCounters,
    backend_for,
    llamacpp_run_extras,
    printed_error,
)
from pytest_specdecode.client import MeasurementClient
from pytest_specdecode.errors import ConfigError, RequestError
from pytest_specdecode.profiles import ServerProfile
from pytest_specdecode.profiles.llamacpp import LlamaCppOptions, LlamaCppSpeculative
from pytest_specdecode.request_log import RequestRecord, RunRecord
from pytest_specdecode.servers.launcher import find_free_port
from pytest_specdecode.servers.readiness import LogTail
from pytest_specdecode.workloads import Prompt, Workload

BASE_URL = "http://127.0.0.1:8080"
PROMPTS = (Prompt("code", "Write a function."), Prompt("chat", "Plan my weekend."))
Handler = Callable[[httpx.Request], httpx.Response]

SGLANG = ServerProfile(name="s", model_path="/models/target")
EAGLE3 = LlamaCppSpeculative("draft-eagle3", "/m/eagle3.gguf", draft_n_max=4)
LLAMA_SPEC = ServerProfile(
    name="l",
    model_path="/m/target.gguf",
    launcher="llamacpp",
    llamacpp=LlamaCppOptions(speculative=EAGLE3, threads=2, ctx_size=1024, parallel=1),
)
LLAMA_PLAIN = ServerProfile(
    name="n", model_path="/m/target.gguf", launcher="llamacpp", llamacpp=LlamaCppOptions()
)


def workload(api: str = "completions-stream", **changes: object) -> Workload:
    base = Workload("unit", "inline", PROMPTS, api=api, requests_per_run=2, warmup_requests=0)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def make_client(
    handler: Handler, seen: list[httpx.Request] | None = None, **options: Any
) -> MeasurementClient:
    def recording(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        return handler(request)

    transport = httpx.MockTransport(recording)
    return MeasurementClient(BASE_URL, transport=transport, **options)


def scripted(responses: Sequence[httpx.Response]) -> Handler:
    queue: Iterator[httpx.Response] = iter(responses)
    return lambda request: next(queue)


def test_backend_for_follows_the_launcher() -> None:
    assert isinstance(backend_for(SGLANG), SglangBackend)
    assert isinstance(backend_for(dataclasses.replace(SGLANG, launcher="sim")), SglangBackend)
    llama = backend_for(LLAMA_SPEC)
    assert isinstance(llama, LlamaCppBackend)
    assert llama.health_paths == ("/health",)
    assert llama.default_port == 8080
    assert backend_for(SGLANG).health_paths == ("/health_generate", "/health")
    assert backend_for(SGLANG).log_phases == SGLANG_PHASES


# --- SGLang: /flush_cache and /server_info ---------------------------------------------------


def test_flush_cache_retries_while_the_server_is_busy() -> None:
    seen: list[httpx.Request] = []
    busy = httpx.Response(400, text="Cache not flushed: requests are running")
    ok = httpx.Response(200, text="Cache flushed.\nPlease check backend logs for more details.")
    backend = SglangBackend(SGLANG)
    with make_client(scripted([busy, busy, ok]), seen) as client:
        assert backend.flush_cache(client, retry_interval=0) is True
    assert backend.flush_supported is True
    assert [(r.method, r.url.path) for r in seen] == [("GET", "/flush_cache")] * 3


def test_flush_cache_gives_up_when_busy_past_the_timeout() -> None:
    client = make_client(scripted([httpx.Response(400, text="busy")]))
    with client, pytest.raises(RequestError, match=r"stayed busy \(HTTP 400.*for 0s"):
        SglangBackend(SGLANG).flush_cache(client, timeout=0)


def test_flush_cache_404_means_unsupported_and_is_remembered() -> None:
    seen: list[httpx.Request] = []
    backend = SglangBackend(SGLANG)
    with make_client(scripted([httpx.Response(404)]), seen) as client:
        assert backend.flush_cache(client) is False
        assert backend.begin_run(client, workload(flush_cache=True)) is None
    assert backend.flush_supported is False
    assert len(seen) == 1


def test_flush_cache_other_statuses_are_errors() -> None:
    with (
        make_client(scripted([httpx.Response(500, text="oops")])) as client,
        pytest.raises(RequestError, match=r"/flush_cache: HTTP 500 Internal Server Error: oops"),
    ):
        SglangBackend(SGLANG).flush_cache(client)


def test_sglang_runs_flush_only_when_the_workload_asks() -> None:
    seen: list[httpx.Request] = []
    backend = SglangBackend(SGLANG)
    with make_client(lambda request: httpx.Response(200), seen) as client:
        backend.begin_run(client, workload(flush_cache=False))
        assert seen == []
        backend.begin_run(client, workload(flush_cache=True))
    assert [r.url.path for r in seen] == ["/flush_cache"]


def test_server_info_falls_back_to_get_server_info() -> None:
    seen: list[httpx.Request] = []
    info = {"tp_size": 8, "speculative_algorithm": "EAGLE3", "version": "0.5.4"}
    handler = scripted([httpx.Response(404), httpx.Response(200, json=info)])
    with make_client(handler, seen) as client:
        assert SglangBackend(SGLANG).server_info(client) == info
    assert [r.url.path for r in seen] == ["/server_info", "/get_server_info"]


def test_server_info_without_either_route_is_an_error() -> None:
    client = make_client(scripted([httpx.Response(404), httpx.Response(404)]))
    with client, pytest.raises(RequestError, match="neither /server_info nor /get_server_info"):
        SglangBackend(SGLANG).server_info(client)


def test_server_info_that_is_not_an_object_is_an_error() -> None:
    with (
        make_client(scripted([httpx.Response(200, json=[1, 2])])) as client,
        pytest.raises(RequestError, match=r"/server_info: expected a JSON object, got \[1,2\]"),
    ):
        SglangBackend(SGLANG).server_info(client)


def test_server_info_connection_refused_names_the_url() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused")

    client = make_client(handler)
    with client, pytest.raises(RequestError, match=r"8080/server_info: cannot connect"):
        SglangBackend(SGLANG).server_info(client)


def test_sglang_checks_args_of_attached_servers_only() -> None:
    backend = SglangBackend(SGLANG)
    assert backend.compare_args(SGLANG, {}, attached=False) == []
    mismatches = backend.compare_args(SGLANG, {"model_path": "/other"}, attached=True)
    assert [m.field for m in mismatches] == ["model_path", "tp_size"]


# --- a fake llama-server -----------------------------------------------------------------------


def llama_final(tokens: int, *, drafted: int | None, accepted: int | None) -> dict[str, Any]:
    """The final /v1/completions chunk (or whole body) as llama-server writes it."""
    timings: dict[str, Any] = {
        "cache_n": 0, "prompt_n": 24, "prompt_ms": 8.469, "prompt_per_token_ms": 0.352875,
        "prompt_per_second": 2833.86, "predicted_n": tokens, "predicted_ms": 6.939,
        "predicted_per_token_ms": 0.99, "predicted_per_second": 1008.79,
    }  # fmt: skip
    if drafted is not None:
        timings |= {"draft_n": drafted, "draft_n_accepted": accepted}
    return {
        "choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": "length"}],
        "created": 1795942067,
        "model": "/m/target.gguf",
        "system_fingerprint": "b1-0c1e570",
        "object": "text_completion",
        "usage": {
            "completion_tokens": tokens,
            "prompt_tokens": 24,
            "total_tokens": 24 + tokens,
            "prompt_tokens_details": {"cached_tokens": 0},
        },
        "id": "chatcmpl-a9MWUQcol3SFtzfxXu6ANHZdxGANMlAm",
        "timings": timings,
    }


def llama_token(text: str) -> dict[str, Any]:
    return {
        "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": None}],
        "created": 1795942067,
        "model": "/m/target.gguf",
        "system_fingerprint": "b1-0c1e570",
        "object": "text_completion",
        "id": "chatcmpl-a9MWUQcol3SFtzfxXu6ANHZdxGANMlAm",
    }


def prometheus(counters: dict[str, float]) -> str:
    """Like llama-server's /metrics: C++ default stream formatting (6 significant digits)."""
    lines = []
    for name, value in counters.items():
        lines += [
            f"# HELP llamacpp:{name} {name}",
            f"# TYPE llamacpp:{name} counter",
            f"llamacpp:{name} {value:.6g}",
        ]
    lines += ["# TYPE llamacpp:requests_processing gauge", "llamacpp:requests_processing 0"]
    return "\n".join(lines) + "\n"


class FakeLlamaServer:
    """Completions of ``tokens`` tokens, each verified in steps of ``n_max`` accepted drafts
    (the fixed-output pair: everything accepted) or none accepted; counters like the real one."""

    def __init__(self, *, tokens: int = 8, accept_all: bool = True, metrics: bool = True) -> None:
        self.tokens = tokens
        self.accept_all = accept_all
        self.metrics = metrics
        self.counters = {
            "spec_decode_num_draft_tokens_total": 0.0,
            "spec_decode_num_accepted_tokens_total": 0.0,
            "spec_decode_num_drafts_total": 0.0,
        }
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[httpx.Headers] = []
        self.foreign_requests = 0  # requests "someone else" sends between our scrapes
        self.props: dict[str, Any] = {
            "default_generation_settings": {"params": {"speculative.types": "none"}, "n_ctx": 1024},
            "total_slots": 1,
            "model_path": "/m/target.gguf",
            "build_info": "b1-0c1e570",
            "endpoint_metrics": True,
        }
        self.slots: Any = [{"id": 0, "n_ctx": 1024, "speculative": True, "is_processing": False}]

    def complete(self) -> tuple[int, int]:
        """(drafted, accepted) of one request; the counters move as in the server."""
        n_max, steps, drafted, accepted = 4, 0, 0, 0
        remaining = self.tokens - 1  # the first token comes from the prompt
        while remaining > 0:
            draft = min(n_max, remaining - 1) if self.accept_all else n_max
            ok = draft if self.accept_all else 0
            if draft > 0:
                steps += 1
                drafted += draft
                accepted += ok
            remaining -= ok + 1
        self.counters["spec_decode_num_draft_tokens_total"] += drafted
        self.counters["spec_decode_num_accepted_tokens_total"] += accepted
        self.counters["spec_decode_num_drafts_total"] += steps
        return drafted, accepted

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/metrics":
            if not self.metrics:
                return httpx.Response(501, json={"error": {"code": 501, "message": "no"}})
            for _ in range(self.foreign_requests):
                self.complete()
            return httpx.Response(
                200, text=prometheus(self.counters), headers={"content-type": "text/plain"}
            )
        if path == "/props":
            return httpx.Response(200, json=self.props)
        if path == "/slots":
            if self.slots is None:
                return httpx.Response(501, json={"error": {"code": 501, "message": "no slots"}})
            return httpx.Response(200, json=self.slots)
        assert path == "/v1/completions", path
        body = json.loads(request.content)
        self.bodies.append(body)
        self.headers.append(request.headers)
        drafted, accepted = self.complete()
        final = llama_final(self.tokens, drafted=drafted, accepted=accepted)
        if not body.get("stream"):
            final["choices"][0]["text"] = " General" * self.tokens
            return httpx.Response(200, json=final)
        events = [llama_token(" General") for _ in range(self.tokens)] + [final]
        payload = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return httpx.Response(
            200, headers={"content-type": "text/event-stream"}, content=payload.encode()
        )


def llama_client(server: FakeLlamaServer, profile: ServerProfile = LLAMA_SPEC) -> MeasurementClient:
    backend = backend_for(profile)
    return make_client(cast("Handler", server), adapters=backend.adapter)


# --- llama.cpp: the adapter ------------------------------------------------------------------


@pytest.mark.parametrize("api", ["completions-stream", "generate-stream"])
def test_llamacpp_streams_completions_and_records_the_draft_counts(api: str) -> None:
    server = FakeLlamaServer(tokens=8)
    with llama_client(server) as client:
        run = client.run(workload(api), run_index=0)
    assert [r.completion_tokens for r in run.records] == [8, 8]
    record = run.records[0]
    # 1 prompt token, then steps of 4 accepted + 1 target token: 5, then 2 (1 drafted)
    assert record.spec == {"draft_n": 5, "draft_n_accepted": 5}
    assert record.spec_verify_ct is None  # llama-server reports steps only in /metrics
    assert record.chunk_tokens == tuple(range(1, 9))  # one chunk per token
    assert record.t_first_token is not None
    assert record.finish_reason == "length"
    assert record.prompt_tokens == 24
    body = server.bodies[0]
    assert body == {
        "prompt": "Write a function.",
        "max_tokens": 256,
        "temperature": 0.0,
        "ignore_eos": True,
        "seed": prompt_seed(PROMPTS[0]),
        "cache_prompt": False,  # the workload flushes the cache: no prompt reuse
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert server.bodies[1]["seed"] == prompt_seed(PROMPTS[1]) != body["seed"]
    # llama-server closes a streamed response's connection although it says keep-alive
    assert [h.get("connection") for h in server.headers] == ["close", "close"]


def test_llamacpp_non_streaming_and_prompt_cache() -> None:
    server = FakeLlamaServer(tokens=8, accept_all=False)
    with llama_client(server) as client:
        run = client.run(workload("completions", flush_cache=False), run_index=0)
    record = run.records[0]
    assert record.completion_tokens == 8
    assert record.t_first_token is None
    assert record.spec == {"draft_n": 28, "draft_n_accepted": 0}
    # the server's own time: timings.prompt_ms + predicted_ms
    assert record.server_e2e_latency == pytest.approx((8.469 + 6.939) / 1000)
    assert server.bodies[0]["cache_prompt"] is True
    assert server.bodies[0]["stream"] is False
    assert "stream_options" not in server.bodies[0]
    assert server.headers[0].get("connection") != "close"


def test_llamacpp_adapter_reads_a_plain_server_and_errors() -> None:
    adapter = LlamaCppCompletions(streaming=False)
    plain = llama_final(8, drafted=None, accepted=None)
    assert adapter.parse_final(plain).spec == {}
    no_times = {**plain, "timings": {"predicted_n": 8}}
    assert adapter.parse_final(no_times).server_e2e_latency is None
    error = {"error": {"code": 400, "message": "request (6001 tokens) exceeds the context"}}
    with pytest.raises(RequestError, match=r"error: request \(6001 tokens\) exceeds"):
        adapter.parse_final(error)
    with pytest.raises(RequestError, match="expected timings to be a JSON object"):
        adapter.parse_final({**plain, "timings": [1]})
    bad = llama_final(8, drafted=-1, accepted=0)
    with pytest.raises(RequestError, match="expected draft_n to be a count, got -1"):
        adapter.parse_final(bad)


def test_llamacpp_maps_every_api_to_completions() -> None:
    backend = LlamaCppBackend(LLAMA_SPEC)
    assert backend.adapter("generate") == LlamaCppCompletions(streaming=False)
    assert backend.adapter("completions-stream", model="m") == LlamaCppCompletions(True, "m")
    assert backend.adapter("generate-stream").headers == {"Connection": "close"}
    assert SglangBackend(SGLANG).adapter("generate") == SglangGenerate(streaming=False)
    with pytest.raises(ConfigError, match="unknown api 'chat'"):
        backend.adapter("chat")


def test_prompt_seed_is_stable_and_31_bits() -> None:
    seed = prompt_seed(Prompt("code", "x"))
    assert seed == prompt_seed(Prompt("chat", "x"))  # the text decides, not the kind
    assert 0 <= seed < 2**31
    assert prompt_seed(Prompt("code", "y")) != seed


def test_llamacpp_log_phases(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(
        "0.00.005.480 I srv    load_model: loading model '/tmp/tm3/fixed-target.gguf'\n"
        "0.00.156.072 I common_speculative_init_result: loading draft model '/x/e.gguf'\n"
    )
    tail = LogTail(log, LLAMACPP_PHASES)
    assert tail.poll() == "loading the draft model"
    with log.open("a") as handle:
        handle.write("0.00.164.690 I srv  llama_server: model loaded\n")
    assert tail.poll() == "starting the HTTP server"


# --- llama.cpp: server info and checks -------------------------------------------------------


def test_llamacpp_server_info_normalises_props_and_slots() -> None:
    server = FakeLlamaServer()
    backend = LlamaCppBackend(LLAMA_SPEC)
    with llama_client(server) as client:
        assert backend.server_info(client) == {
            "backend": "llamacpp",
            "version": "b1-0c1e570",
            "model_path": "/m/target.gguf",
            "n_ctx": 1024,
            "total_slots": 1,
            "speculative": True,
        }
        server.slots = None  # --no-slots: 501
        assert backend.server_info(client)["speculative"] is None


def test_llamacpp_server_info_of_another_server_is_an_error() -> None:
    client = make_client(lambda request: httpx.Response(404, text="Not Found"))
    with client, pytest.raises(RequestError, match=r"/props: there is no /props .*llama-server"):
        LlamaCppBackend(LLAMA_SPEC).server_info(client)


def info(**changes: Any) -> dict[str, Any]:
    base = {"model_path": "/m/target.gguf", "n_ctx": 1024, "total_slots": 1, "speculative": True}
    return base | changes


def test_a_launched_llamacpp_server_is_checked_for_speculation_only() -> None:
    backend = LlamaCppBackend(LLAMA_SPEC)
    assert backend.compare_args(LLAMA_SPEC, info(model_path="/elsewhere"), attached=False) == []
    # the trap: a draft that is not EAGLE-3 leaves llama-server up without speculation
    (mismatch,) = backend.compare_args(LLAMA_SPEC, info(speculative=False), attached=False)
    assert mismatch.describe() == "speculative: profile wants True, server reports False"
    assert backend.compare_args(LLAMA_SPEC, info(speculative=None), attached=False) == []
    plain = LlamaCppBackend(LLAMA_PLAIN)
    (mismatch,) = plain.compare_args(LLAMA_PLAIN, info(), attached=False)
    assert mismatch.describe() == "speculative: profile wants False, server reports True"


def test_an_attached_llamacpp_server_is_checked_for_what_it_reports() -> None:
    backend = LlamaCppBackend(LLAMA_SPEC)
    assert backend.compare_args(LLAMA_SPEC, info(), attached=True) == []
    # -c is split over the slots, or shared by all of them (kv_unified)
    options = LlamaCppOptions(speculative=EAGLE3, threads=2, ctx_size=1024, parallel=2)
    two = dataclasses.replace(LLAMA_SPEC, llamacpp=options)
    assert backend.compare_args(two, info(total_slots=2, n_ctx=512), attached=True) == []
    assert backend.compare_args(two, info(total_slots=2, n_ctx=1024), attached=True) == []
    found = backend.compare_args(
        LLAMA_SPEC,
        info(model_path="/other.gguf", total_slots=4, n_ctx=4096, speculative=None),
        attached=True,
    )
    assert [m.describe() for m in found] == [
        "speculative: profile wants True, server does not report it",
        "model_path: profile wants '/m/target.gguf', server reports '/other.gguf'",
        "parallel: profile wants 1, server reports 4",
        "ctx_size: profile wants 1024, server reports 16384",
    ]
    assert "draft model, draft n max/min, threads" in backend.unverifiable([LLAMA_SPEC])


# --- llama.cpp: accept length from the counters around a run ----------------------------------


def test_accept_length_is_one_plus_accepted_per_verification_step() -> None:
    server = FakeLlamaServer(tokens=64)
    backend = LlamaCppBackend(LLAMA_SPEC)
    with llama_client(server) as client:
        server.complete()  # earlier traffic: only the deltas count
        state = backend.begin_run(client, workload())
        run = client.run(workload(), run_index=0)
        extras = backend.end_run(client, state, run)
    # 64 tokens: 12 steps of 4 accepted + 1, then one of 2: 13 steps, 50 accepted
    assert extras.values == {"accept_length": pytest.approx(1 + 100 / 26)}
    assert extras.warnings == ()
    assert sum(r.spec["draft_n"] for r in run.records) == 100  # type: ignore[misc]


def test_a_draft_that_is_never_accepted_gives_one() -> None:
    server = FakeLlamaServer(tokens=16, accept_all=False)
    backend = LlamaCppBackend(LLAMA_SPEC)
    with llama_client(server) as client:
        state = backend.begin_run(client, workload())
        extras = backend.end_run(client, state, client.run(workload(), run_index=0))
    assert extras.values == {"accept_length": 1.0}


def test_a_profile_without_speculation_never_scrapes() -> None:
    seen: list[httpx.Request] = []
    server = FakeLlamaServer(metrics=False)
    backend = LlamaCppBackend(LLAMA_PLAIN)
    with make_client(cast("Handler", server), seen, adapters=backend.adapter) as client:
        state = backend.begin_run(client, workload())
        extras = backend.end_run(client, state, client.run(workload(), run_index=0))
    assert extras.values == {}
    assert "/metrics" not in [r.url.path for r in seen]


def test_a_server_without_metrics_is_a_clear_error() -> None:
    backend = LlamaCppBackend(LLAMA_SPEC)
    with (
        llama_client(FakeLlamaServer(metrics=False)) as client,
        pytest.raises(RequestError, match=r"8080/metrics: llama-server was started without "),
    ):
        backend.begin_run(client, workload())


def test_counters_missing_from_metrics_are_a_clear_error() -> None:
    text = "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 0\n"
    client = make_client(lambda request: httpx.Response(200, text=text))
    with (
        client,
        pytest.raises(RequestError, match=r"no llamacpp:spec_decode_num_drafts_total, .*newer"),
    ):
        LlamaCppBackend(LLAMA_SPEC).begin_run(client, workload())


def test_foreign_requests_during_a_run_fail_it() -> None:
    server = FakeLlamaServer(tokens=8)
    backend = LlamaCppBackend(LLAMA_SPEC)
    with llama_client(server) as client:
        state = backend.begin_run(client, workload())
        run = client.run(workload(), run_index=2)
        server.foreign_requests = 1
        with pytest.raises(RequestError) as caught:
            backend.end_run(client, state, run)
    assert str(caught.value) == (
        "run 3: llama-server's counters moved by 15 accepted of 15 draft tokens during the run, "
        "but the run's 2 responses report 10 of 10 (timings.draft_n_accepted / draft_n): "
        "requests other than this run's reached the server while it was measured (another "
        "client, or a server shared with other tests), so neither the accept length nor the "
        "throughput is this run's alone. Measure a server nobody else uses"
    )


def run_of(*specs: dict[str, object]) -> RunRecord:
    records = tuple(
        RequestRecord(
            prompt_kind="code", prompt_tokens=8, completion_tokens=64, cached_tokens=None,
            t_start=0.0, t_first_token=None, t_end=1.0, chunk_times=(1.0,), chunk_tokens=(64,),
            spec_verify_ct=None, spec=spec, finish_reason="length", server_e2e_latency=None,
        )
        for spec in specs
    )  # fmt: skip
    return RunRecord(records=records, t_start=0.0, t_end=1.0, run_index=0)


def test_printed_counters_are_exact_below_a_million_and_rounded_above() -> None:
    assert printed_error(0) == 0
    assert printed_error(999999) == 0
    assert printed_error(1.23457e06) == 5  # 6 significant digits: a resolution of 10
    assert printed_error(2.5e07) == 50
    counters = SpecCounters.parse(
        prometheus(
            {
                "spec_decode_num_draft_tokens_total": 1234567,
                "spec_decode_num_accepted_tokens_total": 1000001,
                "spec_decode_num_drafts_total": 250000,
            }
        )
    )
    assert counters == SpecCounters(drafts=250000, draft_tokens=1.23457e06, accepted=1e06)


def test_rounded_counters_are_cross_checked_within_their_rounding() -> None:
    before = SpecCounters(drafts=250000, draft_tokens=1.23457e06, accepted=1.00000e06)
    after = SpecCounters(drafts=250026, draft_tokens=1.23467e06, accepted=1.00010e06)
    # exact deltas 101 and 101 are within ±10 of the printed 100 and 100
    extras = llamacpp_run_extras(
        before, after, run_of({"draft_n": 101, "draft_n_accepted": 101}), where="run 1"
    )
    assert extras.values["accept_length"] == pytest.approx(1 + 100 / 26)
    (warning,) = extras.warnings
    assert "printed with 6 significant digits, so the accept length is uncertain by up to" in (
        warning
    )
    assert "restart the server" in warning
    with pytest.raises(RequestError, match="report 150 of 101"):
        llamacpp_run_extras(
            before, after, run_of({"draft_n": 101, "draft_n_accepted": 150}), where="run 1"
        )


def test_a_run_without_a_verified_draft_has_no_accept_length() -> None:
    same = SpecCounters(drafts=7, draft_tokens=13, accepted=13)
    extras = llamacpp_run_extras(same, same, run_of({}, {}), where="run 2")
    assert extras.values == {}
    assert extras.warnings == (
        "run 2: llama-server verified no draft during the run "
        "(llamacpp:spec_decode_num_drafts_total did not move), so it has no accept length",
    )


def test_counters_that_go_backwards_mean_a_restart() -> None:
    before = SpecCounters(drafts=70, draft_tokens=130, accepted=130)
    after = SpecCounters(drafts=7, draft_tokens=13, accepted=13)
    with pytest.raises(RequestError, match=r"went backwards during the run .* restarted"):
        llamacpp_run_extras(before, after, run_of({"draft_n": 13}), where="run 1")


def test_sglang_launch_ports_are_ones_every_release_accepts() -> None:
    # SGLang 0.5.11-0.5.15 refuse a main port above 55535 (their derived gRPC port, port +
    # 10000, must be <= 65535): 2 of 10 OS-chosen ephemeral ports died of it on an H200.
    backend = backend_for(SGLANG)
    low, high = backend.port_range or (0, 0)
    assert (low, high) == SGLANG_PORT_RANGE == (10000, 20800)
    assert high + 10000 <= 65535
    assert high < 22000  # below SGLang 0.5.22+'s own NCCL port range and the ephemeral ports
    ports = [
        find_free_port("127.0.0.1", port_range=backend.port_range, derived=backend.derived_ports)
        for _ in range(50)
    ]
    assert all(low <= port <= high for port in ports)
    assert backend.derived_ports(12345) == ()  # single-node SGLang talks over IPC files


def test_dp_attention_makes_sglang_bind_more_ports_and_they_must_be_free() -> None:
    dp = backend_for(dataclasses.replace(SGLANG, extra_args=("--enable-dp-attention",)))
    assert dp.derived_ports(10000) == (10013, *range(10233, 10240))
    # A port whose derived port is taken is never chosen.
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        taken = holder.getsockname()[1]
        holder.listen()
        with pytest.raises(OSError, match=r"no free port in .* \(with the ports the server"):
            find_free_port(
                "127.0.0.1",
                port_range=(taken - 13, taken - 13),
                derived=dp.derived_ports,
                attempts=3,
            )
    # and the ports of servers recorded on this machine are avoided
    with pytest.raises(OSError):
        find_free_port("127.0.0.1", port_range=(15000, 15000), avoid={15000}, attempts=3)


def test_llama_server_takes_any_free_port() -> None:
    llama = backend_for(LLAMA_PLAIN)
    assert llama.port_range is None
    assert llama.derived_ports(8080) == ()
