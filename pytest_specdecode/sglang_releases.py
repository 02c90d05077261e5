"""What each SGLang release the project knows accepts and reports: its ``launch_server`` flags
(option strings, argparse ``dest``, arity, type, choices) and the ``ServerArgs`` fields its
``/server_info`` echoes, with their defaults.

The data is ``sglang_releases.json`` beside this module (package data), generated from the
released wheels by ``scripts/gen-sim-flags.py``; do not edit it by hand. ``versions`` lists the
releases read, oldest first; each flag and field carries ``versions``, runs of indexes into that
list as ``[first, last]`` pairs. It is read once, at the first question, not at import.

Both sides read it: the core (the ``/server_info`` field a profile's flag sets, in
:mod:`pytest_specdecode.profiles.profile`) and the simulator (the command line of the release it
speaks, in ``sim/parser.py`` and ``sim/args.py``). It imports nothing of the package, so the
simulator depends on the core only through this module, and the core never on the simulator.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA_PATH = Path(__file__).with_name("sglang_releases.json")

_VERSION_RE = re.compile(r"^v?0\.5\.(\d+)(?:(?:\.post|rc|\.dev|\.rc|post)\d+)*$")


@functools.cache
def _data() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DATA_PATH.read_text(encoding="utf-8"))
    return loaded


def known_releases() -> tuple[str, ...]:
    """The releases in the data, oldest first (``0.5.6``, ..., ``0.5.23``)."""
    return tuple(_data()["versions"])


def supported_range() -> str:
    releases = known_releases()
    return f"{releases[0]} to {releases[-1]}"


def newest() -> str:
    return known_releases()[-1]


def normalize(version: str) -> str:
    """The known release a version string maps to (``0.5.15.post1`` -> ``0.5.15``).

    ``ValueError`` naming the known range for anything else."""
    match = _VERSION_RE.match(version.strip())
    releases = known_releases()
    if match:
        release = f"0.5.{int(match.group(1))}"
        if release in releases:
            return release
    raise ValueError(
        f"unsupported SGLang version {version!r}: the releases known are SGLang "
        f"{supported_range()} (patch suffixes such as .post1 map to their release)"
    )


def _has(entry: dict[str, Any], index: int) -> bool:
    return any(first <= index <= last for first, last in entry["versions"])


@dataclass(frozen=True)
class FlagSpec:
    """One ``launch_server`` option of one release, as its argparse action was declared."""

    opts: tuple[str, ...]
    dest: str
    kind: str
    nargs: str | None
    type: str | None
    choices: tuple[str, ...] | None


@functools.cache
def flags(release: str) -> tuple[FlagSpec, ...]:
    """The options of ``release`` (a :func:`known_releases` entry), sorted by ``dest``."""
    index = known_releases().index(release)
    return tuple(
        FlagSpec(
            opts=tuple(entry["opts"]),
            dest=entry["dest"],
            kind=entry["kind"],
            nargs=entry["nargs"],
            type=entry["type"],
            choices=tuple(entry["choices"]) if entry["choices"] else None,
        )
        for entry in _data()["flags"]
        if _has(entry, index)
    )


@functools.cache
def field_defaults(release: str) -> dict[str, Any]:
    """The release's ServerArgs fields in declaration order, with their declared defaults
    (private bookkeeping fields, ``_*``, left out: ``/server_info`` does not show them)."""
    index = known_releases().index(release)
    return {
        name: entry["default"]
        for name, entry in _data()["fields"].items()
        if _has(entry, index) and not name.startswith("_")
    }


def flag_dest(flag: str, version: str) -> str | None:
    """The argparse ``dest`` of option ``flag`` (``--tp-size``) in the release ``version``
    (any spelling :func:`normalize` accepts) maps to; None for an unknown release or an option
    that release does not have."""
    try:
        release = normalize(version)
    except ValueError:
        return None
    for spec in flags(release):
        if flag in spec.opts:
            return spec.dest
    return None
