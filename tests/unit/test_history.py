"""The history file (record, append under concurrency, read), the trend and its picture."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import struct
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import pytest
from reportdata import errored, night, scaled, seed_result, seed_results

from pytest_specdecode.outputs import history as history_module
from pytest_specdecode.outputs.history import (
    HISTORY_SCHEMA_PATH,
    BadLines,
    HistoryError,
    append_history,
    history_record,
    read_history,
)
from pytest_specdecode.outputs.trend import format_table, select, trend
from pytest_specdecode.outputs.trend_plot import (
    ERRORED_KEY,
    INSTALL_HINT,
    PlotDependencyError,
    plot_trend,
    trend_figure,
)
from pytest_specdecode.result import SpecdecodeResult as Result
from pytest_specdecode.result import TestError

SESSION = {
    "started_utc": "2026-11-29T02:40:00Z",
    "finished_utc": "2026-11-29T03:00:00Z",
    "target": "sim",
    "pytest_args": ["perf_tests"],
    "exit_status": 0,
}
TWO_STEP = "eagle3-2step-nccl"


def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(HISTORY_SCHEMA_PATH.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


# --------------------------------------------------------------------------- the record


def test_history_record_of_a_real_run_validates_against_its_schema() -> None:
    record = json.loads(json.dumps(history_record(seed_results(), session_info=SESSION)))
    errors = sorted(validator().iter_errors(record), key=str)
    assert not errors, [e.message for e in errors]
    assert record["time_utc"] == "2026-11-29T03:00:00Z"
    assert record["commit"] == "a5b2868ea434262dcfa65210e880453eba9b1d07"
    assert record["hardware_keys"] == ["simulated"]
    assert record["simulated"] is True
    assert record["gpu"] is None  # the simulated run saw no GPU
    assert [t["profile"] for t in record["tests"]] == [
        "nospec-nccl",
        "eagle3-5step",
        "eagle3-5step-nccl",
        TWO_STEP,
    ]
    broken = json.loads(json.dumps(record))
    broken["tests"][0]["outcome"] = "ok"
    assert not validator().is_valid(broken)


def test_history_record_keeps_means_cis_and_the_baseline_it_was_judged_against() -> None:
    result = scaled(seed_result(TWO_STEP), 0.9, baseline_std=0.02)
    test = history_record([result], session_info=SESSION)["tests"][0]
    assert test["outcome"] == "fail"
    tok = test["metrics"]["tok_s"]
    assert tok["n"] == result.runs
    assert tok["ci_low"] < tok["mean"] < tok["ci_high"]
    own, accept, versus = test["checks"]
    assert (own["metric"], own["reference"], own["verdict"]) == ("tok_s", None, "fail")
    assert own["ratio"] == pytest.approx(0.9)
    assert own["threshold"] == pytest.approx(own["baseline_mean"] * 0.97)
    assert own["baseline_std"] == pytest.approx(own["baseline_mean"] * 0.02)
    assert accept["threshold"] == pytest.approx(accept["baseline_mean"] * 0.95)
    assert versus["reference"] == "nospec-nccl"
    assert versus["threshold"] == pytest.approx(versus["baseline_mean"] * 1.05)


def test_history_record_names_the_gpus_and_defaults_its_time() -> None:
    data = seed_result().to_json()
    gpu = {"names": ["NVIDIA H100 80GB HBM3"] * 8, "count": 8, "driver": "570.86.15"}
    data["provenance"]["gpu"] = gpu
    record = history_record([Result.from_json(data)], session_info={})
    assert record["gpu"] == gpu
    written = datetime.fromisoformat(record["time_utc"].replace("Z", "+00:00"))
    assert abs((datetime.now(timezone.utc) - written).total_seconds()) < 60
    assert validator().is_valid(json.loads(json.dumps(record)))


def test_baseline_spread_is_null_when_the_check_does_not_carry_it() -> None:
    test = history_record([seed_result(TWO_STEP)], session_info=SESSION)["tests"][0]
    assert all(c["baseline_std"] is None for c in test["checks"])
    assert all(c["baseline_mean"] is not None for c in test["checks"])


# --------------------------------------------------------------------------- append and read


def test_append_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "ci" / "history" / "perf.jsonl"
    records = [night(1), night(2, {TWO_STEP: 0.9})]
    for record in records:
        append_history(path, record)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2
    assert read_history(path) == records


def test_append_refuses_what_is_not_a_history_record(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    with pytest.raises(HistoryError, match="build it with history_record"):
        append_history(path, {"tests": []})
    with pytest.raises(HistoryError, match="not JSON"):
        append_history(path, {**night(1), "oops": object()})
    assert not path.exists()


def _append_many(path: str, worker: int, count: int) -> None:
    base = night(1)
    for index in range(count):
        # Well above PIPE_BUF (4 KiB): a plain O_APPEND write of this size may interleave.
        record = {**base, "run_id": f"w{worker}-{index}", "padding": "x" * (worker * 3000)}
        append_history(Path(path), record)


def test_concurrent_appends_lose_and_tear_no_line(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    workers, count = 6, 60
    context = multiprocessing.get_context("spawn")
    children = [
        context.Process(target=_append_many, args=(str(path), w, count)) for w in range(workers)
    ]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=120)
        assert child.exitcode == 0
    records = read_history(path)  # raises on any torn line
    run_ids = [r["run_id"] for r in records]
    assert len(run_ids) == workers * count
    assert set(run_ids) == {f"w{w}-{i}" for w in range(workers) for i in range(count)}
    for record in records:
        worker = int(record["run_id"][1:].split("-")[0])
        assert record["padding"] == "x" * (worker * 3000)
    # Each worker's own records keep their order.
    for w in range(workers):
        mine = [r for r in run_ids if r.startswith(f"w{w}-")]
        assert mine == [f"w{w}-{i}" for i in range(count)]


def test_a_bad_line_is_named_with_file_line_and_remedy(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    append_history(path, night(1))
    with path.open("a", encoding="utf-8") as handle:
        handle.write('{"schema_version": 1, "time_utc": "2026-11-02T03:00:00Z", "tes\n')
    append_history(path, night(3))
    with pytest.raises(HistoryError) as caught:
        read_history(path)
    message = str(caught.value)
    assert f"{path}:2: not JSON" in message
    assert "fix or delete that line" in message

    skipped: list[HistoryError] = []
    records = read_history(path, on_bad_line=skipped.append)
    assert [r["time_utc"] for r in records] == ["2026-11-01T03:00:00Z", "2026-11-03T03:00:00Z"]
    assert len(skipped) == 1
    assert f"{path}:2:" in str(skipped[0])


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("[1, 2]", "a list, not a JSON object"),
        ('{"time_utc": "2026-11-02T03:00:00Z", "tests": []}', "no integer 'schema_version'"),
        (
            '{"schema_version": 7, "time_utc": "2026-11-02T03:00:00Z", "tests": []}',
            "schema version 7 was written by a newer pytest-specdecode",
        ),
        ('{"schema_version": 1, "time_utc": "yesterday", "tests": []}', "'yesterday' is not"),
        (
            '{"schema_version": 1, "time_utc": "2026-11-02T03:00:00Z", "tests": [{"test_id": '
            '"t", "profile": "p", "outcome": "great", "hardware_key": "h", "metrics": {}, '
            '"checks": []}]}',
            "outcome 'great' is not one of",
        ),
    ],
)
def test_malformed_records_are_explained(tmp_path: Path, line: str, expected: str) -> None:
    path = tmp_path / "history.jsonl"
    path.write_text(line + "\n", encoding="utf-8")
    with pytest.raises(HistoryError) as caught:
        read_history(path)
    assert str(caught.value).startswith(f"{path}:1: ")
    assert expected in str(caught.value)


def test_a_missing_history_file_says_how_it_is_made(tmp_path: Path) -> None:
    with pytest.raises(HistoryError, match=r"does not exist.*--specdecode-history"):
        read_history(tmp_path / "none.jsonl")


# --------------------------------------------------------------------------- trend


def _row(records: list[dict[str, Any]], profile: str = TWO_STEP, **kw: Any) -> Any:
    table = trend(records, **kw)
    (row,) = [r for r in table.rows if r.profile == profile]
    return row


def test_a_single_bad_night_is_shown_but_not_flagged() -> None:
    records = [night(1), night(2), night(3, {TWO_STEP: 0.9})]
    row = _row(records)
    assert row.flags == ()
    assert not row.regressed
    assert row.status.startswith("watch: tok_s")
    assert not trend(records).regressed


def test_two_bad_nights_in_a_row_are_a_regression() -> None:
    records = [night(1), night(2, {TWO_STEP: 0.9}), night(3, {TWO_STEP: 0.9})]
    row = _row(records)
    assert row.regressed
    (flag,) = row.flags
    assert (flag.kind, flag.check, flag.length, flag.ongoing) == ("regression", "tok_s", 2, True)
    assert flag.first_commit is not None
    assert flag.first_commit.startswith("02")
    assert row.status == "REGRESSION: tok_s (2 sessions)"
    assert [r.profile for r in trend(records).regressed] == [TWO_STEP]


def test_alternating_bad_nights_are_never_flagged() -> None:
    records = [night(d, {TWO_STEP: 0.9} if d % 2 else None) for d in range(1, 8)]
    row = _row(records)
    assert row.flags == ()


def test_a_recovered_regression_stays_flagged_but_not_ongoing() -> None:
    slow = {TWO_STEP: 0.9}
    records = [night(1), night(2, slow), night(3, slow), night(4, slow), night(5), night(6)]
    row = _row(records)
    (flag,) = row.flags
    assert (flag.length, flag.ongoing) == (3, False)
    assert not row.regressed
    assert row.status == "ok (recovered from 1 regression(s))"


def test_persist_three_needs_three_nights() -> None:
    slow = {TWO_STEP: 0.9}
    records = [night(1), night(2, slow), night(3, slow)]
    assert not _row(records, persist=3).regressed
    assert _row([*records, night(4, slow)], persist=3).regressed
    assert _row([night(1, slow)], persist=1).regressed


def test_sessions_without_a_judgement_neither_extend_nor_break_a_run() -> None:
    slow = {TWO_STEP: 0.9}
    recording = night(3)
    for test in recording["tests"]:
        test["outcome"] = "recorded"
        for check in test["checks"]:
            check.update(compared=False, verdict=None, ratio=None, ci_low=None, ci_high=None)
    records = [night(1), night(2, slow), recording, night(4, slow)]
    row = _row(records)
    (flag,) = row.flags
    assert flag.length == 2
    assert row.regressed


def test_an_accept_length_drop_is_flagged_on_its_own() -> None:
    drop = {TWO_STEP: 0.8}
    records = [night(1), night(2, accept=drop), night(3, accept=drop)]
    row = _row(records)
    assert [(f.check, f.kind) for f in row.flags] == [("accept_length", "regression")]


def test_a_lasting_improvement_is_flagged_as_such() -> None:
    fast = {"nospec-nccl": 1.08}
    row = _row([night(1), night(2, fast), night(3, fast)], profile="nospec-nccl")
    assert [(f.kind, f.ongoing) for f in row.flags] == [("improvement", True)]
    assert row.status.startswith("improved: tok_s")
    assert not row.regressed


def test_records_are_ordered_by_time_not_by_file_order() -> None:
    slow = {TWO_STEP: 0.9}
    records = [night(3), night(1, slow), night(2, slow)]  # the last night recovered
    row = _row(records)
    assert [p.time.day for p in row.points] == [1, 2, 3]
    assert not row.regressed


def test_trend_rejects_a_meaningless_persistence() -> None:
    with pytest.raises(ValueError, match="persist=0"):
        trend([night(1)], persist=0)


def test_select_keeps_the_last_sessions_and_the_chosen_profiles() -> None:
    records = [night(3), night(1), night(2)]
    chosen = select(records, profiles=["nospec-nccl"], last=2)
    assert [r["run_id"] for r in chosen] == ["night-2", "night-3"]
    assert all([t["profile"] for t in r["tests"]] == ["nospec-nccl"] for r in chosen)


def test_trend_table_lines() -> None:
    slow = {TWO_STEP: 0.9}
    lines = format_table(trend([night(1), night(2, slow), night(3, slow)]))
    text = "\n".join(lines)
    assert lines[0].startswith("SIMULATED:")
    row = next(line for line in lines if "test_eagle3_2step" in line)
    assert "eagle3-2step-nccl (simulated)" in row
    assert "| PFF " in row
    assert "-10.0%" in row
    assert "REGRESSION: tok_s (2 sessions)" in row
    assert "tok_s regression: 2 sessions in a row, 2026-11-02 03:00 → 2026-11-03 03:00" in text
    assert "a change is flagged after 2 consecutive judged sessions" in text


# --------------------------------------------------------------------------- picture


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    length, chunk = struct.unpack(">I4s", data[8:16])
    assert (length, chunk) == (13, b"IHDR")
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_plot_trend_writes_a_png_of_the_requested_size(tmp_path: Path) -> None:
    pytest.importorskip(
        "matplotlib", reason="the trend picture needs matplotlib (the 'plot' extra)"
    )
    slow = {TWO_STEP: 0.9}
    records = [night(1), night(2, slow), night(3, slow, accept={"eagle3-5step": 0.9})]
    path = plot_trend(records, tmp_path / "out" / "trend.png", size=(900, 640))
    assert path == tmp_path / "out" / "trend.png"
    assert _png_size(path) == (900, 640)
    assert sorted(p.name for p in path.parent.iterdir()) == ["trend.png"]  # no temp file left

    only_nospec = select(records, profiles=["nospec-nccl"])  # no accept length at all
    assert _png_size(plot_trend(only_nospec, tmp_path / "nospec.png")) == (1200, 800)


def test_plot_trend_rejects_bad_sizes_and_empty_histories(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"size=\(0, 600\)"):
        plot_trend([night(1)], tmp_path / "t.png", size=(0, 600))
    with pytest.raises(ValueError, match="no tests"):
        plot_trend([], tmp_path / "t.png")
    with pytest.raises(ValueError, match="no tests"):
        plot_trend([{**night(1), "tests": []}], tmp_path / "t.png")  # sessions, but no tests


def errored_night(day: int, profiles: tuple[str, ...] = (TWO_STEP,)) -> dict[str, Any]:
    """The history record of a session on 2026-11-``day`` at 03:00 UTC in which the server of
    every test of ``profiles`` did not start: no values, outcome "error"."""
    crash = TestError(phase="setup", type="ServerStartError", cause="server did not start")
    results = [errored(profile, crash) for profile in profiles]
    return history_record(
        results,
        session_info={
            **SESSION,
            "started_utc": f"2026-11-{day:02d}T02:40:00Z",
            "finished_utc": f"2026-11-{day:02d}T03:00:00Z",
            "exit_status": 1,
        },
    )


def _errored_marks(ax: Any) -> list[Any]:
    return [line for line in ax.get_lines() if line.get_gid() == "errored"]


def _series_colors(ax: Any) -> dict[str, Any]:
    """The line colour of each test's series (its error bar line), by legend label."""
    return {
        c.get_label(): c.lines[0].get_color() for c in ax.containers if c.get_label()[:1] != "_"
    }


