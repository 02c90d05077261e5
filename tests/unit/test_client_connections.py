"""The client against a real socket: what follows ``[DONE]`` (issue 27, item 2).

A request is measured to the arrival of its ``[DONE]``, and a run to its last answer: what the
server does with the connection after that (SGLang ends the body at once; a server might keep
it open) is never measured time, and the client does not wait for it. These run against a small
HTTP/1.1 server on a socket, where closing a connection takes real time.
"""

from __future__ import annotations

import json
import socketserver
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from pytest_specdecode.client import MeasurementClient
from pytest_specdecode.workloads import Prompt, Workload

PROMPTS = (Prompt("code", "Write a function."), Prompt("chat", "Plan my weekend."))


@dataclass
class SseServer:
    """Answers every POST with a chunked SGLang /generate stream of three chunks and
    ``[DONE]``, then ends the body at once, or ``linger`` seconds later."""

    linger: float = 0.0
    received: list[float] = field(default_factory=list)  # perf_counter of each request
    lock: threading.Lock = field(default_factory=threading.Lock)


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _event(tokens: int, final: bool) -> bytes:
    meta = {
        "id": "r1",
        "finish_reason": {"type": "length", "length": tokens} if final else None,
        "prompt_tokens": 12,
        "completion_tokens": tokens,
        "cached_tokens": 0,
    }
    body = {"text": "x" * tokens, "output_ids": list(range(tokens)), "meta_info": meta}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _handler(state: SseServer) -> type[socketserver.StreamRequestHandler]:
    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            while True:  # HTTP/1.1 keep-alive: one request after another on this connection
                request_line = self.rfile.readline()
                if not request_line:
                    return
                length = 0
                while (line := self.rfile.readline()) not in (b"\r\n", b"\n", b""):
                    name, _, value = line.decode("latin-1").partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                self.rfile.read(length)
                with state.lock:
                    state.received.append(time.perf_counter())
                self.wfile.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n"
                )
                for tokens in (1, 2, 3):
                    self.wfile.write(_chunk(_event(tokens, final=tokens == 3)))
                    self.wfile.flush()
                    time.sleep(0.01)
                self.wfile.write(_chunk(b"data: [DONE]\n\n"))
                self.wfile.flush()
                if state.linger:
                    time.sleep(state.linger)
                try:
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except OSError:
                    return  # the client gave up on this connection

    return Handler


@pytest.fixture
def sse_server() -> Iterator[tuple[str, SseServer]]:
    state = SseServer()
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _handler(state))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()


def sequential(requests: int) -> Workload:
    return Workload("unit", "inline", PROMPTS, requests_per_run=requests, concurrency=1)


def test_a_body_kept_open_after_done_is_neither_waited_for_nor_measured(sse_server):
    url, state = sse_server
    state.linger = 5.0  # the server would end each body 5 s after its [DONE]
    started = time.perf_counter()
    with MeasurementClient(url) as client:
        run = client.run(sequential(3), run_index=0)
    took = time.perf_counter() - started

    # Waiting for each body's end would take 15 s; the bounds leave room for a loaded machine.
    assert took < 4.0, "the client closes at [DONE] instead of waiting 5 s for the body's end"
    assert [r.completion_tokens for r in run.records] == [3, 3, 3]
    for record in run.records:
        assert record.t_end - record.t_start < 1.0  # three chunks 10 ms apart, then [DONE]
    for before, after in zip(run.records, run.records[1:], strict=False):
        assert before.t_end <= after.t_start
    assert run.t_end == run.records[-1].t_end  # the run ends with its last answer
    assert len(state.received) == 3
