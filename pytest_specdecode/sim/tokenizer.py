"""A deterministic fake tokenizer: stable prompt token ids and readable generated text.

Prompts are split into words and punctuation, one token each, after a BOS token. Generated
tokens are drawn from a small word list by a per-request generator; greedy requests (temperature
0) seed it from the prompt, so the same prompt always gives the same text, as greedy decoding
does.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator, Mapping, Sequence

BOS_TOKEN_ID = 1
EOS_TOKEN_ID = 2
_PROMPT_VOCAB = 150_000
_PROMPT_ID_OFFSET = 1_000
_OUTPUT_ID_OFFSET = 200_000
_PIECE = re.compile(r"\w+|[^\w\s]")
_SPECIAL_TEXT = {BOS_TOKEN_ID: "<s>", EOS_TOKEN_ID: "</s>"}

_WORD_LIST = (
    "the of and to in is that for it as with was on be by this are at from or an which have "
    "not but all they one has more can we their its been would there when will also into "
    "other these than some time only two may first any new very then where most over such "
    "after between many those each through both well under while same three because does "
    "system model token draft verify speed decode server graph cache batch layer expert "
    "tensor parallel memory kernel latency throughput request stream accept length step "
    "cycle target prefix radix queue worker signal output input prompt sample greedy value "
    "result figure table measure baseline margin run test config profile launch ready load "
    "weight capture health metric counter gauge window interval average median noise seed "
    "simulated number reason answer question capital city france paris river north south "
    "east west large small fast slow early late long short high low good better best"
)
#: Text of each output token id (a leading space, like a BPE word piece).
_OUTPUT_PIECES = tuple(" " + word for word in _WORD_LIST.split())

_LCG_MULTIPLIER = 6364136223846793005
_LCG_INCREMENT = 1442695040888963407
_MASK64 = (1 << 64) - 1


def encode(text: str) -> list[int]:
    """Token ids of a prompt: BOS, then one stable id per word or punctuation mark."""
    ids = [BOS_TOKEN_ID]
    ids.extend(
        zlib.crc32(piece.encode("utf-8")) % _PROMPT_VOCAB + _PROMPT_ID_OFFSET
        for piece in _PIECE.findall(text)
    )
    return ids


def encode_pieces(text: str) -> list[str]:
    """The text of each token ``encode(text)`` returns, BOS included (for logprob texts)."""
    return [_SPECIAL_TEXT[BOS_TOKEN_ID], *_PIECE.findall(text)]


def token_text(token_id: int) -> str:
    """Text of one token id. Prompt ids are one-way hashes of their words: a prompt's pieces
    come from ``encode_pieces``; an id seen without its text reads ``<id>``."""
    offset = token_id - _OUTPUT_ID_OFFSET
    if 0 <= offset < len(_OUTPUT_PIECES):
        return _OUTPUT_PIECES[offset]
    return _SPECIAL_TEXT.get(token_id, f"<{token_id}>")


def alternative_output_ids(position: int, chosen: int) -> Iterator[int]:
    """Other output-vocabulary ids for top-logprob lists: stable per position, never ``chosen``."""
    vocab = len(_OUTPUT_PIECES)
    first = zlib.crc32(f"alt:{position}".encode("ascii")) % vocab
    for step in range(vocab):
        token_id = _OUTPUT_ID_OFFSET + (first + step) % vocab
        if token_id != chosen:
            yield token_id


def prompt_key(ids: Sequence[int]) -> int:
    """A stable 32-bit digest of a prompt (prefix-cache key and greedy seed)."""
    return zlib.crc32(",".join(map(str, ids)).encode("ascii"))


def apply_chat_template(messages: Sequence[Mapping[str, object]]) -> str:
    """A ChatML-style rendering, enough to give chat prompts a realistic token count."""
    parts = []
    for message in messages:
        content = message.get("content", "")
        if isinstance(content, list):  # OpenAI content parts
            content = " ".join(
                str(part.get("text", "")) for part in content if isinstance(part, Mapping)
            )
        parts.append(f"<|im_start|>{message.get('role', 'user')}\n{content}<|im_end|>\n")
    parts.append("<|im_start|>assistant\n")
    return "".join(parts)


class OutputTokens:
    """The generated token ids and text of one request, produced on demand."""

    __slots__ = ("_ids_csv", "_ids_csv_count", "_joined", "_joined_count", "_state", "ids")

    def __init__(self, seed: int) -> None:
        self._state = seed & _MASK64
        self.ids: list[int] = []
        self._joined = ""
        self._joined_count = 0
        self._ids_csv = ""
        self._ids_csv_count = 0

    def extend(self, count: int) -> None:
        state = self._state
        ids = self.ids
        vocab = len(_OUTPUT_PIECES)
        for _ in range(count):
            state = (state * _LCG_MULTIPLIER + _LCG_INCREMENT) & _MASK64
            ids.append(_OUTPUT_ID_OFFSET + (state >> 33) % vocab)
        self._state = state

    def text(self, count: int | None = None) -> str:
        """Detokenized text of the first ``count`` tokens (all by default), joined incrementally."""
        count = len(self.ids) if count is None else count
        if count < self._joined_count:
            return self.text_between(0, count)
        if count > self._joined_count:
            self._joined += self.text_between(self._joined_count, count)
            self._joined_count = count
        return self._joined

    def ids_json(self, count: int) -> str:
        """JSON array of the first ``count`` ids, built incrementally: streams re-send the whole
        cumulative list in every chunk, and encoding it afresh dominated the server's CPU."""
        if count < self._ids_csv_count:
            return "[" + ",".join(map(str, self.ids[:count])) + "]"
        if count > self._ids_csv_count:
            more = ",".join(map(str, self.ids[self._ids_csv_count : count]))
            self._ids_csv = f"{self._ids_csv},{more}" if self._ids_csv else more
            self._ids_csv_count = count
        return "[" + self._ids_csv + "]"

    def text_between(self, start: int, end: int) -> str:
        return "".join(_OUTPUT_PIECES[i - _OUTPUT_ID_OFFSET] for i in self.ids[start:end])
