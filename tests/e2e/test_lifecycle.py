"""Server lifecycle end to end: launch, reuse and stop counts, ordering, GPU sets, keep-alive
across pytest invocations, xdist, the algorithm markers, and attaching to a running server.

Every run is a real pytest subprocess (the ``project`` fixture) starting real simulated servers.
Counts come from the summary line ``servers: nospec launched 1, reused 0, stopped 1; ...`` and
from the server log files under pytest's basetemp (one per launch).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hand_started import EAGLE3, hand_started_sim

FAST = '["--sim-speed", "50", "--sim-load-seconds", "0.2", "--sim-seed", "1"]'
RUNS = ("--specdecode-runs", "3", "--specdecode-max-runs", "3")

# Three profiles, three algorithms. {gpus} goes into [defaults] ("gpus = [0]" makes every
# server need the same GPU), {eagle3_gpus} into the eagle3 profile.
PROFILES = """
[defaults]
launcher = "sim"
tp_size = 8
model_path = "/models/tiny-llm"
startup_timeout = 30
warmup_requests = 1
{gpus}

[env.nccl_tuned]
NCCL_PROTO = "LL"
NCCL_ALGO = "Ring"
NCCL_BUFFSIZE = "{buffsize}"

[profiles.nospec]
env = "nccl_tuned"
extra_args = {fast}

[profiles.eagle3]
env = "nccl_tuned"
extra_args = {fast}
{eagle3_gpus}
[profiles.eagle3.speculative]
algorithm = "EAGLE3"
draft_model_path = "/models/tiny-eagle3"
num_steps = 2
eagle_topk = 1
num_draft_tokens = 3

[profiles.ngram]
env = "nccl_tuned"
speculative = {{ algorithm = "NGRAM", num_draft_tokens = 8 }}
extra_args = {fast}
[workloads.fast]
prompt_set = "mixed"
max_new_tokens = 64
concurrency = 1
requests_per_run = 2
warmup_requests = 1

[workloads.default]
base = "default"  # replaces the built-in default for the tests that name no workload
prompt_set = "mixed"
max_new_tokens = 64
concurrency = 1
requests_per_run = 2
warmup_requests = 1
"""

# Six tests over three profiles, interleaved in the file.
SIX_TESTS = """
import pytest

@pytest.mark.specdecode("nospec", workload="fast")
def test_1_nospec(): pass

@pytest.mark.specdecode("eagle3", workload="fast")
def test_2_eagle3(): pass

@pytest.mark.specdecode("ngram", workload="fast")
def test_3_ngram(): pass

@pytest.mark.specdecode("nospec", workload="fast")
def test_4_nospec(): pass

@pytest.mark.specdecode("eagle3", workload="fast")
def test_5_eagle3(): pass

@pytest.mark.specdecode("ngram", workload="fast")
def test_6_ngram(): pass
"""

ONE_NOSPEC = """
import pytest

@pytest.mark.specdecode("nospec", workload="fast")
def test_nospec(): pass
"""

ONE_EAGLE3 = """
import pytest

@pytest.mark.specdecode("eagle3", workload="fast")
def test_eagle3(): pass
"""


def profiles(gpus: str = "", buffsize: str = "16777216", eagle3_gpus: str = "") -> str:
    return PROFILES.format(gpus=gpus, buffsize=buffsize, fast=FAST, eagle3_gpus=eagle3_gpus)


def server_counts(result: pytest.RunResult) -> dict[str, dict[str, int]]:
    """The summary line ``servers: a launched 1, reused 0, stopped 1, left running; b ...``."""
    lines = [line for line in result.outlines if line.startswith("servers: ")]
    assert len(lines) == 1, result.stdout.str()
    counts: dict[str, dict[str, int]] = {}
    for part in lines[0][len("servers: ") :].split("; "):
        name, _, rest = part.partition(" ")
        fields = {"launched": 0, "reused": 0, "stopped": 0, "failed": 0, "kept": 0}
        for item in rest.split(", "):
            if item == "left running":
                fields["kept"] = 1
            else:
                key, value = item.rsplit(" ", 1)
                fields[key] = int(value)
        counts[name] = fields
    return counts


def lifecycle_lines(result: pytest.RunResult) -> list[str]:
    """The plugin's ``starting`` / ``reusing`` / ``stopping`` / ``left running`` lines, in order."""
    pattern = re.compile(r"^specdecode: (\S+): (starting|reusing|stopping|left running)")
    out = []
    for line in result.outlines:
        match = pattern.match(line)
        if match:
            out.append(f"{match.group(1)} {match.group(2)}")
    return out


