"""What a pytest process's session starts with, in plain values: which process this is (an
xdist worker or the main one) and the run it belongs to, the directory of its server logs,
the earlier nights of history, SIGTERM taken as Ctrl-C, and the start-up objects kept out of
the garbage collector's way.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_specdecode.errors import SpecdecodeError
from pytest_specdecode.outputs.history import read_history

if TYPE_CHECKING:
    from pytest_specdecode.session.orchestrator import SpecdecodeSession


def process_of(workerinput: Mapping[str, Any] | None) -> tuple[str, str]:
    """(worker, run id) of this process: an xdist worker's name and the controller's run id
    (from xdist's ``workerinput``), or ``main`` and a new run id."""
    if workerinput is None:
        return "main", uuid.uuid4().hex
    worker = str(workerinput.get("workerid", "gw"))
    return worker, str(workerinput.get("specdecode_run_id") or workerinput.get("testrunuid"))


class LazyLogDir(os.PathLike[str]):
    """Server logs go under pytest's basetemp (``basetemp()``, None without one), created only
    when a server is launched."""

    def __init__(self, basetemp: Callable[[], Path | None]) -> None:
        self._basetemp = basetemp
        self._path: Path | None = None

    def _resolve(self) -> Path:
        if self._path is None:
            base = self._basetemp() or Path.cwd() / ".specdecode-logs"
            self._path = Path(base) / "specdecode-logs"
            self._path.mkdir(parents=True, exist_ok=True)
        return self._path

    def __fspath__(self) -> str:
        return str(self._resolve())

    def __truediv__(self, other: str) -> Path:
        return self._resolve() / other


def read_earlier_nights(session: SpecdecodeSession) -> None:
    """The history file's earlier nights, which sharpen each test's launch-to-launch variance
    (launches.prior_for); a bad line or file is a session warning."""
    path = session.settings.history
    if path is None or not path.exists():
        return
    try:
        session.history = read_history(
            path, on_bad_line=lambda exc: session.warnings.append(str(exc))
        )
    except SpecdecodeError as exc:
        session.warnings.append(f"{exc}; the launch variance uses the baselines alone")


def terminate_gracefully() -> None:
    """SIGTERM (a cancelled CI job) takes pytest's Ctrl-C path, so servers are stopped."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:

        def handler(signum: int, frame: object) -> None:
            raise KeyboardInterrupt(f"signal {signum}")

        signal.signal(signal.SIGTERM, handler)


def freeze_start_up_objects() -> None:
    """Once the session has selected tests of the plugin: move every object alive now (the
    modules pytest and the plugin imported, their classes and functions, the collected tests)
    out of the collector's reach (``gc.freeze``): they live as long as the session anyway. A
    full collection walks every tracked object, these are most of them, and the measuring
    client runs in this process: a collection during a run is a pause in the client's reading
    of the stream. pytest also collects five times at exit (its unraisable-exception check),
    about 0.2 s of CPU a session on a CI core, and the plugin's own suite starts hundreds of
    pytest processes. Objects made later (results, samples) are collected as usual; frozen ones
    are left out of ``gc.get_objects()``, which is why a session without the plugin's tests is
    not frozen at all.
    """
    gc.freeze()