def test_plot_trend_marks_an_errored_session_at_its_time_pinned_below_the_values() -> None:
    mpl = pytest.importorskip(
        "matplotlib", reason="the trend picture needs matplotlib (the 'plot' extra)"
    )
    import matplotlib.dates as mdates

    # the third session had only errored tests: the two-step and the no-spec servers died
    records = [night(1), night(2), errored_night(3, ("nospec-nccl", TWO_STEP))]
    figure = trend_figure(records)
    crash_x = mdates.date2num(datetime(2026, 11, 3, 3, 0, tzinfo=timezone.utc))
    tok_s, accept = figure.axes[:2]
    colors = _series_colors(tok_s)
    for ax, profiles in ((tok_s, {"nospec-nccl", TWO_STEP}), (accept, {TWO_STEP})):
        marks = _errored_marks(ax)
        # one mark per errored test in the panel of a metric it measures (no-spec has no
        # accept length), in the colour of that test's line
        assert sorted(mpl.colors.to_hex(m.get_color()) for m in marks) == sorted(
            mpl.colors.to_hex(colors[p]) for p in profiles
        )
        for mark in marks:
            assert list(mark.get_xdata()) == [pytest.approx(crash_x)]
            # x in data, y in axes coordinates: pinned near the bottom, not a value
            assert mark.get_transform().contains_branch_seperately(ax.transData) == (True, False)
            assert 0.0 < mark.get_ydata()[0] < 0.3
            assert mark.get_marker() == "$E$"
        assert len({m.get_ydata()[0] for m in marks}) == len(marks)  # never on top of each other
        # the y axis is lowered so that every value lies above the strip of E's
        low, high = ax.get_ylim()
        assert (ax.dataLim.y0 - low) / (high - low) > max(m.get_ydata()[0] for m in marks)
        low, high = ax.get_xlim()
        assert low < crash_x < high  # the x axis gives the all-errored session its date
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert ERRORED_KEY in legend
        assert ERRORED_KEY == "errored or crashed (no value)"
    assert "3 session(s), 1 with tests that errored or crashed" in figure.get_suptitle()

    no_error = trend_figure([night(1), night(2)])
    assert not any(_errored_marks(ax) for ax in no_error.axes)
    assert ERRORED_KEY not in [t.get_text() for t in no_error.axes[0].get_legend().get_texts()]
    assert "with tests that errored" not in no_error.get_suptitle()


