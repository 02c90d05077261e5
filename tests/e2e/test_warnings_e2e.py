"""Warnings as a user sees them (#25 item 6): a misspelled ``PYTEST_SPECDECODE_*`` variable is
named with the closest known one instead of being ignored without a word, and one ineffective
line of the profile file is one warning with a count, not one per profile and target."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tests.e2e.conftest import DEFAULT_PROFILES

if TYPE_CHECKING:
    from conftest import Project

ONE_TEST = """
import pytest

@pytest.mark.specdecode("nospec", workload="fast")
def test_nospec():
    pass
"""


def test_a_misspelled_variable_warns_with_the_closest_name_and_is_not_applied(
    project: Project,
) -> None:
    project.tests(ONE_TEST)
    result = project.run_with_env({"PYTEST_SPECDECODE_RUN": "3"}, "-rA")

    out = result.stdout.str()
    warning = (
        "environment variable PYTEST_SPECDECODE_RUN is not a pytest-specdecode setting and is "
        "ignored; did you mean PYTEST_SPECDECODE_RUNS?"
    )
    assert f"specdecode: warning: {warning}" in out  # in the header, before anything runs
    assert f"\nwarning: {warning}" in out  # and again in the summary at the end
    assert out.count(warning) == 2
    row = next(line for line in out.splitlines() if line.startswith("| test_nospec "))
    assert row.split("|")[6].strip() == "5"  # the default number of runs, not the 3 it meant


def test_one_ineffective_env_line_is_one_warning_with_a_count(project: Project) -> None:
    ineffective = 'NCCL_NTHREADS = "512"\nCUDA_DEVICE_MAX_CONNECTIONS = "1"'
    text = DEFAULT_PROFILES.replace('NCCL_NTHREADS = "512"', ineffective)
    project.profiles(text + '\n[targets.other]\nlauncher = "sim"\nstartup_timeout = 20\n')
    project.tests(ONE_TEST)

    result = project.run("--collect-only")

    out = result.stdout.str()
    lines = [line for line in out.splitlines() if "CUDA_DEVICE_MAX_CONNECTIONS" in line]
    # Two profiles, each in the default target and [targets.other]: once in the header and once
    # in the summary, each time with the count, at the [env.nccl_tuned] line that set it.
    assert len(lines) == 2, out
    header, summary = lines
    assert header.startswith("specdecode: warning: ")
    assert summary.startswith("warning: ")
    for line in lines:
        assert "specdecode.toml [env.nccl_tuned]: CUDA_DEVICE_MAX_CONNECTIONS = '1' has no" in line
        assert line.endswith("(4 times)")
