"""The machine-load rule and its record: when a run and its baseline were measured under loads
that differ enough to move tok/s, and what is written down (issue 13, item 3). The readers are
replaced, so nothing here depends on how busy the machine running the tests is."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_specdecode.errors import ConfigError
from pytest_specdecode.session import machine_load
from pytest_specdecode.session.machine_load import (
    LoadSampler,
    MachineLoad,
    comparison_warnings,
    held_back_by_load,
    load_warning,
    loads_differ,
    recording_warning,
)
from pytest_specdecode.settings import resolve
from pytest_specdecode.stats.comparison import Verdict
from pytest_specdecode.verdict import BaselineRef, Check, Threshold, evaluate, outcome_of


def load(per_cpu: float | None, cpus: int = 2) -> MachineLoad:
    return MachineLoad(
        cpus=cpus,
        runnable_per_cpu=per_cpu,
        loadavg=None,
        cpu_busy=None,
        cpu_steal=None,
        seconds=10.0,
    )


@pytest.mark.parametrize(
    ("current", "baseline", "differ"),
    [
        (0.2, 0.9, False),  # both below saturation: every task had a CPU
        (0.0, 0.99, False),
        (0.1, 1.1, True),  # a whole task per CPU more, and the busier side saturated
        (1.1, 0.1, True),  # either direction
        (1.5, 2.4, False),  # both busy, but less than a task per CPU apart
        (1.5, 2.5, True),
        (3.0, 0.0, True),
    ],
)
def test_the_rule(current: float, baseline: float, differ: bool) -> None:
    assert loads_differ(current, baseline) is differ


def test_the_warning_says_which_side_was_busier_and_what_that_does() -> None:
    busy_baseline = load_warning(load(0.2), load(2.0), "its own baseline")
    assert busy_baseline is not None
    assert "0.20 runnable tasks per CPU (2 CPUs) now, 2.00 runnable tasks per CPU" in busy_baseline
    assert "its own baseline was recorded on the busier machine" in busy_baseline
    assert "hide a slowdown" in busy_baseline

    busy_run = load_warning(load(2.0), load(0.2), "its own baseline")
    assert busy_run is not None
    assert "this run was measured on the busier machine" in busy_run

    assert load_warning(load(0.5), load(0.3), "its own baseline") is None
    assert load_warning(load(3.0), None, "its own baseline") is None  # an older baseline
    assert load_warning(load(None), load(3.0), "its own baseline") is None  # nothing known


def test_without_a_run_queue_the_load_average_per_cpu_stands_in() -> None:
    averaged = MachineLoad(2, None, (4.0, 3.0, 2.0), None, None, 5.0)
    assert averaged.per_cpu == 2.0
    assert "2.00 load per CPU (2 CPUs)" in averaged.describe()


def test_the_record_round_trips_and_odd_records_are_ignored() -> None:
    measured = MachineLoad(8, 1.25, (9.0, 8.0, 7.5), 0.93, 0.01, 12.34)
    data = measured.to_json()
    assert data == {
        "cpus": 8,
        "runnable_per_cpu": 1.25,
        "loadavg": [9.0, 8.0, 7.5],
        "cpu_busy": 0.93,
        "cpu_steal": 0.01,
        "seconds": 12.3,
        "declared": False,
    }
    assert MachineLoad.from_json(data) == MachineLoad(8, 1.25, (9.0, 8.0, 7.5), 0.93, 0.01, 12.3)
    for odd in (None, "busy", {}, {"cpus": "many"}, {"cpus": 2, "runnable_per_cpu": [1]}):
        assert MachineLoad.from_json(odd) is None


def test_only_timed_metrics_against_compared_baselines_are_warned_about() -> None:
    busy = {"cpus": 2, "runnable_per_cpu": 3.0}
    own = BaselineRef("its own baseline", {"tok_s": [1.0]}, machine_load=busy)
    other = BaselineRef("nospec's baseline", {"tok_s": [1.0]}, machine_load={"cpus": 2})
    missing = BaselineRef("eagle's baseline", None, problem="no baseline")
    refs = {None: own, "nospec": other, "eagle": missing}
    quiet = load(0.1)

    tok_s_twice = [Threshold("tok_s", -0.03), Threshold("ttft", -0.1)]
    assert len(comparison_warnings(quiet, tok_s_twice, refs)) == 1  # one per baseline
    assert comparison_warnings(quiet, [Threshold("accept_length", -0.05)], refs) == []
    # nospec's baseline recorded no load figure, eagle's has no samples: nothing to say.
    against = [Threshold("tok_s", 0.05, "nospec"), Threshold("tok_s", 0.05, "eagle")]
    assert comparison_warnings(quiet, against, refs) == []
    assert comparison_warnings(None, tok_s_twice, refs) == []  # --specdecode-machine-load off


def _checks(
    baseline_load: dict[str, float] | None, metric: str = "tok_s", drop: float = 0.10
) -> tuple[Check, ...]:
    """A drop against a -3% margin, measured tightly enough to FAIL."""
    baseline = [100.0 + 0.3 * (i % 5) for i in range(20)]
    current = [100.0 * (1 - drop) + 0.3 * (i % 5) for i in range(10)]
    ref = BaselineRef("its own baseline", {metric: baseline}, machine_load=baseline_load)
    return evaluate([Threshold(metric, -0.03)], {metric: current}, {None: ref}, alpha=0.05,
                    method="welch-log")  # fmt: skip


def test_a_fail_measured_on_a_much_busier_machine_is_not_called() -> None:
    quiet = {"cpus": 2, "runnable_per_cpu": 0.11}
    checks = _checks(quiet)
    assert outcome_of(checks).name == "FAIL"
    held = held_back_by_load(checks, load(4.9))
    assert held[0].verdict is Verdict.INCONCLUSIVE
    assert outcome_of(held).name == "INCONCLUSIVE"
    text = held[0].describe()
    assert (
        "Not called a FAIL: measured at 4.90 runnable tasks per CPU against 0.11 when its "
        "own baseline was recorded; that much busier a CPU can cost up to 9.6% on its own (2% "
        "per runnable task per CPU)" in text
    )
    # A drop beyond what the load could cost is the build's: a third slower at the same load,
    # or a tenth slower at 2.5 tasks per CPU (4.8% allowed), still FAILs.
    assert held_back_by_load(_checks(quiet, drop=0.33), load(4.9))[0].verdict is Verdict.FAIL
    assert held_back_by_load(checks, load(2.5))[0].verdict is Verdict.FAIL
    # Loads the rule calls alike, a busier baseline (which only hides slowdowns), an unknown
    # load on either side, a token count: the FAIL stands.
    assert held_back_by_load(checks, load(0.9)) == checks
    assert held_back_by_load(_checks({"cpus": 2, "runnable_per_cpu": 1.5}), load(2.2))[0].verdict \
        is Verdict.FAIL  # fmt: skip
    assert held_back_by_load(_checks({"cpus": 2, "runnable_per_cpu": 4.0}), load(0.1))[0].verdict \
        is Verdict.FAIL  # fmt: skip
    assert held_back_by_load(_checks(None), load(4.9))[0].verdict is Verdict.FAIL
    assert held_back_by_load(checks, None) == checks
    assert held_back_by_load(checks, load(None)) == checks
    counted = _checks(quiet, metric="accept_length")
    assert held_back_by_load(counted, load(4.9))[0].verdict is Verdict.FAIL


def test_recording_on_a_saturated_machine_is_said() -> None:
    said = recording_warning(load(1.6))
    assert said is not None
    assert "recorded on a busy machine (1.60 runnable tasks" in said
    assert recording_warning(load(0.8)) is None
    assert recording_warning(None) is None


def test_the_sampler_averages_the_run_queue_without_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queue = iter([5, 7, 9])
    monkeypatch.setattr(machine_load, "read_running", lambda: next(queue, 7))
    monkeypatch.setattr(machine_load, "cpu_count", lambda: 4)
    monkeypatch.setattr(machine_load, "read_loadavg", lambda: (1.0, 2.0, 3.0))
    times = iter([(100, 0, 1000), (150, 10, 1200)])
    monkeypatch.setattr(machine_load, "read_cpu_times", lambda: next(times))
    with LoadSampler(interval=3600) as sampler:  # only the samples at start and end
        pass
    measured = sampler.result()
    assert measured is not None
    assert measured.runnable_per_cpu == pytest.approx((6 - 1) / 4)  # mean of 5 and 7, less one
    assert measured.cpu_busy == pytest.approx(1 - 50 / 200)
    assert measured.cpu_steal == pytest.approx(10 / 200)
    assert measured.loadavg == (1.0, 2.0, 3.0)
    assert not measured.declared


def test_declared_and_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine_load, "cpu_count", lambda: 16)
    with LoadSampler(0.75) as declared:
        pass
    given = declared.result()
    assert given is not None
    assert given.declared
    assert given.per_cpu == 0.75
    assert "as declared" in given.describe()
    with LoadSampler("off") as off:
        pass
    assert off.result() is None


def test_the_setting(tmp_path: Path) -> None:
    def resolved(value: str) -> float | str:
        env = {"PYTEST_SPECDECODE_MACHINE_LOAD": value}
        settings = resolve(cli={}, ini={}, env=env, invocation_dir=tmp_path, ini_dir=tmp_path)
        return settings.machine_load

    assert resolved("measure") == "measure"
    assert resolved("OFF") == "off"
    assert resolved("0.5") == 0.5
    for bad in ("-1", "busy", "nan", "inf"):
        with pytest.raises(ConfigError, match="runnable tasks per CPU"):
            resolved(bad)
