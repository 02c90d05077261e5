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


#: Files outside ``sim/`` whose content the simulator's behaviour depends on: the per-release
#: flags and fields its parser and ``/server_info`` are built from.
SIM_SHARED_SOURCES: tuple[str, ...] = ("sglang_releases.py", "sglang_releases.json")


@lru_cache(maxsize=1)
def sim_sources_hash() -> str:
    """The simulator's sources (``sim/`` and :data:`SIM_SHARED_SOURCES`): a server of another
    version of them is another build, never reused."""
    package = Path(pytest_specdecode.__file__).parent
    paths = [p for p in (package / "sim").rglob("*") if p.is_file()]
    paths = [p for p in paths if p.suffix in (".py", ".toml", ".json")]
    paths += [package / name for name in SIM_SHARED_SOURCES]
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(path.relative_to(package).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]
