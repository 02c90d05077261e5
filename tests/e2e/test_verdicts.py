"""Verdicts end to end (issue 4): record, pass, and catch injected regressions.

Every test records baselines with ``--update-baselines`` on quiet simulated servers, then runs
the same suite again with a regression of the *same configuration* injected through the
``SPECDECODE_SIM_*`` environment variables (outside every profile and fingerprint, like a slower
SGLang build), and checks which tests pass, fail or are inconclusive, and what they say.

Effects are large against the noise (a 6% slowdown against a 0.6% run-to-run CV, 30% against a
few %), and the simulated servers are seeded, so the outcomes do not depend on luck.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pytest
from summary_table import summary_table

from tests.e2e.conftest import SLOW_QUIET_PROFILES

if TYPE_CHECKING:
    from conftest import Project

RECORD = ("--update-baselines", "--specdecode-baseline-runs", "8")
CHECK = ("--specdecode-runs", "4", "--specdecode-max-runs", "8")

SUITE = """
import pytest

@pytest.mark.specdecode("nospec", workload="steady", tok_s=-0.10)
def test_nospec_throughput():
    pass

@pytest.mark.specdecode("eagle3", workload="steady", accept_length=-0.10)
def test_eagle3_acceptance():
    pass

@pytest.mark.specdecode("nospec", workload="steady", tok_s=-0.50)
def test_nospec_loose():
    pass

def test_unrelated():
    pass