def server_logs(project) -> set[Path]:
    """Every server log of the project's runs so far: one per launch, under each run's basetemp
    (``runpytest-N``, with ``popen-gwN`` below it for xdist workers)."""
    return set(project.path.glob("runpytest-[0-9]*/**/specdecode-logs/*.log"))


def passed_order(result: pytest.RunResult) -> list[str]:
    return re.findall(r"^test_perf\.py::(\w+) PASSED", result.stdout.str(), re.MULTILINE)


def sim_pid(url: str) -> int:
    """The pid of the simulated server started with the port of ``url`` on its command line."""
    port = int(url.rsplit(":", 1)[1])
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"pytest_specdecode.sim" in cmdline and str(port).encode() in cmdline:
            return int(entry.name)
    raise AssertionError(f"no simulated server listens on {url}")


def table_row(result: pytest.RunResult, test: str) -> list[str]:
    """Test, profile, runs and verdict from the summary table's row for ``test``."""
    for line in result.outlines:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if line.startswith("|") and cells[0] == test:
            return [cells[0], cells[1], cells[-2], cells[-1]]
    raise AssertionError(f"no row for {test} in:\n{result.stdout.str()}")


def kept_url(result: pytest.RunResult, profile: str) -> str:
    match = re.search(
        rf"^specdecode: {profile}: left running for the next session at (\S+)$",
        result.stdout.str(),
        re.MULTILINE,
    )
    assert match is not None, result.stdout.str()
    return match.group(1)


# -- launches, reuse, stops and ordering ---------------------------------------------------


def test_each_profile_launches_once_and_its_tests_run_together(project):
    project.profiles(profiles())
    project.tests(SIX_TESTS)
    result = project.run("-v", *RUNS)
    result.assert_outcomes(passed=6)

    # Grouped by profile, in the order each profile first appears; file order within a group.
    assert passed_order(result) == [
        "test_1_nospec",
        "test_4_nospec",
        "test_2_eagle3",
        "test_5_eagle3",
        "test_3_ngram",
        "test_6_ngram",
    ]
    # Each server is started once and stopped after its last test, before the next starts.
    assert lifecycle_lines(result) == [
        "nospec starting",
        "nospec stopping",
        "eagle3 starting",
        "eagle3 stopping",
        "ngram starting",
        "ngram stopping",
    ]
    assert server_counts(result) == {
        name: {"launched": 1, "reused": 0, "stopped": 1, "failed": 0, "kept": 0}
        for name in ("nospec", "eagle3", "ngram")
    }
    assert len(server_logs(project)) == 3
    result.stdout.fnmatch_lines(["*specdecode: nospec: ready after *s"])
    assert project.sim_processes() == []


