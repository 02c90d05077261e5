"""``python -m pytest_specdecode report HISTORY``: table, picture, exit status."""

from __future__ import annotations

import io
import os
import random
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from reportdata import night

from pytest_specdecode.__main__ import EXIT_OK, EXIT_REGRESSION, EXIT_USAGE, main
from pytest_specdecode.outputs.history import append_history

TWO_STEP = "eagle3-2step-nccl"
SLOW = {TWO_STEP: 0.9}


def write_history(path: Path, records: list[dict[str, Any]]) -> Path:
    for record in records:
        append_history(path, record)
    return path


def run(*argv: str | Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main([str(a) for a in argv], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def healthy(tmp_path: Path) -> Path:
    return write_history(tmp_path / "history.jsonl", [night(1), night(2), night(3)])


@pytest.fixture
def regressed(tmp_path: Path) -> Path:
    return write_history(
        tmp_path / "history.jsonl", [night(1), night(2), night(3, SLOW), night(4, SLOW)]
    )


def test_a_healthy_history_prints_the_table_and_exits_0(healthy: Path) -> None:
    code, out, err = run("report", healthy)
    assert code == EXIT_OK == 0
    assert err == ""
    lines = out.splitlines()
    assert lines[0].startswith("SIMULATED:")
    for name in (
        "test_no_speculation_nccl_tuned",
        "test_eagle3_5step_without_nccl_tuning",
        "test_eagle3_5step_nccl_tuned",
        "test_eagle3_2step_nccl_beats_no_speculation",
    ):
        (row,) = [line for line in lines if f"| {name} " in line]
        assert "| PPP " in row
        assert row.rstrip(" |").endswith("ok")
    assert "3 session(s)" in out
    assert "flags:" not in out


def test_a_persistent_regression_exits_1_and_is_described(regressed: Path) -> None:
    code, out, _ = run("report", regressed)
    assert code == EXIT_REGRESSION == 1
    row = next(line for line in out.splitlines() if "| test_eagle3_2step" in line)
    assert "REGRESSION: tok_s (2 sessions)" in row
    assert "| PPFF " in row
    assert "tok_s regression: 2 sessions in a row, 2026-11-03 03:00 → 2026-11-04 03:00" in out
    assert "(ongoing)" in out


def test_one_bad_night_is_not_an_alarm(tmp_path: Path) -> None:
    path = write_history(tmp_path / "h.jsonl", [night(1), night(2), night(3, SLOW)])
    code, out, _ = run("report", path)
    assert code == EXIT_OK
    assert "watch: tok_s worse in the latest session (not yet flagged)" in out


def test_persist_and_last_change_what_counts_as_persistent(regressed: Path) -> None:
    assert run("report", regressed, "--persist", "3")[0] == EXIT_OK
    assert run("report", regressed, "--persist", "1")[0] == EXIT_REGRESSION
    code, out, _ = run("report", regressed, "--last", "1")
    assert code == EXIT_OK
    assert "1 session(s)" in out
    assert "insufficient data" in out


def test_profile_selects_rows_and_an_unknown_profile_is_an_error(regressed: Path) -> None:
    code, out, _ = run("report", regressed, "--profile", "nospec-nccl", "--profile", "eagle3-5step")
    assert code == EXIT_OK  # the regressed profile is not selected
    rows = [line for line in out.splitlines() if line.startswith("| test_")]
    assert len(rows) == 2
    assert all("nospec-nccl" in r or "eagle3-5step " in r for r in rows)

    code, _, err = run("report", regressed, "--profile", "eagle3-2step")
    assert code == EXIT_USAGE
    assert "--profile eagle3-2step: no such profile" in err
    assert "eagle3-2step-nccl" in err  # the profiles it does have


def test_a_malformed_history_exits_2_naming_the_line(regressed: Path) -> None:
    with regressed.open("a", encoding="utf-8") as handle:
        handle.write("not json\n")
    code, out, err = run("report", regressed)
    assert code == EXIT_USAGE
    assert out == ""
    assert f"{regressed}:5: not JSON" in err

    code, out, err = run("report", regressed, "--skip-bad-lines")
    assert code == EXIT_REGRESSION
    assert f"skipping {regressed}:5: not JSON" in err
    assert "4 session(s)" in out


def test_a_missing_file_and_bad_usage_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run("report", tmp_path / "absent.jsonl")
    assert code == EXIT_USAGE
    assert "does not exist" in err

    assert run()[0] == EXIT_USAGE
    assert run("report", tmp_path / "x", "--size", "big")[0] == EXIT_USAGE
    assert "is not WIDTHxHEIGHT" in capsys.readouterr().err
    assert run("report", tmp_path / "x", "--last", "0")[0] == EXIT_USAGE
    assert "must be 1 or more" in capsys.readouterr().err
    assert run("--version")[0] == EXIT_OK


def test_png_is_drawn_at_the_requested_size(regressed: Path, tmp_path: Path) -> None:
    pytest.importorskip(
        "matplotlib", reason="the trend picture needs matplotlib (the 'plot' extra)"
    )
    png = tmp_path / "pictures" / "trend.png"
    code, out, _ = run("report", regressed, "--png", png, "--size", "800x500")
    assert code == EXIT_REGRESSION
    assert f"trend picture: {png} (800x500 px)" in out
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == (800, 500)


def test_python_dash_m_runs_the_command_line(regressed: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        [sys.executable, "-m", "pytest_specdecode", "report", str(regressed)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == EXIT_REGRESSION, done.stderr
    assert "REGRESSION: tok_s (2 sessions)" in done.stdout
    help_text = subprocess.run(
        [sys.executable, "-m", "pytest_specdecode", "report", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=True,
    ).stdout
    assert "exit status: 0 ok, 1 a persistent regression is flagged" in help_text


def test_the_cross_night_detector_flags_a_persistent_drop_and_dates_it(tmp_path: Path) -> None:
    """Nights with a 3 % launch-to-launch spread and a 10 % drop of the 2-step profile from
    night 17: no single night FAILs it reliably, the detector does, dates it and draws it."""
    rng = random.Random(3)
    records = []
    for day in range(1, 25):
        drop = 0.9 if day >= 17 else 1.0
        jitter = {p: drop * (1.0 + rng.gauss(0.0, 0.03)) for p in (TWO_STEP,)}
        records.append(night(day, jitter))
    history = write_history(tmp_path / "history.jsonl", records)
    png = tmp_path / "trend.png"
    code, out, _ = run("report", history, "--reference-nights", "12", "--png", png)
    assert code == EXIT_REGRESSION
    assert "across nights (scan/h)" in out
    assert "REGRESSION across nights: tok_s -" in out
    (line,) = [ln for ln in out.splitlines() if "estimated to start at night" in ln]
    assert TWO_STEP in line
    # the estimate lands on the first slower night, give or take one
    assert any(f"2026-11-{day:02d}" in line for day in (16, 17, 18)), line
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # with the defaults too: the detector watches from the first nights, it waits for no
    # 90-night reference
    code, out, _ = run("report", history)
    assert code == EXIT_REGRESSION
    assert "REGRESSION across nights: tok_s -" in out
