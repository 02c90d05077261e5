"""``launcher = "sim"``: the simulated SGLang server (``python -m pytest_specdecode.sim``) in
the interpreter running pytest; its build is this package's version and the sim's sources."""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest_specdecode
from pytest_specdecode.profiles.kinds.base import BuildFacts, ProfileView, ServerKind

SIM_MODULE = "pytest_specdecode.sim"


class SimKind(ServerKind):
    name = "sim"
    simulated = True
    takes_server_module = False

    def serving_module(self, server_module: str | None) -> str:
        return SIM_MODULE

    def command(
        self, profile: ProfileView, *, host: str, port: int, binary: str | None
    ) -> list[str]:
        head = [sys.executable, "-m", profile.module]
        return head + profile.server_args(host=host, port=port)

    def build_parts(self, facts: BuildFacts) -> dict[str, Any]:
        return {
            "sim": f"{pytest_specdecode.__version__}+{sim_sources_hash()}",
            "python": os.path.realpath(sys.executable),
        }

    def describe_build(self, parts: Mapping[str, Any]) -> str:
        return f"the simulator of pytest-specdecode {parts.get('sim')}"


KIND = SimKind()


@lru_cache(maxsize=1)
def sim_sources_hash() -> str:
    sim = Path(pytest_specdecode.__file__).parent / "sim"
    digest = hashlib.sha256()
    for path in sorted(sim.rglob("*")):
        if path.is_file() and path.suffix in (".py", ".toml", ".json"):
            digest.update(path.relative_to(sim).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]