def test_algorithm_markers_are_registered_and_select_tests(project):
    project.profiles(profiles())
    project.tests(SIX_TESTS)

    markers = project.run("--markers")
    markers.stdout.fnmatch_lines(
        [
            "@pytest.mark.eagle3: tests whose server profile uses eagle3 (added automatically*",
            "@pytest.mark.ngram: tests whose server profile uses ngram*",
            "@pytest.mark.nospec: tests whose server profile uses nospec*",
        ]
    )

    selected = project.run("-v", "--strict-markers", "-m", "eagle3", *RUNS)
    selected.assert_outcomes(passed=2, deselected=4)
    assert passed_order(selected) == ["test_2_eagle3", "test_5_eagle3"]
    # Deselected profiles are never started.
    assert set(server_counts(selected)) == {"eagle3"}
    assert lifecycle_lines(selected) == ["eagle3 starting", "eagle3 stopping"]

    combined = project.run("-v", "--strict-markers", "-m", "nospec or ngram", *RUNS)
    combined.assert_outcomes(passed=4, deselected=2)
    assert set(server_counts(combined)) == {"nospec", "ngram"}


def test_a_fixture_parameter_names_the_server(project):
    project.profiles(profiles())
    project.tests(
        """
        import httpx
        import pytest

        @pytest.mark.parametrize("specdecode_server", ["eagle3", "nospec"], indirect=True)
        def test_server(specdecode_server):
            info = httpx.get(specdecode_server.base_url + "/server_info", timeout=10).json()
            expected = "EAGLE3" if specdecode_server.profile.name == "eagle3" else None
            assert info["speculative_algorithm"] == expected
            assert specdecode_server.origin == "launched"
        """
    )
    result = project.run("-v", *RUNS)
    result.assert_outcomes(passed=2)
    assert set(server_counts(result)) == {"eagle3", "nospec"}
    # The parameter's profile also gets the algorithm marker.
    only = project.run("-v", "-m", "eagle3", *RUNS)
    only.assert_outcomes(passed=1, deselected=1)
    only.stdout.fnmatch_lines(["*test_server?eagle3? PASSED*"])


# -- GPU sets and keep-alive ---------------------------------------------------------------


def test_kept_server_is_reused_by_the_next_session_without_a_second_load(project):
    project.profiles(profiles())
    project.tests(ONE_NOSPEC)

    first = project.run("--specdecode-keep-server", *RUNS)
    first.assert_outcomes(passed=1)
    assert server_counts(first)["nospec"] == {
        "launched": 1,
        "reused": 0,
        "stopped": 0,
        "failed": 0,
        "kept": 1,
    }
    url = kept_url(first, "nospec")
    pid = sim_pid(url)
    assert project.sim_processes() == [pid]  # alive after pytest exited
    logs = server_logs(project)

    second = project.run(*RUNS)
    second.assert_outcomes(passed=1)
    second.stdout.fnmatch_lines([f"specdecode: nospec: reusing the running server at {url}"])
    assert "starting" not in "\n".join(lifecycle_lines(second))
    assert server_counts(second)["nospec"] == {
        "launched": 0,
        "reused": 1,
        "stopped": 1,
        "failed": 0,
        "kept": 0,
    }
    assert server_logs(project) == logs  # nothing was launched, so no new server log
    # The kept server loaded once: one load in its log, and it served both sessions.
    (log,) = logs
    assert log.read_text().count("Load weight begin") == 1
    # Without --specdecode-keep-server the session that adopted it stops it.
    assert project.sim_processes() == []


def test_kept_server_with_another_fingerprint_is_never_reused(project):
    project.profiles(profiles())
    project.tests(ONE_NOSPEC)
    first = project.run("--specdecode-keep-server", *RUNS)
    first.assert_outcomes(passed=1)
    old_pid = sim_pid(kept_url(first, "nospec"))

    # The NCCL tuning changed (the seed's lost NCCL_BUFFSIZE): same profile name, new fingerprint.
    project.profiles(profiles(buffsize="4194304"))
    second = project.run("--specdecode-keep-server", *RUNS)
    second.assert_outcomes(passed=1)
    assert lifecycle_lines(second) == ["nospec starting", "nospec left running"]
    assert server_counts(second)["nospec"]["reused"] == 0
    new_pid = sim_pid(kept_url(second, "nospec"))
    assert new_pid != old_pid
    # The mismatching server needs no GPUs, so nobody had a reason to stop it: both still run.
    assert sorted(project.sim_processes()) == sorted([old_pid, new_pid])


