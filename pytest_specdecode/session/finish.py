"""The end of a session, in plain Python: the measurements saved before any other plugin's end
can lose them (baselines, outputs, or a worker's hand-over to the controller), and naming the
plugin whose end failed.

Exit statuses are pytest's ``ExitCode`` values, as plain ints: the plugin reads and sets
pytest's through the callables it passes in. What kind of night the session was (regressed,
broken, not judged, ok: :mod:`~pytest_specdecode.session.exit_status`) is judged here, said in
the summary and the Markdown summary's first line, and returned: with
``--specdecode-exit-status nightly`` the plugin ends the session with its status.

pytest-benchmark writes no JSON when nothing was measured (every server broke): it warns "Not
saving anything, no benchmarks have been run!" (an error, and so an INTERNALERROR of the
session, under ``filterwarnings = error``) and leaves the ``--benchmark-json`` file absent
(5.3) or empty (up to 5.2, which opens it while parsing the options). For a session of the
plugin's tests, the file is written here instead, with pytest-benchmark's own hooks and no
benchmarks (:func:`_nothing_measured`).
"""

from __future__ import annotations

import inspect
import os
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pytest_specdecode.errors import SpecdecodeError
from pytest_specdecode.outputs import benchmark
from pytest_specdecode.outputs.json_report import make_session_info
from pytest_specdecode.outputs.write import write_outputs
from pytest_specdecode.result import SpecdecodeResult, TestError
from pytest_specdecode.servers.cleanup import finish_run
from pytest_specdecode.session.exit_status import Night, judge
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


def late_failure_report(
    result: SpecdecodeResult, seen: Mapping[str, tuple[str, tuple[str, int | None, str]]]
) -> dict[str, Any]:
    """The fields of the pytest report that makes ``result``'s late failure an error of its
    test: under the node id and location ``seen`` (by test id) gave it, else its test id (a
    test this process never saw: none so far)."""
    nodeid, location = seen.get(
        result.test_id, (result.test_id, (result.test_id.split("::")[0], None, ""))
    )
    return {
        "nodeid": nodeid,
        "location": location,
        "keywords": {},
        "outcome": "failed",
        "longrepr": f"{result.profile}: failed after the test had finished: {result.late_failure}",
        "when": "teardown",
        "user_properties": [("specdecode_failed_after_test", result.late_failure or "")],
    }


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
) -> Night | None:
    """Write the baselines and outputs (the controller, or a session without xdist), or make
    a worker's results ready to go up; then close the session's servers. Returns the kind of
    night the session was (None on an xdist worker, whose controller judges).

    ``worker_down``: an xdist worker went down with an error; ``benchmark_session``:
    pytest-benchmark's, if it runs; ``stops_workers_servers``: this is the xdist controller,
    which stops what its workers started.
    """
    problems: list[str] = []  # what the plugin could not write: the night is broken
    try:
        if sd.settings.update_baselines:
            sd.finish_launches()
        if sd.is_xdist_worker:
            return None  # the finally below sends the results up
        if worker_down:
            # xdist replaces a worker that crashed after its tests and exits 0; what it had
            # measured is kept (see Outbox), but a night with a crashed worker is not a pass.
            set_exit_status(INTERNAL_ERROR)
        _hand_to_benchmark(sd, benchmark_session, problems)
        if sd.settings.update_baselines:
            _write_baselines(sd, problems, set_exit_status)
        if late_failures(sd.results) and exit_status() in (OK, NO_TESTS_COLLECTED):
            # pytest passed these tests before their later launches or baseline writes
            # failed: the session fails, and the reports written below carry that status
            set_exit_status(TESTS_FAILED)
        _write_outputs(sd, exit_status, set_exit_status, pytest_args, problems)
    except SpecdecodeError as exc:
        sd.updates.append(f"ERROR: {exc}")
        problems.append(str(exc))
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
        _close_servers(sd, outbox, workeroutput, stops_workers_servers)
    if sd.is_xdist_worker:
        return None
    night = judge(
        sd.results,
        pytest_status=exit_status(),
        problems=problems,
        nightly=sd.settings.exit_status == "nightly",
    )
    if sd.results or night.nightly:  # a session without the plugin's tests is not a night
        sd.output_lines.append(f"night: {night.headline()}")
    return night


def _write_outputs(
    sd: SpecdecodeSession,
    exit_status: Callable[[], int],
    set_exit_status: Callable[[int], None],
    pytest_args: Sequence[str],
    problems: list[str],
) -> None:
    """The JSON report, history line and Markdown summary (controller or single process);
    what could not be written is added to ``problems``."""
    results = sd.results
    info = make_session_info(
        started=sd.started,
        finished=datetime.now(timezone.utc),
        target=sd.target_if_loaded,
        pytest_args=list(pytest_args),
        exit_status=exit_status(),
        run_id=sd.run_id,
        hardware_keys=[r.hardware_key for r in results],
        warnings=sd.warnings,
        failed_after_tests=[(r.test_id, r.late_failure or "") for r in late_failures(results)],
    )

    def headline(errors: Sequence[str]) -> tuple[str, str]:
        """The night as the Markdown summary's first lines say it (kind, why), the outputs'
        errors so far included."""
        night = judge(
            results,
            pytest_status=exit_status(),
            problems=[*problems, *errors],
            nightly=sd.settings.exit_status == "nightly",
        )
        return night.title(), night.why()

    written, errors = write_outputs(
        results,
        settings=sd.settings,
        session_info=info,
        env=os.environ,
        night=headline,
        warnings=sd.warnings,
    )
    sd.output_lines.extend(written)
    if errors:
        sd.output_lines.extend(f"ERROR: {error}" for error in errors)
        problems.extend(errors)
        set_exit_status(TESTS_FAILED)


