"""pytest wiring for pytest-specdecode, and nothing else: options from
:data:`pytest_specdecode.settings.OPTIONS`, pytest's objects read into plain values for
:mod:`pytest_specdecode.session` (the collection's plan, the measurement, the end of the session,
the terminal's text), and their results and errors turned into pytest outcomes.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from pytest_specdecode.errors import ConfigError, NotServedHere, SpecdecodeError
from pytest_specdecode.markers import MarkerSpec
from pytest_specdecode.outputs.json_report import junit_properties
from pytest_specdecode.result import SpecdecodeResult, TestError
from pytest_specdecode.servers.handle import ServerHandle
from pytest_specdecode.session import console, finish, start
from pytest_specdecode.session.collection import (
    NO_PROFILE,
    Collected,
    Planned,
    group_tagged,
    marker_lines,
    plan_collection,
    start_selected,
    untaggable,
)
from pytest_specdecode.session.orchestrator import SpecdecodeSession, SpecdecodeTest
from pytest_specdecode.session.outcomes import note_error, verdict_action
from pytest_specdecode.session.worker_relay import (
    LATE_ATTR,
    RESULTS_ATTR,
    TEST_ID_ATTR,
    Inbox,
    Outbox,
)
from pytest_specdecode.settings import OPTIONS, Settings, resolve

SESSION_KEY = pytest.StashKey[SpecdecodeSession]()
PLANNED_KEY = pytest.StashKey[Planned]()  # a specdecode test's marker, profile and test id
TEST_KEY = pytest.StashKey[SpecdecodeTest]()
NEXT_SERVER_KEY = pytest.StashKey[str | None]()  # the profile this process's next test needs
CAUSE_KEY = pytest.StashKey[BaseException]()  # the error a test failed with, before _fail hid it
JUDGED_KEY = pytest.StashKey[bool]()  # the verdict is being applied: a failure now is the verdict
ROW_KEY = pytest.StashKey[SpecdecodeResult]()  # the ERROR row of a test that errored
OUTBOX_KEY = pytest.StashKey[Outbox]()  # an xdist worker's results not yet sent up
SUMMARY_KEY = pytest.StashKey[bool]()  # the specdecode section of the terminal summary was shown
WORKER_DOWN_KEY = pytest.StashKey[bool]()  # an xdist worker went down with an error
LATE_KEY = pytest.StashKey["_LateFailures"]()  # the failures found after their tests


class SpecdecodeWarning(pytest.PytestWarning):
    """A soft problem: an inconclusive verdict passed by policy, a soft fingerprint change."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup(
        "specdecode", "performance-regression tests of speculative-decoding servers"
    )
    for option in OPTIONS:
        group.addoption(option.flag, **option.cli_arguments())
        if option.ini:
            parser.addini(option.ini_key, option.help + option.default_text, default=None)


def _settings(config: pytest.Config, *, check_outputs: bool) -> Settings:
    """The settings from the command line, the ini file and the environment; with
    ``check_outputs`` every output path (the plugin's, --junitxml, --benchmark-json) is checked
    before anything launches (start.check_outputs). A bad value is a usage error."""
    ini_file = str(config.inipath or "the ini file")
    given = {o.name: config.getoption(f"specdecode_{o.name}") for o in OPTIONS}
    try:
        settings = resolve(
            cli=given,
            ini={o.name: config.getini(o.ini_key) if o.ini else None for o in OPTIONS},
            env=os.environ,
            invocation_dir=config.invocation_params.dir,
            ini_dir=config.inipath.parent if config.inipath else config.rootpath,
            ini_file=ini_file,
            # Without an ini file the rootdir is wherever the run starts: find the project.
            search_from=None if config.inipath else config.rootpath,
        )
        if check_outputs:
            start.check_outputs(
                settings,
                given={name for name, value in given.items() if value},
                env=os.environ,
                ini_file=ini_file,
                junitxml=config.getoption("xmlpath", None),
                benchmark_json=config.getoption("benchmark_json", None),
                args=[str(arg) for arg in config.invocation_params.args],
                base=config.invocation_params.dir,
            )
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None
    return settings


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    for line in marker_lines():
        config.addinivalue_line("markers", line)
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    settings = _settings(config, check_outputs=workerinput is None)
    if workerinput is not None and workerinput.get("specdecode_loadgroup"):
        # The controller schedules by group (see pytest_xdist_make_scheduler), but a worker
        # tags node ids with their xdist_group only under --dist loadgroup; without the tag
        # every test is its own group and profiles are spread over all workers.
        config.option.loadgroup = True
    session = start.open_session(
        settings,
        workerinput=workerinput,
        basetemp=lambda: _basetemp(config),
        rootdir=config.rootpath,
        say=lambda line: _say(config, line),
        is_tty=lambda: _reporter_is_tty(config),
    )
    config.stash[SESSION_KEY] = session
    config.stash[LATE_KEY] = _LateFailures(config)
    config.pluginmanager.register(config.stash[LATE_KEY], "specdecode-late-failures")
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_XdistHooks(session), "specdecode-xdist")
    start.terminate_gracefully()


