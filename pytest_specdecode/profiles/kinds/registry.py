"""The one registration of server kinds: ``KINDS`` maps each ``launcher`` value to its kind, in
the order the profile file's error messages list them. A new kind: its module in this folder and
one line here."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Protocol

from pytest_specdecode.profiles.kinds import docker, llamacpp, sglang, sim
from pytest_specdecode.profiles.kinds.base import ServerKind

KINDS: Mapping[str, ServerKind] = MappingProxyType(
    {
        kind.name: kind
        for kind in (
            sglang.KIND,
            docker.KIND,
            sim.KIND,
            llamacpp.KIND,
        )
    }
)


class _HasLauncher(Protocol):
    @property
    def launcher(self) -> str: ...


def kind_of(what: str | _HasLauncher) -> ServerKind:
    """The kind of a launcher name or of a profile (anything with a ``launcher``)."""
    name = what if isinstance(what, str) else what.launcher
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(
            f"unknown launcher {name!r}; the server kinds are {', '.join(KINDS)}"
        ) from None


def recorded_in_container(kind: object) -> bool:
    """Whether a recorded server identity's ``kind`` (a launcher name, or none for an entry
    that names none) is a container's."""
    known = KINDS.get(kind) if isinstance(kind, str) else None
    return known is not None and known.in_container
