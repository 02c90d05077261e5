"""Secrets never leave this process: one place that decides what looks secret and hides it.

Used wherever configuration is written down or shown: baselines, reports, history, server logs.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from typing import Any

REDACTED = "<redacted>"

SPEED_ENV_PATTERNS: tuple[str, ...] = (
    # Collective communication: the seed's 62.9 vs 88.8 tok/s came from losing these.
    "NCCL_*",
    "NVSHMEM_*",
    # Server, runtime and kernel tuning.
    "SGLANG_*",
    "CUDA_*",
    "CUBLAS_*",
    "CUBLASLT_*",
    "CUDNN_*",
    "TORCH_*",
    "PYTORCH_*",
    "TORCHINDUCTOR_*",
    "TRITON_*",
    "FLASHINFER_*",
    "LLAMA_ARG_*",  # llama-server reads most of its flags from these
    "GGML_*",
    # CPU-side threads used by tokenisation and the scheduler.
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "TOKENIZERS_PARALLELISM",
)
"""Environment variable names (``fnmatch`` globs) whose values can change measured speed and
are therefore recorded in provenance. ``HF_*`` is deliberately absent: ``HF_HUB_OFFLINE`` and
friends change how a model is fetched, not how fast it decodes, and ``HF_TOKEN`` lives there."""

# TOKEN matches HF_TOKEN or GITHUB_TOKEN but not MAX_TOKENS, NUM_DRAFT_TOKENS or
# TOKENIZERS_PARALLELISM: those are speed settings, and redacting a hard fingerprint field
# would make a real configuration change invisible.
_SECRET_NAME = re.compile(
    r"TOKEN(?!S|IZER)|SECRET|KEY|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|AUTHORIZATION|COOKIE",
    re.IGNORECASE,
)
_ASSIGNMENT = re.compile(r"^(-{0,2}[A-Za-z_][A-Za-z0-9_.-]*)=(.*)$", re.DOTALL)


def is_secret_name(name: str) -> bool:
    """Whether a variable, key or flag name looks like it holds a secret (case-insensitive:
    *TOKEN* except *TOKENS*/*TOKENIZER*, *SECRET*, *KEY*, *PASSWORD*, *PASSWD*, *PASSPHRASE*,
    *CREDENTIAL*, *AUTHORIZATION*, *COOKIE*)."""
    return _SECRET_NAME.search(name) is not None


def redact(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` whose secret-looking names have the value ``"<redacted>"``."""
    return {name: REDACTED if is_secret_name(name) else value for name, value in env.items()}


def speed_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` matching :data:`SPEED_ENV_PATTERNS`, redacted, sorted by name."""
    chosen = {
        name: value
        for name, value in env.items()
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in SPEED_ENV_PATTERNS)
    }
    return dict(sorted(redact(chosen).items()))


_ASSIGNMENT = re.compile(r"^(-{0,2}[A-Za-z_][A-Za-z0-9_.-]*)=(.*)$", re.DOTALL)
_FLAG_AND_VALUE = re.compile(r"^(--?[A-Za-z0-9][A-Za-z0-9_.-]*)(\s+)(\S.*)$", re.DOTALL)


def redact_json(value: Any) -> Any:
    """Redact secrets anywhere in JSON-shaped data: values under secret-looking keys,
    ``NAME=secret`` and ``--secret-flag secret`` strings, and ``["--api-key", "secret"]``
    pairs in lists (argv)."""
    if isinstance(value, Mapping):
        return {
            str(key): REDACTED if is_secret_name(str(key)) else redact_json(item)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        out: list[Any] = []
        hide_next = False  # the previous item was a bare secret flag such as --api-key
        for item in value:
            is_flag = isinstance(item, str) and item.startswith("-")
            out.append(REDACTED if hide_next and not is_flag else redact_json(item))
            bare_flag = is_flag and "=" not in item and len(str(item).split()) == 1
            hide_next = bare_flag and is_secret_name(str(item))
        return out
    if isinstance(value, str):
        match = _ASSIGNMENT.match(value)
        if match and is_secret_name(match.group(1)):
            return f"{match.group(1)}={REDACTED}"
        match = _FLAG_AND_VALUE.match(value)
        if match and is_secret_name(match.group(1)):
            return f"{match.group(1)}{match.group(2)}{REDACTED}"
    return value
