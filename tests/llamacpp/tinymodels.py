"""Tiny GGUF models for llama-server tests, generated from a seed in well under a second.

Only numpy and ``gguf`` (PyPI, 0.19.0) are used: no torch, no transformers, nothing downloaded.
``generate(directory, seed=0)`` writes, in ~0.3-0.7 s on 2 cores (most of it the BPE training):

=====================  =====================================================================
``target.gguf``        Llama, 4 layers, hidden 256, 4 heads, 2 KV heads, FFN 512, F32, 10.5 MB
``draft.gguf``         Llama, 1 layer, hidden 128, FFN 256 (``--spec-type draft-simple``)
``eagle3.gguf``        EAGLE-3 head for the target, random, draft vocab 256 + ``d2t``, 4.0 MB
``fixed-target.gguf``  like target.gguf, but greedily emits token ``fixed_token_id`` always
``fixed-draft.gguf``   like draft.gguf, emits the same token
``fixed-eagle3.gguf``  EAGLE-3 head (full vocab, no ``d2t``) that proposes the same token
``manifest.json``      the ``TinyModels`` fields (paths, fixed token id and text, sizes, seconds)
=====================  =====================================================================

All share one vocabulary: a byte-level BPE of 512 tokens (``tokenizer.ggml.model`` "gpt2", pre
"gpt-2"): ids 0-3 are the control tokens ``<s>`` (BOS), ``</s>`` (EOS), ``<|im_start|>``,
``<|im_end|>`` (EOT), then the 256 bytes, then 252 merges trained on the first 8 KB of Debian's
``/usr/share/common-licenses/GPL-3`` (an original fallback text if that file is missing), plus a
ChatML ``tokenizer.chat_template``. LM-head rows of control tokens are zero, so the random models
never stop early on EOS: every request runs to ``max_tokens``. Random acceptance is ~0 (seen:
0 of 183-375 drafts per request). The fixed pair gives real 100 % acceptance (``_fix_output``);
the fixed token of seed 0 is id 511, " General". The EAGLE-3 head is written as llama.cpp's
converter writes one (architecture ``eagle3``: ``fc``, ``blk.0.attn_norm`` / ``attn_norm_2`` /
``attn_q,k,v`` over 2H / ``attn_output`` / ``ffn_*``, ``output_norm``, ``output``, optional I64
``d2t`` of absolute target ids; keys ``eagle3.target_layers`` = [0, 2, 3] (the *inputs* of those
target layers are read), ``eagle3.target_hidden_size``, ``eagle3.norm_before_residual``); it has
no ``token_embd`` and borrows the target's.

The llama-server contract (captured from ``version: 0.5.0-dev (build 1, commit 0c1e570)``,
llama-cpp-python 0.3.36 sdist, run as ``llama-server --host 127.0.0.1 --port P -t 2 -c 1024 -np 1
--metrics -m fixed-target.gguf --spec-type draft-eagle3 -md fixed-eagle3.gguf
--spec-draft-n-max 4`` unless said otherwise). All examples below are real responses.

Start-up and ``/health``
    The HTTP socket is bound *before* the model loads. Until then connecting is refused; while
    loading, ``GET /health`` (and every other endpoint) answers 503 with
    ``{"error":{"message":"Loading model","type":"unavailable_error","code":503}}``; then 200
    ``{"status":"ok"}``. Back-to-back polling saw 17-22 answers of 503 before the 200 (3 starts);
    loads took 0.15-0.45 s here. Without ``-np``/``-c`` the log said ``n_slots = 4, n_ctx_slot =
    4096, kv_unified = 'true'`` (4096 = these models' ``n_ctx_train``).
    SIGTERM: logs ``cleaning up before exit...`` and exits 0.

Log (stdout+stderr; prefix = time since start as ``M.SS.mmm.uuu``, level I/W/E; long lines are
wrapped here, the continuation marked ``+``)::

    0.00.004.605 I srv    load_model: loading model '/tmp/tm3/fixed-target.gguf'
    0.00.010.429 E llama_init_from_model: failed to initialize the context: eagle3 requires
      + ctx_other to be set (this warning is normal during memory fitting)       [harmless]
    0.00.010.548 W operator(): failed to measure the memory of the extra model, fitting without
      + it: failed to create llama_context from model                            [harmless]
    0.00.015.404 I cmn          init: llama threadpool init, n_threads = 2
    0.00.156.072 I common_speculative_init_result: loading draft model
      + '/tmp/tm3/fixed-eagle3.gguf'
    0.00.160.179 I srv    load_model: initializing, n_slots = 1, n_ctx_slot = 1024,
      + kv_unified = 'false'
    0.00.164.690 I srv  llama_server: model loaded
    0.00.164.713 I srv  llama_server: listening on http://127.0.0.1:52593

    ``listening on`` comes after ``model loaded`` although the socket answered 503 before.
    With ``--spec-synth-rates 0.9,0.7,0.5,0.3`` (or ``--spec-synth-len``), after ``initializing``::

    0.00.030.554 W spec common_specu: synthetic speculative acceptance is enabled for
      + benchmarking; generated output is not valid
    0.00.030.589 I spec common_specu: synthetic acceptance: n_max = 4, mean length = 3.400000,
      + rates = [0.9, 0.7, 0.5, 0.3]

    (``--spec-synth-len 2.5`` with n_max 3: ``rates = [0.691414, 0.478053, 0.330533]``.)
    Per request (the acceptance line only when the slot speculates)::

    0.00.254.542 I slot print_timing: id  0 | task 1 | prompt eval time =       8.47 ms /
      + 24 tokens (    0.35 ms per token,  2833.86 tokens per second)
    0.00.254.558 I slot print_timing: id  0 | task 1 |        eval time =       6.94 ms /
      + 8 tokens (    0.99 ms per token,  1008.79 tokens per second)
    0.00.254.559 I slot print_timing: id  0 | task 1 |       total time =      15.41 ms /
      + 32 tokens
    0.00.254.568 I slot print_timing: id  0 | task 1 |    graphs reused =          1
    0.00.254.572 I slot print_timing: id  0 | task 1 | draft acceptance = 1.00000 (    5
      + accepted /     5 generated), mean len =  3.50
    0.00.254.648 I slot      release: id  0 | task 1 | stop processing: n_tokens = 31,
      + truncated = 0

    ``mean len`` = 1 + accepted / verification steps of that request.
    Failures (exit code 1): ``E gguf_init_from_file: failed to open GGUF file '/nonexistent.gguf'
    (No such file or directory)`` ... ``E srv  llama_server: exiting due to model loading error``;
    a taken port: ``E srv         start: couldn't bind HTTP server socket, hostname: 127.0.0.1,
    port: 18112`` then ``exiting due to HTTP server error``.
    TRAP: ``--spec-type draft-eagle3 -md <a plain Llama GGUF>`` does NOT exit: it logs
    ``E srv    load_model: failed to initialize speculative decoding context: draft model is not
    eagle3 (expected 3 extract layers, got 0)`` and then serves *without* speculation.

``POST /v1/completions`` (``{"prompt":..., "max_tokens": 8, "temperature": 0,
"cache_prompt": false}``)::

    {"choices": [{"text": " General General General General General General General General",
      "index": 0, "logprobs": null, "finish_reason": "length"}], "created": 1795942067,
     "model": "/tmp/tm3/fixed-target.gguf", "system_fingerprint": "b1-0c1e570",
     "object": "text_completion",
     "usage": {"completion_tokens": 8, "prompt_tokens": 24, "total_tokens": 32,
               "prompt_tokens_details": {"cached_tokens": 0}},
     "id": "chatcmpl-a9MWUQcol3SFtzfxXu6ANHZdxGANMlAm",
     "timings": {"cache_n": 0, "prompt_n": 24, "prompt_ms": 8.469,
                 "prompt_per_token_ms": 0.352875, "prompt_per_second": 2833.8646829613886,
                 "predicted_n": 8, "predicted_ms": 6.939,
                 "predicted_per_token_ms": 0.9912857142857143,
                 "predicted_per_second": 1008.7908920593746,
                 "draft_n": 5, "draft_n_accepted": 5}}

    ``draft_n`` / ``draft_n_accepted`` (draft tokens proposed / accepted in this request) are
    present only when the slot can speculate; a plain server's ``timings`` end at
    ``predicted_per_second``. ``/v1/chat/completions`` is the same with ``"object":
    "chat.completion"`` and ``choices[0].message = {"role": "assistant", "content": ...}``.
    ``max_tokens`` and ``n_predict`` are aliases. The prompt cache is on by default: an identical
    prompt again gave ``cache_n`` 23 (and ``usage.prompt_tokens_details.cached_tokens``); with
    ``"cache_prompt": false`` it stays 0. A request's ``"seed"`` seeds the synthetic-acceptance
    coin flips (same seed, same ``draft_n_accepted``); without one the source seeds them from
    ``std::random_device``.
    Too long a prompt: 400 ``{"error":{"code":400,"message":"request (6001 tokens) exceeds the
    available context size (1024 tokens), try increasing it","type":"exceed_context_size_error",
    "n_prompt_tokens":6001,"n_ctx":1024}}``.

Streaming (``"stream": true``; SSE ``data: {...}`` lines, then ``data: [DONE]``)
    ``/v1/completions``: one chunk per token (``choices[0].text``, ``finish_reason`` null, no
    ``usage``/``timings``), then a final chunk with ``"text": ""``, ``"finish_reason":
    "length"``, ``usage`` *and* ``timings`` (incl. ``draft_n``) - with or without
    ``stream_options.include_usage``::

        data: {"choices":[{"text":"","index":0,"logprobs":null,"finish_reason":"length"}],...,
               "object":"text_completion","usage":{"completion_tokens":3,"prompt_tokens":5,
               "total_tokens":8,"prompt_tokens_details":{"cached_tokens":1}},"id":"chatcmpl-...",
               "timings":{"cache_n":1,"prompt_n":4,...,"predicted_n":3,...,"draft_n":1,
               "draft_n_accepted":1}}
        data: [DONE]

    ``/v1/chat/completions``: first chunk ``delta: {"role":"assistant","content":null}``, one
    ``delta.content`` chunk per token, a ``finish_reason`` chunk with ``delta: {}``; with
    ``stream_options.include_usage`` then one more chunk ``"choices": []`` carrying ``usage`` and
    ``timings``; without it, ``timings`` (no ``usage``) ride on the ``finish_reason`` chunk.
    Streamed responses say ``Keep-Alive: timeout=5, max=100`` but the server closes the
    connection after them: an httpx client that reuses it fails with ``RemoteProtocolError:
    Server disconnected without sending a response`` (7 of 180 requests in a loop). Sending
    ``Connection: close`` on streamed requests removed it (0 of 360).

``GET /metrics`` (only with ``--metrics``; else 501 ``{"error":{"code":501,"message":"This
server does not support metrics endpoint. Start it with `--metrics`",
"type":"not_supported_error"}}``). Prometheus text, all names prefixed ``llamacpp:``.
    counters: ``prompt_tokens_total``, ``prompt_tokens_cached_total``, ``prompt_seconds_total``,
    ``tokens_predicted_total``, ``tokens_predicted_seconds_total``, ``n_decode_total``,
    ``n_tokens_max`` (a max, typed counter), ``spec_decode_num_draft_tokens_total`` (= sum of
    ``draft_n``), ``spec_decode_num_accepted_tokens_total`` (= sum of ``draft_n_accepted``),
    ``spec_decode_num_drafts_total`` (verification steps), and - only once a draft happened -
    ``spec_decode_num_accepted_tokens_per_pos_total{position="0".."n_max-1"}``;
    gauges: ``prompt_tokens_seconds``, ``predicted_tokens_seconds``, ``requests_processing``,
    ``requests_deferred``, ``n_busy_slots_per_decode``. Accept length = 1 + Δaccepted/Δdrafts.
    Seen after 3 short requests::

        # HELP llamacpp:spec_decode_num_draft_tokens_total Speculative: Total draft tokens generated
        # TYPE llamacpp:spec_decode_num_draft_tokens_total counter
        llamacpp:spec_decode_num_draft_tokens_total 13
        llamacpp:spec_decode_num_accepted_tokens_total 13
        llamacpp:spec_decode_num_drafts_total 7
        llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 7
        llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 2

    ``prometheus_client.parser`` names these families without ``_total``
    (``llamacpp:spec_decode_num_drafts``) and renames the sample ``llamacpp:n_tokens_max`` to
    ``llamacpp:n_tokens_max_total``.

``GET /props`` (fingerprint material)
    ``{"default_generation_settings": {"params": {... sampling defaults ...,
    "speculative.types": "none", ...}, "n_ctx": 1024}, "total_slots": 1, "model_alias":
    "/tmp/tm3/fixed-target.gguf", "model_ftype": "all F32", "model_path":
    "/tmp/tm3/fixed-target.gguf", "endpoint_slots": true, "endpoint_props": false,
    "endpoint_metrics": true, "chat_template": "...", "bos_token": "<s>", "eos_token": "</s>",
    "build_info": "b1-0c1e570", "is_sleeping": false, ...}``. NOTE: ``speculative.types`` here
    says ``"none"`` even with ``--spec-type draft-eagle3``; /props names neither the draft model
    nor ``n_max``. ``build_info`` ends with the commit that ``--version`` prints.

``GET /slots`` (on by default; ``--no-slots`` disables)
    Before any request: ``[{"id": 0, "n_ctx": 1024, "speculative": true, "is_processing":
    false}]``. After one, each slot also has ``id_task``, ``n_prompt_tokens``,
    ``n_prompt_tokens_processed``, ``n_prompt_tokens_cache``, ``next_token: [{...}]`` and
    ``params`` (the last request's sampling params, with ``"speculative.types":
    "none,draft-eagle3"``). ``speculative`` is the only truthful "speculation is on" signal: in the
    trap above it is false while ``params["speculative.types"]`` still says draft-eagle3.

``GET /v1/models``
    ``{"object": "list", "data": [{"id": "/tmp/tm3/fixed-target.gguf", "aliases": [...],
    "object": "model", "owned_by": "llamacpp", "meta": {"vocab_type": 2, "n_vocab": 512,
    "n_ctx": 1024, "n_ctx_train": 4096, "n_embd": 256, "n_params": 2623744, "size": 10494976,
    "ftype": "all F32"}}], "models": [...]}`` (target model only).

Not visible over HTTP at all: the draft model's path, ``--spec-draft-n-max/-n-min/-p-min``,
the synthetic rates (log only). A fingerprint must take those from the launch argv.
Also: ``POST /tokenize {"content": ...}`` -> ``{"tokens": [...]}``, ``POST /detokenize``.
Defaults: ``--spec-draft-n-max`` 3, ``-n-min`` 0, ``-p-min`` 0.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import gguf
import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]

#: Where Debian keeps the GPL-3 text (package base-files); the tokenizer trains on its start.
GPL3 = Path("/usr/share/common-licenses/GPL-3")
#: How much of the training text is used.
TRAIN_BYTES = 8192

#: Used only when GPL-3 is not on the machine. Original text, written for this module.
FALLBACK_TEXT = """\
A speculative decoder guesses a few tokens ahead with a small and cheap model, and the large
model then checks all of those guesses in one forward pass. When the guesses are right the
server moves forward by several tokens for the price of one step; when they are wrong it keeps
the tokens up to the first mistake, takes the large model's own token there, and tries again.
The share of guesses that survive is the acceptance rate, and the average number of tokens that
one verification step yields is the accept length. Both numbers depend on the text: code and
boilerplate are easy to guess, while a poem or a list of random numbers is hard.

