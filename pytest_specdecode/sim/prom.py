"""Prometheus metrics with SGLang's names (``--enable-metrics``), in a per-server registry.

Token counters and latency histograms are updated as requests progress (tokenizer side in
SGLang); scheduler gauges are set only when a decode log line is printed, as upstream does, so
they are stale between log lines.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0)
_ITL_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25)
_E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0)


class SimMetrics:
    def __init__(self, model_name: str) -> None:
        # SGLang exports no ``*_created`` series (real 0.5.15's /metrics has none).
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["model_name"]
        self._label = {"model_name": model_name}
        registry = self.registry

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=registry)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=registry)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=registry)

        self.prompt_tokens = counter("sglang:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter(
            "sglang:generation_tokens", "Number of generation tokens processed."
        )
        self.cached_tokens = counter(
            "sglang:cached_tokens", "Number of cached prompt tokens (prefix cache hits)."
        )
        self.num_requests = counter("sglang:num_requests", "Number of requests processed.")
        self.time_to_first_token = histogram(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            _TTFT_BUCKETS,
        )
        self.inter_token_latency = histogram(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            _ITL_BUCKETS,
        )
        self.e2e_request_latency = histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            _E2E_BUCKETS,
        )
        self.num_running_reqs = gauge("sglang:num_running_reqs", "The number of running requests.")
        self.num_queue_reqs = gauge("sglang:num_queue_reqs", "The number of requests in the queue.")
        self.num_used_tokens = gauge("sglang:num_used_tokens", "The number of used tokens.")
        self.token_usage = gauge("sglang:token_usage", "The token usage.")
        self.gen_throughput = gauge("sglang:gen_throughput", "The generation throughput (token/s).")
        self.spec_accept_length = gauge(
            "sglang:spec_accept_length", "The average acceptance length of speculative decoding."
        )
        self.spec_accept_rate = gauge(
            "sglang:spec_accept_rate", "The average acceptance rate of speculative decoding."
        )
        # Create the labelled children now so every series is exported from the start.
        for metric in (
            self.prompt_tokens,
            self.generation_tokens,
            self.cached_tokens,
            self.num_requests,
            self.num_running_reqs,
            self.num_queue_reqs,
            self.num_used_tokens,
            self.token_usage,
            self.gen_throughput,
            self.spec_accept_length,
            self.spec_accept_rate,
        ):
            metric.labels(**self._label)
        self._ttft = self.time_to_first_token.labels(**self._label)
        self._itl = self.inter_token_latency.labels(**self._label)
        self._e2e = self.e2e_request_latency.labels(**self._label)

    def observe_time_to_first_token(self, seconds: float) -> None:
        self._ttft.observe(seconds)

    def observe_inter_token_latency(self, seconds_per_token: float, tokens: int) -> None:
        # Like SGLang: a chunk of n tokens counts as n latencies of interval / n.
        for _ in range(tokens):
            self._itl.observe(seconds_per_token)

    def observe_finished_request(
        self, *, prompt_tokens: int, generation_tokens: int, cached_tokens: int, e2e_latency: float
    ) -> None:
        label = self._label
        self.prompt_tokens.labels(**label).inc(prompt_tokens)
        self.generation_tokens.labels(**label).inc(generation_tokens)
        self.cached_tokens.labels(**label).inc(cached_tokens)
        self.num_requests.labels(**label).inc()
        self._e2e.observe(e2e_latency)

    def set_scheduler_gauges(
        self,
        *,
        num_running_reqs: int,
        num_queue_reqs: int,
        num_used_tokens: int,
        token_usage: float,
        gen_throughput: float,
        spec_accept_length: float | None,
        spec_accept_rate: float | None,
    ) -> None:
        label = self._label
        self.num_running_reqs.labels(**label).set(num_running_reqs)
        self.num_queue_reqs.labels(**label).set(num_queue_reqs)
        self.num_used_tokens.labels(**label).set(num_used_tokens)
        self.token_usage.labels(**label).set(token_usage)
        self.gen_throughput.labels(**label).set(gen_throughput)
        if spec_accept_length is not None:
            self.spec_accept_length.labels(**label).set(spec_accept_length)
        if spec_accept_rate is not None:
            self.spec_accept_rate.labels(**label).set(spec_accept_rate)

    def exposition(self) -> bytes:
        result: bytes = generate_latest(self.registry)
        return result