def test_a_later_session_stops_the_kept_server_when_it_needs_its_gpus(project):
    project.profiles(profiles(gpus="gpus = [0]"))
    project.tests(ONE_NOSPEC)
    first = project.run("--specdecode-keep-server", *RUNS)
    first.assert_outcomes(passed=1)
    kept = sim_pid(kept_url(first, "nospec"))

    project.tests(ONE_EAGLE3)
    second = project.run(*RUNS)
    second.assert_outcomes(passed=1)
    # The kept server is stopped before the server that needs the same GPU starts.
    assert lifecycle_lines(second) == ["nospec stopping", "eagle3 starting", "eagle3 stopping"]
    assert "(eagle3 needs GPUs [0])" in second.stdout.str()
    assert server_counts(second) == {
        "nospec": {"launched": 0, "reused": 0, "stopped": 1, "failed": 0, "kept": 0},
        "eagle3": {"launched": 1, "reused": 0, "stopped": 1, "failed": 0, "kept": 0},
    }
    assert kept not in project.sim_processes()
    assert project.sim_processes() == []


def test_a_kept_server_on_other_gpus_is_left_alone(project):
    # nospec on GPU 0, eagle3 on GPU 1: no conflict, so the kept server survives the session.
    project.profiles(profiles(gpus="gpus = [0]", eagle3_gpus="gpus = [1]"))
    project.tests(ONE_NOSPEC)
    first = project.run("--specdecode-keep-server", *RUNS)
    first.assert_outcomes(passed=1)
    kept = sim_pid(kept_url(first, "nospec"))

    project.tests(ONE_EAGLE3)
    second = project.run(*RUNS)
    second.assert_outcomes(passed=1)
    assert lifecycle_lines(second) == ["eagle3 starting", "eagle3 stopping"]
    assert project.sim_processes() == [kept]


def test_one_gpu_set_keeps_one_server_at_a_time(project):
    """Every profile on GPU 0: when one server is up, no other is; each starts once."""
    project.profiles(profiles(gpus="gpus = [0]"))
    project.tests(SIX_TESTS)
    result = project.run("-v", *RUNS)
    result.assert_outcomes(passed=6)
    lines = lifecycle_lines(result)
    running = 0
    for line in lines:
        running += 1 if line.endswith("starting") else -1
        assert running in (0, 1), lines
    assert [line for line in lines if line.endswith("starting")] == [
        "nospec starting",
        "eagle3 starting",
        "ngram starting",
    ]


def test_a_skipped_test_does_not_keep_its_server_from_giving_way(project):
    """A test keeps its server for the next test of the same profile; when that one is skipped,
    the next profile on the same GPU must still get the GPU (and not wait for a lease)."""
    project.profiles(profiles(gpus="gpus = [0]"))
    project.tests(
        """
        import pytest

        @pytest.mark.specdecode("nospec", workload="fast")
        def test_1(): pass

        @pytest.mark.skip(reason="not today")
        @pytest.mark.specdecode("nospec", workload="fast")
        def test_2(): pass

        @pytest.mark.specdecode("eagle3", workload="fast")
        def test_3(): pass
        """
    )
    result = project.run("-v", *RUNS, timeout=60)
    result.assert_outcomes(passed=2, skipped=1)
    assert "waiting" not in result.stdout.str()
    assert lifecycle_lines(result) == [
        "nospec starting",
        "nospec stopping",
        "eagle3 starting",
        "eagle3 stopping",
    ]
    assert project.sim_processes() == []


# -- xdist ---------------------------------------------------------------------------------


