"""Machine-readable output of a session: the JSON report and the JUnit properties of a test.

The JSON report (``--specdecode-report PATH``) holds every measured test with its raw samples,
checks and verdicts, fingerprint and provenance, and every test that errored with its cause
(outcome ``error``), plus a per-metric summary (n, mean, std, CV and
the 95% t confidence interval of the mean). Its layout is versioned
(:data:`REPORT_SCHEMA_VERSION`) and described by ``schemas/report.schema.json`` and
``docs/reports.md``.

Decisions where the design was silent:

* Secrets are redacted once more on the way out, in each test's fingerprint and provenance and in
  the pytest arguments (values under secret-looking keys, ``NAME=value`` strings, ``--secret-flag
  value`` pairs, whether split over two list items or joined in one string as a fingerprint's
  ``extra_args`` holds them), so a profile's ``--api-key`` never reaches a CI page.
* Non-finite numbers (NaN, infinity) are written as ``null``: strict JSON has no spelling for
  them, and a report that cannot be written at the end of a nightly run helps nobody.
* Values stay in base units (seconds, tokens per second); the report's ``metrics`` object carries
  each metric's display unit and scale for readers that want milliseconds, and each test's
  ``bench_serving`` object repeats the figures SGLang's ``bench_serving`` also reports under its
  names and units (``output_throughput``, ``mean_ttft_ms``, ``median_itl_ms``, ...), beside the
  fields readers of earlier reports depend on.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pytest_specdecode import __version__
from pytest_specdecode.files import atomic_write_text
from pytest_specdecode.metrics import METRICS
from pytest_specdecode.redaction import redact_json
from pytest_specdecode.result import Outcome, SpecdecodeResult
from pytest_specdecode.stats.samples import describe

REPORT_SCHEMA_VERSION = 1
"""Version of the JSON report layout; bumped when a reader of the old layout would misread the
new one (added optional fields do not bump it)."""

REPORT_KIND = "pytest-specdecode report"
SCHEMA_DIR = Path(__file__).parents[1] / "schemas"
REPORT_SCHEMA_PATH = SCHEMA_DIR / "report.schema.json"

SESSION_KEYS = (
    "started_utc",
    "finished_utc",
    "duration_s",
    "plugin_version",
    "target",
    "hardware_keys",
    "pytest_args",
    "exit_status",
    "run_id",
    "git",
)
"""The keys of ``session_info`` this module knows; others are copied through unchanged."""


# --------------------------------------------------------------------------- numbers


def metric_summary(values: Sequence[float]) -> dict[str, float | None]:
    """n, mean, std (ddof=1), CV and the 95% t interval of the mean of one metric's per-run
    values (:func:`~pytest_specdecode.stats.samples.describe`; one run has no std, CV or
    interval)."""
    d = describe(values)
    return {
        "n": d.n,
        "mean": d.mean,
        "std": d.std,
        "cv": d.cv,
        "ci95_low": d.ci_low,
        "ci95_high": d.ci_high,
    }


def finite_json(value: Any) -> Any:
    """A copy of JSON-shaped data with NaN and infinities replaced by ``None``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): finite_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_json(v) for v in value]
    return value


# --------------------------------------------------------------------------- redaction

# --------------------------------------------------------------------------- session info


def iso_utc(value: datetime | str, *, key: str = "time") -> str:
    """A datetime or ISO 8601 string as ``YYYY-MM-DDTHH:MM:SSZ`` (naive datetimes are UTC)."""
    if isinstance(value, str):
        try:
            moment = parse_iso(value)
        except ValueError:
            raise ValueError(
                f"session_info[{key!r}] = {value!r} is not an ISO 8601 time; pass a datetime or "
                "a string such as '2026-11-29T03:00:00Z'"
            ) from None
    else:
        moment = value
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    text = moment.astimezone(timezone.utc).isoformat(timespec="seconds")
    return text.replace("+00:00", "Z")


def parse_iso(text: str) -> datetime:
    """Parse ISO 8601 including a trailing ``Z`` (Python 3.10's fromisoformat lacks it)."""
    moment = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def make_session_info(
    *,
    started: datetime,
    finished: datetime,
    target: str | None,
    pytest_args: Sequence[str],
    exit_status: int,
    run_id: str | None = None,
    hardware_keys: Sequence[str] | None = None,
    warnings: Sequence[str] = (),
    failed_after_tests: Sequence[tuple[str, str]] = (),
) -> dict[str, Any]:
    """The ``session_info`` mapping :func:`build_report` and ``history_record`` expect;
    ``failed_after_tests``: (test id, reason) of each failure found after its test finished."""
    info: dict[str, Any] = {
        "started_utc": iso_utc(started, key="started"),
        "finished_utc": iso_utc(finished, key="finished"),
        "duration_s": round((finished - started).total_seconds(), 3),
        "plugin_version": __version__,
        "target": target,
        "pytest_args": list(pytest_args),
        "exit_status": int(exit_status),
        "run_id": run_id,
    }
    if hardware_keys is not None:
        info["hardware_keys"] = sorted(set(hardware_keys))
    if warnings:
        info["warnings"] = list(warnings)  # the profile file's, for the report header
    if failed_after_tests:
        info["failed_after_tests"] = [
            {"test_id": test_id, "reason": reason} for test_id, reason in failed_after_tests
        ]
    return info


