"""Writing a suite of one-test-per-profile files and reading pytest's ``--durations`` back, for
the end-to-end tests of failures and hangs."""

from __future__ import annotations

import re

import pytest


def suite_of(*profiles: str) -> str:
    """One test per profile named, in order: ``test_1_<profile>``, ``test_2_<profile>``, ..."""
    lines = ["import pytest", ""]
    for index, profile in enumerate(profiles, 1):
        name = profile.replace("-", "_")
        lines += [
            f'@pytest.mark.specdecode("{profile}", workload="fast")',
            f"def test_{index}_{name}(): pass",
            "",
        ]
    return "\n".join(lines)


def durations(result: pytest.RunResult) -> dict[tuple[str, str], float]:
    """``(test, phase) -> seconds`` from ``--durations=0 -vv``."""
    found = re.findall(
        r"^([\d.]+)s (setup|call|teardown)\s+test_perf\.py::(\w+)$",
        result.stdout.str(),
        re.MULTILINE,
    )
    return {(test, phase): float(seconds) for seconds, phase, test in found}