def test_xdist_launches_each_server_once(project):
    # All three profiles need GPU 0, so workers must take turns, and a worker between two
    # tests of its profile must not lose its server to a sibling waiting for the GPU.
    project.profiles(profiles(gpus="gpus = [0]"))
    project.tests(SIX_TESTS)
    result = project.run("-n", "3", "-v", *RUNS)
    result.assert_outcomes(passed=6)
    counts = server_counts(result)
    assert set(counts) == {"nospec", "eagle3", "ngram"}
    for name, fields in counts.items():
        assert fields["launched"] == 1, (name, fields)
        assert fields["stopped"] == 1, (name, fields)
    assert len(server_logs(project)) == 3
    # Each profile ran on one worker (loadgroup scheduling), and the test ids in the table are
    # the plain ones (no "@group" suffix), so baselines are the same with and without -n.
    workers: dict[str, set[str]] = {}
    passed = r"\[(gw\d)\].*PASSED test_perf\.py::test_\d_(\w+)"
    for worker, name in re.findall(passed, result.stdout.str()):
        workers.setdefault(name, set()).add(worker)
    assert all(len(w) == 1 for w in workers.values()), workers
    assert table_row(result, "test_1_nospec")[1] == "nospec (simulated)"
    assert not [row for row in result.outlines if row.startswith("|") and "@" in row]
    assert project.sim_processes() == []


def test_xdist_a_worker_keeps_its_server_between_two_of_its_tests(project):
    """A slow setup leaves a gap between two tests; a sibling waiting for the GPU must not
    take it while the worker still has a test for its server (that would mean a second load)."""
    project.profiles(profiles(gpus="gpus = [0]"))
    project.pytester.makeconftest(
        """
        import time

        def pytest_runtest_setup(item):
            time.sleep(1.5)  # before the server is acquired: three polls of a waiting worker
        """
    )
    project.tests(
        """
        import pytest

        @pytest.mark.specdecode("nospec", workload="fast")
        def test_1(): pass

        @pytest.mark.specdecode("eagle3", workload="fast")
        def test_2(): pass

        @pytest.mark.specdecode("nospec", workload="fast")
        def test_3(): pass

        @pytest.mark.specdecode("eagle3", workload="fast")
        def test_4(): pass
        """
    )
    result = project.run("-n", "2", *RUNS)
    result.assert_outcomes(passed=4)
    counts = server_counts(result)
    assert counts["nospec"]["launched"] == 1, counts
    assert counts["eagle3"]["launched"] == 1, counts
    assert project.sim_processes() == []


def test_xdist_keep_server_then_a_plain_session_reuses_it(project):
    project.profiles(profiles())
    project.tests(SIX_TESTS)
    first = project.run("-n", "3", "--specdecode-keep-server", *RUNS)
    first.assert_outcomes(passed=6)
    counts = server_counts(first)
    assert sum(c["launched"] for c in counts.values()) == 3
    kept = [name for name, c in counts.items() if c["kept"]]
    assert len(kept) == 1, counts
    assert sum(c["stopped"] for c in counts.values()) == 2
    assert len(project.sim_processes()) == 1

    project.tests(
        f"""
        import pytest

        @pytest.mark.specdecode("{kept[0]}", workload="fast")
        def test_again(): pass
        """
    )
    second = project.run(*RUNS)
    second.assert_outcomes(passed=1)
    assert server_counts(second)[kept[0]] == {
        "launched": 0,
        "reused": 1,
        "stopped": 1,
        "failed": 0,
        "kept": 0,
    }
    assert project.sim_processes() == []


# -- attaching to a server someone else runs -----------------------------------------------