def normalized_session(
    session_info: Mapping[str, Any], results: Sequence[SpecdecodeResult]
) -> dict[str, Any]:
    """``session_info`` with times in ISO UTC, secrets redacted and the gaps filled from the
    results: plugin version, hardware keys, and the git commit from the first result's
    provenance."""
    info: dict[str, Any] = dict(session_info)
    for key in ("started_utc", "finished_utc"):
        if info.get(key) is not None:
            info[key] = iso_utc(info[key], key=key)
    args = info.get("pytest_args")
    if args is not None:
        if isinstance(args, str) or not isinstance(args, Sequence):
            raise ValueError(
                f"session_info['pytest_args'] = {args!r} must be a list of strings "
                "(the invocation's arguments, e.g. config.invocation_params.args)"
            )
        info["pytest_args"] = [str(a) for a in args]
    info.setdefault("plugin_version", __version__)
    if info.get("hardware_keys") is None:
        info["hardware_keys"] = sorted({r.hardware_key for r in results})
    if info.get("git") is None:
        info["git"] = next(
            (r.provenance["git"] for r in results if isinstance(r.provenance.get("git"), Mapping)),
            None,
        )
    if info.get("pytest_args") is not None:
        info["pytest_args"] = redact_json(info["pytest_args"])
    for key in SESSION_KEYS:
        info.setdefault(key, None)
    return info


# --------------------------------------------------------------------------- JSON report


def metrics_registry() -> dict[str, dict[str, Any]]:
    """Label, display unit, display scale and direction of every metric."""
    return {
        name: {
            "label": info.label,
            "unit": info.unit,
            "display_scale": info.display_scale,
            "higher_is_better": info.higher_is_better,
        }
        for name, info in METRICS.items()
    }


def outcome_counts(results: Sequence[SpecdecodeResult]) -> dict[str, int]:
    counts = {outcome.value: 0 for outcome in Outcome}
    for result in results:
        counts[result.outcome.value] += 1
    return {"total": len(results), **counts}


BENCH_SERVING_NAMES: Mapping[str, tuple[str, float]] = {
    "tok_s": ("output_throughput", 1.0),
    "ttft": ("mean_ttft_ms", 1000.0),
    "tpot": ("mean_tpot_ms", 1000.0),
    "itl_p50": ("median_itl_ms", 1000.0),
    "itl_p99": ("p99_itl_ms", 1000.0),
    "accept_length": ("accept_length", 1.0),
}
"""Our metric -> (SGLang ``bench_serving``'s name, the factor to its unit), for the metrics
whose definition is bench_serving's for a benchmark of one run (metrics.py): its
``output_throughput`` is Σ output tokens / duration (tok/s), its ``mean_ttft_ms`` and
``mean_tpot_ms`` the means over the run's requests, its ``median_itl_ms`` and ``p99_itl_ms``
percentiles over the run's inter-token gaps, in milliseconds. Its ``accept_length`` is the
server's cumulative ``avg_spec_accept_length`` (tokens per verify step, bonus included); ours is
the same quantity over the run's own requests only (warm-up and earlier runs left out).
``decode_tok_s`` and ``spec_accept_length`` have no bench_serving counterpart."""


def bench_serving_block(result: SpecdecodeResult) -> dict[str, Any]:
    """The test's figures under SGLang ``bench_serving``'s names and units: ``per_run`` (each
    run's value, as bench_serving would report a benchmark of that run alone) and ``mean``
    (over the runs), plus ``completed`` (requests per run: every request of a measured run
    completed, or the run failed) when the workload is known."""
    per_run: dict[str, list[float]] = {}
    for metric, (name, scale) in BENCH_SERVING_NAMES.items():
        values = result.samples.get(metric)
        if values:
            per_run[name] = [value * scale for value in values]
    block: dict[str, Any] = {
        "per_run": per_run,
        "mean": {name: sum(values) / len(values) for name, values in per_run.items()},
    }
    workload = result.provenance.get("workload")
    requests = workload.get("requests_per_run") if isinstance(workload, Mapping) else None
    if isinstance(requests, int) and result.runs:
        block["completed"] = requests
    return block


