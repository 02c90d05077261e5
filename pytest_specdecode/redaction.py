"""Secrets never leave this process: one place that decides what looks secret and hides it.

Used wherever configuration is written down or shown: baselines, reports, history, server logs,
the terminal. Environment and key names are judged by :func:`is_secret_name`, command-line flags
by :func:`is_secret_flag`, and URLs lose their user info (:func:`redact_url`).
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


# A flag is judged by its words, not by substrings: --speculative-token-map (a path),
# --ssl-keyfile and --api-key-file (paths to a secret, not the secret) and --max-total-tokens
# configure speed or name files, and hiding their values would make a configuration change
# invisible; --admin-api-key, --hf-token and --ssl-keyfile-password carry the secret itself.
_FLAG_WORD = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_SECRET_WORDS = frozenset(
    {
        "secret",
        "secrets",
        "password",
        "passwd",
        "passphrase",
        "credential",
        "credentials",
        "cookie",
        "cookies",
        "authorization",
        "apikey",
        "bearer",
    }
)
_SECRET_LAST_WORDS = frozenset({"key", "keys", "token"})


def is_secret_flag(flag: str) -> bool:
    """Whether a command-line flag (``--admin-api-key``, ``--hf-token``, ``-apiKey``) takes a
    credential as its value: one of its words (split at ``-``, ``_``, ``.`` and camelCase) is
    *secret*, *password*, *passwd*, *passphrase*, *credential(s)*, *cookie(s)*,
    *authorization*, *apikey* or *bearer*, or its last word is *key*, *keys* or *token*. A
    ``--flag=value`` token is judged by its flag."""
    name = flag.partition("=")[0].lstrip("-")
    words = [word.lower() for word in _FLAG_WORD.findall(name)]
    if not words:
        return False
    return words[-1] in _SECRET_LAST_WORDS or any(word in _SECRET_WORDS for word in words)


# The user info of a URL: scheme://USER[:PASSWORD]@host, and the scheme-less USER:PASSWORD@host
# that --server-host accepts (only with a colon there, so git@github.com:org/repo is left be).
# Greedy up to the last "@" of the authority: an unescaped "@" in a password must not leak its
# tail.
_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s]*@")
_BARE_USERINFO = re.compile(r"(?<![^\s=])[^\s/@:=]+:[^\s/]*@(?=[^\s@/])")


def redact_url(text: str) -> str:
    """``text`` with the user info of every URL in it replaced by ``<redacted>``:
    ``http://me:pw@gpu-box:30000`` → ``http://<redacted>@gpu-box:30000``, and the scheme-less
    ``me:pw@gpu-box:30000`` (alone, after whitespace or after ``=``) →
    ``<redacted>@gpu-box:30000``."""
    text = _URL_USERINFO.sub(lambda match: f"{match.group('scheme')}{REDACTED}@", text)
    return _BARE_USERINFO.sub(f"{REDACTED}@", text)


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


_FLAG_AND_VALUE = re.compile(r"^(--?[A-Za-z0-9][A-Za-z0-9_.-]*)(\s+)(\S.*)$", re.DOTALL)


def _secret_name_or_flag(name: str) -> bool:
    """A flag is judged by :func:`is_secret_flag`, any other name by :func:`is_secret_name`."""
    return is_secret_flag(name) if name.startswith("-") else is_secret_name(name)


def redact_json(value: Any) -> Any:
    """Redact secrets anywhere in JSON-shaped data: values under secret-looking keys,
    ``NAME=secret`` and ``--secret-flag secret`` strings, ``["--api-key", "secret"]``
    pairs in lists (argv), and the user info of URLs in any string."""
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
            hide_next = bare_flag and is_secret_flag(str(item))
        return out
    if isinstance(value, str):
        match = _ASSIGNMENT.match(value)
        if match and _secret_name_or_flag(match.group(1)):
            return f"{match.group(1)}={REDACTED}"
        match = _FLAG_AND_VALUE.match(value)
        if match and is_secret_flag(match.group(1)):
            return f"{match.group(1)}{match.group(2)}{REDACTED}"
        return redact_url(value)
    return value
