"""A disk memo of the sequential plan's calibration (:mod:`pytest_specdecode.stats.sequential`)
and of the power analysis' noncentrality (:mod:`pytest_specdecode.stats.power_analysis`).

Calibrating a plan simulates 200,000 seeded paths of the Welch test at every look: 0.4-1.4 s of
CPU for each distinct (looks, alpha, spending, baseline size), paid by every pytest process that
compares, every night, for a result that is a pure function of those inputs. Solving for the
noncentrality of the minimum detectable effect takes 3 ms, but its root finder's import
(``scipy.optimize``) costs every comparing process about 0.17 s. The result is kept
in ``$XDG_CACHE_HOME/pytest-specdecode/calibration/`` (``~/.cache`` without it;
``PYTEST_SPECDECODE_CALIBRATION_CACHE`` moves it), one small JSON file per key, and read back
bit for bit (JSON floats round-trip exactly).

The key holds everything the result depends on: the plan, the simulation's size and seed, the
numpy and scipy versions (the random streams and the t distribution), and a digest of the
compiled code that computes it, so a changed calibration never reads an old answer. A cache that
cannot be read or written (a read-only home, a torn file) is not an error: the plan is computed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import CodeType
from typing import Any

from pytest_specdecode.files import atomic_write_text


def cache_dir() -> Path:
    """Where calibrations are kept: ``$PYTEST_SPECDECODE_CALIBRATION_CACHE`` when set, else per
    user (not the state directory, which a run may move)."""
    chosen = os.environ.get("PYTEST_SPECDECODE_CALIBRATION_CACHE")
    if chosen:
        return Path(chosen)
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "pytest-specdecode" / "calibration"


def library_versions() -> dict[str, str]:
    """The numpy and scipy versions a stored result depends on (the random streams, the special
    functions); reading scipy's imports its top package only, not the modules that cost."""
    import numpy
    import scipy

    return {"numpy": str(numpy.__version__), "scipy": str(scipy.__version__)}


def code_digest(functions: Sequence[Callable[..., Any]]) -> str:
    """A digest of the compiled code of ``functions`` (their bytecode and constants)."""
    digest = hashlib.sha256()

    def feed(code: CodeType) -> None:
        digest.update(code.co_code)
        for constant in code.co_consts:
            if isinstance(constant, CodeType):  # a nested function or comprehension
                feed(constant)
            elif isinstance(constant, frozenset):  # `x in {...}`: its order follows the hash seed
                digest.update(repr(sorted(map(repr, constant))).encode())
            else:
                digest.update(repr(constant).encode())

    for function in functions:
        feed(function.__code__)
    return digest.hexdigest()[:16]


def memoized(
    key: Mapping[str, object],
    compute: Callable[[], tuple[float, ...]],
    *,
    directory: Path | None = None,
) -> tuple[float, ...]:
    """``compute()``, or what an earlier call with the same ``key`` stored."""
    text = json.dumps(key, sort_keys=True)
    path = (directory or cache_dir()) / f"{hashlib.sha256(text.encode()).hexdigest()[:24]}.json"
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        stored = json.loads(path.read_text(encoding="utf-8"))
        if stored["key"] == json.loads(text):
            return tuple(float(value) for value in stored["values"])
    values = compute()
    with contextlib.suppress(OSError):
        atomic_write_text(path, json.dumps({"key": json.loads(text), "values": list(values)}))
    return values
