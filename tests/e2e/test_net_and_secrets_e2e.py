"""What users see about the network and secrets (issue #12, items 5 and 7): a proxy in the
environment never sits between the plugin and a local server, and a password in the
``--server-host`` URL reaches no output file and no terminal line."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from hand_started import EAGLE3, hand_started_sim

PROXY_VARIABLES = ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY")

TESTS = """
import pytest

@pytest.mark.specdecode("eagle3", workload="fast")
def test_measured(): pass
"""


def dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_proxy_in_the_environment_does_not_come_between_the_plugin_and_its_server(
    project, monkeypatch
):
    # A corporate proxy that this machine cannot even reach, and no NO_PROXY for 127.0.0.1.
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name in PROXY_VARIABLES:
        monkeypatch.setenv(name, f"http://127.0.0.1:{dead_port()}")
    project.tests(TESTS)
    result = project.run("--update-baselines", "--specdecode-baseline-runs", "2")
    result.assert_outcomes(passed=1)
    assert len(project.baseline_files()) == 1
    assert project.sim_processes() == []


ATTACHED_PROFILES = """
[defaults]
launcher = "sim"
tp_size = 8
model_path = "/models/tiny-llm"
warmup_requests = 1

[profiles.eagle3]
extra_args = ["--disable-custom-all-reduce"]
speculative.algorithm = "EAGLE3"
speculative.draft_model_path = "/models/tiny-eagle3"
speculative.num_steps = 2
speculative.eagle_topk = 1
speculative.num_draft_tokens = 3

[workloads.fast]
prompt_set = "mixed"
max_new_tokens = 32
concurrency = 1
requests_per_run = 2
warmup_requests = 1
"""

PASSWORD = "hunter2-sekrit"


@pytest.fixture(scope="module")
def attached_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A simulated server started by hand, matching ``eagle3`` above; its port. Module-scoped,
    so it starts before pytester snapshots ``sys.modules`` (a second import of httpcore there
    would make its exceptions escape httpx's mapping)."""
    with hand_started_sim(*EAGLE3, log=tmp_path_factory.mktemp("attached") / "server.log") as (
        port,
        _,
    ):
        yield port


def files_holding(root: Path, text: str) -> list[Path]:
    needle = text.encode()
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


@pytest.mark.parametrize(
    "form", ["http://perf:{pw}@127.0.0.1:{port}", "perf:{pw}@127.0.0.1:{port}"]
)
def test_a_password_in_the_server_host_url_reaches_no_output(project, attached_sim, form):
    project.profiles(ATTACHED_PROFILES)
    project.tests(TESTS)
    host = form.format(pw=PASSWORD, port=attached_sim)
    outputs = project.path / "out"
    result = project.run(
        f"--server-host={host}",
        "--update-baselines",
        "--specdecode-baseline-runs", "2",
        "--specdecode-force-baseline",  # two runs on a busy CI box may be noisy; not the point
        "--specdecode-report", str(outputs / "report.json"),
        "--specdecode-history", str(outputs / "history.jsonl"),
        "--specdecode-markdown", str(outputs / "summary.md"),
        f"--junitxml={outputs / 'junit.xml'}",
        "-v",
    )  # fmt: skip
    result.assert_outcomes(passed=1)
    assert {p.name for p in outputs.iterdir()} >= {"report.json", "history.jsonl", "summary.md"}
    terminal = result.stdout.str() + result.stderr.str()
    assert PASSWORD not in terminal
    assert len(project.baseline_files()) == 1
    assert files_holding(project.path, PASSWORD) == []
    # The server is still named, without its user info.
    assert f"<redacted>@127.0.0.1:{attached_sim} (attached)" in terminal


# --- item 8: the smaller ones ------------------------------------------------------------------

INTERRUPT_WHILE_WRITING_THE_REPORT = """
import os
import signal

_replace = os.replace


def _interrupted_replace(src, dst, *args, **kwargs):
    # Ctrl-C at the worst moment: the new report is written to its temporary file, not yet in
    # place. SIGINT is raised as KeyboardInterrupt at the next bytecode, here.
    if str(dst).endswith("report.json"):
        os.kill(os.getpid(), signal.SIGINT)
    return _replace(src, dst, *args, **kwargs)


os.replace = _interrupted_replace
"""


def test_ctrl_c_while_the_report_is_written_ends_cleanly_and_tears_no_file(project):
    project.tests(
        """
        import pytest

        @pytest.mark.specdecode("nospec", workload="fast")
        def test_measured(): pass
        """
    )
    report = project.path / "out" / "report.json"
    args = ("--specdecode-report", str(report), "--specdecode-runs", "2")
    first = project.run(*args)
    first.assert_outcomes(passed=1)
    before = report.read_text()

    project.pytester.makeconftest(INTERRUPT_WHILE_WRITING_THE_REPORT)
    result = project.run(*args)
    output = result.stdout.str() + result.stderr.str()
    assert "Traceback" not in output
    assert "KeyboardInterrupt" not in output
    assert result.ret == 2  # pytest's "interrupted"
    result.stdout.fnmatch_lines(["*interrupted (Ctrl-C*) while writing the baselines and reports*"])
    assert report.read_text() == before  # the previous report, whole
    assert sorted(p.name for p in report.parent.iterdir()) == ["report.json"]  # no temp file
    assert project.sim_processes() == []


def test_a_missing_interpreter_is_named_without_a_traceback(project):
    missing = project.path / "no-venv" / "bin" / "python"
    project.profiles(
        f"""
        [profiles.real]
        launcher = "sglang"
        model_path = "/models/tiny-llm"
        python = "{missing}"
        startup_timeout = 10
        warmup_requests = 0
        """
    )
    project.tests(
        """
        import pytest

        @pytest.mark.specdecode("real", workload={"requests_per_run": 1, "max_new_tokens": 4})
        def test_real(): pass
        """
    )
    result = project.run("--specdecode-target", "real", "--specdecode-skip-preflight")
    result.assert_outcomes(errors=1)
    output = result.stdout.str()
    assert f"sets python = '{missing}', which does not exist" in output
    assert "FileNotFoundError" not in output
    assert "subprocess.py" not in output  # no frames of Popen
