"""What a recorded result's baseline file gets: its samples and runs per launch."""

from __future__ import annotations

import pytest

from pytest_specdecode.baselines.baseline import BaselineRecord
from pytest_specdecode.fingerprint import Fingerprint
from pytest_specdecode.result import Outcome, SpecdecodeResult
from pytest_specdecode.session.baseline_launches import baseline_layout


def recorded(samples: dict[str, list[float]], launch_runs: list[int]) -> SpecdecodeResult:
    return SpecdecodeResult(
        test_id="test_perf.py::test_a",
        profile="nospec",
        simulated=True,
        hardware_key="simulated",
        workload_name="fast",
        workload_hash="0" * 16,
        fingerprint=Fingerprint(hard={"model": "m"}, soft={}),
        samples=samples,
        outcome=Outcome.RECORDED,
        message="recorded",
        launch_runs=launch_runs,
    )


def record_of(result: SpecdecodeResult) -> BaselineRecord:
    samples, launch_runs, _ = baseline_layout(result)
    return BaselineRecord(
        test_id=result.test_id,
        profile=result.profile,
        hardware_key=result.hardware_key,
        simulated=result.simulated,
        workload_name=result.workload_name,
        workload_hash=result.workload_hash,
        fingerprint=result.fingerprint,
        samples=samples,
        provenance={},
        created_unix=0.0,
        launch_runs=launch_runs,
    )


TOK_S = [100.0, 101.0, 99.0, 97.0, 98.0, 96.0]


def test_every_metric_in_every_run_keeps_the_launches() -> None:
    result = recorded({"tok_s": TOK_S, "ttft": [0.1] * 6}, [3, 3])
    samples, launch_runs, notes = baseline_layout(result)
    assert launch_runs == (3, 3)
    assert samples == {"tok_s": tuple(TOK_S), "ttft": (0.1,) * 6}
    assert notes == []
    assert record_of(result).launch_runs == (3, 3)


def test_a_metric_missing_from_some_runs_is_left_out_and_named_not_the_launches() -> None:
    # seen on a slow machine: two of six short responses came in one chunk, so no ITL
    result = recorded(
        {"tok_s": TOK_S, "itl_p50": [0.01] * 4, "itl_p99": [0.02] * 4, "ttft": [0.1] * 6},
        [3, 3],
    )
    samples, launch_runs, notes = baseline_layout(result)
    assert launch_runs == (3, 3)
    assert sorted(samples) == ["tok_s", "ttft"]
    assert notes == [
        f"{name} is left out of the baseline: 4 of the 6 runs yielded it, and a baseline over "
        "2 server launches needs one value per run (a longer workload gives every run one)"
        for name in ("itl_p50", "itl_p99")
    ]
    record = record_of(result)
    assert record.launch_runs == (3, 3)
    assert "itl_p50" not in record.samples


@pytest.mark.parametrize("launch_runs", [[6], []])
def test_one_launch_keeps_every_metric(launch_runs: list[int]) -> None:
    result = recorded({"tok_s": TOK_S, "itl_p50": [0.01] * 4}, launch_runs)
    samples, layout, notes = baseline_layout(result)
    assert samples["itl_p50"] == (0.01,) * 4
    assert layout == ()
    assert notes == []
    assert record_of(result).launch_runs == (6,)
