"""What one measured test produced: its samples, checks, outcome and provenance.

A :class:`SpecdecodeResult` is the contract between measuring (``session``) and writing down
(``outputs/``): plain data, JSON-serialisable, so xdist workers can send it to the controller and
the report writers never need the server pool or the HTTP client.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_specdecode.fingerprint import Fingerprint
from pytest_specdecode.verdict import Check, Outcome


@dataclass
class SpecdecodeResult:
    """Everything one measured test produced, JSON-serialisable (xdist workers send it up)."""

    test_id: str
    profile: str
    simulated: bool
    hardware_key: str
    workload_name: str
    workload_hash: str
    fingerprint: Fingerprint
    samples: dict[str, list[float]]
    outcome: Outcome
    message: str
    checks: list[dict[str, Any]] = field(default_factory=list)
    server_origin: str = "launched"
    server_version: str | None = None
    warnings: list[str] = field(default_factory=list)
    provenance: dict[str, Any] = field(default_factory=dict)
    launch_runs: list[int] = field(default_factory=list)
    """Runs per server launch (several only for a baseline recorded over several launches)."""

    @property
    def runs(self) -> int:
        return len(self.samples.get("tok_s", []))

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["fingerprint"] = self.fingerprint.to_json()
        data["outcome"] = self.outcome.value
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SpecdecodeResult:
        values = dict(data)
        values["fingerprint"] = Fingerprint.from_json(values["fingerprint"])
        values["outcome"] = Outcome(values["outcome"])
        return cls(**values)


def check_json(check: Check) -> dict[str, Any]:
    c = check.comparison
    out: dict[str, Any] = {
        "metric": check.threshold.metric,
        "margin": check.threshold.margin,
        "reference": check.threshold.reference,
        "baseline_path": check.ref.path,
        "problem": check.problem,
        "verdict": c.verdict.value if c else None,
    }
    if c is not None:
        out.update(
            ratio=c.ratio,
            ci_low=c.ci_low,
            ci_high=c.ci_high,
            p_pass=c.p_pass,
            p_fail=c.p_fail,
            mde=c.mde,
            method=c.method,
            alpha=c.alpha,
            n_current=c.current.n,
            n_baseline=c.baseline.n,
            baseline_mean=c.baseline.mean,
            baseline_std=c.baseline.std,
            current_mean=c.current.mean,
            launches=c.launches,
            launch_cv=c.launch_cv,
            history_nights=c.history_nights,
            df=c.df,
            alpha_no_change=c.alpha_no_change,
            warnings=list(c.warnings),
        )
    return out
