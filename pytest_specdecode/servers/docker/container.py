"""What the ``docker`` launcher asks of a container, and how it names and describes one.

The labels that mark a container as ours and say what it runs (its profile and fingerprint), a valid
container name, GPUs as device requests, the environment with its secrets hidden for the log's
header line, and the messages of a start the engine refused: the image is missing, or the container
asks for GPUs the engine cannot give. Plain values and functions, no engine call: kept apart from
:mod:`~pytest_specdecode.servers.docker.launcher` so the launcher reads as a lifecycle, and shared
with :mod:`~pytest_specdecode.servers.docker.recorded`, which checks the labels.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Sequence

import docker.types
from docker.models.containers import Container

from pytest_specdecode.redaction import is_secret_name
from pytest_specdecode.servers.docker.engine import describe_engine

LABEL_MANAGED = "pytest-specdecode.managed"
LABEL_FINGERPRINT = "pytest-specdecode.fingerprint"
LABEL_PROFILE = "pytest-specdecode.profile"
LABEL_PORT = "pytest-specdecode.port"

# The test image scripts/provision-docker.sh builds; named in the missing-image error.
SIM_IMAGE = "pytest-specdecode-sim:local"


def missing_image_message(image: str, docker_host: str | None) -> str:
    how = (
        "build it with `bash scripts/provision-docker.sh`"
        if image == SIM_IMAGE
        else f"pull it (`docker pull {image}`) or build it"
    )
    return (
        f"Docker image {image!r} is not present on the engine at {describe_engine(docker_host)}; "
        f"{how}. The launcher never pulls images itself: a multi-GB pull must not eat the "
        "server's startup timeout. (The simulated server's test image, "
        f"{SIM_IMAGE}, is built by scripts/provision-docker.sh.)"
    )


def start_failure_message(
    name: str, image: str, reason: str, gpus: Sequence[int] | int | None
) -> str:
    message = f"the Docker engine could not start container {name} ({image}): {reason}"
    if device_requests(gpus) and ("device driver" in reason or "gpu" in reason.lower()):
        message += (
            f". The container asks for GPUs {describe_gpus(gpus)}: the engine needs the NVIDIA "
            "Container Toolkit (nvidia-ctk runtime configure --runtime=docker, then restart "
            "dockerd); or set the profile's gpus to none"
        )
    return message


def device_requests(gpus: Sequence[int] | int | None) -> list[docker.types.DeviceRequest]:
    """GPUs as docker device requests: a count (``-1`` = all) or explicit device ids."""
    if gpus is None or isinstance(gpus, bool):
        return []
    if isinstance(gpus, int):
        if gpus == 0:
            return []
        return [docker.types.DeviceRequest(count=gpus, capabilities=[["gpu"]])]
    if not gpus:
        return []
    return [docker.types.DeviceRequest(device_ids=[str(g) for g in gpus], capabilities=[["gpu"]])]


def describe_gpus(gpus: Sequence[int] | int | None) -> str:
    if not device_requests(gpus):
        return "none"
    if isinstance(gpus, int):
        return "all" if gpus < 0 else f"any {gpus}"
    return ",".join(str(g) for g in gpus or ())


def container_name(name: str | None, port: int) -> str:
    """A valid container name (``[a-zA-Z0-9][a-zA-Z0-9_.-]*``) from the caller's ``name``."""
    if not name:
        return f"pytest-specdecode-{port}-{uuid.uuid4().hex[:8]}"
    cleaned = re.sub(r"[^a-zA-Z0-9_.-]+", "-", name).strip("-.")
    if not cleaned or not cleaned[0].isalnum():
        cleaned = f"specdecode-{cleaned}".rstrip("-")
    return cleaned[:128]


def redact_env(name: str, value: str) -> str:
    return "***" if is_secret_name(name) else value


def image_name(container: Container) -> str:
    with contextlib.suppress(Exception):
        return str(container.attrs["Config"]["Image"])
    return "?"


__all__ = [
    "LABEL_FINGERPRINT",
    "LABEL_MANAGED",
    "LABEL_PORT",
    "LABEL_PROFILE",
    "SIM_IMAGE",
    "container_name",
    "describe_gpus",
    "device_requests",
    "image_name",
    "missing_image_message",
    "redact_env",
    "start_failure_message",
]
