"""The baseline store: one reviewable JSON file per test and hardware key.

Each file holds one :class:`~pytest_specdecode.baselines.baseline.BaselineRecord`, pretty-printed
with sorted keys and one sample per line, so ``git diff`` of a re-recorded baseline is a review.

Layout (see :meth:`BaselineStore.path_for`)::

    baselines/<hardware key>/<test file without .py>/<test name and params>.json

Writes are atomic (temporary file in the same directory, then ``os.replace``) and serialised per
file by a ``filelock.FileLock`` in the lock directory (``<state dir>/locks``), named by a hash of
the baseline's resolved path: the baselines tree, which people review and commit, holds baselines
only, and every writer of one file on this machine still takes the same lock. A file that cannot
be read is never overwritten: an update moves it aside to ``<name>.json.corrupt-<UTC time>`` and
says so. ``--update-baselines`` refuses a baseline noisier than ``--specdecode-max-baseline-cv``
unless forced.
"""

from __future__ import annotations

import hashlib
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import filelock

from pytest_specdecode.baselines.baseline import (
    BaselineFileError,
    BaselineRecord,
    check_fingerprint,
    parse_baseline_json,
)
from pytest_specdecode.errors import BaselineError
from pytest_specdecode.files import atomic_write_text, move_aside, remove_stale_temp_files
from pytest_specdecode.settings import default_state_dir
from pytest_specdecode.stats.samples import describe

METRIC_UNITS: Mapping[str, str] = {
    "tok_s": "tok/s",
    "decode_tok_s": "tok/s",
    "accept_length": "tokens/step",
    "ttft": "s",
    "tpot": "s",
    "itl_p50": "s",
    "itl_p99": "s",
}
"""Units of the metric names in docs/architecture.md, for :meth:`BaselineUpdate.describe`."""


# --------------------------------------------------------------------------- file names

# Characters kept as they are in file names; everything else is %XX-encoded (UTF-8 bytes), so
# the mapping from test id to path is injective and needs no escaping in any shell-free use.
_SAFE = frozenset(string.ascii_letters + string.digits + "_-.=+,@[]")
_SAFE_NO_DOT = _SAFE - {"."}
_MAX_SEGMENT = 120  # leaves room for ".json.corrupt-<time>" and temp-file affixes within 255


def _encode(text: str, safe: frozenset[str]) -> str:
    return "".join(
        ch if ch in safe else "".join(f"%{byte:02X}" for byte in ch.encode()) for ch in text
    )


def _shorten(encoded: str, original: str) -> str:
    """Cut an over-long segment and append ``~`` and 16 hex digits of its SHA-256. ``~`` never
    survives encoding, so a shortened name cannot equal an unshortened one."""
    if len(encoded) <= _MAX_SEGMENT:
        return encoded
    head = encoded[: _MAX_SEGMENT - 17]
    cut = head.rfind("%")
    if cut >= len(head) - 2:  # do not end inside a %XX escape
        head = head[:cut]
    return f"{head}~{hashlib.sha256(original.encode()).hexdigest()[:16]}"


def _path_segment(text: str) -> str:
    if not text:
        raise ValueError("empty path segment")
    encoded = _encode(text, _SAFE)
    if encoded in (".", ".."):  # never walk out of the store
        encoded = encoded.replace(".", "%2E")
    return _shorten(encoded, text)


def _test_name(name: str) -> str:
    """``Class::test_x[params]`` -> ``Class.test_x[params]``. Before the first ``[`` a literal
    ``.`` is encoded, so ``.`` there only ever stands for ``::``; the params keep theirs."""
    bracket = name.find("[")
    head, params = (name[:bracket], name[bracket:]) if bracket >= 0 else (name, "")
    parts = head.split("::")
    if not all(parts):
        raise ValueError(f"empty name part in {name!r}")
    encoded = ".".join(_encode(part, _SAFE_NO_DOT) for part in parts) + _encode(params, _SAFE)
    return _shorten(encoded, name)


# --------------------------------------------------------------------------- the store