def _nothing_measured(benchmark_session: Any, lines: list[str]) -> list[str]:
    """pytest-benchmark's ``--benchmark-json`` when no run was measured (see the module
    docstring): the file is written with no benchmarks, through pytest-benchmark's own hooks,
    and ``--benchmark-save``/``--benchmark-autosave`` save nothing (an empty saved run would be
    what ``--benchmark-compare`` compares with next), so that pytest-benchmark has nothing left
    to warn about. Says so in ``lines``; returns the errors (a file that could not be
    written). A disabled pytest-benchmark (under xdist) is left alone."""
    bs = benchmark_session
    if getattr(bs, "disabled", False):
        return []
    errors: list[str] = []
    target = getattr(bs, "json", None)
    if target:
        # a path from pytest-benchmark 5.3, an open file (its name) up to 5.2
        shown = target if isinstance(target, str | os.PathLike) else getattr(target, "name", "?")
        hook, config = bs.config.hook, bs.config
        try:
            machine_info = bs.get_machine_info()
            commit_info = hook.pytest_benchmark_generate_commit_info(config=config)
            hook.pytest_benchmark_update_commit_info(config=config, commit_info=commit_info)
            output = hook.pytest_benchmark_generate_json(
                config=config,
                benchmarks=[],
                include_data=True,
                machine_info=machine_info,
                commit_info=commit_info,
            )
            hook.pytest_benchmark_update_json(config=config, benchmarks=[], output_json=output)
            bs.save_json(output)
        except OSError as exc:
            errors.append(f"could not write the pytest-benchmark JSON to {shown}: {exc}")
            lines.append(f"ERROR: {errors[-1]}")
        else:
            lines.append(f"pytest-benchmark JSON: {shown} (no benchmarks: nothing was measured)")
    if getattr(bs, "save", None) or getattr(bs, "autosave", None):
        lines.append("pytest-benchmark: no run saved, nothing was measured")
    bs.json = bs.save = bs.autosave = None
    return errors


def _hand_to_benchmark(
    sd: SpecdecodeSession, benchmark_session: object | None, problems: list[str]
) -> None:
    """The results, kept by the session for the summary and outputs, are handed to
    pytest-benchmark (when it runs and exports) before its own hook writes its JSON."""
    if benchmark_session is None or not benchmark.wants_export(benchmark_session):
        return
    for result in sd.results:
        benchmark.add_result(benchmark_session, result)
    if sd.results and not getattr(benchmark_session, "benchmarks", True):
        problems.extend(_nothing_measured(benchmark_session, sd.output_lines))


def _write_baselines(
    sd: SpecdecodeSession, problems: list[str], set_exit_status: Callable[[int], None]
) -> None:
    """``--update-baselines``: the recorded results become baselines; one that cannot be written
    is an error of the session."""
    updates, errors = sd.write_baselines(sd.results)
    for update in updates:
        sd.updates.extend(update.describe())
    if errors:
        sd.updates.extend(f"ERROR: {error}" for error in errors)
        problems.extend(errors)
        set_exit_status(TESTS_FAILED)


def _close_servers(
    sd: SpecdecodeSession,
    outbox: Outbox,
    workeroutput: dict[str, Any],
    stops_workers_servers: bool,
) -> None:
    """Close the session's servers; a worker hands up what its last launches measured."""
    sd.close()
    if sd.is_xdist_worker:
        # What the teardown reports have not carried up: results of the profiles whose
        # remaining baseline launches ran just now.
        workeroutput.update(worker_output(sd, outbox))
        return
    sd.servers.add(sd.pool.counts)
    # The xdist controller (DSession) stops what its workers started; without -n, sd.close()
    # above already did.
    if stops_workers_servers:
        stopped = finish_run(
            sd.settings.state_dir,
            sd.run_id,
            keep_alive=sd.settings.keep_server,
            on_event=sd.emit,
        )
        sd.servers.add(stopped)


class PluginRegistry(Protocol):
    """What is asked of pytest's plugin manager (pluggy's) to name a plugin that failed."""

    def list_plugin_distinfo(self) -> list[tuple[Any, Any]]: ...

    def list_name_plugin(self) -> list[tuple[str, Any]]: ...


def other_plugin_failed_line(
    exc: BaseException, registry: PluginRegistry, *, status: int = INTERNAL_ERROR
) -> str:
    """The line that says another plugin's ``pytest_sessionfinish`` raised ``exc`` and fails the
    session with ``status``; ``registry`` names the installed plugins (and their distributions)
    and every registered one."""
    distributions = [
        (plugin, f"{dist.project_name} {dist.version}")
        for plugin, dist in registry.list_plugin_distinfo()
    ]
    plugins = registry.list_name_plugin()
    return (
        f"ERROR: {failed_hook(exc, distributions=distributions, plugins=plugins)}, so this "
        f"session fails (exit status {status}). pytest-specdecode wrote its baselines "
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
