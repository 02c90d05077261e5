"""scripts/test's two runs of this suite split it, and lose nothing: the parallel run
(SPECDECODE_TEST_QUIET=defer) and the live-speed run after it (=only) together collect every test
exactly once, the live-speed run exactly the quiet_machine tests (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# One module marked whole, one with a single marked test, one with none.
FILES = (
    "tests/sim/test_sim_timing.py",
    "tests/sim/test_sim_routes.py",
    "tests/unit/test_settings.py",
)


def collected(phase: str | None) -> tuple[int, list[str]]:
    env = {k: v for k, v in os.environ.items() if k != "SPECDECODE_TEST_QUIET"}
    if phase is not None:
        env["SPECDECODE_TEST_QUIET"] = phase
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *FILES],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    return done.returncode, ids


def test_the_parallel_run_and_the_live_speed_run_split_the_suite() -> None:
    rc_all, everything = collected(None)
    rc_defer, deferred = collected("defer")
    rc_only, quiet = collected("only")
    assert (rc_all, rc_defer, rc_only) == (0, 0, 0)
    assert sorted(deferred + quiet) == sorted(everything)  # each test in exactly one run
    assert not set(deferred) & set(quiet)
    timing = [i for i in everything if i.startswith("tests/sim/test_sim_timing.py::")]
    flush = "tests/sim/test_sim_routes.py::test_flush_cache_refused_while_a_request_runs"
    assert timing
    assert flush in everything
    assert sorted(quiet) == sorted([*timing, flush])


def test_a_misspelt_phase_is_a_usage_error_naming_the_variable() -> None:
    env = {**os.environ, "SPECDECODE_TEST_QUIET": "later"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         FILES[2]],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == pytest.ExitCode.USAGE_ERROR
    assert (
        "SPECDECODE_TEST_QUIET='later' (from the environment): expected one of defer, only, "
        "or unset it to run every test together"
    ) in done.stderr
