"""Verdicts across server launches, end to end (the two-level model of launches.py).

A simulated server whose speed varies by launch (``--sim-launch-cv``, the H200's situation:
about 5% between launches, 2% between runs) is recorded over several launches, then relaunched
and checked as a nightly run is: an unchanged build must not FAIL, a large regression must, and
every check of a test is decided, not only the first that fails.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

from summary_table import summary_table

if TYPE_CHECKING:
    from conftest import Project

# Launch CV 5% and run CV 2%, fast and seeded per run; each launch draws its own speed factor.
VARYING = """
[defaults]
launcher = "sim"
model_path = "/models/tiny-llm"
startup_timeout = 30
warmup_requests = 1

[profiles.varying]
extra_args = ["--sim-speed", "20", "--sim-load-seconds", "0.2", "--sim-noise-cv", "0.02",
              "--sim-launch-cv", "0.05"]

[profiles.varying-spec]
extra_args = ["--sim-speed", "20", "--sim-load-seconds", "0.2", "--sim-noise-cv", "0.02",
              "--sim-launch-cv", "0.05"]
[profiles.varying-spec.speculative]
algorithm = "EAGLE3"
draft_model_path = "/models/tiny-eagle3"
num_steps = 2
eagle_topk = 1
num_draft_tokens = 3

[workloads.steady]
prompt_set = "mixed"
max_new_tokens = 128
concurrency = 1
requests_per_run = 2
warmup_requests = 1
"""

TESTS = """
import pytest

@pytest.mark.specdecode("varying", workload="steady", tok_s=-0.02)
def test_throughput():
    pass

@pytest.mark.specdecode("varying", workload="steady", tok_s=-0.30)
def test_throughput_loose():
    pass

# Accept length at -5%: two 128-token requests a run draw it with a run CV of about 3.5%, and at
# -2% an unchanged launch FAILed about once in a hundred (seen: 0.966 over 8 runs against 15).
@pytest.mark.specdecode("varying-spec", workload="steady", tok_s=-0.02, accept_length=-0.05)
def test_both():
    pass
"""

RECORD = ("--update-baselines", "--specdecode-baseline-runs", "5")
CHECK = ("--specdecode-runs", "5", "--specdecode-max-runs", "8")


def baseline_json(project: Project, test: str) -> dict[str, object]:
    (path,) = [p for p in project.baseline_files() if p.stem == test]
    data: dict[str, object] = json.loads(path.read_text())
    return data


def test_a_varying_server_is_recorded_over_three_launches_and_judged_across_them(
    project: Project,
) -> None:
    project.profiles(VARYING)
    project.tests(TESTS)
    recorded = project.run(*RECORD)
    recorded.assert_outcomes(passed=3)
    out = recorded.stdout.str()
    # The launch CV makes launches vary, so the default is 3 launches per profile: the first for
    # all of the profile's tests, then two relaunches measuring every one of them again.
    assert out.count("varying: baseline launch 2 of 3") == 1
    assert out.count("varying: baseline launch 3 of 3") == 1
    assert "servers: varying launched 3, reused 0, stopped 3; varying-spec launched 3" in out
    for test in ("test_throughput", "test_throughput_loose", "test_both"):
        record = baseline_json(project, test)
        assert record["launch_runs"] == [5, 5, 5], test
        samples = record["samples"]
        assert isinstance(samples, dict)
        assert len(samples["tok_s"]) == 15
    rows = summary_table(recorded)
    assert {row["runs"] for row in rows.values()} == {"15"}

    # The nightly run: one more launch, unchanged. Its launch is one draw of the launch
    # variation, which the verdict carries, so it does not FAIL.
    checked = project.run(*CHECK, "-rA")  # -rA: the verdict's text also when all PASS
    assert checked.ret in (0, 1), checked.stdout.str()
    rows = summary_table(checked)
    assert not any(row["verdict"].startswith("FAIL") for row in rows.values()), rows
    text = checked.stdout.str()
    assert re.search(
        r"over 3 baseline launches \(launch-to-launch CV \d+\.\d% in the interval\)", text
    ), text
    assert "[two-level]" in text


def test_a_large_regression_fails_every_check_it_breaks(project: Project) -> None:
    # No launch variance here, so one launch per side: a 30% slowdown and a halved acceptance
    # must both be reported, not only the first check that fails.
    project.profiles(re.sub(r',\s*"--sim-launch-cv", "0.05"', "", VARYING))
    project.tests(TESTS)
    project.run(*RECORD).assert_outcomes(passed=3)
    broken = project.run_with_env(
        {"SPECDECODE_SIM_SLOWDOWN": "1.3", "SPECDECODE_SIM_ACCEPT_SCALE": "0.5"}, *CHECK
    )
    broken.assert_outcomes(failed=2, passed=1)
    text = broken.stdout.str()
    section = text[text.index("_ test_both _") :]
    section = section[: section.index("\n_", 10)] if "\n_" in section[10:] else section
    assert "output tok/s vs its own baseline: FAIL" in section
    assert "accept length vs its own baseline: FAIL" in section
    assert summary_table(broken)["test_throughput_loose"]["verdict"] == "PASS"


def test_nights_of_history_give_a_one_launch_baseline_its_launch_variance(
    project: Project,
) -> None:
    # A baseline recorded in one launch cannot know how much launches vary: the verdict says so.
    # Each night written to --specdecode-history is one more launch of the test; from the third
    # night on, the next verdict carries the launch variance those nights show.
    # One test of one profile: five sessions of it (record and four nights) prove the point.
    project.profiles(VARYING)
    project.tests(TESTS[: TESTS.index("@pytest", TESTS.index("def test_throughput():"))])
    project.run(*RECORD, "--specdecode-baseline-launches", "1").assert_outcomes(passed=1)
    history = project.path / "history.jsonl"
    first = project.run(*CHECK, f"--specdecode-history={history}", "-rA")  # -rA: also on PASS
    assert "--specdecode-baseline-launches 3" in first.stdout.str()
    for _ in range(2):
        project.run(*CHECK, f"--specdecode-history={history}")
    assert len(history.read_text().splitlines()) == 3
    fourth = project.run(*CHECK, f"--specdecode-history={history}", "-rA")
    text = fourth.stdout.str()
    assert re.search(
        r"over 1 baseline launch and 3 nights of history \(launch-to-launch CV \d+\.\d% in the "
        r"interval\)",
        text,
    ), text
    assert "--specdecode-baseline-launches 3" not in text
