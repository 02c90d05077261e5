"""Fixtures for the docker launcher's tests: an engine client, the sim image, launchers.

These tests need a Docker engine and the image ``pytest-specdecode-sim:local``; both come from
``bash scripts/provision-docker.sh``. Without them the tests are skipped, unless
``SPECDECODE_REQUIRE_DOCKER=1`` (CI sets it after provisioning): then they fail, so a broken
engine cannot turn into a quietly green run.

No ``__init__.py`` here on purpose: with one, a ``tests`` folder on ``sys.path`` would make this
folder importable as ``docker`` and shadow the Docker SDK.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NoReturn

import docker
import docker.errors
import pytest

from pytest_specdecode.errors import ServerStartError
from pytest_specdecode.servers.docker.container import LABEL_FINGERPRINT, LABEL_PROFILE
from pytest_specdecode.servers.docker.engine import connect
from pytest_specdecode.servers.docker.launcher import DockerLauncher
from pytest_specdecode.servers.launcher import find_free_port

SIM_IMAGE = "pytest-specdecode-sim:local"
PROVISION = "bash scripts/provision-docker.sh"


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("SPECDECODE_REQUIRE_DOCKER") == "1":
        pytest.fail(
            f"{reason}, and SPECDECODE_REQUIRE_DOCKER=1 says it must be there "
            f"(did `{PROVISION}` run and succeed?)",
            pytrace=False,
        )
    pytest.skip(f"{reason}; run `{PROVISION}` to install and start it")


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    try:
        client = connect()  # from DOCKER_HOST, like the launcher
    except ServerStartError as exc:
        _unavailable(f"no Docker engine answers: {str(exc).split('. Start', 1)[0]}")
    yield client
    client.close()


@pytest.fixture(scope="session")
def sim_image(docker_client: docker.DockerClient) -> str:
    try:
        docker_client.images.get(SIM_IMAGE)
    except docker.errors.ImageNotFound:
        _unavailable(f"the test image {SIM_IMAGE} is not built")
    return SIM_IMAGE


def sim_command(port: int, *extra: str, host: str = "127.0.0.1") -> list[str]:
    """The simulated server's argv inside the container: fast load, fast decode."""
    return [
        "python3",
        "-m",
        "pytest_specdecode.sim",
        "--model-path",
        "sim/tiny-llama",
        "--host",
        host,
        "--port",
        str(port),
        "--sim-load-seconds",
        "0.3",
        "--sim-speed",
        "100",
        *extra,
    ]


LaunchFactory = Callable[..., DockerLauncher]


@pytest.fixture
def launch(
    docker_client: docker.DockerClient, sim_image: str, tmp_path: Path
) -> Iterator[LaunchFactory]:
    """Make sim launchers on a free port; every one made is stopped after the test.

    ``extra`` are more sim flags (later ones win); ``sim_host`` is the sim's ``--host``; other
    keyword arguments go to :class:`DockerLauncher` (``client=None`` = from ``DOCKER_HOST``).
    """
    made: list[DockerLauncher] = []

    def make(
        *extra: str,
        env: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        name: str | None = None,
        sim_host: str = "127.0.0.1",
        **kwargs: Any,
    ) -> DockerLauncher:
        port = kwargs.pop("port", None) or find_free_port()
        settings: dict[str, Any] = {
            "image": sim_image,
            "host": "127.0.0.1",
            "log_path": tmp_path / f"server-{port}.log",
            "gpus": None,
            "client": docker_client,
            **kwargs,
        }
        launcher = DockerLauncher(
            command=sim_command(port, *extra, host=sim_host),
            env=dict(env or {}),
            port=port,
            labels=labels or {LABEL_FINGERPRINT: "test-fingerprint", LABEL_PROFILE: "docker-test"},
            name=name or f"specdecode-test-{port}",
            **settings,
        )
        made.append(launcher)
        return launcher

    yield make
    for launcher in made:
        launcher.stop(grace=2.0)
