"""The simulator speaking SGLang 0.5.15 answers every recorded endpoint as real 0.5.15 did.

Each request recorded from a real 0.5.15 server (``data/real_sglang_0_5_15``) is replayed
against the simulator started with the real server's command line: same status code, same JSON
key paths with compatible types (the simulator's own ``simulated``/``sim_*`` fields aside), same
streaming framing, and the same option set on the command line.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pytest_specdecode import sglang_releases
from pytest_specdecode.backends import SGLANG_PORT_RANGE
from pytest_specdecode.servers.launcher import find_free_port

from .conftest import (
    RecordedAnswer,
    key_paths,
    merged_key_paths,
    real_answers,
    real_evidence,
    real_launch_options,
    shape_differences,
)

#: Recorded but not replayed: the first /health_generate is the readiness probe the fixture
#: already sent (it is checked like the later ones).
SKIPPED: frozenset[str] = frozenset()


def _free_port() -> int:
    """A port real 0.5.15 accepts (it refuses main ports above 55535), as the plugin picks."""
    return find_free_port("127.0.0.1", port_range=SGLANG_PORT_RANGE)


def _real_argv() -> list[str]:
    """The real server's flags, with the port replaced by a free one."""
    argv = list(real_evidence()["argv"])
    flags = argv[argv.index("sglang.launch_server") + 1 :]
    port = flags.index("--port")
    flags[port + 1] = str(_free_port())
    return flags


