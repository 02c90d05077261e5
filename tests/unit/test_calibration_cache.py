"""The disk memo of the sequential plans' calibration: the same answer, computed once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_specdecode.stats import power_analysis, sequential
from pytest_specdecode.stats.calibration_cache import cache_dir, code_digest, memoized
from pytest_specdecode.stats.sequential import SequentialPlan


def test_a_stored_calibration_is_read_back_bit_for_bit_and_computed_once(tmp_path: Path):
    calls: list[int] = []

    def compute() -> tuple[float, ...]:
        calls.append(1)
        return (0.1 + 0.2, 1 / 3, 2.5e-17)

    key = {"looks": [5, 6], "alpha": 0.05}
    first = memoized(key, compute, directory=tmp_path)
    again = memoized(dict(reversed(list(key.items()))), compute, directory=tmp_path)
    assert again == first == (0.1 + 0.2, 1 / 3, 2.5e-17)
    assert len(calls) == 1
    assert memoized({**key, "alpha": 0.1}, compute, directory=tmp_path) == first
    assert len(calls) == 2  # another key is another calibration


def test_a_torn_or_foreign_file_is_computed_again_and_an_unwritable_cache_is_no_error(
    tmp_path: Path,
):
    key = {"looks": [5]}
    memoized(key, lambda: (0.5,), directory=tmp_path)
    (stored,) = tmp_path.glob("*.json")
    stored.write_text('{"key": {"looks": [5]}, "values": [0.5')  # torn
    assert memoized(key, lambda: (0.25,), directory=tmp_path) == (0.25,)
    stored.write_text(json.dumps({"key": {"looks": [6]}, "values": [0.9]}))  # another key's
    assert memoized(key, lambda: (0.125,), directory=tmp_path) == (0.125,)
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the directory should be
    assert memoized(key, lambda: (0.75,), directory=blocked / "calibration") == (0.75,)


def test_the_code_digest_changes_with_the_code_and_not_between_processes():
    def one(x: float) -> bool:
        return x in {"a", "b", "c"}

    def other(x: float) -> bool:
        return x in {"a", "b", "d"}

    assert code_digest([one]) == code_digest([one])
    assert code_digest([one]) != code_digest([other])


def test_the_plans_levels_come_from_the_simulation_and_then_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("PYTEST_SPECDECODE_CALIBRATION_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path
    plan = SequentialPlan(initial_runs=4, max_runs=6).for_baseline(7)
    looks = plan.looks()
    simulated = sequential._simulate_look_alphas(looks, plan.alpha, plan.spending, 7)
    sequential._nominal_look_alphas.cache_clear()
    assert plan.look_alphas() == simulated
    (stored,) = tmp_path.glob("*.json")
    # A later process reads the file instead of simulating (marked here so it shows)
    content = json.loads(stored.read_text())
    content["values"] = [value / 2 for value in content["values"]]
    stored.write_text(json.dumps(content))
    sequential._nominal_look_alphas.cache_clear()
    assert plan.look_alphas() == tuple(value / 2 for value in simulated)
    sequential._nominal_look_alphas.cache_clear()


MDE_IN_A_FRESH_PROCESS = """
import json, sys
from pytest_specdecode.stats.power_analysis import min_detectable_effect
mde = min_detectable_effect(5, 15, 0.03, 0.05)
print(json.dumps([mde, "scipy.optimize" in sys.modules]))
"""


def test_the_mdes_noncentrality_is_solved_once_and_later_processes_skip_the_root_finder(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "PYTEST_SPECDECODE_CALIBRATION_CACHE": str(tmp_path)}

    def fresh_process() -> tuple[float, bool]:
        done = subprocess.run(
            [sys.executable, "-c", MDE_IN_A_FRESH_PROCESS],
            env=env, capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
        mde, imported = json.loads(done.stdout)
        return float(mde), bool(imported)

    first, solved = fresh_process()
    assert solved  # the first process solved it, with scipy.optimize's brentq
    (stored,) = tmp_path.glob("*.json")
    assert json.loads(stored.read_text())["key"]["noncentrality_for_power"] == [5, 15, 0.05, 0.8]
    again, imported = fresh_process()
    assert again == first  # bit for bit
    assert not imported  # read from the cache: the root finder was never imported
    # and the stored value is what this process solves
    stored_value = json.loads(stored.read_text())["values"][0]
    assert power_analysis._solve_noncentrality(5, 15, 0.05, 0.8) == stored_value
