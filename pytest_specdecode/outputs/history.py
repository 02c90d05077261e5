"""The nightly history: one JSON line per session, appended, read back for trends.

Each line is a :func:`history_record`: when the session ran, on which commit and hardware, and
per test that was measured or errored its outcome (for an error, its cause), the mean and 95% CI
of every metric and its runs' values, the configuration's speculative algorithm, and per check
the ratio, its CI, the verdict and the baseline it was compared with (mean, run-to-run std when
known, and the margin's threshold in the metric's unit). The
layout is versioned (:data:`HISTORY_SCHEMA_VERSION`) and described by
``schemas/history.schema.json``.

Appending is safe from several processes at once (xdist controllers of parallel CI jobs sharing
a file): each record is one ``write`` of one complete line to a descriptor opened with
``O_APPEND``, under a ``filelock`` next to the file, so lines neither interleave nor get lost
whatever their length. A line is whole or absent: an append that fails (a full disk, an I/O
error, Ctrl-C) is cut back to the file's previous size, and a last line torn by a writer that
was killed outright is moved to ``PATH.torn`` by the next append, which says so.
:func:`read_history` names a bad line (file and line) and stops, or hands it to the caller's
``on_bad_line`` and goes on (:class:`BadLines`: the session's readers, each line once).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import filelock

from pytest_specdecode import __version__
from pytest_specdecode.errors import SpecdecodeError
from pytest_specdecode.metrics import METRICS
from pytest_specdecode.outputs.json_report import (
    finite_json,
    iso_utc,
    metric_summary,
    normalized_session,
    parse_iso,
)
from pytest_specdecode.result import Outcome, SpecdecodeResult

HISTORY_SCHEMA_VERSION = 1
"""Version of a history line's layout; a reader refuses lines of a newer version."""

HISTORY_SCHEMA_PATH = Path(__file__).parents[1] / "schemas" / "history.schema.json"

_REMEDY = (
    "each line must be one session's JSON record written by pytest-specdecode; fix or delete "
    "that line (the others are kept), or pass --skip-bad-lines to report it and go on"
)


class HistoryError(SpecdecodeError):
    """A history file cannot be read or written."""


# --------------------------------------------------------------------------- record


def _threshold(baseline_mean: float, margin: float, higher_is_better: bool) -> float | None:
    """The current mean at which the ratio meets ``1 + margin`` exactly."""
    if higher_is_better:
        return baseline_mean * (1.0 + margin)
    return baseline_mean / (1.0 + margin) if margin > -1.0 else None


def _baseline_std(check: Mapping[str, Any]) -> float | None:
    std = check.get("baseline_std")
    if isinstance(std, int | float) and not isinstance(std, bool):
        return float(std)
    cv, mean = check.get("baseline_cv"), check.get("baseline_mean")
    if isinstance(cv, int | float) and isinstance(mean, int | float):
        return float(cv) * abs(float(mean))
    return None


def _check_record(check: Mapping[str, Any]) -> dict[str, Any]:
    metric = str(check["metric"])
    info = METRICS.get(metric)
    margin = float(check.get("margin") or 0.0)
    baseline_mean = check.get("baseline_mean")
    compared = check.get("ratio") is not None
    return {
        "metric": metric,
        "reference": check.get("reference"),
        "margin": margin,
        "compared": compared,
        "verdict": check.get("verdict") if compared else None,
        "ratio": check.get("ratio"),
        "ci_low": check.get("ci_low"),
        "ci_high": check.get("ci_high"),
        "n_baseline": check.get("n_baseline"),
        "baseline_mean": baseline_mean,
        "baseline_std": _baseline_std(check) if compared else None,
        "threshold": (
            _threshold(float(baseline_mean), margin, info.higher_is_better if info else True)
            if compared and isinstance(baseline_mean, int | float)
            else None
        ),
    }


