"""pytest wiring for pytest-specdecode, and nothing else.

Options and ini keys come from :data:`pytest_specdecode.settings.OPTIONS`; the marker is parsed
by :mod:`pytest_specdecode.markers`; servers, measurement and verdicts live in
:mod:`pytest_specdecode.session`. This module turns their errors into pytest outcomes.
"""

from __future__ import annotations

import inspect
import os
import signal
import sys
import threading
import time
import traceback
import uuid
import warnings
from collections import Counter
from collections.abc import Generator, Iterator
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NoReturn

import pytest

from pytest_specdecode.errors import ConfigError, SpecdecodeError
from pytest_specdecode.markers import MARKER_HELP, MarkerSpec, parse_marker
from pytest_specdecode.outputs import benchmark, terminal
from pytest_specdecode.outputs.history import read_history
from pytest_specdecode.outputs.json_report import junit_properties, make_session_info
from pytest_specdecode.outputs.write import write_outputs
from pytest_specdecode.profiles.profile import ALGORITHM_MARKERS
from pytest_specdecode.redaction import redact_url
from pytest_specdecode.result import SpecdecodeResult, TestError
from pytest_specdecode.servers.cleanup import finish_run
from pytest_specdecode.servers.handle import ServerCounts, ServerHandle
from pytest_specdecode.servers.readiness import Progress
from pytest_specdecode.session import SpecdecodeSession, SpecdecodeTest
from pytest_specdecode.settings import OPTIONS, Settings, project_test_id, resolve
from pytest_specdecode.verdict import Outcome

SESSION_KEY = pytest.StashKey[SpecdecodeSession]()
SPEC_KEY = pytest.StashKey[MarkerSpec]()
TEST_KEY = pytest.StashKey[SpecdecodeTest]()
NODEID_KEY = pytest.StashKey[str]()  # the test id before xdist's loadgroup adds "@group"
NEXT_SERVER_KEY = pytest.StashKey[str | None]()  # the profile this process's next test needs
CAUSE_KEY = pytest.StashKey[BaseException]()  # the error a test failed with, before _fail hid it
JUDGED_KEY = pytest.StashKey[bool]()  # the verdict is being applied: a failure now is the verdict
ROW_KEY = pytest.StashKey[SpecdecodeResult]()  # the ERROR row of a test that errored
OUTBOX_KEY = pytest.StashKey["_Outbox"]()  # an xdist worker's results not yet sent up
SUMMARY_KEY = pytest.StashKey[bool]()  # the specdecode section of the terminal summary was shown
WORKER_DOWN_KEY = pytest.StashKey[bool]()  # an xdist worker went down with an error

RESULTS_ATTR = "specdecode_results"
"""The attribute of a worker's teardown report that carries its results to the controller."""


