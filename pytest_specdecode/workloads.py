"""Workloads: what the measurement client sends, and a content hash kept with every result.

A workload is a prompt set plus the request shape (output length, temperature, ``ignore_eos``,
concurrency, requests per run, API) and the run protocol around it (warm-up requests, cache flush).

Prompts are realistic text of several kinds, shipped as package data in
``pytest_specdecode/prompts/<kind>.jsonl`` (one ``{"kind": ..., "text": ...}`` object per line).
Random token ids understate speculative acceptance (vLLM #52536), and acceptance differs a lot
between code, maths, chat and summarisation, so the kind of text is part of what is measured.

**Every run sends the same prompts.** ``prompts_for_run`` takes the first ``requests_per_run``
prompts of the set (cycling if the set is shorter) for every run index. Runs are the samples the
statistics compare, so they must differ only by server noise: rotating through the set would put
prompt-to-prompt differences into the run-to-run variance (a code prompt accepts far more draft
tokens than a chat prompt), and adaptive extra runs would change the prompt mix of the sample
between the baseline and the current measurement. The mixed set is interleaved by kind (code,
math, chat, summarization, code, ...), so ``requests_per_run`` = 4 gives one prompt of each kind.
Warm-up requests cycle over the same prompts, so the prefix-cache state is the same for every
measured run even on a server without ``/flush_cache``.

The content hash covers exactly what shapes the measured requests (the prompts every run sends,
``max_new_tokens``, ``temperature``, ``ignore_eos``, ``concurrency``, ``requests_per_run``,
``api``) and nothing else: renaming a workload or changing its warm-up does not invalidate
its baselines.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from types import MappingProxyType

from pytest_specdecode.errors import ConfigError
from pytest_specdecode.fingerprint import canonical_json

PROMPT_KINDS = ("code", "math", "chat", "summarization")
CUSTOM_KIND = "custom"
"""The kind of prompts written inline in a profile file (``prompts = [...]``)."""
PROMPT_SETS = (*PROMPT_KINDS, "mixed")
APIS = ("generate", "generate-stream", "completions", "completions-stream")
"""SGLang native ``/generate`` and OpenAI ``/v1/completions``, each without and with streaming."""

DEFAULT_WORKLOAD = "default"
WORKLOAD_KEYS = (
    "base",
    "prompt_set",
    "prompts",
    "max_new_tokens",
    "temperature",
    "ignore_eos",
    "concurrency",
    "requests_per_run",
    "warmup_requests",
    "flush_cache",
    "api",
)
"""The keys a ``[workloads.NAME]`` table (or an inline mapping) may set."""

_PROMPT_ORDER = "first-n-cyclic"
"""Names the rule ``prompts_for_run`` follows; hashed so that changing the rule changes hashes."""


@dataclass(frozen=True)
class Prompt:
    """One prompt text and the kind of text it is (one of PROMPT_KINDS, or ``custom``)."""

    kind: str
    text: str


@dataclass(frozen=True)
class Workload:
    """A prompt set and the shape of the requests the client sends for it.

    Values are checked on construction; a bad value raises ``ConfigError`` naming the workload,
    the key, the value, what is allowed and ``source`` (where the workload was defined).
    """

    name: str
    prompt_set: str
    prompts: tuple[Prompt, ...]
    max_new_tokens: int = 256
    temperature: float = 0.0
    ignore_eos: bool = True
    concurrency: int = 1
    requests_per_run: int = 1
    warmup_requests: int = 2
    flush_cache: bool = True
    api: str = "generate-stream"
    source: str = "built-in"

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompts", tuple(self.prompts))
        _check_workload(self)
        object.__setattr__(self, "temperature", float(self.temperature))

    @property
    def streaming(self) -> bool:
        """Whether the API streams (only streaming requests give TTFT and inter-token gaps)."""
        return self.api.endswith("-stream")

    def hashed_fields(self) -> dict[str, object]:
        """What :meth:`content_hash` covers, the prompts as one digest: stored with a baseline
        so that a changed workload is reported by the field that changed."""
        texts = [prompt.text for prompt in self.prompts_for_run(0)]
        return {
            "prompts": f"{len(texts)} prompts, sha256 "
            + hashlib.sha256(canonical_json(texts).encode()).hexdigest()[:16],
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "ignore_eos": self.ignore_eos,
            "concurrency": self.concurrency,
            "requests_per_run": self.requests_per_run,
            "api": self.api,
        }

    def content_hash(self) -> str:
        """16 hex digits of SHA-256 over the canonical JSON of what shapes the measured requests."""
        shape = {
            "prompts": [prompt.text for prompt in self.prompts_for_run(0)],
            "prompt_order": _PROMPT_ORDER,
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "ignore_eos": self.ignore_eos,
            "concurrency": self.concurrency,
            "requests_per_run": self.requests_per_run,
            "api": self.api,
        }
        return hashlib.sha256(canonical_json(shape).encode()).hexdigest()[:16]

    def prompts_for_run(self, run_index: int) -> tuple[Prompt, ...]:
        """The prompts of one measured run, in sending order: the same for every run index
        (see the module docstring for why), the first ``requests_per_run`` of the set, cycling."""
        if isinstance(run_index, bool) or not isinstance(run_index, int) or run_index < 0:
            raise ValueError(f"run_index must be an integer >= 0, got {run_index!r}")
        return tuple(itertools.islice(itertools.cycle(self.prompts), self.requests_per_run))

    def prompts_for_warmup(self) -> tuple[Prompt, ...]:
        """The warm-up prompts: ``warmup_requests`` of them, cycling over a run's prompts."""
        run_prompts = self.prompts_for_run(0)
        return tuple(itertools.islice(itertools.cycle(run_prompts), self.warmup_requests))

    def to_json(self) -> dict[str, object]:
        """The workload's description for reports and baseline provenance (without prompt texts)."""
        return {
            "name": self.name,
            "source": self.source,
            "prompt_set": self.prompt_set,
            "prompt_kinds": [prompt.kind for prompt in self.prompts_for_run(0)],
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "ignore_eos": self.ignore_eos,
            "concurrency": self.concurrency,
            "requests_per_run": self.requests_per_run,
            "warmup_requests": self.warmup_requests,
            "flush_cache": self.flush_cache,
            "api": self.api,
            "content_hash": self.content_hash(),
        }


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_workload(workload: Workload) -> None:
    def bad(key: str, value: object, allowed: str, remedy: str = "") -> ConfigError:
        message = f"workload {workload.name!r}: {key} = {value!r} is not allowed; {allowed}"
        return ConfigError(
            message + (f". {remedy}" if remedy else ""), source=workload.source or None
        )

    if not workload.prompts:
        raise bad("prompts", [], "a workload needs at least one prompt")
    for prompt in workload.prompts:
        if not isinstance(prompt, Prompt) or not isinstance(prompt.text, str) or not prompt.text:
            raise bad("prompts", prompt, "every prompt must be a non-empty string")
    for key, minimum in (
        ("max_new_tokens", 1),
        ("concurrency", 1),
        ("requests_per_run", 1),
        ("warmup_requests", 0),
    ):
        value = getattr(workload, key)
        if not _is_int(value) or value < minimum:
            raise bad(key, value, f"it must be an integer >= {minimum}")
    temperature = workload.temperature
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not math.isfinite(temperature)
        or temperature < 0
    ):
        raise bad(
            "temperature", temperature, "it must be a number >= 0", "Use 0 for greedy decoding"
        )
    for key in ("ignore_eos", "flush_cache"):
        if not isinstance(getattr(workload, key), bool):
            raise bad(key, getattr(workload, key), "it must be true or false")
    if workload.api not in APIS:
        raise bad("api", workload.api, f"choose one of {', '.join(APIS)}")
    if workload.concurrency > workload.requests_per_run:
        raise bad(
            "concurrency",
            workload.concurrency,
            f"it exceeds requests_per_run = {workload.requests_per_run}, so at most "
            f"{workload.requests_per_run} requests would ever be in flight",
            f"Set requests_per_run to at least {workload.concurrency}",
        )


