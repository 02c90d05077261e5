"""One baseline: the record a baseline file holds, read and checked.

A baseline keeps everything a later comparison needs to be trusted: the raw per-run samples
(never only their summary), the summary for human readers, the workload hash, the profile
fingerprint (hard and soft fields), and provenance (time, git commit, versions, GPUs, the
speed-relevant environment variables with secrets redacted). Where the files live and how they
are written is :mod:`pytest_specdecode.baselines.store`.

Decisions where the design was silent:

* The stored ``summary`` and ``fingerprint.digest`` are for readers; loading recomputes both
  from the samples and the hard fields, so a hand-edited sample cannot disagree with its summary.
* Unknown top-level keys are an error, not ignored: a field this version does not understand
  would otherwise be dropped silently on the next ``--update-baselines``.
* Secrets are redacted twice: in :func:`~pytest_specdecode.session.provenance.collect_provenance`
  and
  again when a record is built, over every JSON object key, ``NAME=value`` string and
  ``--flag value`` pair in provenance and fingerprint (a profile's ``--api-key`` argument must
  not reach git either).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pytest_specdecode import __version__
from pytest_specdecode.errors import BaselineError
from pytest_specdecode.fingerprint import FieldDifference, Fingerprint, JSONValue
from pytest_specdecode.redaction import redact_json
from pytest_specdecode.stats.samples import describe

SCHEMA_VERSION = 2
"""Version of the baseline file layout; bumped whenever a reader of the old layout would
misread the new one.

2: ``launch_runs`` (how many of the runs each server launch contributed, in order), and
``accept_length`` is SGLang's own definition (verify tokens per verify step); schema 1 stored
the per-request figure under that name, now ``spec_accept_length``. Schema 1 files are still
read: as one launch, with their ``accept_length`` samples moved to ``spec_accept_length`` (the
figure they are), so tok/s stays comparable and an accept-length check says to re-record.
"""

READABLE_SCHEMA_VERSIONS = (1, SCHEMA_VERSION)

LEGACY_ACCEPT_LENGTH_NOTE = (
    "it was recorded with baseline schema 1, whose accept_length was SGLang's per-request "
    "figure (first token included, now recorded as spec_accept_length), not SGLang's own "
    "accept length (verify tokens per verify step) that this version measures; re-record it "
    "with --update-baselines to compare accept length"
)

SCHEMA_PATH = Path(__file__).parents[1] / "schemas" / "baseline.schema.json"
"""JSON Schema (draft 2020-12) of a baseline file, for editors and CI; the package itself
validates with :meth:`BaselineRecord.from_json`."""

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
        """n, mean, std (sample, ddof=1), cv, median, min, max (:func:`samples.describe`; one run
        has no std or cv)."""
        d = describe(self.values)
        return {
            "n": d.n,
            "mean": d.mean,
            "std": d.std,
            "cv": d.cv,
            "median": d.median,
            "min": d.min,
            "max": d.max,
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
    launch_runs: tuple[int, ...] = ()
    """Runs per server launch, in order (empty: all runs came from one launch)."""
    read_from_schema: int = SCHEMA_VERSION
    """The schema version of the file this record was read from (what is written is always
    :data:`SCHEMA_VERSION`)."""

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
        runs = max(len(values) for values in samples.values())
        launch_runs = tuple(int(n) for n in self.launch_runs) or (runs,)
        if any(n < 1 for n in launch_runs) or sum(launch_runs) != runs:
            raise ValueError(
                f"launch_runs {list(launch_runs)} must be positive counts that add up to the "
                f"{runs} runs of the samples"
            )
        uneven = sorted(name for name, values in samples.items() if len(values) != runs)
        if uneven and len(launch_runs) > 1:
            raise ValueError(
                f"samples of {', '.join(uneven)} do not have one value per run ({runs}), so "
                "they cannot be split into launches"
            )
        object.__setattr__(self, "launch_runs", launch_runs)
        provenance = _json_copy(dict(self.provenance), "provenance")
        object.__setattr__(self, "provenance", redact_json(provenance))
        object.__setattr__(self, "fingerprint", _redacted_fingerprint(self.fingerprint))
        object.__setattr__(self, "created_unix", float(self.created_unix))

    @property
    def schema_version(self) -> int:
        return SCHEMA_VERSION

    def launches(self, metric: str) -> tuple[tuple[float, ...], ...]:
        """The samples of ``metric`` split by launch (one group when the lengths differ)."""
        values = self.samples[metric]
        if len(self.launch_runs) == 1 or len(values) != sum(self.launch_runs):
            return (values,)
        groups, start = [], 0
        for n in self.launch_runs:
            groups.append(values[start : start + n])
            start += n
        return tuple(groups)

    def missing_metric_note(self, metric: str) -> str | None:
        """Why this baseline has no samples of ``metric``, when the reason is known."""
        if metric == "accept_length" and self.read_from_schema == 1:
            return LEGACY_ACCEPT_LENGTH_NOTE
        return None

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
            "launch_runs": list(self.launch_runs),
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
        version = _check_schema_version(data.get("schema_version", None), where)
        fields = _FIELDS if version == SCHEMA_VERSION else _FIELDS_V1
        unknown = sorted(set(data) - fields)
        if unknown:
            raise BaselineFileError(
                f"unknown field(s) {', '.join(map(repr, unknown))} for schema version "
                f"{version} (known: {', '.join(sorted(fields))}); they would be lost on "
                "the next update",
                path=where,
            )
        get = _FieldReader(data, where)
        try:
            fingerprint = Fingerprint.from_json(get.mapping("fingerprint"))
        except ValueError as exc:
            raise BaselineFileError(f"field 'fingerprint': {exc}", path=where) from exc
        get.mapping("summary")  # derived; recomputed from the samples, but must be well formed
        samples = get.samples()
        if version == 1 and "accept_length" in samples:
            samples["spec_accept_length"] = samples.pop("accept_length")
        try:
            return cls(
                test_id=get.text("test_id"),
                profile=get.text("profile"),
                hardware_key=get.text("hardware_key"),
                simulated=get.boolean("simulated"),
                workload_name=get.text("workload_name"),
                workload_hash=get.text("workload_hash"),
                fingerprint=fingerprint,
                samples=samples,
                provenance=get.mapping("provenance"),
                created_unix=get.number("created_unix"),
                launch_runs=get.counts("launch_runs") if version >= 2 else (),
                read_from_schema=version,
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


_FIELDS_V1 = frozenset(
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
_FIELDS = _FIELDS_V1 | {"launch_runs"}


def _check_schema_version(version: JSONValue, where: Path | str | None) -> int:
    if (
        isinstance(version, int)
        and not isinstance(version, bool)
        and version in READABLE_SCHEMA_VERSIONS
    ):
        return version
    readable = " and ".join(map(str, READABLE_SCHEMA_VERSIONS))
    reads = f"this pytest-specdecode ({__version__}) reads schema versions {readable}"
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

    def counts(self, name: str) -> tuple[int, ...]:
        value = self._get(name, "a list of run counts")
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in value)
        ):
            raise self._bad(name, "a non-empty list of positive whole numbers", value)
        return tuple(int(n) for n in value if isinstance(n, int))

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


def parse_baseline_json(raw: bytes, path: Path) -> JSONValue:
    """The JSON of a baseline file's bytes; a :class:`BaselineFileError` saying what is wrong
    (not UTF-8, invalid JSON, merge-conflict markers, a duplicate key, NaN)."""

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