def _basetemp(config: pytest.Config) -> Path | None:
    factory = getattr(config, "_tmp_path_factory", None)
    return Path(factory.getbasetemp()) if factory else None


def _reporter_is_tty(config: pytest.Config) -> bool:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    return reporter is not None and bool(reporter.isatty)


def _session(config: pytest.Config) -> SpecdecodeSession:
    return config.stash[SESSION_KEY]


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


def pytest_report_header(config: pytest.Config) -> list[str]:
    try:
        return console.header_lines(_session(config))
    except SpecdecodeError as exc:
        raise pytest.UsageError(str(exc)) from None


# -- collection ----------------------------------------------------------------------------


def _collected(item: pytest.Item) -> Collected:
    marker = item.get_closest_marker("specdecode")
    callspec = getattr(item, "callspec", None)
    param = callspec.params.get("specdecode_server") if callspec is not None else None
    return Collected(
        nodeid=item.nodeid,
        path=item.path,
        marker=(marker.args, marker.kwargs) if marker is not None else None,
        server_param=param if isinstance(param, str) else None,
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Parse markers, add the algorithm markers (before ``-m`` deselects), group by profile."""
    session = _session(config)
    try:
        plan = plan_collection(session, [_collected(item) for item in items], config.rootpath)
    except SpecdecodeError as exc:
        raise pytest.UsageError(str(exc)) from None
    if not session.is_xdist_worker:
        for line in session.placement_lines():
            _say(config, f"specdecode: placed on {line}")
    xdist = config.pluginmanager.hasplugin("xdist")
    for item, planned in zip(items, plan.tests, strict=True):
        if planned is not None:
            item.stash[PLANNED_KEY] = planned
            item.add_marker(planned.algorithm_marker)
            if xdist:
                item.add_marker(pytest.mark.xdist_group(planned.group))
    items[:] = [items[index] for index in plan.order]


def pytest_collection_finish(session: pytest.Session) -> None:
    planned = [item.stash[PLANNED_KEY] for item in session.items if PLANNED_KEY in item.stash]
    start_selected(_session(session.config), planned)
    if planned:  # a session without the plugin's tests is left as it was
        start.freeze_start_up_objects()


def _spec(item: pytest.Item) -> MarkerSpec | None:
    planned = item.stash.get(PLANNED_KEY, None)
    return planned.spec if planned is not None else None


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def specdecode_session(pytestconfig: pytest.Config) -> SpecdecodeSession:
    """The plugin's session object: profiles, the server pool, the baseline store."""
    return _session(pytestconfig)


@pytest.fixture
def specdecode_server(request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    """A ready server for the test's profile (from its marker, or ``indirect`` parametrize)."""
    session = _session(request.config)
    spec = _spec(request.node)
    name = getattr(request, "param", None) or (spec.server if spec else None)
    if not name:
        pytest.fail(NO_PROFILE, pytrace=False)
    try:
        profile = session.profile(name, where=request.node.nodeid)
        handle = session.server_for(profile)
    except NotServedHere as exc:  # --server-host: another profile's server, or none for it
        pytest.skip(str(exc))
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
    planned = request.node.stash.get(PLANNED_KEY, None)
    spec = planned.spec if planned else MarkerSpec(server=specdecode_server.profile.name)
    test_id = planned.test_id if planned else request.node.nodeid
    test = SpecdecodeTest(_session(request.config), test_id, spec, specdecode_server)
    request.node.stash[TEST_KEY] = test
    return test


@pytest.fixture(autouse=True)
def _specdecode_autouse(request: pytest.FixtureRequest) -> None:
    if PLANNED_KEY in request.node.stash:
        request.getfixturevalue("specdecode")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Remember which server the next test of this process needs (for its release); give back
    leases kept for this test if it does not need them."""
    spec = _spec(nextitem) if nextitem is not None else None
    item.stash[NEXT_SERVER_KEY] = spec.server if spec is not None else None
    own = _spec(item)
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
    planned = item.stash.get(PLANNED_KEY, None)
    if planned is not None:
        setattr(report, TEST_ID_ATTR, planned.test_id)  # xdist serialises it with the report
    if report.failed and planned is not None:
        _note_error(sd, item, report.when, call)
    if sd.is_xdist_worker and report.when == "teardown":
        # Sent as each test finishes, not only at the end: a worker whose end of session fails
        # (another plugin's hook, a crash) has already handed over what it measured.
        outgoing = item.config.stash.setdefault(OUTBOX_KEY, Outbox()).take(sd.results)
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
    test = item.stash.get(TEST_KEY, None)
    row, properties = note_error(
        sd, item.stash[PLANNED_KEY], test, TestError.of(phase, exc), has_row=ROW_KEY in item.stash
    )
    if row is not None:
        item.stash[ROW_KEY] = row
    item.user_properties.extend(properties)


def _apply_outcome(item: pytest.Item, test: SpecdecodeTest, result: SpecdecodeResult) -> None:
    action, text = verdict_action(result, test.spec, _session(item.config).settings)
    if action == "fail":
        pytest.fail(text, pytrace=False)
    if action == "skip":
        # Reported at the test's location (as a skip marker is), not at this line.
        raise pytest.skip.Exception(text, _use_item_location=True)
    if action == "xfail":
        pytest.xfail(text)
    if action == "warn":
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
    config = session.config
    sd = _session(config)

    def set_exit_status(status: int) -> None:
        session.exitstatus = pytest.ExitCode(status)

    night = finish.save_measurements(
        sd,
        exit_status=lambda: int(session.exitstatus),
        set_exit_status=set_exit_status,
        pytest_args=[str(arg) for arg in config.invocation_params.args],
        worker_down=config.stash.get(WORKER_DOWN_KEY, False),
        benchmark_session=getattr(config, "_benchmarksession", None),
        outbox=config.stash.setdefault(OUTBOX_KEY, Outbox()),
        workeroutput=getattr(config, "workeroutput", {}),
        stops_workers_servers=config.pluginmanager.hasplugin("dsession"),
    )
    if not sd.is_xdist_worker:
        # Before the other plugins' ends: the terminal reporter counts these reports in its
        # summary and JUnit XML writes them into its file.
        config.stash[LATE_KEY].report(finish.late_failures(sd.results))
    try:
        yield
    except Exception as exc:
        if sd.is_xdist_worker:
            raise  # its results went up before; the worker's end is xdist's to report
        session.exitstatus = pytest.ExitCode.INTERNAL_ERROR
        _other_plugin_failed(session, sd, exc, night.after(3).status if night else 3)
    if night is not None and night.nightly:  # --specdecode-exit-status nightly
        session.exitstatus = night.after(int(session.exitstatus)).status


def _other_plugin_failed(
    session: pytest.Session, sd: SpecdecodeSession, exc: Exception, status: int
) -> None:
    """Another plugin's ``pytest_sessionfinish`` raised: show its traceback as pytest shows
    any plugin's internal error, fail the session, and give the summary it kept from being
    printed, so the user still sees what was measured and written."""
    config = session.config
    config.notify_exception(pytest.ExceptionInfo.from_exception(exc), config.option)
    line = finish.other_plugin_failed_line(exc, config.pluginmanager, status=status)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        sys.stderr.write(line + "\n")
        return
    if not config.stash.get(SUMMARY_KEY, False):
        _write_summary(reporter, sd)
    reporter.write_line(line, red=True, bold=True)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    sd = _session(config)
    if sd.is_xdist_worker:
        return
    config.stash[SUMMARY_KEY] = True
    _write_summary(terminalreporter, sd)


def _write_summary(terminalreporter: Any, sd: SpecdecodeSession) -> None:
    lines = console.summary_lines(sd)
    if lines is None:
        return
    terminalreporter.section("specdecode")
    for line in lines:
        terminalreporter.write_line(line)


class _LateFailures:
    """Failures found after their tests had finished (a later baseline launch refused or
    failed, a baseline not written at the end) as pytest errors of those tests: one report per
    test, made at the session's end, so the terminal's summary ("1 error"), its ERRORS section,
    JUnit XML (an ``<error>`` of the test's ``<testcase>``) and any other reader of test reports
    count it. On the xdist controller too: it sees every worker's reports, and their results
    arrive before its session ends."""

    def __init__(self, config: pytest.Config) -> None:
        self._config = config
        self._nodes: dict[str, tuple[str, tuple[str, int | None, str]]] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Remember each specdecode test's node id and location, by its result's test id."""
        test_id = getattr(report, TEST_ID_ATTR, None)
        if isinstance(test_id, str) and not getattr(report, LATE_ATTR, False):
            self._nodes[test_id] = (report.nodeid, report.location)

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(
        self, report: pytest.TestReport
    ) -> tuple[str, str, tuple[str, dict[str, bool]]] | None:
        """Counted and listed as an ERROR, but no "E" after the progress line's "[100%]"."""
        if getattr(report, LATE_ATTR, False):
            return "error", "", ("ERROR", {"red": True})
        return None

    def report(self, results: list[SpecdecodeResult]) -> None:
        for result in results:
            report = pytest.TestReport(**finish.late_failure_report(result, self._nodes))
            setattr(report, LATE_ATTR, True)
            self._config.hook.pytest_runtest_logreport(report=report)


class _XdistHooks:
    """Hooks that exist only when pytest-xdist is installed (pytest's "DeferPlugin" recipe)."""

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput["specdecode_run_id"] = self._session.run_id
        # pytest_xdist_make_scheduler below turns --dist load into loadgroup scheduling.
        node.workerinput["specdecode_loadgroup"] = node.config.getvalue("dist") == "load"

    def __init__(self, session: SpecdecodeSession) -> None:
        self._session = session
        self._inbox = Inbox(session)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entries = getattr(report, RESULTS_ATTR, None)
        if entries and not self._session.is_xdist_worker:
            self._inbox.receive(str(getattr(report, "worker_id", "")), entries)

    def pytest_testnodedown(self, node: Any, error: object) -> None:
        if error is not None:
            node.config.stash[WORKER_DOWN_KEY] = True
        output = getattr(node, "workeroutput", {}) or {}
        self._inbox.worker_down(str(node.workerinput["workerid"]), output, error)

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
            marks = [(m.args, m.kwargs) for m in item.iter_markers("xdist_group")]
            tagged = group_tagged(item.nodeid, marks)
            if tagged is None:
                continue
            _set_nodeid(item, tagged)
            if item.nodeid != tagged:  # a pytest that moved node ids again
                warnings.warn(SpecdecodeWarning(untaggable(pytest.__version__)), stacklevel=1)
                return


def _set_nodeid(item: pytest.Item, nodeid: str) -> None:
    """Rewrite the node id, as xdist's loadgroup does; pytest offers no public way to."""
    node: Any = item
    structured: Any = getattr(node, "_id", None)
    if hasattr(structured, "parse"):
        node._id = structured.parse(nodeid)  # pytest >= 9.2: nodeid is str(item._id)
    else:
        node._nodeid = nodeid
