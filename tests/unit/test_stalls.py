"""The stall bound and the hung-after-ready rule, without servers (issue 12, item 4)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from pytest_specdecode.client import STALL_FLOOR, STALL_INITIAL, StallBound
from pytest_specdecode.errors import ServerHungError, ServerTimeoutError
from pytest_specdecode.servers.readiness import LogTail, wait_until_ready


def test_the_stall_bound_starts_generous_then_follows_what_the_server_showed():
    bound = StallBound()
    assert bound.bound(streaming=True) == STALL_INITIAL
    bound.longest_gap = 0.2  # a quick server: the floor holds
    assert bound.bound(streaming=True) == STALL_FLOOR
    bound.longest_gap = 12.0  # a long prefill queue in the warm-up: 10x that
    assert bound.bound(streaming=True) == 120.0
    assert "12.00s" in bound.explain(streaming=True)
    # non-streamed responses are judged against whole responses, not chunk gaps
    assert bound.bound(streaming=False) == STALL_INITIAL
    assert StallBound(fixed=7).bound(streaming=True) == 7


def _ready_log(tmp_path: Path) -> LogTail:
    log = tmp_path / "server.log"
    log.write_text("INFO: The server is fired up and ready to roll!\n")
    return LogTail(log, (("fired up and ready to roll", "ready"),))


def test_a_server_that_logged_ready_but_never_answers_is_hung_not_slow(tmp_path):
    def frozen(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    with pytest.raises(ServerHungError) as caught:
        wait_until_ready(
            "http://127.0.0.1:1",
            name="server 'x'",
            timeout=300,
            log=_ready_log(tmp_path),
            transport=httpx.MockTransport(frozen),
            poll_interval=0.01,
            ready_grace=0.2,
        )
    text = str(caught.value)
    assert "logged that it is ready" in text
    assert "last probe: timed out after 5s" in text
    assert "the server is hung" in text


def test_a_server_still_loading_is_waited_for_until_the_startup_timeout(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("Load weight begin\n")

    def loading(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(ServerTimeoutError) as caught:
        wait_until_ready(
            "http://127.0.0.1:1",
            name="server 'x'",
            timeout=0.3,
            log=LogTail(log, (("Load weight begin", "loading"),)),
            transport=httpx.MockTransport(loading),
            poll_interval=0.01,
            ready_grace=0.01,
        )
    assert not isinstance(caught.value, ServerHungError)
    assert "last phase: loading" in str(caught.value)


def test_a_startup_timeout_after_ready_is_a_hang_with_what_the_server_last_said(tmp_path):
    """#27 item 4: the startup timeout runs out before the hang bound on a server that said it
    is ready: a hang, named with its last log line, never "raise startup_timeout"."""

    def frozen(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503)

    log = _ready_log(tmp_path)
    with log.path.open("a") as fh:
        fh.write("ERROR: Health check failed. Server couldn't get a response from detokenizer\n")
    with pytest.raises(ServerHungError) as caught:
        wait_until_ready(
            "http://127.0.0.1:1",
            name="server 'x'",
            timeout=0.3,
            log=log,
            transport=httpx.MockTransport(frozen),
            poll_interval=0.01,
            ready_grace=60,
        )
    text = str(caught.value)
    assert "server 'x' logged that it is ready 0s after its launch" in text
    assert "(last probe: HTTP 503); gave up at the startup_timeout 0.3s" in text
    assert "hung after its load, not loading slowly" in text
    assert 'Its last log line: "ERROR: Health check failed.' in text
    assert "Raise the profile's startup_timeout" not in text
