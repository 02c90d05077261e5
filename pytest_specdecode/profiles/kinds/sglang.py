"""``launcher = "sglang"``: SGLang run as a local process by the profile's ``python`` (else the
interpreter running pytest); its build is that interpreter and SGLang's installed files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from pytest_specdecode.profiles.kinds.base import BuildFacts, ProfileView, ServerKind

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
        return f"SGLang {version} in {parts.get('python')}"


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
    return {"sglang": data.get("sglang"), "record": data.get("record")}
