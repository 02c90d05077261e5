"""The measurement client: sends a workload's requests and records what happened to each.

What differs between servers and APIs lives in the protocol adapters
(:mod:`pytest_specdecode.adapters`): the request path, body and headers, and how one response
body or one stream event is read. Which adapter a server gets is its backend's choice
(:mod:`pytest_specdecode.backends`), passed in as ``adapters``. Everything else is shared here:
HTTP, timeouts, SSE framing, token timelines (one chunk can carry several tokens, e.g. a verify
step that accepts several: each chunk records its arrival time and cumulative count, and the
metrics split the gap over the tokens it brought, as bench_serving does), errors and
concurrency, plus plain GETs (:meth:`MeasurementClient.get`) for the backends' housekeeping
routes (``/server_info``, ``/flush_cache``, ``/props``, ``/metrics``).

Errors are ``RequestError``s naming the URL (credentials removed) and never the API key.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import TypeVar

import httpx

from pytest_specdecode import net
from pytest_specdecode.adapters import (
    ParsedUpdate,
    ProtocolAdapter,
    adapter_for,
    error_message,
    excerpt,
)
from pytest_specdecode.errors import ConfigError, RequestError
from pytest_specdecode.redaction import redact_url
from pytest_specdecode.request_log import RequestRecord, RunRecord
from pytest_specdecode.workloads import Prompt, Workload

_T = TypeVar("_T")

SIM_SENT_AT_HEADER = "x-specdecode-sent-monotonic"
"""Sent to simulated servers only: the client's ``time.monotonic()`` when it began sending the
request. The simulator starts the request's schedule there, so the host's delay before the
simulator reads the request (which grows on a busy machine, and which a GPU server's
milliseconds-long steps would not notice) does not lengthen the measured request. Real servers
never get it. The simulator's copy of the name is ``pytest_specdecode.sim.httputil``'s
``SENT_AT_HEADER``."""
AdapterFactory = Callable[..., ProtocolAdapter]
"""``factory(api, model=...)``: the adapter for a workload's api (a backend's ``adapter``)."""


# --- stream state ------------------------------------------------------------------------------


class _Timeline:
    """Accumulates the updates of one request into a token timeline and final fields."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.counts: list[int] = []
        self.tokens = 0
        self.estimated = False
        self.reported_total: int | None = None
        self.prompt_tokens: int | None = None
        self.cached_tokens: int | None = None
        self.finish_reason: str | None = None
        self.spec_verify_ct: int | None = None
        self.spec: dict[str, object] = {}
        self.server_e2e_latency: float | None = None

    def apply(self, update: ParsedUpdate, now: float) -> None:
        if update.summary:
            if update.completion_tokens is not None:
                self.reported_total = update.completion_tokens
        else:
            new = self.tokens
            if update.completion_tokens is not None:
                new = update.completion_tokens
            elif update.has_text:
                new, self.estimated = self.tokens + 1, True
            if new > self.tokens:
                self.times.append(now)
                self.counts.append(new)
                self.tokens = new
        self.prompt_tokens = _latest(update.prompt_tokens, self.prompt_tokens)
        self.cached_tokens = _latest(update.cached_tokens, self.cached_tokens)
        self.finish_reason = _latest(update.finish_reason, self.finish_reason)
        self.spec_verify_ct = _latest(update.spec_verify_ct, self.spec_verify_ct)
        self.server_e2e_latency = _latest(update.server_e2e_latency, self.server_e2e_latency)
        self.spec.update(update.spec)

    def record(self, prompt: Prompt, t_start: float, t_end: float, streamed: bool) -> RequestRecord:
        total = self.tokens if self.reported_total is None else self.reported_total
        if self.estimated and self.reported_total is None:
            raise RequestError(
                "the stream carried no token counts (no usage in any chunk), so generated tokens "
                "cannot be counted; the server ignored stream_options.include_usage. Use api "
                "'generate-stream' or a server that reports usage"
            )
        if self.prompt_tokens is None:
            raise RequestError("the response carried no prompt token count")
        times, counts = _reconcile(self.times, self.counts, total)
        if not streamed:
            times, counts = ([t_end], [total]) if total else ([], [])
        return RequestRecord(
            prompt_kind=prompt.kind,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=total,
            cached_tokens=self.cached_tokens,
            t_start=t_start,
            t_first_token=times[0] if streamed and times else None,
            t_end=t_end,
            chunk_times=tuple(times),
            chunk_tokens=tuple(counts),
            spec_verify_ct=self.spec_verify_ct,
            spec=dict(self.spec),
            finish_reason=self.finish_reason,
            server_e2e_latency=self.server_e2e_latency,
        )


