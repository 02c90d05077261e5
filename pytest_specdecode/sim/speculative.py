"""What the speculative flags resolve to: SGLang's rules for ``--speculative-algorithm`` and its
steps, top-k and draft tokens, the running-request cap, overlap scheduling and mixed chunks, per
behaviour era (``versions.py``), with the notes SGLang logs.

Apart from ``args.py`` because they are a subject of their own (an algorithm, a draft tree and a
scheduling rule per era) of which the rest of the resolution only reads the outcome
(``Speculative``). ``args.py`` imports this module, never the other way round, so the two small
things both need live here: ``StartupError`` (what a release refuses while resolving) and
``Flags`` (the given flags over the release's declared defaults).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_specdecode.sim import versions

SPECULATIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")
#: Algorithms for which SGLang caps max_running_requests at 48 when it is not given.
CAPPED_ALGORITHMS = frozenset({"EAGLE", "EAGLE3", "STANDALONE"})


class StartupError(Exception):
    """A ``ValueError`` SGLang raises while resolving its arguments (exit status 1)."""


@dataclass(frozen=True)
class Flags:
    """The flags given on the command line, over the release's declared field defaults."""

    given: Mapping[str, Any]
    defaults: Mapping[str, Any]

    def get(self, name: str, fallback: Any = None) -> Any:
        """The given value, else the release's default, else ``fallback`` (for ``None``)."""
        value = self.given.get(name, self.defaults.get(name))
        return fallback if value is None else value


@dataclass
class Speculative:
    """The speculative-decoding settings while they are resolved, with the notes SGLang logs."""

    algorithm: str | None
    steps: int | None
    topk: int | None
    draft_tokens: int | None
    max_running: int | None
    disable_overlap: bool
    enable_mixed_chunk: bool
    notes: list[str] = dataclasses.field(default_factory=list)


def _looks_like_llama_or_grok(model_path: str) -> bool:
    lowered = model_path.lower()
    return "llama" in lowered or "grok" in lowered


def speculative_algorithm(flags: Flags) -> str | None:
    """``--speculative-algorithm`` upper-cased; ``StartupError`` for one not simulated."""
    algorithm: str | None = flags.get("speculative_algorithm")
    if algorithm is not None and algorithm.upper() not in SPECULATIVE_ALGORITHMS:
        raise StartupError(
            f"speculative_algorithm {algorithm!r} is not simulated; choose one of "
            f"{', '.join(SPECULATIVE_ALGORITHMS)}"
        )
    return algorithm.upper() if algorithm else None


def resolve_speculative(
    algorithm: str | None, flags: Flags, model_path: str, era: versions.Era
) -> Speculative:
    """SGLang's speculative-decoding rules: NEXTN is EAGLE; the draft-model algorithms cap the
    running requests, settle overlap scheduling and the draft tree; NGRAM sizes its own tree."""
    spec = Speculative(
        algorithm="EAGLE" if algorithm == "NEXTN" else algorithm,
        steps=flags.get("speculative_num_steps"),
        topk=flags.get("speculative_eagle_topk"),
        draft_tokens=flags.get("speculative_num_draft_tokens"),
        max_running=flags.get("max_running_requests"),
        disable_overlap=bool(flags.get("disable_overlap_schedule", False)),
        enable_mixed_chunk=bool(flags.get("enable_mixed_chunk", False)),
    )
    if spec.algorithm in CAPPED_ALGORITHMS:
        if spec.max_running is None:
            spec.max_running = 48
            spec.notes.append(
                "Max running requests is reset to 48 for speculative decoding. You can override "
                "this by explicitly setting --max-running-requests."
            )
        _settle_overlap_schedule(spec, era)
        if spec.enable_mixed_chunk:
            spec.enable_mixed_chunk = False
            spec.notes.append(
                "Mixed chunked prefill is disabled because of using eagle speculative decoding."
            )
        _choose_draft_tree(spec, model_path)
    elif spec.algorithm == "NGRAM":
        _resolve_ngram(spec, flags, era)
    return spec


def _settle_overlap_schedule(spec: Speculative, era: versions.Era) -> None:
    """Overlap scheduling with a draft model: off before spec v2; with spec v2 as the default,
    spec v1 (no overlap) for topk > 1 or when overlap is disabled; spec v2 only: as given."""
    if not era.spec_v2_default:
        spec.disable_overlap = True
        spec.notes.append(
            "Overlap scheduler is disabled because of using eagle3 or standalone speculative "
            "decoding."
        )
    elif not era.spec_v2_only:
        reason = None
        if spec.topk is not None and spec.topk > 1 and not spec.disable_overlap:
            spec.disable_overlap = True
            reason = "spec v2 currently only supports topk = 1"
        if spec.disable_overlap:
            spec.notes.append(
                "Spec v1 is used for eagle/eagle3/standalone speculative decoding because "
                f"{reason or 'overlap schedule is disabled'}."
            )
        else:
            spec.notes.append(
                "Spec v2 is enabled by default for eagle/eagle3/standalone speculative decoding."
            )
    elif spec.disable_overlap:
        spec.notes.append(
            "Non-overlap (synchronous) spec v2 is used for eagle/eagle3/standalone "
            "speculative decoding."
        )


def _choose_draft_tree(spec: Speculative, model_path: str) -> None:
    """Steps, topk and draft tokens of a draft model: all three automatic when none is given
    (a wider tree for Llama and Grok targets), else the missing ones; with topk 1 (a chain) the
    draft tokens are steps + 1."""
    if spec.algorithm == "STANDALONE":
        auto = (3, 1, 4)
    else:
        auto = (5, 4, 8) if _looks_like_llama_or_grok(model_path) else (3, 1, 4)
    if spec.steps is None and spec.topk is None and spec.draft_tokens is None:
        steps, topk, draft_tokens = auto
        spec.notes.append(
            "Auto choose speculative parameters: "
            f"{steps=}, {topk=}, num_draft_tokens={draft_tokens}. "
            "Set --speculative-num-steps, --speculative-eagle-topk and "
            "--speculative-num-draft-tokens together to override."
        )
    else:
        steps = auto[0] if spec.steps is None else spec.steps
        topk = auto[1] if spec.topk is None else spec.topk
        draft_tokens = auto[2] if spec.draft_tokens is None else spec.draft_tokens
    if topk == 1 and draft_tokens != steps + 1:
        spec.notes.append(
            "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
            "speculative_eagle_topk == 1"
        )
        draft_tokens = steps + 1
    spec.steps, spec.topk, spec.draft_tokens = steps, topk, draft_tokens


def _resolve_ngram(spec: Speculative, flags: Flags, era: versions.Era) -> None:
    """NGRAM's tree and budget, and the releases where it turns overlap scheduling off."""
    # NGRAM has no draft model: its tree is as wide as --speculative-ngram-max-bfs-breadth.
    spec.topk = flags.get("speculative_ngram_max_bfs_breadth", 10)
    if spec.draft_tokens is None:
        spec.draft_tokens = 12
        spec.notes.append(
            "speculative_num_draft_tokens is set to 12 by default for ngram speculative "
            "decoding. You can override this by explicitly setting "
            "--speculative-num-draft-tokens."
        )
    if era.ngram_disables_overlap:
        spec.disable_overlap = True
