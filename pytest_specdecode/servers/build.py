"""Which build a launch runs: the part of a server's identity that the fingerprint leaves out.

The fingerprint says which *configuration* a server runs (model, speculative settings, the
profile's env sets); two sessions with the same profile can still launch different servers:
another SGLang release or a rebuilt wheel in the same interpreter, another image behind the same
tag, a llama-server rebuilt in place, or the environment variables that change speed from the
shell (``SGLANG_*`` switches, the simulator's injected ``SPECDECODE_SIM_SLOWDOWN``). A server may
be reused only by a session that would launch the same build, so the pool keys its servers by
fingerprint *and* build (:class:`BuildKey`).

What is read, per launcher (each kind's ``build_parts`` in :mod:`pytest_specdecode.profiles.kinds`):

* ``sglang``: the interpreter's real path and, asked of that interpreter without importing
  SGLang (``importlib.metadata``, well under a second), SGLang's version and a hash of the
  installed files' record (pip's ``RECORD`` lists every file with its hash, so a reinstall of
  other code under the same version changes it);
* ``sim``: this package's version and a hash of the simulator's sources (``sim/`` and the
  per-release SGLang data it reads, ``sglang_releases.py``/``.json``);
* ``docker``: the image's id (its content digest) on the engine, not only its tag;
* ``llamacpp``: the binary's real path, size and modification time (the GGUF files' hashes are
  already in the fingerprint);
* every launcher: the speed-relevant variables of the launch environment
  (:data:`~pytest_specdecode.redaction.SPEED_ENV_PATTERNS`, the simulator's knobs and the
  library paths), secret-looking ones hashed, never stored.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_specdecode.profiles.kinds.base import BuildFacts
from pytest_specdecode.profiles.kinds.registry import KINDS, kind_of
from pytest_specdecode.redaction import SPEED_ENV_PATTERNS, is_secret_name

BUILD_ENV_PATTERNS: tuple[str, ...] = (
    *SPEED_ENV_PATTERNS,
    "SPECDECODE_SIM_*",  # the simulator's injected regressions (sim/args.py ENV_KNOBS)
    "PYTHONPATH",
    "LD_LIBRARY_PATH",
    "LD_PRELOAD",
)
"""Launch-environment variables that make two launches of one profile different builds."""


@dataclass(frozen=True)
class BuildKey:
    """The build a launch runs: ``key`` (a short hash) and what it was computed from, for the
    message that explains why a running server was not reused."""

    key: str
    parts: Mapping[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """``SGLang 0.5.15 in /venv/bin/python`` or ``image sha256:ab12...``: the build's
        headline, without the environment."""
        kind = KINDS.get(str(self.parts.get("launcher")))
        return kind.describe_build(self.parts) if kind is not None else "an unknown build"

    def differences(self, other: Mapping[str, Any]) -> list[str]:
        """What differs between this build and another's recorded ``parts``: field names and
        both values (environment variables by name only: their values may be secret)."""
        mine, theirs = dict(self.parts), dict(other)
        out = []
        for name in sorted(set(mine) | set(theirs)):
            if name == "env":
                env_a, env_b = mine.get("env") or {}, theirs.get("env") or {}
                changed = sorted(k for k in set(env_a) | set(env_b) if env_a.get(k) != env_b.get(k))
                if changed:
                    out.append(f"environment {', '.join(changed)}")
            elif mine.get(name) != theirs.get(name):
                out.append(f"{name} {theirs.get(name)!r} -> {mine.get(name)!r}")
        return out


def build_key(
    launcher: str,
    *,
    python: str | None,
    launch_env: Mapping[str, str],
    image: str | None = None,
    image_id: str | None = None,
    binary: str | None = None,
    engine: str | None = None,
) -> BuildKey:
    """The build of one launch (see the module docstring for what each launcher reads: its
    kind's :meth:`~pytest_specdecode.profiles.kinds.base.ServerKind.build_parts`)."""
    facts = BuildFacts(python=python, image=image, image_id=image_id, binary=binary, engine=engine)
    parts: dict[str, Any] = {"launcher": launcher}
    parts.update(kind_of(launcher).build_parts(facts))
    parts["env"] = _build_env(launch_env)
    text = json.dumps(parts, sort_keys=True, default=str)
    return BuildKey(key=hashlib.sha256(text.encode()).hexdigest()[:16], parts=parts)


def _build_env(env: Mapping[str, str]) -> dict[str, str]:
    out = {}
    for name in sorted(env):
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in BUILD_ENV_PATTERNS):
            value = env[name]
            if is_secret_name(name):  # compared, never stored or shown
                value = "sha256:" + hashlib.sha256(value.encode()).hexdigest()[:16]
            out[name] = value
    return out
