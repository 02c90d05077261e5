"""pytest wiring for pytest-specdecode, and nothing else.

Options and ini keys come from :data:`pytest_specdecode.settings.OPTIONS`; the marker is parsed
by :mod:`pytest_specdecode.markers`; servers, measurement and verdicts live in
:mod:`pytest_specdecode.session`. This module turns their errors into pytest outcomes.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_specdecode import report
from pytest_specdecode.errors import ConfigError, SpecdecodeError
from pytest_specdecode.markers import MARKER_HELP, MarkerSpec, parse_marker
from pytest_specdecode.pool import ServerHandle, finish_run
from pytest_specdecode.profiles import ALGORITHM_MARKERS
from pytest_specdecode.readiness import Progress
from pytest_specdecode.session import SpecdecodeSession, SpecdecodeTest, TestResult
from pytest_specdecode.settings import OPTIONS, Settings, resolve
from pytest_specdecode.verdict import Outcome

SESSION_KEY = pytest.StashKey[SpecdecodeSession]()
SPEC_KEY = pytest.StashKey[MarkerSpec]()
TEST_KEY = pytest.StashKey[SpecdecodeTest]()
RESULTS_KEY = pytest.StashKey[list[TestResult]]()
UPDATES_KEY = pytest.StashKey[list[str]]()


class SpecdecodeWarning(pytest.PytestWarning):
    """A soft problem: an inconclusive verdict passed by policy, a soft fingerprint change."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup(
        "specdecode", "performance-regression tests of speculative-decoding servers"
    )
    for option in OPTIONS:
        default = "" if option.default is None else f" (default: {option.default})"
        if option.is_flag:
            group.addoption(
                option.flag,
                action="store_true",
                dest=f"specdecode_{option.name}",
                default=None,
                help=option.help,
            )
        else:
            group.addoption(
                option.flag,
                dest=f"specdecode_{option.name}",
                metavar=option.metavar,
                default=None,
                help=option.help + default,
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
    if workerinput is not None:
        worker = str(workerinput.get("workerid", "gw"))
        run_id = str(workerinput.get("specdecode_run_id") or workerinput.get("testrunuid"))
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
    config.stash[RESULTS_KEY] = []
    config.stash[UPDATES_KEY] = []
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_XdistHooks(session), "specdecode-xdist")
    _terminate_gracefully()


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
        f"specdecode: profiles {settings.config}, target {target} ({session.target_reason}), "
        f"baselines {settings.baselines}"
    ]
    if settings.server_host:
        lines.append(f"specdecode: measuring the server at {settings.server_host} (attached)")
    if settings.update_baselines:
        lines.append("specdecode: --update-baselines: measured runs become the new baselines")
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
        except SpecdecodeError as exc:
            raise pytest.UsageError(str(exc)) from None
        item.stash[SPEC_KEY] = replace(spec, server=server)
        item.add_marker(profile.algorithm_marker)
        if xdist:
            item.add_marker(pytest.mark.xdist_group(f"specdecode-{profile.name}"))
        order.setdefault(profile.name, len(order))

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
    sd.pool.set_demand(None if sd.is_xdist_worker else demand)


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
        pytest.fail(str(exc), pytrace=False)
    try:
        yield handle
    finally:
        session.release(profile)


@pytest.fixture
def specdecode(request: pytest.FixtureRequest, specdecode_server: ServerHandle) -> SpecdecodeTest:
    """The test's measurement: ``specdecode.measure()`` returns the runs and the verdict."""
    spec = request.node.stash.get(SPEC_KEY, None) or MarkerSpec(
        server=specdecode_server.profile.name
    )
    test = SpecdecodeTest(_session(request.config), request.node.nodeid, spec, specdecode_server)
    request.node.stash[TEST_KEY] = test
    return test


@pytest.fixture(autouse=True)
def _specdecode_autouse(request: pytest.FixtureRequest) -> None:
    if SPEC_KEY in request.node.stash:
        request.getfixturevalue("specdecode")


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
        pytest.fail(str(exc), pytrace=False)
    item.config.stash[RESULTS_KEY].append(measured)
    _apply_outcome(item, test, measured)
    return result


def _apply_outcome(item: pytest.Item, test: SpecdecodeTest, result: TestResult) -> None:
    settings = _session(item.config).settings
    outcome = result.outcome
    text = f"{result.profile}: {result.message}"
    if outcome in (Outcome.FAIL, Outcome.MISMATCH):
        pytest.fail(text, pytrace=False)
    if outcome is Outcome.NO_BASELINE:
        policy = test.spec.on_missing_baseline or settings.on_missing_baseline
        if policy == "fail":
            pytest.fail(text, pytrace=False)
        pytest.skip(text)
    if outcome is Outcome.INCONCLUSIVE:
        policy = test.spec.on_inconclusive or settings.on_inconclusive
        if policy == "fail":
            pytest.fail(text, pytrace=False)
        if policy == "xfail":
            pytest.xfail(text)
        warnings.warn(SpecdecodeWarning(f"inconclusive, passed by policy: {text}"), stacklevel=1)
    for warning in result.warnings:
        warnings.warn(SpecdecodeWarning(warning), stacklevel=1)


# -- end of session ------------------------------------------------------------------------


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    sd = _session(config)
    try:
        if sd.is_xdist_worker:
            workeroutput: dict[str, Any] = getattr(config, "workeroutput", {})
            workeroutput["specdecode_results"] = [r.to_json() for r in config.stash[RESULTS_KEY]]
            return
        if sd.settings.update_baselines:
            for update in sd.write_baselines(config.stash[RESULTS_KEY]):
                config.stash[UPDATES_KEY].extend(update.describe())
    except SpecdecodeError as exc:
        config.stash[UPDATES_KEY].append(f"ERROR: {exc}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    finally:
        sd.close()
        if config.pluginmanager.hasplugin("xdist") and not sd.is_xdist_worker:
            finish_run(
                sd.settings.state_dir,
                sd.run_id,
                keep_alive=sd.settings.keep_server,
                on_event=lambda message: _say(config, f"specdecode: {message}"),
            )


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if _session(config).is_xdist_worker:
        return
    results = config.stash[RESULTS_KEY]
    updates = config.stash[UPDATES_KEY]
    if not results and not updates:
        return
    terminalreporter.section("specdecode")
    for line in report.results_table(results):
        terminalreporter.write_line(line)
    detail = report.details(results)
    if detail:
        terminalreporter.write_line("")
        for line in detail:
            terminalreporter.write_line(line)
    if updates:
        terminalreporter.write_line("")
        terminalreporter.write_line("baselines updated (old -> new):")
        for line in updates:
            terminalreporter.write_line("  " + line)


class _XdistHooks:
    """Hooks that exist only when pytest-xdist is installed (pytest's "DeferPlugin" recipe)."""

    def __init__(self, session: SpecdecodeSession) -> None:
        self._session = session

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput["specdecode_run_id"] = self._session.run_id

    def pytest_testnodedown(self, node: Any, error: object) -> None:
        output = getattr(node, "workeroutput", {}) or {}
        config = node.config
        for data in output.get("specdecode_results", []):
            config.stash[RESULTS_KEY].append(TestResult.from_json(data))

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        """``-n N`` distributes whole profiles to workers, so each server is used by one worker
        at a time (``--dist load`` becomes ``loadgroup``; other modes are left alone)."""
        if config.getvalue("dist") != "load":
            return None
        from xdist.scheduler import LoadGroupScheduling

        return LoadGroupScheduling(config, log)
