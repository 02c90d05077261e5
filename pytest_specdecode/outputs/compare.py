"""Offline compare: two saved runs side by side, with the statistics of a live run.

``python -m pytest_specdecode compare OLD NEW`` reads two JSON reports (``--specdecode-report``),
baseline files (``baselines/...json``) or directories of baseline files, matches their tests by
test id and profile, and judges NEW's runs against OLD's exactly as a live run judges a test's
runs against its stored baseline: :func:`pytest_specdecode.verdict.evaluate` (so
:func:`pytest_specdecode.stats.comparison.compare`), one :class:`~pytest_specdecode.result.
SpecdecodeResult` per test, and the terminal table and details of
:mod:`pytest_specdecode.outputs.terminal`. Nothing statistical is computed here.

What a live run has and a saved file does not, and what this module does instead:

* **Margins** are the marker's, read back from the checks a report carries (NEW's, else OLD's);
  a baseline file or a recording run has none, so such a test gets :data:`DEFAULT_MARGINS`
  (tok/s may be at most 3% worse), and ``--margin`` replaces the margins of every test.
* **One look.** A live run looks at a growing sample and spends alpha over the looks; both
  samples here are complete, so there is one look at the full alpha.
* **No history.** The launch variance earlier nights give a live run (``--specdecode-history``)
  is not read; a baseline recorded over several launches still carries its own.
* ``against=`` checks compare with *another* profile's baseline, which neither file holds: they
  are not repeated, and each test that had one says so.
* A hard fingerprint, workload or simulated/real difference is a MISMATCH, never compared,
  as live; ``allow_mismatch`` compares anyway and names each difference in a warning.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_specdecode.baselines.baseline import BaselineFileError, BaselineRecord
from pytest_specdecode.errors import ConfigError
from pytest_specdecode.fingerprint import FieldDifference, Fingerprint
from pytest_specdecode.metrics import METRICS
from pytest_specdecode.outputs import terminal
from pytest_specdecode.outputs.json_report import DERIVED_KEYS, REPORT_KIND, REPORT_SCHEMA_VERSION
from pytest_specdecode.result import Outcome, SpecdecodeResult, TestError
from pytest_specdecode.verdict import BaselineRef, Threshold, check_json, evaluate, message
from pytest_specdecode.verdict import outcome_of as verdict_outcome

DEFAULT_MARGINS = (Threshold("tok_s", -0.03),)
"""Margins of a test whose files carry none (baseline files, a recording run): the example
suite's own tok/s margin."""

FAILING = (Outcome.FAIL, Outcome.MISMATCH, Outcome.ERROR)
"""Outcomes that make the comparison fail (exit status 1), as they fail a live test."""

Key = tuple[str, str]
"""(test id, profile): how the two sides' tests are matched."""

_DERIVED_KEYS = frozenset(DERIVED_KEYS)
"""What the report adds to ``SpecdecodeResult.to_json()``: read back, they are left out."""


class CompareError(ConfigError):
    """A file given to compare cannot be read as a report or a baseline file."""


@dataclass(frozen=True)
class SavedTest:
    """One test's runs as one saved file holds them."""

    test_id: str
    profile: str
    source: str  # the file it came from
    simulated: bool
    hardware_key: str
    workload_name: str
    workload_hash: str
    fingerprint: Fingerprint
    samples: Mapping[str, Sequence[float]]
    launch_runs: tuple[int, ...] = ()
    thresholds: tuple[Threshold, ...] = ()  # own-baseline margins of the marker (reports only)
    against: tuple[str, ...] = ()  # the marker's against= checks, described
    error: str | None = None  # why it has no samples (a test that errored)

    @property
    def key(self) -> Key:
        return self.test_id, self.profile


@dataclass
class Compared:
    """What came of comparing two sides."""

    results: list[SpecdecodeResult] = field(default_factory=list)
    only_old: list[SavedTest] = field(default_factory=list)
    only_new: list[SavedTest] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(result.outcome in FAILING for result in self.results)


# --------------------------------------------------------------------------- reading


def read_side(path: Path) -> dict[Key, SavedTest]:
    """The tests of one side: a report, a baseline file, or a directory of baseline files
    (searched recursively). Raises :class:`CompareError` naming the file and what is wrong."""
    path = Path(path)
    if path.is_dir():
        files = sorted(path.rglob("*.json"))
        if not files:
            raise CompareError(
                "no *.json files under this directory; give a report (--specdecode-report), a "
                "baseline file or a directory of baseline files",
                source=str(path),
            )
    elif path.exists():
        files = [path]
    else:
        raise CompareError("no such file or directory", source=str(path))
    tests: dict[Key, SavedTest] = {}
    for file in files:
        for test in read_file(file):
            if test.key in tests:
                raise CompareError(
                    f"test {test.test_id} of profile {test.profile} appears twice (also in "
                    f"{tests[test.key].source}); give one run per side",
                    source=str(file),
                )
            tests[test.key] = test
    return tests