DERIVED_KEYS = ("runs", "summary", "bench_serving")
"""The keys :func:`report_entry` adds to ``SpecdecodeResult.to_json()`` (computed from it)."""


def report_entry(result: SpecdecodeResult) -> dict[str, Any]:
    """One test of the report: ``SpecdecodeResult.to_json()`` plus ``runs``, ``summary`` and
    ``bench_serving`` (the same figures under SGLang bench_serving's names and units)."""
    entry = result.to_json()
    # Only these two carry configuration text; blanket redaction would hide "hardware_key".
    entry["fingerprint"] = redact_json(entry["fingerprint"])
    entry["provenance"] = redact_json(entry["provenance"])
    entry["runs"] = result.runs
    entry["summary"] = {
        name: metric_summary(values) for name, values in result.samples.items() if values
    }
    entry["bench_serving"] = bench_serving_block(result)
    return entry


def build_report(
    results: Sequence[SpecdecodeResult], *, session_info: Mapping[str, Any]
) -> dict[str, Any]:
    """The JSON report of one session (layout: ``docs/reports.md``, ``report.schema.json``)."""
    report = {
        "schema_version": REPORT_SCHEMA_VERSION,
        "kind": REPORT_KIND,
        "generator": f"pytest-specdecode {__version__}",
        "session": normalized_session(session_info, results),
        "simulated": any(r.simulated for r in results),
        "counts": outcome_counts(results),
        "metrics": metrics_registry(),
        "tests": [report_entry(r) for r in results],
    }
    cleaned: dict[str, Any] = finite_json(report)
    return cleaned


def write_report(path: Path, report: Mapping[str, Any]) -> None:
    """Write ``report`` as indented JSON, atomically (temporary file, then ``os.replace``)."""
    try:
        text = json.dumps(finite_json(report), indent=2, allow_nan=False) + "\n"
    except (TypeError, ValueError) as exc:
        raise ValueError(f"the report for {path} is not JSON data: {exc}") from exc
    atomic_write_text(Path(path), text)


# --------------------------------------------------------------------------- JUnit


def _number(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, int | float) and not isinstance(value, bool) else ""


def _interval(low: Any, high: Any) -> str:
    if low is None or high is None:
        return ""
    return f"[{_number(low)}, {_number(high)}]"


def _property_part(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "unnamed"


def check_key(check: Mapping[str, Any]) -> str:
    """``tok_s`` for a check against the test's own baseline, ``tok_s_vs_nospec-nccl`` for
    one against another profile's baseline."""
    metric = str(check.get("metric"))
    reference = check.get("reference")
    return metric if reference is None else f"{metric}_vs_{_property_part(str(reference))}"


def junit_properties(result: SpecdecodeResult) -> list[tuple[str, str]]:
    """Name/value pairs for ``record_property``: profile, outcome, simulated, runs, the error
    (type, phase and cause) of a test that errored, per metric
    the mean and its 95% CI (base units: tok/s, tokens/step, seconds), and per check its ratio,
    CI of the ratio, margin and verdict (``not compared`` plus the problem when there was no
    comparison)."""
    props: list[tuple[str, str]] = [
        ("specdecode_profile", result.profile),
        ("specdecode_outcome", result.outcome.value),
        ("specdecode_simulated", "true" if result.simulated else "false"),
        ("specdecode_runs", str(result.runs)),
        ("specdecode_hardware_key", result.hardware_key),
        *([("specdecode_host", result.host)] if result.host else []),
        ("specdecode_fingerprint", result.fingerprint.digest),
    ]
    if result.error is not None:
        props.append(("specdecode_error", result.error.describe()))
    for name in METRICS:
        values = result.samples.get(name)
        if not values:
            continue
        summary = metric_summary(values)
        props.append((f"specdecode_{name}_mean", _number(summary["mean"])))
        props.append(
            (f"specdecode_{name}_ci", _interval(summary["ci95_low"], summary["ci95_high"]))
        )
    for check in result.checks:
        prefix = f"specdecode_check_{check_key(check)}"
        props.append((f"{prefix}_margin", f"{check.get('margin', 0.0):+g}"))
        if check.get("ratio") is None:
            props.append((f"{prefix}_verdict", "not compared"))
            props.append((f"{prefix}_problem", str(check.get("problem") or "")))
            continue
        props.append((f"{prefix}_ratio", _number(check["ratio"])))
        props.append((f"{prefix}_ci", _interval(check.get("ci_low"), check.get("ci_high"))))
        props.append((f"{prefix}_verdict", str(check.get("verdict"))))
    return props