@dataclass(frozen=True)
class BaselineUpdate:
    """What one write did: the file, the record it replaced (if any), the new record, and where
    an unreadable old file was moved to."""

    path: Path
    old: BaselineRecord | None
    new: BaselineRecord
    moved_aside: Path | None = None
    moved_aside_reason: str | None = None

    def describe(self, units: Mapping[str, str] | None = None) -> list[str]:
        """Human lines for the terminal: header, then ``tok_s 88.7 -> 91.2 tok/s (+2.8%)`` per
        metric (means, with n and CV), then fingerprint changes."""
        units = METRIC_UNITS if units is None else units
        lines: list[str] = []
        if self.moved_aside is not None:
            reason = f" ({self.moved_aside_reason})" if self.moved_aside_reason else ""
            lines.append(f"the existing file could not be read{reason}; kept as {self.moved_aside}")
        new_summary = self.new.summary()
        if self.old is None:
            lines.append(f"new baseline: {self.path}")
            for name, summary in new_summary.items():
                lines.append(
                    f"{name} {_number(summary['mean'])}{_unit(units, name)}{_noise(summary)}"
                )
            return lines
        lines.append(f"updated baseline: {self.path}")
        old_summary = self.old.summary()
        for name in sorted(set(old_summary) | set(new_summary)):
            unit = _unit(units, name)
            if name not in old_summary:
                mean = new_summary[name]["mean"]
                lines.append(
                    f"{name} (new metric) {_number(mean)}{unit}{_noise(new_summary[name])}"
                )
            elif name not in new_summary:
                lines.append(f"{name} removed (was {_number(old_summary[name]['mean'])}{unit})")
            else:
                before, after = old_summary[name]["mean"], new_summary[name]["mean"]
                lines.append(
                    f"{name} {_number(before)} -> {_number(after)}{unit} "
                    f"({_change(before, after)}){_noise(new_summary[name])}"
                )
        if self.old.profile != self.new.profile:
            lines.append(f"profile changed: {self.old.profile} -> {self.new.profile}")
        check = check_fingerprint(
            self.old,
            self.new.fingerprint,
            workload_hash=self.new.workload_hash,
            simulated=self.new.simulated,
        )
        lines += [f"hard field changed: {d.describe()}" for d in check.hard]
        lines += [f"soft field changed: {d.describe()}" for d in check.soft]
        return lines


def _unit(units: Mapping[str, str], name: str) -> str:
    return f" {units[name]}" if name in units else ""


def _number(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.1f}" if abs(value) >= 100 else f"{value:.3g}"


def _change(before: float | None, after: float | None) -> str:
    if before is None or after is None or before == 0:
        return "change n/a"
    return f"{(after - before) / abs(before) * 100:+.1f}%"


def _noise(summary: Mapping[str, float | None]) -> str:
    cv = summary["cv"]
    return f", n={summary['n']}, CV {'n/a' if cv is None else f'{cv * 100:.1f}%'}"


