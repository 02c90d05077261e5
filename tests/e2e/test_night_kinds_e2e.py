"""A night that says what broke, and is never lost to one bad line (#46), end to end through pytest
and the simulated server: the exit status of each kind of night under ``--specdecode-exit-status
nightly`` (pytest's own without it), the Markdown and step summaries' first line, a night whose
servers all broke under ``-W error`` with ``--benchmark-json``, a full disk under the history,
bad history lines on the nightly path, and output paths checked before any server launches.

The tests whose names say ``benchmark`` also run on the oldest and the newest pytest-benchmark
(scripts/test-compat.sh).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import Project

TESTS = """
import pytest

@pytest.mark.specdecode("nospec", workload="fast", tok_s=-0.1)
def test_nospec():
    pass
"""
# No margin, so no verdict: the nights that test the history's writing and reading hold
# whatever the machine's speed (outcome "measured", a night that is ok unless its outputs fail).
MEASURED = """
import pytest

@pytest.mark.specdecode("nospec", workload="fast")
def test_nospec():
    pass
"""
RUNS = ("--specdecode-runs", "5", "--specdecode-max-runs", "5")
RECORD = ("--update-baselines", "--specdecode-baseline-runs", "5", "--specdecode-force-baseline")
NIGHTLY = "--specdecode-exit-status=nightly"

DYING_PROFILE = """
# Exits about a second into its load (speed 1: real seconds).
[profiles.dies]
extra_args = ["--sim-speed", "1", "--sim-load-seconds", "1", "--sim-fault", "exit-during-load"]
"""

EARLIER_NIGHT = '{"schema_version":1,"time_utc":"2026-11-01T03:00:00Z","tests":[]}\n'


def recorded(project: Project) -> Project:
    project.tests(TESTS)
    project.run(*RECORD).assert_outcomes(passed=1)
    (project.path / "out").mkdir()  # pytest-benchmark up to 5.2 opens its JSON file early
    return project


@pytest.mark.quiet_machine  # a size of change read off the client's clock, against 5 runs
def test_a_slower_build_keeps_pytests_status_unless_the_night_asks_for_its_own_benchmark(
    quiet_project: Project,
) -> None:
    # on the quiet profiles, alone: a baseline of 5 runs recorded beside the parallel run's
    # load measured at CV 18% and a twice slower build as -21%, INCONCLUSIVE (a CI run of
    # 2026-12-06 on a loaded machine)
    project = quiet_project
    recorded(project)
    slow = {"SPECDECODE_SIM_SLOWDOWN": "2"}  # the build twice as slow: FAIL at -10%

    plain = project.run_with_env(slow, *RUNS, "--benchmark-json=out/bench.json")
    assert plain.ret == 1  # pytest's "a test failed"
    plain.stdout.fnmatch_lines(
        ["night: REGRESSED: the build regressed: 1 test FAILed (test_nospec)"]
    )

    # the ini key (and so the nightly script's flag) gives the night its own status
    ini = project.path / "tox.ini"
    ini.write_text(ini.read_text().rstrip("\n") + "\nspecdecode_exit_status = nightly\n")
    step_summary = project.path / "step-summary.md"
    nightly = project.run_with_env(
        {**slow, "GITHUB_STEP_SUMMARY": str(step_summary)}, *RUNS, "--benchmark-json=out/bench.json"
    )
    assert nightly.ret == 10
    nightly.stdout.fnmatch_lines(
        ["night: REGRESSED: the build regressed (exit status 10): 1 test FAILed (test_nospec)"]
    )
    assert step_summary.read_text().splitlines()[0] == (
        "## pytest-specdecode: REGRESSED: the build regressed (exit status 10)"
    )
    (entry,) = json.loads((project.path / "out" / "bench.json").read_text())["benchmarks"]
    assert entry["name"] == "test_nospec"


def test_a_night_whose_server_dies_loading_is_broken_not_an_internal_error_benchmark(
    project: Project,
) -> None:
    project.profiles(project.profiles().read_text() + DYING_PROFILE)
    project.tests(
        """
        import pytest

        @pytest.mark.specdecode("dies", workload="fast", tok_s=-0.1)
        def test_dies():
            pass
        """
    )
    (project.path / "out").mkdir()
    # -W error: pytest-benchmark's "Not saving anything, no benchmarks have been run!" is an
    # exception in its own pytest_sessionfinish; it made this night exit 3 (#46)
    result = project.run(
        "-W", "error", NIGHTLY, "--benchmark-json=out/bench.json", "--specdecode-markdown=out/s.md"
    )

    assert result.ret == 11
    output = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in output
    assert "Not saving anything" not in output
    result.stdout.fnmatch_lines(
        [
            "pytest-benchmark JSON: *bench.json (no benchmarks: nothing was measured)",
            "night: BROKEN: the box or the setup is broken (exit status 11): 1 test errored or "
            "crashed (test_dies)",
        ]
    )
    bench = json.loads((project.path / "out" / "bench.json").read_text())
    assert bench["benchmarks"] == []
    assert "machine_info" in bench  # pytest-benchmark's own layout, from its own hooks
    summary = (project.path / "out" / "s.md").read_text().splitlines()
    assert (
        summary[0]
        == "## pytest-specdecode: BROKEN: the box or the setup is broken (exit status 11)"
    )
    assert summary[2] == "1 test errored or crashed (test_dies)"


# A stand-in for a full disk where this machine cannot mount a tmpfs: the history module's
# os.write writes what "fits" of the line, then fails as a full disk does.
FULL_DISK_STAND_IN = """
import errno
import os
import types

from pytest_specdecode.outputs import history