"""


def failure_text(result: pytest.RunResult, test: str) -> str:
    """The failure section of ``test`` (between its ``____ test ____`` header and the next)."""
    text = result.stdout.str()
    match = re.search(rf"_{{3,}} {test} _{{3,}}\n(.*?)(?=\n_{{3,}} |\n={{3,}} )", text, re.S)
    assert match, f"no failure section for {test}:\n{text}"
    return match.group(1)


def test_record_then_a_clean_pass_with_the_table(quiet_project: Project) -> None:
    quiet_project.tests(SUITE)
    recorded = quiet_project.run(*RECORD)
    recorded.assert_outcomes(passed=4)
    assert len(quiet_project.baseline_files()) == 3
    rows = summary_table(recorded)
    assert {row["verdict"] for row in rows.values()} == {"RECORDED"}
    assert {row["runs"] for row in rows.values()} == {"8"}

    assert "specdecode verdict" not in recorded.stdout.str()  # passes' text only with -rP

    checked = quiet_project.run(*CHECK, "-rP")
    checked.assert_outcomes(passed=4)
    out = checked.stdout.str()
    assert "SIMULATED: these figures come from pytest-specdecode's simulated SGLang server" in out
    assert "baselines updated" not in out
    # -rP shows a passing test's verdict, as pytest shows a passing test's captured output.
    section = out[out.index("Captured specdecode verdict call") :]
    assert re.search(
        r"nospec: output tok/s vs its own baseline: PASS\. Baseline [\d.]+ tok/s \(n=8", section
    ), section
    rows = summary_table(checked)
    assert list(rows) == ["test_nospec_throughput", "test_nospec_loose", "test_eagle3_acceptance"]
    assert list(rows["test_nospec_throughput"]) == [
        "test", "profile", "tok/s (95% CI)", "vs baseline", "accept len", "runs", "verdict",
    ]  # fmt: skip
    nospec = rows["test_nospec_throughput"]
    assert nospec["profile"] == "nospec (simulated)"
    assert re.fullmatch(r"\d+\.\d ± \d+\.\d", nospec["tok/s (95% CI)"])
    assert re.fullmatch(r"[+-]\d+\.\d% \[[+-]\d+\.\d%, [+-]\d+\.\d%\]", nospec["vs baseline"])
    assert nospec["accept len"] == "-"  # no speculation, no accept length
    assert nospec["verdict"] == "PASS"
    eagle3 = rows["test_eagle3_acceptance"]
    assert eagle3["profile"] == "eagle3 (simulated)"
    assert 1.5 < float(eagle3["accept len"]) < 3.0
    assert eagle3["vs baseline"] == "-"  # it makes no tok/s claim against its own baseline
    assert eagle3["verdict"] == "PASS"
    assert quiet_project.sim_processes() == []


@pytest.mark.quiet_machine  # a 10% slowdown measured live: tests/conftest.py says why
def test_a_10_percent_slowdown_fails_exactly_the_affected_test(quiet_project: Project) -> None:
    # "At most 1% slower": a 10% slowdown is then 8-9% beyond the margin, several times the
    # confidence interval's half-width when the baseline runs are at most 4% apart (CV). A
    # noisier baseline is re-recorded (record_quietly): CI once recorded one at CV 4.4% on a
    # shared 2-core box, and a 6% slowdown measured INCONCLUSIVE against it; another at 6.3%,
    # and this 10% one measured INCONCLUSIVE (ratio 0.930, upper bound 1.003): rightly, both.
    quiet_project.tests(SUITE.replace("tok_s=-0.10", "tok_s=-0.01"))
    quiet_project.record_quietly(*RECORD).assert_outcomes(passed=4)

    more = ("--specdecode-runs", "4", "--specdecode-max-runs", "10")
    slow = quiet_project.run_with_env({"SPECDECODE_SIM_SLOWDOWN": "1.10"}, *more)
    # Only the test whose margin the regression exceeds fails; the session goes on.
    slow.assert_outcomes(failed=1, passed=3)
    slow.stdout.fnmatch_lines(["FAILED test_perf.py::test_nospec_throughput - *"])
    rows = summary_table(slow)
    assert rows["test_nospec_throughput"]["verdict"] == "FAIL"
    assert rows["test_nospec_loose"]["verdict"] == "PASS"  # -50% allowed
    assert rows["test_eagle3_acceptance"]["verdict"] == "PASS"  # slower, same acceptance
    # One paragraph: metric, baseline, current, ratio with its bounds, margin, verdict, n, MDE.
    text = failure_text(slow, "test_nospec_throughput")
    paragraph = (
        r"nospec: output tok/s vs its own baseline: FAIL\. "
        r"Baseline (?P<base>\d+(\.\d+)?) tok/s \(n=8, CV \d+\.\d%\), "
        r"current (?P<cur>\d+(\.\d+)?) tok/s \(n=(?P<n>\d+), CV \d+\.\d%\); "
        r"ratio (?P<ratio>0\.\d{3}) with one-sided [\d.]+% bounds "
        r"\[(?P<low>0\.\d{3}), (?P<high>0\.\d{3})\]; "
        r"margin -1\.0% \(no worse than 0\.990 required\); p\(fail\)=[\d.e-]+ \(the chance that "
        r"a build exactly at the margin measures this low; FAIL needs at most [\d.e-]+\), "
        r"MDE \d+\.\d% \[welch-log\]"
    )
    match = re.search(paragraph, text)
    assert match, text
    ratio = float(match["ratio"])
    assert float(match["low"]) <= ratio <= float(match["high"]) < 0.99
    assert ratio == pytest.approx(float(match["cur"]) / float(match["base"]), abs=0.002)
    assert 0.86 < ratio < 0.95  # a 10% slower model, plus a little unchanged HTTP overhead
    assert 4 <= int(match["n"]) <= 10
    assert "Traceback" not in text


def test_lower_acceptance_fails_accept_length_only(quiet_project: Project) -> None:
    quiet_project.tests(SUITE)
    quiet_project.run(*RECORD).assert_outcomes(passed=4)

    broken_draft = quiet_project.run_with_env({"SPECDECODE_SIM_ACCEPT_SCALE": "0.5"}, *CHECK)
    broken_draft.assert_outcomes(failed=1, passed=3)  # the non-speculative tests are unaffected
    rows = summary_table(broken_draft)
    assert rows["test_eagle3_acceptance"]["verdict"] == "FAIL"
    assert float(rows["test_eagle3_acceptance"]["accept len"]) < 1.6
    text = failure_text(broken_draft, "test_eagle3_acceptance")
    match = re.search(
        r"eagle3: accept length vs its own baseline: FAIL\. Baseline (\d\.\d+) tokens/step "
        r"\(n=8, CV [\d.]+%\), current (\d\.\d+) tokens/step .*; ratio (0\.\d+) .*"
        r"margin -10\.0% \(no worse than 0\.900 required\)",
        text,
    )
    assert match, text
    assert float(match[3]) < 0.85
    assert "tok/s" not in text  # the test makes no throughput claim


def test_heavy_noise_is_inconclusive_after_more_runs(quiet_project: Project) -> None:
    quiet_project.tests(
        """
        import pytest

        @pytest.mark.specdecode("nospec", workload="fast", tok_s=-0.10)
        def test_noisy():
            pass
        """
    )
    quiet_project.run(*RECORD).assert_outcomes(passed=1)

    # 60% run-to-run noise: at 30%, a baseline a loaded box had recorded slow let the first
    # look PASS (+15.1% [-9.8%, +47.0%] against -10%; clean-clone CI on 2 workers)
    noisy = quiet_project.run_with_env(
        {"SPECDECODE_SIM_NOISE_CV": "0.6"},
        "--specdecode-runs", "3", "--specdecode-max-runs", "6", "-rx",
    )  # fmt: skip
    noisy.assert_outcomes(xfailed=1)  # the default policy for INCONCLUSIVE
    row = summary_table(noisy)["test_noisy"]
    assert row["verdict"] == "INCONCLUSIVE"
    assert row["runs"] == "6"  # 3 runs, then one more at a time up to the maximum
    out = noisy.stdout.str()
    assert re.search(
        r"XFAIL test_perf\.py::test_noisy - nospec: output tok/s vs its own baseline: "
        r"INCONCLUSIVE\. Baseline .* current .* \(n=6, CV \d+\.\d%\); ratio .* bounds .*; "
        r"margin -10\.0% .*MDE \d+\.\d%",
        out,
    ), out
    assert "this check cannot be decided either way at n=6" in out


# alpha=0.001 makes PASS and FAIL need overwhelming evidence, so with heavy noise and three
# runs every test is inconclusive, whatever the noise draws (the policy is the point here).
POLICY_SUITE = """
import pytest

