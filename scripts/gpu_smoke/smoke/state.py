"""The state that outlives the machine: carried out after every unit, restored on a fresh one.

A lent GPU machine goes back soon after a call ends, and its /tmp with it. So after every unit
the state (baselines, results, logs, server logs, noise batches; not the models, which the next
call rebuilds in seconds, nor the generated suite) is written to $OUT as one archive,
``gpu-smoke-state.tar.gz``. The device tool returns at most 8 files of 16 MiB from $OUT, at
most 2 folders down, named in letters, digits and ``._-``: an archive over PART_BYTES is split
into ``gpu-smoke-state.tar.gz.000``, ``.001``, ... (the archive of the default phases is a few
hundred KB). The next call restores it with ``GPU_SMOKE_RESTORE=PATH`` (the archive, or the
folder its parts are in) and goes on where the last one stopped.

``state.json`` numbers the writes: an archive no newer than the state already here (a warm
machine that kept its /tmp) is not unpacked again.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ARCHIVE = "gpu-smoke-state.tar.gz"
PART_BYTES = 15 * 2**20  # the device returns files of at most 16 MiB
OUT_FILES = 8  # ... and at most 8 of them
OUT_DEPTH = 2  # ... at most 2 folders down
NAME = re.compile(r"^[A-Za-z0-9._-]+$")
META = "state.json"


def members(state: Path) -> Iterator[Path]:
    """What is carried: the baselines, and per card its results, logs, the server logs of its
    pytest sessions and its attach and spread baselines."""
    if (state / META).exists():
        yield state / META
    base = state / "baselines"
    if base.exists():
        yield from sorted(p for p in base.rglob("*") if p.is_file())
    for card in sorted((state / "cards").glob("*")):
        for sub in ("results", "logs", "baselines-attach", "baselines-spread"):
            if (card / sub).exists():
                yield from sorted(p for p in (card / sub).rglob("*") if p.is_file())
        for pt in sorted(card.glob("pt-*")):
            yield from sorted(p for p in pt.rglob("*.log") if p.is_file())


def read_meta(state: Path) -> dict[str, Any]:
    path = state / META
    if not path.exists():
        return {"seq": 0}
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def pack(state: Path, out: Path, *, part_bytes: int = PART_BYTES) -> list[Path]:
    """Write the state to ``out`` as one archive (or its parts); return the files written."""
    meta = read_meta(state)
    meta = {**meta, "seq": int(meta.get("seq", 0)) + 1, "written": time.time(),
            "written_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
    state.mkdir(parents=True, exist_ok=True)
    (state / META).write_text(json.dumps(meta, indent=2) + "\n")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in members(state):
            tar.add(path, arcname=path.relative_to(state).as_posix(), recursive=False)
    data = buffer.getvalue()
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(f"{ARCHIVE}*"):
        old.unlink()
    if len(data) <= part_bytes:
        target = out / ARCHIVE
        target.write_bytes(data)
        return [target]
    parts = []
    for i in range(0, len(data), part_bytes):
        part = out / f"{ARCHIVE}.{i // part_bytes:03d}"
        part.write_bytes(data[i : i + part_bytes])
        parts.append(part)
    return parts


def archive_bytes(source: Path) -> bytes:
    """The archive at ``source``: the file itself, or in a folder the archive or its parts."""
    if source.is_file():
        return source.read_bytes()
    if (source / ARCHIVE).is_file():
        return (source / ARCHIVE).read_bytes()
    parts = sorted(p for p in source.glob(f"{ARCHIVE}.[0-9][0-9][0-9]") if p.is_file())
    if not parts:
        raise FileNotFoundError(f"no {ARCHIVE} (nor its parts {ARCHIVE}.000, ...) in {source}")
    return b"".join(p.read_bytes() for p in parts)


def restore(source: Path, state: Path) -> str:
    """Unpack the archive at ``source`` into ``state`` unless the state here is as new; say
    what was done."""
    data = archive_bytes(source)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        names = tar.getnames()
        bad = [n for n in names if n.startswith("/") or ".." in Path(n).parts]
        if bad:
            raise ValueError(f"{source}: refusing paths outside the state directory: {bad[:3]}")
        meta_member = tar.extractfile(META) if META in names else None
        theirs = json.loads(meta_member.read()) if meta_member else {"seq": 0}
        ours = read_meta(state)
        if (state / META).exists() and int(ours.get("seq", 0)) >= int(theirs.get("seq", 0)):
            return (
                f"the state in {state} (write {ours.get('seq')}) is as new as {source} "
                f"(write {theirs.get('seq')}): kept, nothing unpacked"
            )
        state.mkdir(parents=True, exist_ok=True)
        if hasattr(tarfile, "data_filter"):
            tar.extractall(state, filter="data")
        else:  # Python < 3.10.12 / 3.11.4: the paths were checked above
            tar.extractall(state)
    cards = sorted(p.name for p in (state / "cards").glob("*"))
    return (
        f"restored {len(names)} files from {source} (write {theirs.get('seq')} of "
        f"{theirs.get('written_utc', '?')}; cards: {', '.join(cards) or 'none'})"
    )


def out_problems(out: Path) -> list[str]:
    """What in ``out`` the device would not bring back: too many files, too large, too deep,
    or named with other characters than letters, digits and ``._-``."""
    problems = []
    files = [p for p in out.rglob("*") if p.is_file()]
    if len(files) > OUT_FILES:
        problems.append(f"{len(files)} files in {out}, more than {OUT_FILES}")
    for p in files:
        rel = p.relative_to(out)
        if p.stat().st_size > 16 * 2**20:
            problems.append(f"{rel}: {p.stat().st_size} bytes, more than 16 MiB")
        if len(rel.parts) - 1 > OUT_DEPTH:
            problems.append(f"{rel}: more than {OUT_DEPTH} folders down")
        if not all(NAME.match(part) for part in rel.parts):
            problems.append(f"{rel}: a name with other characters than letters, digits, ._-")
    return problems
