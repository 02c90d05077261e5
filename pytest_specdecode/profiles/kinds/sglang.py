"""``launcher = "sglang"``: SGLang run as a local process by the profile's ``python`` (else the
interpreter running pytest); its build is that interpreter, SGLang's version, commit (when it
was installed from git or a source tree) and installed files, and the versions of the packages
that move its speed (:data:`SPEED_PACKAGES`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from pytest_specdecode.profiles.kinds.base import BuildFacts, ProfileView, ServerKind

SPEED_PACKAGES = (
    "torch",
    "sgl-kernel",
    "flashinfer-python",
    "triton",
    "transformers",
    "nvidia-cutlass-dsl",
)
"""Packages beside SGLang whose version moves its speed (kernels, the compiler, the model code):
their versions in the server's interpreter are part of its build, so a history names them."""

# Run in the server's interpreter: metadata only, so it takes milliseconds, not SGLang's import.
# The commit: pip's direct_url.json of an install from git (vcs_info), else ``git rev-parse`` in
# the source directory of an editable or local install (SGLang's images install it that way).
_PROBE = """
import hashlib, json, subprocess, importlib.metadata as m
def version(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return None
try:
    d = m.distribution("sglang")
except m.PackageNotFoundError:
    print(json.dumps({"sglang": None}))
else:
    record = d.read_text("RECORD") or d.read_text("direct_url.json") or ""
    try:
        url = json.loads(d.read_text("direct_url.json") or "{}")
    except ValueError:
        url = {}
    commit = (url.get("vcs_info") or {}).get("commit_id")
    where = str(url.get("url") or "")
    if commit is None and where.startswith("file://"):
        try:
            git = subprocess.run(["git", "-C", where[7:], "rev-parse", "HEAD"],
                                 capture_output=True, text=True, timeout=10)
            commit = git.stdout.strip() or None if git.returncode == 0 else None
        except (OSError, subprocess.SubprocessError):
            commit = None
    packages = {}
    for name in PACKAGES:
        found = version(name)
        if found is not None:
            packages[name] = found
    print(json.dumps({"sglang": d.version, "commit": commit, "packages": packages,
                      "record": hashlib.sha256(record.encode()).hexdigest()[:16]}))
""".replace("PACKAGES", repr(SPEED_PACKAGES))


class SglangKind(ServerKind):
    name = "sglang"
    own_python = True
    local_gpus = True
    sglang_preflight = True

    def command(
        self, profile: ProfileView, *, host: str, port: int, binary: str | None
    ) -> list[str]:
        head = [profile.python or sys.executable, "-m", profile.module]
        return head + profile.server_args(host=host, port=port)

    def build_parts(self, facts: BuildFacts) -> dict[str, Any]:
        python = os.path.realpath(facts.python or sys.executable)
        return {"python": python, **sglang_of(python)}

    def describe_build(self, parts: Mapping[str, Any]) -> str:
        version = parts.get("sglang") or "no SGLang installed"
        commit = f" (commit {str(parts['commit'])[:12]})" if parts.get("commit") else ""
        return f"SGLang {version}{commit} in {parts.get('python')}"


KIND = SglangKind()


@lru_cache(maxsize=16)
def sglang_of(python: str) -> dict[str, Any]:
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
    return {
        "sglang": data.get("sglang"),
        "commit": data.get("commit"),
        "packages": data.get("packages") or {},
        "record": data.get("record"),
    }
