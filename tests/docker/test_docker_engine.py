"""The docker launcher against a real engine: the simulated SGLang server in the test image.

Needs a Docker engine and ``pytest-specdecode-sim:local`` (``bash scripts/provision-docker.sh``);
see conftest.py for skip/fail. Containers run on host networking on a free loopback port.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator

import docker
import docker.errors
import httpx
import pytest

from pytest_specdecode.backends import SGLANG_PHASES
from pytest_specdecode.errors import ServerStartError
from pytest_specdecode.servers.docker.container import (
    LABEL_FINGERPRINT,
    LABEL_MANAGED,
    LABEL_PROFILE,
)
from pytest_specdecode.servers.docker.launcher import VANISHED_EXIT_CODE, DockerLauncher
from pytest_specdecode.servers.docker.recorded import docker_server_alive, stop_docker_server
from pytest_specdecode.servers.launcher import find_free_port, port_in_use
from pytest_specdecode.servers.readiness import LogTail, Progress, wait_until_ready

# The ``launch`` fixture (conftest.py): sim launchers on free ports, stopped after the test.
LaunchFactory = Callable[..., DockerLauncher]

GENERATE = {
    "text": "The capital of France is",
    "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True},
}


def ready(launcher: DockerLauncher, timeout: float = 60.0, **kwargs: object) -> float:
    return wait_until_ready(
        launcher.base_url,
        name=f"sim in {launcher.name}",
        timeout=timeout,
        exit_code=launcher.exit_code,
        log=LogTail(launcher.log_path, SGLANG_PHASES),
        poll_interval=0.1,
        **kwargs,  # type: ignore[arg-type]
    )


def test_launch_serve_and_stop(launch: LaunchFactory, docker_client: docker.DockerClient) -> None:
    launcher = launch(
        "--sim-load-seconds",
        "2",
        "--sim-speed",
        "1",
        env={"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "HF_TOKEN": "hf_do_not_log"},
        labels={LABEL_FINGERPRINT: "fp-123", LABEL_PROFILE: "eagle3-sim"},
    )
    launcher.start()
    assert launcher.exit_code() is None

    phases: list[str] = []
    ready(launcher, on_progress=lambda p: phases.append(p.phase))
    # The log is copied while the container runs: the load phases were seen live.
    assert {
        "loading the target model's weights",
        "capturing the target's prefill CUDA graphs",
        "warming up",
    } & set(phases), phases

    with httpx.Client(base_url=launcher.base_url, trust_env=False, timeout=30.0) as http:
        response = http.post("/generate", json=GENERATE)
    assert response.status_code == 200, response.text
    assert response.json()["meta_info"]["completion_tokens"] == 8

    assert launcher.container_id is not None
    container = docker_client.containers.get(launcher.container_id)
    assert container.labels[LABEL_FINGERPRINT] == "fp-123"
    assert container.labels[LABEL_PROFILE] == "eagle3-sim"
    assert container.labels[LABEL_MANAGED] == "1"
    assert container.name == launcher.name
    host_config = container.attrs["HostConfig"]
    assert host_config["NetworkMode"] == "host"
    assert host_config["IpcMode"] == "host"
    assert host_config["ShmSize"] == 32 * 1024**3
    assert host_config["Init"] is True
    assert "NCCL_PROTO=LL" in container.attrs["Config"]["Env"]

    log_text = launcher.log_path.read_text()
    first = log_text.splitlines()[0]
    assert launcher.name in first
    assert launcher.container_id in first
    assert "pytest-specdecode-sim:local" in first
    assert "NCCL_ALGO=Ring" in log_text
    assert "hf_do_not_log" not in log_text
    assert "Uvicorn running on" in log_text

    identity = json.loads(json.dumps(launcher.identity()))
    assert identity["kind"] == "docker"
    assert identity["container_id"] == launcher.container_id

    launcher.stop(grace=5.0)
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(launcher.container_id)
    assert not port_in_use("127.0.0.1", launcher.port)
    assert launcher.exit_code() is not None
    launcher.stop(grace=5.0)  # idempotent


def test_exit_during_load_fails_fast_with_exit_code_and_log(launch: LaunchFactory) -> None:
    launcher = launch("--sim-fault", "exit-during-load")
    started = time.monotonic()
    launcher.start()
    with pytest.raises(ServerStartError) as excinfo:
        ready(launcher, timeout=120.0)
    elapsed = time.monotonic() - started
    assert elapsed < 5.0, f"took {elapsed:.1f}s to notice the exit"
    error = excinfo.value
    assert error.exit_code not in (None, 0)
    assert f"exited with code {error.exit_code}" in str(error)
    assert any("Capture cuda graph failed" in line for line in error.log_tail), error.log_tail
    assert error.log_path == str(launcher.log_path)
    launcher.stop(grace=2.0)
    assert launcher.exit_code() == error.exit_code


def test_recorded_identity_finds_and_stops_the_container(
    launch: LaunchFactory, docker_client: docker.DockerClient
) -> None:
    launcher = launch()
    launcher.start()
    ready(launcher)
    # What the pool's JSON state file keeps, read back by a later session.
    identity = json.loads(json.dumps(launcher.identity()))
    assert docker_server_alive(identity)

    stop_docker_server(identity, 5.0)
    assert not docker_server_alive(identity)
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(identity["container_id"])
    assert not port_in_use("127.0.0.1", launcher.port)
    stop_docker_server(identity, 5.0)  # already gone: quiet

    # The launcher that started it notices that its container vanished.
    assert launcher.exit_code() == VANISHED_EXIT_CODE
    assert "vanished" in launcher.log_path.read_text()
    launcher.stop(grace=1.0)


def test_missing_image_is_a_clear_error(launch: LaunchFactory) -> None:
    launcher = launch(image="pytest-specdecode-missing:never-built")
    with pytest.raises(ServerStartError) as excinfo:
        launcher.start()
    message = str(excinfo.value)
    assert "'pytest-specdecode-missing:never-built' is not present" in message
    assert "docker pull pytest-specdecode-missing:never-built" in message
    assert "scripts/provision-docker.sh" in message
    assert launcher.container_id is None


def test_gpu_request_without_gpu_runtime_is_a_clear_error(
    launch: LaunchFactory, docker_client: docker.DockerClient
) -> None:
    if "nvidia" in docker_client.info().get("Runtimes", {}):
        pytest.skip("this engine has the NVIDIA runtime: a GPU request would succeed")
    launcher = launch(gpus=[0])
    with pytest.raises(ServerStartError) as excinfo:
        launcher.start()
    assert "NVIDIA Container Toolkit" in str(excinfo.value)
    assert docker_client.containers.list(all=True, filters={"name": launcher.name}) == []


def test_name_conflicts(
    launch: LaunchFactory, docker_client: docker.DockerClient, sim_image: str
) -> None:
    # A stopped container of ours with the same name is a leftover: replaced.
    stale = launch()
    docker_client.containers.create(
        sim_image, ["true"], name=stale.name, labels={LABEL_MANAGED: "1"}, network_mode="none"
    )
    stale.start()
    assert stale.exit_code() is None
    stale.stop(grace=1.0)

    # A running container that is not ours is never touched.
    foreign = launch()
    other = docker_client.containers.run(
        sim_image, ["sleep", "30"], name=foreign.name, detach=True, network_mode="none"
    )
    try:
        with pytest.raises(ServerStartError) as excinfo:
            foreign.start()
        assert f"a container named {foreign.name} already exists" in str(excinfo.value)
        other.reload()
        assert other.status == "running"
    finally:
        other.remove(force=True)


def test_progress_phases_are_from_the_container_log(launch: LaunchFactory) -> None:
    """The readiness watcher's phase comes from the streamed log, before the port opens."""
    launcher = launch("--sim-load-seconds", "1.5", "--sim-speed", "1")
    launcher.start()
    seen: list[Progress] = []
    ready(launcher, on_progress=seen.append)
    assert seen[0].phase in (
        "starting",
        "initialising torch.distributed",
        "loading the target model's weights",
    )
    assert any(p.phase != "starting" for p in seen)


