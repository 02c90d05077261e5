"""The progress line's phases for every start-up log wording from SGLang 0.5.6 to 0.5.23.

The simulator writes each release's start-up lines (read in the releases' sources; 0.5.15's
checked against the real log in ``data/real_sglang_0_5_15``); the plugin's phase table
(``backends.SGLANG_PHASES``) must name a phase for each step of every one of them: a 900-second
load that shows "starting" or a stale phase is what the table is for.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_specdecode.backends import SGLANG_PHASES, SGLANG_PORT_RANGE
from pytest_specdecode.servers.launcher import find_free_port
from pytest_specdecode.servers.readiness import LogTail

EAGLE3 = (
    "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/models/draft",
    "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "3",
)  # fmt: skip


def startup_phases(tmp_path: Path, version: str, *flags: str) -> list[str]:
    """The phases the plugin shows, in order, for the start-up log of the simulator speaking
    ``version`` (started until ready, then its log replayed line by line, as it was written)."""
    log = tmp_path / f"sim-{version}.log"
    port = find_free_port("127.0.0.1", port_range=SGLANG_PORT_RANGE)
    argv = [
        sys.executable, "-m", "pytest_specdecode.sim", "--model-path", "/models/target",
        "--port", str(port), "--sim-sglang-version", version, "--sim-load-seconds", "0.5",
        *flags,
    ]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while "ready to roll" not in log.read_text() and proc.poll() is None:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
    replay = tmp_path / f"replay-{version}.log"
    replay.write_text("")
    tail = LogTail(replay, SGLANG_PHASES)
    seen: list[str] = []
    with replay.open("a") as out:
        for line in log.read_text().splitlines(keepends=True):
            out.write(line)
            out.flush()
            phase = tail.poll()
            if not seen or seen[-1] != phase:
                seen.append(phase)
    return seen


@pytest.mark.parametrize("version", ["0.5.6", "0.5.13"])
def test_releases_up_to_0_5_13_capture_per_model(tmp_path: Path, version: str) -> None:
    phases = startup_phases(tmp_path, version, *EAGLE3)
    assert "loading the target model's weights" in phases
    assert "capturing the target's CUDA graphs" in phases
    assert "capturing the draft's CUDA graphs" in phases
    assert phases[-3:] == ["starting the HTTP server", "warming up", "ready"]


@pytest.mark.parametrize("version", ["0.5.14", "0.5.15", "0.5.23"])
def test_releases_from_0_5_14_capture_per_graph(tmp_path: Path, version: str) -> None:
    phases = startup_phases(tmp_path, version, *EAGLE3)
    expected_in_order = [
        "loading the target model's weights",
        "loading the draft model's weights",
        "allocating the KV cache",
        "capturing the target's prefill CUDA graphs",
        "capturing the target's verify CUDA graphs",
        "capturing the draft's decode CUDA graphs",
        "starting the HTTP server",
        "warming up",
        "ready",
    ]
    positions = [phases.index(name) for name in expected_in_order]
    assert positions == sorted(positions), phases


def test_without_speculation_the_target_captures_decode_graphs(tmp_path: Path) -> None:
    phases = startup_phases(tmp_path, "0.5.23")
    assert "capturing the target's decode CUDA graphs" in phases
    assert not any("draft" in phase for phase in phases)
