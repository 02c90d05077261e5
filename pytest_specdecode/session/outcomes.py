"""How a test ends, in the session's terms: what a verdict asks of the test (fail, skip, xfail,
pass with a warning) under the missing-baseline and inconclusive policies, and the ERROR row of
a test that failed before it got a verdict. The plugin turns the first into pytest's outcomes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pytest_specdecode.markers import MarkerSpec
from pytest_specdecode.outputs.json_report import junit_properties
from pytest_specdecode.result import Outcome, SpecdecodeResult, TestError
from pytest_specdecode.settings import Settings

if TYPE_CHECKING:
    from pytest_specdecode.session.collection import Planned
    from pytest_specdecode.session.orchestrator import SpecdecodeSession, SpecdecodeTest

Action = Literal["fail", "skip", "xfail", "warn", "pass"]
"""What a measured test becomes: ``warn`` passes with a warning (an inconclusive verdict passed
by policy); ``skip`` is reported at the test's location."""


def verdict_action(
    result: SpecdecodeResult, spec: MarkerSpec, settings: Settings
) -> tuple[Action, str]:
    """The action ``result``'s outcome asks for (the marker's policy before the settings'),
    and its text."""
    outcome = result.outcome
    text = f"{result.profile}: {result.message}"
    if outcome in (Outcome.FAIL, Outcome.MISMATCH):
        return "fail", text
    if outcome is Outcome.NO_BASELINE:
        policy = spec.on_missing_baseline or settings.on_missing_baseline
        return ("fail" if policy == "fail" else "skip"), text
    if outcome is Outcome.INCONCLUSIVE:
        policy = spec.on_inconclusive or settings.on_inconclusive
        if policy == "fail":
            return "fail", text
        if policy == "xfail":
            return "xfail", text
        return "warn", text
    return "pass", text


def record_error(
    session: SpecdecodeSession, test_id: str, spec: MarkerSpec, error: TestError
) -> SpecdecodeResult:
    """The ERROR row of a test that failed without a verdict, added to the session's results
    (every report shows it)."""
    profile = session.profile(spec.server or "", where=test_id)  # both checked at collection
    workload = session.workload(spec.workload, where=test_id)
    row = SpecdecodeResult.errored(
        test_id,
        profile=profile.name,
        simulated=profile.simulated,
        hardware_key=session.hardware_key(profile.simulated, profile),
        workload_name=workload.name,
        workload_hash=workload.content_hash(),
        fingerprint=profile.fingerprint(),
        error=error,
        server_origin="attached" if session.settings.server_host else "launched",
        host=profile.placed_on,
    )
    session.results.append(row)
    return row


def note_error(
    session: SpecdecodeSession,
    planned: Planned,
    test: SpecdecodeTest | None,
    error: TestError,
    *,
    has_row: bool,
) -> tuple[SpecdecodeResult | None, list[tuple[str, str]]]:
    """Why a planned test failed outside its verdict: the ERROR row it becomes (None when it
    has a row already, or a verdict) and the JUnit properties to add to it.

    Judged, then failed (an assertion after ``specdecode.measure()``, a teardown): the verdict
    stays the outcome and the first such error is shown beside it. Otherwise the first error is
    the cause; a teardown failing after it adds nothing."""
    if test is not None and test.result is not None:
        if test.result.error is not None:
            return None, []
        test.result.error = error
        # pytest's JUnit XML reads the teardown report's properties, taken from the item
        return None, [("specdecode_error", error.describe())]
    if has_row:
        return None, []
    row = record_error(session, planned.test_id, planned.spec, error)
    return row, junit_properties(row)