@pytest.fixture
def tcp_engine(docker_client: docker.DockerClient) -> Iterator[str]:
    """The local engine's socket forwarded to ``tcp://127.0.0.2:<port>``.

    To the launcher this is a remote engine whose host name is not 127.0.0.1, so the
    ``DOCKER_HOST`` path (client, base_url, recorded identity) runs for real, on loopback only.
    """
    docker_host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not docker_host.startswith("unix://"):
        pytest.skip(f"DOCKER_HOST={docker_host} is not a local socket to forward")
    path = docker_host[len("unix://") :]
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.2", 0))
    listener.listen(16)
    listener.settimeout(0.2)
    stop = threading.Event()
    sockets: list[socket.socket] = [listener]

    def pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for end in (src, dst):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sockets.extend((conn, upstream))
            upstream.connect(path)
            threading.Thread(target=pump, args=(conn, upstream), daemon=True).start()
            threading.Thread(target=pump, args=(upstream, conn), daemon=True).start()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    yield f"tcp://127.0.0.2:{listener.getsockname()[1]}"
    stop.set()
    server.join(2.0)
    for sock in sockets:
        sock.close()


def test_remote_engine_through_docker_host(
    tcp_engine: str, launch: LaunchFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", tcp_engine)
    port = find_free_port("127.0.0.2")
    # client=None: the launcher connects through DOCKER_HOST itself, as in a real session.
    launcher = launch(sim_host="0.0.0.0", port=port, client=None)
    # The server runs where the engine runs: its URL names the engine's host.
    assert launcher.base_url == f"http://127.0.0.2:{port}"
    launcher.start()
    ready(launcher)
    assert tcp_engine in launcher.log_path.read_text().splitlines()[0]
    identity = json.loads(json.dumps(launcher.identity()))
    assert identity["docker_host"] == tcp_engine
    assert identity["host"] == "127.0.0.2"
    # A later session without DOCKER_HOST still finds it through the recorded engine.
    monkeypatch.delenv("DOCKER_HOST")
    assert docker_server_alive(identity)
    launcher.stop(grace=2.0)
    assert not docker_server_alive(identity)
    assert not port_in_use("127.0.0.2", port)
