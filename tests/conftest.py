"""Shared by every test folder: the pytest runs the tests start must not think they are xdist
workers when the plugin's own suite runs under ``-n``.

pytest-xdist exports ``PYTEST_XDIST_WORKER`` (and friends) to its workers, and a pytester
subprocess inherits them: pytest-benchmark then disables itself with a warning on stderr, and
the plugin's own controller/worker logic would see a worker where there is none.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# httpx 0.28 imports httpcore on its first connection. Where that is inside a pytester test,
# pytester's teardown removes the modules the test imported, httpcore among them; the next
# import makes new exception classes that httpx's mapping no longer knows, and a refused
# connection escapes as httpcore.ConnectError. Imported here, before any snapshot, it stays.
import httpcore  # noqa: F401
import pytest
from pytest_forkserver import Forkserver, is_pytest_run

# A shell without job control starts a background command (`scripts/test &` in a script) with
# SIGINT ignored, and an ignored signal stays ignored across exec: every pytest the suite starts
# would shrug off the Ctrl-C that the interrupt tests send it, and they would test the shell,
# not the plugin. Python's own handler (a handled signal is reset to the default at exec) gives
# the suite's children the Ctrl-C a terminal gives a user's pytest.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# OpenBLAS (numpy's and scipy's BLAS) starts a thread per core when numpy is imported, and they
# spin a moment: 0.15-0.3 s of CPU in each of the hundreds of processes the suite starts (its
# pytest runs, xdist workers, benchmarks), none of which multiplies a matrix. Set here, before
# xdist starts its workers; a value the developer set is kept.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

XDIST_WORKER_VARIABLES = (
    "PYTEST_XDIST_WORKER",
    "PYTEST_XDIST_WORKER_COUNT",
    "PYTEST_XDIST_TESTRUNUID",
)


@pytest.fixture(autouse=True)
def _not_an_xdist_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in XDIST_WORKER_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def _machine_load_not_compared(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin's own runs neither record nor compare the machine's load: on a shared CI box
    the load changes between a test's recording and its check, and the warning would change
    what a test sees. tests/e2e/test_machine_load_e2e.py turns it on with an injected load."""
    monkeypatch.setenv("PYTEST_SPECDECODE_MACHINE_LOAD", "off")


# Plugins installed for the suite itself that no run it starts uses: each costs every pytester
# run its import (hypothesis and anyio together about 0.3 s of CPU, hundreds of runs a suite).
UNUSED_IN_INNER_RUNS = ("hypothesispytest", "anyio")
_UNUSED_PLUGIN_ARGS = tuple(arg for name in UNUSED_IN_INNER_RUNS for arg in ("-p", f"no:{name}"))