def _test_record(result: SpecdecodeResult) -> dict[str, Any]:
    metrics = {}
    for name, values in result.samples.items():
        if values:
            summary = metric_summary(values)
            metrics[name] = {key: summary[key] for key in ("n", "mean", "cv")} | {
                "ci_low": summary["ci95_low"],
                "ci_high": summary["ci95_high"],
            }
    return {
        "test_id": result.test_id,
        "profile": result.profile,
        "outcome": result.outcome.value,
        "simulated": result.simulated,
        "hardware_key": result.hardware_key,
        "host": result.host,
        "workload_hash": result.workload_hash,
        "fingerprint": result.fingerprint.digest,
        # SGLang's speculative algorithm or llama.cpp's spec type: the dashboard filters by it
        "algorithm": result.fingerprint.hard.get("speculative_algorithm")
        or result.fingerprint.hard.get("speculative_type"),
        "server_version": result.server_version,
        "build": result.provenance.get("build"),
        "runs": result.runs,
        # the runs of each server launch, in order: a baseline recorded over several launches
        # gives the cross-night detector its first points of the new level (stats/crossnight)
        "launch_runs": list(result.launch_runs),
        "metrics": metrics,
        # each run's value (5 significant digits), for the dashboard's run-level view
        "samples": {
            name: [float(f"{value:.5g}") for value in values]
            for name, values in result.samples.items()
            if values
        },
        "checks": [_check_record(c) for c in result.checks],
        "error": dataclasses.asdict(result.error) if result.error is not None else None,
        # the detector's state after this night: it lives with the history it is computed from
        "crossnight": result.crossnight,
    }


def history_record(
    results: Sequence[SpecdecodeResult], *, session_info: Mapping[str, Any]
) -> dict[str, Any]:
    """One session's line: time (``finished_utc`` of ``session_info``, else now), commit,
    hardware (keys, and GPU names and driver from the first result's provenance), target, exit
    status, and a compact record of every test that was measured or errored."""
    info = normalized_session(session_info, results)
    when = info.get("finished_utc") or info.get("started_utc") or datetime.now(timezone.utc)
    git_info = info.get("git")
    git: Mapping[str, Any] = git_info if isinstance(git_info, Mapping) else {}
    record = {
        "schema_version": HISTORY_SCHEMA_VERSION,
        "time_utc": iso_utc(when, key="finished_utc"),
        "started_utc": info.get("started_utc"),
        "run_id": info.get("run_id"),
        "commit": git.get("commit"),
        "dirty": git.get("dirty"),
        "plugin_version": info.get("plugin_version") or __version__,
        "target": info.get("target"),
        "hardware_keys": list(info.get("hardware_keys") or []),
        "gpu": next((r.provenance["gpu"] for r in results if r.provenance.get("gpu")), None),
        "exit_status": info.get("exit_status"),
        "simulated": any(r.simulated for r in results),
        "tests": [_test_record(r) for r in results],
    }
    cleaned: dict[str, Any] = finite_json(record)
    return cleaned


# --------------------------------------------------------------------------- append


