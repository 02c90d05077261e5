"""The baseline store: one reviewable JSON file per test and hardware key.

A baseline file keeps everything a later comparison needs to be trusted: the raw per-run
samples (never only their summary), the summary for human readers, the workload hash, the
profile fingerprint (hard and soft fields), and provenance (time, git commit, versions, GPUs,
the speed-relevant environment variables with secrets redacted). Files are pretty-printed with
sorted keys and one sample per line, so ``git diff`` of a re-recorded baseline is a review.

Layout (see :meth:`BaselineStore.path_for`)::

    baselines/<hardware key>/<test file without .py>/<test name and params>.json

Writes are atomic (temporary file in the same directory, then ``os.replace``) and serialised per
file by a ``filelock.FileLock`` next to it. A file that cannot be read is never overwritten: an
update moves it aside to ``<name>.json.corrupt-<UTC time>`` and says so.

Decisions where the design was silent:

* The stored ``summary`` and ``fingerprint.digest`` are for readers; loading recomputes both
  from the samples and the hard fields, so a hand-edited sample cannot disagree with its summary.
* Unknown top-level keys are an error, not ignored: a field this version does not understand
  would otherwise be dropped silently on the next ``--update-baselines``.
* Secrets are redacted twice: in :func:`collect_provenance` and again when a record is built,
  over every JSON object key, ``NAME=value`` string and ``--flag value`` pair in provenance and
  fingerprint (a profile's ``--api-key`` argument must not reach git either).
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import filelock

from pytest_specdecode import __version__
from pytest_specdecode.errors import BaselineError
from pytest_specdecode.files import atomic_write_text, move_aside, remove_stale_temp_files
from pytest_specdecode.fingerprint import FieldDifference, Fingerprint, JSONValue
from pytest_specdecode.redaction import redact_json

SCHEMA_VERSION = 1
"""Version of the baseline file layout; bumped whenever a reader of the old layout would
misread the new one."""

SCHEMA_PATH = Path(__file__).parent / "schemas" / "baseline.schema.json"
"""JSON Schema (draft 2020-12) of a baseline file, for editors and CI; the package itself
validates with :meth:`BaselineRecord.from_json`."""

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

_REMEDY = (
    "Fix the file by hand, or re-record it with --update-baselines (the unreadable file is kept "
    "as <name>.json.corrupt-<time>, not deleted)."
)


class BaselineFileError(BaselineError):
    """A baseline file that cannot be used as it is; ``problem`` says why in a few words
    (without the path and the advice, which the full message adds)."""

    def __init__(self, problem: str, remedy: str = _REMEDY, *, path: Path | str | None) -> None:
        self.problem = problem
        super().__init__(f"{problem}. {remedy}", path=None if path is None else str(path))


# --------------------------------------------------------------------------- samples


@dataclass(frozen=True)
class MetricSamples:
    """The per-run values of one metric, in run order."""

    values: tuple[float, ...]

    def __post_init__(self) -> None:
        values = tuple(float(v) for v in self.values)
        if not values:
            raise ValueError("a metric needs at least one sample")
        for value in values:
            if not math.isfinite(value):
                raise ValueError(f"samples must be finite numbers, got {value!r}")
        object.__setattr__(self, "values", values)

    @property
    def cv(self) -> float | None:
        """Coefficient of variation (sample std / |mean|); ``None`` when it cannot be judged
        (one sample, or a mean of zero)."""
        return self.summary()["cv"]

    def summary(self) -> dict[str, float | None]:
        """n, mean, std (sample, ddof=1), cv, median, min, max. ``std`` and ``cv`` are ``None``
        with a single sample: reporting 0 would claim a noise level nobody measured."""
        values = self.values
        mean = statistics.fmean(values)
        std = statistics.stdev(values) if len(values) >= 2 else None
        cv = std / abs(mean) if std is not None and mean != 0 else None
        return {
            "n": len(values),
            "mean": mean,
            "std": std,
            "cv": cv,
            "median": statistics.median(values),
            "min": min(values),
            "max": max(values),
        }


# --------------------------------------------------------------------------- redaction


def _json_copy(value: JSONValue, what: str) -> JSONValue:
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} must be JSON data without NaN or infinity: {exc}") from exc


def _redacted_fingerprint(fingerprint: Fingerprint) -> Fingerprint:
    return Fingerprint(hard=redact_json(fingerprint.hard), soft=redact_json(fingerprint.soft))


# --------------------------------------------------------------------------- the record


@dataclass(frozen=True)
class BaselineRecord:
    """One stored baseline: the runs of one test on one hardware key, and what they ran under."""

    test_id: str
    profile: str
    hardware_key: str
    simulated: bool
    workload_name: str
    workload_hash: str
    fingerprint: Fingerprint
    samples: Mapping[str, tuple[float, ...]]
    provenance: Mapping[str, JSONValue]
    created_unix: float
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if not self.test_id or not self.hardware_key:
            raise ValueError("a baseline needs a test id and a hardware key")
        if not self.samples:
            raise ValueError(f"baseline of {self.test_id} has no samples")
        samples: dict[str, tuple[float, ...]] = {}
        for name, values in sorted(self.samples.items()):
            try:
                samples[name] = MetricSamples(tuple(values)).values
            except ValueError as exc:
                raise ValueError(f"samples[{name!r}]: {exc}") from exc
        object.__setattr__(self, "samples", samples)
        provenance = _json_copy(dict(self.provenance), "provenance")
        object.__setattr__(self, "provenance", redact_json(provenance))
        object.__setattr__(self, "fingerprint", _redacted_fingerprint(self.fingerprint))
        object.__setattr__(self, "created_unix", float(self.created_unix))

    def metric(self, name: str) -> MetricSamples:
        """The samples of one metric; ``KeyError`` if this baseline did not record it."""
        return MetricSamples(self.samples[name])

    def summary(self) -> dict[str, dict[str, float | None]]:
        """Per metric: n, mean, std, cv, median, min, max (see :meth:`MetricSamples.summary`)."""
        return {name: MetricSamples(values).summary() for name, values in self.samples.items()}

    def to_json(self) -> dict[str, JSONValue]:
        """The file's content as JSON data (matches ``schemas/baseline.schema.json``)."""
        return {
            "schema_version": self.schema_version,
            "test_id": self.test_id,
            "profile": self.profile,
            "hardware_key": self.hardware_key,
            "simulated": self.simulated,
            "workload_name": self.workload_name,
            "workload_hash": self.workload_hash,
            "fingerprint": self.fingerprint.to_json(),
            "samples": {name: list(values) for name, values in self.samples.items()},
            "summary": {name: _readable(summary) for name, summary in self.summary().items()},
            "provenance": dict(self.provenance),
            "created_unix": self.created_unix,
        }

    def to_text(self) -> str:
        """Pretty-printed, sorted-key JSON with a trailing newline: the exact file content."""
        return json.dumps(self.to_json(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, data: JSONValue, *, path: Path | str | None = None) -> BaselineRecord:
        """Validate and build a record; :class:`BaselineError` names ``path`` and the field."""
        where = path
        if not isinstance(data, Mapping):
            raise BaselineFileError(
                f"a baseline file holds one JSON object, this one a {type(data).__name__}",
                path=where,
            )
        _check_schema_version(data.get("schema_version", None), where)
        unknown = sorted(set(data) - _FIELDS)
        if unknown:
            raise BaselineFileError(
                f"unknown field(s) {', '.join(map(repr, unknown))} for schema version "
                f"{SCHEMA_VERSION} (known: {', '.join(sorted(_FIELDS))}); they would be lost on "
                "the next update",
                path=where,
            )
        get = _FieldReader(data, where)
        try:
            fingerprint = Fingerprint.from_json(get.mapping("fingerprint"))
        except ValueError as exc:
            raise BaselineFileError(f"field 'fingerprint': {exc}", path=where) from exc
        get.mapping("summary")  # derived; recomputed from the samples, but must be well formed
        try:
            return cls(
                test_id=get.text("test_id"),
                profile=get.text("profile"),
                hardware_key=get.text("hardware_key"),
                simulated=get.boolean("simulated"),
                workload_name=get.text("workload_name"),
                workload_hash=get.text("workload_hash"),
                fingerprint=fingerprint,
                samples=get.samples(),
                provenance=get.mapping("provenance"),
                created_unix=get.number("created_unix"),
                schema_version=SCHEMA_VERSION,
            )
        except (ValueError, OverflowError) as exc:
            raise BaselineFileError(str(exc), path=where) from exc


def _readable(summary: Mapping[str, float | None]) -> dict[str, float | None]:
    # 12 significant digits: drops float noise such as 94.10000000000001 from the diff; the
    # summary is for readers only (loading recomputes it from the exact samples).
    return {
        key: value if value is None or isinstance(value, int) else float(f"{value:.12g}")
        for key, value in summary.items()
    }


_FIELDS = frozenset(
    {
        "schema_version",
        "test_id",
        "profile",
        "hardware_key",
        "simulated",
        "workload_name",
        "workload_hash",
        "fingerprint",
        "samples",
        "summary",
        "provenance",
        "created_unix",
    }
)


def _check_schema_version(version: JSONValue, where: Path | str | None) -> None:
    if isinstance(version, int) and not isinstance(version, bool) and version == SCHEMA_VERSION:
        return
    reads = f"this pytest-specdecode ({__version__}) reads schema version {SCHEMA_VERSION}"
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        advice = (
            "It was written by a newer pytest-specdecode: upgrade the plugin, or re-record the "
            "baseline with --update-baselines (the newer file is kept as "
            "<name>.json.corrupt-<time>)."
        )
    elif isinstance(version, int) and not isinstance(version, bool):
        advice = (
            "It was written by an older pytest-specdecode: re-record the baseline with "
            "--update-baselines (the old file is kept as <name>.json.corrupt-<time>)."
        )
    else:
        raise BaselineFileError(
            f"has no valid 'schema_version' (found {version!r}); {reads}. Is this a "
            "pytest-specdecode baseline?",
            path=where,
        )
    raise BaselineFileError(f"has schema version {version}, but {reads}", advice, path=where)


class _FieldReader:
    """Typed access to the fields of a parsed baseline, failing with the field's name."""

    def __init__(self, data: Mapping[str, JSONValue], where: Path | str | None) -> None:
        self._data = data
        self._where = where

    def _get(self, name: str, expected: str) -> JSONValue:
        if name not in self._data:
            raise BaselineFileError(f"missing field {name!r} ({expected})", path=self._where)
        return self._data[name]

    def _bad(self, name: str, expected: str, value: JSONValue) -> BaselineFileError:
        return BaselineFileError(
            f"field {name!r} must be {expected}, got {value!r}", path=self._where
        )

    def text(self, name: str) -> str:
        value = self._get(name, "a string")
        if not isinstance(value, str):
            raise self._bad(name, "a string", value)
        return value

    def boolean(self, name: str) -> bool:
        value = self._get(name, "true or false")
        if not isinstance(value, bool):
            raise self._bad(name, "true or false", value)
        return value

    def number(self, name: str) -> float:
        value = self._get(name, "a number")
        if not _is_number(value):
            raise self._bad(name, "a number", value)
        return float(value)

    def mapping(self, name: str) -> Mapping[str, JSONValue]:
        value = self._get(name, "an object")
        if not isinstance(value, Mapping):
            raise self._bad(name, "an object", value)
        return value

    def samples(self) -> dict[str, tuple[float, ...]]:
        samples = self.mapping("samples")
        if not samples:
            raise self._bad("samples", "an object with at least one metric", samples)
        out: dict[str, tuple[float, ...]] = {}
        for metric, values in samples.items():
            if not isinstance(values, list) or not values or not all(map(_is_number, values)):
                raise self._bad(f"samples.{metric}", "a non-empty list of numbers", values)
            out[metric] = tuple(float(v) for v in values)
        return out


def _is_number(value: JSONValue) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# --------------------------------------------------------------------------- fingerprint check


@dataclass(frozen=True)
class FingerprintCheck:
    """How a stored baseline's configuration differs from the current one."""

    hard: tuple[FieldDifference, ...]
    soft: tuple[FieldDifference, ...]

    @property
    def comparable(self) -> bool:
        """False when a hard field differs: the two runs are different experiments."""
        return not self.hard

    def error_message(self, record_path: Path | str) -> str:
        """Why the baseline at ``record_path`` is not compared, naming every hard field."""
        names = ", ".join(d.name for d in self.hard)
        lines = [
            f"{record_path}: not compared: the baseline was recorded under a different "
            f"configuration (hard fields differ: {names}):"
        ]
        lines += [f"  {d.describe()}" for d in self.hard]
        if self.soft:
            lines.append("Soft fields that differ as well:")
            lines += [f"  {d.describe()}" for d in self.soft]
        lines.append(
            "If the change is intended, re-record the baseline with --update-baselines; "
            "otherwise restore the configuration the baseline was measured with."
        )
        return "\n".join(lines)

    def warning_message(self, record_path: Path | str | None = None) -> str:
        """A warning naming the soft fields that differ (the comparison still runs)."""
        where = f"{record_path}: " if record_path is not None else ""
        details = "; ".join(d.describe() for d in self.soft)
        return f"{where}compared, but soft fields differ from the baseline: {details}"


def check_fingerprint(
    stored: BaselineRecord,
    current: Fingerprint,
    *,
    workload_hash: str | None = None,
    simulated: bool | None = None,
) -> FingerprintCheck:
    """Compare a stored baseline's fingerprint with the current one.

    ``current`` is redacted the way stored fingerprints are, so a secret never shows up as a
    difference. A different ``workload_hash`` or ``simulated`` flag, when given, counts as a
    hard difference: other prompts or a simulated server make a different experiment.
    """
    diff = stored.fingerprint.diff(_redacted_fingerprint(current))
    hard = list(diff.hard)
    if workload_hash is not None and workload_hash != stored.workload_hash:
        hard.append(FieldDifference("workload_hash", stored.workload_hash, workload_hash))
    if simulated is not None and simulated != stored.simulated:
        hard.append(FieldDifference("simulated", stored.simulated, simulated))
    return FingerprintCheck(hard=tuple(hard), soft=diff.soft)


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

    def __init__(self, root: Path, *, lock_timeout: float = 60.0) -> None:
        self.root = Path(root)
        self.lock_timeout = lock_timeout

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
        holds ``<file>.lock``; an existing file that cannot be read is moved aside first.
        Under xdist only the controller may call this (the caller ensures that).
        """
        path = self.path_for(record.hardware_key, record.test_id)
        if max_cv is not None and not force:
            _refuse_noisy(record, path, max_cv, metrics_for_cv)
        text = record.to_text()
        path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = Path(f"{path}.lock")
        try:
            with filelock.FileLock(lock_path, timeout=self.lock_timeout):
                remove_stale_temp_files(path)
                old, moved_aside, reason = self._take_old(path, record)
                atomic_write_text(path, text)
        except filelock.Timeout as exc:
            raise BaselineError(
                f"could not lock {lock_path} within {self.lock_timeout:g} s: another process "
                "is writing this baseline. Let it finish (under xdist only the controller "
                "writes baselines) and run again.",
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
        record = BaselineRecord.from_json(_parse_json(raw, path), path=path)
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


def _parse_json(raw: bytes, path: Path) -> JSONValue:
    def no_duplicates(pairs: list[tuple[str, JSONValue]]) -> dict[str, JSONValue]:
        # A merge resolved by hand can leave a key twice; json would silently keep the last.
        keys = [key for key, _ in pairs]
        repeated = sorted({key for key in keys if keys.count(key) > 1})
        if repeated:
            raise ValueError(f"duplicate key(s) {', '.join(map(repr, repeated))}")
        return dict(pairs)

    def no_constants(name: str) -> JSONValue:
        raise ValueError(f"{name} is not a JSON number")

    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BaselineFileError(f"is not UTF-8 text ({exc})", path=path) from exc
    try:
        return json.loads(text, object_pairs_hook=no_duplicates, parse_constant=no_constants)
    except json.JSONDecodeError as exc:
        conflict = " and holds git merge-conflict markers" if "<<<<<<<" in text else ""
        raise BaselineFileError(
            f"is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}){conflict}",
            path=path,
        ) from exc
    except ValueError as exc:
        raise BaselineFileError(f"is not valid baseline JSON: {exc}", path=path) from exc


def _refuse_noisy(
    record: BaselineRecord, path: Path, max_cv: float, metrics: Sequence[str]
) -> None:
    for name in metrics:
        if name not in record.samples:
            continue  # e.g. accept_length of a profile without speculation
        summary = record.metric(name).summary()
        n, cv = summary["n"], summary["cv"]
        if cv is not None and cv <= max_cv:
            continue
        if cv is not None:
            measured = (
                f"{name} has a CV of {cv * 100:.1f}% over {n} runs, above the limit of "
                f"{max_cv * 100:.1f}%"
            )
        elif n == 1:
            measured = f"the noise of {name} cannot be judged from 1 run"
        else:
            measured = f"the CV of {name} is undefined (mean 0 over {n} runs)"
        raise BaselineError(
            f"refusing to record the baseline of {record.test_id}: {measured} "
            "(--specdecode-max-baseline-cv, ini specdecode_max_baseline_cv). A noisy baseline "
            "hides real regressions: find the noise source or record more runs. To record it "
            "anyway, pass --specdecode-force-baseline.",
            path=str(path),
        )
