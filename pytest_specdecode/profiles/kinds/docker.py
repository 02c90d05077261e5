"""``launcher = "docker"``: SGLang in a container (the image's own interpreter), started by the
Docker launcher on this machine's engine or a ``[hosts.NAME]`` one; its build is the image's id."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_specdecode.profiles.kinds.base import BuildFacts, ProfileView, ServerKind

DOCKER_PYTHON = "python3"  # the interpreter inside the lmsysorg/sglang images


class DockerKind(ServerKind):
    name = "docker"
    in_container = True
    placed_on_hosts = True

    def command(
        self, profile: ProfileView, *, host: str, port: int, binary: str | None
    ) -> list[str]:
        head = [DOCKER_PYTHON, "-m", profile.module]
        return head + profile.server_args(host=host, port=port)

    def build_parts(self, facts: BuildFacts) -> dict[str, Any]:
        parts: dict[str, Any] = {"image": facts.image, "image_id": facts.image_id}
        if facts.engine:  # a host of the fleet: its server is another server than another host's
            parts["engine"] = facts.engine
        return parts

    def describe_build(self, parts: Mapping[str, Any]) -> str:
        if parts.get("image_id"):
            return f"image {parts.get('image')} ({str(parts['image_id'])[:19]})"
        return super().describe_build(parts)


KIND = DockerKind()