@pytest.fixture(scope="module")
def sim_0_5_15(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    flags = _real_argv()
    port = int(flags[flags.index("--port") + 1])
    log = tmp_path_factory.mktemp("contract") / "sim.log"
    argv = [
        sys.executable, "-m", "pytest_specdecode.sim", *flags, "--sim-sglang-version", "0.5.15",
        "--sim-load-seconds", "0.2", "--sim-speed", "20", "--sim-seed", "1",
        "--sim-launch-seed", "1",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"{base}/health_generate", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        with httpx.Client(base_url=base, timeout=60) as client:
            yield client
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


def _replay(client: httpx.Client, answer: RecordedAnswer) -> tuple[httpx.Response, list[str]]:
    """Send the recorded request; the SSE lines too when it streamed."""
    kwargs: dict[str, Any] = {}
    if answer.request is not None:
        kwargs["json"] = answer.request
    if answer.sse_lines is not None:
        with client.stream(answer.method, answer.path, **kwargs) as response:
            lines = list(response.iter_lines())
        return response, lines
    return client.request(answer.method, answer.path, **kwargs), []


def _private(paths: dict[str, set[str]]) -> dict[str, set[str]]:
    """Paths without SGLang's private bookkeeping keys (``_*``), which carry no API."""
    return {p: t for p, t in paths.items() if not any(k.startswith("_") for k in p.split("."))}


ANSWERS = real_answers("0.5.15")

# The answers were recorded in one sequence on one server; where an answer's shape depends on what
# came before it, that is replayed first (under xdist this worker's sim may have seen anything).
# "/server_info (after requests)" came right after the flushes, which reset the folded spec counts,
# so its internal_states has no avg_spec_accept_length (scheduler.py get_internal_state).
REPLAYED_BEFORE = {"GET /server_info (after requests)": "POST /flush_cache"}


def _hit_the_prefix_cache(answer: RecordedAnswer) -> bool:
    if answer.sse_lines is not None:
        bodies = answer.sse_events()
    else:  # a batch answers with a list, one body per prompt
        bodies = answer.body if isinstance(answer.body, list) else [answer.body]
    return any(
        isinstance(body, dict)
        and isinstance(body.get("meta_info"), dict)
        and (body["meta_info"].get("cached_tokens") or 0) > 0
        for body in bodies
    )


@pytest.mark.parametrize("name", [n for n in ANSWERS if n not in SKIPPED])
def test_replayed_answer_has_the_real_status_and_shape(sim_0_5_15: httpx.Client, name: str) -> None:
    real = ANSWERS[name]
    if _hit_the_prefix_cache(real):
        # Its shape (cached_tokens_details) depends on an earlier request having filled the
        # prefix cache; under xdist that one may have run on another worker's server, so the
        # same prompt is sent here first.
        _replay(sim_0_5_15, ANSWERS["POST /generate"])
    if name in REPLAYED_BEFORE:
        _replay(sim_0_5_15, ANSWERS[REPLAYED_BEFORE[name]])
    response, lines = _replay(sim_0_5_15, real)
    assert response.status_code == real.status, response.text[:500]
    real_type = (real.content_type or "").split(";")[0]
    sim_type = (response.headers.get("content-type") or "").split(";")[0]
    if real_type in ("application/json", "text/event-stream"):
        assert sim_type == real_type
    if real.sse_lines is not None:
        _check_sse_framing(lines)
        real_paths = merged_key_paths(real.sse_events())
        sim_events = [
            json.loads(line[len("data: ") :])
            for line in lines
            if line.startswith("data: ") and line != "data: [DONE]"
        ]
        assert not shape_differences(real_paths, merged_key_paths(sim_events))
    elif real_type == "application/json":
        real_paths = _private(key_paths(real.body))
        assert not shape_differences(real_paths, _private(key_paths(response.json())))
    elif name.startswith("GET /metrics"):
        # Some series appear only once observed: compare with all the recorded expositions.
        recorded = "\n".join(a.body for n, a in ANSWERS.items() if n.startswith("GET /metrics"))
        _check_metric_names(recorded, response.text)
    else:  # plain text or empty: the same text
        assert response.text == real.body


def _check_sse_framing(lines: list[str]) -> None:
    """``data: <json>`` events each followed by a blank line, ending with ``data: [DONE]``."""
    assert lines, "empty stream"
    events = lines[0::2]
    separators = lines[1::2]
    assert all(line.startswith("data: ") for line in events), lines[:4]
    assert all(line == "" for line in separators), lines[:4]
    assert events[-1] == "data: [DONE]"


def _families(exposition: str) -> set[str]:
    """Metric names: declared families and sample names, histogram suffixes stripped."""
    names = set(re.findall(r"^([a-zA-Z_:][\w:]*)[{ ]", exposition, re.MULTILINE))
    names |= set(re.findall(r"^# TYPE (\S+) ", exposition, re.MULTILINE))
    return {re.sub(r"_(bucket|count|sum)$", "", name) for name in names}


def _check_metric_names(real_text: str, sim_text: str) -> None:
    """Every metric the simulator exports is one real 0.5.15 exports under that name."""
    invented = _families(sim_text) - _families(real_text)
    assert not invented, f"metrics real SGLang 0.5.15 does not export: {sorted(invented)}"


def test_health_is_503_with_an_empty_body_during_warm_up_then_200() -> None:
    timeline = real_evidence()["health_timeline"]
    statuses = [entry["health"] for entry in timeline]
    assert statuses[0] == "ConnectError"  # port closed while loading
    assert "503 ''" in statuses
    assert statuses[-1] == "200 ''"


def test_the_option_set_is_the_real_one() -> None:
    """Every option real 0.5.15 lists in --help is accepted by the simulator speaking it (and
    the simulator's extra ones are the help-suppressed options of the same release)."""
    sim_options = {o for flag in sglang_releases.flags("0.5.15") for o in flag.opts}
    real = real_launch_options("0.5.15")
    assert real <= sim_options
    assert sim_options - real <= {
        "--forward-pass-metrics-ipc-name",
        "--forward-pass-metrics-worker-id",
        "--speculative-dflash-draft-window-size",
    }


def test_server_info_has_the_real_field_set(sim_0_5_15: httpx.Client) -> None:
    real = ANSWERS["GET /server_info"].body
    sim = sim_0_5_15.get("/server_info").json()
    sim_fields = {k for k in sim if k != "simulated" and not k.startswith("sim_")}
    assert sim_fields == set(real)
    for name in ("speculative_num_steps", "speculative_eagle_topk", "disable_overlap_schedule"):
        assert sim[name] == real[name], name
    assert sim["version"].startswith(real["version"])


def test_data_folder_is_where_the_docs_say() -> None:
    folder = Path(__file__).parent / "data" / "real_sglang_0_5_15"
    assert (folder / "evidence_hand_server.json").is_file()
