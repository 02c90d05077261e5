"""The plugin's own readers on what real SGLang 0.5.15 answered (``data/real_sglang_0_5_15``).

The recorded bodies and event streams are replayed through the real measurement client (an
``httpx.MockTransport`` answering each request with the recorded answer), the metrics, the
backend's ``/server_info`` reader and the attach check. A shape real SGLang sent that the plugin
cannot read fails here, in CI, without a GPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from pytest_specdecode.backends import SGLANG_PHASES, SglangBackend
from pytest_specdecode.client import MeasurementClient
from pytest_specdecode.metrics import compute_run_metrics
from pytest_specdecode.profiles.profile import (
    ServerProfile,
    Speculative,
    compare_server_args,
)
from pytest_specdecode.servers.readiness import LogTail
from pytest_specdecode.workloads import Prompt, Workload

from .conftest import REAL_0_5_15, RecordedAnswer, real_answers, real_evidence

DATA = REAL_0_5_15

# The recorded server: EAGLE3 2-step, a draft whose every token is accepted, 64 tokens a request.
STEPS, TOKENS = 2, 64
PROMPT = Prompt("code", real_answers()["POST /generate"].request["text"])


def recorded_transport(answer: RecordedAnswer) -> httpx.MockTransport:
    """Answers every request to the recorded path with the recorded answer (and /flush_cache
    with its own), the way the real server did."""
    flush = real_answers()["POST /flush_cache"]

    def handler(request: httpx.Request) -> httpx.Response:
        chosen = flush if request.url.path == "/flush_cache" else answer
        assert request.url.path == chosen.path, request.url
        headers = {"content-type": chosen.content_type or "application/json"}
        if chosen.sse_lines is not None:
            body = "".join(f"{line}\n" for line in chosen.sse_lines).encode()
            return httpx.Response(chosen.status, content=body, headers=headers)
        if isinstance(chosen.body, str):
            return httpx.Response(chosen.status, text=chosen.body, headers=headers)
        return httpx.Response(chosen.status, json=chosen.body, headers=headers)

    return httpx.MockTransport(handler)


def workload(api: str) -> Workload:
    return Workload(
        "contract", "inline", (PROMPT,), api=api, max_new_tokens=TOKENS, requests_per_run=2
    )


REPLAYED: dict[str, tuple[str, str]] = {
    "generate": ("generate", "POST /generate"),
    "generate-stream": ("generate-stream", "POST /generate stream"),
    "completions": ("completions", "POST /v1/completions"),
    "completions-stream": ("completions-stream", "POST /v1/completions stream (plugin's body)"),
}


@pytest.mark.parametrize("case", list(REPLAYED))
def test_a_run_against_the_recorded_answers_is_read_in_full(case: str) -> None:
    api, name = REPLAYED[case]
    with MeasurementClient(
        "http://127.0.0.1:30000", transport=recorded_transport(real_answers()[name])
    ) as client:
        run = client.run(workload(api), run_index=0)
    assert [r.completion_tokens for r in run.records] == [TOKENS, TOKENS]
    assert all(r.finish_reason == "length" for r in run.records)
    assert all(r.prompt_tokens == 22 for r in run.records)
    values = compute_run_metrics(run).values
    if api.startswith("generate"):
        # SGLang's own figure: its log said "accept len: 3.00" and /metrics
        # sglang:spec_accept_length 3.0 for this draft; meta_info's per-request figure is 64/21.
        assert values["accept_length"] == STEPS + 1
        assert values["spec_accept_length"] == pytest.approx(TOKENS / 21)
        assert all(r.spec_verify_ct == 21 for r in run.records)
    else:
        # 0.5.15's OpenAI-compatible routes carry no speculative details, even when asked
        # (return_spec_tokens_details arrived in 0.5.19): no accept length, never a wrong one.
        assert "accept_length" not in values
        assert all(r.spec_verify_ct is None for r in run.records)
    if api.endswith("-stream"):
        assert {"ttft", "itl_p50"} <= set(values)


def test_the_accept_length_is_the_one_sglang_logs_and_exports() -> None:
    metrics = real_answers()["GET /metrics (after requests)"].body
    gauge = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("sglang:spec_accept_length{")
    ]
    assert gauge == [3.0]
    log_lines = [p["line"] for p in real_evidence()["phases"] if "accept len" in p["line"]]
    assert not log_lines or all("accept len: 3.00" in line for line in log_lines)


def server_profile(**changes: object) -> ServerProfile:
    """The profile that launched the recorded server (what the plugin would attach with)."""
    argv = real_evidence()["argv"]
    profile = ServerProfile(
        name="eagle3-2step",
        source="contract",
        launcher="sglang",
        model_path=argv[argv.index("--model-path") + 1],
        tp_size=1,
        mem_fraction_static=0.5,
        speculative=Speculative(
            algorithm="EAGLE3",
            draft_model_path=argv[argv.index("--speculative-draft-model-path") + 1],
            num_steps=2,
            eagle_topk=1,
            num_draft_tokens=3,
        ),
        extra_args=("--attention-backend", "triton", "--disable-cuda-graph"),
    )
    return dataclasses.replace(profile, **changes)


def read_server_info() -> dict[str, object]:
    answer = real_answers()["GET /server_info"]
    with MeasurementClient(
        "http://127.0.0.1:30000", transport=recorded_transport(answer)
    ) as client:
        return SglangBackend(server_profile()).server_info(client)


def test_the_attach_check_passes_the_server_that_runs_the_profile() -> None:
    info = read_server_info()
    assert info["version"] == "0.5.15"
    assert compare_server_args(server_profile(), info) == []


Change = Callable[[ServerProfile], ServerProfile]


@pytest.mark.parametrize(
    ("change", "fields"),
    [
        (lambda p: dataclasses.replace(p, tp_size=8), ["tp_size"]),
        (
            lambda p: dataclasses.replace(
                p,
                speculative=dataclasses.replace(p.speculative, num_steps=3, num_draft_tokens=4),
            ),
            ["speculative_num_steps", "speculative_num_draft_tokens"],
        ),
        (
            lambda p: dataclasses.replace(
                p, extra_args=(*p.extra_args, "--cuda-graph-max-bs", "8")
            ),
            # 0.5.15's --cuda-graph-max-bs is an alias that sets cuda_graph_max_bs_decode
            ["cuda_graph_max_bs_decode"],
        ),
    ],
    ids=["tp", "steps", "cuda-graph-max-bs"],
)
def test_a_difference_is_named_with_the_field_this_release_reports(
    change: Change, fields: list[str]
) -> None:
    mismatches = compare_server_args(change(server_profile()), read_server_info())
    assert [m.field for m in mismatches] == fields
    assert all(m.reported for m in mismatches)


def test_a_field_this_release_does_not_report_is_unchecked_not_refused() -> None:
    info = read_server_info()
    assert "cuda_graph_max_bs" not in info  # 0.5.14+ split it into -decode/-prefill
    # Asked as 0.5.13 and earlier name it, the field is missing; that is not a mismatch.
    del info["mem_fraction_static"]
    mismatches = compare_server_args(server_profile(), info)
    assert [(m.field, m.reported, m.required) for m in mismatches] == [
        ("mem_fraction_static", False, False)
    ]
    # The fields every release has are required: without them it is not SGLang.
    del info["tp_size"]
    required = [m.field for m in compare_server_args(server_profile(), info) if m.required]
    assert required == ["tp_size"]


def test_every_expected_field_exists_in_the_real_server_info() -> None:
    info = read_server_info()
    profile = server_profile(extra_args=("--cuda-graph-max-bs", "8", "--disable-cuda-graph"))
    assert set(profile.expected_server_args("0.5.15")) <= set(info)


def phases_of(log_name: str, tmp_path: Path) -> list[str]:
    """The progress line's phases, in order, as the real log was written line by line."""
    source = (DATA / log_name).read_text(encoding="utf-8").splitlines(keepends=True)
    log = tmp_path / log_name
    log.write_text("")
    tail = LogTail(log, SGLANG_PHASES)
    seen: list[str] = []
    with log.open("a", encoding="utf-8") as out:
        for line in source:
            out.write(line)
            out.flush()
            phase = tail.poll()
            if not seen or seen[-1] != phase:
                seen.append(phase)
    return seen


def test_the_progress_line_follows_a_real_start_with_cuda_graphs(tmp_path: Path) -> None:
    # 0.5.15 with CUDA graphs on (the attempt later stopped on a missing optional library)
    assert phases_of("server_cuda_graphs_on_startup.log", tmp_path) == [
        "starting",
        "initialising torch.distributed",
        "loading the target model's weights",
        "weights loaded",
        "initialising the draft",
        "loading the draft model's weights",
        "weights loaded",
        "allocating the KV cache",
        "capturing the target's prefill CUDA graphs",
        "capturing the target's verify CUDA graphs",
        "capturing the draft's prefill CUDA graphs",
        "capturing the draft's decode CUDA graphs",  # where it died: the phase it reports
    ]


def test_the_progress_line_follows_the_real_start_to_ready(tmp_path: Path) -> None:
    phases = phases_of("server_hand.log", tmp_path)
    assert phases[:7] == [
        "starting",
        "initialising torch.distributed",
        "loading the target model's weights",
        "weights loaded",
        "initialising the draft",
        "loading the draft model's weights",
        "weights loaded",
    ]
    assert phases[7:11] == [
        "allocating the KV cache",
        "starting the HTTP server",
        "warming up",
        "ready",
    ]