def _latest(new: _T | None, old: _T | None) -> _T | None:
    return old if new is None else new


def _reconcile(times: list[float], counts: list[int], total: int) -> tuple[list[float], list[int]]:
    """Scale estimated cumulative counts so the last equals the server's total, keeping only
    chunks that still add tokens (the first chunk keeps >= 1 token, so TTFT is unchanged)."""
    if not counts or counts[-1] == total:
        return times, counts
    if total == 0:
        return [], []
    last = counts[-1]
    kept_times: list[float] = []
    kept_counts: list[int] = []
    for t, count in zip(times, counts, strict=True):
        scaled = max(1, (2 * count * total + last) // (2 * last))  # round half up
        if not kept_counts or scaled > kept_counts[-1]:
            kept_times.append(t)
            kept_counts.append(scaled)
    return kept_times, kept_counts


async def _sse_data(chunks: AsyncIterator[bytes]) -> AsyncGenerator[bytes, None]:
    """The ``data`` payload of each server-sent event (multi-line data joined with newlines).

    Lines are split on bytes, at CR, LF or CRLF only, as the SSE format defines them. Text
    lines would also split at U+2028, U+2029 and U+0085 (``str.splitlines``, and httpx's
    ``aiter_lines``), which JSON leaves unescaped and orjson (SGLang's encoder) writes raw: a
    model that generated one would break its event in two. Bytes are also the cheaper read:
    this runs for every chunk of every stream."""
    data: list[bytes] = []
    pending = b""
    async for chunk in chunks:
        pending += chunk
        # A CR at the end may be the first half of a CRLF split across two chunks.
        cut = len(pending) - 1 if pending.endswith(b"\r") else len(pending)
        lines = pending[:cut].splitlines(keepends=True)
        if lines and not lines[-1].endswith((b"\n", b"\r")):
            pending = lines.pop() + pending[cut:]  # a line without its end yet
        else:
            pending = pending[cut:]
        for raw in lines:
            line = raw.rstrip(b"\r\n")
            if not line:
                if data:
                    yield b"\n".join(data)
                    data = []
                continue
            name, _, value = line.partition(b":")
            if name == b"data":
                data.append(value[1:] if value.startswith(b" ") else value)
            # Comments (":...") and the event/id/retry fields carry nothing we use.
    last = pending.rstrip(b"\r\n")
    if last.startswith(b"data:"):
        value = last[5:]
        data.append(value[1:] if value.startswith(b" ") else value)
    if data:
        yield b"\n".join(data)


# --- connections -------------------------------------------------------------------------------

KEEPALIVE_SECONDS = 1.0
"""How long an idle connection stays in the pool: well under the keep-alive timeout of SGLang's
and llama-server's HTTP servers (5 s), so the client never sends on a connection the server is
closing at that moment; the requests of a run follow each other within milliseconds."""


# --- stalls ------------------------------------------------------------------------------------

STALL_INITIAL = 120.0
"""Seconds of silence allowed before anything was seen on a server: a first request may wait
for kernels compiled on first use (Triton attention on real SGLang)."""
STALL_FLOOR = 30.0
STALL_FACTOR = 10.0


class StallBound:
    """How long a server may stay silent before it counts as hung: ``fixed`` seconds
    (``--specdecode-stall-timeout``), else :data:`STALL_FACTOR` times the longest silence seen
    on it so far (before the first token of a stream, between two of its chunks, or a whole
    non-streamed response), at least :data:`STALL_FLOOR`, and :data:`STALL_INITIAL` before
    anything was seen. One per server, kept across the clients of a session, so the warm-up
    teaches the bound that the measured runs are held to.
    """

    def __init__(self, fixed: float | None = None) -> None:
        self.fixed = fixed
        self.longest_gap = 0.0  # streamed: the longest wait for the next chunk
        self.longest_response = 0.0  # not streamed: the longest whole response

    def _seen(self, streaming: bool) -> float:
        return self.longest_gap if streaming else self.longest_response

    def bound(self, streaming: bool) -> float:
        if self.fixed is not None:
            return self.fixed
        seen = self._seen(streaming)
        return max(STALL_FLOOR, STALL_FACTOR * seen) if seen else STALL_INITIAL

    def explain(self, streaming: bool) -> str:
        if self.fixed is not None:
            return f"--specdecode-stall-timeout {self.fixed:g}"
        seen = self._seen(streaming)
        if not seen:
            return f"the bound before anything was seen on this server: {STALL_INITIAL:g}s"
        what = "silence within a stream" if streaming else "response"
        return (
            f"{STALL_FACTOR:g}x the longest {what} seen on this server so far ({seen:.2f}s), at "
            f"least {STALL_FLOOR:g}s; --specdecode-stall-timeout sets it"
        )


# --- the client --------------------------------------------------------------------------------


class MeasurementClient:
    """Sends a workload's requests to one server and records each request's timeline.

    A synchronous API over asyncio + ``httpx.AsyncClient``: the client owns a private event loop,
    so call it from synchronous code only, and from one thread. ``connect_timeout`` bounds each
    connection attempt; ``request_timeout`` bounds each request from sending to the last byte;
    ``stall`` bounds any silence within it (:class:`StallBound`: a hung server fails its request
    in seconds to minutes, not after the whole request timeout). ``simulated``: the server is
    the simulator, so each request carries its send time (:data:`SIM_SENT_AT_HEADER`).
    ``adapters(api, model=...)`` chooses the protocol adapter for a workload's api (default:
    SGLang's, :func:`~pytest_specdecode.adapters.adapter_for`). ``transport`` is for tests
    (``httpx.MockTransport``).
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        model: str | None = None,
        adapters: AdapterFactory = adapter_for,
        connect_timeout: float = 10.0,
        request_timeout: float = 600.0,
        stall: StallBound | None = None,
        simulated: bool = False,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        try:
            url = httpx.URL(base_url)
        except httpx.InvalidURL as exc:
            shown = redact_url(base_url)  # neither the URL nor httpx's message shows a password
            raise ConfigError(f"server URL {shown!r} is not a valid URL: {exc}") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise ConfigError(
                f"server URL {redact_url(base_url)!r} is not an http:// or https:// URL with a "
                "host, e.g. http://127.0.0.1:30000"
            )
        self._api_key = api_key
        self._model = model
        self._adapters = adapters
        self._connect_timeout = connect_timeout
        self._request_timeout = request_timeout
        self._stall = stall or StallBound()
        self._simulated = simulated
        self._display_url = str(url.copy_with(userinfo=b"")).rstrip("/")
        self._loop: asyncio.AbstractEventLoop | None = asyncio.new_event_loop()
        self._http = httpx.AsyncClient(
            base_url=str(url).rstrip("/"),
            headers={"Authorization": f"Bearer {api_key}"} if api_key else None,
            timeout=httpx.Timeout(request_timeout, connect=connect_timeout),
            # Our semaphore bounds the requests in flight; the pool must never queue them.
            limits=httpx.Limits(
                max_connections=None,
                max_keepalive_connections=None,
                keepalive_expiry=KEEPALIVE_SECONDS,
            ),
            transport=transport,
            trust_env=net.trust_env(url),  # local: direct; remote: the user's proxy settings
            verify=net.tls_context(url),
        )

    # -- lifecycle --

    def close(self) -> None:
        """Close the HTTP connections and the event loop; the client cannot be used afterwards."""
        if self._loop is not None:
            self._loop.run_until_complete(self._http.aclose())
            # httpx's line iterators of finished streams are async generators too; finalise
            # them on this loop instead of leaving "Task was destroyed" to the garbage collector.
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()
            self._loop = None

    def __enter__(self) -> MeasurementClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _run_sync(self, coro: Awaitable[_T]) -> _T:
        if self._loop is None:
            if asyncio.iscoroutine(coro):
                coro.close()
            raise RuntimeError("this MeasurementClient is closed; create a new one")
        return self._loop.run_until_complete(coro)

    # -- measuring --

    def run(self, workload: Workload, run_index: int) -> RunRecord:
        """One measured run: ``requests_per_run`` requests, at most ``concurrency`` in flight.
        Any failed request fails the run with a ``RequestError``."""
        prompts = workload.prompts_for_run(run_index)
        label = f"workload {workload.name!r}, run {run_index + 1}"  # 1-based, as users count
        records, t_start, t_end = self._run_sync(self._send_all(workload, prompts, label))
        return RunRecord(records=records, t_start=t_start, t_end=t_end, run_index=run_index)

    def warmup(self, workload: Workload) -> None:
        """Send the workload's warm-up requests (same shape and concurrency, not recorded)."""
        prompts = workload.prompts_for_warmup()
        if prompts:
            label = f"workload {workload.name!r}, warm-up"
            self._run_sync(self._send_all(workload, prompts, label))

    async def _send_all(
        self, workload: Workload, prompts: Sequence[Prompt], label: str
    ) -> tuple[tuple[RequestRecord, ...], float, float]:
        adapter = self._adapters(workload.api, model=self._model)
        slots = asyncio.Semaphore(workload.concurrency)

        async def one(number: int, prompt: Prompt) -> RequestRecord:
            async with slots:
                try:
                    return await self._send(adapter, prompt, workload)
                except RequestError as exc:
                    where = f"{label}, request {number} of {len(prompts)} ({prompt.kind} prompt)"
                    raise RequestError(
                        f"{where}: {exc}",
                        url=exc.url,
                        status=exc.status,
                        stalled=exc.stalled,
                        timed_out=exc.timed_out,
                    ) from exc

        t_start = time.perf_counter()
        tasks = [asyncio.ensure_future(one(n, p)) for n, p in enumerate(prompts, 1)]
        _, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        t_end = time.perf_counter()
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for task in tasks:
            failure = None if task.cancelled() else task.exception()
            if failure is not None:
                raise failure  # the lowest-numbered failed request; the others were cancelled
        records = tuple(task.result() for task in tasks)
        if records:
            # The run ends with its last answer, not with the clean-up of its last connection.
            t_end = max(record.t_end for record in records)
        return records, t_start, t_end

    async def _send(
        self, adapter: ProtocolAdapter, prompt: Prompt, workload: Workload
    ) -> RequestRecord:
        path, body = adapter.request(prompt, workload)
        url = self._display_url + path
        timeline = _Timeline()
        t_start = time.perf_counter()
        headers = adapter.headers
        if self._simulated:
            headers = {**headers, SIM_SENT_AT_HEADER: repr(time.monotonic())}
        try:
            send = self._stream if adapter.streaming else self._post
            t_end = await asyncio.wait_for(
                send(adapter, path, body, headers, timeline), timeout=self._request_timeout
            )
            return timeline.record(prompt, t_start, t_end, streamed=adapter.streaming)
        except RequestError as exc:
            raise self._error(f"{url}: {exc}", url, exc.status, timed_out=exc.timed_out) from exc
        except asyncio.TimeoutError as exc:
            raise self._error(
                f"{url}: no complete response within request_timeout={self._request_timeout:g}s "
                f"({timeline.tokens} tokens received)",
                url,
                timed_out=True,
            ) from exc
        except httpx.ReadTimeout as exc:
            streaming = adapter.streaming
            bound = self._stall.bound(streaming)
            if bound >= self._request_timeout:  # the request timeout is the tighter bound
                why = f"request_timeout={self._request_timeout:g}s"
            else:
                why = f"the stall bound: {self._stall.explain(streaming)}"
            raise self._error(
                f"{url}: no {'token' if streaming else 'response'} for "
                f"{min(bound, self._request_timeout):.0f}s after {timeline.tokens} tokens "
                f"({why}): the server is hung",
                url,
                stalled=True,
            ) from exc
        except httpx.HTTPError as exc:
            raise self._transport_error(exc, url, timeline.tokens) from exc

    def _timeout(self, streaming: bool) -> httpx.Timeout:
        """This request's timeouts: the read timeout (the longest wait for the next bytes) is
        the stall bound."""
        read = min(self._stall.bound(streaming), self._request_timeout)
        return httpx.Timeout(self._request_timeout, connect=self._connect_timeout, read=read)

    async def _post(
        self,
        adapter: ProtocolAdapter,
        path: str,
        body: dict[str, object],
        headers: Mapping[str, str],
        timeline: _Timeline,
    ) -> float:
        t_sent = time.perf_counter()
        response = await self._http.post(
            path, json=body, headers=headers, timeout=self._timeout(streaming=False)
        )
        t_end = time.perf_counter()
        stall = self._stall
        stall.longest_response = max(stall.longest_response, t_end - t_sent)
        if response.status_code != 200:
            raise _status_error(response)
        try:
            data = response.json()
        except ValueError as exc:
            raise RequestError(f"the response is not JSON: {excerpt(response.text)}") from exc
        timeline.apply(adapter.parse_final(data), t_end)
        return t_end

    async def _stream(
        self,
        adapter: ProtocolAdapter,
        path: str,
        body: dict[str, object],
        headers: Mapping[str, str],
        timeline: _Timeline,
    ) -> float:
        """Stream one request; its time ends when ``[DONE]`` arrives, not after the close."""
        stall = self._stall
        last = time.perf_counter()
        t_done: float | None = None
        async with self._http.stream(
            "POST", path, json=body, headers=headers, timeout=self._timeout(streaming=True)
        ) as response:
            if response.status_code != 200:
                await response.aread()
                raise _status_error(response)
            content_type = response.headers.get("content-type", "")
            if "text/event-stream" not in content_type:
                await response.aread()
                raise RequestError(
                    f"expected an event stream (text/event-stream), got content-type "
                    f"{content_type!r}: {excerpt(response.text)}"
                )
            # aclosing: leaving the loop early (at [DONE] or on an error) must close the
            # generator here, not leave it to the garbage collector on a stopped event loop.
            events = contextlib.aclosing(_sse_data(response.aiter_bytes()))
            async with events as stream:
                async for payload in stream:
                    now = time.perf_counter()
                    stall.longest_gap = max(stall.longest_gap, now - last)
                    last = now
                    if payload.strip() == b"[DONE]":
                        # The request is answered here. SGLang ends the body right after; the
                        # client closes instead of reading on to reuse the connection, which
                        # cost more client time at 64 streams than the close and connect it
                        # saved (benchmarks/bench_measurement.py, 2026-12-04).
                        t_done = now
                        break
                    try:
                        data = json.loads(payload)
                    except ValueError as exc:  # not JSON, or not UTF-8
                        why = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
                        shown = excerpt(payload.decode("utf-8", "replace"))
                        raise RequestError(
                            f"malformed event in the stream (not JSON, {why}): {shown}"
                        ) from exc
                    update = adapter.parse_event(data)
                    if update is not None:
                        timeline.apply(update, now)
        if t_done is None or timeline.finish_reason is None:
            missing = "[DONE]" if timeline.finish_reason is not None else "a final chunk"
            raise RequestError(
                f"stream ended early: server closed the connection after {timeline.tokens} "
                f"tokens without {missing}"
            )
        return t_done

    # -- plain requests: the backends' housekeeping routes --

    def url(self, path: str) -> str:
        """The URL of ``path`` as it may be shown (credentials removed)."""
        return self._display_url + path

    def get(self, path: str) -> httpx.Response:
        """``GET path`` with the client's API key and timeouts; any status is returned. A
        transport failure (refused, timed out) is a ``RequestError`` naming the URL."""
        return self._run_sync(self._get(path))

    def status_error(self, response: httpx.Response, path: str) -> RequestError:
        """The error for an unexpected status of ``path``: status, the server's message, a hint."""
        return self._status_error(response, self.url(path))

    def error(self, message: str, path: str, status: int | None = None) -> RequestError:
        """A ``RequestError`` about ``path``: ``"<url>: <message>"``, the API key masked."""
        url = self.url(path)
        return self._error(f"{url}: {message}", url, status)

    async def _get(self, path: str) -> httpx.Response:
        try:
            return await self._http.get(path)
        except httpx.HTTPError as exc:
            raise self._transport_error(exc, self._display_url + path, None) from exc

    # -- errors --

    def _error(
        self,
        message: str,
        url: str,
        status: int | None = None,
        *,
        stalled: bool = False,
        timed_out: bool = False,
    ) -> RequestError:
        if self._api_key:
            message = message.replace(self._api_key, "***")
        return RequestError(message, url=url, status=status, stalled=stalled, timed_out=timed_out)

    def _status_error(self, response: httpx.Response, url: str) -> RequestError:
        return self._error(f"{url}: {_status_error(response)}", url, response.status_code)

    def _transport_error(self, exc: httpx.HTTPError, url: str, tokens: int | None) -> RequestError:
        received = "" if tokens is None else f" after {tokens} tokens"
        if isinstance(exc, httpx.ConnectTimeout):
            why = f"could not connect within connect_timeout={self._connect_timeout:g}s"
        elif isinstance(exc, httpx.ConnectError):
            why = f"cannot connect ({exc}); is the server running and listening there?"
        elif isinstance(exc, httpx.ReadTimeout):
            why = (
                f"the server sent nothing for request_timeout={self._request_timeout:g}s "
                f"(read timeout){received}"
            )
        elif isinstance(exc, (httpx.WriteTimeout, httpx.PoolTimeout)):
            why = f"{type(exc).__name__} after request_timeout={self._request_timeout:g}s"
        elif isinstance(exc, httpx.RemoteProtocolError) and tokens is not None:
            why = f"stream ended early: server closed the connection{received} ({exc})"
        else:
            why = f"{type(exc).__name__}: {exc or 'the connection was lost'}{received}"
        return self._error(f"{url}: {why}", url, timed_out=isinstance(exc, httpx.TimeoutException))


def _status_error(response: httpx.Response) -> RequestError:
    """The error for a non-200 response: status, the server's message or a body excerpt, a hint."""
    try:
        data = response.json()
        detail = error_message(data) if isinstance(data, Mapping) else excerpt(data)
    except ValueError:
        detail = excerpt(response.text)
    hint = {
        401: "; the server wants an API key: check the one configured",
        403: "; the server rejected the API key",
        404: "; the server has no such route: is this the right server and api?",
        503: "; the server is not ready or is unhealthy",
    }.get(response.status_code, "")
    return RequestError(
        f"HTTP {response.status_code} {response.reason_phrase}: {detail or '(empty body)'}{hint}",
        status=response.status_code,
    )
