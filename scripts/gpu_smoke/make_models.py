#!/usr/bin/env python3
"""Build the tiny models of scripts/gpu-smoke: a Llama target and two EAGLE3 draft heads.

    python3 scripts/gpu_smoke/make_models.py OUTDIR [--verify] [--hf-check]

writes OUTDIR/tiny-llama, OUTDIR/tiny-eagle3-match and OUTDIR/tiny-eagle3-miss, and
OUTDIR/models.json (the chosen tokens, the proven margins, file hashes).

What they do, by construction (not by training):

* ``tiny-llama`` (LlamaForCausalLM: hidden 256, 4 layers, 4 heads / 2 KV heads, intermediate 512,
  vocab 2048, bf16) answers every prompt greedily with the same token X (" the"). Dimension 0 of
  every embedding row is 1.0; row 0 of every o_proj and down_proj is zero, so no layer writes into
  dimension 0 and the residual stream keeps x[0] = 1.0 exactly. lm_head row X is L*e0 and every
  other row has a zero in column 0. After the final RMSNorm (weights 1) the logits are
  ``L/rms`` for X and ``row_j . x[1:] / rms`` for any other j, so X wins whenever
  ``L > max_j |row_j| * |x[1:]|``. |x[1:]| is bounded from the weights' spectral norms
  (``_layer_bound``): the bound holds for every prompt, position and attention pattern, and
  L is set to MARGIN times what it needs.
* ``tiny-eagle3-match`` (LlamaForCausalLMEagle3, 1 layer, draft vocab 1024) proposes X at every
  draft step: fc row 0 copies dimension 0 of the first aux hidden state (1.0) into draft
  dimension 0, the draft layer again cannot write into dimension 0, and draft lm_head row
  t2d(X) is L*e0. SGLang maps draft ids to target ids through ``d2t``: target = draft +
  d2t[draft] (sglang/srt/models/llama_eagle3.py: ``hot_token_id = d2t + arange``). Every draft
  token is accepted: accept length = num_steps + 1 (3.00 for 2 steps) by SGLang's definition.
* ``tiny-eagle3-miss`` is the same head with lm_head row t2d(Y) = L*e0 for a token Y != X: every
  draft token is rejected, accept length 1.00.

The draft vocabulary is a non-trivial subset of the target's (so a reversed d2t would pick the
wrong token and the match draft would stop matching). Everything is seeded: the same versions of
torch and tokenizers give byte-identical files.

Needs torch, safetensors, tokenizers (numpy through torch). --hf-check also needs transformers:
it runs the target in transformers and compares with this file's own forward pass.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

SHAPES = {
    # the host-bound smoke models of 2026-12-01/02 (CPU-checkable in seconds)
    "tiny": {
        "HIDDEN": 256,
        "LAYERS": 4,
        "HEADS": 4,
        "KV_HEADS": 2,
        "INTER": 512,
        "VOCAB": 2048,
        "DRAFT_VOCAB": 1024,
        "AUX_LAYERS": [0, 1, 2],
        "EPS": 1e-6,
        "ROPE_THETA": 10000.0,
        "MAX_POS": 4096,
        "PREFIX": "tiny",
        "TARGET_DIR": "tiny-llama",
        "SPECTRAL": True,
        "DRAFT_EMBED": True,
    },
    # Llama-3.1-8B's shape and size (8.03 B parameters, 16.1 GB in bf16) with the EAGLE3 head
    # of the published draft's shape (1 layer, draft vocabulary 32000): random weights built on
    # the GPU with the same construction. Rope is plain (theta 500000, no llama3 scaling) and
    # the context 8192: neither changes the bytes a decode step reads. Margins are proven with
    # Frobenius norms (cheap on the GPU, looser than spectral norms, still upper bounds).
    "llama8b": {
        "HIDDEN": 4096,
        "LAYERS": 32,
        "HEADS": 32,
        "KV_HEADS": 8,
        "INTER": 14336,
        "VOCAB": 128256,
        "DRAFT_VOCAB": 32000,
        "AUX_LAYERS": [1, 15, 28],
        "EPS": 1e-5,
        "ROPE_THETA": 500000.0,
        "MAX_POS": 8192,
        "PREFIX": "llama8b",
        "TARGET_DIR": "llama8b",
        "SPECTRAL": False,
        "DRAFT_EMBED": False,
    },
}
SHAPE = "tiny"
HIDDEN = LAYERS = HEADS = KV_HEADS = HEAD_DIM = INTER = VOCAB = DRAFT_VOCAB = 0
AUX_LAYERS: list[int] = []  # eagle_aux_hidden_state_layer_ids; SGLang captures input of i+1
EPS = ROPE_THETA = 0.0
MAX_POS = 0
PREFIX = "tiny"
TARGET_DIR = "tiny-llama"
SPECTRAL = DRAFT_EMBED = True
DEVICE = "cpu"


def set_shape(name: str, device: str = "cpu") -> None:
    """Make the module's size constants those of SHAPES[name] (the forward pass reads them)."""
    g = globals()
    g.update(SHAPES[name])
    g["SHAPE"] = name
    g["HEAD_DIM"] = g["HIDDEN"] // g["HEADS"]
    g["DEVICE"] = device


