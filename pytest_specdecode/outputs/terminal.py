"""Human-readable output: the end-of-session table in the shape of the seed's summary.

    | Config | tok/s (avg) | vs baseline |      (the seed)

becomes one row per measured test: test and profile, tok/s mean with its 95% CI, the change
against the test's own baseline with the CI of the ratio, accept length, and the verdict.
A test that errored or crashed is a row too, ERROR and its cause where the verdict would be.
Simulated figures are labelled in the title and on every row.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from tabulate import tabulate

from pytest_specdecode.result import Outcome, SpecdecodeResult
from pytest_specdecode.stats.samples import describe

SIMULATED_BANNER = (
    "SIMULATED: these figures come from pytest-specdecode's simulated SGLang server, "
    "not from hardware"
)


def mean_ci(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and the half-width of its 95% t interval (None for a single run)."""
    d = describe(values)
    return d.mean, None if d.ci_high is None else d.ci_high - d.mean


TABLE_HEADERS = (
    "test",
    "profile",
    "tok/s (95% CI)",
    "vs baseline",
    "accept len",
    "runs",
    "verdict",
)


def short_id(test_id: str) -> str:
    return test_id.split("::", 1)[-1]


def _tok_s(result: SpecdecodeResult) -> str:
    values = result.samples.get("tok_s")
    if not values:
        return "-"
    mean, half = mean_ci(values)
    return f"{mean:.1f}" if half is None else f"{mean:.1f} ± {half:.1f}"


def _change(result: SpecdecodeResult) -> str:
    for check in result.checks:
        if check["metric"] == "tok_s" and check["reference"] is None and "ratio" in check:
            ratio, low, high = check["ratio"], check["ci_low"], check["ci_high"]
            return f"{ratio - 1:+.1%} [{low - 1:+.1%}, {high - 1:+.1%}]"
    return "-"


def _accept(result: SpecdecodeResult) -> str:
    values = result.samples.get("accept_length")
    if not values:
        return "-"
    return f"{sum(values) / len(values):.2f}"


CAUSE_WIDTH = 80
"""Characters of an error's cause in a table cell; the details below the table have it all."""


def shorten(text: str, width: int = CAUSE_WIDTH) -> str:
    return textwrap.shorten(text, width=width, placeholder="...")


def _verdict(result: SpecdecodeResult) -> str:
    error = result.error
    if result.outcome is Outcome.ERROR and error is not None:
        return "ERROR: " + shorten(error.describe())
    text = result.outcome.value.upper()
    against = [c for c in result.checks if c["reference"] is not None and c.get("verdict")]
    for check in against:
        text += f"; vs {check['reference']} {check['ratio'] - 1:+.1%} {check['verdict'].upper()}"
    if error is not None:
        text += f"; then {error.type} in {error.phase}"
    if result.late_failure and result.outcome is not Outcome.ERROR:
        text += "; fails the session (after the test)"
    return text


def table_rows(results: Sequence[SpecdecodeResult]) -> list[list[str]]:
    """The table's cells, one row per result, columns :data:`TABLE_HEADERS`; shared by the
    terminal table and the Markdown summary so the two never disagree."""
    return [
        [
            short_id(result.test_id),
            result.profile
            + (f" @ {result.host}" if result.host else "")  # the fleet's host it ran on
            + (" (simulated)" if result.simulated else ""),
            _tok_s(result),
            _change(result),
            _accept(result),
            str(result.runs),
            _verdict(result),
        ]
        for result in results
    ]


def results_table(results: Sequence[SpecdecodeResult]) -> list[str]:
    """The summary table as lines (empty when nothing was measured)."""
    if not results:
        return []
    table = tabulate(
        table_rows(results), headers=list(TABLE_HEADERS), tablefmt="github", disable_numparse=True
    )
    lines = table.splitlines()
    if any(r.simulated for r in results):
        lines.insert(0, SIMULATED_BANNER)
    return lines


def details(results: Sequence[SpecdecodeResult]) -> list[str]:
    """The verdict paragraphs of tests that did not simply pass, the cause of each error, plus
    their warnings."""
    lines: list[str] = []
    for result in results:
        notable = result.outcome not in (Outcome.PASS, Outcome.RECORDED, Outcome.MEASURED)
        late_error = result.error if result.outcome is not Outcome.ERROR else None
        if notable or result.warnings or late_error is not None:
            lines.append(f"{result.test_id} [{result.profile}]: {result.outcome.value.upper()}")
            if notable:
                lines.extend("  " + line for line in result.message.splitlines())
            if late_error is not None:
                lines.append(f"  then errored: {late_error.describe()}")
            lines.extend(f"  warning: {w}" for w in result.warnings)
    return lines


def failed_after_tests(results: Sequence[SpecdecodeResult]) -> list[str]:
    """The failures found after their tests had finished (a later baseline launch refused or
    failed, a baseline not written), which fail the session although pytest had passed the
    tests: a heading and one line per test, or nothing."""
    late = [result for result in results if result.late_failure]
    if not late:
        return []
    lines = [
        f"failed after the test had finished ({len(late)}): the session fails, though pytest "
        "had passed the test"
    ]
    lines.extend(f"  {result.test_id} [{result.profile}]: {result.late_failure}" for result in late)
    return lines
