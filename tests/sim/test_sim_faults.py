"""Injected faults fail the way SGLang fails."""

from __future__ import annotations

import itertools
import json
import signal
import time
from typing import Any

import httpx
import pytest

from .conftest import StartSim, port_is_open, sse_events

LONG = {"max_new_tokens": 3000, "temperature": 0, "ignore_eos": True}


def read_stream(client: httpx.Client, payload: dict[str, Any], received: list[Any]) -> None:
    """Read a /generate stream into ``received`` (kept when reading fails midway)."""
    with client.stream("POST", "/generate", json=payload) as response:
        assert response.status_code == 200
        for data in sse_events(response.iter_lines()):
            if data != "[DONE]":
                received.append(json.loads(data))


def test_exit_during_load_dies_with_a_traceback_before_binding(start_sim: StartSim) -> None:
    sim = start_sim("--sim-fault", "exit-during-load", load_seconds=0.6, speed=1, ready=False)
    deadline = time.monotonic() + 30
    while sim.proc.poll() is None:
        assert not port_is_open(sim.port), "the port must stay closed while loading"
        assert time.monotonic() < deadline, sim.log()
        time.sleep(0.02)
    assert sim.proc.returncode != 0
    log = sim.log()
    assert "KV Cache is allocated" in log
    assert "Traceback (most recent call last)" in log
    assert "Capture cuda graph failed" in log
    assert "Received sigquit from a child process" in log
    assert "Uvicorn running" not in log


def test_crash_after_n_serves_n_then_dies_mid_stream(start_sim: StartSim) -> None:
    sim = start_sim("--sim-fault", "crash-after:2")
    with sim.client() as client:
        short = {"text": "x", "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}}
        assert client.post("/generate", json=short).status_code == 200
        completion = {"prompt": "x", "max_tokens": 8}
        assert client.post("/v1/completions", json=completion).status_code == 200
        assert client.get("/health").status_code == 200  # probes do not count as requests
        received: list[Any] = []
        payload = {"text": "doomed", "stream": True, "sampling_params": LONG}
        with pytest.raises(httpx.HTTPError):  # the stream breaks while being read
            read_stream(client, payload, received)
    assert received, "a few tokens are streamed before the crash"
    assert 0 < received[-1]["meta_info"]["completion_tokens"] < 3000
    assert sim.proc.wait(timeout=10) == -signal.SIGKILL
    assert "illegal memory access" in sim.log()


def test_hang_accepts_requests_but_never_answers(start_sim: StartSim) -> None:
    sim = start_sim("--sim-fault", "hang", env={"SGLANG_HEALTH_CHECK_TIMEOUT": "1"}, ready=False)
    sim.wait_for_log("ready to roll")
    payload = {"text": "x", "stream": True, "sampling_params": LONG}
    with sim.client(timeout=httpx.Timeout(5.0, read=1.5)) as client:
        received: list[Any] = []
        with pytest.raises(httpx.ReadTimeout):  # headers arrive, then nothing
            read_stream(client, payload, received)
        assert received == []
        started = time.monotonic()
        assert client.get("/health_generate", timeout=10).status_code == 503
        assert time.monotonic() - started >= 0.9  # after SGLANG_HEALTH_CHECK_TIMEOUT
    assert "Health check failed" in sim.log()
    assert sim.proc.poll() is None


def test_hang_after_n_serves_n_then_freezes_mid_stream_and_stays_alive(
    start_sim: StartSim,
) -> None:
    sim = start_sim("--sim-fault", "hang-after:1", env={"SGLANG_HEALTH_CHECK_TIMEOUT": "1"})
    with sim.client(timeout=httpx.Timeout(5.0, read=1.5)) as client:
        short = {"text": "x", "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}}
        assert client.post("/generate", json=short).status_code == 200
        received: list[Any] = []
        payload = {"text": "frozen", "stream": True, "sampling_params": LONG}
        with pytest.raises(httpx.ReadTimeout):  # a few tokens, then silence
            read_stream(client, payload, received)
        assert received, "a few tokens are streamed before the hang"
        assert client.get("/health_generate", timeout=10).status_code == 503
    assert sim.proc.poll() is None  # alive and listening: hung, not crashed
    assert "illegal memory access" not in sim.log()


def test_http_500_on_generate_and_completions(start_sim: StartSim) -> None:
    sim = start_sim("--sim-fault", "http-500")
    with sim.client() as client:
        native = client.post("/generate", json={"text": "x"})
        assert native.status_code == 500
        assert "message" in native.json()["error"]
        openai = client.post("/v1/completions", json={"prompt": "x"})
        assert openai.status_code == 500
        assert openai.json()["object"] == "error"
        assert openai.json()["code"] == 500
        assert client.get("/health").status_code == 200


def test_malformed_sse_breaks_one_event_mid_stream(start_sim: StartSim) -> None:
    sim = start_sim("--sim-fault", "malformed-sse")
    payload = {
        "text": "x",
        "stream": True,
        "sampling_params": {"max_new_tokens": 40, "ignore_eos": True},
    }
    with sim.client() as client, client.stream("POST", "/generate", json=payload) as response:
        events = list(sse_events(response.iter_lines()))
    assert events[-1] == "[DONE]"
    good, broken = [], []
    for data in events[:-1]:
        try:
            good.append(json.loads(data))
        except json.JSONDecodeError:
            broken.append(data)
    assert len(broken) == 1
    assert good[-1]["meta_info"]["completion_tokens"] == 40  # the stream went on to the end


def test_flap_health_alternates_once_ready(start_sim: StartSim) -> None:
    sim = start_sim("--sim-fault", "flap-health")
    with sim.client() as client:
        codes = [client.get("/health").status_code for _ in range(4)]
    assert set(codes) == {200, 503}
    assert all(a != b for a, b in itertools.pairwise(codes))