# --- shipped prompt sets -----------------------------------------------------------------------


@cache
def load_prompt_set(name: str) -> tuple[Prompt, ...]:
    """The shipped prompts of one kind, or ``mixed`` (every kind, interleaved in PROMPT_KINDS
    order: code, math, chat, summarization, code, ...)."""
    if name == "mixed":
        by_kind = [load_prompt_set(kind) for kind in PROMPT_KINDS]
        interleaved = itertools.chain.from_iterable(itertools.zip_longest(*by_kind))
        return tuple(prompt for prompt in interleaved if prompt is not None)
    if name not in PROMPT_KINDS:
        raise ConfigError(f"unknown prompt set {name!r}; choose one of {', '.join(PROMPT_SETS)}")
    resource = resources.files(__package__ or "pytest_specdecode") / "prompts" / f"{name}.jsonl"
    prompts = []
    for line_number, line in enumerate(resource.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            prompts.append(_parse_prompt_line(line, name, f"{resource}:{line_number}"))
    if not prompts:
        raise ConfigError(f"prompt set {name!r} is empty", source=str(resource))
    return tuple(prompts)


def _parse_prompt_line(line: str, kind: str, where: str) -> Prompt:
    try:
        entry = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not a JSON object ({exc.msg}): {line[:80]!r}", source=where) from exc
    if not isinstance(entry, dict) or set(entry) != {"kind", "text"}:
        raise ConfigError(f'expected {{"kind": ..., "text": ...}}, got {line[:80]!r}', source=where)
    if entry["kind"] != kind or not isinstance(entry["text"], str) or not entry["text"].strip():
        raise ConfigError(
            f"expected kind {kind!r} and a non-empty text, got {line[:80]!r}", source=where
        )
    return Prompt(kind=kind, text=entry["text"])


def _builtin_workloads() -> Mapping[str, Workload]:
    mixed = load_prompt_set("mixed")
    workloads = [
        # The everyday workload: one prompt of each kind per run, one request at a time.
        Workload("default", "mixed", mixed, requests_per_run=4),
        # The seed's benchmark shape, greedy 500-token requests one at a time ("500 tokens in
        # 5.20s"), four per run: the seed's one request per run gave a run-to-run CV of ~4%,
        # and one prompt of each kind per run halves it (perf_tests/specdecode.toml).
        Workload("seed", "mixed", mixed, max_new_tokens=500, requests_per_run=4),
        # A batch of eight concurrent requests (two of each kind); warm up with a full batch.
        Workload("batch8", "mixed", mixed, concurrency=8, requests_per_run=8, warmup_requests=8),
    ]
    workloads += [
        Workload(kind, kind, load_prompt_set(kind), requests_per_run=4) for kind in PROMPT_KINDS
    ]
    return MappingProxyType({workload.name: workload for workload in workloads})


BUILTIN_WORKLOADS: Mapping[str, Workload] = _builtin_workloads()


def describe_builtin(name: str) -> str:
    """A built-in workload in a few words, e.g. ``mixed prompts, 500 new tokens, 4 requests per
    run, concurrency 1``."""
    workload = BUILTIN_WORKLOADS[name]
    return (
        f"{workload.prompt_set} prompts, {workload.max_new_tokens} new tokens, "
        f"{workload.requests_per_run} requests per run, concurrency {workload.concurrency}"
    )


def builtin_overrides(tables: Mapping[str, Mapping[str, object]], source: str) -> list[str]:
    """A warning for each ``[workloads.NAME]`` of a profile file that takes a built-in's name:
    every test naming it gets the table, not the built-in, and a reader of the test cannot
    tell. A table that builds on the built-in of its own name (``base = NAME``) says it means
    to, and is not warned about."""
    return [
        f"{source} [workloads.{name}] replaces the built-in workload {name!r} "
        f"({describe_builtin(name)}) for every test that names it; rename the table to keep "
        f'both, or write base = "{name}" in it to say the replacement is meant'
        for name, table in tables.items()
        if name in BUILTIN_WORKLOADS and table.get("base") != name
    ]


# --- resolving a workload from a name, a profile-file table or an inline mapping ---------------


def resolve_workload(
    spec: str | Mapping[str, object] | None,
    defined: Mapping[str, Mapping[str, object]] = MappingProxyType({}),
    *,
    source: str = "",
) -> Workload:
    """The workload a test asks for.

    ``None`` means ``"default"``. A name is looked up first among ``defined`` (the profile
    file's ``[workloads.NAME]`` tables), then among BUILTIN_WORKLOADS. A mapping overrides
    fields of ``"default"`` (or of the built-in named by its ``base`` key). ``source`` says where
    ``spec``/``defined`` came from (a file path, a marker) and appears in every error message.
    """
    if spec is None:
        spec = DEFAULT_WORKLOAD
    if isinstance(spec, str):
        if spec in defined:
            where = f"{source} [workloads.{spec}]" if source else f"[workloads.{spec}]"
            return _from_table(spec, defined[spec], where)
        if spec in BUILTIN_WORKLOADS:
            return BUILTIN_WORKLOADS[spec]
        known = sorted(set(defined) | set(BUILTIN_WORKLOADS))
        raise ConfigError(
            f"unknown workload {spec!r}{_did_you_mean(spec, known)}; known workloads: "
            f"{', '.join(known)} (define others as [workloads.NAME] tables in the profile file)",
            source=source or None,
        )
    if isinstance(spec, Mapping):
        return _from_table("inline", spec, source or "inline workload")
    raise ConfigError(
        f"a workload must be a name or a table of settings, got {type(spec).__name__} {spec!r}",
        source=source or None,
    )


def _from_table(name: str, table: object, source: str) -> Workload:
    if not isinstance(table, Mapping):
        raise ConfigError(
            f"workload {name!r} must be a table of settings, got {type(table).__name__} {table!r}",
            source=source,
        )
    for key in table:
        if key not in WORKLOAD_KEYS:
            raise ConfigError(
                f"workload {name!r}: unknown key {key!r}{_did_you_mean(str(key), WORKLOAD_KEYS)}; "
                f"allowed keys: {', '.join(WORKLOAD_KEYS)}",
                source=source,
            )
    base_name = table.get("base", DEFAULT_WORKLOAD)
    if not isinstance(base_name, str) or base_name not in BUILTIN_WORKLOADS:
        raise ConfigError(
            f"workload {name!r}: base = {base_name!r} is not a built-in workload; choose one of "
            f"{', '.join(BUILTIN_WORKLOADS)}",
            source=source,
        )
    overrides: dict[str, object] = {
        key: value for key, value in table.items() if key not in ("base", "prompt_set", "prompts")
    }
    if "prompt_set" in table and "prompts" in table:
        raise ConfigError(
            f"workload {name!r}: set either prompt_set or prompts, not both", source=source
        )
    if "prompt_set" in table:
        prompt_set = table["prompt_set"]
        if not isinstance(prompt_set, str) or prompt_set not in PROMPT_SETS:
            raise ConfigError(
                f"workload {name!r}: prompt_set = {prompt_set!r} is not allowed; choose one of "
                f"{', '.join(PROMPT_SETS)} (or write your own with prompts = [...])",
                source=source,
            )
        overrides["prompt_set"] = prompt_set
        overrides["prompts"] = load_prompt_set(prompt_set)
    if "prompts" in table:
        overrides["prompt_set"] = "inline"
        overrides["prompts"] = _inline_prompts(name, table["prompts"], source)
    # The override values are unchecked TOML data; Workload.__post_init__ checks every one.
    return replace(BUILTIN_WORKLOADS[base_name], name=name, source=source, **overrides)  # type: ignore[arg-type]


def _inline_prompts(name: str, value: object, source: str) -> tuple[Prompt, ...]:
    if (
        isinstance(value, str)
        or not isinstance(value, Sequence)
        or not value
        or not all(isinstance(text, str) and text.strip() for text in value)
    ):
        raise ConfigError(
            f"workload {name!r}: prompts = {value!r} is not allowed; it must be a non-empty list "
            f"of non-empty strings",
            source=source,
        )
    return tuple(Prompt(kind=CUSTOM_KIND, text=text) for text in value)


def _did_you_mean(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
