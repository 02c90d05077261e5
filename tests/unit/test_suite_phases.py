"""scripts/test's four runs of this suite split it, and lose nothing: the parallel run
(SPECDECODE_TEST_QUIET=defer), the lane beside it (=waiting), the live-speed run after them
(=only) and the run beside that one (=beside) together collect every test exactly once: the
live-speed run exactly the quiet_machine tests, the lane exactly those under WAITING_TESTS and
the run beside the live-speed one exactly those under BESIDE_THE_QUIET_TESTS
(tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# One module marked whole, one with a single marked test, one with none; one of the waiting
# lane; and two that run beside the live-speed tests: a file of a folder that runs there whole,
# and a file named alone in a folder that does not.
FILES = (
    "tests/sim/test_sim_timing.py",
    "tests/sim/test_sim_routes.py",
    "tests/sim/test_sim_openai.py",
    "tests/sim/test_sim_faults.py",
    "tests/unit/test_settings.py",
    "tests/e2e/test_warnings_e2e.py",
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


def test_the_four_runs_split_the_suite() -> None:
    rc_all, everything = collected(None)
    rc_defer, deferred = collected("defer")
    rc_waiting, waiting = collected("waiting")
    rc_only, quiet = collected("only")
    rc_beside, beside = collected("beside")
    assert (rc_all, rc_defer, rc_waiting, rc_only, rc_beside) == (0, 0, 0, 0, 0)
    # each test in exactly one run
    assert sorted(deferred + waiting + quiet + beside) == sorted(everything)
    assert len(set(deferred + waiting + quiet + beside)) == len(everything)
    timing = [i for i in everything if i.startswith("tests/sim/test_sim_timing.py::")]
    flush = "tests/sim/test_sim_routes.py::test_flush_cache_refused_while_a_request_runs"
    assert timing
    assert flush in everything
    assert sorted(quiet) == sorted([*timing, flush])
    faults = [i for i in everything if i.startswith("tests/sim/test_sim_faults.py::")]
    assert faults
    assert sorted(waiting) == sorted(faults)
    unit_and_warnings = [i for i in everything if i.startswith(FILES[4:])]
    assert unit_and_warnings
    assert sorted(beside) == sorted(unit_and_warnings)
    assert any(i.startswith("tests/sim/test_sim_openai.py::") for i in deferred)


def test_a_misspelt_phase_is_a_usage_error_naming_the_variable() -> None:
    env = {**os.environ, "SPECDECODE_TEST_QUIET": "later"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         FILES[4]],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == pytest.ExitCode.USAGE_ERROR
    assert (
        "SPECDECODE_TEST_QUIET='later' (from the environment): expected one of defer, waiting, "
        "beside, only, "
        "or unset it to run every test together"
    ) in done.stderr
