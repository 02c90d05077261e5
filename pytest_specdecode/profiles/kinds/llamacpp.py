"""``launcher = "llamacpp"``: llama.cpp's ``llama-server`` as a local process
(:mod:`pytest_specdecode.profiles.llamacpp` holds its options and imports its name from here);
its build is the binary's path, size and modification time (the GGUF files' hashes are in the
fingerprint)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pytest_specdecode.profiles.kinds.base import BuildFacts, ProfileView, ServerKind

LAUNCHER = "llamacpp"
DEFAULT_BINARY = "llama-server"


class LlamaCppKind(ServerKind):
    name = LAUNCHER
    backend = LAUNCHER
    server_name = "llama-server"
    local_gpus = True
    llamacpp_options = True

    def command(
        self, profile: ProfileView, *, host: str, port: int, binary: str | None
    ) -> list[str]:
        configured = profile.llamacpp.binary if profile.llamacpp is not None else None
        head = [binary or configured or DEFAULT_BINARY]
        return head + profile.server_args(host=host, port=port)

    def build_parts(self, facts: BuildFacts) -> dict[str, Any]:
        return {"binary": file_stamp(facts.binary) if facts.binary else None}

    def describe_build(self, parts: Mapping[str, Any]) -> str:
        return f"llama-server {parts.get('binary')}"


KIND = LlamaCppKind()


def file_stamp(path: str) -> str:
    real = os.path.realpath(path)
    try:
        stat = os.stat(real)
    except OSError:
        return f"{real} (missing)"
    return f"{real} ({stat.st_size} bytes, mtime {stat.st_mtime_ns})"
