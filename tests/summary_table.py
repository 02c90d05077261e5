"""Reading the plugin's end-of-session table from a pytester run, for the end-to-end tests.

The table is tabulate's "github" layout (``| test | profile | ... |``): the header row, a rule,
then one row per test until the first line that is not a table row.
"""

from __future__ import annotations

import pytest


def summary_table(result: pytest.RunResult) -> dict[str, dict[str, str]]:
    """The end-of-session table, one dict per test (keyed by the table's column names)."""
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if line.startswith("| test "))
    headers = [cell.strip() for cell in lines[start].strip("|").split("|")]
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(headers, cells, strict=True))
    return rows
