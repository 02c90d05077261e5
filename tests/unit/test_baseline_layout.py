"""What a recorded result's baseline file gets: its samples and runs per launch."""

from __future__ import annotations

import pytest

from pytest_specdecode.fingerprint import Fingerprint
from pytest_specdecode.result import Outcome, SpecdecodeResult
from pytest_specdecode.session.baseline_launches import baseline_record


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


TOK_S = [100.0, 101.0, 99.0, 97.0, 98.0, 96.0]


def test_every_metric_in_every_run_keeps_the_launches() -> None:
    result = recorded({"tok_s": TOK_S, "ttft": [0.1] * 6}, [3, 3])
    record, notes = baseline_record(result, created_unix=1.0)
    assert record.launch_runs == (3, 3)
    assert record.samples == {"tok_s": tuple(TOK_S), "ttft": (0.1,) * 6}
    assert notes == []
    assert record.test_id == "test_perf.py::test_a"
    assert record.created_unix == 1.0


def test_a_metric_missing_from_some_runs_is_left_out_and_named_not_the_launches() -> None:
    # seen on a slow machine: two of six short responses came in one chunk, so no ITL
    result = recorded(
        {"tok_s": TOK_S, "itl_p50": [0.01] * 4, "itl_p99": [0.02] * 4, "ttft": [0.1] * 6},
        [3, 3],
    )
    record, notes = baseline_record(result, created_unix=1.0)
    assert record.launch_runs == (3, 3)
    assert sorted(record.samples) == ["tok_s", "ttft"]
    assert notes == [
        f"{name} is left out of the baseline: 4 of the 6 runs yielded it, and a baseline over "
        "2 server launches needs one value per run (a longer workload gives every run one)"
        for name in ("itl_p50", "itl_p99")
    ]
    assert result.samples["itl_p50"] == [0.01] * 4  # the result itself keeps what it measured


@pytest.mark.parametrize("launch_runs", [[6], []])
def test_one_launch_keeps_every_metric(launch_runs: list[int]) -> None:
    result = recorded({"tok_s": TOK_S, "itl_p50": [0.01] * 4}, launch_runs)
    record, notes = baseline_record(result, created_unix=1.0)
    assert record.samples["itl_p50"] == (0.01,) * 4
    assert notes == []
    assert record.launch_runs == (6,)
