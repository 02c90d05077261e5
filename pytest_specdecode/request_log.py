"""What happened to each request of a measured run: the contract between the measurement client
(:mod:`pytest_specdecode.client`, which fills these in) and the metrics
(:mod:`pytest_specdecode.metrics`, which reads them). Plain frozen data, so the measurement core
(metrics, stats, verdicts) never needs httpx.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class RequestRecord:
    """What happened to one request. Times are ``time.perf_counter()`` seconds.

    ``chunk_times``/``chunk_tokens`` hold the arrival time and the *cumulative* completion tokens
    of every stream chunk that added tokens (non-streaming: one entry at ``t_end``).
    ``t_first_token`` is the arrival of the first chunk with >= 1 token; None when not streaming.
    ``spec`` holds every spec field other than ``spec_verify_ct`` (names vary by SGLang era).
    """

    prompt_kind: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None
    t_start: float
    t_first_token: float | None
    t_end: float
    chunk_times: tuple[float, ...]
    chunk_tokens: tuple[int, ...]
    spec_verify_ct: int | None
    spec: Mapping[str, object]
    finish_reason: str | None
    server_e2e_latency: float | None

    @property
    def ttft(self) -> float | None:
        """Time to first token (s), or None for a non-streaming request."""
        return None if self.t_first_token is None else self.t_first_token - self.t_start

    @property
    def e2e(self) -> float:
        """End-to-end latency as the client saw it (s)."""
        return self.t_end - self.t_start


@dataclass(frozen=True)
class RunRecord:
    """The requests of one measured run; ``t_start`` (the first send) and ``t_end`` (the last
    answer: a stream's ``[DONE]``, a response's last byte) bracket the whole run."""

    records: tuple[RequestRecord, ...]
    t_start: float
    t_end: float
    run_index: int

    @property
    def wall_s(self) -> float:
        """Wall time of the whole run (s), the denominator of tok/s."""
        return self.t_end - self.t_start