class BaselineStore:
    """Baseline files under one root directory (normally ``baselines/`` of the repository)."""

    def __init__(
        self, root: Path, *, lock_dir: Path | None = None, lock_timeout: float = 60.0
    ) -> None:
        self.root = Path(root)
        self.lock_dir = Path(lock_dir) if lock_dir is not None else default_state_dir() / "locks"
        self.lock_timeout = lock_timeout

    def lock_path(self, path: Path) -> Path:
        """The lock of baseline file ``path``: outside the baselines tree (so ``git status``
        never shows lock files), keyed by the resolved path, so two processes that reach the
        same file by different relative paths or symlinks exclude each other."""
        digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:32]
        return self.lock_dir / f"baseline-{digest}.lock"

    def path_for(self, hardware_key: str, test_id: str) -> Path:
        """``<root>/<hardware key>/<test file without .py>/<test name incl. params>.json``.

        Sanitising: letters, digits and ``_-.=+,@[]`` are kept; every other character becomes
        ``%XX`` (its UTF-8 bytes), ``/`` included, so a name never adds a directory and ``.``/
        ``..`` segments never leave the root. In the test name, ``::`` between class and
        function becomes ``.`` (a literal ``.`` there is encoded). A segment longer than 120
        characters is cut and suffixed with ``~`` and 16 hex digits of its SHA-256. Distinct
        test ids therefore get distinct paths, except on case-insensitive file systems for ids
        that differ only in case, and for ``x.py`` versus an extension-less test file ``x``.

        ``perf_tests/test_seed.py::test_x[eagle3-2step-concurrency=8]`` on ``8xH100`` ->
        ``8xH100/perf_tests/test_seed/test_x[eagle3-2step-concurrency=8].json``.
        """
        if not test_id:
            raise ValueError("empty test id")
        file_part, sep, name = test_id.partition("::")
        if not sep:
            file_part, name = "", test_id
        directories = [_path_segment(hardware_key)]
        if file_part:
            pieces = file_part.split("/")
            if pieces[-1].endswith(".py") and len(pieces[-1]) > 3:
                pieces[-1] = pieces[-1][:-3]
            directories += [_path_segment(piece) for piece in pieces]
        name_segment = _test_name(name) if sep else _path_segment(name)
        return self.root.joinpath(*directories, name_segment + ".json")

    def load(self, hardware_key: str, test_id: str) -> BaselineRecord | None:
        """The baseline of ``test_id`` on ``hardware_key``; ``None`` when none was recorded.

        Raises :class:`BaselineError` (naming the file and what to do) for a file that is not
        valid JSON, has another schema version, fails validation, or belongs to another test or
        hardware key than its path says.
        """
        path = self.path_for(hardware_key, test_id)
        if not path.exists():
            return None
        return self._read(path, hardware_key=hardware_key, test_id=test_id)

    def find_for_profile(
        self, hardware_key: str, profile: str, workload_hash: str
    ) -> list[BaselineRecord]:
        """Every baseline on ``hardware_key`` recorded with ``profile`` on the workload with
        ``workload_hash``, sorted by test id: what a test compares with when it must beat
        another profile. An unreadable file under the hardware key raises rather than being
        skipped, so a broken baseline can never make a comparison silently disappear."""
        base = self.root / _path_segment(hardware_key)
        if not base.is_dir():
            return []
        found = []
        for path in base.rglob("*.json"):
            if path.name.startswith(".") or not path.is_file():
                continue
            record = self._read(path, hardware_key=hardware_key, test_id=None)
            if record.profile == profile and record.workload_hash == workload_hash:
                found.append(record)
        return sorted(found, key=lambda record: record.test_id)

    def write(
        self,
        record: BaselineRecord,
        *,
        max_cv: float | None = None,
        force: bool = False,
        metrics_for_cv: Sequence[str] = ("tok_s",),
    ) -> BaselineUpdate:
        """Store ``record`` as the baseline of its test and hardware key.

        Refuses (nothing written) when a metric of ``metrics_for_cv`` that the record holds has
        a CV above ``max_cv`` or only one sample, unless ``force``. The write is atomic and
        holds the file's lock (:meth:`lock_path`); an existing file that cannot be read is moved
        aside first.
        Under xdist only the controller may call this (the caller ensures that).
        """
        path = self.path_for(record.hardware_key, record.test_id)
        if max_cv is not None and not force:
            _refuse_noisy(record, path, max_cv, metrics_for_cv)
        text = record.to_text()
        path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.lock_path(path)
        try:
            lock_path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BaselineError(
                f"cannot create the lock directory {lock_path.parent} for {path}: {exc}. Make "
                "it writable or choose another with --specdecode-state-dir.",
                path=str(path),
            ) from exc
        try:
            with filelock.FileLock(lock_path, timeout=self.lock_timeout):
                remove_stale_temp_files(path)
                old, moved_aside, reason = self._take_old(path, record)
                atomic_write_text(path, text)
        except filelock.Timeout as exc:
            raise BaselineError(
                f"could not lock {lock_path} (the lock of {path}) within "
                f"{self.lock_timeout:g} s: another process is writing this baseline. Let it "
                "finish (under xdist only the controller writes baselines) and run again.",
                path=str(path),
            ) from exc
        return BaselineUpdate(path, old, record, moved_aside, reason)

    def _read(self, path: Path, *, hardware_key: str, test_id: str | None) -> BaselineRecord:
        """Parse ``path`` and check that the record belongs where it lies (the hardware key and,
        when given, the test id it was looked up by)."""
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise BaselineFileError(f"cannot read the baseline file: {exc}", path=path) from exc
        record = BaselineRecord.from_json(parse_baseline_json(raw, path), path=path)
        try:
            expected = self.path_for(record.hardware_key, record.test_id)
        except ValueError as exc:
            raise BaselineFileError(
                f"field 'test_id' {record.test_id!r} is not a pytest node id ({exc})", path=path
            ) from exc
        if (
            record.hardware_key != hardware_key
            or (test_id is not None and record.test_id != test_id)
            or expected.resolve() != path.resolve()
        ):
            raise BaselineFileError(
                f"holds the baseline of test {record.test_id!r} on hardware key "
                f"{record.hardware_key!r}, which belongs at {expected}",
                "Was it copied or renamed? Move it back, or re-record this test with "
                "--update-baselines (the misplaced file is kept as <name>.json.corrupt-<time>).",
                path=path,
            )
        return record

    def _take_old(
        self, path: Path, record: BaselineRecord
    ) -> tuple[BaselineRecord | None, Path | None, str | None]:
        """The record being replaced; or, when the file cannot be used, where its bytes were
        moved and why. Never deletes or overwrites what is there."""
        if not path.exists():
            return None, None, None
        try:
            old = self._read(path, hardware_key=record.hardware_key, test_id=record.test_id)
        except BaselineFileError as exc:
            try:
                moved = move_aside(path)
            except OSError as move_error:
                raise BaselineError(
                    f"{exc.problem}; it could not be moved aside ({move_error}), so nothing was "
                    "written. Move or fix the file and run again.",
                    path=str(path),
                ) from move_error
            return None, moved, exc.problem
        return old, None, None


