"""docs/nightly-ci.md, run as printed (#25 item 2): the blocks marked ``<!-- nightly-step: NAME
-->`` are read from the page, not copied here. The nightly script runs against the simulator
(``TARGET=sim``: the profile file's ``[targets.sim]`` overlay) in a copy of the example suite
with its committed baselines: green with every baseline, and each kind of red night with the
exit status the page's table gives it (#46): the build 40% slower (10); a server that exits
while loading, one that hangs, a baseline removed (11); every test INCONCLUSIVE (12); always
with ``--benchmark-json`` as the script gives it, and the broken nights under ``-W error``,
where pytest-benchmark's "Not saving anything" warning made an internal error. The tests whose
names say ``benchmark_json`` run again on the oldest and the newest pytest-benchmark
(scripts/test-compat.sh). The workflow, the systemd units and the cron line are checked to run
that script the same way.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "nightly-ci.md"
SCRIPT = "perf_tests/nightly.sh"
CHECKOUT = "/srv/perf-repo"  # where the systemd and cron examples keep the checkout
STEP = re.compile(r"^<!-- nightly-step: (\S+) -->\n```[a-z]*\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def nightly_steps() -> dict[str, str]:
    steps: dict[str, str] = dict(STEP.findall(DOC.read_text(encoding="utf-8")))
    assert set(steps) == {
        SCRIPT,
        ".github/workflows/nightly-perf.yml",
        "/etc/systemd/system/specdecode-nightly.service",
        "/etc/systemd/system/specdecode-nightly.timer",
        "crontab",
    }, "docs/nightly-ci.md lost or renamed a <!-- nightly-step: NAME --> block"
    return steps


def example_checkout(tmp_path: Path) -> Path:
    """The example suite and its committed (simulated) baselines, with the page's script."""
    repo = tmp_path / "repo"
    (repo / "perf_tests").mkdir(parents=True)
    for name in ("specdecode.toml", "test_seed.py"):
        shutil.copy(REPO / "perf_tests" / name, repo / "perf_tests" / name)
    shutil.copytree(REPO / "baselines", repo / "baselines")
    script = repo / SCRIPT
    script.write_text(nightly_steps()[SCRIPT])
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return repo


