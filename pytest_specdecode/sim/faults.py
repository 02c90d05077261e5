"""Injected faults (``--sim-fault``), each failing the way SGLang fails.

All faults except ``exit-during-load`` arm only after the warm-up, so the server first becomes
ready. Process deaths are a SIGKILL to the server itself, as SGLang's ``kill_process_tree`` does
when a scheduler dies (the exit status is then -9 / 137).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from pytest_specdecode.sim.logs import SCHEDULER_LOGGER, SIM_LOGGER

_scheduler_log = logging.getLogger(SCHEDULER_LOGGER)
_main_log = logging.getLogger(SIM_LOGGER)

#: Wall seconds between a crash being decided and the SIGKILL, so already produced tokens reach
#: the client first (the crash happens "while serving", after a few streamed tokens).
CRASH_GRACE_SECONDS = 0.05

_CAPTURE_FAILURE = """\
Scheduler hit an exception: Traceback (most recent call last):
  File "sglang/srt/managers/scheduler.py", in run_scheduler_process
    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)
  File "sglang/srt/model_executor/model_runner.py", in initialize
    self.init_device_graphs()
  File "sglang/srt/model_executor/cuda_graph_runner.py", in __init__
    raise Exception(
Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 2.00 GiB. \
GPU 0 has a total capacity of 94.97 GiB of which 1.12 GiB is free. \
(simulated fault: --sim-fault exit-during-load)
Possible solutions:
1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)
2. set --cuda-graph-max-bs to a smaller value (e.g., 16)
3. disable torch compile by not using --enable-torch-compile
4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)
Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose
"""

_RUNTIME_FAILURE = """\
Scheduler hit an exception: Traceback (most recent call last):
  File "sglang/srt/managers/scheduler.py", in run_scheduler_process
    scheduler.event_loop_normal()
  File "sglang/srt/managers/scheduler.py", in event_loop_normal
    result = self.run_batch(batch)
  File "sglang/srt/speculative/eagle_worker.py", in forward_batch_generation
    logits_output, verify_output, model_worker_batch, _ = self.verify(batch, spec_info)
RuntimeError: CUDA error: an illegal memory access was encountered \
(simulated fault: --sim-fault {fault})
"""


def kill_self() -> None:
    """SIGKILL this process, as ``kill_process_tree(os.getpid())`` does."""
    for stream in (sys.stderr, sys.stdout):
        stream.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _child_failed() -> None:
    _main_log.error("Received sigquit from a child process. It usually means the child failed.")


def fail_during_load() -> None:
    """The ``exit-during-load`` fault: a CUDA-graph capture failure kills the server."""
    _scheduler_log.error(_CAPTURE_FAILURE.rstrip("\n"))
    _child_failed()
    kill_self()


class FaultState:
    """Which fault is injected and whether it is armed (after the warm-up)."""

    def __init__(self, fault: str | None, crash_after: int | None) -> None:
        # crash-after:N and hang-after:N share the count; the kind says what request N+1 does
        self.kind = fault.split(":", 1)[0] if fault and crash_after is not None else fault
        self.fault = fault
        self._crash_after = crash_after
        self.armed = False
        self._generate_requests = 0
        self._health_calls = 0
        self._crashing = False

    def active(self, kind: str) -> bool:
        return self.armed and self.kind == kind

    def count_generate_request(self) -> bool:
        """Count a generate/completions request; True when it is the one to crash on."""
        if not self.armed or self._crash_after is None:
            return False
        self._generate_requests += 1
        return self._generate_requests == self._crash_after + 1

    def health_flaps_down(self) -> bool:
        """``flap-health``: every second health call after readiness fails (200, 503, ...)."""
        if not self.active("flap-health"):
            return False
        self._health_calls += 1
        return self._health_calls % 2 == 0

    def crash_while_serving(self) -> None:
        """``crash-after:N``: log the scheduler's failure, then die shortly after."""
        if self._crashing:
            return
        self._crashing = True
        _scheduler_log.error(_RUNTIME_FAILURE.format(fault=self.fault).rstrip("\n"))
        _child_failed()
        asyncio.get_running_loop().call_later(CRASH_GRACE_SECONDS, kill_self)


def malformed_event(payload: bytes) -> bytes:
    """A ``data:`` line whose JSON is cut off mid-object (the ``malformed-sse`` fault)."""
    return b"data: " + payload[: max(1, len(payload) // 2)] + b"\n\n"
