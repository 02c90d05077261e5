"""Which build a launch runs: the part of a server's identity that the fingerprint leaves out.

The fingerprint says which *configuration* a server runs (model, speculative settings, the
profile's env sets); two sessions with the same profile can still launch different servers:
another SGLang release or a rebuilt wheel in the same interpreter, another image behind the same
tag, a llama-server rebuilt in place, or the environment variables that change speed from the
shell (``SGLANG_*`` switches, the simulator's injected ``SPECDECODE_SIM_SLOWDOWN``). A server may
be reused only by a session that would launch the same build, so the pool keys its servers by
fingerprint *and* build (:class:`BuildKey`).

What is read, per launcher:

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
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest_specdecode
from pytest_specdecode.redaction import SPEED_ENV_PATTERNS, is_secret_name

BUILD_ENV_PATTERNS: tuple[str, ...] = (
    *SPEED_ENV_PATTERNS,
    "SPECDECODE_SIM_*",  # the simulator's injected regressions (sim/args.py ENV_KNOBS)
    "PYTHONPATH",
    "LD_LIBRARY_PATH",
    "LD_PRELOAD",
)
"""Launch-environment variables that make two launches of one profile different builds."""

# Run in the server's interpreter: metadata only, so it takes milliseconds, not SGLang's import.
_PROBE = """
import hashlib, json, importlib.metadata as m
try:
    d = m.distribution("sglang")
except m.PackageNotFoundError:
    print(json.dumps({"sglang": None}))
else:
    record = d.read_text("RECORD") or d.read_text("direct_url.json") or ""
    print(json.dumps({"sglang": d.version,
                      "record": hashlib.sha256(record.encode()).hexdigest()[:16]}))
"""


@dataclass(frozen=True)
class BuildKey:
    """The build a launch runs: ``key`` (a short hash) and what it was computed from, for the
    message that explains why a running server was not reused."""

    key: str
    parts: Mapping[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """``SGLang 0.5.15 in /venv/bin/python`` or ``image sha256:ab12...``: the build's
        headline, without the environment."""
        parts = self.parts
        if parts.get("image_id"):
            return f"image {parts.get('image')} ({str(parts['image_id'])[:19]})"
        if "sglang" in parts:
            version = parts["sglang"] or "no SGLang installed"
            return f"SGLang {version} in {parts.get('python')}"
        if "binary" in parts:
            return f"llama-server {parts['binary']}"
        if "sim" in parts:
            return f"the simulator of pytest-specdecode {parts['sim']}"
        return "an unknown build"

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
    """The build of one launch (see the module docstring for what each launcher reads)."""
    parts: dict[str, Any] = {"launcher": launcher}
    if launcher == "sim":
        parts["sim"] = f"{pytest_specdecode.__version__}+{_sim_sources_hash()}"
        parts["python"] = os.path.realpath(sys.executable)
    elif launcher == "docker":
        parts["image"] = image
        parts["image_id"] = image_id
        if engine:  # a host of the fleet: its server is another server than another host's
            parts["engine"] = engine
    elif launcher == "llamacpp":
        parts["binary"] = _file_stamp(binary) if binary else None
    else:
        interpreter = python or sys.executable
        parts["python"] = os.path.realpath(interpreter)
        parts.update(_sglang_of(parts["python"]))
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


def _file_stamp(path: str) -> str:
    real = os.path.realpath(path)
    try:
        stat = os.stat(real)
    except OSError:
        return f"{real} (missing)"
    return f"{real} ({stat.st_size} bytes, mtime {stat.st_mtime_ns})"


@lru_cache(maxsize=16)
def _sglang_of(python: str) -> dict[str, Any]:
    """SGLang's version and record hash in ``python`` (cached: an interpreter's packages do not
    change within one pytest session). An interpreter that cannot be run gives no version;
    the launch then fails with its own message."""
    try:
        done = subprocess.run(
            [python, "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        data = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return {"sglang": None, "probe": "failed"}
    return {"sglang": data.get("sglang"), "record": data.get("record")}


#: Files outside ``sim/`` whose content the simulator's behaviour depends on: the per-release
#: flags and fields its parser and ``/server_info`` are built from.
SIM_SHARED_SOURCES: tuple[str, ...] = ("sglang_releases.py", "sglang_releases.json")


@lru_cache(maxsize=1)
def _sim_sources_hash() -> str:
    package = Path(pytest_specdecode.__file__).parent
    sim = package / "sim"
    paths = [p for p in sim.rglob("*") if p.is_file() and p.suffix in (".py", ".toml", ".json")]
    paths += [package / name for name in SIM_SHARED_SOURCES]
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(path.relative_to(package).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]