NOISY = {"workload": "fast", "tok_s": -0.03, "alpha": 0.001}

@pytest.mark.specdecode("nospec", **NOISY)
def test_by_flag():
    pass

@pytest.mark.specdecode("nospec", on_inconclusive="fail", **NOISY)
def test_marker_fail():
    pass

@pytest.mark.specdecode("nospec", on_inconclusive="warn", **NOISY)
def test_marker_warn():
    pass

@pytest.mark.specdecode("nospec", on_inconclusive="xfail", **NOISY)
def test_marker_xfail():
    pass
"""


def test_inconclusive_policies_from_flag_and_marker(quiet_project: Project) -> None:
    quiet_project.tests(POLICY_SUITE)
    # A noisy server, recorded and checked: four runs of the baseline's own spread keep every
    # comparison open. Noise on the checks alone was not enough: on a loaded machine a fast
    # workload's runs are paced by the CPU, not by the simulated step, so one test's three runs
    # measured within 0.9% of each other, 14% under a quiet baseline of eight, and FAILed. (A
    # baseline as noisy as the checks, 20-34%, is refused: --specdecode-max-baseline-cv.)
    recorded = quiet_project.run_with_env(
        {"SPECDECODE_SIM_NOISE_CV": "0.2"}, "--update-baselines", "--specdecode-baseline-runs", "4"
    )
    recorded.assert_outcomes(passed=4)
    noise = {"SPECDECODE_SIM_NOISE_CV": "0.4"}
    few = ("--specdecode-runs", "3", "--specdecode-max-runs", "3")

    default = quiet_project.run_with_env(noise, *few)
    assert {row["verdict"] for row in summary_table(default).values()} == {"INCONCLUSIVE"}
    default.assert_outcomes(xfailed=2, failed=1, passed=1, warnings=1)
    default.stdout.fnmatch_lines(["FAILED test_perf.py::test_marker_fail - *"])
    text = failure_text(default, "test_marker_fail")
    assert text.startswith("nospec: output tok/s vs its own baseline: INCONCLUSIVE."), text
    assert "SpecdecodeWarning: inconclusive, passed by policy: nospec:" in default.stdout.str()

    warn = quiet_project.run_with_env(noise, *few, "--specdecode-on-inconclusive", "warn")
    warn.assert_outcomes(passed=2, failed=1, xfailed=1, warnings=2)

    fail = quiet_project.run_with_env(noise, *few, "--specdecode-on-inconclusive", "fail")
    fail.assert_outcomes(failed=2, passed=1, xfailed=1)
    fail.stdout.fnmatch_lines(["FAILED test_perf.py::test_by_flag - *"])
    assert "vs its own baseline: INCONCLUSIVE." in failure_text(fail, "test_by_flag")


# The seed's story: EAGLE3 2-step with NCCL tuning (94.0 tok/s) against no speculation after the
# NCCL variables were lost (62.9 tok/s). The simulated gap (+45-50%) is far wider than the noise
# of a busy CI box, unlike EAGLE3 against tuned no speculation (+6-9%, the seed's +5.9%).
AGAINST_SUITE = """
import pytest

# It records the baseline the others are judged against; its own check is loose, since a loaded
# worker measured it at a CV of 13% (INCONCLUSIVE at -10%).
@pytest.mark.specdecode("nospec-untuned", workload="steady", tok_s=-0.5)
def test_nospec_untuned():
    pass

