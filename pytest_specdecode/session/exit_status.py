"""Which kind of night a session was, for whoever is on call, and the exit status that says it.

pytest's own exit statuses say "a test failed" for a build that got slower and for a server that
never came up alike. With ``--specdecode-exit-status nightly`` (ini ``specdecode_exit_status``,
``PYTEST_SPECDECODE_EXIT_STATUS``) the session ends with one status per kind of night instead,
in this order of precedence (the first that applies):

======  ============  ======================================================================
status  kind          when
======  ============  ======================================================================
10      regressed     a test FAILed against its baseline (a claim's margin, or the
                      cross-night detector's alarm): wake the engine team
11      broken        the box or the setup: a server did not start, crashed or hung, a
                      baseline is missing, mismatched or could not be recorded, an output
                      could not be written, pytest's own trouble (interrupted, an internal
                      error, no test collected), or a test that failed without a verdict
12      unjudged      nothing could be judged: the tests ran, none FAILed, nothing broke,
                      but no test was judged PASS (all INCONCLUSIVE), or an INCONCLUSIVE one
                      failed the session by its policy
0       ok            every judged test passed (INCONCLUSIVE beside a PASS stays 0 unless its
                      policy fails it), or baselines were recorded
======  ============  ======================================================================

Without the option the session keeps pytest's statuses; the kind is still said, in the
terminal and in the first line of the Markdown summary. docs/nightly-ci.md has the table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pytest_specdecode.result import Outcome, SpecdecodeResult

OK, REGRESSED, BROKEN, UNJUDGED = "ok", "regressed", "broken", "unjudged"
STATUS = {OK: 0, REGRESSED: 10, BROKEN: 11, UNJUDGED: 12}
"""The exit status of each kind of night (``--specdecode-exit-status nightly``)."""

_PRECEDENCE = (REGRESSED, BROKEN, UNJUDGED, OK)
_TITLE = {
    REGRESSED: "REGRESSED: the build regressed",
    BROKEN: "BROKEN: the box or the setup is broken",
    UNJUDGED: "NOT JUDGED: nothing could be judged",
    OK: "OK: nothing regressed",
}
_PYTEST_TROUBLE = {
    2: "the session was interrupted (Ctrl-C, or SIGTERM from a scheduler whose time ran out)",
    3: "an internal error (a plugin or pytest itself raised)",
    4: "a usage error (a bad option or setting)",
    5: "no test was collected or selected (check the suite's path and -m)",
}
_BROKEN_OUTCOMES = {
    Outcome.ERROR: "errored or crashed",
    Outcome.NO_BASELINE: "had no baseline",
    Outcome.MISMATCH: "had a baseline of another configuration",
}


@dataclass(frozen=True)
class Night:
    """The kind of night, why, and pytest's status it was judged with."""

    kind: str
    reasons: tuple[str, ...]
    pytest_status: int
    nightly: bool
    """``--specdecode-exit-status nightly``: the session ends with :attr:`status`."""

    @property
    def status(self) -> int:
        """The exit status the session ends with: the kind's, or pytest's own."""
        return STATUS[self.kind] if self.nightly else self.pytest_status

    def title(self) -> str:
        """The kind, and the exit status when it is the kind's."""
        status = f" (exit status {self.status})" if self.nightly else ""
        return f"{_TITLE[self.kind]}{status}"

    def why(self) -> str:
        return "; ".join(self.reasons)

    def headline(self) -> str:
        """One line: the kind, the status when it is the kind's, and why."""
        return f"{self.title()}: {self.why()}" if self.reasons else self.title()

    def after(self, pytest_status: int) -> Night:
        """The night once pytest's status changed after it was judged (another plugin's
        ``pytest_sessionfinish`` raised, or a Ctrl-C): pytest's own trouble breaks a night
        that had not regressed."""
        if pytest_status == self.pytest_status:
            return self
        trouble = _PYTEST_TROUBLE.get(pytest_status)
        kind = self.kind if self.kind == REGRESSED or trouble is None else BROKEN
        reasons = (*self.reasons, trouble) if trouble else self.reasons
        return Night(kind, reasons, pytest_status, self.nightly)


def _names(results: Sequence[SpecdecodeResult]) -> str:
    shown = [r.test_id.rpartition("::")[2] for r in results[:3]]
    more = f" and {len(results) - 3} more" if len(results) > 3 else ""
    return ", ".join(shown) + more


def _count(n: int, what: str) -> str:
    return f"{n} test{'s' if n != 1 else ''} {what}"


def _alarmed(result: SpecdecodeResult) -> bool:
    return any(
        isinstance(state, Mapping) and bool(state.get("alarm"))
        for state in result.crossnight.values()
    )


def judge(
    results: Sequence[SpecdecodeResult],
    *,
    pytest_status: int,
    problems: Sequence[str] = (),
    nightly: bool = False,
) -> Night:
    """The kind of night of a session: its results, pytest's exit status so far, and the
    problems the plugin found beside the tests (a baseline or an output not written)."""
    found: dict[str, list[str]] = {kind: [] for kind in _PRECEDENCE}
    failed = [r for r in results if r.outcome is Outcome.FAIL]
    if failed:
        alarms = sum(1 for r in failed if _alarmed(r))
        across = f", {alarms} on the cross-night alarm" if alarms else ""
        found[REGRESSED].append(f"{_count(len(failed), 'FAILed')}{across} ({_names(failed)})")
    for outcome, what in _BROKEN_OUTCOMES.items():
        these = [r for r in results if r.outcome is outcome]
        if these:
            found[BROKEN].append(f"{_count(len(these), what)} ({_names(these)})")
    late = [r for r in results if r.late_failure or (r.error and r.outcome is not Outcome.ERROR)]
    if late:
        found[BROKEN].append(f"{_count(len(late), 'failed after their verdict')} ({_names(late)})")
    if problems:
        found[BROKEN].append(f"{len(problems)} output(s) or baseline(s) not written")
    if pytest_status in _PYTEST_TROUBLE:
        found[BROKEN].append(_PYTEST_TROUBLE[pytest_status])
    inconclusive = [r for r in results if r.outcome is Outcome.INCONCLUSIVE]
    passed = [r for r in results if r.outcome is Outcome.PASS]
    if inconclusive and (not passed or pytest_status == 1):
        found[UNJUDGED].append(f"{_count(len(inconclusive), 'INCONCLUSIVE')}")
    if pytest_status == 1 and not any(found.values()):
        found[BROKEN].append("a test failed without a verdict of pytest-specdecode (see above)")
    kind = next((k for k in _PRECEDENCE if found[k]), OK)
    if kind == OK:
        counts = [
            f"{n} {outcome.value}"
            for outcome in Outcome
            if (n := sum(1 for r in results if r.outcome is outcome))
        ]
        found[OK].append(", ".join(counts) if counts else "no pytest-specdecode test ran")
    # the kind's own reasons first, then the others the night also had
    reasons = [*found[kind], *(r for k in _PRECEDENCE if k not in (kind, OK) for r in found[k])]
    return Night(kind, tuple(reasons), pytest_status, nightly)