NOISE_HINT = (
    "(--specdecode-max-baseline-cv, ini specdecode_max_baseline_cv). A noisy baseline hides real "
    "regressions: find the noise source or record more runs. To record it anyway, pass "
    "--specdecode-force-baseline."
)


def noise_problem(
    samples: Mapping[str, Sequence[float]],
    max_cv: float,
    metrics: Sequence[str] = ("tok_s",),
    launch_runs: Sequence[int] = (),
) -> str | None:
    """Why these samples are too noisy to become a baseline, or None. The one rule, applied
    when a test measures with ``--update-baselines`` (so the test says so) and again when the
    file is written (so no other path records a noisy baseline).

    The limit is on run-to-run noise: for a baseline recorded over several launches
    (``launch_runs``) each launch is judged on its own, because the spread between launches is
    not noise to refuse but what the two-level verdict models (on an H200 one launch differed
    from the next by 12-28% while each launch's CV stayed 2-9%)."""
    for name in metrics:
        values = samples.get(name)
        if not values:
            continue  # e.g. accept_length of a profile without speculation
        groups = [list(values)]
        if len(launch_runs) > 1 and sum(launch_runs) == len(values):
            starts = [sum(launch_runs[:i]) for i in range(len(launch_runs))]
            groups = [list(values[a : a + n]) for a, n in zip(starts, launch_runs, strict=True)]
        for index, group in enumerate(groups):
            where = f" in launch {index + 1} of {len(groups)}" if len(groups) > 1 else ""
            summary = describe(group)
            if summary.cv is not None and summary.cv <= max_cv:
                continue
            if summary.cv is not None:
                return (
                    f"{name} has a CV of {summary.cv:.1%} over {summary.n} runs{where}, above "
                    f"the limit of {max_cv:.1%}"
                )
            if summary.n == 1:
                return f"the noise of {name} cannot be judged from 1 run{where}"
            return f"the CV of {name} is undefined (mean 0 over {summary.n} runs{where})"
    return None


def _refuse_noisy(
    record: BaselineRecord, path: Path, max_cv: float, metrics: Sequence[str]
) -> None:
    problem = noise_problem(record.samples, max_cv, metrics, record.launch_runs)
    if problem is not None:
        raise BaselineError(
            f"refusing to record the baseline of {record.test_id}: {problem} {NOISE_HINT}",
            path=str(path),
        )