A performance test for such a server sends the same prompts, with the same settings, to the same
build on the same machine, and records how many tokens per second come back, how long the first
token takes, and how many drafts were accepted. It repeats the run a few times, because a single
run on a shared machine is noisy, and it compares the numbers with a baseline that was recorded
earlier. A regression is a change that is larger than the noise: the test fails only when the
evidence says that the new build is slower, not when one run happened to be unlucky.

The models used here are tiny and their weights are random. They know nothing about language,
but they run through the same code paths as real models: the tokenizer splits text into bytes
and merges, the attention layers read the cache, the feed-forward layers mix the features, and
the output layer scores every token in the vocabulary. One pair of models is built so that both
the target and the draft head always choose the same token, which makes every draft correct.
Another draft head is random, so that almost no draft is ever accepted. Between those two ends
the server's synthetic acceptance settings give any rate that a test asks for.
"""

#: Control tokens, in id order from 0.
SPECIAL_TOKENS = ("<s>", "</s>", "<|im_start|>", "<|im_end|>")
BOS_ID, EOS_ID, IM_START_ID, EOT_ID = range(len(SPECIAL_TOKENS))
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_CONTROL = 3

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# GPT-2's pre-tokenizer, with ASCII classes standing in for \p{L} and \p{N} (training only:
# llama.cpp applies the merges with its own "gpt-2" pre-tokenizer at run time).
_PRETOKENIZE = re.compile(
    r"'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+"
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable code points (byte-level BPE)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


BYTE_TO_UNICODE = _bytes_to_unicode()


def training_text() -> str:
    """The tokenizer's training text: the start of Debian's GPL-3, else the fallback text."""
    try:
        return GPL3.read_bytes()[:TRAIN_BYTES].decode("utf-8", errors="ignore")
    except OSError:
        return FALLBACK_TEXT


@dataclass(frozen=True)
class Vocab:
    """A byte-level BPE vocabulary as llama.cpp reads it (tokenizer.ggml.model "gpt2")."""

    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    eot_id: int = EOT_ID

    @property
    def size(self) -> int:
        return len(self.tokens)

    @property
    def special_ids(self) -> list[int]:
        return [i for i, t in enumerate(self.token_types) if t == TOKEN_TYPE_CONTROL]

    def token_id(self, text: str) -> int:
        """The id of a token given as plain text (" the"), in byte-level form or not."""
        encoded = "".join(BYTE_TO_UNICODE[b] for b in text.encode("utf-8"))
        return self.tokens.index(encoded)

    def token_text(self, token_id: int) -> str:
        """The plain text of a normal token (byte-level code points mapped back to bytes)."""
        unicode_to_byte = {u: b for b, u in BYTE_TO_UNICODE.items()}
        raw = bytes(unicode_to_byte[c] for c in self.tokens[token_id])
        return raw.decode("utf-8", errors="replace")

    def write_to(self, writer: gguf.GGUFWriter) -> None:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("gpt-2")
        writer.add_token_list(self.tokens)
        writer.add_token_types(self.token_types)
        writer.add_token_merges(self.merges)
        writer.add_bos_token_id(self.bos_id)
        writer.add_eos_token_id(self.eos_id)
        writer.add_eot_token_id(self.eot_id)
        writer.add_add_bos_token(True)
        writer.add_add_eos_token(False)
        writer.add_chat_template(CHATML_TEMPLATE)


def train_vocab(vocab_size: int = 512, text: str | None = None) -> Vocab:
    """Train a byte-level BPE of ``vocab_size`` tokens: control tokens, 256 bytes, merges.

    Deterministic: ties between equally frequent pairs go to the lexicographically smallest.
    """
    n_base = len(SPECIAL_TOKENS) + 256
    if vocab_size < n_base:
        raise ValueError(f"vocab_size must be at least {n_base}")
    text = training_text() if text is None else text
    words = Counter(
        tuple(BYTE_TO_UNICODE[b] for b in piece.encode("utf-8"))
        for piece in _PRETOKENIZE.findall(text)
    )
    corpus: list[tuple[list[str], int]] = [(list(w), n) for w, n in words.items()]
    tokens = [*SPECIAL_TOKENS, *(BYTE_TO_UNICODE[b] for b in range(256))]
    merges: list[str] = []
    while len(tokens) < vocab_size:
        pairs: Counter[tuple[str, str]] = Counter()
        for symbols, n in corpus:
            for pair in itertools.pairwise(symbols):
                pairs[pair] += n
        if not pairs:
            break
        best_count = max(pairs.values())
        a, b = min(p for p, n in pairs.items() if n == best_count)
        merged = a + b
        merges.append(f"{a} {b}")
        tokens.append(merged)
        for symbols, _ in corpus:
            i = 0
            while i < len(symbols) - 1:
                if symbols[i] == a and symbols[i + 1] == b:
                    symbols[i : i + 2] = [merged]
                i += 1
    types = [TOKEN_TYPE_CONTROL] * len(SPECIAL_TOKENS) + [TOKEN_TYPE_NORMAL] * (
        len(tokens) - len(SPECIAL_TOKENS)
    )
    return Vocab(tokens=tokens, token_types=types, merges=merges)


@dataclass(frozen=True)
class Shape:
    """A Llama-style transformer's sizes."""

    n_layer: int = 4
    n_embd: int = 256
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 512
    n_ctx_train: int = 4096
    rms_eps: float = 1e-5
    rope_base: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