def append_history(
    path: Path, record: Mapping[str, Any], *, lock_timeout: float = 60.0
) -> str | None:
    """Append ``record`` as one line to the JSON-lines file ``path`` (created with its parent
    directories). Safe against concurrent appenders, see the module docstring.

    The line is whole or absent: a write that fails (a full disk, an I/O error, Ctrl-C or
    SIGTERM) is cut back to the file's previous size before the error is raised. A torn last
    line left by a writer that was killed is moved aside first (:func:`_mend_last_line`).
    Returns what was mended, as a sentence naming the file and line, or None."""
    path = Path(path)
    if not isinstance(record, Mapping) or record.get("schema_version") != HISTORY_SCHEMA_VERSION:
        raise HistoryError(
            f"refusing to append to {path}: the record is not a history record of schema "
            f"version {HISTORY_SCHEMA_VERSION} (build it with history_record())"
        )
    try:
        line = json.dumps(finite_json(record), separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise HistoryError(f"refusing to append to {path}: the record is not JSON: {exc}") from exc
    data = (line + "\n").encode("utf-8")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = filelock.FileLock(str(path) + ".lock", timeout=lock_timeout)
        with lock:
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                note = _mend_last_line(fd, path)
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    data = b"\n" + data  # the torn line could not be moved: fenced off
                _append_whole(fd, data, size)
            finally:
                os.close(fd)
    except filelock.Timeout as exc:
        raise HistoryError(
            f"could not lock {path}.lock within {lock_timeout:g} s to append the session's "
            "history; another process holds it. If none is running, delete the lock file"
        ) from exc
    except OSError as exc:
        raise HistoryError(
            f"could not append the session's history to {path}: {exc}; "
            f"{os_error_hint(exc, '--specdecode-history')}"
        ) from exc
    return note


def os_error_hint(exc: OSError, option: str) -> str:
    """What to do about ``exc`` when writing the file that ``option`` names: a full disk is
    not a matter of permissions."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return (
            "the file system holding it is full (or its quota is spent): free space there, or "
            f"point {option} at another file system"
        )
    if exc.errno == errno.EROFS:
        return f"its file system is mounted read-only: point {option} at a writable one"
    if exc.errno == errno.EIO:
        return "the disk reported an I/O error: check the disk (dmesg) before the next night"
    return f"check the path ({option}) and its permissions"


def _append_whole(fd: int, data: bytes, size: int) -> None:
    """Write ``data`` at the end of ``fd`` (``size`` bytes long) and sync it, or leave the file
    at ``size`` bytes: whatever stops the write half-way (ENOSPC, EIO, Ctrl-C or SIGTERM taken
    as KeyboardInterrupt) is followed by a truncation back to ``size``."""
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    except BaseException as exc:
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        except OSError as cut:
            if isinstance(exc, OSError):
                raise OSError(
                    exc.errno,
                    f"{exc.strerror}, and cutting the file back to its {size} bytes failed too "
                    f"({cut}): its last line is torn; the next append moves it aside",
                ) from exc
            raise
        if isinstance(exc, OSError):
            raise OSError(
                exc.errno,
                f"{exc.strerror}; nothing of this session's line was kept: the history is as it "
                f"was ({size} bytes)",
            ) from exc
        raise


def _mend_last_line(fd: int, path: Path) -> str | None:
    """A last line without its newline (a writer killed mid-append, or a line added by hand):
    a whole record gets its newline; anything else is moved to ``PATH.torn`` (appended there)
    and cut from the history, so the history keeps whole records only. Where the move fails
    the line stays, and the caller fences it off with a newline before the next record;
    readers then skip it, naming it. Returns what was done, or None for a file that ends in
    a newline (or is empty)."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return None
    content = os.pread(fd, size, 0)
    start = content.rfind(b"\n") + 1
    tail = content[start:]
    number = content.count(b"\n", 0, start) + 1
    where = f"{path}:{number}"
    try:
        parse_record(tail, where=where)
    except HistoryError:
        pass
    else:
        _append_whole(fd, b"\n", size)
        return f"{where}: the last line had no newline at its end; added before this session's"
    what = (
        f"{where}: the last line was cut off ({len(tail):,} bytes and no newline: an append "
        "interrupted by a crash, a kill or a full disk) and is not a whole record"
    )
    aside = Path(f"{path}.torn")
    try:
        with aside.open("ab") as handle:
            handle.write(tail + b"\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.ftruncate(fd, start)
        os.fsync(fd)
    except OSError as exc:
        return (
            f"{what}; it could not be moved to {aside} ({exc}), so it stays as line {number} "
            "and this session's line starts on the next; readers skip that line"
        )
    return f"{what}; moved to {aside}, so the history holds whole records only"


# --------------------------------------------------------------------------- read


class BadLine(HistoryError):
    """A line of a history file that is not a valid record, as a reader that skips it reports
    it: ``where`` (``FILE:LINE``) and ``why``; its text names both, without a remedy."""

    def __init__(self, where: str, why: str) -> None:
        self.where = where
        self.why = why
        super().__init__(f"{where}: {why}")


def read_history(
    path: Path, *, on_bad_line: Callable[[HistoryError], None] | None = None
) -> list[dict[str, Any]]:
    """Every record of ``path``, in file order. A line that is not a valid record raises
    :class:`HistoryError` naming the file and line and what to do, unless ``on_bad_line`` is
    given: then it receives a :class:`BadLine` and the line is left out. Blank lines are not
    records and are passed over."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise HistoryError(
            f"history file {path} does not exist; a session writes it when run with "
            "--specdecode-history PATH"
        ) from None
    except OSError as exc:
        raise HistoryError(f"cannot read history file {path}: {exc}") from exc
    records = []
    lines = raw.split(b"\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            records.append(parse_record(line, where=where))
        except HistoryError as exc:
            if on_bad_line is None:
                raise
            why = str(exc).removeprefix(f"{where}: ").removesuffix(f"; {_REMEDY}")
            if number == len(lines):  # no newline after it: a writer was cut off
                why = (
                    f"the last line has no newline at its end and is not a whole record (an "
                    f"append cut off by a crash or a full disk; the next append moves it "
                    f"aside): {why}"
                )
            on_bad_line(BadLine(where, why))
    return records


class BadLines:
    """An ``on_bad_line`` for the readers of one session, adding each bad line to
    ``warnings`` once: the session reads the history at its start and again for the dashboard,
    and both name the same line in the same words."""

    def __init__(self, warnings: list[str]) -> None:
        self._warnings = warnings

    def __call__(self, exc: HistoryError) -> None:
        text = (
            f"history line skipped: {exc}. The session reads the other lines; fix or delete "
            "that line to stop this warning"
        )
        if text not in self._warnings:
            self._warnings.append(text)


def parse_record(line: bytes | str, *, where: str) -> dict[str, Any]:
    """One history line, checked enough that the trend code can trust its shape."""
    try:
        data = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HistoryError(f"{where}: not JSON ({exc}); {_REMEDY}") from None
    if not isinstance(data, dict):
        raise HistoryError(f"{where}: a {type(data).__name__}, not a JSON object; {_REMEDY}")
    version = data.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise HistoryError(f"{where}: no integer 'schema_version'; {_REMEDY}")
    if version > HISTORY_SCHEMA_VERSION:
        raise HistoryError(
            f"{where}: schema version {version} was written by a newer pytest-specdecode; this "
            f"one ({__version__}) reads version {HISTORY_SCHEMA_VERSION}: upgrade it"
        )
    if version != HISTORY_SCHEMA_VERSION:
        raise HistoryError(f"{where}: unknown schema version {version}; {_REMEDY}")
    time_text = data.get("time_utc")
    try:
        parse_iso(str(time_text))
    except ValueError:
        raise HistoryError(f"{where}: 'time_utc' {time_text!r} is not an ISO 8601 time") from None
    tests = data.get("tests")
    if not isinstance(tests, list):
        raise HistoryError(f"{where}: 'tests' must be a list; {_REMEDY}")
    outcomes = {o.value for o in Outcome}
    for index, test in enumerate(tests):
        spot = f"{where}: tests[{index}]"
        if not isinstance(test, dict):
            raise HistoryError(f"{spot} is not an object; {_REMEDY}")
        for key in ("test_id", "profile", "outcome", "hardware_key"):
            if not isinstance(test.get(key), str):
                raise HistoryError(f"{spot} has no string {key!r}; {_REMEDY}")
        if test["outcome"] not in outcomes:
            raise HistoryError(
                f"{spot}: outcome {test['outcome']!r} is not one of {sorted(outcomes)}; {_REMEDY}"
            )
        if not isinstance(test.get("metrics"), dict) or not isinstance(test.get("checks"), list):
            raise HistoryError(f"{spot} needs a 'metrics' object and a 'checks' list; {_REMEDY}")
        for name, summary in test["metrics"].items():
            if not isinstance(summary, dict) or not _is_number(summary.get("mean")):
                raise HistoryError(f"{spot}.metrics[{name!r}] has no numeric 'mean'; {_REMEDY}")
        for c_index, check in enumerate(test["checks"]):
            if not isinstance(check, dict) or not isinstance(check.get("metric"), str):
                raise HistoryError(f"{spot}.checks[{c_index}] has no 'metric'; {_REMEDY}")
        error = test.get("error")
        if error is not None and not (
            isinstance(error, dict)
            and all(isinstance(error.get(key), str) for key in ("phase", "type", "cause"))
        ):
            raise HistoryError(
                f"{spot}.error must be null or an object with string 'phase', 'type' and "
                f"'cause'; {_REMEDY}"
            )
    return data


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
