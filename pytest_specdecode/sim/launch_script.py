"""``SPECDECODE_SIM_LAUNCH_SCRIPT``: a different simulated server at each launch, for tests.

The plugin relaunches a profile's server with the same command every time (a baseline recorded
over several launches), so a test that wants only the second launch noisy, or only the third
one failing to load, cannot say so in the profile. With ``SPECDECODE_SIM_LAUNCH_SCRIPT=PATH``
each simulated server that starts takes the first line of PATH as more ``--sim-*`` flags for
itself and removes that line, under a file lock, so launches take one line each, in the order
they start; an empty line, or none left, adds nothing. Like the other ``SPECDECODE_SIM_*`` knobs
it lies outside every profile and fingerprint, and what it applied is logged at startup and
reported by ``/server_info`` (``sim_env_knobs``). It is a test device: the file is consumed.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path

import filelock

ENV_LAUNCH_SCRIPT = "SPECDECODE_SIM_LAUNCH_SCRIPT"

LOCK_TIMEOUT_S = 30.0


def take_launch_flags(env: Mapping[str, str]) -> tuple[list[str], str | None]:
    """The ``--sim-*`` flags of this launch from the script ``env`` names (its first line,
    removed from the file), and the line saying what was applied (None: no script set).

    ``ValueError`` naming the variable, the file and the line when the file cannot be read or
    rewritten, the line cannot be split as a shell would, or it holds a flag that is not
    ``--sim-*`` (the script shapes the simulation, never the server's own arguments)."""
    where = env.get(ENV_LAUNCH_SCRIPT, "").strip()
    if not where:
        return [], None
    path = Path(where)
    prefix = f"environment variable {ENV_LAUNCH_SCRIPT}={where!r}"
    try:
        with filelock.FileLock(f"{path}.lock", timeout=LOCK_TIMEOUT_S):
            lines = path.read_text(encoding="utf-8").splitlines()
            if not lines:
                return [], f"{ENV_LAUNCH_SCRIPT}={where} (no line left: nothing added)"
            line = lines[0]
            path.write_text("".join(f"{rest}\n" for rest in lines[1:]), encoding="utf-8")
    except (OSError, filelock.Timeout) as exc:
        raise ValueError(
            f"{prefix}: cannot take this launch's line of {path}: {exc}. Point it at a "
            "writable text file with one line of --sim-* flags per launch"
        ) from None
    try:
        flags = shlex.split(line)
    except ValueError as exc:
        raise ValueError(f"{prefix}: line {line!r} of {path}: {exc}") from None
    foreign = [flag for flag in flags if flag.startswith("--") and not flag.startswith("--sim-")]
    if foreign:
        raise ValueError(
            f"{prefix}: line {line!r} of {path} has {', '.join(foreign)}: a launch script "
            "holds --sim-* flags only (the server's own arguments belong in the profile)"
        )
    shown = " ".join(flags) or "nothing added"
    return flags, f"{ENV_LAUNCH_SCRIPT}={where} ({shown})"