TARGET_SHAPE = Shape()
DRAFT_SHAPE = Shape(n_layer=1, n_embd=128, n_head=4, n_head_kv=2, n_ff=256)
#: The EAGLE-3 head: one decoder layer as wide as its target.
EAGLE3_SHAPE = Shape(n_layer=1, n_embd=256, n_head=4, n_head_kv=2, n_ff=512)

#: Scale of the (+e_k, -e_k) unit pairs in a fixed-output FFN (see ``_fix_output``).
FIXED_SCALE = 2.0


def _normal(rng: np.random.Generator, *shape: int, std: float = 0.02) -> F32:
    out: F32 = rng.standard_normal(shape, dtype=np.float32)
    out *= np.float32(std)
    return out


def _ones(n: int) -> F32:
    return np.ones(n, dtype=np.float32)


def _fixed_direction(seed: int, n_embd: int) -> F32:
    out: F32 = np.random.default_rng([seed, 0xF1]).standard_normal(n_embd, dtype=np.float32)
    out /= np.float32(np.linalg.norm(out))
    return out


def _fix_output(
    tensors: dict[str, F32], layer: int, shape: Shape, direction: F32, token_id: int
) -> None:
    """Make the model emit ``token_id`` greedily in every context.

    In ``layer``'s SwiGLU FFN, hidden units 2k and 2k+1 get gate and up rows +s*e_k and -s*e_k
    and down column ``direction``. Their sum is s^2 x_k^2 (sigmoid(s x_k) + sigmoid(-s x_k)) =
    s^2 x_k^2, so the FFN adds s^2 |x|^2 * direction, and x is the RMS-normed FFN input:
    |x|^2 = n_embd whatever the context. That term swamps the small random residual, so after
    the final RMSNorm the hidden state points along ``direction``, and the LM-head row of
    ``token_id`` is set to ``direction``.
    """
    h = shape.n_embd
    if shape.n_ff < 2 * h:
        raise ValueError(f"a fixed-output FFN needs n_ff >= 2 * n_embd ({shape.n_ff} < {2 * h})")
    gate = np.zeros((shape.n_ff, h), dtype=np.float32)
    down = np.zeros((h, shape.n_ff), dtype=np.float32)
    for k in range(h):
        gate[2 * k, k] = FIXED_SCALE
        gate[2 * k + 1, k] = -FIXED_SCALE
        down[:, 2 * k] = direction
        down[:, 2 * k + 1] = direction
    tensors[f"blk.{layer}.ffn_gate.weight"] = gate
    tensors[f"blk.{layer}.ffn_up.weight"] = gate.copy()
    tensors[f"blk.{layer}.ffn_down.weight"] = down
    tensors[f"blk.{layer}.ffn_norm.weight"] = _ones(h)
    tensors["output_norm.weight"] = _ones(h)
    tensors["output.weight"][token_id] = direction


