"""A fleet of two hosts, for real: two Docker engines on this machine (two daemons, their own
sockets and data roots: scripts/provision-docker-fleet.sh), the simulated server's image on
both, the plugin placing profiles on them through ``[hosts.NAME]`` (issue 14).

Needs ``SPECDECODE_FLEET_DOCKER_HOSTS="unix:///... unix:///..."`` (scripts/test exports it);
without it these tests skip, unless ``SPECDECODE_REQUIRE_DOCKER=1`` (CI), which fails them. The
TLS tests also need engine B's TLS endpoint and client certificate directory,
``SPECDECODE_FLEET_TLS_HOST`` and ``SPECDECODE_FLEET_TLS_CERTS`` (the script prints them,
scripts/test exports them): skipped without, failed under ``SPECDECODE_REQUIRE_DOCKER=1``.
"""

from __future__ import annotations

import contextlib
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
            for c in client.containers.list(all=True, filters=MANAGED, ignore_removed=True):
                with contextlib.suppress(docker.errors.NotFound):  # its session removed it
                    c.remove(force=True)
        finally:
            client.close()


def containers(engine: str) -> list[str]:
    client = docker.DockerClient(base_url=engine)
    try:
        # ignore_removed: a container listed and then removed before the SDK inspects it (a
        # session sweeping or replacing one) is gone, not an error of the test
        found = client.containers.list(all=True, filters=MANAGED, ignore_removed=True)
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
        "--specdecode-force-baseline", f"--specdecode-report={report}",
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
    try:
        # `with`: the pipe is closed on every path (left to gc, it fails a later test)
        with subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", *RUNS],
            cwd=project.path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        ) as proc:  # fmt: skip
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
    finally:
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


# -- a host reached over TCP with TLS client certificates of its own (#14) -------------------------

TLS_HOST = os.environ.get("SPECDECODE_FLEET_TLS_HOST", "")
TLS_CERTS = os.environ.get("SPECDECODE_FLEET_TLS_CERTS", "")
# box-b is engine B over its TLS endpoint, with the host's own client certificates (box-a: none)
TLS_FLEET = FLEET.replace(
    'docker_host_env = "FLEET_BOX_B"\n',
    'docker_host_env = "FLEET_BOX_B"\ntls_cert_path = "{certs}"\n',
)
CONTEXT_FLEET = FLEET.replace('docker_host_env = "FLEET_BOX_B"\n', 'context = "fleet-tls"\n')


@pytest.fixture
def tls_fleet(fleet, monkeypatch) -> tuple[object, Path]:
    """The fleet with box-b's endpoint engine B's TLS one (scripts/provision-docker-fleet.sh
    prints it and its client certificate directory; scripts/test exports them)."""
    if not TLS_HOST or not TLS_CERTS:
        reason = (
            "SPECDECODE_FLEET_TLS_HOST and SPECDECODE_FLEET_TLS_CERTS (engine B's TLS endpoint "
            "and client certificates, from scripts/provision-docker-fleet.sh) are not set"
        )
        if os.environ.get("SPECDECODE_REQUIRE_DOCKER") == "1":
            pytest.fail(f"SPECDECODE_REQUIRE_DOCKER=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    monkeypatch.setenv("FLEET_BOX_B", TLS_HOST)
    return fleet, Path(TLS_CERTS)


def created_on(engine: str, container_id: str, since: float) -> bool:
    """Whether ``engine`` created the container ``container_id`` since ``since`` (its events)."""
    client = docker.DockerClient(base_url=engine)
    try:
        events = client.events(
            since=int(since) - 1, until=int(time.time()) + 1, decode=True,
            filters={"type": "container", "event": "create", "container": container_id},
        )  # fmt: skip
        return any(event.get("id") == container_id for event in events)
    finally:
        client.close()


def container_of(log: str) -> str:
    found = re.search(r"^# pytest-specdecode: container \S+ \(id ([0-9a-f]{64})\)", log, re.M)
    assert found, log[:500]
    return found.group(1)


def make_certs(folder: Path, ca: Path | None = None) -> Path:
    """A CA of its own (or ``ca``'s key and certificate) and a client certificate it signed, in
    Docker's layout (ca.pem, cert.pem, key.pem), with openssl."""
    folder.mkdir(parents=True, exist_ok=True)

    def ssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=folder)

    ec = ("-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256")
    if ca is None:
        ssl("genpkey", *ec, "-out", "ca-key.pem")
        ssl("req", "-x509", "-new", "-key", "ca-key.pem", "-days", "2", "-subj", "/CN=other CA",
            "-out", "ca.pem")  # fmt: skip
        ca = folder
    ssl("genpkey", *ec, "-out", "key.pem")
    ssl("req", "-new", "-key", "key.pem", "-subj", "/CN=fleet client", "-out", "client.csr")
    (folder / "ext.cnf").write_text("extendedKeyUsage=clientAuth\n")
    ssl("x509", "-req", "-in", "client.csr", "-CA", str(ca / "ca.pem"), "-CAkey",
        str(ca / "ca-key.pem"), "-CAcreateserial", "-days", "2", "-extfile", "ext.cnf",
        "-out", "cert.pem")  # fmt: skip
    return folder


