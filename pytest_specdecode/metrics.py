"""From the request records of one run to that run's metrics, and the metric registry.

Values are stored in base units (seconds, tokens per second); ``MetricInfo.display_scale`` turns
them into the unit shown to people (TTFT in ms). A metric that cannot be computed for a run is
*absent* from ``RunMetrics.values``, never zero: a non-streaming run has no TTFT or ITL, and a
server without speculative decoding has no accept length.

Definitions (n requests; c_i completion tokens; run wall time W = run t_end - run t_start):

* ``tok_s`` = Σ c_i / W: generated tokens over the wall time of the run, the seed's
  "500 tokens in 5.20s = 96.1 tok/s". Includes TTFT, gaps between requests and client overhead.
* ``decode_tok_s`` = Σ (c_i - 1) / |union of [t_first_token_i, t_end_i]|: tokens after the
  first over the time during which at least one request was decoding. For one request, or sequential
  requests, this is the per-stream decode rate with every TTFT and gap left out; for a batch
  started together it is bench_one_batch_server's ``bs·output_len / (latency - ttft)``.
  (This refines docs/architecture.md's "wall time - mean TTFT", which for several sequential
  requests would still count all but one TTFT as decode time.) Streaming runs only.
* ``accept_length`` = Σ (c_i - 1) / Σ spec_verify_ct_i: the tokens the verify steps produced
  per verify step, SGLang's own definition (the ``accept len`` of its ``Decode batch`` log line
  and the ``sglang:spec_accept_length`` gauge: accepted drafts plus the bonus token, per verify).
  Each request's first token comes from prefill, without a verify step, so it is left out: a
  draft that is always accepted at 2 steps gives exactly 3.00 at any output length. It is
  present only when the server speculates (some request reports ``spec_verify_ct``). A request
  without the field counts as 0 verify steps when it produced at most one token (SGLang 0.5.23
  omits ``spec_*`` for a request that never reached a verify step); one that produced more
  tokens without it is an error (a non-speculative server answered part of the run).
* ``spec_accept_length`` = Σ c_i / Σ spec_verify_ct_i: the per-request figure SGLang puts in
  ``meta_info.spec_accept_length`` (and SGLang's CI asserts on), aggregated verify-weighted
  (PR #34743). It counts the prefill token as well, so it reads high by c/(c-1) - 1 of the
  accept length: 3.05 instead of 3.00 at 64 tokens. Recorded beside ``accept_length`` for
  readers who compare with SGLang's per-request numbers, and because baselines of schema 1
  stored this figure under the name ``accept_length``. llama-server reports no verification
  steps per request; its backend adds the run's accept length from the server's counters
  instead (:mod:`pytest_specdecode.backends`), which is the same definition (1 + accepted
  drafts per step).
* ``ttft`` = mean of (t_first_token_i - t_start_i). Streaming runs only.
* ``tpot`` = mean over requests with c_i > 1 of (e2e_i - ttft_i) / (c_i - 1) (bench_serving).
* ``itl_p50``, ``itl_p99``: percentiles (numpy's linear interpolation, as bench_serving) over
  every token after each request's first chunk: a chunk that adds Δ tokens after a gap g
  contributes Δ samples of g/Δ (bench_serving). Streaming runs only.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from pytest_specdecode.errors import RequestError
from pytest_specdecode.request_log import RequestRecord, RunRecord


@dataclass(frozen=True)
class MetricInfo:
    """How a metric is named, shown and judged. Shown value = stored value * display_scale."""

    name: str
    label: str
    unit: str
    higher_is_better: bool
    display_scale: float = 1.0

    def display(self, value: float) -> float:
        """The value in the display ``unit``."""
        return value * self.display_scale


METRICS: Mapping[str, MetricInfo] = MappingProxyType(
    {
        info.name: info
        for info in (
            MetricInfo("tok_s", "output tok/s", "tok/s", higher_is_better=True),
            MetricInfo("decode_tok_s", "decode tok/s", "tok/s", higher_is_better=True),
            MetricInfo("accept_length", "accept length", "tokens/step", higher_is_better=True),
            MetricInfo(
                "spec_accept_length",
                "accept length per request",
                "tokens/step",
                higher_is_better=True,
            ),
            MetricInfo("ttft", "TTFT", "ms", higher_is_better=False, display_scale=1000.0),
            MetricInfo("tpot", "TPOT", "ms", higher_is_better=False, display_scale=1000.0),
            MetricInfo("itl_p50", "ITL p50", "ms", higher_is_better=False, display_scale=1000.0),
            MetricInfo("itl_p99", "ITL p99", "ms", higher_is_better=False, display_scale=1000.0),
        )
    }
)
"""Every metric, in the order reports list them."""


@dataclass(frozen=True)
class RunMetrics:
    """The metrics of one measured run; ``values`` holds only the metrics that apply."""

    run_index: int
    values: Mapping[str, float]
    n_requests: int
    completion_tokens: int
    wall_s: float

    def to_json(self) -> dict[str, object]:
        """JSON-shaped data for baselines and reports."""
        return {
            "run_index": self.run_index,
            "values": dict(self.values),
            "n_requests": self.n_requests,
            "completion_tokens": self.completion_tokens,
            "wall_s": self.wall_s,
        }


def compute_run_metrics(run: RunRecord) -> RunMetrics:
    """The metrics of one run (see the module docstring for the definitions)."""
    records = run.records
    if not records:
        raise ValueError(f"run {run.run_index + 1} has no requests; nothing to measure")
    if run.wall_s <= 0:
        raise ValueError(f"run {run.run_index + 1} has a non-positive wall time {run.wall_s!r}")
    total_tokens = sum(record.completion_tokens for record in records)
    found: dict[str, float | None] = {
        "tok_s": total_tokens / run.wall_s,
        "decode_tok_s": _decode_tok_s(records),
        **_accept_lengths(records, run.run_index),
        "ttft": _ttft(records),
        "tpot": _tpot(records),
    }
    itl = _itl_samples(records)
    if itl:
        p50, p99 = np.percentile(np.asarray(itl, dtype=float), [50.0, 99.0])
        found["itl_p50"], found["itl_p99"] = float(p50), float(p99)
    return RunMetrics(
        run_index=run.run_index,
        values={name: value for name in METRICS if (value := found.get(name)) is not None},
        n_requests=len(records),
        completion_tokens=total_tokens,
        wall_s=run.wall_s,
    )


def _decode_tok_s(records: tuple[RequestRecord, ...]) -> float | None:
    intervals = []
    for record in records:
        if record.t_first_token is None:
            return None
        intervals.append((record.t_first_token, record.t_end))
    decoding = _union_length(intervals)
    if decoding <= 0:
        return None
    return sum(max(record.completion_tokens - 1, 0) for record in records) / decoding


def _union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """The total length covered by the union of [start, end] intervals."""
    total = 0.0
    current_start = current_end = None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_start is not None and current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_start is not None and current_end is not None:
        total += current_end - current_start
    return total


def _accept_lengths(records: tuple[RequestRecord, ...], run_index: int) -> dict[str, float]:
    """``accept_length`` and ``spec_accept_length`` of a run (both absent without speculation)."""
    if all(record.spec_verify_ct is None for record in records):
        return {}
    unverified = [
        record
        for record in records
        if record.spec_verify_ct is None and record.completion_tokens > 1
    ]
    if unverified:
        raise RequestError(
            f"run {run_index + 1}: {len(unverified)} of {len(records)} requests produced more than "
            f"one token without reporting spec_verify_ct, while the others did; a speculative "
            f"SGLang server reports it on every request that reached a verify step. Are the "
            f"requests reaching different servers (a load balancer, a restart mid-run)? "
            f"Measure one server directly."
        )
    verify_steps = sum(record.spec_verify_ct or 0 for record in records)
    if verify_steps <= 0:
        return {}
    produced = sum(record.completion_tokens for record in records)
    first_tokens = sum(1 for record in records if record.completion_tokens > 0)
    return {
        "accept_length": (produced - first_tokens) / verify_steps,
        "spec_accept_length": produced / verify_steps,
    }


def _ttft(records: tuple[RequestRecord, ...]) -> float | None:
    ttfts = [record.ttft for record in records]
    if any(ttft is None for ttft in ttfts):
        return None
    return sum(ttft for ttft in ttfts if ttft is not None) / len(ttfts)


def _tpot(records: tuple[RequestRecord, ...]) -> float | None:
    per_request = []
    for record in records:
        ttft = record.ttft
        if ttft is None:
            return None
        if record.completion_tokens > 1:
            per_request.append((record.e2e - ttft) / (record.completion_tokens - 1))
    return sum(per_request) / len(per_request) if per_request else None


def _itl_samples(records: tuple[RequestRecord, ...]) -> list[float]:
    samples: list[float] = []
    for record in records:
        if record.t_first_token is None:
            continue  # non-streaming: the single entry at t_end is not an arrival gap
        points = zip(record.chunk_times, record.chunk_tokens, strict=True)
        for (t_prev, n_prev), (t_now, n_now) in itertools.pairwise(points):
            new_tokens = n_now - n_prev
            if new_tokens > 0:
                samples.extend([(t_now - t_prev) / new_tokens] * new_tokens)
    return samples
