"""Where and on what a measurement was taken: GPUs, the hardware key, and provenance.

The hardware key keeps baselines of different machines apart; provenance is the record of time,
git commit, versions, GPUs and speed-relevant environment that goes into every baseline.
"""

from __future__ import annotations

import platform
import re
import socket
import subprocess
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pytest_specdecode import __version__
from pytest_specdecode.errors import ConfigError
from pytest_specdecode.fingerprint import JSONValue
from pytest_specdecode.redaction import speed_env


@dataclass(frozen=True)
class GpuInfo:
    """The GPUs of this machine as ``nvidia-smi`` reports them."""

    names: tuple[str, ...]
    driver: str | None

    @property
    def count(self) -> int:
        return len(self.names)

    def to_json(self) -> dict[str, JSONValue]:
        return {"names": list(self.names), "count": self.count, "driver": self.driver}


SGLANG_BACKEND = "sglang"
"""``server_info["backend"]`` of an SGLang server (``backends.SglangBackend.name``): a backend,
not a launcher (sglang, docker and sim servers all report it)."""
_NVIDIA_SMI = ("nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader")


def detect_gpus(
    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
) -> GpuInfo | None:
    """GPU names and driver from ``nvidia-smi``; ``None`` when it is absent, fails, hangs for
    10 s or lists nothing. Several drivers (never seen on one box) are joined with ``/``."""
    try:
        result = run(list(_NVIDIA_SMI), capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if result.returncode != 0:
        return None
    names: list[str] = []
    drivers: set[str] = set()
    for line in (result.stdout or "").splitlines():
        name, sep, driver = line.rpartition(",")
        if sep and name.strip():
            names.append(name.strip())
            if driver.strip():
                drivers.add(driver.strip())
    if not names:
        return None
    return GpuInfo(names=tuple(names), driver="/".join(sorted(drivers)) or None)


def _key_part(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+]+", "-", text).strip("-.")


def hardware_key(
    gpu: GpuInfo | None,
    *,
    simulated: bool,
    override: str | None = None,
    override_source: str = "--specdecode-hardware-key",
) -> str:
    """The directory that keeps baselines of different hardware apart.

    ``override`` wins (runs of other characters than letters, digits and ``._+`` become ``-``);
    a simulated server gives ``"simulated"`` whatever the machine; GPUs give count and name,
    e.g. ``8xNVIDIA-RTX-PRO-6000-Blackwell-Server-Edition``, mixed models sorted and joined
    with ``+``. Without GPUs the key is ``"cpu"``, not ``cpu-<hostname>``: baselines live in
    git and a host name would give every CI runner its own. The caller should warn that CPU
    machines share this key. The driver is not part of the key: a driver upgrade is what a
    nightly run should compare across (it is a soft field). For a server on another host,
    the local ``nvidia-smi`` says nothing: pass ``override``.
    """
    if override is not None:
        key = _key_part(override)
        if not key:
            raise ConfigError(
                f"hardware key {override!r} has no letters or digits; use a name such as "
                "'8xH100' for the machine class whose baselines this run shares",
                source=override_source,
            )
        return key
    if simulated:
        return "simulated"
    if gpu is None or not gpu.names:
        return "cpu"
    counts = Counter(_key_part(name) or "unknown-gpu" for name in gpu.names)
    return "+".join(f"{count}x{name}" for name, count in sorted(counts.items()))


# --------------------------------------------------------------------------- provenance


def collect_provenance(
    *,
    env: Mapping[str, str],
    server_info: Mapping[str, Any] | None,
    gpu: GpuInfo | None,
    repo_dir: Path | None,
    now: datetime | None = None,
    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
) -> dict[str, JSONValue]:
    """Where and with what a measurement was taken, for the baseline file.

    Keys: ``time_utc`` (ISO 8601), ``git`` (``{"commit", "dirty"}`` of ``repo_dir``, or
    ``None`` outside a repository or without git; untracked files do not count as dirty),
    ``plugin_version``, ``python_version``, ``platform``, ``hostname``, ``server`` (the
    backend, ``server_info["backend"]``, SGLang when absent), ``server_version``
    (``server_info["version"]``; also as ``sglang_version`` for an SGLang server, the key older
    baselines have), ``gpu`` (names, count, driver), ``env`` (the variables of
    ``env`` matching :data:`SPEED_ENV_PATTERNS`, secrets redacted) and ``simulated``. Collect
    it once per session, before any baseline is written, or the git state counts the
    baselines being written as local changes.
    """
    info = server_info or {}
    moment = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    version = info.get("version")
    backend = str(info.get("backend") or SGLANG_BACKEND)
    simulated = info.get("simulated")
    return {
        "time_utc": moment.isoformat(timespec="seconds").replace("+00:00", "Z"),
        "git": _git_info(repo_dir, run) if repo_dir is not None else None,
        "plugin_version": __version__,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "server": backend,
        "server_version": None if version is None else str(version),
        "sglang_version": None if version is None or backend != SGLANG_BACKEND else str(version),
        "gpu": gpu.to_json() if gpu is not None else None,
        "env": speed_env(env),
        "simulated": None if simulated is None else bool(simulated),
    }


def _git_info(
    repo_dir: Path, run: Callable[..., subprocess.CompletedProcess[str]]
) -> dict[str, JSONValue] | None:
    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return run(
            ["git", "-C", str(repo_dir), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0 or not head.stdout.strip():
            return None
        status = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
    return {"commit": head.stdout.strip(), "dirty": dirty}
