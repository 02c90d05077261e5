"""Human-readable output: the end-of-session table in the shape of the seed's summary.

    | Config | tok/s (avg) | vs baseline |      (the seed)

becomes one row per measured test: test and profile, tok/s mean with its 95% CI, the change
against the test's own baseline with the CI of the ratio, accept length, and the verdict.
Simulated figures are labelled in the title and on every row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from scipy import stats as scipy_stats
from tabulate import tabulate

from pytest_specdecode.session import TestResult
from pytest_specdecode.verdict import Outcome

SIMULATED_BANNER = (
    "SIMULATED: these figures come from pytest-specdecode's simulated SGLang server, "
    "not from hardware"
)


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float | None]:
    """Mean and the half-width of its t confidence interval (None for a single run)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(scipy_stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    return mean, half


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


def _tok_s(result: TestResult) -> str:
    values = result.samples.get("tok_s")
    if not values:
        return "-"
    mean, half = mean_ci(values)
    return f"{mean:.1f}" if half is None else f"{mean:.1f} ± {half:.1f}"


def _change(result: TestResult) -> str:
    for check in result.checks:
        if check["metric"] == "tok_s" and check["reference"] is None and "ratio" in check:
            ratio, low, high = check["ratio"], check["ci_low"], check["ci_high"]
            return f"{ratio - 1:+.1%} [{low - 1:+.1%}, {high - 1:+.1%}]"
    return "-"


def _accept(result: TestResult) -> str:
    values = result.samples.get("accept_length")
    if not values:
        return "-"
    return f"{sum(values) / len(values):.2f}"


def _verdict(result: TestResult) -> str:
    text = result.outcome.value.upper()
    against = [c for c in result.checks if c["reference"] is not None and c.get("verdict")]
    for check in against:
        text += f"; vs {check['reference']} {check['ratio'] - 1:+.1%} {check['verdict'].upper()}"
    return text


def table_rows(results: Sequence[TestResult]) -> list[list[str]]:
    """The table's cells, one row per result, columns :data:`TABLE_HEADERS`; shared by the
    terminal table and the Markdown summary so the two never disagree."""
    return [
        [
            short_id(result.test_id),
            result.profile + (" (simulated)" if result.simulated else ""),
            _tok_s(result),
            _change(result),
            _accept(result),
            str(result.runs),
            _verdict(result),
        ]
        for result in results
    ]


def results_table(results: Sequence[TestResult]) -> list[str]:
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


def details(results: Sequence[TestResult]) -> list[str]:
    """The verdict paragraphs of tests that did not simply pass, plus their warnings."""
    lines: list[str] = []
    for result in results:
        notable = result.outcome not in (Outcome.PASS, Outcome.RECORDED, Outcome.MEASURED)
        if notable or result.warnings:
            lines.append(f"{result.test_id} [{result.profile}]: {result.outcome.value.upper()}")
            if notable:
                lines.extend("  " + line for line in result.message.splitlines())
            lines.extend(f"  warning: {w}" for w in result.warnings)
    return lines
