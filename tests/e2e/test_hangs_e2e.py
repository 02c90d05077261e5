"""Hangs end in bounded time with the right message, and a --server-host that is not a ready
SGLang is named within seconds (issue 12, items 4 and 6).

Real pytest subprocesses: simulated servers that freeze right after they are ready
(``--sim-fault hang``) or while serving a measured request (``--sim-fault hang-after:N``:
alive, listening, never another token), and attach targets that are a closed port, a plain HTTP
server, and a server stuck at 503.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator

import pytest
from pytest_runs import durations, suite_of

from pytest_specdecode.servers.launcher import find_free_port, port_in_use

RUNS = ("--specdecode-runs", "3", "--specdecode-max-runs", "3", "--durations=0", "-vv")
FAST = '"--sim-speed", "50", "--sim-load-seconds", "0.2", "--sim-seed", "1"'

PROFILES = f"""
[defaults]
launcher = "sim"
tp_size = 8
model_path = "/models/tiny-llm"
startup_timeout = 300
warmup_requests = 1

# Ready, then frozen: its health probe never answers 200 again.
[profiles.frozen]
extra_args = [{FAST}, "--sim-fault", "hang"]

# Ready; freezes while serving its 4th request (the first measured run), and stays alive.
[profiles.hangs]
extra_args = [{FAST}, "--sim-fault", "hang-after:3"]

[profiles.nospec]
extra_args = [{FAST}]

[workloads.fast]
prompt_set = "mixed"
max_new_tokens = 64
concurrency = 1
requests_per_run = 2
warmup_requests = 1
"""


def test_a_server_frozen_right_after_ready_fails_within_the_stall_bound(project):
    project.profiles(PROFILES)
    project.tests(suite_of("frozen", "frozen", "nospec"))
    started = time.monotonic()
    result = project.run("--specdecode-stall-timeout", "3", *RUNS)
    took = time.monotonic() - started
    result.assert_outcomes(errors=2, passed=1)
    out = result.stdout.str()
    assert "logged that it is ready" in out
    assert "the server is hung" in out
    assert "Raise the profile's startup_timeout" not in out  # not a slow load: a hang
    assert took < 60  # not the 300 s startup timeout
    times = durations(result)
    assert times[("test_2_frozen", "setup")] < 1.0  # the failure sticks: no second wait
    assert project.sim_processes() == []


def test_a_server_hung_after_ready_with_a_short_startup_timeout_is_reported_as_hung(project):
    """#27 item 4: the startup timeout (4 s) runs out before the hang bound (stall timeout 60 s)
    on a server that logged it is ready and then froze: the error says it hung after its load,
    what it last said and since when, not "raise startup_timeout, loading is just slow"."""
    project.profiles(
        PROFILES.replace("[profiles.frozen]\n", "[profiles.frozen]\nstartup_timeout = 4\n")
    )
    project.tests(suite_of("frozen", "frozen"))
    started = time.monotonic()
    result = project.run("--specdecode-stall-timeout", "60", *RUNS)
    took = time.monotonic() - started
    result.assert_outcomes(errors=2)
    out = result.stdout.str()
    assert "ServerHungError" in out
    assert "logged that it is ready" in out
    assert "gave up at the startup_timeout 4s" in out
    assert "hung after its load, not loading slowly" in out
    assert 'Its last log line: "' in out
    assert "Raise the profile's startup_timeout" not in out
    assert "last phase: ready" not in out
    assert took < 40  # the 4 s startup timeout, not the 60 s hang bound
    assert durations(result)[("test_2_frozen", "setup")] < 1.0
    assert project.sim_processes() == []


def test_a_server_that_hangs_while_measured_fails_its_test_and_the_profiles_next_at_once(
    project,
):
    project.profiles(PROFILES)
    project.tests(suite_of("hangs", "hangs", "nospec"))
    result = project.run("--specdecode-stall-timeout", "2", *RUNS)
    result.assert_outcomes(failed=1, errors=1, passed=1)
    out = result.stdout.str()
    assert "hung during run 1" in out
    assert "no token for 2s" in out
    assert "--specdecode-stall-timeout 2" in out
    assert "Later tests of this profile fail at once" in out
    times = durations(result)
    assert times[("test_1_hangs", "call")] < 15  # not request_timeout's 600 s
    assert times[("test_2_hangs", "setup")] < 1.0
    assert "hangs launched 1, reused 0, stopped 0, failed 1" in out
    assert project.sim_processes() == []  # the hung server was stopped, not left frozen


def test_the_default_stall_bound_is_derived_from_what_the_warm_up_saw(project):
    project.profiles(PROFILES)
    project.tests(suite_of("hangs"))
    result = project.run(*RUNS)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    # 10x the longest silence of the warm-up (milliseconds at 50x speed), floored at 30 s
    assert "no token for 30s" in out
    assert "10x the longest silence within a stream seen on this server so far" in out
    assert durations(result)[("test_1_hangs", "call")] < 60


def test_a_request_timeout_on_a_frozen_server_marks_it_hung_and_nothing_waits_again(project):
    """#27 item 4: the request timeout (8 s) is tighter than the stall bound (30 s): the timed-out
    request is followed by a health probe, which a frozen server does not answer, so the server
    counts as hung: the profile's later tests fail at once, and its stop is not a 30 s wait."""
    project.profiles(PROFILES)
    project.tests(suite_of("hangs", "hangs", "hangs", "nospec"))
    started = time.monotonic()
    result = project.run("--specdecode-request-timeout", "8", *RUNS)
    took = time.monotonic() - started
    result.assert_outcomes(failed=1, errors=2, passed=1)
    out = result.stdout.str()
    assert "hung during run 1" in out
    assert "request_timeout=8s" in out
    assert "GET /health_generate: no answer within 5s" in out  # the probe names the cause
    assert "Later tests of this profile fail at once" in out
    times = durations(result)
    # the request timeout, the probe, the hung server's 5 s stop grace, slack: no second wait
    assert times[("test_1_hangs", "call")] < 8 + 5 + 5 + 4
    assert times[("test_2_hangs", "setup")] < 1.0
    assert times[("test_3_hangs", "setup")] < 1.0
    assert times[("test_3_hangs", "teardown")] < 1.0
    assert "hangs launched 1, reused 0, stopped 0, failed 1" in out
    assert took < 60  # was 8 + 2 x 10.1 + 30 s of waiting on top of the runs
    assert project.sim_processes() == []


