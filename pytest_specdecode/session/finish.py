"""The end of a session, in plain Python: the measurements saved before any other plugin's end
can lose them (baselines, outputs, or a worker's hand-over to the controller), and naming the
plugin whose end failed.

Exit statuses are pytest's ``ExitCode`` values, as plain ints: the plugin reads and sets
pytest's through the callables it passes in.
"""

from __future__ import annotations

import inspect
import os
import traceback
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_specdecode.errors import SpecdecodeError
from pytest_specdecode.outputs import benchmark
from pytest_specdecode.outputs.json_report import make_session_info
from pytest_specdecode.outputs.write import write_outputs
from pytest_specdecode.result import SpecdecodeResult, TestError
from pytest_specdecode.servers.cleanup import finish_run
from pytest_specdecode.session.worker_relay import Outbox, worker_output

if TYPE_CHECKING:
    from pytest_specdecode.session.orchestrator import SpecdecodeSession

OK = 0  # pytest.ExitCode.OK
TESTS_FAILED = 1  # pytest.ExitCode.TESTS_FAILED
INTERRUPTED = 2  # pytest.ExitCode.INTERRUPTED
INTERNAL_ERROR = 3  # pytest.ExitCode.INTERNAL_ERROR
NO_TESTS_COLLECTED = 5  # pytest.ExitCode.NO_TESTS_COLLECTED


def late_failures(results: Sequence[SpecdecodeResult]) -> list[SpecdecodeResult]:
    """The results that fail the session although pytest had reported their tests: a later
    baseline launch refused or failed, a baseline that could not be written."""
    return [result for result in results if result.late_failure]


def save_measurements(
    sd: SpecdecodeSession,
    *,
    exit_status: Callable[[], int],
    set_exit_status: Callable[[int], None],
    pytest_args: Sequence[str],
    worker_down: bool,
    benchmark_session: object | None,
    outbox: Outbox,
    workeroutput: dict[str, Any],
    stops_workers_servers: bool,
) -> None:
    """Write the baselines and outputs (the controller, or a session without xdist), or make
    a worker's results ready to go up; then close the session's servers.

    ``worker_down``: an xdist worker went down with an error; ``benchmark_session``:
    pytest-benchmark's, if it runs; ``stops_workers_servers``: this is the xdist controller,
    which stops what its workers started.
    """
    try:
        if sd.settings.update_baselines:
            sd.finish_launches()
        if sd.is_xdist_worker:
            return  # the finally below sends the results up
        if worker_down:
            # xdist replaces a worker that crashed after its tests and exits 0; what it had
            # measured is kept (see Outbox), but a night with a crashed worker is not a pass.
            set_exit_status(INTERNAL_ERROR)
        if benchmark_session is not None and benchmark.wants_export(benchmark_session):
            # the results, kept by the session for the summary and outputs, are handed to
            # pytest-benchmark before its own hook writes its JSON
            for result in sd.results:
                benchmark.add_result(benchmark_session, result)
        if sd.settings.update_baselines:
            updates, errors = sd.write_baselines(sd.results)
            for update in updates:
                sd.updates.extend(update.describe())
            if errors:
                sd.updates.extend(f"ERROR: {error}" for error in errors)
                set_exit_status(TESTS_FAILED)
        if late_failures(sd.results) and exit_status() in (OK, NO_TESTS_COLLECTED):
            # pytest passed these tests before their later launches or baseline writes
            # failed: the session fails, and the reports written below carry that status
            set_exit_status(TESTS_FAILED)
        _write_outputs(sd, exit_status(), set_exit_status, pytest_args)
    except SpecdecodeError as exc:
        sd.updates.append(f"ERROR: {exc}")
        set_exit_status(TESTS_FAILED)
    except KeyboardInterrupt:
        # Ctrl-C (or SIGTERM) while the files are written: every writer replaces its file
        # atomically or appends one line at once, so what is on disk is whole; end like any
        # interrupted session, with a line, not a traceback from inside pytest's own finally.
        sd.output_lines.append(
            "ERROR: interrupted (Ctrl-C or SIGTERM) while writing the baselines and reports: what "
            "was not written yet is skipped; every file is either complete or as it was before"
        )
        set_exit_status(INTERRUPTED)
    finally:
        sd.close()
        if sd.is_xdist_worker:
            # What the teardown reports have not carried up: results of the profiles whose
            # remaining baseline launches ran just now.
            workeroutput.update(worker_output(sd, outbox))
        else:
            sd.servers.add(sd.pool.counts)
        # The xdist controller (DSession) stops what its workers started; without -n, sd.close()
        # above already did.
        if stops_workers_servers and not sd.is_xdist_worker:
            stopped = finish_run(
                sd.settings.state_dir,
                sd.run_id,
                keep_alive=sd.settings.keep_server,
                on_event=sd.emit,
            )
            sd.servers.add(stopped)


