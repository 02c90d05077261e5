"""The batching scheduler: one engine step at a time over all running sequences, on a model clock.

Timekeeping is the point of this module. The engine keeps an absolute model timeline ``now``
(event-loop seconds). Each step's deadline is the previous deadline plus the step's modelled
duration; the loop sleeps until that deadline and, when it wakes late (the event loop is busy, or
the sleep granularity is coarser than a step at high ``--sim-speed``), it runs every overdue step
back to back without sleeping. Totals therefore follow the model exactly and only the last
wake-up adds jitter. When the engine is idle its clock jumps to the next arrival.

A request that arrives at wall time t is admitted at the first step boundary at or after t, also
during catch-up. After each step every touched sequence sets its ``changed`` event; consumers
(the HTTP streams) read the current cumulative state when they wake, so a slow consumer coalesces
several steps into one chunk and the engine never waits for a client.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from pytest_specdecode.sim.logprobs import LogprobPlan
from pytest_specdecode.sim.model import StepCosts, draw_accepted_drafts
from pytest_specdecode.sim.prom import SimMetrics
from pytest_specdecode.sim.tokenizer import OutputTokens

scheduler_log = logging.getLogger("pytest_specdecode.sim.scheduler")

#: Longest stretch of back-to-back catch-up steps before the engine lets the event loop run I/O.
_MAX_CATCH_UP_SECONDS = 0.005
#: The event loop's timer granularity: epoll waits in whole milliseconds, rounded up, so an
#: ``asyncio.sleep`` ends up to 1 ms after its deadline (0.5 ms on average).
_LOOP_TIMER_RESOLUTION = 0.001
#: Up to this many running requests, a step that may finish one ends on time (see ``_sleep``).
_ON_TIME_MAX_BATCH = 4
_PREFIX_CACHE_ENTRIES = 100_000


class Sequence:
    """One request inside the engine: its plan (fixed at admission) and its progress."""

    __slots__ = (
        "aborted",
        "accept_histogram",
        "accepted_drafts",
        "admitted_at",
        "arrival",
        "cached_tokens",
        "changed",
        "doomed",
        "finish_time",
        "finished",
        "first_token_time",
        "index",
        "last_token_time",
        "log_metrics",
        "logprobs",
        "output",
        "probs",
        "prompt_key",
        "prompt_tokens",
        "rid",
        "rng",
        "speed",
        "stops_naturally",
        "target_tokens",
        "verify_ct",
    )

    def __init__(
        self,
        *,
        rid: str,
        index: int,
        prompt_tokens: int,
        prompt_key: int,
        target_tokens: int,
        stops_naturally: bool,
        probs: tuple[float, ...],
        speed: float,
        rng: random.Random,
        output: OutputTokens,
        arrival: float,
        log_metrics: bool = True,
        doomed: bool = False,
        logprobs: LogprobPlan | None = None,
    ) -> None:
        self.rid = rid
        self.index = index
        self.prompt_tokens = prompt_tokens
        self.prompt_key = prompt_key
        self.target_tokens = target_tokens
        self.stops_naturally = stops_naturally
        self.probs = probs
        self.speed = speed
        self.rng = rng
        self.output = output
        self.arrival = arrival
        self.log_metrics = log_metrics
        self.doomed = doomed
        self.logprobs = logprobs  # only reported, never used by the engine
        self.cached_tokens = 0
        self.verify_ct = 0
        self.accepted_drafts = 0
        self.accept_histogram = [0] * (len(probs) + 1)
        self.admitted_at: float | None = None
        self.first_token_time: float | None = None
        self.last_token_time = arrival
        self.finish_time: float | None = None
        self.finished = False
        self.aborted = False
        self.changed = asyncio.Event()

    @property
    def completion_tokens(self) -> int:
        return len(self.output.ids)

    @property
    def queue_time(self) -> float:
        """Seconds between arrival and admission (0 while still waiting)."""
        return 0.0 if self.admitted_at is None else self.admitted_at - self.arrival


@dataclass
class _Step:
    duration: float
    admitted: list[Sequence] | None  # a prefill step admits these; None = decode step
    new_tokens: int = 0


@dataclass
class SchedulerStats:
    """What the decode log line, /server_info and the gauges report (updated at log time)."""

    last_gen_throughput: float = 0.0
    cum_spec_accept_tokens: int = 0
    cum_spec_verify_ct: int = 0
    num_generated_tokens: int = 0

    @property
    def avg_spec_accept_length(self) -> float | None:
        if self.cum_spec_verify_ct == 0:
            return None
        return self.cum_spec_accept_tokens / self.cum_spec_verify_ct


class Engine:
    def __init__(
        self,
        *,
        costs: StepCosts,
        max_running_requests: int,
        max_prefill_tokens: int,
        max_total_num_tokens: int,
        decode_log_interval: int,
        speculative: bool,
        num_draft_tokens: int,
        disable_radix_cache: bool,
        metrics: SimMetrics | None,
        on_doomed_progress: Callable[[Sequence], None] | None = None,
        cuda_graph: bool = True,
    ) -> None:
        self._cuda_graph = cuda_graph
        self._costs = costs
        self._max_running = max_running_requests
        self._max_prefill_tokens = max_prefill_tokens
        self._max_total_num_tokens = max_total_num_tokens
        self._log_interval = decode_log_interval
        self._speculative = speculative
        self._proposed_per_verify = max(1, num_draft_tokens - 1)
        self._disable_radix_cache = disable_radix_cache
        self._metrics = metrics
        self._on_doomed_progress = on_doomed_progress
        self._inbox: deque[Sequence] = deque()
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []
        self._running_speed_sum = 0.0
        self._prefix_cache: set[int] = set()
        self._wakeup = asyncio.Event()
        self._frozen = False
        self.now = 0.0
        self.last_output_time = 0.0
        self.max_lag = 0.0
        """Largest delay (s) between a step's model deadline and the engine applying it."""
        self.stats = SchedulerStats()
        self._decode_steps = 0
        self._interval_busy = 0.0
        self._interval_tokens = 0
        self._interval_accept_tokens = 0
        self._interval_verify_ct = 0

    # -- requests -------------------------------------------------------------------------------

    def submit(self, seq: Sequence) -> None:
        self._inbox.append(seq)
        self._wakeup.set()

    def abort(self, seq: Sequence) -> None:
        """Drop a request whose client went away; it is filtered out at the next boundary."""
        if not seq.finished:
            seq.aborted = True
            seq.finished = True
            seq.changed.set()

    def freeze(self) -> None:
        """The ``hang`` fault: accept requests, never run another step."""
        self._frozen = True

    @property
    def num_running(self) -> int:
        return sum(1 for seq in self._running if not seq.aborted)

    @property
    def num_waiting(self) -> int:
        return sum(1 for seq in (*self._waiting, *self._inbox) if not seq.aborted)

    @property
    def num_tokens(self) -> int:
        """Tokens held by running requests (prompt and output)."""
        return sum(seq.prompt_tokens + seq.completion_tokens for seq in self._running)

    def flush_cache(self) -> bool:
        """SGLang's flush: refused while requests run or wait; clears the cache and spec stats."""
        if self.num_running or self.num_waiting:
            scheduler_log.warning(
                "Cache not flushed because there are pending requests. "
                "#queue-req: %d, #running-req: %d",
                self.num_waiting,
                self.num_running,
            )
            return False
        self._prefix_cache.clear()
        self.stats.cum_spec_accept_tokens = 0
        self.stats.cum_spec_verify_ct = 0
        self.stats.num_generated_tokens = 0
        self._interval_accept_tokens = 0
        self._interval_verify_ct = 0
        scheduler_log.info("Cache flushed successfully!")
        return True

    # -- the loop -------------------------------------------------------------------------------

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self.now = loop.time()
        burst_start = loop.time()
        while True:
            self._admit_arrivals()
            if self._frozen or not (self._running or self._waiting):
                if self._inbox and not self._frozen:
                    # Idle: the model clock jumps to the next arrival.
                    self.now = max(self.now, self._inbox[0].arrival)
                    continue
                self._wakeup.clear()
                await self._wakeup.wait()
                burst_start = loop.time()
                continue
            step = self._plan()
            if step is None:
                continue
            deadline = self.now + step.duration
            on_time = self._may_finish(step)
            delay = deadline - loop.time()
            if delay > 0:
                await self._sleep_until(deadline, delay, on_time)
                burst_start = loop.time()
            elif loop.time() - burst_start > _MAX_CATCH_UP_SECONDS:
                # Still behind: catch up, but let the HTTP side breathe now and then.
                await asyncio.sleep(0)
                burst_start = loop.time()
            self.now = deadline
            self.max_lag = max(self.max_lag, loop.time() - deadline)
            self._interval_busy += step.duration
            if step.admitted is not None:
                self._apply_prefill(step)
            else:
                self._apply_decode(step.duration)
            self.last_output_time = loop.time()

    async def _sleep_until(self, deadline: float, delay: float, on_time: bool) -> None:
        """Sleep until ``deadline``; with ``on_time``, to within the kernel's timer slack.

        A request's last token is the end of its measured time, and the next request of a
        sequential client starts only after it: the loop's up-to-1-ms lateness there is host
        time in every request, which ``--sim-speed 10`` makes ten times the share a GPU
        server's own host would have. So a step that may finish a request sleeps the bulk on
        the loop and blocks for the last millisecond; other steps keep the coarse timer (their
        lateness does not add up: deadlines follow the model clock).
        """
        if not on_time:
            await asyncio.sleep(delay)
            return
        coarse = delay - _LOOP_TIMER_RESOLUTION
        if coarse > 0:
            await asyncio.sleep(coarse)
        rest = deadline - asyncio.get_running_loop().time()
        if rest > 0:
            time.sleep(rest)  # at most about 1 ms, and only at small batches

    def _may_finish(self, step: _Step) -> bool:
        """Whether ``step`` can complete a request, at a batch small enough to time it exactly
        (:data:`_ON_TIME_MAX_BATCH`; a larger batch's requests overlap, so one request's end
        is not the end of the client's wait, and blocking the loop would slow the streams)."""
        if step.admitted is not None:
            batch = step.admitted
            if len(batch) > _ON_TIME_MAX_BATCH:
                return False
            return any(seq.target_tokens <= 1 for seq in batch)
        if len(self._running) > _ON_TIME_MAX_BATCH:
            return False
        speculative = self._speculative
        return any(
            seq.target_tokens - seq.completion_tokens <= (len(seq.probs) + 1 if speculative else 1)
            for seq in self._running
        )

    def _admit_arrivals(self) -> None:
        inbox, now = self._inbox, self.now
        while inbox and inbox[0].arrival <= now:
            seq = inbox.popleft()
            if not seq.aborted:
                self._waiting.append(seq)

    def _plan(self) -> _Step | None:
        """The next step and its duration, or None when aborts left nothing to run."""
        waiting = self._waiting
        while waiting and waiting[0].aborted:
            waiting.popleft()
        if any(seq.aborted for seq in self._running):
            self._running = [seq for seq in self._running if not seq.aborted]
            self._running_speed_sum = sum(seq.speed for seq in self._running)
        free = self._max_running - len(self._running)
        if waiting and free > 0:
            admitted: list[Sequence] = []
            new_tokens = 0
            while waiting and len(admitted) < free:
                seq = waiting[0]
                if seq.aborted:
                    waiting.popleft()
                    continue
                cached = 0
                if not self._disable_radix_cache and seq.prompt_key in self._prefix_cache:
                    cached = seq.prompt_tokens - 1  # the last prompt token is always recomputed
                uncached = seq.prompt_tokens - cached
                if admitted and new_tokens + uncached > self._max_prefill_tokens:
                    break
                waiting.popleft()
                seq.admitted_at = self.now
                seq.cached_tokens = cached
                new_tokens += uncached
                admitted.append(seq)
            if admitted:
                speed = sum(seq.speed for seq in admitted) / len(admitted)
                return _Step(self._costs.prefill(new_tokens) / speed, admitted, new_tokens)
        batch = len(self._running)
        if batch == 0:
            return None
        speed = self._running_speed_sum / batch
        return _Step(self._costs.decode(batch) / speed, None)

    def _apply_prefill(self, step: _Step) -> None:
        assert step.admitted is not None
        now = self.now
        cached_total = 0
        for seq in step.admitted:
            cached_total += seq.cached_tokens
            if len(self._prefix_cache) >= _PREFIX_CACHE_ENTRIES:
                self._prefix_cache.clear()
            self._prefix_cache.add(seq.prompt_key)
            if seq.aborted:
                continue
            seq.first_token_time = now
            if seq.target_tokens > 0:
                seq.output.extend(1)
                seq.last_token_time = now
                if self._metrics is not None and seq.log_metrics:
                    self._metrics.observe_time_to_first_token(now - seq.arrival)
            if seq.completion_tokens >= seq.target_tokens and not self._crashes_now(seq):
                self._finish(seq)
            else:
                self._running.append(seq)
                self._running_speed_sum += seq.speed
            seq.changed.set()
        scheduler_log.info(
            "Prefill batch, #new-seq: %d, #new-token: %d, #cached-token: %d, "
            "token usage: %.2f, #running-req: %d, #queue-req: %d, #pending-token: 0, "
            "cuda graph: %s, input throughput (token/s): %.2f",
            len(step.admitted),
            step.new_tokens,
            cached_total,
            self._token_usage(),
            len(self._running),
            len(self._waiting) + len(self._inbox),
            self._cuda_graph,
            step.new_tokens / step.duration if step.duration > 0 else 0.0,
        )

    def _apply_decode(self, duration: float) -> None:
        now = self.now
        metrics = self._metrics
        speculative = self._speculative
        produced = 0
        finished_any = False
        for seq in self._running:
            if seq.aborted:
                finished_any = True
                continue
            remaining = seq.target_tokens - seq.completion_tokens
            if speculative:
                accepted = draw_accepted_drafts(seq.rng, seq.probs)
                tokens = min(accepted + 1, remaining)
                seq.verify_ct += 1
                seq.accepted_drafts += tokens - 1
                seq.accept_histogram[tokens - 1] += 1
                self._interval_verify_ct += 1
                # The server-wide accept length counts what the verify accepted, also where the
                # request needed fewer tokens (SGLang trims the output after verifying).
                self._interval_accept_tokens += accepted + 1
            else:
                tokens = 1
            seq.output.extend(tokens)
            produced += tokens
            if metrics is not None and seq.log_metrics:
                metrics.observe_inter_token_latency((now - seq.last_token_time) / tokens, tokens)
            seq.last_token_time = now
            if self._crashes_now(seq):
                pass  # the server freezes the engine and dies: this request never finishes
            elif seq.completion_tokens >= seq.target_tokens:
                self._finish(seq)
                finished_any = True
            seq.changed.set()
        if finished_any:
            self._running = [seq for seq in self._running if not seq.finished]
            self._running_speed_sum = sum(seq.speed for seq in self._running)
        self._interval_tokens += produced
        self._decode_steps += 1
        if self._decode_steps % self._log_interval == 0:
            self._log_decode_stats()

    def _crashes_now(self, seq: Sequence) -> bool:
        """``crash-after:N``: the doomed request crashes the server after a few tokens, and
        before its last one, so it is always still being served when the process dies."""
        if not seq.doomed or self._on_doomed_progress is None:
            return False
        if seq.completion_tokens < min(4, seq.target_tokens - 1):
            return False
        self._on_doomed_progress(seq)
        return True

    def _finish(self, seq: Sequence) -> None:
        seq.finished = True
        seq.finish_time = self.now
        self.stats.num_generated_tokens += seq.completion_tokens
        if self._metrics is not None and seq.log_metrics:
            self._metrics.observe_finished_request(
                prompt_tokens=seq.prompt_tokens,
                generation_tokens=seq.completion_tokens,
                cached_tokens=seq.cached_tokens,
                e2e_latency=self.now - seq.arrival,
            )

    def _token_usage(self) -> float:
        used = sum(seq.prompt_tokens + seq.completion_tokens for seq in self._running)
        return used / self._max_total_num_tokens

    def _log_decode_stats(self) -> None:
        """SGLang's decode log line; the cumulative spec counters fold in only here.

        The throughput is over the engine's busy time in the interval (idle gaps between
        requests would otherwise dilute it), in wall tokens/s, i.e. including --sim-speed.
        """
        busy = self._interval_busy
        throughput = self._interval_tokens / busy if busy > 0 else 0.0
        stats = self.stats
        stats.last_gen_throughput = throughput
        running = len(self._running)
        used_tokens = sum(seq.prompt_tokens + seq.completion_tokens for seq in self._running)
        usage = used_tokens / self._max_total_num_tokens
        queued = len(self._waiting) + len(self._inbox)
        accept_part = ""
        accept_length = accept_rate = None
        if self._speculative and self._interval_verify_ct:
            accept_length = self._interval_accept_tokens / self._interval_verify_ct
            accept_rate = (self._interval_accept_tokens - self._interval_verify_ct) / (
                self._interval_verify_ct * self._proposed_per_verify
            )
            stats.cum_spec_accept_tokens += self._interval_accept_tokens
            stats.cum_spec_verify_ct += self._interval_verify_ct
            accept_part = f"accept len: {accept_length:.2f}, accept rate: {accept_rate:.2f}, "
        scheduler_log.info(
            "Decode batch, #running-req: %d, #token: %d, token usage: %.2f, %s"
            "cuda graph: %s, gen throughput (token/s): %.2f, #queue-req: %d",
            running,
            used_tokens,
            usage,
            accept_part,
            self._cuda_graph,
            throughput,
            queued,
        )
        if self._metrics is not None:
            self._metrics.set_scheduler_gauges(
                num_running_reqs=running,
                num_queue_reqs=queued,
                num_used_tokens=used_tokens,
                token_usage=usage,
                gen_throughput=throughput,
                spec_accept_length=accept_length,
                spec_accept_rate=accept_rate,
            )
        self._interval_busy = 0.0
        self._interval_tokens = 0
        self._interval_accept_tokens = 0
        self._interval_verify_ct = 0