class SpecdecodeWarning(pytest.PytestWarning):
    """A soft problem: an inconclusive verdict passed by policy, a soft fingerprint change."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup(
        "specdecode", "performance-regression tests of speculative-decoding servers"
    )
    for option in OPTIONS:
        default = "" if option.default is None else f" (default: {option.default})"
        # argparse %-formats command-line help ("8%" would crash `pytest --help`); ini help
        # is printed as it is.
        cli_help = (option.help + ("" if option.is_flag else default)).replace("%", "%%")
        if option.is_flag:
            group.addoption(
                option.flag,
                action="store_true",
                dest=f"specdecode_{option.name}",
                default=None,
                help=cli_help,
            )
        else:
            group.addoption(
                option.flag,
                dest=f"specdecode_{option.name}",
                metavar=option.metavar,
                default=None,
                help=cli_help,
            )
        if option.ini:
            parser.addini(option.ini_key, option.help + default, default=None)


def _settings(config: pytest.Config) -> Settings:
    ini_dir = config.inipath.parent if config.inipath else config.rootpath
    try:
        return resolve(
            cli={o.name: config.getoption(f"specdecode_{o.name}") for o in OPTIONS},
            ini={o.name: config.getini(o.ini_key) if o.ini else None for o in OPTIONS},
            env=os.environ,
            invocation_dir=config.invocation_params.dir,
            ini_dir=ini_dir,
            ini_file=str(config.inipath or "the ini file"),
            # Without an ini file the rootdir is wherever the run starts: find the project.
            search_from=None if config.inipath else config.rootpath,
        )
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_HELP)
    for name in ALGORITHM_MARKERS:
        config.addinivalue_line(
            "markers",
            f"{name}: tests whose server profile uses {name} "
            "(added automatically by pytest-specdecode)",
        )
    settings = _settings(config)
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    if workerinput is None:
        _check_benchmark_json(config)
    if workerinput is not None:
        worker = str(workerinput.get("workerid", "gw"))
        run_id = str(workerinput.get("specdecode_run_id") or workerinput.get("testrunuid"))
        if workerinput.get("specdecode_loadgroup"):
            # The controller schedules by group (see pytest_xdist_make_scheduler), but a worker
            # tags node ids with their xdist_group only under --dist loadgroup; without the tag
            # every test is its own group and profiles are spread over all workers.
            config.option.loadgroup = True
    else:
        worker, run_id = "main", uuid.uuid4().hex
    session = SpecdecodeSession(
        settings,
        run_id=run_id,
        worker=worker,
        is_xdist_worker=workerinput is not None,
        log_dir=_LazyLogDir(config),  # type: ignore[arg-type]
        rootdir=config.rootpath,
        emit=lambda message: _say(config, f"specdecode: {message}"),
        progress=_ProgressLine(config),
    )
    config.stash[SESSION_KEY] = session
    if settings.history is not None and settings.history.exists():
        # Earlier nights sharpen each test's launch-to-launch variance (launches.prior_for).
        try:
            session.history = read_history(
                settings.history, on_bad_line=lambda exc: session.warnings.append(str(exc))
            )
        except SpecdecodeError as exc:
            session.warnings.append(f"{exc}; the launch variance uses the baselines alone")
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_XdistHooks(session), "specdecode-xdist")
    _terminate_gracefully()


def _check_benchmark_json(config: pytest.Config) -> None:
    """A --benchmark-json path that cannot be written is a usage error now, not after the
    measurements (pytest-benchmark 5.3 checks it only when it writes: benchmark.check_json_path)."""
    flag = "--benchmark-json"
    value = config.getoption("benchmark_json", None)
    if value is None:
        return
    args = [str(arg) for arg in config.invocation_params.args]
    if any(arg == flag or arg.startswith(f"{flag}=") for arg in args):
        source = f"{flag} on the command line"
    elif flag in os.environ.get("PYTEST_ADDOPTS", ""):
        source = f"{flag} in PYTEST_ADDOPTS"
    elif config.inipath is not None:
        source = f"{flag} in addopts of {config.inipath}"
    else:
        source = flag
    try:
        benchmark.check_json_path(value, base=config.invocation_params.dir, source=source)
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None


def _session(config: pytest.Config) -> SpecdecodeSession:
    return config.stash[SESSION_KEY]


class _LazyLogDir(os.PathLike[str]):
    """Server logs go under pytest's basetemp, created only when a server is launched."""

    def __init__(self, config: pytest.Config) -> None:
        self._config = config
        self._path: Path | None = None

    def _resolve(self) -> Path:
        if self._path is None:
            factory = getattr(self._config, "_tmp_path_factory", None)
            base = factory.getbasetemp() if factory else Path.cwd() / ".specdecode-logs"
            self._path = Path(base) / "specdecode-logs"
            self._path.mkdir(parents=True, exist_ok=True)
        return self._path

    def __fspath__(self) -> str:
        return str(self._resolve())

    def __truediv__(self, other: str) -> Path:
        return self._resolve() / other