def read_file(path: Path) -> list[SavedTest]:
    """The tests of one report or baseline file."""
    try:
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CompareError(f"cannot be read: {exc}", source=str(path)) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CompareError(
            f"is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
            source=str(path),
        ) from None
    file_type = data.get("kind") if isinstance(data, Mapping) else None
    if isinstance(data, Mapping) and file_type == REPORT_KIND:
        return _report_tests(data, path)
    if isinstance(data, Mapping) and "test_id" in data and "samples" in data:
        return [_baseline_test(data, path)]
    raise CompareError(
        "is neither a pytest-specdecode JSON report (written with --specdecode-report; it "
        f'has "kind": "{REPORT_KIND}") nor a baseline file (with "test_id" and "samples")',
        source=str(path),
    )


def _baseline_test(data: Mapping[str, Any], path: Path) -> SavedTest:
    try:
        record = BaselineRecord.from_json(data, path=path)
    except BaselineFileError as exc:  # its problem names the field; the remedy is the store's
        raise CompareError(
            f"is not a valid baseline file: {exc.problem}", source=str(path)
        ) from None
    return SavedTest(
        test_id=record.test_id,
        profile=record.profile,
        source=str(path),
        simulated=record.simulated,
        hardware_key=record.hardware_key,
        workload_name=record.workload_name,
        workload_hash=record.workload_hash,
        fingerprint=record.fingerprint,
        samples=record.samples,
        launch_runs=record.launch_runs,
    )


def _report_tests(data: Mapping[str, Any], path: Path) -> list[SavedTest]:
    version = data.get("schema_version")
    if version != REPORT_SCHEMA_VERSION:
        raise CompareError(
            f"report schema_version {version!r} is not one this version reads "
            f"({REPORT_SCHEMA_VERSION}); compare it with the pytest-specdecode that wrote it",
            source=str(path),
        )
    entries = data.get("tests")
    if not isinstance(entries, list):
        raise CompareError('the report has no "tests" list', source=str(path))
    tests = []
    for index, entry in enumerate(entries):
        where = f"{path} tests[{index}]"
        try:
            values = {k: v for k, v in entry.items() if k not in _DERIVED_KEYS}
            result = SpecdecodeResult.from_json(values)
            tests.append(_from_result(result, str(path)))
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise CompareError(
                f"is not a test of a pytest-specdecode report ({type(exc).__name__}: {exc})",
                source=where,
            ) from None
    return tests


def _from_result(result: SpecdecodeResult, source: str) -> SavedTest:
    own: list[Threshold] = []
    against: list[Threshold] = []
    for check in result.checks:
        metric, margin = str(check["metric"]), float(check["margin"])
        if metric not in METRICS:
            raise ValueError(f"check of unknown metric {metric!r}")
        threshold = Threshold(metric, margin, check.get("reference"))
        (own if threshold.reference is None else against).append(threshold)
    samples = {name: values for name, values in result.samples.items() if values}
    error = None
    if not samples:
        error = result.error.describe() if result.error else f"no runs ({result.outcome.value})"
    return SavedTest(
        test_id=result.test_id,
        profile=result.profile,
        source=source,
        simulated=result.simulated,
        hardware_key=result.hardware_key,
        workload_name=result.workload_name,
        workload_hash=result.workload_hash,
        fingerprint=result.fingerprint,
        samples=samples,
        launch_runs=tuple(result.launch_runs) if len(result.launch_runs) > 1 else (),
        thresholds=tuple(own),
        against=tuple(t.describe() for t in against),
        error=error,
    )


# --------------------------------------------------------------------------- comparing


def compare_sides(
    old: Mapping[Key, SavedTest],
    new: Mapping[Key, SavedTest],
    *,
    alpha: float,
    method: str,
    alpha_no_change: float,
    margins: Sequence[Threshold] = (),
    allow_mismatch: bool = False,
) -> Compared:
    """Judge each of NEW's tests against OLD's runs of the same test id and profile.

    ``margins`` replace every test's own; without them a test keeps the margins its report
    recorded (NEW's, else OLD's), else :data:`DEFAULT_MARGINS`."""
    out = Compared()
    for key, current in new.items():
        stored = old.get(key)
        if stored is None:
            out.only_new.append(current)
            continue
        thresholds = tuple(margins) or current.thresholds or stored.thresholds or DEFAULT_MARGINS
        out.results.append(
            _judge(
                stored,
                current,
                thresholds,
                alpha=alpha,
                method=method,
                alpha_no_change=alpha_no_change,
                allow_mismatch=allow_mismatch,
            )
        )
    out.only_old = [test for key, test in old.items() if key not in new]
    return out


