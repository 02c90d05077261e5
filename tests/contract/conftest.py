"""Recorded answers of real SGLang, and helpers to compare shapes against them.

``data/real_sglang_<version>/`` holds what a real server answered (copied from the project's
``reference/real-sglang-0.5.15/``): ``evidence_hand_server.json`` (every endpoint of a
hand-started 0.5.15 server: request, status, headers, body or SSE lines) and
``launch_server_options.json`` (the option strings of its ``--help``). Tests of the simulator
and of the plugin's parsers both load them through :func:`real_evidence`.

Shapes are compared as JSON *key paths* with a type each (:func:`key_paths`): ``a.b`` for nested
objects and ``a.[]`` for list items, so two answers have the same shape when they have the same
paths with compatible types (``null`` is compatible with anything: real SGLang sends ``null``
for a field it has no value for yet).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data"
REAL_0_5_15 = DATA / "real_sglang_0_5_15"
#: Run and launch noise of a GPU-bound SGLang 0.5.15 server on one H200 at TP 1 (the noise
#: phase of ``scripts/gpu-smoke``; evidence in ``docs/gpu-smoke-2026-12-03/``). The simulator's
#: noise presets (``[noise.*]`` of ``sim/model.toml``) and ``benchmarks/bench_nightly.py``'s
#: measured scenario are these figures (``test_h200_noise.py`` holds them together).
H200_NOISE = DATA / "h200_noise.json"

#: Keys only the simulator sends, by design: how the plugin recognises a simulator.
SIM_ONLY_PREFIXES = ("sim_",)
SIM_ONLY_KEYS = frozenset({"simulated"})


@dataclass(frozen=True)
class RecordedAnswer:
    """One recorded request and the real server's answer."""

    name: str
    method: str
    path: str
    request: Any
    status: int
    headers: Mapping[str, str]
    body: Any
    """Parsed JSON for JSON answers, text otherwise; ``None`` for streamed answers."""
    sse_lines: tuple[str, ...] | None
    """The raw lines of a streamed answer (``data: ...`` and the blank separators)."""

    @property
    def content_type(self) -> str | None:
        return self.headers.get("content-type")

    def sse_events(self) -> list[Any]:
        """The JSON payloads of a streamed answer, ``[DONE]`` excluded."""
        assert self.sse_lines is not None, f"{self.name} is not a streamed answer"
        return [
            json.loads(line[len("data: ") :])
            for line in self.sse_lines
            if line.startswith("data: ") and line != "data: [DONE]"
        ]


@cache
def real_evidence(version: str = "0.5.15") -> dict[str, Any]:
    """The whole recorded evidence file of a real SGLang ``version``."""
    folder = DATA / f"real_sglang_{version.replace('.', '_')}"
    loaded: dict[str, Any] = json.loads(
        (folder / "evidence_hand_server.json").read_text(encoding="utf-8")
    )
    return loaded


def real_answers(version: str = "0.5.15") -> dict[str, RecordedAnswer]:
    """Every recorded endpoint answer of a real SGLang ``version``, by the recording's name."""
    answers = {}
    for name, raw in real_evidence(version)["endpoints"].items():
        lines = raw.get("sse_lines")
        answers[name] = RecordedAnswer(
            name=name,
            method=raw["method"],
            path=raw["path"],
            request=raw.get("request"),
            status=raw["status"],
            headers=raw.get("headers") or {},
            body=raw.get("body"),
            sse_lines=None if lines is None else tuple(line for _, line in lines),
        )
    return answers


@cache
def h200_noise() -> dict[str, Any]:
    """The measured noise of :data:`H200_NOISE`."""
    loaded: dict[str, Any] = json.loads(H200_NOISE.read_text(encoding="utf-8"))
    return loaded


def real_launch_options(version: str = "0.5.15") -> frozenset[str]:
    folder = DATA / f"real_sglang_{version.replace('.', '_')}"
    data = json.loads((folder / "launch_server_options.json").read_text(encoding="utf-8"))
    return frozenset(data["options"])


def json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    return "object"


def key_paths(value: object, prefix: str = "") -> dict[str, set[str]]:
    """``{path: {json types seen}}`` for every key path of ``value`` (see the module docstring)."""
    paths: dict[str, set[str]] = {}

    def walk(node: object, path: str) -> None:
        if path:
            paths.setdefault(path, set()).add(json_type(node))
        if isinstance(node, dict):
            for key, child in node.items():
                walk(child, f"{path}.{key}" if path else str(key))
        elif isinstance(node, list):
            for child in node:
                walk(child, f"{path}.[]" if path else "[]")

    walk(value, prefix)
    return paths


def merged_key_paths(values: Iterator[object] | list[object]) -> dict[str, set[str]]:
    merged: dict[str, set[str]] = {}
    for value in values:
        for path, types in key_paths(value).items():
            merged.setdefault(path, set()).update(types)
    return merged


def is_sim_only(path: str) -> bool:
    return any(
        part in SIM_ONLY_KEYS or part.startswith(SIM_ONLY_PREFIXES) for part in path.split(".")
    )


def shape_differences(real: Mapping[str, set[str]], sim: Mapping[str, set[str]]) -> list[str]:
    """Human-readable differences: paths only one side has, and incompatible types."""
    problems = []
    for path in sorted(set(real) - set(sim)):
        problems.append(f"only the real server sends {path}")
    for path in sorted(set(sim) - set(real)):
        if not is_sim_only(path):
            problems.append(f"only the simulator sends {path}")
    for path in sorted(set(real) & set(sim)):
        real_types, sim_types = real[path] - {"null"}, sim[path] - {"null"}
        if real_types and sim_types and not real_types & sim_types:
            problems.append(f"{path}: real {sorted(real[path])}, simulator {sorted(sim[path])}")
    return problems