set_shape("tiny")
SEED = 20261201
TOKENIZER_VOCAB = 2048  # the same byte-level BPE for every shape (the model vocab may be larger)
WEIGHT_STD = 0.02  # the random part of every projection
EMBED_SPREAD = 0.05  # embedding dims 1.. are uniform in [-EMBED_SPREAD, EMBED_SPREAD], then
# every row's dims 1.. are scaled to the same norm, so that the first layer norm gives every
# token the same value in dim 0 (the first-only head's marker needs a constant)
MARGIN = 4.0  # L is MARGIN times the smallest value the bound needs
DRAFT_STEPS_PROVEN = 8  # the draft bound covers this many chained draft steps
FIRST_MARKER = 2 / 3  # first-only head: lm_head row Y = FIRST_MARKER * L / marker on dim 1
X_TEXT = " the"
Y_TEXT = " and"
EOS = "<|endoftext|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


# -- tokenizer --------------------------------------------------------------------------------


def prompt_texts(repo: Path) -> list[str]:
    """The plugin's own workload texts (pytest_specdecode/prompts/ or the older workloads/)."""
    for sub in ("prompts", "workloads"):
        files = sorted((repo / "pytest_specdecode" / sub).glob("*.jsonl"))
        if files:
            texts = []
            for f in files:
                for line in f.read_text(encoding="utf-8").splitlines():
                    if line.strip():
                        texts.append(json.loads(line)["text"])
            return texts
    raise SystemExit(f"no workload texts under {repo}/pytest_specdecode/{{prompts,workloads}}/")


def train_tokenizer(texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        min_frequency=1,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def save_tokenizer(tok, out: Path) -> None:
    tok.save(str(out / "tokenizer.json"))
    eos_id = tok.token_to_id(EOS)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": MAX_POS,
        "bos_token": None,
        "eos_token": EOS,
        "pad_token": EOS,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(eos_id): {
                "content": EOS,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
        },
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": EOS, "pad_token": EOS}, indent=2) + "\n"
    )


# -- weights ----------------------------------------------------------------------------------


def bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).contiguous()


def f32(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float32)


def spec(w: torch.Tensor) -> float:
    """An upper bound of the spectral norm of a weight: the spectral norm itself (tiny shape,
    on the CPU) or the Frobenius norm (large shapes: an SVD of 224 matrices is minutes)."""
    if SPECTRAL:
        return float(torch.linalg.matrix_norm(f32(w), ord=2))
    return float(f32(w).norm())


def randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, device=DEVICE) * WEIGHT_STD


