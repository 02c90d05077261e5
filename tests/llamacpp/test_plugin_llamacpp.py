"""The plugin end to end against the real llama.cpp ``llama-server`` (issue 6).

Each test writes a profile file pointing at the session's generated tiny models (conftest.py)
into a pytester project and runs pytest in a subprocess, as a user would: real server processes,
real speculative decoding on the CPU, real measurements. The configurations, with what they
measured on a 2-core machine (``-t 1 -c 1024 -np 1``; four 64-token requests per run, whose
~260-token prompts take ~70 ms each to evaluate, so tok/s includes a lot of prompt time):

================  ===============================================  ==============  =======
profile           what it runs                                     accept length   tok/s
================  ===============================================  ==============  =======
eagle3-fixed      fixed-output target + EAGLE-3 head, n max 4      4.846 each run  470-510
eagle3-random     the same target, random EAGLE-3 head             1.000 each run  200-210
eagle3-synthetic  fixed pair, --spec-synth-rates 0.9,0.7,0.5,0.3   3.316 each run  425-475
nospec            the same target, no speculation                  -               760-815
================  ===============================================  ==============  =======

The accept lengths are deterministic: greedy decoding of fixed prompts, and llama-server's
synthetic acceptance is seeded by the request's ``seed``, which the adapter derives from the
prompt. 4.846 = 1 + 50/13: per 64-token request, twelve verification steps of 4 accepted drafts
plus the target's token, and a last step with 2. The throughput claims leave wide gaps: the
random head's ratio to the fixed pair is ~0.41 against a required 0.8, and the fixed pair's own
re-check needs only 0.5.

One thread, not two: llama.cpp's thread pool spin-waits, and with ``-t 2`` on two cores one
competing busy process cut the fixed pair from ~1,000 to 5-25 tok/s; with ``-t 1`` it held
~690 of ~720 tok/s (two busy processes: ~420).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from summary_table import summary_table

from .conftest import ENV_BINARY, LlamaServerBinary
from .tinymodels import TinyModels

N_MAX = 4
SYNTH_RATES = (0.9, 0.7, 0.5, 0.3)
RUNS = ("--specdecode-runs", "3", "--specdecode-max-runs", "3")
# A loaded CI box can make five runs vary by more than the default 8 %; the point here is the
# workflow, not the baseline's sharpness.
RECORD = (
    "--update-baselines",
    "--specdecode-baseline-runs",
    "4",
    "--specdecode-max-baseline-cv",
    "1",
)


def profiles(models: TinyModels, binary: str | None = None) -> str:
    """The profile file: four llama.cpp servers on the session's tiny models."""
    binary_line = f'binary = "{binary}"' if binary else ""
    fixed = f'draft_model_path = "{models.fixed_eagle3}", draft_n_max = {N_MAX}'
    random = f'draft_model_path = "{models.eagle3}", draft_n_max = {N_MAX}'
    return f"""
[defaults]
launcher = "llamacpp"
{binary_line}
threads = 1
ctx_size = 1024
parallel = 1
startup_timeout = 60
warmup_requests = 1

[profiles.eagle3-fixed]
description = "fixed-output target and EAGLE-3 head: every draft is accepted"
model_path = "{models.fixed_target}"
speculative = {{ algorithm = "draft-eagle3", {fixed} }}

[profiles.eagle3-random]
description = "the same target with a random EAGLE-3 head: no draft is accepted"
model_path = "{models.fixed_target}"
speculative = {{ algorithm = "draft-eagle3", {random} }}

[profiles.eagle3-synthetic]
description = "the fixed pair with llama-server's synthetic acceptance"
model_path = "{models.fixed_target}"
speculative = {{ algorithm = "draft-eagle3", {fixed} }}
extra_args = ["--spec-synth-rates", "{",".join(map(str, SYNTH_RATES))}"]

[profiles.nospec]
model_path = "{models.fixed_target}"

[workloads.quick]
prompt_set = "mixed"
max_new_tokens = 64
requests_per_run = 4
warmup_requests = 1
"""


