"""Who holds a port, which build a launch runs, and the pool refusing a server that is not the
one it launched (issue 12.1)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_specdecode.errors import ServerStartError
from pytest_specdecode.profiles.profile import ServerProfile
from pytest_specdecode.servers import startup as startup_module
from pytest_specdecode.servers.build import build_key
from pytest_specdecode.servers.launcher import find_free_port, port_in_use
from pytest_specdecode.servers.pool import ServerPool
from pytest_specdecode.servers.ports import (
    describe_holders,
    listeners,
    session_holds_port,
    session_listens,
)
from pytest_specdecode.servers.subprocess import SubprocessLauncher

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")


def http_server(port: int) -> subprocess.Popen[bytes]:
    """``python -m http.server`` in a session of its own (as a launched server is)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 20
    while not port_in_use("127.0.0.1", port):  # a socket, not httpx (see tests/hand_started.py)
        assert proc.poll() is None
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return proc


@pytest.fixture
def foreign() -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    port = find_free_port()
    proc = http_server(port)
    yield port, proc
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def test_the_listener_of_a_port_is_named_with_its_pid_and_command(foreign):
    port, proc = foreign
    (listener,) = listeners(port) or []
    assert listener.pid == proc.pid
    assert listener.session == proc.pid  # it leads its own session
    assert "http.server" in (listener.cmdline or "")
    assert describe_holders(port).startswith(f"pid {proc.pid} (")
    assert listeners(find_free_port()) == []


def test_a_port_is_ours_only_when_our_session_holds_it(foreign):
    port, proc = foreign
    assert session_holds_port(proc.pid, port) is True
    assert session_holds_port(os.getsid(0), port) is False  # pytest's session is another
    assert session_holds_port(proc.pid, find_free_port()) is False  # nobody listens there
    assert session_listens(proc.pid, port) is True  # a stop waits while it still listens
    assert session_listens(os.getsid(0), port) is False  # somebody else's: no wait


class _LoadingLauncher(SubprocessLauncher):
    """A launched "server" that never listens (as SGLang does while it loads its weights)."""

    def __init__(self, port: int, log_path: Path) -> None:
        super().__init__(
            [sys.executable, "-c", "import time; time.sleep(60)"],
            env=dict(os.environ),
            host="127.0.0.1",
            port=port,
            log_path=log_path,
            kind="sim",
        )


def test_a_server_answering_in_place_of_the_launched_one_is_refused(tmp_path, monkeypatch):
    """The race the port check cannot close: the port was free when the launch began, another
    server took it meanwhile and answered the health probe while ours was still loading."""
    port = find_free_port()
    squatter: list[subprocess.Popen[bytes]] = []

    class Raced(_LoadingLauncher):
        def start(self) -> None:
            super().start()
            squatter.append(http_server(port))  # /health_generate: http.server answers 404...

    def fake_ready(*args: object, **kwargs: object) -> float:
        return 0.5  # ...so say the probe got its 200 from it, as a squatting SGLang would give

    profile = ServerProfile(name="nospec", model_path="/models/tiny-llm", launcher="sim", port=port)
    monkeypatch.setattr(
        startup_module, "make_launcher", lambda *a, **k: Raced(port, tmp_path / "server.log")
    )
    monkeypatch.setattr(startup_module, "wait_until_ready", fake_ready)
    pool = ServerPool(state_dir=tmp_path / "state", log_dir=tmp_path, run_id="r", preflight=False)
    try:
        began = time.monotonic()
        with pytest.raises(ServerStartError) as caught:
            pool.acquire(profile)
        # Stopping ours does not wait for the squatter to let go of the port (it never will):
        # once no process of our server listens, the stop is done (it used to take the 30 s).
        assert time.monotonic() - began < 20
        text = str(caught.value)
        assert f"a server answered at http://127.0.0.1:{port}" in text
        assert "but not the one launched" in text
        assert f"pid {squatter[0].pid} (" in text
        assert "http.server" in text
        # Ours was stopped, and the failure sticks for the rest of the run.
        assert pool.counts.failed["nospec"] == 1
        with pytest.raises(ServerStartError):
            pool.acquire(profile)
    finally:
        pool.close()
        for proc in squatter:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_a_build_key_changes_with_the_build_and_names_what_changed():
    base = build_key("sim", python=None, launch_env={"PATH": "/bin", "SGLANG_X": "1"})
    same = build_key("sim", python=None, launch_env={"PATH": "/usr/bin", "SGLANG_X": "1"})
    assert base.key == same.key  # PATH does not make another build
    slower = build_key("sim", python=None, launch_env={"SPECDECODE_SIM_SLOWDOWN": "2"})
    assert slower.key != base.key
    assert slower.differences(base.parts) == ["environment SGLANG_X, SPECDECODE_SIM_SLOWDOWN"]


def test_a_secret_in_the_launch_environment_is_compared_but_never_kept():
    one = build_key("sim", python=None, launch_env={"SGLANG_API_KEY": "hunter2"})
    two = build_key("sim", python=None, launch_env={"SGLANG_API_KEY": "swordfish"})
    assert one.key != two.key
    assert "hunter2" not in repr(one.parts)
    assert one.differences(two.parts) == ["environment SGLANG_API_KEY"]  # by name only


def test_the_sglang_build_is_read_in_the_servers_interpreter_without_failing_when_missing():
    here = build_key("sglang", python=sys.executable, launch_env={})
    assert here.parts["python"] == os.path.realpath(sys.executable)
    assert "sglang" in here.parts  # None here: this interpreter has no SGLang
    missing = build_key("sglang", python="/no/such/python", launch_env={})
    assert missing.parts["sglang"] is None
    assert missing.parts.get("probe") == "failed"
    assert missing.key != here.key
    assert "SGLang" in missing.describe()
