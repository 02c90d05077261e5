"""What one test produced: its samples, checks, outcome and provenance, or why it errored.

A :class:`SpecdecodeResult` is the contract between measuring (``session``) and writing down
(``outputs/``): plain data, JSON-serialisable, so xdist workers can send it to the controller and
the report writers never need the server pool or the HTTP client.

A test that errored or crashed (its server did not start or died, its body raised) is a result
too, with outcome ERROR and no samples (:meth:`SpecdecodeResult.errored`), so that a night whose
servers crashed is a row in every report instead of a gap. A test that was judged and errored
afterwards (its body failed after ``specdecode.measure()``, its teardown raised) keeps its
verdict as the outcome; ``error`` says what else went wrong.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_specdecode.fingerprint import Fingerprint


class Outcome(str, enum.Enum):
    """What one test came to: a verdict, a recording, a measurement only, or an error."""

    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"
    NO_BASELINE = "no baseline"
    MISMATCH = "mismatch"
    RECORDED = "recorded"  # --update-baselines
    MEASURED = "measured"  # no thresholds: measured and reported only
    # Not a verdict: the test errored or crashed (a server that did not start or died, an
    # exception in its body) before one could be reached; the result's ``error`` says why.
    ERROR = "error"


@dataclass(frozen=True)
class TestError:
    """Why a test errored: when pytest saw it, the exception's type, its message's first line
    (the whole message, a server's log tail included, is in pytest's own failure section)."""

    __test__ = False  # not a test class, whatever pytest's collection makes of the name

    phase: str  # "setup" (e.g. the server did not start), "call", "teardown" or "session end"
    type: str  # e.g. "ServerCrashedError", "AssertionError"
    cause: str

    def describe(self) -> str:
        return f"{self.type} in {self.phase}: {self.cause}"

    @classmethod
    def of(cls, phase: str, exc: BaseException) -> TestError:
        text = str(exc).strip()
        return cls(phase=phase, type=type(exc).__name__, cause=text.splitlines()[0] if text else "")


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
    error: TestError | None = None
    """Why the test errored (outcome ERROR), or what went wrong after its verdict; else None."""
    host: str | None = None
    """The ``[hosts.NAME]`` its server ran on (a fleet, :mod:`pytest_specdecode.fleet`); None:
    this machine, or an attached server."""
    crossnight: dict[str, Any] = field(default_factory=dict)
    """The cross-night detector's state of each series after tonight, by metric
    (:mod:`pytest_specdecode.session.cross_night`); empty when the test recorded a baseline."""
    late_failure: str | None = None
    """Why this test fails the session although pytest had already reported it: a later
    baseline launch was refused by the noise guard or failed, or its baseline could not be
    written at the end of the session. The plugin reports it to pytest (an error of the test,
    in the terminal, JUnit XML and the exit status); None when nothing did."""

    @classmethod
    def errored(
        cls,
        test_id: str,
        *,
        profile: str,
        simulated: bool,
        hardware_key: str,
        workload_name: str,
        workload_hash: str,
        fingerprint: Fingerprint,
        error: TestError,
        server_origin: str = "launched",
        host: str | None = None,
    ) -> SpecdecodeResult:
        """The row of a test that errored before it had a verdict: no samples, no checks."""
        return cls(
            test_id=test_id,
            profile=profile,
            simulated=simulated,
            hardware_key=hardware_key,
            workload_name=workload_name,
            workload_hash=workload_hash,
            fingerprint=fingerprint,
            samples={},
            outcome=Outcome.ERROR,
            message=error.describe(),
            server_origin=server_origin,
            error=error,
            host=host,
        )

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
        if values.get("error") is not None:
            values["error"] = TestError(**values["error"])
        return cls(**values)