@dataclass
class LlamaProject:
    pytester: pytest.Pytester
    models: TinyModels

    @property
    def path(self) -> Path:
        return self.pytester.path

    def tests(self, source: str) -> None:
        self.pytester.makepyfile(test_perf=textwrap.dedent(source))

    def run(self, *args: str) -> pytest.RunResult:
        return self.pytester.runpytest_subprocess(
            "-p", "no:cacheprovider", "-p", "no:randomly", *args, timeout=300
        )

    def report(self, result: pytest.RunResult) -> dict[str, dict[str, Any]]:
        """The tests of the JSON report written by ``--specdecode-report report.json``."""
        data = json.loads((self.path / "report.json").read_text())
        return {test["test_id"].split("::")[-1]: test for test in data["tests"]}

    def servers_left(self) -> list[int]:
        """llama-server processes still running on this session's models."""
        return llama_servers_using(str(self.models.directory))


def llama_servers_using(needle: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"llama-server" in cmdline and needle.encode() in cmdline:
            pids.append(int(entry.name))
    return pids


@pytest.fixture
def project(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    llama_server_binary: LlamaServerBinary,
    tiny_models: TinyModels,
) -> Iterator[LlamaProject]:
    monkeypatch.setenv("PYTEST_SPECDECODE_STATE_DIR", str(pytester.path / "state"))
    monkeypatch.setenv(ENV_BINARY, str(llama_server_binary.path))
    pytester.makeini(
        """
        [pytest]
        specdecode_config = specdecode.toml
        specdecode_baselines = baselines
        """
    )
    (pytester.path / "specdecode.toml").write_text(profiles(tiny_models))
    proj = LlamaProject(pytester, tiny_models)
    yield proj
    for pid in proj.servers_left():  # a failing test must not leak servers into the next
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


MEASURE_ALL = """
import pytest

@pytest.mark.specdecode("eagle3-fixed", workload="quick")
def test_fixed(): pass

@pytest.mark.specdecode("eagle3-random", workload="quick")
def test_random(): pass

@pytest.mark.specdecode("eagle3-synthetic", workload="quick")
def test_synthetic(): pass

@pytest.mark.specdecode("nospec", workload="quick")
def test_nospec(): pass
"""


def test_real_speculation_gives_the_accept_lengths_it_should(project: LlamaProject) -> None:
    project.tests(MEASURE_ALL)
    result = project.run(*RUNS, "--specdecode-report", "report.json")
    result.assert_outcomes(passed=4)
    tests = project.report(result)
    for test in tests.values():
        assert test["outcome"] == "measured"
        assert test["simulated"] is False
        assert test["hardware_key"] == "cpu"
        assert test["fingerprint"]["hard"]["launcher_class"] == "llamacpp"
        assert test["provenance"]["server"] == "llamacpp"
        assert re.fullmatch(r"b\d+-[0-9a-f]+", test["server_version"])
        assert len(test["samples"]["tok_s"]) == 3
        assert test["warnings"] == []

    # The 100 %-acceptance EAGLE-3 pair: n_max + 1 tokens per verification step, except for
    # the last, shorter step of each 64-token request (1 + 50/13 = 4.846).
    fixed = tests["test_fixed"]["samples"]["accept_length"]
    assert all(N_MAX + 1 - 0.2 <= value <= N_MAX + 1 for value in fixed), fixed
    # The random head: nothing accepted, one token per step.
    random = tests["test_random"]["samples"]["accept_length"]
    assert all(1.0 <= value <= 1.05 for value in random), random
    # Synthetic acceptance: 1 + the sum of the per-position rates.
    synthetic = tests["test_synthetic"]["samples"]["accept_length"]
    configured = 1 + sum(SYNTH_RATES)
    assert all(abs(value - configured) <= 0.3 for value in synthetic), (synthetic, configured)
    assert "accept_length" not in tests["test_nospec"]["samples"]

    rows = summary_table(result)
    assert rows["test_fixed"]["accept len"] == f"{sum(fixed) / len(fixed):.2f}"
    assert rows["test_nospec"]["accept len"] == "-"
    assert "SIMULATED" not in result.stdout.str()
    servers = next(line for line in result.outlines if line.startswith("servers: "))
    for name in ("eagle3-fixed", "eagle3-random", "eagle3-synthetic", "nospec"):
        assert f"{name} launched 1, reused 0, stopped 1" in servers
    assert project.servers_left() == []


def test_the_spec_type_decides_the_marker(project: LlamaProject) -> None:
    project.tests(MEASURE_ALL)
    eagle3 = project.run("--collect-only", "-q", "-m", "eagle3")
    eagle3.stdout.fnmatch_lines(["*3/4 tests collected (1 deselected)*"])
    nospec = project.run("--collect-only", "-q", "-m", "nospec")
    nospec.stdout.fnmatch_lines(["test_perf.py::test_nospec", "*1/4 tests collected*"])


JOURNEY = """
import pytest

@pytest.mark.specdecode("eagle3-fixed", workload="quick", tok_s=-0.5, accept_length=-0.02)
def test_fixed_holds_its_baseline(): pass

@pytest.mark.specdecode(
    "eagle3-random", workload="quick",
    against={"eagle3-fixed": {"tok_s": -0.1, "accept_length": -0.2}},
)
def test_random_head_against_the_fixed_pair(): pass
"""


def test_a_recorded_baseline_passes_and_a_slower_configuration_fails_against_it(
    project: LlamaProject, llama_server_binary: LlamaServerBinary, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The binary from the profile this time, not from the environment.
    monkeypatch.delenv(ENV_BINARY)
    (project.path / "specdecode.toml").write_text(
        profiles(project.models, binary=str(llama_server_binary.path))
    )
    project.tests(JOURNEY)
    # One launch, so that the counts below are one launch's; a real server's default is three
    # launches per baseline (the launch journey is tests/e2e/test_launches_e2e.py's).
    recorded = project.run(*RECORD, "--specdecode-baseline-launches", "1", "-k", "holds")
    recorded.assert_outcomes(passed=1, deselected=1)
    baseline_file = (
        project.path / "baselines" / "cpu" / "test_perf" / ("test_fixed_holds_its_baseline.json")
    )
    baseline = json.loads(baseline_file.read_text())
    fingerprint = baseline["fingerprint"]
    digest = hashlib.sha256(project.models.fixed_target.read_bytes()).hexdigest()
    assert fingerprint["hard"]["model_sha256"] == digest
    assert fingerprint["hard"]["speculative_type"] == "draft-eagle3"
    assert fingerprint["hard"]["speculative_draft_n_max"] == N_MAX
    assert fingerprint["hard"]["threads"] == 1
    assert fingerprint["soft"]["binary"] == str(llama_server_binary.path)
    commit = re.search(r"commit ([0-9a-f]+)", llama_server_binary.version)
    assert commit is not None
    assert commit.group(1) in fingerprint["soft"]["llamacpp_build"]
    assert fingerprint["soft"]["server_version"].endswith(commit.group(1))
    assert len(baseline["samples"]["accept_length"]) == 4

    checked = project.run(*RUNS)
    checked.assert_outcomes(passed=1, failed=1)
    rows = summary_table(checked)
    assert rows["test_fixed_holds_its_baseline"]["verdict"] == "PASS"
    assert rows["test_random_head_against_the_fixed_pair"]["verdict"].startswith("FAIL")
    text = checked.stdout.str()
    # The FAIL is the accept length's, exact on any machine: 1 token a step against 4.846.
    # The tok/s check is judged too, and how far below its margin it lands depends on what
    # shares the CPU while each side is measured: below 0.5 of the baseline on one worker, 0.504
    # and 0.671 beside two other llama.cpp tests on two machines of the CI kind, 0.727 and 0.765
    # on a third, where the baseline had been recorded while more shared the CPU (the fixed pair
    # then measured +44-52% over its own baseline, minutes later). There the interval cleared
    # the margin but not the no-change guard, which a FAIL also needs: INCONCLUSIVE, reported
    # beside the FAIL it does not change. Either way the tok/s claim must not PASS, and the
    # random head must measure below the margin.
    full = re.search(
        r"eagle3-random: output tok/s vs eagle3-fixed's baseline: FAIL\. Baseline ([\d.]+) "
        r"tok/s \(n=4, CV [\d.]+%\), current ([\d.]+) tok/s \(n=3, CV [\d.]+%\); ratio "
        # a real engine's launches vary: with a one-launch baseline the interval carries the
        # stated launch-variance prior ("over 1 baseline launch (launch-to-launch CV 6.0% ...)")
        r"(0\.\d+) with one-sided [\d.]+% bounds \[[\d.]+, ([\d.]+)\](?: over [^;]*)?; margin "
        r"-10\.0% \(no worse than 0\.900 required\)",
        text,
    )
    brief = re.search(
        r"output tok/s vs eagle3-fixed's baseline: INCONCLUSIVE as well \(ratio (0\.\d+), "
        r"one-sided [\d.]+% bounds \[[\d.]+, ([\d.]+)\], no worse than 0\.900 required, n=3"
        # the no-change guard's reason, where it held back the FAIL (the usual cause here)
        r"(?:; not distinguishable from no change at [\d.]+%: upper bound [\d.]+)?\); "
        r"it does not change the FAIL above\.",
        text,
    )
    assert (full is None) != (brief is None), text
    if full is not None:
        baseline_tok_s, current_tok_s, ratio, upper = map(float, full.groups())
        assert current_tok_s < baseline_tok_s
        assert ratio < upper < 0.9
    else:
        assert brief is not None
        ratio, upper = map(float, brief.groups())
        assert ratio < upper
        assert ratio < 0.9
    assert re.search(
        r"accept length vs eagle3-fixed's baseline: FAIL\. Baseline 4\.846 tokens/step "
        r"\(n=4, CV 0\.0%\), current 1 tokens/step \(n=3, CV 0\.0%\); ratio 0\.20\d",
        text,
    ), text
    assert project.servers_left() == []


KILLED = """
import os, signal, threading, time
import pytest

def kill_after(server, finished):
    \"\"\"SIGKILL the server once its log shows `finished` completed requests.\"\"\"
    def watch():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if server.log_path.read_text(errors="replace").count("stop processing") >= finished:
                os.killpg(server.identity["pid"], signal.SIGKILL)
                return
            time.sleep(0.005)
    threading.Thread(target=watch, daemon=True).start()

@pytest.mark.specdecode("eagle3-random", workload="quick", tok_s=-0.5)
def test_killed(specdecode_server):
    # the server's warm-up request, the workload's, then the first request of run 1: the kill
    # lands just after the server logged that request done, which may be before the client read
    # its last bytes (then request 1 is the one cut short) or after (then request 2)
    kill_after(specdecode_server, 3)

@pytest.mark.specdecode("eagle3-random", workload="quick", tok_s=-0.5)
def test_after(): pass
"""


def test_a_server_killed_mid_run_is_reported_clearly(project: LlamaProject) -> None:
    project.tests(KILLED)
    result = project.run("--durations=0", "-vv")
    result.assert_outcomes(failed=1, errors=1)
    text = result.stdout.str()
    assert re.search(
        r"server 'eagle3-random' died during run 1 \(exit code -9\); the request failed with: "
        r"workload 'quick', run 1, request [1-4] of 4 \(\w+ prompt\): "
        r"http://127\.0\.0\.1:\d+/v1/completions: ",
        text,
    ), text
    assert re.search(r"server log: \S+/eagle3-random-[\d-]+\.log", text)
    assert re.search(r"last \d+ log lines:", text)
    assert "llama_server: listening on http://127.0.0.1:" in text  # the tail of its log
    # The next test of that server fails at once with the same error, without a relaunch.
    assert "ERROR at setup of test_after" in text
    assert "eagle3-random launched 1, reused 0, stopped 0, failed 1" in text
    setups = re.findall(r"^([\d.]+)s setup\s+test_perf\.py::(\w+)$", text, re.M)
    assert {test: float(seconds) for seconds, test in setups}["test_after"] < 1.0
    assert project.servers_left() == []