def _layer_weights(gen: torch.Generator, in_dim: int) -> dict[str, torch.Tensor]:
    """One Llama decoder layer whose o_proj and down_proj cannot write into dimension 0."""
    w = {
        "self_attn.q_proj.weight": randn(gen, HEADS * HEAD_DIM, in_dim),
        "self_attn.k_proj.weight": randn(gen, KV_HEADS * HEAD_DIM, in_dim),
        "self_attn.v_proj.weight": randn(gen, KV_HEADS * HEAD_DIM, in_dim),
        "self_attn.o_proj.weight": randn(gen, HIDDEN, HEADS * HEAD_DIM),
        "mlp.gate_proj.weight": randn(gen, INTER, HIDDEN),
        "mlp.up_proj.weight": randn(gen, INTER, HIDDEN),
        "mlp.down_proj.weight": randn(gen, HIDDEN, INTER),
        "input_layernorm.weight": torch.ones(HIDDEN, device=DEVICE),
        "post_attention_layernorm.weight": torch.ones(HIDDEN, device=DEVICE),
    }
    w["self_attn.o_proj.weight"][0].zero_()
    w["mlp.down_proj.weight"][0].zero_()
    return {k: bf16(v) for k, v in w.items()}


def _layer_bound(w: dict[str, torch.Tensor], attn_in_norm: float) -> float:
    """Upper bound of |what one layer adds to the residual stream| (dims 1..; dim 0 gets 0).

    attn_in_norm bounds |input of qkv| (sqrt(H) for a normed vector with weights 1, sqrt(2H)
    for the EAGLE3 input layer's concatenation). Attention output of a head is a convex
    combination of its values, so |head out| <= |W_v(kv head)| * attn_in_norm; |silu(g)| <= |g|
    gives |silu(g) * u| <= |g|_inf |u| <= |W_g| |W_u| H.
    """
    sqrt_h = math.sqrt(HIDDEN)
    v = w["self_attn.v_proj.weight"]
    per_kv = [spec(v[i * HEAD_DIM : (i + 1) * HEAD_DIM]) * attn_in_norm for i in range(KV_HEADS)]
    group = HEADS // KV_HEADS
    attn = math.sqrt(sum(group * b * b for b in per_kv))
    attn_out = spec(w["self_attn.o_proj.weight"]) * attn
    ln_max = float(f32(w["post_attention_layernorm.weight"]).abs().max())
    mlp_in = sqrt_h * ln_max
    mlp = spec(w["mlp.gate_proj.weight"]) * mlp_in * spec(w["mlp.up_proj.weight"]) * mlp_in
    mlp_out = spec(w["mlp.down_proj.weight"]) * mlp
    return attn_out + mlp_out


def _pow2_at_least(x: float) -> float:
    return 2.0 ** math.ceil(math.log2(max(x, 1.0)))  # exact in bf16


def _lm_head(
    gen: torch.Generator, rows: int, winners: dict[int, tuple[int, float]], big: float
) -> torch.Tensor:
    """lm_head whose rows in `winners` read one dimension (row -> (dim, weight)); every other
    row has zeros in columns 0 and 1, the dimensions the winners read."""
    head = randn(gen, rows, HIDDEN)
    head[:, :2] = 0.0
    head = bf16(head)
    for row, (dim, weight) in winners.items():
        head[row].zero_()
        head[row, dim] = weight
    return head


def _head_bound(gen: torch.Generator, rows: int, rest_bound: float) -> tuple[float, dict]:
    """L for an lm_head drawn next from `gen` (same draw as _lm_head): the winner's logit
    L/rms beats every other row (|row| * |x[2:]| / rms) by FIRST_MARKER's gap with MARGIN."""
    state = gen.get_state()
    head = randn(gen, rows, HIDDEN)
    head[:, :2] = 0.0
    r_max = float(f32(bf16(head)).norm(dim=1).max())
    gen.set_state(state)
    needed = r_max * rest_bound
    # the first-only head's winners are L apart by (1 - FIRST_MARKER) L at worst: ask for that
    big = _pow2_at_least(needed * MARGIN / (1 - FIRST_MARKER))
    gap = (1 - FIRST_MARKER) * big
    return big, {
        "L": big,
        "row_norm_max": r_max,
        "rest_norm_bound": rest_bound,
        "needed_L": needed,
        "margin": gap / needed,
    }


