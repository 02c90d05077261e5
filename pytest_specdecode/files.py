"""Writing files a reader may be reading: atomic replacement, and keeping the user's bytes."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import stat
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

_TEMP_SUFFIX = ".tmp"
_MKSTEMP_PART = re.compile(r"[a-z0-9_]{8}")
# A writer's temp file is named by its writer: pid and host, then mkstemp's random part.
_WRITER_PART = re.compile(r"(?P<pid>[0-9]+)@(?P<host>[A-Za-z0-9-]{1,32})\.[a-z0-9_]{8}")
STALE_TEMP_SECONDS = 3600.0
"""Age after which a temp file whose writer cannot be checked (another host, an older plugin's
name) counts as left behind: a writer holds its temp file from ``mkstemp`` to ``os.replace``,
milliseconds, or seconds on a slow network file system."""
_WRITE_ATTEMPTS = 3


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:32] or "host"


def atomic_write_text(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``: a reader sees the old file or the new, never half.

    The temp file beside ``path`` carries the writer's pid and host, so a clean-up by another
    writer (:func:`remove_stale_temp_files`) can tell it is in use. Should it vanish anyway
    before the rename (an older writer's clean-up), the write is done again with a new one
    rather than lost.
    """
    for attempt in range(1, _WRITE_ATTEMPTS + 1):
        temp_name = _write_temp(path, text)
        try:
            os.replace(temp_name, path)
        except FileNotFoundError:
            if os.path.exists(temp_name) or attempt == _WRITE_ATTEMPTS:
                raise
            continue  # someone removed our temp file: write it again
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp_name)
            raise
        break
    _fsync_directory(path.parent)


def _write_temp(path: Path, text: str) -> str:
    """``text`` in a new temp file beside ``path``, synced, with the mode ``path`` will have."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # An existing file's permissions survive the replace; a new file gets rw-r--r-- (mkstemp's
    # 0600 would hide a baseline meant for the whole team).
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mode = 0o644
    fd, temp_name = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.name}.{os.getpid()}@{_host()}.", suffix=_TEMP_SUFFIX
    )
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp_name, mode)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp_name)
        raise
    return temp_name


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
    """Temp files of ``path`` left by a writer that died, and only those: a writer of this host
    whose pid is gone, or (another host's, an older plugin's) one older than
    :data:`STALE_TEMP_SECONDS`. The file's lock does not make every other temp file dead: two
    sessions with their own state directories take their own locks of the same baseline, and
    removing the other's temp file before its rename lost that write."""
    prefix = f".{path.name}."
    host = _host()
    now = time.time()
    for candidate in path.parent.iterdir():
        name = candidate.name
        if not (name.startswith(prefix) and name.endswith(_TEMP_SUFFIX)):
            continue
        middle = name[len(prefix) : -len(_TEMP_SUFFIX)]
        writer = _WRITER_PART.fullmatch(middle)
        if writer is None and not _MKSTEMP_PART.fullmatch(middle):
            continue  # not a temp file of ours
        if writer is not None and writer["host"] == host:
            dead = not _alive(int(writer["pid"]))
        else:
            try:
                dead = now - candidate.stat().st_mtime > STALE_TEMP_SECONDS
            except OSError:
                continue  # gone already
        if dead:
            with contextlib.suppress(OSError):
                candidate.unlink()


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def move_aside(path: Path) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    counter = 1
    while target.exists():
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{counter}")
        counter += 1
    os.rename(path, target)
    return target
