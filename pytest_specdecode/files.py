"""Writing files a reader may be reading: atomic replacement, and keeping the user's bytes."""

from __future__ import annotations

import contextlib
import os
import re
import stat
import tempfile
from datetime import datetime, timezone
from pathlib import Path

_TEMP_SUFFIX = ".tmp"
_MKSTEMP_PART = re.compile(r"[a-z0-9_]{8}")


def atomic_write_text(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``: a reader sees the old file or the new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # An existing file's permissions survive the replace; a new file gets rw-r--r-- (mkstemp's
    # 0600 would hide a baseline meant for the whole team).
    mode = stat.S_IMODE(path.stat().st_mode) if path.exists() else 0o644
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=_TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp_name, mode)
        os.replace(temp_name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp_name)
        raise
    _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable; not every platform can open a directory."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def remove_stale_temp_files(path: Path) -> None:
    """Temp files of ``path`` left by a writer that died. Only called under the file's lock,
    which every writer holds from creating its temp file to replacing, so none is in use."""
    prefix = f".{path.name}."
    for candidate in path.parent.iterdir():
        name = candidate.name
        random_part = name[len(prefix) : -len(_TEMP_SUFFIX)]
        if (
            name.startswith(prefix)
            and name.endswith(_TEMP_SUFFIX)
            and _MKSTEMP_PART.fullmatch(random_part)
        ):
            with contextlib.suppress(OSError):
                candidate.unlink()


def move_aside(path: Path) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    counter = 1
    while target.exists():
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{counter}")
        counter += 1
    os.rename(path, target)
    return target