def test_plot_trend_draws_a_history_in_which_every_test_errored(tmp_path: Path) -> None:
    mpl = pytest.importorskip(
        "matplotlib", reason="the trend picture needs matplotlib (the 'plot' extra)"
    )
    import matplotlib.dates as mdates

    profiles = ("nospec-nccl", TWO_STEP)
    records = [errored_night(day, profiles) for day in (4, 6)]
    figure = trend_figure(records)
    days = [mdates.date2num(datetime(2026, 11, d, 3, 0, tzinfo=timezone.utc)) for d in (4, 6)]
    colors = set()
    for ax in figure.axes[:2]:
        marks = _errored_marks(ax)
        assert len(marks) == 2  # a test never measured: its errors are in every panel
        for mark in marks:
            assert list(mark.get_xdata()) == pytest.approx(days)
            colors.add(mpl.colors.to_hex(mark.get_color()))
        low, high = ax.get_xlim()
        assert low < days[0]
        assert days[1] < high
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        # each test's colour is named although it has no line, and the mark is explained
        assert legend[:2] == list(profiles)
        assert ERRORED_KEY in legend
        assert "errored or crashed" in " ".join(t.get_text() for t in ax.texts)
    assert len(colors) == 2
    assert "2 session(s), 2 with tests that errored or crashed" in figure.get_suptitle()
    assert _png_size(plot_trend(records, tmp_path / "e.png", size=(800, 500))) == (800, 500)

    (single,) = trend_figure(records[:1]).axes[:1]  # one session: a day either side of its date
    assert single.get_xlim() == pytest.approx((days[0] - 1.0, days[0] + 1.0))