def _write(
    path: Path,
    arch: str,
    name: str,
    shape: Shape,
    vocab: Vocab,
    tensors: dict[str, npt.NDArray[np.float32] | npt.NDArray[np.int64]],
    extra: dict[str, int | bool | list[int]] | None = None,
) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), arch=arch)
    writer.add_name(name)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(shape.n_ctx_train)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_layer_norm_rms_eps(shape.rms_eps)
    writer.add_rope_freq_base(shape.rope_base)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_vocab_size(vocab.size)
    for key, value in (extra or {}).items():
        full = f"{arch}.{key}"
        if isinstance(value, bool):
            writer.add_bool(full, value)
        elif isinstance(value, int):
            writer.add_uint32(full, value)
        else:
            writer.add_array(full, value)
    vocab.write_to(writer)
    for tensor_name, array in tensors.items():
        if array.dtype == np.int64:
            writer.add_tensor(tensor_name, array, raw_dtype=gguf.GGMLQuantizationType.I64)
        else:
            writer.add_tensor(tensor_name, np.ascontiguousarray(array, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _silence_specials(output: F32, vocab: Vocab) -> None:
    """Zero the LM-head rows of control tokens: their logit is 0 while the max of hundreds of
    random logits is positive, so a greedy model never ends a generation early with EOS/EOT."""
    output[vocab.special_ids] = 0.0


def write_llama(
    path: Path,
    vocab: Vocab,
    *,
    seed: int,
    shape: Shape = TARGET_SHAPE,
    fixed_token: int | None = None,
    name: str = "tiny-llama",
) -> Path:
    """Write a Llama GGUF (F32) with random weights; with ``fixed_token``, a fixed-output one."""
    rng = np.random.default_rng(seed)
    h, hd = shape.n_embd, shape.head_dim
    tensors: dict[str, F32] = {
        "token_embd.weight": _normal(rng, vocab.size, h),
        "output_norm.weight": _ones(h),
        "output.weight": _normal(rng, vocab.size, h),
    }
    for i in range(shape.n_layer):
        tensors |= {
            f"blk.{i}.attn_norm.weight": _ones(h),
            f"blk.{i}.attn_q.weight": _normal(rng, shape.n_head * hd, h),
            f"blk.{i}.attn_k.weight": _normal(rng, shape.n_head_kv * hd, h),
            f"blk.{i}.attn_v.weight": _normal(rng, shape.n_head_kv * hd, h),
            f"blk.{i}.attn_output.weight": _normal(rng, h, shape.n_head * hd),
            f"blk.{i}.ffn_norm.weight": _ones(h),
            f"blk.{i}.ffn_gate.weight": _normal(rng, shape.n_ff, h),
            f"blk.{i}.ffn_up.weight": _normal(rng, shape.n_ff, h),
            f"blk.{i}.ffn_down.weight": _normal(rng, h, shape.n_ff),
        }
    _silence_specials(tensors["output.weight"], vocab)
    if fixed_token is not None:
        _fix_output(tensors, shape.n_layer - 1, shape, _fixed_direction(seed, h), fixed_token)
    return _write(path, "llama", name, shape, vocab, dict(tensors))


def default_target_layers(n_layer_target: int) -> list[int]:
    """Which target layers' inputs the head reads: first, middle, last (ids < n_layer)."""
    return [0, n_layer_target // 2, n_layer_target - 1]


def write_eagle3(
    path: Path,
    vocab: Vocab,
    *,
    seed: int,
    target: Shape = TARGET_SHAPE,
    shape: Shape = EAGLE3_SHAPE,
    target_layers: Sequence[int] | None = None,
    draft_vocab_size: int | None = None,
    fixed_token: int | None = None,
    name: str = "tiny-eagle3",
) -> Path:
    """Write an EAGLE-3 draft head GGUF (architecture "eagle3") for a ``target``-shaped model.

    Tensors as llama.cpp's converter writes them from the HF ``LlamaForCausalLMEagle3`` layout:
    ``fc`` [3*H_tgt -> H], one decoder layer whose q/k/v read 2H (embedding and fused target
    features), ``attn_norm`` (input_layernorm), ``attn_norm_2`` (hidden_norm), SwiGLU FFN,
    ``output_norm`` and its own ``output`` (lm_head). No ``token_embd``: the head borrows the
    target's. With ``draft_vocab_size`` below the vocab size, ``output`` covers that many draft
    tokens and ``d2t`` (I64) maps each to its absolute target id. ``fixed_token`` makes the
    head always propose that token (implies the full vocab, no ``d2t``).
    """
    if shape.n_embd != target.n_embd:
        raise ValueError("the head borrows the target's token embeddings: n_embd must match")
    rng = np.random.default_rng(seed)
    h, hd = shape.n_embd, shape.head_dim
    n_draft = (
        vocab.size if draft_vocab_size is None or fixed_token is not None else draft_vocab_size
    )
    tensors: dict[str, F32] = {
        "fc.weight": _normal(rng, h, 3 * target.n_embd),
        "output_norm.weight": _ones(h),
        "output.weight": _normal(rng, n_draft, h),
        "blk.0.attn_norm.weight": _ones(h),
        "blk.0.attn_norm_2.weight": _ones(h),
        "blk.0.attn_q.weight": _normal(rng, shape.n_head * hd, 2 * h),
        "blk.0.attn_k.weight": _normal(rng, shape.n_head_kv * hd, 2 * h),
        "blk.0.attn_v.weight": _normal(rng, shape.n_head_kv * hd, 2 * h),
        "blk.0.attn_output.weight": _normal(rng, h, shape.n_head * hd),
        "blk.0.ffn_norm.weight": _ones(h),
        "blk.0.ffn_gate.weight": _normal(rng, shape.n_ff, h),
        "blk.0.ffn_up.weight": _normal(rng, shape.n_ff, h),
        "blk.0.ffn_down.weight": _normal(rng, h, shape.n_ff),
    }
    all_tensors: dict[str, npt.NDArray[np.float32] | npt.NDArray[np.int64]] = {}
    if n_draft < vocab.size:
        normal_ids = np.array(
            [i for i in range(vocab.size) if i not in set(vocab.special_ids)], dtype=np.int64
        )
        d2t = np.sort(rng.choice(normal_ids, size=n_draft, replace=False)).astype(np.int64)
        all_tensors["d2t"] = d2t
    else:
        _silence_specials(tensors["output.weight"], vocab)
    if fixed_token is not None:
        _fix_output(tensors, 0, shape, _fixed_direction(seed, h), fixed_token)
    layers = default_target_layers(target.n_layer) if target_layers is None else target_layers
    extra: dict[str, int | bool | list[int]] = {
        "target_layers": list(layers),
        "target_hidden_size": target.n_embd,
        "norm_before_residual": False,
    }
    return _write(path, "eagle3", name, shape, vocab, {**tensors, **all_tensors}, extra)


@dataclass(frozen=True)
class TinyModels:
    """What ``generate`` wrote. Paths are absolute."""

    directory: Path
    target: Path
    draft: Path
    eagle3: Path
    fixed_target: Path
    fixed_draft: Path
    fixed_eagle3: Path
    fixed_token_id: int
    fixed_token_text: str
    vocab_size: int
    seed: int
    seconds: float
    files: dict[str, int] = field(default_factory=dict)


def generate(directory: Path, seed: int = 0, vocab_size: int = 512) -> TinyModels:
    """Write the whole set into ``directory`` (created if needed) and a ``manifest.json``.

    * ``target.gguf``: random Llama, 4 layers, hidden 256, 4 heads, 2 KV heads, FFN 512.
    * ``draft.gguf``: random Llama, 1 layer, hidden 128 (for ``--spec-type draft-simple``).
    * ``eagle3.gguf``: random EAGLE-3 head for the target, draft vocab 256 with ``d2t``.
    * ``fixed-target.gguf``, ``fixed-draft.gguf``, ``fixed-eagle3.gguf``: the same shapes, all
      greedily emitting token ``fixed_token_id`` in every context, so drafts from either fixed
      draft are all accepted by the fixed target for real.
    """
    start = time.perf_counter()
    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    vocab = train_vocab(vocab_size)
    fixed = vocab.size - 1  # the last merge: a normal, multi-byte token
    paths = {
        "target": write_llama(directory / "target.gguf", vocab, seed=seed, name="tiny-target"),
        "draft": write_llama(
            directory / "draft.gguf", vocab, seed=seed + 1, shape=DRAFT_SHAPE, name="tiny-draft"
        ),
        "eagle3": write_eagle3(
            directory / "eagle3.gguf", vocab, seed=seed + 2, draft_vocab_size=vocab.size // 2
        ),
        "fixed_target": write_llama(
            directory / "fixed-target.gguf",
            vocab,
            seed=seed + 3,
            fixed_token=fixed,
            name="tiny-fixed-target",
        ),
        "fixed_draft": write_llama(
            directory / "fixed-draft.gguf",
            vocab,
            seed=seed + 4,
            shape=DRAFT_SHAPE,
            fixed_token=fixed,
            name="tiny-fixed-draft",
        ),
        "fixed_eagle3": write_eagle3(
            directory / "fixed-eagle3.gguf",
            vocab,
            seed=seed + 5,
            fixed_token=fixed,
            name="tiny-fixed-eagle3",
        ),
    }
    models = TinyModels(
        directory=directory,
        **paths,
        fixed_token_id=fixed,
        fixed_token_text=vocab.token_text(fixed),
        vocab_size=vocab.size,
        seed=seed,
        seconds=time.perf_counter() - start,
        files={p.name: p.stat().st_size for p in paths.values()},
    )
    manifest = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(models).items()}
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return models


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    models = generate(args.directory, seed=args.seed)
    print(json.dumps({k: str(v) for k, v in asdict(models).items()}, indent=2))


if __name__ == "__main__":
    main()