def _write(fd, data, calls=[]):
    calls.append(len(data))
    if len(calls) == 1:
        return os.write(fd, bytes(data[:2346]))
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

history.os = types.SimpleNamespace(**{**vars(os), "write": _write})
"""


def _fill(disk: Path, leave: int) -> None:
    """Fill the file system of ``disk`` but for ``leave`` bytes."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError:
            pass
    size = filler.stat().st_size
    os.truncate(filler, max(0, size - leave))


def test_a_full_disk_under_the_history_leaves_it_as_it_was_and_breaks_the_night(
    project: Project,
) -> None:
    project.tests(MEASURED)
    disk = project.path / "disk"
    disk.mkdir()
    mounted = (
        sys.platform == "linux"
        and os.geteuid() == 0
        and (
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)],
                capture_output=True,
                check=False,
            ).returncode
            == 0
        )
    )
    history = disk / "history.jsonl"
    try:
        # an earlier night that ends near the end of a page: tonight's line fits in part
        padded = json.loads(EARLIER_NIGHT) | {"note": "x" * 3900}
        history.write_text(json.dumps(padded) + "\n")
        if mounted:
            _fill(disk, leave=0)
        else:
            (project.path / "conftest.py").write_text(FULL_DISK_STAND_IN)
        before = history.read_bytes()

        result = project.run(*RUNS, NIGHTLY, f"--specdecode-history={history}")

        assert result.ret == 11
        result.assert_outcomes(passed=1)  # measured and judged; only the writing failed
        output = result.stdout.str()
        assert f"could not append the session's history to {history}: [Errno 28]" in output
        assert "nothing of this session's line was kept: the history is as it was" in output
        assert "the file system holding it is full" in output
        assert "permissions" not in output
        result.stdout.fnmatch_lines(["night: BROKEN: * 1 output(s) or baseline(s) not written"])
        assert history.read_bytes() == before  # whole or absent: absent
        print(f"full disk: {'a 64 KiB tmpfs' if mounted else 'the stand-in (no mount here)'}")
    finally:
        if mounted:
            subprocess.run(["umount", str(disk)], check=True)


def test_bad_history_lines_cost_the_night_nothing_and_are_named_once(project: Project) -> None:
    project.tests(MEASURED)
    history = project.path / "history.jsonl"
    torn = b'{"schema_version":1,"time_utc":"2026-11-03T03:00:00Z","te'
    history.write_bytes(EARLIER_NIGHT.encode() + b"garbage\n" + torn)

    result = project.run(
        *RUNS, NIGHTLY, f"--specdecode-history={history}", "--specdecode-html=site"
    )

    assert result.ret == 0, result.stdout.str()
    result.assert_outcomes(passed=1)
    output = result.stdout.str()
    section = output[output.index("= specdecode =") :]
    garbage = f"warning: history line skipped: {history}:2: not JSON"
    cut_off = f"warning: history line skipped: {history}:3: the last line has no newline"
    # once in the summary (the start's reader and the dashboard's, the same line, one warning)
    assert section.count(garbage) == 1
    assert section.count(cut_off) == 1
    assert f"{history}:3: the last line was cut off ({len(torn)} bytes" in section
    assert f"moved to {history}.torn" in section
    assert (project.path / "site" / "index.html").is_file()
    lines = history.read_bytes().split(b"\n")
    assert lines[:2] == [EARLIER_NIGHT.strip().encode(), b"garbage"]
    assert json.loads(lines[2])["tests"][0]["outcome"] == "measured"
    assert lines[3:] == [b""]
    assert Path(f"{history}.torn").read_bytes() == torn + b"\n"

    # an interactive report stops at the garbage and names the option that skips it
    strict = subprocess.run(
        [sys.executable, "-m", "pytest_specdecode", "report", str(history)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert strict.returncode == 2
    assert f"{history}:2: not JSON" in strict.stderr
    assert "pass --skip-bad-lines to report it and go on" in strict.stderr


@pytest.mark.parametrize(
    ("flag", "what"),
    [
        ("--specdecode-history", "file"),
        ("--specdecode-report", "file"),
        ("--specdecode-markdown", "file"),
        ("--specdecode-html", "folder"),
        ("--junitxml", "file"),
    ],
)
def test_an_output_that_cannot_be_written_stops_the_session_before_any_server_launches(
    project: Project, flag: str, what: str
) -> None:
    project.tests(TESTS)
    blocker = project.path / "out"
    blocker.write_text("a file where the outputs' folder should be\n")
    target = blocker / "nightly" / "output"

    result = project.run(NIGHTLY, f"{flag}={target}")

    assert result.ret == 4  # a usage error: nothing ran (the nightly script reports it as 11)
    result.stderr.fnmatch_lines(
        [
            f"ERROR: {flag}: cannot write the {what} {target}: {blocker} is a file, so the "
            f"folder {target.parent} cannot be created. It would be written at the end of the "
            "session, after every server launched and every test was measured, so nothing is "
            f"launched; give a path in a folder ({flag})"
        ]
    )
    assert "launched 1" not in result.stdout.str()
    assert not project.state_dir.exists() or not any(project.state_dir.rglob("*.json"))
    assert project.sim_processes() == []


def test_another_plugins_failure_at_the_end_breaks_an_ok_night_and_says_its_status(
    project: Project,
) -> None:
    project.tests(MEASURED)
    (project.path / "conftest.py").write_text(
        """
import pytest

@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    raise RuntimeError("a plugin fails at the end of the session")
"""
    )

    result = project.run(*RUNS, NIGHTLY)

    assert result.ret == 11  # not pytest's 3: the box or the setup, by the night's table
    result.stdout.fnmatch_lines(["ERROR: pytest_sessionfinish of *conftest.py* (exit status 11)*"])