def _write_outputs(
    sd: SpecdecodeSession,
    status: int,
    set_exit_status: Callable[[int], None],
    pytest_args: Sequence[str],
) -> None:
    """The JSON report, history line and Markdown summary (controller or single process)."""
    results = sd.results
    info = make_session_info(
        started=sd.started,
        finished=datetime.now(timezone.utc),
        target=sd.target_if_loaded,
        pytest_args=list(pytest_args),
        exit_status=status,
        run_id=sd.run_id,
        hardware_keys=[r.hardware_key for r in results],
        warnings=sd.warnings,
        failed_after_tests=[(r.test_id, r.late_failure or "") for r in late_failures(results)],
    )
    written, errors = write_outputs(
        results, settings=sd.settings, session_info=info, env=os.environ
    )
    sd.output_lines.extend(written)
    if errors:
        sd.output_lines.extend(f"ERROR: {error}" for error in errors)
        set_exit_status(TESTS_FAILED)


def other_plugin_failed_line(
    exc: BaseException,
    *,
    distributions: Iterable[tuple[object, str]],
    plugins: Iterable[tuple[str, object]],
) -> str:
    """The line that says another plugin's ``pytest_sessionfinish`` raised ``exc`` and fails the
    session; ``distributions``: (plugin, "name version") of the installed plugins,
    ``plugins``: (registered name, plugin) of all."""
    return (
        f"ERROR: {failed_hook(exc, distributions=distributions, plugins=plugins)}, so this "
        f"session fails (exit status {INTERNAL_ERROR}). pytest-specdecode wrote its baselines "
        "and reports before that hook ran (listed above); fix what the traceback above names, "
        "or run without that plugin"
    )


def failed_hook(
    exc: BaseException,
    *,
    distributions: Iterable[tuple[object, str]],
    plugins: Iterable[tuple[str, object]],
) -> str:
    """Whose ``pytest_sessionfinish`` raised ``exc``: the innermost frame of that name in its
    traceback, named by the distribution that installed the plugin (as pytest's header lists
    plugins), else the plugin's registered name, else the file."""
    frames = [
        f for f in traceback.extract_tb(exc.__traceback__) if f.name == "pytest_sessionfinish"
    ]
    first = TestError.of("sessionfinish", exc)
    what = f"{first.type}: {first.cause}"
    if not frames:
        return f"another plugin's pytest_sessionfinish raised {what}"
    frame = frames[-1]
    where = Path(frame.filename).resolve()
    owner: str | None = None
    for plugin, dist in distributions:
        if _plugin_file(plugin) == where:
            owner = dist
    if owner is None:
        owner = next(
            (
                f"plugin {name!r}"
                for name, plugin in plugins
                if plugin is not None and _plugin_file(plugin) == where
            ),
            "a plugin",
        )
    return f"pytest_sessionfinish of {owner} ({frame.filename}:{frame.lineno}) raised {what}"


def _plugin_file(plugin: object) -> Path | None:
    try:
        source = inspect.getfile(plugin if inspect.ismodule(plugin) else type(plugin))
    except TypeError:  # a built-in
        return None
    return Path(source).resolve()
