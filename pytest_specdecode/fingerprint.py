"""What a measurement was taken under, split into fields that forbid a comparison and fields
that only deserve a warning.

*Hard* fields change speed by design: model, draft model, tensor parallelism, the speculative
algorithm and its steps/topk/draft tokens, memory fraction, extra server flags, the environment
variables that tune NCCL, the launcher (a simulated server is never compared with a real one).
Two measurements whose hard fields differ are different experiments; comparing them is the
"62.9 vs 88.8 tok/s" mistake from the seed, so it is refused.

*Soft* fields are versions and similar context (SGLang version, image tag, driver): a change
there is exactly what a nightly run wants to detect, so it is compared but reported.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

JSONValue: TypeAlias = Any  # the JSON subset: str, int, float, bool, None, list, dict[str, ...]


def canonical_json(value: JSONValue) -> str:
    """JSON with sorted keys and no whitespace: equal data gives equal text, hence equal hashes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _frozen(mapping: Mapping[str, JSONValue]) -> dict[str, JSONValue]:
    # Round-trip through JSON so tuples become lists and the stored form equals the loaded form.
    loaded: dict[str, JSONValue] = json.loads(canonical_json(dict(mapping)))
    return loaded


@dataclass(frozen=True)
class FieldDifference:
    """One field that differs between two fingerprints (``None`` = absent on that side)."""

    name: str
    stored: JSONValue
    current: JSONValue

    def describe(self) -> str:
        return f"{self.name}: baseline {self.stored!r}, now {self.current!r}"


@dataclass(frozen=True)
class FingerprintDiff:
    hard: tuple[FieldDifference, ...]
    soft: tuple[FieldDifference, ...]

    @property
    def comparable(self) -> bool:
        return not self.hard


@dataclass(frozen=True)
class Fingerprint:
    """Hard and soft fields of one configuration, JSON-shaped, with a digest of the hard part."""

    hard: Mapping[str, JSONValue] = field(default_factory=dict)
    soft: Mapping[str, JSONValue] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "hard", _frozen(self.hard))
        object.__setattr__(self, "soft", _frozen(self.soft))

    @property
    def digest(self) -> str:
        """16 hex digits of SHA-256 over the canonical hard fields; the reuse and baseline key."""
        return hashlib.sha256(canonical_json(self.hard).encode()).hexdigest()[:16]

    def with_soft(self, **extra: JSONValue) -> Fingerprint:
        """A copy with soft fields added, e.g. the SGLang version read from a running server."""
        return Fingerprint(hard=self.hard, soft={**self.soft, **extra})

    def to_json(self) -> dict[str, JSONValue]:
        return {"digest": self.digest, "hard": dict(self.hard), "soft": dict(self.soft)}

    @classmethod
    def from_json(cls, data: Mapping[str, JSONValue]) -> Fingerprint:
        hard, soft = data.get("hard"), data.get("soft", {})
        if not isinstance(hard, Mapping) or not isinstance(soft, Mapping):
            raise ValueError("a fingerprint needs 'hard' and 'soft' objects")
        return cls(hard=hard, soft=soft)

    def diff(self, current: Fingerprint) -> FingerprintDiff:
        """What changed from ``self`` (stored) to ``current``; soft fields absent on either
        side are not differences (old baselines may not know a newer soft field)."""
        return FingerprintDiff(
            hard=_differences(self.hard, current.hard, missing_counts=True),
            soft=_differences(self.soft, current.soft, missing_counts=False),
        )


def _differences(
    stored: Mapping[str, JSONValue], current: Mapping[str, JSONValue], *, missing_counts: bool
) -> tuple[FieldDifference, ...]:
    out = []
    for name in sorted(set(stored) | set(current)):
        if name not in stored or name not in current:
            if missing_counts:
                out.append(FieldDifference(name, stored.get(name), current.get(name)))
            continue
        if canonical_json(stored[name]) != canonical_json(current[name]):
            out.append(FieldDifference(name, stored[name], current[name]))
    return tuple(out)