def _judge(
    stored: SavedTest,
    current: SavedTest,
    thresholds: Sequence[Threshold],
    *,
    alpha: float,
    method: str,
    alpha_no_change: float,
    allow_mismatch: bool,
) -> SpecdecodeResult:
    warnings = [
        f"not repeated offline: {text} (that profile's baseline is in neither file)"
        for text in current.against
    ]
    if stored.hardware_key != current.hardware_key:
        warnings.append(
            f"OLD ran on hardware {stored.hardware_key!r}, NEW on {current.hardware_key!r}"
        )
    differences = _differences(stored, current)
    hard = [d for d in differences if d[1]]
    label = f"OLD ({stored.source})"
    if stored.error is not None:
        ref = BaselineRef(
            label, None, stored.source, f"OLD has no runs of this test: {stored.error}"
        )
    elif hard and not allow_mismatch:
        names = ", ".join(d.name for d, _ in hard)
        lines = [f"not compared: OLD and NEW ran different configurations ({names}):"]
        lines += [f"  {_describe(d)}" for d, _ in hard]
        lines.append(
            "Compare runs of one configuration, or pass --allow-mismatch to compare anyway."
        )
        ref = BaselineRef(label, None, stored.source, "\n".join(lines), mismatch=True)
    else:
        ref = BaselineRef(label, stored.samples, stored.source, launch_runs=stored.launch_runs)
    soft = [d for d, is_hard in differences if not is_hard or allow_mismatch]
    if soft:
        warnings.append("compared, but these differ: " + "; ".join(_describe(d) for d in soft))
    if current.error is not None:
        return _errored(current, warnings)
    checks = evaluate(
        thresholds,
        current.samples,
        {None: ref},
        alpha=alpha,
        method=method,
        alpha_no_change=alpha_no_change,
        # as live: a real server's single-launch baseline understates launch-to-launch noise
        warn_single_launch=not (stored.simulated or current.simulated),
    )
    outcome = verdict_outcome(checks)
    return SpecdecodeResult(
        test_id=current.test_id,
        profile=current.profile,
        simulated=stored.simulated or current.simulated,
        hardware_key=current.hardware_key,
        workload_name=current.workload_name,
        workload_hash=current.workload_hash,
        fingerprint=current.fingerprint,
        samples={name: list(values) for name, values in current.samples.items()},
        outcome=outcome,
        message=message(checks, outcome),
        checks=[check_json(check) for check in checks],
        warnings=warnings,
        launch_runs=list(current.launch_runs),
    )


def _errored(current: SavedTest, warnings: list[str]) -> SpecdecodeResult:
    result = SpecdecodeResult.errored(
        current.test_id,
        profile=current.profile,
        simulated=current.simulated,
        hardware_key=current.hardware_key,
        workload_name=current.workload_name,
        workload_hash=current.workload_hash,
        fingerprint=current.fingerprint,
        error=TestError("NEW", "no runs", current.error or "the test errored"),
    )
    result.warnings.extend(warnings)
    return result


def _differences(stored: SavedTest, current: SavedTest) -> list[tuple[FieldDifference, bool]]:
    """Each field that differs, and whether it is hard (the runs are different experiments)."""
    diff = stored.fingerprint.diff(current.fingerprint)
    found = [(d, True) for d in diff.hard] + [(d, False) for d in diff.soft]
    if stored.workload_hash != current.workload_hash:
        found.append(
            (
                FieldDifference(
                    "workload",
                    f"{stored.workload_name} (hash {stored.workload_hash})",
                    f"{current.workload_name} (hash {current.workload_hash})",
                ),
                True,
            )
        )
    if stored.simulated != current.simulated:
        found.append((FieldDifference("simulated", stored.simulated, current.simulated), True))
    return found


def _describe(difference: FieldDifference) -> str:
    return f"{difference.name}: OLD {difference.stored!r}, NEW {difference.current!r}"


# --------------------------------------------------------------------------- the text


def margins_text(margins: Sequence[Threshold]) -> str:
    return ", ".join(f"{t.metric} {t.margin:+.1%}" for t in margins)


def lines(compared: Compared, *, old: Path, new: Path, margins: Sequence[Threshold]) -> list[str]:
    """What ``compare`` prints: the table and details of a live run, the tests on one side
    only, and a count of the outcomes."""
    out = [f"compare: OLD {old}", f"compare: NEW {new} (judged against OLD: 'vs baseline')"]
    if margins:
        out.append(f"margins: {margins_text(margins)} for every test (--margin)")
    else:
        out.append(
            "margins: each test's marker, as its report recorded them; tests without "
            f"(baseline files, a recording run): {margins_text(DEFAULT_MARGINS)}"
        )
    out.append("")
    out.extend(terminal.results_table(compared.results))
    detail = terminal.details(compared.results)
    if detail:
        out.append("")
        out.extend(detail)
    for side, tests in (("OLD", compared.only_old), ("NEW", compared.only_new)):
        if tests:
            out.append("")
            out.append(f"only in {side} ({len(tests)}), not compared:")
            out.extend(f"  {t.test_id} [{t.profile}] ({t.source})" for t in tests)
    out.append("")
    out.append(_counts(compared.results, compared.only_old, compared.only_new))
    return out


def _counts(
    results: Iterable[SpecdecodeResult], only_old: Sequence[object], only_new: Sequence[object]
) -> str:
    tally: dict[str, int] = {}
    for result in results:
        name = result.outcome.value
        tally[name] = tally.get(name, 0) + 1
    parts = [f"{n} {name}" for name, n in tally.items()]
    if only_old or only_new:
        parts.append(f"{len(only_old)} only in OLD, {len(only_new)} only in NEW")
    return "compared: " + (", ".join(parts) if parts else "no test is in both")
