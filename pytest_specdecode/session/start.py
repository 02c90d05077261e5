"""What a pytest process's session starts with, in plain values: which process this is (an
xdist worker or the main one) and the run it belongs to, the output paths checked before any
server launches, the directory of its server logs, the earlier nights of history, SIGTERM taken
as Ctrl-C, and the start-up objects kept out of the garbage collector's way.
"""

from __future__ import annotations

import gc
import os
import signal
import tempfile
import threading
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_specdecode.errors import ConfigError, SpecdecodeError
from pytest_specdecode.outputs.benchmark import check_json_path
from pytest_specdecode.outputs.history import BadLines, os_error_hint, read_history
from pytest_specdecode.settings import OPTIONS, Settings, unknown_env_warnings

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


def open_session(
    settings: Settings,
    *,
    workerinput: Mapping[str, Any] | None,
    basetemp: Callable[[], Path | None],
    rootdir: Path,
    say: Callable[[str], None],
    is_tty: Callable[[], bool],
) -> SpecdecodeSession:
    """This pytest process's session (an xdist worker's or the main one's), its server logs
    under ``basetemp()``, lines said with ``say``, a misspelled environment variable warned
    about, and the earlier nights of the history read."""
    # Imported here: the plugin reads this module before any of the session's machinery.
    from pytest_specdecode.session.console import ProgressLine
    from pytest_specdecode.session.orchestrator import SpecdecodeSession

    worker, run_id = process_of(workerinput)
    session = SpecdecodeSession(
        settings,
        run_id=run_id,
        worker=worker,
        is_xdist_worker=workerinput is not None,
        log_dir=LazyLogDir(basetemp),  # type: ignore[arg-type]
        rootdir=rootdir,
        emit=lambda message: say(f"specdecode: {message}"),
        progress=ProgressLine(say, is_tty=is_tty),
    )
    session.warnings.extend(unknown_env_warnings(os.environ))
    read_earlier_nights(session)
    return session


def read_earlier_nights(session: SpecdecodeSession) -> None:
    """The history file's earlier nights, which sharpen each test's launch-to-launch variance
    (launches.prior_for) and feed the cross-night detector; a bad line is skipped and named
    once in the session's warnings (:class:`BadLines`), an unreadable file is a warning."""
    path = session.settings.history
    if path is None or not path.exists():
        return
    try:
        session.history = read_history(path, on_bad_line=BadLines(session.warnings))
    except SpecdecodeError as exc:
        session.warnings.append(f"{exc}; the launch variance uses the baselines alone")


def check_outputs(
    settings: Settings,
    *,
    given: Collection[str],
    env: Mapping[str, str],
    ini_file: str,
    junitxml: str | None,
    benchmark_json: object,
    args: Sequence[str],
    base: Path,
) -> None:
    """Every file the session will write at its end, checked now, before any server launches:
    a session that could not record what it measured launches nothing. ``ConfigError`` naming
    the path, where it was given, the operating system's answer and what to do.

    ``given``: the names of the options given on the command line; ``env``, ``ini_file``: where
    the others came from; ``junitxml``: pytest's ``--junitxml``; ``benchmark_json``,
    ``args``: pytest-benchmark's ``--benchmark-json`` value and pytest's arguments (for where
    it was given); ``base``: the directory relative paths are taken from.
    """
    for option in OPTIONS:
        if option.name not in ("history", "report", "markdown", "html"):
            continue
        path = getattr(settings, option.name)
        if path is None:
            continue
        if option.name in given:
            source = option.flag
        elif option.env and env.get(option.env_var):
            source = f"environment variable {option.env_var}"
        else:
            source = f"ini key {option.ini_key} in {ini_file}"
        _check_writable(
            Path(path), directory=option.name == "html", option=option.flag, source=source
        )
    if junitxml:
        path = Path(junitxml).expanduser()
        _check_writable(
            path if path.is_absolute() else base / path,
            directory=False,
            option="--junitxml",
            source="--junitxml",
        )
    if benchmark_json is not None:
        flag = "--benchmark-json"
        if any(arg == flag or arg.startswith(f"{flag}=") for arg in args):
            source = f"{flag} on the command line"
        elif flag in env.get("PYTEST_ADDOPTS", ""):
            source = f"{flag} in PYTEST_ADDOPTS"
        else:
            source = f"{flag} in addopts of {ini_file}"
        check_json_path(benchmark_json, base=base, source=source)


def _check_writable(path: Path, *, directory: bool, option: str, source: str) -> None:
    """``path`` (a file, or with ``directory`` a folder) can be written: an existing file is
    opened for appending (nothing is written), and the folder it goes in, or the nearest one
    above that exists, gets a probe file that is removed at once (the writers put a lock file
    or a temporary file beside theirs)."""
    what = "folder" if directory else "file"
    problem: str | None = None
    hint = f"give a path this user can write ({option}), or fix the permissions"
    try:
        if path.exists() and directory != path.is_dir():
            problem = f"it is a {'file' if directory else 'folder'}, not a {what}"
            hint = f"name a {what} ({option})"
        else:
            if path.is_file():
                os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
            above = path if directory else path.parent
            while not above.exists():
                above = above.parent
            if not above.is_dir():
                problem = f"{above} is a file, so the folder {path.parent} cannot be created"
                hint = f"give a path in a folder ({option})"
            else:
                handle, probe = tempfile.mkstemp(prefix=".specdecode-probe-", dir=above)
                os.close(handle)
                os.unlink(probe)
                if directory and path.is_dir():
                    problem = _foreign_files(path)
                    hint = f"name a new or empty folder, or an earlier dashboard's ({option})"
    except OSError as exc:
        problem = str(exc)
        hint = os_error_hint(exc, option)
    if problem is not None:
        raise ConfigError(
            f"cannot write the {what} {path}: {problem}. It would be written at the end of the "
            f"session, after every server launched and every test was measured, so nothing is "
            f"launched; {hint}",
            source=source,
        )


def _foreign_files(directory: Path) -> str | None:
    """Why the dashboard would refuse ``directory`` (files of the user's in it), or None."""
    from pytest_specdecode.outputs.dashboard.site import MARK  # only for --specdecode-html

    if any(directory.iterdir()) and not (directory / MARK).is_file():
        return "the folder holds other files, and the dashboard never overwrites them"
    return None


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