@pytest.fixture(autouse=True)
def _inner_runs_skip_unused_plugins(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    if "pytester" in request.fixturenames:
        request.getfixturevalue("pytester")  # it clears PYTEST_ADDOPTS: set ours after it
    given = os.environ.get("PYTEST_ADDOPTS", "")
    monkeypatch.setenv("PYTEST_ADDOPTS", " ".join([given, *_UNUSED_PLUGIN_ARGS]).strip())


# The noise guard refuses to record a baseline whose tok/s CV is above 8%. A loaded 2-core box
# moves the client's timing of short simulated runs that much (seen in CI: 8.3%, 10.7%, 15.6%
# over 3-6 runs), so the runs the tests start allow 30%; the guard's own test asks for 8%.
SUITE_MAX_BASELINE_CV = "0.30"


@pytest.fixture(autouse=True)
def _noise_guard_for_a_loaded_box(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_SPECDECODE_MAX_BASELINE_CV", SUITE_MAX_BASELINE_CV)


@pytest.fixture(autouse=True)
def _one_calibration_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runs the tests start share one cache of the sequential plans' calibration
    (calibration_cache.py): pytester gives each test a HOME of its own, where every run would
    compute its plans again (0.4-1.4 s each), and the user's cache stays untouched."""
    shared = tmp_path_factory.getbasetemp() / "calibration-cache"
    monkeypatch.setenv("PYTEST_SPECDECODE_CALIBRATION_CACHE", str(shared))


# Under `-n` (scripts/test runs the suite on three workers), tests that share one machine-wide
# thing run on one worker, one after another: the Docker engines (the fleet tests remove every
# managed container on both engines and kill engine B; the fault matrix has Docker rows).
SHARED_BY_PATH = {
    "docker-engines": (
        "tests/docker/",
        "tests/e2e/test_fleet_e2e.py",
        "tests/e2e/test_lifecycle_docker.py",
        "tests/e2e/test_fault_matrix.py",
    ),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = item.path.relative_to(config.rootpath).as_posix()
        for group, prefixes in SHARED_BY_PATH.items():
            if path.startswith(prefixes):
                item.add_marker(pytest.mark.xdist_group(group))
    phase = os.environ.get(QUIET_PHASE_VARIABLE, "")
    if phase:
        _select_phase(config, items, phase)


# Tests whose claim is a live speed: the README's main job and the mission's command against the
# committed baselines, which were recorded on a quiet machine; the seed's borderline claim (EAGLE3
# 2-step at least 5% over no speculation's baseline) is the thinnest of them: on a quiet machine
# the simulated 2-step measures +5.5% over that baseline, and a run 1.3% slower FAILs. Also the
# simulator's timing against its model, a baseline recorded and then compared within one test, and
# the cross-night tests whose claim is the size of tonight's change (their nights are built around
# a level the test measured moments before). Beside the rest of the suite (three workers keep two
# cores 80-100% busy) these measured 1-2% slow and FAILed on CI machines, in four of six runs on a
# slow one, also at nice -10, which orders a VM's own processes but not what the host gives the VM
# (one such machine's pure-Python loop took 3.5 s to 6.1 s within one session); the more of its own
# load a slow VM carries, the further behind it falls. So scripts/test runs them on their own after
# the rest, one at a time, on the quiet machine their claims are about: the parallel run sets
# SPECDECODE_TEST_QUIET=defer (they are deselected) and the quiet run =only (all else is). A plain
# `pytest tests` runs them with the rest, where, as root, they still take the CPU first (nice -10:
# the server and client the test starts inherit it).
QUIET_MACHINE = "quiet_machine"
QUIET_MACHINE_NICE = -10
QUIET_PHASE_VARIABLE = "SPECDECODE_TEST_QUIET"
QUIET_PHASES = ("defer", "waiting", "beside", "only")

# The tests that mostly wait (a hang bound, servers at 5x): scripts/test runs them in a lane of
# their own beside the parallel run (=waiting; the parallel run leaves them out), at the same
# priority, so that they hold no worker of it. The parallel run is bound by its workers, not the
# cores; a fourth worker there kept the cores busier, but the CPU-paced measurements of the
# tests beside it got noisier (two INCONCLUSIVE checks where a PASS was needed).
WAITING_TESTS = (
    "tests/e2e/test_hangs_e2e.py",
    "tests/e2e/test_compare_e2e.py",
    "tests/e2e/test_server_identity_e2e.py",
    "tests/e2e/test_failed_after_test_e2e.py",
    "tests/sim/test_sim_faults.py",
)

# The live-speed tests keep only about a quarter of two cores busy (most of their time is
# simulated time), so scripts/test runs these beside them, at nice 19 (=beside; the parallel run
# leaves them out): tests that claim no speed, wait on no tight deadline and record no baseline
# under a CV limit a starved moment could break, chosen among those that use the CPU most for
# their time (test_bench_nightly computes its detection tables; the contract tests parse
# SGLang's sources). Nice 19 leaves a core to a live-speed test whenever it wants one. The whole
# rest at nice 19 was tried: the recordings of CPU-paced runs, starved in those moments, went
# over their CV limits, and the hang tests' "fails at once" is a bound of one second.
BESIDE_THE_QUIET_TESTS = (
    "tests/unit/",
    "tests/contract/",
    "tests/test_pytest_forkserver.py",
    "tests/e2e/test_bench_nightly.py",
    "tests/e2e/test_verdicts_marker.py",
    "tests/e2e/test_cli_surface.py",
    "tests/e2e/test_warnings_e2e.py",
    "tests/e2e/test_scripts_test_env.py",  # mostly waits on pip's index, claims no speed
)
PATHS_OF_PHASE = {"waiting": WAITING_TESTS, "beside": BESIDE_THE_QUIET_TESTS}


def _phase_of(path: Path, config: pytest.Config) -> str | None:
    """The run that takes the tests under PATH, quiet_machine tests aside: defer, waiting or
    beside; None for a folder that holds tests of several, or a path outside the suite."""
    try:
        relative = path.relative_to(config.rootpath).as_posix()
    except ValueError:
        return None
    relative += "/" if path.is_dir() else ""
    for phase, paths in PATHS_OF_PHASE.items():
        if relative.startswith(paths):
            return phase
    if any(named.startswith(relative) for paths in PATHS_OF_PHASE.values() for named in paths):
        return None
    return "defer"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The =defer, =waiting and =beside runs do not even collect the others' folders and files
    (collecting the 965 tests that run beside the live-speed ones takes a process about a
    second). pytest asks this of what it finds, not of the paths on its command line:
    _select_phase sorts those out."""
    phase = os.environ.get(QUIET_PHASE_VARIABLE, "")
    if phase not in ("defer", "waiting", "beside"):
        return None
    of_path = _phase_of(collection_path, config)
    return True if of_path is not None and of_path != phase else None


def _select_phase(config: pytest.Config, items: list[pytest.Item], phase: str) -> None:
    if phase not in QUIET_PHASES:
        raise pytest.UsageError(
            f"{QUIET_PHASE_VARIABLE}={phase!r} (from the environment): expected one of "
            f"{', '.join(QUIET_PHASES)}, or unset it to run every test together"
        )
    keep, deselected = [], []
    for item in items:
        if item.get_closest_marker(QUIET_MACHINE) is not None:
            wanted = phase == "only"
        else:
            wanted = phase == _phase_of(item.path, config)
        (keep if wanted else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = keep


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{QUIET_MACHINE}: claims a live speed (tests/conftest.py); scripts/test runs it after "
        f"the rest, alone, and as root at nice {QUIET_MACHINE_NICE}",
    )
    config.addinivalue_line(
        "markers",
        f"{FRESH_INTERPRETER}: its pytester runs start a new interpreter rather than a fork of "
        "the suite's forkserver (tests/pytest_forkserver.py): the claim is about a start",
    )


# pytester's runpytest_subprocess forked from one interpreter per worker that has imported
# pytest, the plugin and scipy already (tests/pytest_forkserver.py says what that keeps and what
# not): 1.7 s of CPU less a run, hundreds of runs a suite. SPECDECODE_TEST_FORKSERVER=0 turns it
# off; a test marked fresh_interpreter gets real subprocesses.
FRESH_INTERPRETER = "fresh_interpreter"
FORKSERVER_VARIABLE = "SPECDECODE_TEST_FORKSERVER"


@pytest.fixture(scope="session")
def _forkserver() -> Iterator[Forkserver | None]:
    value = os.environ.get(FORKSERVER_VARIABLE, "1")
    if value not in ("0", "1"):
        raise pytest.UsageError(
            f"{FORKSERVER_VARIABLE}={value!r} (from the environment): expected 1 (fork the "
            "pytester runs from a forkserver, the default) or 0 (start each one fresh)"
        )
    if value == "0":
        yield None
        return
    server = Forkserver(_UNUSED_PLUGIN_ARGS)
    yield server
    server.close()


def _no_stale_bytecode(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Python file a test writes through pytester never meets bytecode cached for what was
    there before.

    pytest caches a test module's rewritten bytecode in ``__pycache__`` and trusts it while the
    source has the size and the whole-second mtime it was compiled from (so does Python's own
    cache). Tests that write a test file, run pytest, write it again and run again (a kept
    server, then a session that needs its GPUs: ``"nospec"`` and ``"eagle3"`` are both six
    characters) can meet both: one such second run ran the first body again. scripts/test lets
    Python cache bytecode (it unsets PYTHONDONTWRITEBYTECODE), so every write here drops the
    file's cached bytecode, whatever the clock says."""

    def dropping(write: Any, ext: str | None) -> Any:
        def written(*args: Any, **kwargs: Any) -> Path:
            suffix = args[0] if ext is None else ext
            first: Path = write(*args, **kwargs)
            if suffix == ".py":  # the files pytester wrote, named as it names them
                paths = {first, *(pytester.path.joinpath(k).with_suffix(suffix) for k in kwargs)}
                for path in paths:
                    for pyc in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
                        pyc.unlink(missing_ok=True)
            return first

        return written

    monkeypatch.setattr(pytester, "makepyfile", dropping(pytester.makepyfile, ".py"))
    monkeypatch.setattr(pytester, "makefile", dropping(pytester.makefile, None))


@pytest.fixture
def pytester(
    pytester: pytest.Pytester,
    _forkserver: Forkserver | None,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> pytest.Pytester:
    """pytester, whose ``runpytest_subprocess`` runs go through the forkserver, and whose
    written Python files never meet stale bytecode (:func:`_no_stale_bytecode`)."""
    _no_stale_bytecode(pytester, monkeypatch)
    if _forkserver is None or request.node.get_closest_marker(FRESH_INTERPRETER) is not None:
        return pytester
    server = _forkserver
    real_popen = pytester.popen

    def popen(cmdargs: Any, stdout: Any = None, stderr: Any = None, **kw: Any) -> Any:
        argv = [os.fspath(arg) for arg in cmdargs]
        stdin = kw.pop("stdin", pytester.CLOSE_STDIN)
        kw.pop("close_fds", None)  # pytest < 8 passes it; a fork closes what it must
        plain = stdin is pytester.CLOSE_STDIN and not kw and is_pytest_run(argv)
        if not plain or not hasattr(stdout, "fileno") or not hasattr(stderr, "fileno"):
            return real_popen(cmdargs, stdout=stdout, stderr=stderr, stdin=stdin, **kw)
        env = os.environ.copy()  # what Pytester.popen gives its child
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
        with open(os.devnull, "rb") as empty:
            return server.run(argv, env, (empty.fileno(), stdout.fileno(), stderr.fileno()))

    monkeypatch.setattr(pytester, "popen", popen)
    return pytester


@pytest.fixture(autouse=True)
def _quiet_machine_priority(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.node.get_closest_marker(QUIET_MACHINE) is None or os.geteuid() != 0:
        yield
        return
    # Per thread on Linux: the test, and every process it starts, runs on this (main) thread.
    before = os.getpriority(os.PRIO_PROCESS, 0)
    os.setpriority(os.PRIO_PROCESS, 0, QUIET_MACHINE_NICE)
    try:
        yield
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, before)
