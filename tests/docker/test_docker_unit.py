"""The docker launcher without a running container: container settings, names, URLs, errors.

Nothing here needs a Docker engine, so these run everywhere.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import docker.errors
import docker.types
import pytest

from pytest_specdecode.errors import EngineUnreachableError, ServerStartError
from pytest_specdecode.fleet import EngineTLS
from pytest_specdecode.servers.docker.container import (
    LABEL_FINGERPRINT,
    LABEL_MANAGED,
    LABEL_PROFILE,
    container_name,
    device_requests,
)
from pytest_specdecode.servers.docker.engine import (
    connect,
    container_bind_host,
    engine_hostname,
    unreachable_message,
)
from pytest_specdecode.servers.docker.launcher import DockerLauncher
from pytest_specdecode.servers.docker.recorded import docker_server_alive, stop_docker_server
from pytest_specdecode.servers.launcher import Launcher, redact_argv


def make(tmp_path: Path, **overrides: object) -> DockerLauncher:
    kwargs: dict[str, object] = {
        "image": "lmsysorg/sglang:latest",
        "command": ["python3", "-m", "sglang.launch_server", "--port", "30000"],
        "env": {"NCCL_PROTO": "LL", "HF_TOKEN": "hf_secret"},
        "host": "127.0.0.1",
        "port": 30000,
        "log_path": tmp_path / "server.log",
        "gpus": [0, 1, 2, 3],
        "labels": {LABEL_FINGERPRINT: "abc123", LABEL_PROFILE: "eagle3-tp8"},
        "name": "specdecode-eagle3-tp8-30000",
    }
    kwargs.update(overrides)
    return DockerLauncher(**kwargs)  # type: ignore[arg-type]


def test_it_is_a_launcher(tmp_path: Path) -> None:
    launcher = make(tmp_path)
    assert isinstance(launcher, Launcher)
    assert launcher.kind == "docker"


def test_container_settings_on_host_network(tmp_path: Path) -> None:
    kwargs = make(tmp_path, volumes={"/data/hf": "/root/.cache/huggingface"}).create_kwargs()
    assert kwargs["image"] == "lmsysorg/sglang:latest"
    assert kwargs["command"] == ["python3", "-m", "sglang.launch_server", "--port", "30000"]
    assert kwargs["network_mode"] == "host"
    assert "ports" not in kwargs
    assert kwargs["ipc_mode"] == "host"
    assert kwargs["shm_size"] == "32g"
    assert kwargs["init"] is True
    assert kwargs["name"] == "specdecode-eagle3-tp8-30000"
    assert kwargs["environment"]["NCCL_PROTO"] == "LL"
    assert kwargs["environment"]["PYTHONUNBUFFERED"] == "1"
    assert kwargs["volumes"] == {"/data/hf": {"bind": "/root/.cache/huggingface", "mode": "rw"}}
    assert kwargs["labels"] == {
        LABEL_FINGERPRINT: "abc123",
        LABEL_PROFILE: "eagle3-tp8",
        LABEL_MANAGED: "1",
        "pytest-specdecode.port": "30000",
    }
    (request,) = kwargs["device_requests"]
    assert request["DeviceIDs"] == ["0", "1", "2", "3"]
    assert request["Capabilities"] == [["gpu"]]


def test_bridge_network_publishes_the_port(tmp_path: Path) -> None:
    kwargs = make(tmp_path, network="bridge").create_kwargs()
    assert kwargs["network_mode"] == "bridge"
    assert kwargs["ports"] == {"30000/tcp": 30000}


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [
        (None, []),
        (0, []),
        ([], []),
        (8, [{"Count": 8}]),
        (-1, [{"Count": -1}]),
        ([4, 5], [{"DeviceIDs": ["4", "5"]}]),
    ],
)
def test_gpus_become_device_requests(
    gpus: list[int] | int | None, expected: list[dict[str, object]]
) -> None:
    requests = device_requests(gpus)
    assert len(requests) == len(expected)
    for request, want in zip(requests, expected, strict=True):
        assert isinstance(request, docker.types.DeviceRequest)
        assert request["Capabilities"] == [["gpu"]]
        for key, value in want.items():
            assert request[key] == value


def test_no_gpus_means_no_device_request(tmp_path: Path) -> None:
    assert "device_requests" not in make(tmp_path, gpus=None).create_kwargs()


def test_container_names_are_valid() -> None:
    assert container_name("specdecode-eagle3 tp8/30000", 1) == "specdecode-eagle3-tp8-30000"
    assert container_name("_x", 1) == "specdecode-_x"
    assert container_name("---", 1).startswith("specdecode")
    generated = container_name(None, 30001)
    assert generated.startswith("pytest-specdecode-30001-")


def test_secrets_are_redacted_from_the_logged_command() -> None:
    argv = ["python3", "-m", "sglang.launch_server", "--api-key", "sk-1", "--hf-token=hf_2"]
    assert redact_argv(argv) == [
        "python3",
        "-m",
        "sglang.launch_server",
        "--api-key",
        "***",
        "--hf-token=***",
    ]


def test_base_url_is_loopback_for_a_local_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    assert make(tmp_path).base_url == "http://127.0.0.1:30000"
    assert make(tmp_path, host="0.0.0.0").base_url == "http://127.0.0.1:30000"
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/user/1000/docker.sock")
    assert make(tmp_path).base_url == "http://127.0.0.1:30000"


def test_base_url_follows_a_remote_docker_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", "tcp://gpu-box:2376")
    launcher = make(tmp_path)
    assert launcher.base_url == "http://gpu-box:30000"
    assert launcher.identity()["docker_host"] == "tcp://gpu-box:2376"
    assert launcher.identity()["host"] == "gpu-box"
    # An explicit non-loopback host wins over the engine's name.
    assert make(tmp_path, host="10.0.0.7").base_url == "http://10.0.0.7:30000"
    monkeypatch.setenv("DOCKER_HOST", "ssh://ci@gpu-box.example")
    assert make(tmp_path).base_url == "http://gpu-box.example:30000"


def test_engine_hostname() -> None:
    assert engine_hostname("tcp://gpu-box:2375") == "gpu-box"
    assert engine_hostname("tcp://127.0.0.1:2375") is None
    assert engine_hostname("unix:///var/run/docker.sock") is None
    assert engine_hostname("npipe:////./pipe/docker_engine") is None


def test_container_bind_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    assert container_bind_host("host") == "127.0.0.1"
    assert container_bind_host("bridge") == "0.0.0.0"
    assert container_bind_host("host", "tcp://gpu-box:2376") == "0.0.0.0"
    monkeypatch.setenv("DOCKER_HOST", "tcp://gpu-box:2376")
    assert container_bind_host("host") == "0.0.0.0"


def test_unreachable_engine_is_a_clear_start_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    launcher = make(tmp_path, gpus=None)
    with pytest.raises(ServerStartError) as excinfo:
        launcher.start()
    message = str(excinfo.value)
    assert f"DOCKER_HOST=unix://{tmp_path}/no-engine.sock" in message
    assert "scripts/provision-docker.sh" in message
    launcher.stop(grace=1.0)  # never started: a no-op
    assert launcher.exit_code() is None


def test_recorded_identity_on_an_unreachable_engine(tmp_path: Path) -> None:
    identity = {
        "kind": "docker",
        "container_id": "0123456789ab",
        "host": "127.0.0.1",
        "port": 1,
        "docker_host": f"unix://{tmp_path}/no-engine.sock",
    }
    assert docker_server_alive(identity) is False
    stop_docker_server(identity, 1.0)  # nothing to do, and says so in the log; no exception
    assert docker_server_alive({"kind": "docker"}) is False


def test_a_hosts_own_tls_is_in_the_identity_a_later_session_reconnects_with(
    tmp_path: Path,
) -> None:
    tls = EngineTLS(str(tmp_path / "certs"), verify=True)
    launcher = make(tmp_path, docker_host="tcp://gpu-box:2376", tls=tls)
    identity = launcher.identity()
    assert identity["docker_host"] == "tcp://gpu-box:2376"
    assert identity["docker_cert_path"] == str(tmp_path / "certs")
    assert identity["docker_tls_verify"] is True
    assert "docker_cert_path" not in make(tmp_path).identity()  # pytest's DOCKER_* apply


def test_a_recorded_tls_directory_that_is_gone_is_named_and_nothing_is_stopped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The identity's certificates removed since: checked before any connection, the engine is
    not asked anything, the record is kept (the stop reports False), and no key is read."""
    identity = {
        "kind": "docker",
        "container_id": "0123456789ab",
        "host": "127.0.0.1",
        "port": 1,
        "docker_host": "tcp://127.0.0.1:1",
        "docker_cert_path": str(tmp_path / "gone"),
        "docker_tls_verify": True,
    }
    assert docker_server_alive(identity) is False
    assert stop_docker_server(identity, 1.0) is False
    assert f"{tmp_path / 'gone'} does not exist" in caplog.text
    assert "over TLS" in caplog.text