@pytest.mark.specdecode(
    "eagle3", workload="steady", against={"nospec-untuned": {"tok_s": +0.25}}
)
def test_eagle3_beats_untuned_by_a_quarter():
    pass

@pytest.mark.specdecode(
    "eagle3", workload="steady", against={"nospec-untuned": {"tok_s": +0.8}}
)
def test_eagle3_beats_untuned_by_80_percent():
    pass
"""


def test_against_another_profiles_baseline(quiet_project: Project) -> None:
    toml = quiet_project.path / "specdecode.toml"
    text = toml.read_text()
    nospec_args = re.search(r'\[profiles\.nospec\]\nenv = "nccl_tuned"\n(extra_args = .*)\n', text)
    assert nospec_args, text
    toml.write_text(f"{text}\n[profiles.nospec-untuned]\n{nospec_args[1]}\n")
    quiet_project.tests(AGAINST_SUITE)
    quiet_project.run(*RECORD).assert_outcomes(passed=3)

    checked = quiet_project.run(*CHECK)
    checked.assert_outcomes(passed=2, failed=1)
    rows = summary_table(checked)
    beats = rows["test_eagle3_beats_untuned_by_a_quarter"]
    match = re.fullmatch(r"PASS; vs nospec-untuned \+(\d+\.\d)% PASS", beats["verdict"])
    assert match, beats
    assert 35.0 < float(match[1]) < 65.0
    assert beats["vs baseline"] == "-"  # no claim against its own baseline
    too_much = rows["test_eagle3_beats_untuned_by_80_percent"]
    assert re.fullmatch(r"FAIL; vs nospec-untuned \+\d+\.\d% FAIL", too_much["verdict"])
    text = failure_text(checked, "test_eagle3_beats_untuned_by_80_percent")
    assert re.search(
        r"eagle3: output tok/s vs nospec-untuned's baseline: FAIL\. Baseline \d+(\.\d+)? tok/s "
        r"\(n=8, CV [\d.]+%\), current .*; ratio 1\.\d{3} .*margin \+80\.0% \(at least 1\.800 "
        r"required\)",
        text,
    ), text


def test_lower_is_better_metrics_flip_the_ratio(quiet_project: Project) -> None:
    # At 5x (SLOW_QUIET_PROFILES): at 20x the "30% faster" run measured 29% SLOWER beside another
    # worker. Every check here is TPOT, the server's schedule: the client's clock moved with the
    # box's load for the others (TTFT 14 ms with a CV of 77% over 8 runs; ITL p50, where a loaded
    # client read tokens in bursts, a baseline CV of 34%: both INCONCLUSIVE in CI). Their flips
    # are unit-tested (tests/unit/test_stats.py). 48 tokens a request, not 128 (72 s at 5x).
    quiet_project.profiles(
        SLOW_QUIET_PROFILES.replace("max_new_tokens = 128", "max_new_tokens = 48")
    )
    quiet_project.tests(
        """
        import pytest

        @pytest.mark.specdecode("nospec", workload="steady", tpot=-0.05)
        def test_tpot_tight():
            pass

        @pytest.mark.specdecode("nospec", workload="steady", tpot=-0.5)
        def test_latency_loose():
            pass

        @pytest.mark.specdecode("nospec", workload="steady", tpot=+0.2)
        def test_tpot_faster():
            pass
        """
    )
    quiet_project.run(*RECORD).assert_outcomes(passed=3)

    # 30% slower: TPOT grows, so baseline/current is about 0.77. Unflipped (current/baseline
    # about 1.3) the tight test would pass and the "faster" test too.
    slower = quiet_project.run_with_env({"SPECDECODE_SIM_SLOWDOWN": "1.3"}, *CHECK)
    slower.assert_outcomes(failed=2, passed=1)
    rows = summary_table(slower)
    assert rows["test_latency_loose"]["verdict"] == "PASS"
    text = failure_text(slower, "test_tpot_tight")
    match = re.search(
        r"TPOT vs its own baseline: FAIL\. Baseline ([\d.]+) ms .*current ([\d.]+) ms .*; "
        r"ratio (0\.\d{3}) .*margin -5\.0% .*lower is better, so the ratio is baseline/current",
        text,
    )
    assert match, text
    assert float(match[2]) > float(match[1])  # TPOT got longer
    assert 0.6 < float(match[3]) < 0.9

    # 30% faster: TPOT shrinks, baseline/current is about 1.4, so "+20% better" holds.
    faster = quiet_project.run_with_env({"SPECDECODE_SIM_SLOWDOWN": "0.7"}, *CHECK)
    faster.assert_outcomes(passed=3)
