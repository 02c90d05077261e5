"""A fleet of two hosts, for real: two Docker engines on this machine (two daemons, their own
sockets and data roots: scripts/provision-docker-fleet.sh), the simulated server's image on
both, the plugin placing profiles on them through ``[hosts.NAME]`` (issue 14).

Needs ``SPECDECODE_FLEET_DOCKER_HOSTS="unix:///... unix:///..."`` (scripts/test exports it);
without it these tests skip, unless ``SPECDECODE_REQUIRE_DOCKER=1`` (CI), which fails them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import docker
import pytest

ENGINES = os.environ.get("SPECDECODE_FLEET_DOCKER_HOSTS", "").split()

if len(ENGINES) < 2:
    if os.environ.get("SPECDECODE_REQUIRE_DOCKER") == "1":
        raise RuntimeError(
            "SPECDECODE_REQUIRE_DOCKER=1 but SPECDECODE_FLEET_DOCKER_HOSTS does not name two "
            "engines: run scripts/provision-docker-fleet.sh (scripts/test does)"
        )
    pytest.skip(
        "no two Docker engines (SPECDECODE_FLEET_DOCKER_HOSTS); scripts/provision-docker-fleet.sh",
        allow_module_level=True,
    )

FLEET = """
[defaults]
launcher = "docker"
image = "pytest-specdecode-sim:local"
server_module = "pytest_specdecode.sim"
network = "host"
tp_size = 8
model_path = "/models/tiny-llm"
startup_timeout = 120
warmup_requests = 1

[hosts.box-a]
docker_host = "{a}"
gpus = 8
hardware = "8xSIM-A"

[hosts.box-b]
docker_host_env = "FLEET_BOX_B"
gpus = 8

[profiles.on-a]
hosts = ["box-a"]
extra_args = [{args}]

[profiles.on-b]
hosts = ["box-b"]
extra_args = [{args}]

[workloads.fast]
prompt_set = "mixed"
max_new_tokens = 64
concurrency = 1
requests_per_run = 2
warmup_requests = 1
"""
FAST = '"--sim-speed", "50", "--sim-load-seconds", "0.2", "--sim-seed", "1"'
# Six real seconds of load (speed 1): long enough that two loads visibly overlap or do not.
SLOW_LOAD = '"--sim-speed", "1", "--sim-load-seconds", "6", "--sim-seed", "1"'

TESTS = """
import pytest

@pytest.mark.specdecode("on-a", workload="fast")
def test_a1(): pass

@pytest.mark.specdecode("on-b", workload="fast")
def test_b1(): pass

@pytest.mark.specdecode("on-a", workload="fast")
def test_a2(): pass
"""
RUNS = ("--specdecode-runs", "2", "--specdecode-max-runs", "2")
MANAGED = {"label": "pytest-specdecode.managed=1"}


@pytest.fixture
def fleet(project, monkeypatch) -> Iterator[object]:
    monkeypatch.setenv("FLEET_BOX_B", ENGINES[1])
    yield project
    for engine in ENGINES[:2]:  # whatever a failed test left behind
        client = docker.DockerClient(base_url=engine)
        try:
            for c in client.containers.list(
                all=True, filters={"label": "pytest-specdecode.managed=1"}
            ):
                c.remove(force=True)
        finally:
            client.close()


def containers(engine: str) -> list[str]:
    client = docker.DockerClient(base_url=engine)
    try:
        found = client.containers.list(all=True, filters=MANAGED)
        return [c.name for c in found]
    finally:
        client.close()


def server_logs(project) -> dict[str, str]:
    """Profile -> its server log (under pytest's basetemp)."""
    logs = {}
    for path in sorted(project.path.rglob("specdecode-logs/*.log")):
        logs[path.name.rsplit("-", 3)[0]] = path.read_text(errors="replace")
    return logs


@pytest.mark.parametrize("xdist", [("-n", "2"), ()], ids=["xdist", "one-process"])
def test_profiles_run_on_their_hosts_and_one_report_holds_both(fleet, xdist):
    """Under -n 2 each host's tests go to a worker of their own; in one process the hosts are
    used one after another. Either way: one report, the host and hardware key in each row."""
    project = fleet
    project.profiles(FLEET.format(a=ENGINES[0], args=FAST))
    project.tests(TESTS)
    report = project.path / "report.json"
    result = project.run(
        *xdist, "--update-baselines", "--specdecode-baseline-runs", "3",
        "--specdecode-max-baseline-cv", "0.5", f"--specdecode-report={report}",
    )  # fmt: skip
    result.assert_outcomes(passed=3)
    rows = {t["test_id"].rsplit("::", 1)[1]: t for t in json.loads(report.read_text())["tests"]}
    assert {name: row["host"] for name, row in rows.items()} == {
        "test_a1": "box-a",
        "test_a2": "box-a",
        "test_b1": "box-b",
    }
    assert rows["test_a1"]["hardware_key"] == "simulated-8xSIM-A"
    assert rows["test_b1"]["hardware_key"] == "simulated-host-box-b"
    # each host's baselines apart, under its hardware key
    keys = {p.relative_to(project.path / "baselines").parts[0] for p in project.baseline_files()}
    assert keys == {"simulated-8xSIM-A", "simulated-host-box-b"}
    logs = server_logs(project)
    assert "on-a" in logs
    assert "on-b" in logs
    assert ENGINES[0].split("://")[-1] in logs["on-a"]  # the container ran on engine A
    assert ENGINES[1].split("://")[-1] in logs["on-b"]
    out = result.stdout.str()
    assert "on-a @ box-a (simulated)" in out  # the host in the summary row
    assert "placed on box-a: on-a (2 tests)" in out
    assert "placed on box-b: on-b (1 test)" in out
    assert containers(ENGINES[0]) == []
    assert containers(ENGINES[1]) == []


@pytest.mark.parametrize("xdist", [("-n", "2"), ()], ids=["xdist", "one-process"])
def test_keep_server_leaves_one_server_on_each_host_for_the_next_night(fleet, xdist):
    """With --specdecode-keep-server every box keeps its last server (under xdist the controller
    decides, in one process the pool): the next night loads nothing on either box."""
    project = fleet
    project.profiles(FLEET.format(a=ENGINES[0], args=FAST))
    project.tests(TESTS)
    first = project.run(*xdist, *RUNS, "--specdecode-keep-server")
    first.assert_outcomes(passed=3)
    out = first.stdout.str()
    assert re.search(r"on-a: left running for the next session at http://\S+", out), out
    assert re.search(r"on-b: left running for the next session at http://\S+", out), out
    assert len(containers(ENGINES[0])) == 1
    assert len(containers(ENGINES[1])) == 1
    again = project.run(*xdist, *RUNS)
    again.assert_outcomes(passed=3)
    text = again.stdout.str()
    assert "on-a launched 0, reused 1, stopped 1" in text, text
    assert "on-b launched 0, reused 1, stopped 1" in text, text
    assert containers(ENGINES[0]) == []
    assert containers(ENGINES[1]) == []


def _load_window(log: str) -> tuple[datetime, datetime]:
    stamps = re.findall(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)[^\]]*\] (.*)$", log, re.M)
    begin = next(t for t, line in stamps if "Load weight begin" in line)
    ready = next(t for t, line in stamps if "fired up and ready to roll" in line)
    fmt = "%Y-%m-%d %H:%M:%S"
    return datetime.strptime(begin, fmt), datetime.strptime(ready, fmt)