def _say(config: pytest.Config, line: str) -> None:
    """A line on the terminal even while output is captured (as pytest's live logging does)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    # write_line starts a new line only after a test's file name; after the final "[100%]"
    # (where session-end lines such as "left running" come) it would continue that line.
    writer = getattr(reporter, "_tw", None)
    if not reporter.currentfspath and writer is not None and writer.width_of_current_line:
        line = "\n" + line
    capman = config.pluginmanager.get_plugin("capturemanager")
    if capman is not None:
        with capman.global_and_fixture_disabled():
            reporter.write_line(line)
    else:
        reporter.write_line(line)


class _ProgressLine:
    """The seed's "Still loading... 180s", done properly: elapsed time and the phase read from
    the log, on a phase change and every 30 s (every 5 s on a terminal)."""

    def __init__(self, config: pytest.Config) -> None:
        self._config = config
        self._last: tuple[str, str] = ("", "")
        self._last_time = 0.0

    def __call__(self, progress: Progress) -> None:
        reporter = self._config.pluginmanager.get_plugin("terminalreporter")
        interval = 5.0 if reporter is not None and reporter.isatty else 30.0
        key = (progress.name, progress.phase)
        now = time.monotonic()
        if key == self._last and now - self._last_time < interval:
            return
        if progress.phase == "ready":
            return  # the log says so a moment before the health probe does; "ready after" follows
        if progress.elapsed < 1.0 and key[1] in ("starting", "waiting"):
            return  # a fast server needs no progress line
        self._last, self._last_time = key, now
        _say(
            self._config,
            f"specdecode: {progress.name} loading... {progress.elapsed:.0f}s "
            f"(timeout {progress.timeout:.0f}s), phase: {progress.phase}",
        )


def _terminate_gracefully() -> None:
    """SIGTERM (a cancelled CI job) takes pytest's Ctrl-C path, so servers are stopped."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:

        def handler(signum: int, frame: object) -> None:
            raise KeyboardInterrupt(f"signal {signum}")

        signal.signal(signal.SIGTERM, handler)


def pytest_report_header(config: pytest.Config) -> list[str]:
    settings = _session(config).settings
    if not settings.config.exists():
        return []
    session = _session(config)
    try:
        target = session.target
    except SpecdecodeError as exc:
        raise pytest.UsageError(str(exc)) from None
    lines = [
        f"specdecode: profiles {settings.config} ({settings.config_source}), target {target} "
        f"({session.target_reason}), baselines {settings.baselines}"
    ]
    if settings.server_host:
        shown = redact_url(settings.server_host)  # a password in the URL stays off the screen
        lines.append(f"specdecode: measuring the server at {shown} (attached)")
    if settings.update_baselines:
        lines.append("specdecode: --update-baselines: measured runs become the new baselines")
    lines.extend(f"specdecode: warning: {warning}" for warning in session.warnings)
    return lines


# -- collection ----------------------------------------------------------------------------


