"""What differs between the servers the plugin measures, and nothing else: SGLang (real or
simulated) and llama.cpp's ``llama-server``.

A :class:`Backend` owns the log phases its server prints while loading, the health routes, the
protocol adapter of a workload's api (:mod:`pytest_specdecode.adapters`), the server's own
description (:meth:`Backend.server_info`), the check of a running server against its profile,
and what each measured run needs around it (:meth:`Backend.begin_run` /
:meth:`Backend.end_run`). :func:`backend_for` picks one from the profile's launcher.

Everything downstream (metrics, statistics, baselines, verdicts, reports) is one path for every
backend: a run is its :class:`~pytest_specdecode.client.RequestRecord`\\ s plus the metric values
a backend adds in :class:`RunExtras`.

Accept length, the one metric the backends measure differently:

* SGLang: Σ completion_tokens / Σ ``spec_verify_ct`` over the run's requests, from each
  request's own ``meta_info`` (:mod:`pytest_specdecode.metrics`); the backend adds nothing.
* llama.cpp: llama-server reports verification steps only in its Prometheus counters
  (``--metrics``), so the backend scrapes ``/metrics`` before and after every run:
  accept length = 1 + Δ``spec_decode_num_accepted_tokens_total`` /
  Δ``spec_decode_num_drafts_total`` (llama-server's own "mean len": tokens per verification
  step, the target's own token included). The counters are server-wide, so they are
  cross-checked against the run's responses: Δ``num_draft_tokens`` must equal
  Σ ``timings.draft_n`` and Δaccepted Σ ``timings.draft_n_accepted``, up to the rounding of
  the printed counters (6 significant digits). A difference means requests other than the
  run's reached the server while it was measured, which makes both the accept length and the
  throughput someone else's too; the run fails with a ``RequestError`` saying so rather than
  report a number that is not this run's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from pytest_specdecode.adapters import LlamaCppCompletions, ProtocolAdapter, adapter_for, excerpt
from pytest_specdecode.errors import ConfigError, RequestError
from pytest_specdecode.profiles.kinds.llamacpp import LAUNCHER as LLAMACPP
from pytest_specdecode.profiles.profile import ArgMismatch, ServerProfile, compare_server_args
from pytest_specdecode.workloads import APIS, Workload

if TYPE_CHECKING:
    from pytest_specdecode.client import MeasurementClient
    from pytest_specdecode.request_log import RunRecord

# (substring of a log line, the phase it starts[, the phase of its 2nd occurrence]) for SGLang
# 0.5.6 through 0.5.23, read in their sources and in real 0.5.15's log. The last matching line
# wins, so the order only documents. Up to 0.5.13 each model loads, allocates its KV cache and
# captures its graphs in turn (target, then draft); from 0.5.14 both models load first, then
# both KV caches, then the target's graphs (prefill first), then the draft's. Every TP rank logs
# the ModelRunner lines; the phase is the same on all of them.
SGLANG_PHASES: tuple[tuple[str, ...], ...] = (
    # target, then the draft (0.5.6-0.5.20; "Init parallel begin" from 0.5.21)
    ("Init torch distributed begin", "initialising torch.distributed", "initialising the draft"),
    ("Init parallel begin", "initialising torch.distributed", "initialising the draft"),
    (
        "Load weight begin",
        "loading the target model's weights",
        "loading the draft model's weights",
    ),
    ("Load weight end", "weights loaded"),
    ("KV Cache is allocated", "allocating the KV cache"),  # also "Full KV Cache is allocated"
    ("FlashInfer autotune", "autotuning FlashInfer kernels"),
    ("DeepGEMM JIT", "compiling DeepGEMM kernels (JIT)"),
    ("Compiling a graph for", "compiling with torch.compile"),
    # <= 0.5.13: one line per model and graph kind
    ("Capture cuda graph begin", "capturing the target's CUDA graphs"),
    ("Capture piecewise CUDA graph begin", "capturing the target's piecewise CUDA graphs"),
    ("Capture draft cuda graph begin", "capturing the draft's CUDA graphs"),
    ("Capture draft extend cuda graph begin", "capturing the draft's extend CUDA graphs"),
    # >= 0.5.14: "Capture {target|draft} {prefill|decode|verify|extend} CUDA graph begin"
    ("Capture target prefill CUDA graph begin", "capturing the target's prefill CUDA graphs"),
    ("Capture target decode CUDA graph begin", "capturing the target's decode CUDA graphs"),
    ("Capture target verify CUDA graph begin", "capturing the target's verify CUDA graphs"),
    ("Capture draft prefill CUDA graph begin", "capturing the draft's prefill CUDA graphs"),
    ("Capture draft decode CUDA graph begin", "capturing the draft's decode CUDA graphs"),
    ("Capture draft extend CUDA graph begin", "capturing the draft's extend CUDA graphs"),
    ("] max_total_num_tokens=", "starting the HTTP server"),
    # /health answers 503 from here until the warm-up /generate has returned (a 1-token
    # generate per probe, about 1 s each, on real 0.5.15)
    ("Uvicorn running on", "warming up"),
    ("fired up and ready to roll", "ready"),
)
# No phase for failure lines ("Initialization failed", "Received sigquit"): a server that dies
# is reported with the phase it died in, which the line before its traceback set.

SGLANG_PORT_RANGE = (10000, 20800)
"""Main ports every SGLang 0.5.6-0.5.23 accepts and that do not collide with the ports it picks
itself (sglang-api.md §5, read in the releases' ``srt/server_args.py``):

* 0.5.11-0.5.15 derive a gRPC port ``port + 10000`` even with gRPC off and refuse a main port
  above 55535 (``SGLANG_GRPC_PORT (66661) must be between 1 and 65535``: 2 of 10 random ports
  died on an H200);
* the NCCL/TCPStore port is ``port + randint(100, 1000)`` (0.5.6-0.5.8), an OS ephemeral port
  (0.5.9-0.5.21, Linux 32768-60999) or a random port in 22000-29999 (0.5.22+), and TP > 1 binds
  ZMQ ports in 49152-65535: a main port in those ranges could be taken before the server binds
  it, which it does last, after the load;
* 6789, 8998 and 29600 are SGLang's fixed bootstrap and store ports (special modes only).
"""

SGLANG_DP_ATTENTION_OFFSETS = (13, *range(233, 240))
"""With ``--enable-dp-attention`` SGLang binds ``port + 13`` (the DP handshake) and ``port + 233``
to ``port + 239`` (ZMQ over TCP) as well, and fails if they are taken."""


LLAMACPP_PHASES: tuple[tuple[str, ...], ...] = (
    ("load_model: loading model", "loading the model"),
    ("loading draft model", "loading the draft model"),
    ("load_model: initializing, n_slots", "allocating slots and the KV cache"),
    ("llama_server: model loaded", "starting the HTTP server"),
    ("llama_server: listening on", "ready"),
    ("exiting due to", "failed"),
)
"""(substring of a log line, the phase it starts), in the order llama-server prints them."""

SPEC_PREFIX = "llamacpp:spec_decode_"
DRAFTS = SPEC_PREFIX + "num_drafts_total"  # verification steps
DRAFT_TOKENS = SPEC_PREFIX + "num_draft_tokens_total"
ACCEPTED = SPEC_PREFIX + "num_accepted_tokens_total"
PRINTED_DIGITS = 6
"""llama-server prints its counters through a default C++ stream: 6 significant digits, so a
counter above 999999 is rounded (``1.23457e+06``)."""


@dataclass(frozen=True)
class RunExtras:
    """What a backend adds to one run's metrics: metric values and warnings."""

    values: Mapping[str, float] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()


class Backend(Protocol):
    """One kind of server. An instance serves one profile for one measurement."""

    @property
    def name(self) -> str: ...

    @property
    def log_phases(self) -> Sequence[tuple[str, ...]]:
        """(substring of a log line, the loading phase it starts), for the progress line."""
        ...

    @property
    def health_paths(self) -> tuple[str, ...]:
        """The readiness probes, in order of preference (a 404 moves to the next)."""
        ...

    @property
    def default_port(self) -> int:
        """The server's own default port (for ``--server-host HOST`` without a port)."""
        ...

    def adapter(self, api: str, *, model: str | None = None) -> ProtocolAdapter:
        """The protocol adapter for a workload's ``api``."""
        ...

    @property
    def port_range(self) -> tuple[int, int] | None:
        """Where a launch port must lie for this server kind (None: any free port)."""
        ...

    def derived_ports(self, port: int) -> tuple[int, ...]:
        """The other ports a server launched on ``port`` binds, which must be free too."""
        ...

    def server_info(self, client: MeasurementClient) -> dict[str, Any]:
        """What the server says about itself; ``version`` is recorded as a soft field."""
        ...

    def compare_args(
        self, profile: ServerProfile, info: Mapping[str, Any], *, attached: bool
    ) -> list[ArgMismatch]:
        """Where the running server contradicts the profile. For a server the plugin launched
        only what the launch cannot guarantee is checked."""
        ...

    def unverifiable(self, profiles: Sequence[ServerProfile]) -> str:
        """What an attached server of ``profiles`` cannot show about itself (said once, in the
        session header)."""
        ...

    def begin_run(self, client: MeasurementClient, workload: Workload) -> object:
        """Just before a measured run; returns what :meth:`end_run` needs."""
        ...

    def end_run(self, client: MeasurementClient, state: object, run: RunRecord) -> RunExtras:
        """Just after a measured run: extra metric values and warnings."""
        ...


def backend_for(profile: ServerProfile) -> Backend:
    """The backend its kind names (``ServerKind.backend``): llama.cpp for ``launcher =
    "llamacpp"``, SGLang (real or simulated) for the others."""
    return BACKENDS[profile.kind.backend](profile)


# -- SGLang ------------------------------------------------------------------------------------


class SglangBackend:
    """SGLang and the simulated SGLang server: ``/generate`` or ``/v1/completions``, accept
    length from each request's ``spec_verify_ct``, ``/flush_cache`` before each run."""

    name = "sglang"
    log_phases = SGLANG_PHASES
    health_paths = ("/health_generate", "/health")
    default_port = 30000

    def __init__(self, profile: ServerProfile) -> None:
        self.profile = profile
        self.flush_supported: bool | None = None  # None until flush_cache was called

    def adapter(self, api: str, *, model: str | None = None) -> ProtocolAdapter:
        return adapter_for(api, model=model)

    port_range = SGLANG_PORT_RANGE

    def derived_ports(self, port: int) -> tuple[int, ...]:
        """None in the common case: single-node SGLang talks to its own processes over IPC
        files; with ``--enable-dp-attention`` :data:`SGLANG_DP_ATTENTION_OFFSETS`."""
        if "--enable-dp-attention" in self.profile.extra_args:
            return tuple(port + offset for offset in SGLANG_DP_ATTENTION_OFFSETS)
        return ()

    def server_info(self, client: MeasurementClient) -> dict[str, Any]:
        """``GET /server_info`` (SGLang >= 0.5.5), falling back to ``/get_server_info``."""
        for path in ("/server_info", "/get_server_info"):
            response = client.get(path)
            if response.status_code == 404:
                continue
            if response.status_code != 200:
                raise client.status_error(response, path)
            return _json_dict(client, response, path)
        raise client.error(
            "neither /server_info nor /get_server_info exists (HTTP 404); is this an SGLang "
            "server?",
            "/server_info",
            404,
        )

    def compare_args(
        self, profile: ServerProfile, info: Mapping[str, Any], *, attached: bool
    ) -> list[ArgMismatch]:
        return compare_server_args(profile, info) if attached else []

    def unverifiable(self, profiles: Sequence[ServerProfile]) -> str:
        return (
            f"an SGLang server does not report its environment: the NCCL variables of env "
            f"{_env_sets(profiles)} cannot be verified remotely and are taken on trust"
        )

    def begin_run(self, client: MeasurementClient, workload: Workload) -> object:
        if workload.flush_cache:
            self.flush_cache(client)
        return None

    def end_run(self, client: MeasurementClient, state: object, run: RunRecord) -> RunExtras:
        return RunExtras()  # accept length comes from the requests (metrics.py)

    def flush_cache(
        self, client: MeasurementClient, *, timeout: float = 30.0, retry_interval: float = 0.5
    ) -> bool:
        """``GET /flush_cache``; retries while the server answers 400 (requests still running)
        until ``timeout``. Returns False (and remembers it) if the server has no such route."""
        if self.flush_supported is False:
            return False
        deadline = time.monotonic() + timeout
        while True:
            response = client.get("/flush_cache")
            if response.status_code == 200:
                self.flush_supported = True
                return True
            if response.status_code == 404:
                self.flush_supported = False
                return False
            if response.status_code != 400:
                raise client.status_error(response, "/flush_cache")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise client.error(
                    f"the server stayed busy (HTTP 400: requests running or waiting) for "
                    f"{timeout:g}s, so the cache was not flushed; is another client sending "
                    f"requests to this server?",
                    "/flush_cache",
                    400,
                )
            time.sleep(min(retry_interval, remaining))


# -- llama.cpp ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpecCounters:
    """llama-server's speculative-decoding counters at one moment (as printed)."""

    drafts: float  # verification steps
    draft_tokens: float
    accepted: float

    @classmethod
    def parse(cls, text: str) -> SpecCounters:
        """From ``/metrics`` text; ``ValueError`` naming a missing counter."""
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith(SPEC_PREFIX):
                name, _, value = line.rpartition(" ")
                try:
                    values[name.strip()] = float(value)
                except ValueError:
                    continue
        missing = [name for name in (DRAFTS, DRAFT_TOKENS, ACCEPTED) if name not in values]
        if missing:
            raise ValueError(f"no {', '.join(missing)} in its /metrics")
        return cls(values[DRAFTS], values[DRAFT_TOKENS], values[ACCEPTED])


def printed_error(value: float) -> float:
    """The most a counter printed with :data:`PRINTED_DIGITS` significant digits can be off."""
    if abs(value) < 10**PRINTED_DIGITS:
        return 0.0  # an integer below 10^6 is printed exactly
    return 0.5 * 10.0 ** (math.floor(math.log10(abs(value))) - PRINTED_DIGITS + 1)


def llamacpp_run_extras(
    before: SpecCounters, after: SpecCounters, run: RunRecord, *, where: str
) -> RunExtras:
    """The accept length of one run from the counters around it, cross-checked against the
    run's responses (see the module docstring). ``where`` names the run in messages."""
    deltas = {
        "verification steps": (before.drafts, after.drafts),
        "draft tokens": (before.draft_tokens, after.draft_tokens),
        "accepted tokens": (before.accepted, after.accepted),
    }
    slack = {name: printed_error(a) + printed_error(b) for name, (a, b) in deltas.items()}
    delta = {name: b - a for name, (a, b) in deltas.items()}
    if any(delta[name] < -slack[name] for name in delta):
        raise RequestError(
            f"{where}: llama-server's speculative counters went backwards during the run "
            f"({before} -> {after}): the server was restarted while it was measured"
        )
    reported = {
        "draft tokens": sum(_spec_count(r.spec, "draft_n") for r in run.records),
        "accepted tokens": sum(_spec_count(r.spec, "draft_n_accepted") for r in run.records),
    }
    if any(abs(delta[name] - reported[name]) > slack[name] for name in reported):
        raise RequestError(
            f"{where}: llama-server's counters moved by {delta['accepted tokens']:g} accepted "
            f"of {delta['draft tokens']:g} draft tokens during the run, but the run's "
            f"{len(run.records)} responses report {reported['accepted tokens']} of "
            f"{reported['draft tokens']} (timings.draft_n_accepted / draft_n): requests other "
            "than this run's reached the server while it was measured (another client, or a "
            "server shared with other tests), so neither the accept length nor the throughput "
            "is this run's alone. Measure a server nobody else uses"
        )
    steps = delta["verification steps"]
    if steps <= 0:
        return RunExtras(
            warnings=(
                f"{where}: llama-server verified no draft during the run "
                f"({DRAFTS} did not move), so it has no accept length",
            )
        )
    warnings: tuple[str, ...] = ()
    accept_length = 1.0 + delta["accepted tokens"] / steps
    # d(1 + A/S) = dA/S + A dS/S^2, relative to the accept length
    uncertainty = (
        slack["accepted tokens"] / steps
        + delta["accepted tokens"] * slack["verification steps"] / steps**2
    ) / accept_length
    if uncertainty > 0.005:
        warnings = (
            f"{where}: llama-server's counters are past 10^{PRINTED_DIGITS} and printed with "
            f"{PRINTED_DIGITS} significant digits, so the accept length is uncertain by up to "
            f"±{uncertainty:.1%}; restart the server to reset them",
        )
    return RunExtras(values={"accept_length": accept_length}, warnings=warnings)


class LlamaCppBackend:
    """llama.cpp's ``llama-server``: ``/v1/completions``, readiness by ``/health`` (503 while
    loading), accept length from the Prometheus counters around each run."""

    name = LLAMACPP
    log_phases = LLAMACPP_PHASES
    health_paths = ("/health",)
    default_port = 8080

    def __init__(self, profile: ServerProfile) -> None:
        self.profile = profile
        options = profile.llamacpp
        self.speculative = options is not None and options.speculative is not None

    def adapter(self, api: str, *, model: str | None = None) -> ProtocolAdapter:
        """Every api goes to ``/v1/completions`` (llama-server has no SGLang ``/generate``),
        streaming for the ``-stream`` apis, so the built-in workloads work unchanged."""
        if api not in APIS:
            raise ConfigError(f"unknown api {api!r}; choose one of {', '.join(APIS)}")
        return LlamaCppCompletions(streaming=api.endswith("-stream"), model=model)

    port_range = None  # llama-server binds one port and derives none: any free port

    def derived_ports(self, port: int) -> tuple[int, ...]:
        return ()

    def server_info(self, client: MeasurementClient) -> dict[str, Any]:
        """``/props`` and ``/slots`` in one dict: ``backend``, ``version`` (``build_info``),
        ``model_path``, ``n_ctx`` (per slot), ``total_slots`` and ``speculative`` (whether every
        slot can speculate; None with ``--no-slots``)."""
        response = client.get("/props")
        if response.status_code == 404:
            raise client.error(
                "there is no /props (HTTP 404); is this a llama.cpp llama-server?", "/props", 404
            )
        if response.status_code != 200:
            raise client.status_error(response, "/props")
        props = _json_dict(client, response, "/props")
        settings = props.get("default_generation_settings")
        settings = settings if isinstance(settings, Mapping) else {}
        speculative: bool | None = None
        slots_response = client.get("/slots")
        if slots_response.status_code == 200:
            try:
                slots = slots_response.json()
            except ValueError:
                slots = None
            if isinstance(slots, list) and slots:
                speculative = all(
                    isinstance(slot, Mapping) and slot.get("speculative") is True for slot in slots
                )
        elif slots_response.status_code != 501:  # 501: started with --no-slots
            raise client.status_error(slots_response, "/slots")
        return {
            "backend": LLAMACPP,
            "version": props.get("build_info"),
            "model_path": props.get("model_path"),
            "n_ctx": settings.get("n_ctx"),
            "total_slots": props.get("total_slots"),
            "speculative": speculative,
        }

    def compare_args(
        self, profile: ServerProfile, info: Mapping[str, Any], *, attached: bool
    ) -> list[ArgMismatch]:
        """Speculation on or off, always: llama-server that cannot set up the draft model (a
        draft that is not EAGLE-3 for ``draft-eagle3``) logs an error and serves without
        speculation. For an attached server also the model path, slots and context."""
        mismatches = []
        spec_reported = info.get("speculative")
        if spec_reported is not None and spec_reported != self.speculative:
            mismatches.append(ArgMismatch("speculative", self.speculative, spec_reported))
        elif spec_reported is None and attached and self.speculative:
            mismatches.append(ArgMismatch("speculative", True, None, reported=False))
        options = profile.llamacpp
        if not attached or options is None:
            return mismatches
        reported_path = info.get("model_path")
        if reported_path != profile.model_path:
            mismatches.append(ArgMismatch("model_path", profile.model_path, reported_path))
        slots = info.get("total_slots")
        if options.parallel is not None and slots != options.parallel:
            mismatches.append(ArgMismatch("parallel", options.parallel, slots))
        n_ctx = info.get("n_ctx")
        # -c is the whole KV cache: split over the slots, or shared by all (kv_unified)
        if (
            options.ctx_size is not None
            and isinstance(n_ctx, int)
            and isinstance(slots, int)
            and options.ctx_size not in (n_ctx, n_ctx * slots)
        ):
            mismatches.append(ArgMismatch("ctx_size", options.ctx_size, n_ctx * slots))
        return mismatches

    def unverifiable(self, profiles: Sequence[ServerProfile]) -> str:
        return (
            "llama-server does not report its draft model, draft n max/min, threads or "
            f"environment (env {_env_sets(profiles)}), so those of an attached server cannot "
            "be verified"
        )

    def begin_run(self, client: MeasurementClient, workload: Workload) -> object:
        """The counters before the run (only for a speculative profile)."""
        return self._scrape(client) if self.speculative else None

    def end_run(self, client: MeasurementClient, state: object, run: RunRecord) -> RunExtras:
        if not isinstance(state, SpecCounters):
            return RunExtras()
        where = f"run {run.run_index + 1}"
        return llamacpp_run_extras(state, self._scrape(client), run, where=where)

    def _scrape(self, client: MeasurementClient) -> SpecCounters:
        response = client.get("/metrics")
        if response.status_code == 501:
            raise client.error(
                "llama-server was started without --metrics, but its Prometheus counters are "
                "where the accept length comes from; start it with --metrics (the llamacpp "
                "launcher always does)",
                "/metrics",
                501,
            )
        if response.status_code != 200:
            raise client.status_error(response, "/metrics")
        try:
            return SpecCounters.parse(response.text)
        except ValueError as exc:
            raise client.error(
                f"{exc}: this llama.cpp build does not report speculative decoding counters; "
                "use a newer llama-server",
                "/metrics",
            ) from None


BACKENDS: Mapping[str, Callable[[ServerProfile], Backend]] = {
    backend.name: backend for backend in (SglangBackend, LlamaCppBackend)
}
"""The backends by name: a server kind names the one its servers speak (``ServerKind.backend``)."""


def _env_sets(profiles: Sequence[ServerProfile]) -> str:
    """``sets nccl_tuned (eagle3-nccl), none (eagle3)``: each profile's env sets."""
    by_sets: dict[str, list[str]] = {}
    for profile in profiles:
        by_sets.setdefault(", ".join(profile.env_sets) or "none", []).append(profile.name)
    if len(by_sets) == 1:
        return f"set {next(iter(by_sets))}"
    return "sets " + "; ".join(f"{sets} ({', '.join(names)})" for sets, names in by_sets.items())


def _spec_count(spec: Mapping[str, object], key: str) -> int:
    value = spec.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _json_dict(client: MeasurementClient, response: Any, path: str) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise client.error(f"expected a JSON object, got {excerpt(response.text)}", path)
    return data