def test_two_hosts_load_at_the_same_time(fleet):
    project = fleet
    project.profiles(FLEET.format(a=ENGINES[0], args=SLOW_LOAD))
    project.tests(TESTS)
    result = project.run("-n", "2", *RUNS)
    result.assert_outcomes(passed=3)  # no thresholds: measured, not judged
    logs = server_logs(project)
    a_begin, a_ready = _load_window(logs["on-a"])
    b_begin, b_ready = _load_window(logs["on-b"])
    # the servers' own clocks: each load lasted about 6 s and the two overlapped
    assert a_begin < b_ready
    assert b_begin < a_ready
    assert containers(ENGINES[0]) == []
    assert containers(ENGINES[1]) == []


@pytest.mark.parametrize(
    ("endpoint", "message"),
    [
        ("unix:///nonexistent/docker-b.sock", "cannot reach the Docker engine"),
        (None, "takes its Docker endpoint from $FLEET_BOX_B, which is not set"),
    ],
    ids=["unreachable", "endpoint-unset"],
)
def test_a_host_that_cannot_be_reached_fails_its_tests_and_the_other_goes_on(
    fleet, monkeypatch, endpoint, message
):
    project = fleet
    if endpoint is None:
        monkeypatch.delenv("FLEET_BOX_B")
    else:
        monkeypatch.setenv("FLEET_BOX_B", endpoint)
    project.profiles(FLEET.format(a=ENGINES[0], args=FAST))
    project.tests(TESTS)
    result = project.run("-n", "2", *RUNS)
    result.assert_outcomes(passed=2, errors=1)
    assert message in result.stdout.str()
    assert containers(ENGINES[0]) == []


FLEET_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "provision-docker-fleet.sh"
# box-b loads for 30 real seconds: the engine is killed while it loads
KILLED = FLEET.replace(
    '[profiles.on-b]\nhosts = ["box-b"]\nextra_args = [{args}]',
    '[profiles.on-b]\nhosts = ["box-b"]\n'
    'extra_args = ["--sim-speed", "1", "--sim-load-seconds", "30"]',
)


def test_a_host_killed_mid_run_fails_its_tests_leaks_nothing_and_the_other_goes_on(fleet):
    project = fleet
    if ENGINES[1] != "unix:///var/run/specdecode-docker-b.sock":
        pytest.skip("kills the engine scripts/provision-docker-fleet.sh starts; not this one")
    project.profiles(KILLED.format(a=ENGINES[0], args=FAST))
    project.tests(TESTS)
    env = {**os.environ, "PYTHONPATH": str(project.path), "FLEET_BOX_B": ENGINES[1]}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", *RUNS],
        cwd=project.path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while not containers(ENGINES[1]):  # box-b's server is loading
            assert proc.poll() is None
            assert time.monotonic() < deadline
            time.sleep(0.2)
        time.sleep(1.0)
        subprocess.run(["bash", str(FLEET_SCRIPT), "--kill-all"], check=True, timeout=120)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        subprocess.run(["bash", str(FLEET_SCRIPT)], check=True, timeout=300)  # engine B back
    assert re.search(r"2 passed, 1 error", out), out
    assert "on-b" in out
    assert re.search(r"the Docker engine stopped answering|cannot reach the Docker engine", out), (
        out
    )
    assert containers(ENGINES[0]) == []
    # box-b's container came back with its engine (exited, not removed): the next session that
    # reaches the engine removes it.
    project.tests(TESTS.split('@pytest.mark.specdecode("on-b"')[0])
    again = project.run(*RUNS)
    again.assert_outcomes(passed=1)
    assert containers(ENGINES[1]) == []
    assert containers(ENGINES[0]) == []