def night(repo: Path, tmp_path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    """The script as the schedulers start it, in a clean environment but for the variables the
    page sets (and PYTHONPATH, so a checkout's plugin is the one tested)."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("PYTEST_", "SPECDECODE_SIM_", "GITHUB_"))
    }
    env.update(
        PYTEST_SPECDECODE_STATE_DIR=str(tmp_path / "state"),
        PYTHON=sys.executable,
        TARGET="sim",
        OUT=str(tmp_path / "out"),
        HISTORY=str(tmp_path / "var" / "history.jsonl"),
        MARKERS="nospec",  # one profile of the four: the night's shape, a quarter of the time
    )
    env.update(extra)
    calibrations = os.environ.get("PYTEST_SPECDECODE_CALIBRATION_CACHE")
    if calibrations:
        env["PYTEST_SPECDECODE_CALIBRATION_CACHE"] = calibrations
    return subprocess.run(
        [str(repo / SCRIPT)],
        cwd=tmp_path,  # the script finds the repository itself, as systemd and cron start it
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def first_line(out: Path) -> str:
    """The Markdown summary's first line: the kind of night."""
    return (out / "summary.md").read_text().splitlines()[0]


def benchmark_entries(out: Path) -> list[dict[str, object]]:
    """The night's pytest-benchmark JSON, which must be whole JSON even when nothing ran."""
    entries: list[dict[str, object]] = json.loads((out / "benchmark.json").read_text())[
        "benchmarks"
    ]
    return entries


def launch_script(tmp_path: Path, *flags: str) -> dict[str, str]:
    """The environment that gives the night's one server these ``--sim-*`` flags."""
    script = tmp_path / "launches.txt"
    script.write_text(" ".join(flags) + "\n")
    return {"SPECDECODE_SIM_LAUNCH_SCRIPT": str(script)}


# Each broken night also runs under -W error, where pytest-benchmark's "Not saving anything, no
# benchmarks have been run!" is an exception in its pytest_sessionfinish: an internal error of
# the session, and an empty or absent --benchmark-json file, until the plugin wrote it.
STRICT = {"PYTEST_ADDOPTS": "-W error"}


@pytest.mark.quiet_machine  # the committed baselines' own -3% margins, live
def test_the_documented_night_passes_with_every_baseline(tmp_path: Path) -> None:
    repo = example_checkout(tmp_path)
    out, history = tmp_path / "out", tmp_path / "var" / "history.jsonl"
    # The history has seen a garbage line and a night cut off mid-append (no newline): neither
    # costs this night anything (#46).
    history.parent.mkdir(parents=True)
    history.write_bytes(b"garbage\n" + b'{"schema_version": 1, "time_utc": "2026-11-0')

    green = night(repo, tmp_path)

    assert green.returncode == 0, green.stdout + green.stderr
    assert "SIMULATED" in green.stdout
    for name in ("junit.xml", "report.json", "summary.md", "benchmark.json", "trend.png"):
        assert (out / name).stat().st_size > 0, name
    assert first_line(out) == "## pytest-specdecode: OK: nothing regressed (exit status 0)"
    assert (out / "trend-status").read_text().strip() == "0"
    assert "test_no_speculation_nccl_tuned" in (out / "trend.txt").read_text()
    # the session named each bad line (in its warnings: the header and the summary show them)
    assert f"warning: history line skipped: {history}:1: not JSON" in green.stdout
    assert f"warning: history line skipped: {history}:2: the last line has no" in green.stdout
    # its append moved the torn line aside; the trend skipped the garbage, naming it
    assert f"{history}:2: the last line was cut off (44 bytes" in green.stdout
    assert Path(f"{history}.torn").read_bytes() == b'{"schema_version": 1, "time_utc": "2026-11-0\n'
    lines = history.read_text().splitlines()
    assert len(lines) == 2
    assert lines[0] == "garbage"
    assert json.loads(lines[1])["tests"][0]["outcome"] == "pass"
    assert f"report: skipping {history}:1: not JSON" in green.stderr


# No live speed in the red nights: a 40% slower server FAILs a -3% margin, a missing baseline,
# a dead or hung server and a baseline that cannot decide fail on any machine, so these run
# beside the rest of the suite rather than in the quiet phase.
def test_the_documented_night_without_a_baseline_is_broken_with_benchmark_json(
    tmp_path: Path,
) -> None:
    repo = example_checkout(tmp_path)
    out, history = tmp_path / "out", tmp_path / "var" / "history.jsonl"
    missing = repo / "baselines/simulated/perf_tests/test_seed/test_no_speculation_nccl_tuned.json"
    missing.unlink()

    red = night(repo, tmp_path, **STRICT)

    assert red.returncode == 11, red.stdout + red.stderr
    assert "1 failed" in red.stdout
    assert str(missing) in red.stdout  # the failure names the file it expected
    assert "INTERNALERROR" not in red.stdout + red.stderr
    assert 'failures="1"' in (out / "junit.xml").read_text()
    assert len(history.read_text().splitlines()) == 1  # a red night is still a night of history
    assert first_line(out) == (
        "## pytest-specdecode: BROKEN: the box or the setup is broken (exit status 11)"
    )
    assert (
        "1 test had no baseline (test_no_speculation_nccl_tuned)"
        in (out / "summary.md").read_text()
    )
    assert len(benchmark_entries(out)) == 1  # measured, then failed for want of a baseline


def test_the_documented_night_of_a_server_that_exits_while_loading_with_benchmark_json(
    tmp_path: Path,
) -> None:
    repo = example_checkout(tmp_path)
    out = tmp_path / "out"

    red = night(repo, tmp_path, **STRICT, **launch_script(tmp_path, "--sim-fault exit-during-load"))

    assert red.returncode == 11, red.stdout + red.stderr
    assert "INTERNALERROR" not in red.stdout + red.stderr
    assert "Not saving anything" not in red.stdout + red.stderr
    assert "ServerStartError in setup: server 'nospec-nccl' exited with code -9" in red.stdout
    assert first_line(out) == (
        "## pytest-specdecode: BROKEN: the box or the setup is broken (exit status 11)"
    )
    assert "night: BROKEN: the box or the setup is broken (exit status 11): 1 test errored" in (
        red.stdout
    )
    assert benchmark_entries(out) == []  # pytest-benchmark's own layout, no benchmark
    assert f"pytest-benchmark JSON: {out / 'benchmark.json'} (no benchmarks" in red.stdout


def test_the_documented_night_of_a_server_that_hangs_with_benchmark_json(tmp_path: Path) -> None:
    repo = example_checkout(tmp_path)
    out = tmp_path / "out"
    hang = launch_script(tmp_path, "--sim-fault hang")

    red = night(repo, tmp_path, **STRICT, **hang, PYTEST_SPECDECODE_STALL_TIMEOUT="2")

    assert red.returncode == 11, red.stdout + red.stderr
    assert "INTERNALERROR" not in red.stdout + red.stderr
    assert "ServerHungError" in red.stdout
    assert first_line(out) == (
        "## pytest-specdecode: BROKEN: the box or the setup is broken (exit status 11)"
    )
    assert benchmark_entries(out) == []


def test_the_documented_night_of_a_slower_build_regressed_with_benchmark_json(
    tmp_path: Path,
) -> None:
    repo = example_checkout(tmp_path)
    out = tmp_path / "out"

    red = night(repo, tmp_path, SPECDECODE_SIM_SLOWDOWN="1.4")  # the box 40% slower

    assert red.returncode == 10, red.stdout + red.stderr
    assert (
        first_line(out) == "## pytest-specdecode: REGRESSED: the build regressed (exit status 10)"
    )
    assert "1 test FAILed (test_no_speculation_nccl_tuned)" in (out / "summary.md").read_text()
    (entry,) = benchmark_entries(out)
    assert entry["fullname"] == "perf_tests/test_seed.py::test_no_speculation_nccl_tuned"


def test_the_documented_night_that_judges_nothing_with_benchmark_json(tmp_path: Path) -> None:
    repo = example_checkout(tmp_path)
    out = tmp_path / "out"
    # A baseline as wide as a coin toss (tok/s x2 and x0.5 in turn, its log mean kept): no
    # number of tonight's runs can tell a -3% margin either way, so the test is INCONCLUSIVE.
    path = repo / "baselines/simulated/perf_tests/test_seed/test_no_speculation_nccl_tuned.json"
    baseline = json.loads(path.read_text())
    tok_s = baseline["samples"]["tok_s"]
    baseline["samples"]["tok_s"] = [v * (2.0 if i % 2 else 0.5) for i, v in enumerate(tok_s)]
    path.write_text(json.dumps(baseline))

    unsure = night(repo, tmp_path, PYTEST_SPECDECODE_MAX_RUNS="5")

    assert unsure.returncode == 12, unsure.stdout + unsure.stderr
    assert "1 xfailed" in unsure.stdout
    assert first_line(out) == (
        "## pytest-specdecode: NOT JUDGED: nothing could be judged (exit status 12)"
    )
    assert len(benchmark_entries(out)) == 1


def test_the_real_target_refuses_an_interpreter_without_sglang(tmp_path: Path) -> None:
    # The old page's workflow made a fresh venv: no SGLang there, every launch would fail.
    repo = example_checkout(tmp_path)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", tmp_path / "fresh"], check=True)

    result = night(repo, tmp_path, TARGET="real", SGLANG_PYTHON=str(tmp_path / "fresh/bin/python"))

    assert result.returncode == 11  # the box or the setup
    assert f"nightly: no SGLang in {tmp_path / 'fresh/bin/python'}" in result.stderr
    assert not (tmp_path / "out" / "junit.xml").exists()  # stopped before pytest


def test_the_workflow_runs_the_script_with_an_interpreter_that_has_sglang(tmp_path: Path) -> None:
    import yaml  # here: the compat venvs run this file's other tests without PyYAML

    workflow = yaml.safe_load(nightly_steps()[".github/workflows/nightly-perf.yml"])
    job = workflow["jobs"]["perf"]
    steps = job["steps"]
    runs = [step["run"] for step in steps if "run" in step]

    assert job["env"]["TARGET"] == "real"
    assert job["env"]["PYTHON"].startswith("/")  # an installed venv, not a fresh .venv
    assert [step for step in steps if step.get("run", "").strip() == SCRIPT]
    install = next(run for run in runs if "pip install" in run)
    assert install.strip().startswith('"$PYTHON" -m pip install')  # the plugin joins SGLang's venv
    for index, run in enumerate(runs):
        path = tmp_path / f"step{index}.sh"
        path.write_text(run)
        check = subprocess.run(["bash", "-n", path], capture_output=True, text=True, check=False)
        assert check.returncode == 0, (run, check.stderr)


def unit_entries(text: str) -> dict[str, dict[str, list[str]]]:
    """A systemd unit file's sections and their ``key=value`` entries (keys may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, sep, value = line.partition("=")
        assert current is not None, f"{line!r} before any [Section]"
        assert sep, f"{line!r} is not key=value"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def environment(entries: list[str]) -> dict[str, str]:
    return dict(entry.split("=", 1) for entry in entries)


def test_the_systemd_units_and_the_cron_line_run_the_same_script_the_same_way(
    tmp_path: Path,
) -> None:
    steps = nightly_steps()
    service_path = "/etc/systemd/system/specdecode-nightly.service"
    timer_path = "/etc/systemd/system/specdecode-nightly.timer"
    service = unit_entries(steps[service_path])
    timer = unit_entries(steps[timer_path])

    assert service["Service"]["ExecStart"] == [f"{CHECKOUT}/{SCRIPT}"]
    assert service["Service"]["WorkingDirectory"] == [CHECKOUT]
    assert service["Service"]["Type"] == ["oneshot"]
    env = environment(service["Service"]["Environment"])
    assert env["TARGET"] == "real"
    # The timer starts the service of its own name, every night, and is enabled by timers.target.
    assert "Unit" not in timer["Timer"]
    assert Path(timer_path).stem == Path(service_path).stem
    assert timer["Timer"]["OnCalendar"]
    assert timer["Install"]["WantedBy"] == ["timers.target"]

    # The cron line: five time fields, then the script with the service's variables.
    (cron,) = [line for line in steps["crontab"].splitlines() if line.strip()]
    fields = cron.split(None, 5)
    assert len(fields) == 6
    command = shlex.split(fields[5].replace("&&", " && "))
    assert f"cd {CHECKOUT}" in fields[5]
    assert SCRIPT in command
    cron_env = dict(word.split("=", 1) for word in command if re.match(r"^[A-Z_]+=", word))
    assert cron_env == env

    import yaml

    workflow = yaml.safe_load(steps[".github/workflows/nightly-perf.yml"])
    assert workflow["jobs"]["perf"]["env"]["PYTHON"] == env["PYTHON"]

    analyze = shutil.which("systemd-analyze")
    if analyze is not None:
        # systemd's own check, with the checkout where this test made one.
        repo = example_checkout(tmp_path)
        units = tmp_path / "units"
        units.mkdir()
        for path in (service_path, timer_path):
            (units / Path(path).name).write_text(steps[path].replace(CHECKOUT, str(repo)))
        verify = subprocess.run(
            [analyze, "verify", *(str(p) for p in sorted(units.iterdir()))],
            capture_output=True,
            text=True,
            check=False,
        )
        assert verify.returncode == 0, verify.stderr
        assert "specdecode-nightly" not in verify.stderr, verify.stderr  # no warning about ours