@pytest.mark.parametrize("how", ["tls_cert_path", "context"])
def test_a_host_reached_over_tls_with_its_own_certificates_runs_its_profile(
    tls_fleet, monkeypatch, tmp_path, how
):
    """box-b's engine listens on TCP with --tlsverify; only box-b has the client certificates
    (pytest's environment has none): its profile runs there, on engine B, and leaves nothing."""
    project, certs = tls_fleet
    monkeypatch.delenv("DOCKER_CERT_PATH", raising=False)
    monkeypatch.delenv("DOCKER_TLS_VERIFY", raising=False)
    if how == "context":  # made by the docker CLI, as a user would, in a config of our own
        config = tmp_path / "docker-config"
        config.mkdir()
        (config / "config.json").write_text("{}")  # the SDK reads contexts beside it only
        material = f"ca={certs}/ca.pem,cert={certs}/cert.pem,key={certs}/key.pem"
        subprocess.run(
            ["docker", "--config", str(config), "context", "create", "fleet-tls",
             "--docker", f"host={TLS_HOST},{material}"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        monkeypatch.setenv("DOCKER_CONFIG", str(config))
        project.profiles(CONTEXT_FLEET.format(a=ENGINES[0], args=FAST))
    else:
        project.profiles(TLS_FLEET.format(a=ENGINES[0], args=FAST, certs=certs))
    project.tests(TESTS)
    report = project.path / "report.json"
    started = time.time()
    result = project.run("-n", "2", *RUNS, f"--specdecode-report={report}")
    result.assert_outcomes(passed=3)
    rows = {t["test_id"].rsplit("::", 1)[1]: t for t in json.loads(report.read_text())["tests"]}
    assert rows["test_b1"]["host"] == "box-b"
    assert rows["test_a1"]["host"] == "box-a"
    logs = server_logs(project)
    assert f"on DOCKER_HOST={TLS_HOST};" in logs["on-b"]  # reached over TCP
    assert created_on(ENGINES[1], container_of(logs["on-b"]), started)  # engine B ran it
    assert not created_on(ENGINES[0], container_of(logs["on-b"]), started)
    assert containers(ENGINES[0]) == []
    assert containers(ENGINES[1]) == []


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        ("no-key", "of host 'box-b', but no key.pem ("),
        ("other-ca", "the TLS handshake failed"),
        ("client-cert-of-another-ca", "the TLS handshake failed"),
    ],
)
def test_a_tls_host_with_wrong_certificates_fails_its_tests_and_the_other_goes_on(
    tls_fleet, tmp_path, broken, message
):
    project, certs = tls_fleet
    wrong = tmp_path / "wrong-certs"
    if broken == "no-key":
        wrong.mkdir()
        for name in ("ca.pem", "cert.pem"):
            (wrong / name).write_bytes((certs / name).read_bytes())
    elif broken == "other-ca":  # the CA, the certificate and its key of another engine's
        make_certs(wrong)
    else:  # the right CA, but a client certificate the engine's CA never signed
        other = make_certs(tmp_path / "other")
        make_certs(wrong, ca=other)
        (wrong / "ca.pem").write_bytes((certs / "ca.pem").read_bytes())
    project.profiles(TLS_FLEET.format(a=ENGINES[0], args=FAST, certs=wrong))
    project.tests(TESTS)
    result = project.run("-n", "2", *RUNS)
    result.assert_outcomes(passed=2, errors=1)  # box-a's two tests ran
    out = result.stdout.str()
    assert message in out, out
    assert "box-b" in out
    assert str(wrong) in out  # the directory is named
    if (wrong / "key.pem").exists():  # a path is printed, never a key
        key = (wrong / "key.pem").read_text().splitlines()[1]
        assert key not in out
    assert containers(ENGINES[0]) == []
    assert containers(ENGINES[1]) == []


def test_a_kept_server_on_a_tls_host_is_reused_and_stopped_with_the_recorded_certificates(
    tls_fleet,
):
    """The state file records the certificates the server was reached with; the next session
    (its controller, under xdist, holds no launcher) checks and stops it through them."""
    project, certs = tls_fleet
    project.profiles(TLS_FLEET.format(a=ENGINES[0], args=FAST, certs=certs))
    project.tests(TESTS)
    first = project.run("-n", "2", *RUNS, "--specdecode-keep-server")
    first.assert_outcomes(passed=3)
    assert len(containers(ENGINES[1])) == 1
    entries = json.loads((project.state_dir / "servers.json").read_text())["servers"]
    identities = [e["identity"] for e in entries.values() if e["profile"] == "on-b"]
    assert len(identities) == 1
    assert identities[0]["docker_host"] == TLS_HOST
    assert identities[0]["docker_cert_path"] == str(certs)
    assert identities[0]["docker_tls_verify"] is True
    again = project.run("-n", "2", *RUNS)
    again.assert_outcomes(passed=3)
    text = again.stdout.str()
    assert "on-b launched 0, reused 1, stopped 1" in text, text
    assert containers(ENGINES[1]) == []
    assert containers(ENGINES[0]) == []