def test_connect_names_what_is_missing_of_a_hosts_certificates(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    certs.mkdir()
    (certs / "ca.pem").write_text("x")
    (certs / "cert.pem").write_text("x")
    with pytest.raises(EngineUnreachableError) as excinfo:
        connect("tcp://127.0.0.1:1", EngineTLS(str(certs)))
    message = str(excinfo.value)
    assert f"{certs / 'key.pem'} does not exist" in message
    assert "must hold ca.pem, cert.pem, key.pem" in message


def raised_from(inner: BaseException) -> docker.errors.DockerException:
    """A DockerException raised from ``inner``, as the SDK raises its errors."""
    try:
        try:
            raise inner
        except BaseException as cause:
            raise docker.errors.DockerException("Error while fetching server API") from cause
    except docker.errors.DockerException as exc:
        return exc
    raise AssertionError("unreachable")


def test_a_failed_tls_handshake_says_which_certificates_to_check(tmp_path: Path) -> None:
    import ssl

    tls = EngineTLS(str(tmp_path / "certs"))
    refused = raised_from(ssl.SSLError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] verify failed"))
    message = unreachable_message("tcp://gpu-box:2376", refused, tls)
    assert "DOCKER_HOST=tcp://gpu-box:2376 (TLS client certificate in " in message
    assert "the TLS handshake failed" in message
    assert f"signed by {tmp_path / 'certs' / 'ca.pem'}" in message
    reset = raised_from(ConnectionResetError(104, "Connection reset by peer"))  # TLS 1.3's no
    assert "the TLS handshake failed" in unreachable_message("tcp://gpu-box:2376", reset, tls)
    plain = unreachable_message(
        "tcp://gpu-box:2376",
        docker.errors.DockerException("Client sent an HTTP request to an HTTPS server."),
    )
    assert "The engine speaks TLS: give its host tls_cert_path" in plain


def test_the_module_does_not_import_pytest() -> None:
    code = (
        "import sys, pytest_specdecode.servers.docker.launcher, "
        "pytest_specdecode.servers.docker.recorded; "
        "sys.exit('pytest' in sys.modules or '_pytest' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
