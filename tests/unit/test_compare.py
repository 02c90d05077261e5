"""``python -m pytest_specdecode compare OLD NEW``: two saved runs judged as a live run judges.

The reports are built from ``data/seed_results.json`` (one real run of the example suite on the
simulated server) with the report writer itself; the baseline files with the baseline store's
record type.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from reportdata import seed_results

from pytest_specdecode.__main__ import EXIT_OK, EXIT_REGRESSION, EXIT_USAGE, main
from pytest_specdecode.baselines.baseline import BaselineRecord
from pytest_specdecode.outputs.json_report import build_report, write_report
from pytest_specdecode.result import SpecdecodeResult, TestError
from pytest_specdecode.stats.comparison import compare

TWO_STEP = "eagle3-2step-nccl"
INFO = {
    "started_utc": "2026-11-01T03:00:00Z",
    "finished_utc": "2026-11-01T03:20:00Z",
    "target": "sim",
    "pytest_args": ["perf_tests"],
    "exit_status": 0,
}


def run(*argv: str | Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["compare", *(str(a) for a in argv)], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def slowed(results: list[SpecdecodeResult], profile: str, factor: float) -> None:
    for result in results:
        if result.profile == profile:
            for name in ("tok_s", "decode_tok_s"):
                result.samples[name] = [v * factor for v in result.samples[name]]


def report(path: Path, results: list[SpecdecodeResult]) -> Path:
    write_report(path, build_report(results, session_info=INFO))
    return path


def row(out: str, test: str) -> str:
    (line,) = [line for line in out.splitlines() if line.startswith(f"| {test} ")]
    return line


@pytest.fixture
def old(tmp_path: Path) -> Path:
    return report(tmp_path / "old.json", seed_results())


def test_the_same_run_twice_passes_every_test_and_exits_0(old: Path) -> None:
    code, out, err = run(old, old)
    assert (code, err) == (EXIT_OK, "")
    assert out.splitlines()[:2] == [
        f"compare: OLD {old}",
        f"compare: NEW {old} (judged against OLD: 'vs baseline')",
    ]
    assert "SIMULATED: these figures come from" in out
    for result in seed_results():
        assert row(out, result.test_id.split("::")[1]).rstrip(" |").endswith("PASS")
    assert out.rstrip().endswith("compared: 4 pass")


def test_a_slower_new_run_fails_with_the_live_statistics_and_exits_1(
    old: Path, tmp_path: Path
) -> None:
    results = seed_results()
    slowed(results, TWO_STEP, 0.9)
    code, out, _ = run(old, report(tmp_path / "new.json", results))
    assert code == EXIT_REGRESSION == 1
    line = row(out, "test_eagle3_2step_nccl_beats_no_speculation")
    assert "| -10.0% [" in line
    assert line.rstrip(" |").endswith("FAIL")
    # The verdict is stats.comparison.compare's, at the marker's margin and the default alpha.
    before = next(r for r in seed_results() if r.profile == TWO_STEP).samples["tok_s"]
    after = next(r for r in results if r.profile == TWO_STEP).samples["tok_s"]
    expected = compare(after, before, margin=-0.03, alpha=0.15, alpha_no_change=0.01)
    assert f"ratio {expected.ratio:.3f} with one-sided 85% bounds" in out
    assert f"[{expected.ci_low:.3f}, {expected.ci_high:.3f}]" in out
    assert f"output tok/s vs OLD ({old}): FAIL." in out
    # against= needs another profile's baseline, which neither file holds: said, not dropped.
    assert "not repeated offline: tok_s +5% vs nospec-nccl's baseline" in out
    assert "compared: 3 pass, 1 fail" in out


def test_margins_come_from_the_report_and_margin_replaces_them(old: Path, tmp_path: Path) -> None:
    results = seed_results()
    slowed(results, TWO_STEP, 0.9)
    new = report(tmp_path / "new.json", results)
    code, out, _ = run(old, new, "--margin", "tok_s=-0.2")
    assert code == EXIT_OK
    assert "margins: tok_s -20.0% for every test (--margin)" in out
    assert row(out, "test_eagle3_2step_nccl_beats_no_speculation").rstrip(" |").endswith("PASS")


def baseline_file(directory: Path, result: SpecdecodeResult) -> Path:
    record = BaselineRecord(
        test_id=result.test_id,
        profile=result.profile,
        hardware_key=result.hardware_key,
        simulated=result.simulated,
        workload_name=result.workload_name,
        workload_hash=result.workload_hash,
        fingerprint=result.fingerprint,
        samples={k: tuple(v) for k, v in result.samples.items()},
        provenance={},
        created_unix=1.0,
    )
    path = directory / f"{result.test_id.split('::')[1]}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(record.to_text())
    return path


def test_baseline_files_and_directories_compare_at_the_default_margin(
    old: Path, tmp_path: Path
) -> None:
    results = seed_results()
    for result in results[:3]:
        baseline_file(tmp_path / "baselines" / "sub", result)
    code, out, _ = run(tmp_path / "baselines", old)
    assert code == EXIT_OK
    assert "tests without (baseline files, a recording run): tok_s -3.0%" in out
    assert "only in NEW (1), not compared:" in out
    assert f"  {results[3].test_id} [{results[3].profile}] ({old})" in out
    assert "compared: 3 pass, 0 only in OLD, 1 only in NEW" in out

    slowed(results, results[0].profile, 0.8)
    one = baseline_file(tmp_path / "slow", results[0])
    code, out, _ = run(tmp_path / "baselines", one)
    assert code == EXIT_REGRESSION
    assert "only in OLD (2), not compared:" in out
    assert "output tok/s vs OLD" in out


def test_a_changed_configuration_is_a_mismatch_unless_allowed(old: Path, tmp_path: Path) -> None:
    data = json.loads(old.read_text())
    data["tests"][0]["fingerprint"]["hard"]["tp_size"] = 4
    changed = tmp_path / "tp4.json"
    changed.write_text(json.dumps(data))
    code, out, _ = run(old, changed)
    assert code == EXIT_REGRESSION
    assert row(out, "test_no_speculation_nccl_tuned").rstrip(" |").endswith("MISMATCH")
    assert "not compared: OLD and NEW ran different configurations (tp_size):" in out
    assert "tp_size: OLD 8, NEW 4" in out

    code, out, _ = run(old, changed, "--allow-mismatch")
    assert code == EXIT_OK
    assert "warning: compared, but these differ: tp_size: OLD 8, NEW 4" in out


def errored(result: SpecdecodeResult) -> SpecdecodeResult:
    return SpecdecodeResult.errored(
        result.test_id,
        profile=result.profile,
        simulated=result.simulated,
        hardware_key=result.hardware_key,
        workload_name=result.workload_name,
        workload_hash=result.workload_hash,
        fingerprint=result.fingerprint,
        error=TestError("setup", "ServerStartError", "the server exited while loading"),
    )


def test_a_test_that_errored_in_new_fails_and_one_that_errored_in_old_has_no_baseline(
    old: Path, tmp_path: Path
) -> None:
    results = seed_results()
    broken = report(tmp_path / "broken.json", [errored(results[0]), *results[1:]])
    code, out, _ = run(old, broken)
    assert code == EXIT_REGRESSION
    assert "ERROR: no runs in NEW: ServerStartError in setup" in row(
        out, "test_no_speculation_nccl_tuned"
    )
    code, out, _ = run(broken, old)
    assert code == EXIT_OK
    assert row(out, "test_no_speculation_nccl_tuned").rstrip(" |").endswith("NO BASELINE")
    assert "OLD has no runs of this test: ServerStartError in setup" in out


def write(path: Path, data: Any) -> Path:
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("{", "is not valid JSON (line 1, column 2"),
        ({"hello": 1}, "is neither a pytest-specdecode JSON report"),
        (
            {"kind": "pytest-specdecode report", "schema_version": 99, "tests": []},
            "report schema_version 99 is not one this version reads (1)",
        ),
        (
            {"kind": "pytest-specdecode report", "schema_version": 1, "tests": [{"x": 1}]},
            "tests[0]: is not a test of a pytest-specdecode report",
        ),
        ({"test_id": "t", "samples": {}}, "is not a valid baseline file"),
    ],
)
def test_an_unreadable_file_exits_2_naming_it(
    old: Path, tmp_path: Path, content: Any, says: str
) -> None:
    bad = write(tmp_path / "bad.json", content)
    code, out, err = run(old, bad)
    assert (code, out) == (EXIT_USAGE, "")
    assert err.startswith(f"python -m pytest_specdecode compare: error: {bad}")
    assert says in err


def test_missing_paths_empty_directories_duplicates_and_bad_flags_exit_2(
    old: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(old, tmp_path / "nope.json")
    assert code == EXIT_USAGE
    assert f"{tmp_path / 'nope.json'}: no such file or directory" in err
    (tmp_path / "empty").mkdir()
    code, _, err = run(tmp_path / "empty", old)
    assert code == EXIT_USAGE
    assert "no *.json files under this directory" in err
    both = tmp_path / "both"
    both.mkdir()
    report(both / "a.json", seed_results())
    report(both / "b.json", seed_results())
    code, _, err = run(both, old)
    assert code == EXIT_USAGE
    assert "appears twice (also in" in err
    for flag in (["--margin", "tok=-0.1"], ["--margin", "tok_s=x"], ["--alpha", "0.7"]):
        code, _, _ = run(old, old, *flag)  # argparse writes its usage errors to sys.stderr
        assert code == EXIT_USAGE, flag
        assert flag[1] in capsys.readouterr().err