ATTACH_PROFILES = """
[defaults]
launcher = "sim"
tp_size = 8
model_path = "/models/tiny-llm"
warmup_requests = 1

[env.nccl_tuned]
NCCL_PROTO = "LL"

[profiles.eagle3]
env = "nccl_tuned"
extra_args = ["--disable-custom-all-reduce"]
speculative.algorithm = "EAGLE3"
speculative.draft_model_path = "/models/tiny-eagle3"
speculative.num_steps = 2
speculative.eagle_topk = 1
speculative.num_draft_tokens = 3

[profiles.eagle3-5step]
env = "nccl_tuned"
tp_size = 4
mem_fraction_static = 0.7
extra_args = ["--disable-custom-all-reduce", "--num-continuous-decode-steps", "4"]
speculative.algorithm = "EAGLE3"
speculative.draft_model_path = "/models/other-eagle3"
speculative.num_steps = 5
speculative.eagle_topk = 1
speculative.num_draft_tokens = 6

[workloads.fast]
prompt_set = "mixed"
max_new_tokens = 64
concurrency = 1
requests_per_run = 2
warmup_requests = 1
"""

ATTACH_TESTS = """
import pytest

@pytest.mark.specdecode("{profile}", workload="fast")
def test_attached(): pass
"""


@pytest.fixture(scope="module")
def attached_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A simulated server this test module runs itself (as an operator would), matching the
    ``eagle3`` profile of ATTACH_PROFILES; its ``HOST:PORT``."""
    log = tmp_path_factory.mktemp("attached") / "server.log"
    with hand_started_sim(*EAGLE3, log=log) as (port, _):
        yield f"127.0.0.1:{port}"


def test_attach_refuses_a_mismatching_server_and_lists_every_difference(project, attached_sim):
    project.profiles(ATTACH_PROFILES)
    project.tests(ATTACH_TESTS.format(profile="eagle3-5step"))
    result = project.run("--server-host", attached_sim, *RUNS)
    result.assert_outcomes(failed=1)
    output = result.stdout.str()
    assert "does not run profile 'eagle3-5step'" in output
    for field, wanted, reported in [
        ("tp_size", "4", "8"),
        ("mem_fraction_static", "0.7", None),
        ("speculative_draft_model_path", "'/models/other-eagle3'", "'/models/tiny-eagle3'"),
        ("speculative_num_steps", "5", "2"),
        ("speculative_num_draft_tokens", "6", "3"),
        ("num_continuous_decode_steps", "4", "1"),
    ]:
        text = f"{field}: profile wants {wanted}, server reports {reported or ''}"
        assert text in output, (text, output)
    assert "--specdecode-allow-mismatch" in output
    assert lifecycle_lines(result) == []  # nothing launched, nothing stopped
    assert project.sim_processes() == []


def test_attach_with_allow_mismatch_measures_and_warns(project, attached_sim):
    project.profiles(ATTACH_PROFILES)
    project.tests(ATTACH_TESTS.format(profile="eagle3-5step"))
    result = project.run("--server-host", attached_sim, "--specdecode-allow-mismatch", *RUNS)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "*SpecdecodeWarning: the server at http://127.0.0.1:* does not run profile "
            "'eagle3-5step'*speculative_num_steps: profile wants 5, server reports 2*",
        ]
    )
    assert table_row(result, "test_attached")[1:] == ["eagle3-5step (simulated)", "3", "MEASURED"]
    assert lifecycle_lines(result) == []


def test_attach_to_a_matching_server_measures_it_and_says_the_env_is_unverified(
    project, attached_sim
):
    project.profiles(ATTACH_PROFILES)
    project.tests(ATTACH_TESTS.format(profile="eagle3"))
    result = project.run("--server-host", attached_sim, *RUNS)
    result.assert_outcomes(passed=1)
    # Said once, in the header: no server reports its environment, so no test repeats it.
    unverified = [line for line in result.outlines if "cannot be verified remotely" in line]
    assert unverified == [
        "specdecode: attached: an SGLang server does not report its environment: the NCCL "
        "variables of env set nccl_tuned cannot be verified remotely and are taken on trust"
    ]
    assert table_row(result, "test_attached")[1:] == ["eagle3 (simulated)", "3", "MEASURED"]
    assert lifecycle_lines(result) == []
    # The attached server still answers: the plugin never stops what it did not start.
    assert httpx.get(f"http://{attached_sim}/health_generate", timeout=10).status_code == 200