def test_plot_trend_without_matplotlib_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(sys.modules):
        if name == "matplotlib" or name.startswith("matplotlib."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(PlotDependencyError) as caught:
        plot_trend([night(1)], tmp_path / "t.png")
    assert INSTALL_HINT in str(caught.value)
    assert INSTALL_HINT == "pip install 'pytest-specdecode[plot]'"
    assert not (tmp_path / "t.png").exists()


# --------------------------------------------------------------------------- a failed append


def _failing_write(monkeypatch: pytest.MonkeyPatch, error: BaseException, keep: int) -> None:
    """``os.write`` in the history module writes ``keep`` bytes of the first write that is
    longer than that, then raises ``error`` on the next call, as a full disk or a dying disk
    does (the first call succeeds partly, the next fails)."""
    real = os.write
    calls = {"n": 0}

    def write(fd: int, data: Any) -> int:
        calls["n"] += 1
        if calls["n"] == 1 and len(data) > keep:
            return real(fd, bytes(data[:keep]))
        if calls["n"] >= 2:
            raise error
        return real(fd, data)

    # the history module's os alone: pytest's own writes meanwhile are left alone
    monkeypatch.setattr(history_module, "os", SimpleNamespace(**{**vars(os), "write": write}))


@pytest.mark.parametrize(
    ("error", "says"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), "the file system holding it is full"),
        (OSError(errno.EIO, "Input/output error"), "the disk reported an I/O error"),
        (KeyboardInterrupt("signal 15"), None),
    ],
    ids=["ENOSPC", "EIO", "SIGTERM"],
)
def test_an_append_that_fails_half_way_leaves_the_history_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: BaseException, says: str | None
) -> None:
    path = tmp_path / "history.jsonl"
    append_history(path, night(1))
    before = path.read_bytes()
    _failing_write(monkeypatch, error, keep=2346)

    with pytest.raises(type(error) if says is None else HistoryError) as caught:
        append_history(path, night(2))

    assert path.read_bytes() == before  # the 2,346 bytes that fitted were cut back
    assert [r["run_id"] for r in read_history(path)] == ["night-1"]
    if says is not None:
        message = str(caught.value)
        assert f"could not append the session's history to {path}" in message
        assert f"the history is as it was ({len(before)} bytes)" in message
        assert says in message
        assert "permissions" not in message  # a full or failing disk is not a permission
    monkeypatch.undo()
    append_history(path, night(3))  # the next night appends as if nothing happened
    assert [r["run_id"] for r in read_history(path)] == ["night-1", "night-3"]


