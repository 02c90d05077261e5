"""Starting like SGLang: load phases with the port closed, 503 until warm-up, log lines, flags."""

from __future__ import annotations

import re
import subprocess
import sys

import httpx

from .conftest import EAGLE3_2STEP, NCCL_TUNED, StartSim, port_is_open

TS = r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


def test_port_closed_while_loading_then_503_until_warmup_then_200(start_sim: StartSim) -> None:
    # Speed 2 and a slowed warm-up keep each phase long enough to observe on a busy machine.
    sim = start_sim("--sim-slowdown", "10", load_seconds=1.2, speed=2, ready=False)
    sim.wait_for_log("Load weight begin")
    assert not port_is_open(sim.port)
    sim.wait_for_log("Capture target prefill CUDA graph begin")
    assert not port_is_open(sim.port)
    sim.wait_for_log("Uvicorn running on")
    assert "ready to roll" not in sim.log()
    assert httpx.get(f"{sim.base_url}/health", timeout=5).status_code == 503
    assert httpx.get(f"{sim.base_url}/health_generate", timeout=5).status_code == 503
    # /v1/models is static: 200 before readiness, which is why it is no readiness signal.
    assert httpx.get(f"{sim.base_url}/v1/models", timeout=5).status_code == 200
    sim.wait_ready()
    assert "The server is fired up and ready to roll!" in sim.log()
    assert httpx.get(f"{sim.base_url}/health", timeout=5).status_code == 200


def test_log_lines_follow_sglang_wording_and_order(start_sim: StartSim) -> None:
    sim = start_sim(*EAGLE3_2STEP, "--decode-log-interval", "5", env=NCCL_TUNED)
    sim.generate({"text": "hi", "sampling_params": {"max_new_tokens": 40, "temperature": 0}})
    log = sim.log()
    expected_in_order = [
        rf"^{TS}\] \[simulated\] pytest-specdecode \S+ simulated SGLang server",
        rf"^{TS}\] server_args=ServerArgs\(model_path='/shared/kimi-k2.5-int4'",
        rf"^{TS} TP0\] Load weight begin\. avail mem=[\d.]+ GB$",
        rf"^{TS} TP0\] Load weight end\. .*mem usage=[\d.]+ GB\.$",
        rf"^{TS} TP0\] KV Cache is allocated\. dtype: torch\.bfloat16, #tokens: \d+, ",
        rf"^{TS} TP0\] KV Cache is allocated\. dtype: torch\.bfloat16, #tokens: \d+, ",
        rf"^{TS} TP0\] Capture target prefill CUDA graph begin\. backend=breakable, ",
        rf"^{TS} TP0\] Capture target prefill CUDA graph end\. elapsed=[\d.]+ s",
        rf"^{TS} TP0\] Capture target verify CUDA graph begin\. backend=full, num_tokens_per_bs=3",
        rf"^{TS} TP0\] Capture draft prefill CUDA graph begin\.",
        rf"^{TS} TP0\] Capture draft decode CUDA graph begin\.",
        rf"^{TS} TP0\] Capture draft decode CUDA graph end\. elapsed=[\d.]+ s",
        rf"^{TS} TP0\] max_total_num_tokens=\d+, chunked_prefill_size=8192, "
        r"max_prefill_tokens=16384, max_running_requests=48, context_len=\d+",
        rf"^{TS}\] INFO: +Uvicorn running on http://127\.0\.0\.1:{sim.port}",
        rf"^{TS}\] The server is fired up and ready to roll!$",
        rf"^{TS} TP0\] Decode batch, #running-req: 1, #token: \d+, token usage: \d\.\d\d, "
        r"accept len: \d\.\d\d, accept rate: \d\.\d\d, cuda graph: True, "
        r"gen throughput \(token/s\): [\d.]+, #queue-req: 0$",
    ]
    position = 0
    for pattern in expected_in_order:
        match = re.compile(pattern, re.MULTILINE).search(log, position)
        assert match, f"{pattern!r} not found after offset {position}:\n{log}"
        position = match.end()
    assert "NCCL tuning share 1.00" in log


def test_decode_log_has_no_accept_len_without_speculation(start_sim: StartSim) -> None:
    sim = start_sim("--decode-log-interval", "5")
    sim.generate({"text": "hi", "sampling_params": {"max_new_tokens": 30, "temperature": 0}})
    decode_lines = [line for line in sim.log().splitlines() if "Decode batch," in line]
    assert decode_lines
    assert not any("accept len" in line for line in decode_lines)
    assert "Capture draft" not in sim.log()
    assert "Capture target decode CUDA graph begin" in sim.log()


def test_skip_server_warmup_is_ready_without_a_warmup_request(start_sim: StartSim) -> None:
    sim = start_sim("--skip-server-warmup", "--enable-metrics")
    metrics = httpx.get(f"{sim.base_url}/metrics", timeout=5).text
    assert re.search(r'^sglang:num_requests_total\{model_name="[^"]+"\} 0\.0$', metrics, re.M)
    assert "ready to roll" in sim.log()


def test_help_is_grouped_and_a_missing_model_path_is_a_usage_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pytest_specdecode.sim", "--help"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0
    assert "SGLang server arguments" in result.stdout
    assert "simulation knobs" in result.stdout
    assert "--speculative-num-draft-tokens" in result.stdout
    assert "--sim-fault" in result.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "pytest_specdecode.sim", "--port", "1"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert missing.returncode == 2
    assert "--model-path" in missing.stderr
