"""``return_logprob`` on the native ``/generate``: the ``meta_info`` logprob fields of SGLang.

SGLang's frontend needs them: ``sgl.select`` (``RuntimeEndpoint.select`` in
``sglang/lang/backend/runtime_endpoint.py``) sends ``return_logprob`` and reads
``meta_info["input_token_logprobs"]`` of every choice; without the key it raises ``KeyError``.
The values are made up (deterministic, from the token id and position) but the shapes follow
SGLang 0.5.6:

- each entry is ``[logprob, token_id, text]``; text is ``None`` unless
  ``return_text_in_logprobs`` (``TokenizerManager.detokenize_logprob_tokens``);
- ``input_token_logprobs`` covers the prompt from ``logprob_start_len``, and its first logprob
  is ``None`` ("add None at start", ``_process_input_token_logprobs`` in
  ``scheduler_output_processor_mixin.py``); ``logprob_start_len == -1`` means the last prompt
  token only, or nothing for a prefill-only request (``max_new_tokens == 0`` without
  speculation), as ``Scheduler.handle_generate_request`` sets it;
- ``output_token_logprobs`` has one entry per generated token, cumulative like the text;
- with ``top_logprobs_num > 0`` also ``input_top_logprobs`` (``None`` first) and
  ``output_top_logprobs``: per position, the ``top_logprobs_num`` best, best first.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_specdecode.sim.tokenizer import OutputTokens, alternative_output_ids, token_text

Entry = list[float | int | str | None]


@dataclass(frozen=True)
class LogprobRequest:
    """The logprob fields of one ``/generate`` request (``GenerateReqInput``)."""

    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text: bool = False


@dataclass(frozen=True)
class LogprobPlan:
    """What a request needs to report logprobs: its prompt, and where reporting starts."""

    request: LogprobRequest
    prompt_ids: tuple[int, ...]
    #: The prompt's own pieces when it came as text (its ids cannot be decoded otherwise).
    prompt_pieces: tuple[str, ...] | None
    start: int


def plan_logprobs(
    request: LogprobRequest,
    prompt_ids: Sequence[int],
    prompt_pieces: Sequence[str] | None,
    *,
    prefill_only: bool,
) -> LogprobPlan:
    """Resolve ``logprob_start_len``; a start past the prompt is SGLang's 400."""
    length = len(prompt_ids)
    start = request.logprob_start_len
    if start == -1:
        start = length if prefill_only else length - 1
    elif start < 0:
        raise ValueError(f"logprob_start_len must be -1 or at least 0, got {start}.")
    elif start >= length and not prefill_only:
        raise ValueError(
            f"req.logprob_start_len={start} is higher than the number of input tokens "
            f"len(req.origin_input_ids)={length}. Please use a smaller logprob_start_len."
        )
    pieces = tuple(prompt_pieces) if prompt_pieces is not None else None
    return LogprobPlan(request, tuple(prompt_ids), pieces, min(start, length))


def _logprob(position: int, token_id: int) -> float:
    """A stable made-up log-probability in [-4.0, -0.01]."""
    digest = zlib.crc32(f"{position}:{token_id}".encode("ascii"))
    return round(-0.01 - (digest % 400) / 100, 2)


def _entry(plan: LogprobPlan, logprob: float | None, token_id: int, text: str | None) -> Entry:
    return [logprob, token_id, text if plan.request.return_text else None]


def _top(plan: LogprobPlan, position: int, chosen: int, chosen_logprob: float) -> list[Entry]:
    """The ``top_logprobs_num`` best at one position: the chosen token first (greedy)."""
    entries = [_entry(plan, chosen_logprob, chosen, token_text(chosen))]
    for rank, other in enumerate(alternative_output_ids(position, chosen), start=1):
        if len(entries) == plan.request.top_logprobs_num:
            break
        entries.append(
            _entry(plan, round(chosen_logprob - 0.5 * rank, 2), other, token_text(other))
        )
    return entries


def logprob_meta_info(plan: LogprobPlan, output: OutputTokens, count: int) -> dict[str, object]:
    """The logprob fields of ``meta_info`` after ``count`` generated tokens."""
    prompt_texts = plan.prompt_pieces or tuple(token_text(i) for i in plan.prompt_ids)
    input_entries: list[Entry] = []
    input_top: list[list[Entry] | None] = []
    for position in range(plan.start, len(plan.prompt_ids)):
        token_id = plan.prompt_ids[position]
        first = position == plan.start
        logprob = None if first else _logprob(position, token_id)
        input_entries.append(_entry(plan, logprob, token_id, prompt_texts[position]))
        if plan.request.top_logprobs_num > 0:
            input_top.append(None if logprob is None else _top(plan, position, token_id, logprob))
    output_entries: list[Entry] = []
    output_top: list[list[Entry] | None] = []
    for offset, token_id in enumerate(output.ids[:count]):
        position = len(plan.prompt_ids) + offset
        logprob = _logprob(position, token_id)
        output_entries.append(_entry(plan, logprob, token_id, token_text(token_id)))
        if plan.request.top_logprobs_num > 0:
            output_top.append(_top(plan, position, token_id, logprob))
    info: dict[str, object] = {
        "input_token_logprobs": input_entries,
        "output_token_logprobs": output_entries,
    }
    if plan.request.top_logprobs_num > 0:
        info["input_top_logprobs"] = input_top
        info["output_top_logprobs"] = output_top
    return info