def test_a_denied_path_is_still_a_matter_of_permissions(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the history's folder should be\n")
    with pytest.raises(HistoryError) as caught:
        append_history(blocker / "history.jsonl", night(1))
    assert "check the path (--specdecode-history) and its permissions" in str(caught.value)


def _tmpfs(directory: Path, size: str) -> bool:
    """Mount a tmpfs of ``size`` on ``directory``; False where this machine will not."""
    if sys.platform != "linux" or os.geteuid() != 0:
        return False
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


def test_a_full_file_system_keeps_the_history_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a real full tmpfs where the machine allows a mount (root in CI), else with the stand-in
    that fails the write the way a full disk does: either way the same assertions run."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = _tmpfs(disk, "64k")
    try:
        path = disk / "history.jsonl"
        append_history(path, night(1))
        before = path.read_bytes()
        big = {**night(2), "padding": "x" * 200_000}  # more than the disk holds
        if not mounted:
            _failing_write(monkeypatch, OSError(errno.ENOSPC, "No space left on device"), 2346)
        with pytest.raises(HistoryError, match=r"\[Errno 28\] No space left on device") as caught:
            append_history(path, big)
        assert "the file system holding it is full" in str(caught.value)
        assert "permissions" not in str(caught.value)
        assert path.read_bytes() == before
        monkeypatch.undo()
        append_history(path, night(3))
        assert [r["run_id"] for r in read_history(path)] == ["night-1", "night-3"]
        print(f"full disk: {'a 64 KiB tmpfs' if mounted else 'the stand-in (no mount here)'}")
    finally:
        if mounted:
            subprocess.run(["umount", str(disk)], check=True)


# --------------------------------------------------------------------------- a torn last line


def test_the_next_append_moves_a_torn_last_line_aside_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    append_history(path, night(1))
    whole = json.dumps(night(2)).encode()
    with path.open("ab") as handle:
        handle.write(whole[:2346])  # a writer killed mid-line: no newline

    note = append_history(path, night(3))

    assert note is not None
    assert note.startswith(f"{path}:2: the last line was cut off (2,346 bytes and no newline")
    assert f"moved to {path}.torn" in note
    assert Path(f"{path}.torn").read_bytes() == whole[:2346] + b"\n"
    assert [r["run_id"] for r in read_history(path)] == [
        "night-1",
        "night-3",
    ]  # strict: no bad line
    assert append_history(path, night(4)) is None  # nothing left to mend


def test_a_whole_record_without_its_newline_only_gets_the_newline(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    path.write_text(json.dumps(night(1)), encoding="utf-8")  # added by hand, no newline
    note = append_history(path, night(2))
    assert note == f"{path}:1: the last line had no newline at its end; added before this session's"
    assert [r["run_id"] for r in read_history(path)] == ["night-1", "night-2"]
    assert not Path(f"{path}.torn").exists()


def test_a_torn_line_that_cannot_be_moved_is_fenced_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "history.jsonl"
    append_history(path, night(1))
    with path.open("ab") as handle:
        handle.write(b'{"schema_version": 1, "tim')
    Path(f"{path}.torn").mkdir()  # the aside file cannot be opened

    note = append_history(path, night(3))

    assert note is not None
    assert "it could not be moved to" in note
    assert "stays as line 2" in note
    skipped: list[HistoryError] = []
    assert [r["run_id"] for r in read_history(path, on_bad_line=skipped.append)] == [
        "night-1",
        "night-3",
    ]
    assert len(skipped) == 1
    assert str(skipped[0]).startswith(f"{path}:2: not JSON")


# --------------------------------------------------------------------------- the session's readers


def test_the_sessions_readers_name_each_bad_line_once_and_go_on(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    append_history(path, night(1))
    with path.open("ab") as handle:
        handle.write(b"garbage\n")
    append_history(path, night(3))
    with path.open("ab") as handle:
        handle.write(b'{"schema_version": 1, "time_utc": "2026-11-04T0')  # torn, last

    warnings: list[str] = []
    start_read = read_history(path, on_bad_line=BadLines(warnings))
    dashboard_read = read_history(path, on_bad_line=BadLines(warnings))  # the same session

    assert [r["run_id"] for r in start_read] == ["night-1", "night-3"]
    assert dashboard_read == start_read
    assert len(warnings) == 2  # each line once, however many readers
    garbage, torn = warnings
    assert garbage.startswith(f"history line skipped: {path}:2: not JSON")
    assert torn.startswith(f"history line skipped: {path}:4: the last line has no newline")
    assert "a crash or a full disk" in torn
    assert all("--skip-bad-lines" not in w for w in warnings)  # not an option of pytest
    assert all("fix or delete that line" in w for w in warnings)


def test_a_strict_reader_names_the_option_that_skips(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    path.write_bytes(b"garbage\n")
    with pytest.raises(HistoryError) as caught:
        read_history(path)
    assert str(caught.value).startswith(f"{path}:1: not JSON")
    assert "pass --skip-bad-lines to report it and go on" in str(caught.value)
