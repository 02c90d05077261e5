"""What the end of a run does with a server it could not stop: a container whose engine did not
answer is recorded as stale for the next session and said so, never counted as stopped; and a
busy engine that fails one call is asked again before giving up (CI: a 2-core box once left a
fleet test's container behind this way, with the summary claiming it was stopped)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest
import requests

from pytest_specdecode.servers import cleanup
from pytest_specdecode.servers.docker import recorded
from pytest_specdecode.servers.state import Entry, Owner, StateFile

IDENTITY = {
    "kind": "docker",
    "container_id": "0123456789abcdef",
    "host": "127.0.0.1",
    "port": 1,
    "docker_host": "unix:///nowhere.sock",
}


class FakeContainer:
    def __init__(self, failures: int) -> None:
        self.labels = {"pytest-specdecode.managed": "1"}
        self.failures = failures
        self.stops = 0
        self.removed = False

    def stop(self, timeout: int) -> None:
        self.stops += 1
        if self.stops <= self.failures:
            raise requests.exceptions.ReadTimeout("the engine took too long")

    def remove(self, force: bool) -> None:
        self.removed = True


class FakeClient:
    def __init__(self, container: FakeContainer) -> None:
        self.containers = self
        self.container = container

    def get(self, container_id: str) -> FakeContainer:
        assert container_id == IDENTITY["container_id"]
        return self.container

    def close(self) -> None:
        pass


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> Any:
    """An engine whose container fails its first ``failures`` stops; no pauses, no port wait."""

    def make(failures: int) -> FakeContainer:
        container = FakeContainer(failures)
        monkeypatch.setattr(recorded, "connect", lambda *args: FakeClient(container))
        monkeypatch.setattr(recorded, "RETRY_PAUSE_S", 0.0)
        monkeypatch.setattr(recorded, "wait_port_free", lambda *args, **kwargs: None)
        return container

    return make


def test_an_engine_that_times_out_once_is_asked_again(engine: Any) -> None:
    container = engine(failures=1)
    assert recorded.stop_docker_server(IDENTITY, 1.0) is True
    assert container.stops == 2
    assert container.removed


def test_an_engine_that_never_answers_is_given_up_after_the_last_try(
    engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    container = engine(failures=recorded.STOP_ATTEMPTS)
    with caplog.at_level(logging.WARNING):
        assert recorded.stop_docker_server(IDENTITY, 1.0) is False
    assert container.stops == recorded.STOP_ATTEMPTS
    assert not container.removed
    assert f"failed {recorded.STOP_ATTEMPTS} times" in caplog.text
    assert "ReadTimeout" in caplog.text


def _owned_entry(state: StateFile, run_id: str) -> None:
    with state.edit() as entries:
        entries["d1"] = Entry(
            digest="d1",
            profile="on-a",
            url="http://127.0.0.1:1",
            identity=dict(IDENTITY),
            gpus=[],
            status="ready",
            owner=Owner(run_id, os.getpid()),
        )


@pytest.mark.parametrize("stopped", [True, False], ids=["stopped", "engine-down"])
def test_the_controllers_end_of_run_counts_only_what_it_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stopped: bool
) -> None:
    state = StateFile(tmp_path)
    _owned_entry(state, "run-1")
    monkeypatch.setattr(cleanup, "identity_alive", lambda identity: True)
    monkeypatch.setattr(cleanup, "stop_identity", lambda identity, grace: stopped)
    events: list[str] = []
    counts = cleanup.finish_run(tmp_path, "run-1", keep_alive=False, on_event=events.append)
    with state.edit() as entries:
        left = dict(entries)
    if stopped:
        assert counts.stopped["on-a"] == 1
        assert left == {}
        assert events == ["on-a: stopping (end of the test session)"]
    else:
        assert counts.stopped["on-a"] == 0  # not claimed as stopped in the summary
        (stale,) = left.values()
        assert stale.digest == f"stale-{IDENTITY['container_id']}"
        assert (stale.status, stale.owner, stale.identity) == ("stale", None, IDENTITY)
        assert "could not remove its container" in events[-1]
        assert "the next session that reaches the engine removes it" in events[-1]