def _save(tensors: dict[str, torch.Tensor], out: Path, shard_bytes: int = 4 << 30) -> None:
    """model.safetensors, or model-0000i-of-0000n.safetensors + index past shard_bytes."""
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    total = sum(v.numel() * v.element_size() for v in tensors.values())
    if total <= shard_bytes:
        save_file({k: v.cpu() for k, v in tensors.items()}, str(out / "model.safetensors"),
                  metadata={"format": "pt"})  # fmt: skip
        return
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for k, v in tensors.items():
        n = v.numel() * v.element_size()
        if size and size + n > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][k] = v
        size += n
    weight_map = {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({k: v.cpu() for k, v in shard.items()}, str(out / name),
                  metadata={"format": "pt"})  # fmt: skip
        weight_map.update(dict.fromkeys(shard, name))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def build(repo: Path, out: Path) -> dict:
    t0 = time.monotonic()
    texts = prompt_texts(repo)
    tok = train_tokenizer(texts)
    x_id = tok.token_to_id("Ġthe")
    y_id = tok.token_to_id("Ġand")
    if x_id is None or y_id is None:
        raise SystemExit("the trained tokenizer has no ' the' / ' and' token")
    eos_id = tok.token_to_id(EOS)
    gen = torch.Generator(device=DEVICE).manual_seed(SEED)

    # target -----------------------------------------------------------------------------------
    emb = (torch.rand(VOCAB, HIDDEN, generator=gen, device=DEVICE) * 2 - 1) * EMBED_SPREAD
    rest_norm = EMBED_SPREAD * math.sqrt((HIDDEN - 1) / 3)  # what the uniform draw gives
    emb[:, 1:] *= rest_norm / emb[:, 1:].norm(dim=1, keepdim=True)
    emb[:, 0] = 1.0
    emb = bf16(emb)
    target: dict[str, torch.Tensor] = {"model.embed_tokens.weight": emb}
    rest = float(f32(emb[:, 1:]).norm(dim=1).max())
    per_layer = []
    for i in range(LAYERS):
        w = _layer_weights(gen, HIDDEN)
        b = _layer_bound(w, math.sqrt(HIDDEN))
        per_layer.append(b)
        for k, v in w.items():
            target[f"model.layers.{i}.{k}"] = v
    target_rest = rest + sum(per_layer)
    target["model.norm.weight"] = bf16(torch.ones(HIDDEN, device=DEVICE))
    big_t, target_proof = _head_bound(gen, VOCAB, target_rest)
    target["lm_head.weight"] = _lm_head(gen, VOCAB, {x_id: (0, big_t)}, big_t)
    # The aux hidden states SGLang hands the draft: the residual stream before layer i+1.
    aux_rest = [rest + sum(per_layer[: i + 1]) for i in AUX_LAYERS]

    # draft vocabulary: DRAFT_VOCAB target ids, sorted, X and Y among them, not the identity ---
    perm = torch.randperm(VOCAB, generator=gen, device=DEVICE).tolist()
    others = [t for t in perm if t not in (x_id, y_id)][: DRAFT_VOCAB - 2]
    hot = sorted({x_id, y_id, *others})
    assert len(hot) == DRAFT_VOCAB
    d2t = torch.tensor([t - d for d, t in enumerate(hot)], dtype=torch.int64)
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[hot] = True
    dx, dy = hot.index(x_id), hot.index(y_id)

    # draft heads (shared body; only lm_head differs) -----------------------------------------
    fc = randn(gen, HIDDEN, HIDDEN * len(AUX_LAYERS))
    fc[0].zero_()
    fc[0, 0] = 1.0  # draft dim 0 := aux state 0, dim 0 (= 1.0)
    fc[1].zero_()  # draft dim 1 := 0 at the first draft position (the marker starts there)
    fc[2:, [HIDDEN * k for k in range(len(AUX_LAYERS))]] = 0.0  # nothing else reads dim 0
    fc = bf16(fc)
    dlayer = _layer_weights(gen, 2 * HIDDEN)
    # The marker: v_proj row 0 (kv head 0, channel 0) reads only the normed token embedding's
    # dim 0, the same constant c0 for every token (rows of equal norm), so attention head 0's
    # channel 0 is that constant whatever it attends to; o_proj row 1 copies it into dim 1,
    # and nothing else writes dim 1 (down_proj row 1 = 0). Dim 1 of the draft's hidden state is
    # then 0 + m after the first draft forward (fed by fc) and k*m after the k-th (fed by its
    # own previous state): the first-only head reads it.
    c0 = 1.0 / math.sqrt((1.0 + rest_norm**2) / HIDDEN + EPS)
    a = 2.0 ** -round(math.log2(c0))
    v = dlayer["self_attn.v_proj.weight"]
    v[0].zero_()
    v[0, 0] = a
    o = dlayer["self_attn.o_proj.weight"]
    o[1].zero_()
    o[1, 0] = 1.0
    dlayer["mlp.down_proj.weight"][1].zero_()
    dlayer["hidden_norm.weight"] = bf16(torch.ones(HIDDEN, device=DEVICE))
    e32 = f32(emb)
    c0_tok = e32[:, 0] / torch.sqrt(e32.pow(2).mean(dim=1) + EPS)
    marker = (float(c0_tok.min()) * a, float(c0_tok.max()) * a)  # m, up to bf16 rounding
    aux_cat = math.sqrt(sum(1.0 + r * r for r in aux_rest))
    fc_rest = spec(f32(fc)[1:]) * aux_cat
    d_layer = _layer_bound(dlayer, math.sqrt(2 * HIDDEN))
    # step 1 starts from fc(aux); each further draft step starts from the last pre-norm
    # residual: the rest grows by at most one layer bound per step.
    draft_rest = fc_rest + DRAFT_STEPS_PROVEN * d_layer
    body = {"fc.weight": fc, "norm.weight": bf16(torch.ones(HIDDEN, device=DEVICE))}
    if DRAFT_EMBED:
        body["embed_tokens.weight"] = emb.clone()
    for k, w in dlayer.items():
        body[f"midlayer.{k}"] = w
    body["d2t"] = d2t
    body["t2d"] = t2d
    big_d, draft_proof = _head_bound(gen, DRAFT_VOCAB, draft_rest)
    m_mid = sum(marker) / 2
    y_weight = float(bf16(torch.tensor(FIRST_MARKER * big_d / m_mid)))
    winners = {
        "match": {dx: (0, big_d)},
        "miss": {dy: (0, big_d)},
        # step 1: L (X) against y_weight * m = 2/3 L (Y); step k >= 2: L against 4/3 L, 2 L, ...
        "first": {dx: (0, big_d), dy: (1, y_weight)},
    }
    state = gen.get_state()
    heads = {}
    for name, rows in winners.items():
        gen.set_state(state)  # the heads differ only in which rows read dims 0 and 1
        heads[name] = _lm_head(gen, DRAFT_VOCAB, rows, big_d)
    first_proof = {
        "marker_range": marker,
        "y_weight": y_weight,
        "step1_y_over_x": y_weight * marker[1] / big_d,
        "step2_y_over_x": 2 * y_weight * marker[0] / big_d,
    }
    assert first_proof["step1_y_over_x"] < 0.75, first_proof
    assert first_proof["step2_y_over_x"] > 1.25, first_proof

    # write ------------------------------------------------------------------------------------
    built_s = time.monotonic() - t0
    tdir = out / TARGET_DIR
    tdir.mkdir(parents=True, exist_ok=True)
    _save(target, tdir)
    tconfig = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "pad_token_id": eos_id,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": INTER,
        "max_position_embeddings": MAX_POS,
        "mlp_bias": False,
        "num_attention_heads": HEADS,
        "num_hidden_layers": LAYERS,
        "num_key_value_heads": KV_HEADS,
        "pretraining_tp": 1,
        "rms_norm_eps": EPS,
        "rope_parameters": {"rope_theta": ROPE_THETA, "rope_type": "default"},
        "rope_theta": ROPE_THETA,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": VOCAB,
    }
    (tdir / "config.json").write_text(json.dumps(tconfig, indent=2) + "\n")
    (tdir / "generation_config.json").write_text(
        json.dumps({"bos_token_id": eos_id, "eos_token_id": eos_id, "do_sample": False}, indent=2)
        + "\n"
    )
    save_tokenizer(tok, tdir)

    files = {}
    for name in winners:
        ddir = out / f"{PREFIX}-eagle3-{name}"
        ddir.mkdir(parents=True, exist_ok=True)
        tensors = dict(body)
        tensors["lm_head.weight"] = heads[name]
        _save(tensors, ddir)
        dconfig = dict(tconfig)
        dconfig.update(
            {
                "architectures": ["LlamaForCausalLMEagle3"],
                "num_hidden_layers": 1,
                "draft_vocab_size": DRAFT_VOCAB,
                "target_hidden_size": HIDDEN,
                "eagle_config": {
                    "eagle_aux_hidden_state_layer_ids": AUX_LAYERS,
                    "use_aux_hidden_state": True,
                    "use_input_layernorm_in_first_layer": True,
                    "use_last_layernorm": True,
                    "use_mtp_layernorm": False,
                },
            }
        )
        (ddir / "config.json").write_text(json.dumps(dconfig, indent=2) + "\n")
        save_tokenizer(tok, ddir)
        files[name] = ddir
    n_target = sum(v.numel() for v in target.values())
    n_draft = (
        sum(v.numel() for k, v in body.items() if k not in ("d2t", "t2d")) + heads["match"].numel()
    )
    info = {
        "shape": SHAPE,
        "device": str(DEVICE),
        "built_s": round(built_s, 2),
        "written_s": round(time.monotonic() - t0 - built_s, 2),
        "seed": SEED,
        "target_params": n_target,
        "target_bytes": sum(v.numel() * v.element_size() for v in target.values()),
        # what one decode step must read: every weight but the embedding (one row of it)
        "target_bytes_per_step": sum(
            v.numel() * v.element_size() for k, v in target.items() if "embed_tokens" not in k
        ),
        "draft_params": n_draft,
        "draft_bytes_per_step": 2 * n_draft,
        "x": {"id": x_id, "text": X_TEXT, "draft_id": dx},
        "y": {"id": y_id, "text": Y_TEXT, "draft_id": dy},
        "eos_id": eos_id,
        "tokenizer_vocab": tok.get_vocab_size(),
        "d2t_nonzero": int((d2t != 0).sum()),
        "proof": {
            "target": target_proof,
            "draft": draft_proof,
            "first_only": first_proof,
            "norm_bound": "spectral" if SPECTRAL else "frobenius",
            "target_layer_bounds": per_layer,
            "draft_layer_bound": d_layer,
            "draft_steps_proven": DRAFT_STEPS_PROVEN,
        },
    }
    if SHAPE == "tiny":  # the big shape's files are 16 GB: hashing them costs more than building
        info["sha256"] = {
            str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
            for d in (tdir, *files.values())
            for p in sorted(d.iterdir())
        }
    (out / f"models-{PREFIX}.json").write_text(json.dumps(info, indent=2) + "\n")
    (out / "models.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


# -- an independent forward pass, for --verify ------------------------------------------------


def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def _rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    # x: (T, heads, D); neox style (rotate halves), as HF Llama and SGLang's llama use
    half = HEAD_DIM // 2
    inv = 1.0 / (ROPE_THETA ** (torch.arange(0, half, dtype=torch.float64) / half))
    ang = pos[:, None].double() * inv[None, :]
    cos, sin = torch.cos(ang).float()[:, None, :], torch.sin(ang).float()[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def _attn(w: dict, prefix: str, h: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    t = h.shape[0]
    q = (h @ f32(w[prefix + "self_attn.q_proj.weight"]).T).view(t, HEADS, HEAD_DIM)
    k = (h @ f32(w[prefix + "self_attn.k_proj.weight"]).T).view(t, KV_HEADS, HEAD_DIM)
    v = (h @ f32(w[prefix + "self_attn.v_proj.weight"]).T).view(t, KV_HEADS, HEAD_DIM)
    q, k = _rope(q, pos), _rope(k, pos)
    rep = HEADS // KV_HEADS
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(HEAD_DIM)
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    scores = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    o = torch.einsum("hts,shd->thd", scores, v).reshape(t, HEADS * HEAD_DIM)
    return o @ f32(w[prefix + "self_attn.o_proj.weight"]).T


def _mlp(w: dict, prefix: str, h: torch.Tensor) -> torch.Tensor:
    g = h @ f32(w[prefix + "mlp.gate_proj.weight"]).T
    u = h @ f32(w[prefix + "mlp.up_proj.weight"]).T
    return (torch.nn.functional.silu(g) * u) @ f32(w[prefix + "mlp.down_proj.weight"]).T


def target_forward(w: dict, ids: list[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Logits (T, V) and the aux hidden states SGLang captures (input of layers 1, 2, 3)."""
    pos = torch.arange(len(ids))
    x = f32(w["model.embed_tokens.weight"])[ids]
    aux = []
    for i in range(LAYERS):
        if i in [a + 1 for a in AUX_LAYERS]:
            aux.append(x.clone())
        p = f"model.layers.{i}."
        x = x + _attn(w, p, _rms(x, f32(w[p + "input_layernorm.weight"])), pos)
        x = x + _mlp(w, p, _rms(x, f32(w[p + "post_attention_layernorm.weight"])))
    logits = _rms(x, f32(w["model.norm.weight"])) @ f32(w["lm_head.weight"]).T
    return logits, aux


def draft_forward(
    d: dict, emb: torch.Tensor, ids: list[int], hidden: torch.Tensor, pos: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's LlamaForCausalLMEagle3 forward (one layer): draft logits and its aux output."""
    if hidden.shape[-1] != HIDDEN:
        hidden = hidden @ f32(d["fc.weight"]).T
    p = "midlayer."
    residual = hidden
    h = torch.cat(
        [
            _rms(emb[ids], f32(d[p + "input_layernorm.weight"])),
            _rms(hidden, f32(d[p + "hidden_norm.weight"])),
        ],
        dim=-1,
    )
    x = residual + _attn(d, p, h, pos)
    x = x + _mlp(d, p, _rms(x, f32(d[p + "post_attention_layernorm.weight"])))
    logits = _rms(x, f32(d["norm.weight"])) @ f32(d["lm_head.weight"]).T
    return logits, x


def _load_dir(d: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(d.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    return tensors


def verify(out: Path, hf_check: bool) -> None:
    from tokenizers import Tokenizer

    info = json.loads((out / f"models-{PREFIX}.json").read_text())
    x_id, y_id = info["x"]["id"], info["y"]["id"]
    tok = Tokenizer.from_file(str(out / TARGET_DIR / "tokenizer.json"))
    assert tok.decode([x_id]) == X_TEXT
    assert tok.decode([y_id]) == Y_TEXT
    w = _load_dir(out / TARGET_DIR)
    drafts = {n: _load_dir(out / f"{PREFIX}-eagle3-{n}") for n in ("match", "miss", "first")}
    emb = f32(w["model.embed_tokens.weight"])
    gen = torch.Generator().manual_seed(7)
    prompts = ["Hello", "The quick brown fox", "def f(x):\n    return x", "1 + 1 =", "a"]
    prompts += [t[:400] for t in prompt_texts(Path(__file__).resolve().parents[2])]
    worst = math.inf
    worst_draft = {"match": math.inf, "miss": math.inf, "first": math.inf}
    n = 0
    for text in prompts:
        ids = tok.encode(text).ids
        for extra in (0, 17, 200):  # the prompt followed by X repeated (what decoding feeds)
            seq = ids + [x_id] * extra
            if extra == 200:  # and random tokens, for good measure
                seq = ids + torch.randint(0, VOCAB, (64,), generator=gen).tolist()
            logits, aux = target_forward(w, seq)
            top2 = logits.topk(2, dim=-1)
            assert (top2.indices[:, 0] == x_id).all(), f"target picks {top2.indices[:, 0]}"
            worst = min(worst, float((top2.values[:, 0] - top2.values[:, 1]).min()))
            pos = torch.arange(len(seq))
            hot = torch.arange(DRAFT_VOCAB) + drafts["match"]["d2t"]
            # what each head proposes at draft steps 1, 2, 3
            wants = {"match": [x_id] * 3, "miss": [y_id] * 3, "first": [x_id, y_id, y_id]}
            for name, want_steps in wants.items():
                d = drafts[name]
                # draft extend over the sequence (input: token t+1 with the target's states at t)
                hidden = torch.cat(aux, dim=-1)
                dl, dh = draft_forward(d, emb, [*seq[1:], x_id], hidden, pos)
                for want in want_steps:  # then chained draft steps from its own hidden state
                    t2 = dl.topk(2, dim=-1)
                    got = (torch.arange(DRAFT_VOCAB) + d["d2t"])[t2.indices[:, 0]]
                    assert (got == want).all(), f"draft {name} picks {got.unique()}, not {want}"
                    worst_draft[name] = min(
                        worst_draft[name], float((t2.values[:, 0] - t2.values[:, 1]).min())
                    )
                    dl, dh = draft_forward(d, emb, [want] * len(seq), dh, pos + 1)
            assert hot[info["x"]["draft_id"]] == x_id
            n += 1
    print(
        f"verify: {n} sequences: target greedy = {X_TEXT!r} (id {x_id}) everywhere, smallest "
        f"logit gap {worst:.1f}; draft 'match' proposes {X_TEXT!r} (gap "
        f"{worst_draft['match']:.1f}), draft 'miss' proposes {Y_TEXT!r} (id {y_id}, gap "
        f"{worst_draft['miss']:.1f}), draft 'first' {X_TEXT!r} then {Y_TEXT!r} (gap "
        f"{worst_draft['first']:.1f}), through d2t (draft id -> target id = id + d2t[id])"
    )
    if hf_check:
        import transformers

        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(out / TARGET_DIR), dtype=torch.float32
        )
        hf_tok = transformers.AutoTokenizer.from_pretrained(str(out / TARGET_DIR))
        for text in prompts[:12]:
            enc = hf_tok(text, return_tensors="pt")
            ids = enc.input_ids
            gen_ids = model.generate(
                ids,
                attention_mask=enc.attention_mask,
                max_new_tokens=24,
                do_sample=False,
                pad_token_id=info["eos_id"],
            )[0, ids.shape[1] :]
            assert (gen_ids == x_id).all(), f"transformers generated {gen_ids.tolist()}"
            mine, _ = target_forward(w, ids[0].tolist())
            with torch.no_grad():
                theirs = model(ids).logits[0]
            diff = float((mine - theirs).abs().max())
            assert diff < 1e-2 * float(theirs.abs().max()), f"forward differs by {diff}"
        print(
            f"hf-check: transformers {transformers.__version__} generates only {X_TEXT!r} "
            f"(24 greedy tokens, {min(12, len(prompts))} prompts) and its logits match this "
            f"file's forward pass"
        )


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[2])
    ap.add_argument("--verify", action="store_true", help="check the models with own forward")
    ap.add_argument("--hf-check", action="store_true", help="also run the target in transformers")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--device", default=None, help="where to build (default: cuda if there)")
    args = ap.parse_args(argv)
    gpu = args.shape != "tiny" and torch.cuda.is_available()
    device = args.device or ("cuda" if gpu else "cpu")
    set_shape(args.shape, device)
    torch.manual_seed(SEED)
    info = build(args.repo, args.outdir)
    p = info["proof"]
    first = p["first_only"]
    print(
        f"models in {args.outdir}: X={info['x']['text']!r} (id {info['x']['id']}, draft id "
        f"{info['x']['draft_id']}), Y={info['y']['text']!r} (id {info['y']['id']}, draft id "
        f"{info['y']['draft_id']}); proven margins: target {p['target']['margin']:.1f}x, "
        f"draft {p['draft']['margin']:.1f}x ({p['norm_bound']} norms); first-only head: Y/X "
        f"{first['step1_y_over_x']:.2f} at step 1, {first['step2_y_over_x']:.2f} "
        f"at step 2; {info['target_params'] / 1e9:.2f} B target parameters built in "
        f"{info['built_s']} s on {info['device']}, written in {info['written_s']} s"
    )
    if args.verify or args.hf_check:
        verify(args.outdir, args.hf_check)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