def test_a_request_timeout_on_a_server_that_still_answers_fails_only_that_request(project):
    """The other side of the probe: responses longer than the request timeout on a healthy
    server are the request's problem (raise the timeout), not a hung server's."""
    slow = PROFILES + (
        "\n[profiles.slowgen]\nwarmup_requests = 0\n"
        'extra_args = ["--sim-speed", "0.25", "--sim-load-seconds", "0.2", "--sim-seed", "1"]\n'
    )
    project.profiles(slow)
    project.tests(suite_of("slowgen", "slowgen"))
    result = project.run("--specdecode-request-timeout", "2", *RUNS)
    out = result.stdout.str()
    result.assert_outcomes(failed=2)
    assert "only this request ran out of time" in out
    assert "raise --specdecode-request-timeout" in out
    assert "hung during" not in out
    assert "slowgen launched 1, reused 0" in out  # the second test measured the same server


def test_a_kept_server_that_misses_one_health_probe_is_probed_again_not_reloaded(project):
    """#27 item 4: a kept server is adopted by the next session only if it answers its health
    probe. ``flap-health`` fails every second probe after readiness: the launching session's
    readiness probe got the 200, so the adopting session's first probe gets a 503. One miss is
    probed again (a reload is 15-30 minutes on a real box), and the reason is printed."""
    project.profiles(
        PROFILES + "\n[profiles.flaps]\n" + f'extra_args = [{FAST}, "--sim-fault", "flap-health"]\n'
    )
    project.tests(suite_of("flaps"))
    first = project.run("--specdecode-keep-server", *RUNS)
    first.assert_outcomes(passed=1)
    assert "flaps launched 1" in first.stdout.str()
    started = time.monotonic()
    second = project.run(*RUNS)
    took = time.monotonic() - started
    second.assert_outcomes(passed=1)
    out = second.stdout.str()
    assert "missed a health probe (GET /health_generate: HTTP 503); probing again" in out
    assert "answered the second probe" in out
    assert "flaps launched 0, reused 1" in out  # no reload for one missed probe
    assert "giving up the recorded server" not in out
    assert took < 60
    assert project.sim_processes() == []


# -- --server-host that is not a ready SGLang ------------------------------------------------

ATTACH_TEST = """
import pytest

@pytest.mark.specdecode("nospec", workload="fast")
def test_attached(): pass
"""

# Answers 503 on every route, as SGLang does on /health_generate while it warms up.
STUCK_AT_503 = textwrap.dedent(
    """
    import http.server, sys

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(503)
            self.end_headers()

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
    """
)


@pytest.fixture
def foreign_server() -> Iterator[Callable[..., int]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(*argv: str) -> int:
        port = find_free_port()
        proc = subprocess.Popen(
            [sys.executable, *argv, str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        started.append(proc)
        deadline = time.monotonic() + 20
        while not port_in_use("127.0.0.1", port):
            assert proc.poll() is None
            assert time.monotonic() < deadline
            time.sleep(0.05)
        return port

    yield start
    for proc in started:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def attach_run(project, host: str) -> tuple[pytest.RunResult, float]:
    project.profiles(PROFILES)
    project.tests(ATTACH_TEST)
    started = time.monotonic()
    result = project.run("--server-host", host, *RUNS)
    return result, time.monotonic() - started


def test_attach_to_a_closed_port_says_connection_refused_within_seconds(project):
    result, took = attach_run(project, f"127.0.0.1:{find_free_port()}")
    result.assert_outcomes(errors=1)
    out = result.stdout.str()
    assert "nothing accepts connections at http://127.0.0.1:" in out
    assert "connection refused for 5s" in out
    assert "still loading" in out  # the other reason a port is closed
    assert took < 30  # was about 62 s


def test_attach_to_a_plain_http_server_says_it_is_not_sglang_and_what_answered(
    project, foreign_server
):
    port = foreign_server("-m", "http.server", "--bind", "127.0.0.1")
    result, took = attach_run(project, f"127.0.0.1:{port}")
    result.assert_outcomes(errors=1)
    out = result.stdout.str()
    assert f"the server at http://127.0.0.1:{port} answers HTTP but is not SGLang" in out
    assert "GET /health_generate 404, /health 404, /server_info 404" in out
    assert "/ 200" in out  # it serves something: a directory listing
    assert took < 30


def test_attach_to_a_server_stuck_at_503_says_it_is_still_starting(project, foreign_server):
    script = project.path / "stuck.py"
    script.write_text(STUCK_AT_503)
    port = foreign_server(str(script))
    project.profiles(PROFILES.replace("startup_timeout = 300", "startup_timeout = 3"))
    project.tests(ATTACH_TEST)
    result = project.run("--server-host", f"127.0.0.1:{port}", *RUNS)
    result.assert_outcomes(errors=1)
    out = result.stdout.str()
    assert "is still starting: GET /health_generate answered HTTP 503" in out
    assert "SGLang answers 503 while it warms up" in out