def _server_param(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    value = callspec.params.get("specdecode_server") if callspec is not None else None
    return value if isinstance(value, str) else None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Parse markers, add the algorithm markers (before ``-m`` deselects), group by profile."""
    session = _session(config)
    xdist = config.pluginmanager.hasplugin("xdist")
    order: dict[str, int] = {}
    demand: Counter[str] = Counter()
    for item in items:
        marker = item.get_closest_marker("specdecode")
        param = _server_param(item)
        if marker is None and param is None:
            continue
        try:
            spec = parse_marker(marker.args, marker.kwargs, where=item.nodeid) if marker else None
            spec = spec or MarkerSpec(server=None)
            server = param or spec.server
            if server is None:
                raise ConfigError(
                    f"{item.nodeid} uses specdecode but names no server profile: "
                    "write @pytest.mark.specdecode('PROFILE', ...)"
                )
            profile = session.profile(server, where=item.nodeid)
            for reference in spec.references:
                session.profile(reference, where=f"{item.nodeid} (against=)")
            workload = session.workload(spec.workload, where=item.nodeid)
        except SpecdecodeError as exc:
            raise pytest.UsageError(str(exc)) from None
        item.stash[SPEC_KEY] = replace(spec, server=server)
        item.stash[NODEID_KEY] = project_test_id(
            item.nodeid, item.path, config.rootpath, session.settings.project_root
        )
        session.note_collected(item.stash[NODEID_KEY], profile.name, workload)
        item.add_marker(profile.algorithm_marker)
        order.setdefault(profile.name, len(order))
        demand[profile.name] += 1
    try:
        session.place(demand)  # the profiles' hosts, when the profile file has [hosts.NAME]
    except SpecdecodeError as exc:
        raise pytest.UsageError(str(exc)) from None
    if not session.is_xdist_worker:
        for line in session.placement_lines():
            _say(config, f"specdecode: placed on {line}")
    if xdist:
        # One group per profile, or per host when placed: one worker takes a host's profiles
        # in turn (one server per box at a time), different hosts run on different workers.
        for item in items:
            spec = item.stash.get(SPEC_KEY, None)
            if spec is not None and spec.server is not None:
                item.add_marker(pytest.mark.xdist_group(session.group_of(spec.server)))

    def key(indexed: tuple[int, pytest.Item]) -> tuple[int, int, int]:
        index, item = indexed
        spec = item.stash.get(SPEC_KEY, None)
        if spec is None or spec.server is None:
            return (0, 0, index)
        return (1, order[spec.server], index)

    items[:] = [item for _, item in sorted(enumerate(items), key=key)]


def pytest_collection_finish(session: pytest.Session) -> None:
    demand = Counter(
        spec.server
        for item in session.items
        if (spec := item.stash.get(SPEC_KEY, None)) is not None and spec.server
    )
    sd = _session(session.config)
    sd.pool.set_demand(None if sd.is_xdist_worker else demand, hosts=sd.host_of)
    sd.plan(list(demand.elements()))
    sd.note_selected([item.stash[NODEID_KEY] for item in session.items if NODEID_KEY in item.stash])


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def specdecode_session(pytestconfig: pytest.Config) -> SpecdecodeSession:
    """The plugin's session object: profiles, the server pool, the baseline store."""
    return _session(pytestconfig)


@pytest.fixture
def specdecode_server(request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    """A ready server for the test's profile (from its marker, or ``indirect`` parametrize)."""
    session = _session(request.config)
    spec = request.node.stash.get(SPEC_KEY, None)
    name = getattr(request, "param", None) or (spec.server if spec else None)
    if not name:
        pytest.fail(
            "specdecode_server needs a profile: mark the test with "
            "@pytest.mark.specdecode('PROFILE') or parametrize specdecode_server indirectly",
            pytrace=False,
        )
    try:
        profile = session.profile(name, where=request.node.nodeid)
        handle = session.server_for(profile)
    except SpecdecodeError as exc:
        request.node.stash[CAUSE_KEY] = exc  # its type and first line make the ERROR row
        _fail(str(exc))
    try:
        yield handle
    finally:
        # Keep the lease when the next test needs the same server, so that no other process
        # waiting for these GPUs stops it in the gap between the two tests.
        session.release(profile, hold=request.node.stash.get(NEXT_SERVER_KEY, None) == name)


@pytest.fixture
def specdecode(request: pytest.FixtureRequest, specdecode_server: ServerHandle) -> SpecdecodeTest:
    """The test's measurement: ``specdecode.measure()`` returns the runs and the verdict."""
    spec = request.node.stash.get(SPEC_KEY, None) or MarkerSpec(
        server=specdecode_server.profile.name
    )
    test_id = request.node.stash.get(NODEID_KEY, request.node.nodeid)
    test = SpecdecodeTest(_session(request.config), test_id, spec, specdecode_server)
    request.node.stash[TEST_KEY] = test
    return test


@pytest.fixture(autouse=True)
def _specdecode_autouse(request: pytest.FixtureRequest) -> None:
    if SPEC_KEY in request.node.stash:
        request.getfixturevalue("specdecode")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Remember which server the next test of this process needs (for its release); give back
    leases kept for this test if it does not need them."""
    spec = nextitem.stash.get(SPEC_KEY, None) if nextitem is not None else None
    item.stash[NEXT_SERVER_KEY] = spec.server if spec is not None else None
    own = item.stash.get(SPEC_KEY, None)
    _session(item.config).pool.drop_holds(keep=own.server if own is not None else None)


def _fail(message: str) -> NoReturn:
    """Fail the test with ``message`` alone: no traceback, and no chained exception that would
    print the same server error (and its log tail) a second time."""
    __tracebackhide__ = True
    raise pytest.fail.Exception(message, pytrace=False) from None


# -- the verdict ---------------------------------------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    result = yield
    test = item.stash.get(TEST_KEY, None)
    if test is None:
        return result
    try:
        measured = test.measure()
    except SpecdecodeError as exc:
        item.stash[CAUSE_KEY] = exc
        _fail(str(exc))
    # JUnit XML shows these beside the test (user_properties travel with xdist reports too).
    item.user_properties.extend(junit_properties(measured))
    item.stash[JUDGED_KEY] = True
    _apply_outcome(item, test, measured)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A test that errors becomes a row of every report; on an xdist worker, the teardown report
    carries the results finished since the last one to the controller."""
    report = yield
    sd = _session(item.config)
    if report.failed and SPEC_KEY in item.stash:
        _note_error(sd, item, report.when, call)
    if sd.is_xdist_worker and report.when == "teardown":
        # Sent as each test finishes, not only at the end: a worker whose end of session fails
        # (another plugin's hook, a crash) has already handed over what it measured.
        outgoing = item.config.stash.setdefault(OUTBOX_KEY, _Outbox()).take(sd.results)
        if outgoing:
            setattr(report, RESULTS_ATTR, outgoing)  # xdist serialises a report's attributes
    return report


def _note_error(sd: SpecdecodeSession, item: pytest.Item, phase: str, call: Any) -> None:
    """Record why ``item`` failed in ``phase``, unless the failure is its verdict."""
    if phase == "call" and item.stash.get(JUDGED_KEY, False):
        return  # FAIL, MISMATCH or a policy's failure: the result says so already
    cause = item.stash.get(CAUSE_KEY, None)
    exc = cause if cause is not None else (call.excinfo.value if call.excinfo else None)
    if exc is None:
        return  # e.g. a strict xfail that passed: no exception to name
    error = TestError.of(phase, exc)
    test = item.stash.get(TEST_KEY, None)
    if test is not None and test.result is not None:
        # Judged, then failed (an assertion after specdecode.measure(), a teardown): the
        # verdict stays the outcome, the error is shown beside it.
        if test.result.error is None:
            test.result.error = error
            # pytest's JUnit XML reads the teardown report's properties, taken from the item
            item.user_properties.append(("specdecode_error", error.describe()))
        return
    if ROW_KEY in item.stash:
        return  # the first error is the cause; a teardown failing after it adds nothing
    spec = item.stash[SPEC_KEY]
    nodeid = item.stash.get(NODEID_KEY, item.nodeid)
    profile = sd.profile(spec.server or "", where=nodeid)  # both checked at collection
    workload = sd.workload(spec.workload, where=nodeid)
    row = SpecdecodeResult.errored(
        nodeid,
        profile=profile.name,
        simulated=profile.simulated,
        hardware_key=sd.hardware_key(profile.simulated, profile),
        workload_name=workload.name,
        workload_hash=workload.content_hash(),
        fingerprint=profile.fingerprint(),
        error=error,
        server_origin="attached" if sd.settings.server_host else "launched",
        host=profile.placed_on,
    )
    item.stash[ROW_KEY] = row
    sd.results.append(row)
    item.user_properties.extend(junit_properties(row))


class _Outbox:
    """What an xdist worker has sent up, so each teardown report carries only what is new or
    changed (a baseline's later launches add runs to a result already sent)."""

    def __init__(self) -> None:
        self._sent: dict[int, dict[str, Any]] = {}

    def take(self, results: list[SpecdecodeResult]) -> list[dict[str, Any]]:
        outgoing = []
        for index, result in enumerate(results):
            data = result.to_json()
            if self._sent.get(index) != data:
                self._sent[index] = data
                outgoing.append({"index": index, "result": data})
        return outgoing


def _record(config: pytest.Config, result: SpecdecodeResult) -> None:
    """Hand a result (kept by the session for the summary and outputs) to pytest-benchmark."""
    benchmark_session = getattr(config, "_benchmarksession", None)
    if benchmark_session is not None and benchmark.wants_export(benchmark_session):
        benchmark.add_result(benchmark_session, result)


def _apply_outcome(item: pytest.Item, test: SpecdecodeTest, result: SpecdecodeResult) -> None:
    settings = _session(item.config).settings
    outcome = result.outcome
    text = f"{result.profile}: {result.message}"
    if outcome in (Outcome.FAIL, Outcome.MISMATCH):
        pytest.fail(text, pytrace=False)
    if outcome is Outcome.NO_BASELINE:
        policy = test.spec.on_missing_baseline or settings.on_missing_baseline
        if policy == "fail":
            pytest.fail(text, pytrace=False)
        # Reported at the test's location (as a skip marker is), not at this line.
        raise pytest.skip.Exception(text, _use_item_location=True)
    if outcome is Outcome.INCONCLUSIVE:
        policy = test.spec.on_inconclusive or settings.on_inconclusive
        if policy == "fail":
            pytest.fail(text, pytrace=False)
        if policy == "xfail":
            pytest.xfail(text)
        _warn(item, f"inconclusive, passed by policy: {text}")
    if result.message:
        # A test that passes keeps its verdict's text too (the bounds, the MDE, what the
        # interval left out): `-rP` / `-rA` show it under PASSES, as pytest shows captured output.
        item.add_report_section("call", "specdecode verdict", text)
    for warning in result.warnings:
        _warn(item, warning)


def _warn(item: pytest.Item, message: str) -> None:
    """A :class:`SpecdecodeWarning` attributed to the test's file and line, not the plugin's."""
    path, lineno, _ = item.reportinfo()
    warnings.warn_explicit(
        SpecdecodeWarning(message),
        SpecdecodeWarning,
        filename=str(path),
        lineno=(lineno or 0) + 1,
    )


# -- end of session ------------------------------------------------------------------------


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> Generator[None, None, None]:
    """Save the measurements before any other plugin's ``pytest_sessionfinish`` runs (this is
    the outermost wrapper), so that another plugin's failure there cannot lose them (#12): the
    baselines and reports are written, or a worker's results are on their way to the
    controller. Such a failure then fails the session with a line naming it, instead of a
    crash that also swallows the summary."""
    sd = _session(session.config)
    _save_measurements(session, sd)
    try:
        return (yield)
    except Exception as exc:
        if sd.is_xdist_worker:
            raise  # its results went up before; the worker's end is xdist's to report
        _other_plugin_failed(session, sd, exc)
        return None


def _save_measurements(session: pytest.Session, sd: SpecdecodeSession) -> None:
    config = session.config
    try:
        if sd.settings.update_baselines:
            sd.finish_launches()
        if sd.is_xdist_worker:
            return  # the finally below sends the results up
        if config.stash.get(WORKER_DOWN_KEY, False):
            # xdist replaces a worker that crashed after its tests and exits 0; what it had
            # measured is kept (see _Outbox), but a night with a crashed worker is not a pass.
            session.exitstatus = pytest.ExitCode.INTERNAL_ERROR
        for result in sd.results:
            _record(config, result)  # before pytest-benchmark's own hook writes its JSON
        if sd.settings.update_baselines:
            updates, errors = sd.write_baselines(sd.results)
            for update in updates:
                sd.updates.extend(update.describe())
            if errors:
                sd.updates.extend(f"ERROR: {error}" for error in errors)
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
        _write_outputs(session, sd)
    except SpecdecodeError as exc:
        sd.updates.append(f"ERROR: {exc}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    except KeyboardInterrupt:
        # Ctrl-C (or SIGTERM) while the files are written: every writer replaces its file
        # atomically or appends one line at once, so what is on disk is whole; end like any
        # interrupted session, with a line, not a traceback from inside pytest's own finally.
        sd.output_lines.append(
            "ERROR: interrupted (Ctrl-C or SIGTERM) while writing the baselines and reports: what "
            "was not written yet is skipped; every file is either complete or as it was before"
        )
        session.exitstatus = pytest.ExitCode.INTERRUPTED
    finally:
        sd.close()
        if sd.is_xdist_worker:
            # What the teardown reports have not carried up: results of the profiles whose
            # remaining baseline launches ran just now.
            workeroutput: dict[str, Any] = getattr(config, "workeroutput", {})
            outbox = config.stash.setdefault(OUTBOX_KEY, _Outbox())
            workeroutput["specdecode_results"] = outbox.take(sd.results)
            workeroutput["specdecode_servers"] = sd.pool.counts.to_json()
            workeroutput["specdecode_placement"] = sd.placement_lines()
        else:
            sd.servers.add(sd.pool.counts)
        # The xdist controller (DSession) stops what its workers started; without -n, sd.close()
        # above already did.
        if config.pluginmanager.hasplugin("dsession") and not sd.is_xdist_worker:
            stopped = finish_run(
                sd.settings.state_dir,
                sd.run_id,
                keep_alive=sd.settings.keep_server,
                on_event=lambda message: _say(config, f"specdecode: {message}"),
            )
            sd.servers.add(stopped)


def _write_outputs(session: pytest.Session, sd: SpecdecodeSession) -> None:
    """The JSON report, history line and Markdown summary (controller or single process)."""
    config = session.config
    results = sd.results
    info = make_session_info(
        started=sd.started,
        finished=datetime.now(timezone.utc),
        target=sd.target_if_loaded,
        pytest_args=[str(arg) for arg in config.invocation_params.args],
        exit_status=int(session.exitstatus),
        run_id=sd.run_id,
        hardware_keys=[r.hardware_key for r in results],
        warnings=sd.warnings,
    )
    written, errors = write_outputs(
        results, settings=sd.settings, session_info=info, env=os.environ
    )
    sd.output_lines.extend(written)
    if errors:
        sd.output_lines.extend(f"ERROR: {error}" for error in errors)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _other_plugin_failed(session: pytest.Session, sd: SpecdecodeSession, exc: Exception) -> None:
    """Another plugin's ``pytest_sessionfinish`` raised: show its traceback as pytest shows
    any plugin's internal error, fail the session, and give the summary it kept from being
    printed, so the user still sees what was measured and written."""
    config = session.config
    config.notify_exception(pytest.ExceptionInfo.from_exception(exc), config.option)
    session.exitstatus = pytest.ExitCode.INTERNAL_ERROR
    line = (
        f"ERROR: {_failed_hook(config, exc)}, so this session fails (exit status "
        f"{int(pytest.ExitCode.INTERNAL_ERROR)}). pytest-specdecode wrote its baselines and "
        "reports before that hook ran (listed above); fix what the traceback above names, or "
        "run without that plugin"
    )
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        sys.stderr.write(line + "\n")
        return
    if not config.stash.get(SUMMARY_KEY, False):
        _write_summary(reporter, sd)
    reporter.write_line(line, red=True, bold=True)


def _failed_hook(config: pytest.Config, exc: BaseException) -> str:
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
    for plugin, dist in config.pluginmanager.list_plugin_distinfo():
        if _plugin_file(plugin) == where:
            owner = f"{dist.project_name} {dist.version}"
    if owner is None:
        owner = next(
            (
                f"plugin {name!r}"
                for name, plugin in config.pluginmanager.list_name_plugin()
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


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    sd = _session(config)
    if sd.is_xdist_worker:
        return
    config.stash[SUMMARY_KEY] = True
    _write_summary(terminalreporter, sd)


def _write_summary(terminalreporter: Any, sd: SpecdecodeSession) -> None:
    results, updates, outputs = sd.results, sd.updates, sd.output_lines
    servers = sd.servers.describe()
    if not results and not updates and not servers and not outputs and not sd.warnings:
        return
    terminalreporter.section("specdecode")
    for line in terminal.results_table(results):
        terminalreporter.write_line(line)
    detail = terminal.details(results)
    if detail:
        terminalreporter.write_line("")
        for line in detail:
            terminalreporter.write_line(line)
    if updates:
        terminalreporter.write_line("")
        terminalreporter.write_line("baselines updated (old -> new):")
        for line in updates:
            terminalreporter.write_line("  " + line)
    if servers:
        if results or updates:
            terminalreporter.write_line("")
        terminalreporter.write_line(f"servers: {servers}")
    for line in sd.placement_seen or sd.placement_lines():
        terminalreporter.write_line(f"placed on {line}")
    for line in outputs:
        terminalreporter.write_line(line)
    for warning in sd.warnings:
        terminalreporter.write_line(f"warning: {warning}")


class _XdistHooks:
    """Hooks that exist only when pytest-xdist is installed (pytest's "DeferPlugin" recipe)."""

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput["specdecode_run_id"] = self._session.run_id
        # pytest_xdist_make_scheduler below turns --dist load into loadgroup scheduling.
        node.workerinput["specdecode_loadgroup"] = node.config.getvalue("dist") == "load"

    def __init__(self, session: SpecdecodeSession) -> None:
        self._session = session
        self._received: dict[tuple[str, int], int] = {}  # (worker, its index) -> our index

    def _receive(self, worker: str, entries: list[dict[str, Any]]) -> None:
        """A worker's results (see _Outbox): new ones appended, changed ones replaced."""
        results = self._session.results
        for entry in entries:
            result = SpecdecodeResult.from_json(entry["result"])
            key = (worker, int(entry["index"]))
            if key in self._received:
                results[self._received[key]] = result
            else:
                self._received[key] = len(results)
                results.append(result)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entries = getattr(report, RESULTS_ATTR, None)
        if entries and not self._session.is_xdist_worker:
            self._receive(str(getattr(report, "worker_id", "")), entries)

    def pytest_testnodedown(self, node: Any, error: object) -> None:
        output = getattr(node, "workeroutput", {}) or {}
        worker = str(node.workerinput["workerid"])
        self._receive(worker, output.get("specdecode_results", []))
        if error is not None:
            lines = [line for line in str(error).splitlines() if line.strip()]
            last = lines[-1] if lines else repr(error)  # a traceback's last line names it
            node.config.stash[WORKER_DOWN_KEY] = True
            self._session.output_lines.append(
                f"ERROR: xdist worker {worker} went down: {last} "
                "(its traceback is above), so this session fails; the results it had sent "
                "before are kept"
            )
        self._session.servers.add(ServerCounts.from_json(output.get("specdecode_servers", {})))
        # every worker placed the same collection the same way: the first one's says it all
        self._session.placement_seen = self._session.placement_seen or list(
            output.get("specdecode_placement", [])
        )

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        """``-n N`` distributes whole profiles to workers, so each server is used by one worker
        at a time (``--dist load`` becomes ``loadgroup``; other modes are left alone)."""
        if config.getvalue("dist") != "load":
            return None
        from xdist.scheduler import LoadGroupScheduling

        return LoadGroupScheduling(config, log)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        """On a worker, make sure each node id carries its "@group" tag (after xdist's hook).

        xdist tags by assigning ``item._nodeid``, but since pytest 9.2 ``nodeid`` is read from
        the structured ``item._id``, so the tag is silently lost and LoadGroupScheduling gives
        every test its own group (pytest-xdist#1386). Where xdist's tag took, this does nothing.
        """
        if not config.getoption("loadgroup", False):
            return
        for item in items:
            # LoadGroupScheduling._split_scope's test for a tagged id.
            if item.nodeid.rfind("@") > item.nodeid.rfind("]"):
                continue
            # The group name xdist 3.8 builds in WorkerInteractor.pytest_collection_modifyitems.
            names = {
                str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                for mark in item.iter_markers("xdist_group")
            }
            if names:
                tagged = f"{item.nodeid}@{'_'.join(sorted(names))}"
                _set_nodeid(item, tagged)
                if item.nodeid != tagged:  # a pytest that moved node ids again
                    warnings.warn(
                        SpecdecodeWarning(
                            f"cannot tag node ids with their xdist_group on pytest "
                            f"{pytest.__version__}: a profile's tests may run on several "
                            "workers, each launching its own server"
                        ),
                        stacklevel=1,
                    )
                    return


def _set_nodeid(item: pytest.Item, nodeid: str) -> None:
    """Rewrite the node id, as xdist's loadgroup does; pytest offers no public way to."""
    node: Any = item
    structured: Any = getattr(node, "_id", None)
    if hasattr(structured, "parse"):
        node._id = structured.parse(nodeid)  # pytest >= 9.2: nodeid is str(item._id)
    else:
        node._nodeid = nodeid
