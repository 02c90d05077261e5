"""llama.cpp's side of a server profile (``launcher = "llamacpp"``): its options, the
``llama-server`` command line, and the fingerprint fields only llama.cpp has (hashes of the
GGUF files, the build).

A profile file describes a llama.cpp server with the keys every profile has (``model_path``,
``extra_args``, ``env``, ``host``, ``port``, ``startup_timeout``, ``warmup_requests``,
``api_key_env``, ``gpus``) plus ``binary``, ``threads``, ``ctx_size``, ``parallel`` and a
``speculative`` table of llama.cpp's own::

    speculative = { algorithm = "draft-eagle3", draft_model_path = "/m/eagle3.gguf",
                    draft_n_max = 4, draft_n_min = 0 }

``algorithm`` is a ``--spec-type``; the tests' automatic marker follows :data:`SPEC_TYPES`.
The launcher always passes ``--metrics`` (the backend reads the accept length from the
Prometheus counters), ``--host`` and ``--port``. The checks of a llama.cpp ``speculative`` table
and ``extra_args`` are here; the rest of the loading is :mod:`pytest_specdecode.profiles.loader`'s
(and, for SGLang's names written in a llama.cpp table, :mod:`pytest_specdecode.profiles.fields`'),
and the server side (HTTP, counters) is :mod:`pytest_specdecode.backends`'.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from pytest_specdecode.errors import ConfigError
from pytest_specdecode.profiles.kinds.llamacpp import DEFAULT_BINARY, LAUNCHER
from pytest_specdecode.profiles.values import check_keys, fail, integer, string

BINARY_ENV = "SPECDECODE_LLAMA_SERVER"

SPEC_TYPES: Mapping[str, str] = MappingProxyType(
    {
        "draft-eagle3": "eagle3",
        "draft-simple": "standalone",
        "draft-mtp": "nextn",
        "ngram-simple": "ngram",
        "ngram-map-k": "ngram",
        "ngram-map-k4v": "ngram",
        "ngram-mod": "ngram",
        "ngram-cache": "ngram",
    }
)
"""The ``--spec-type``s a profile may use, and the marker of their tests (SGLang's names: a
separate draft model is ``standalone``, an MTP head in the target is ``nextn``)."""
DRAFT_MODEL_TYPES = frozenset({"draft-eagle3", "draft-simple"})
"""Types that need ``draft_model_path`` (``-md``); the others draft without a draft model."""

LLAMACPP_FIRST_CLASS_FLAGS: Mapping[str, str] = MappingProxyType(
    {
        "-m": "model_path",
        "--model": "model_path",
        "-mu": "model_path",
        "--model-url": "model_path",
        "-hf": "model_path",
        "-hfr": "model_path",
        "--hf-repo": "model_path",
        "-md": "speculative.draft_model_path",
        "--spec-draft-model": "speculative.draft_model_path",
        "--model-draft": "speculative.draft_model_path",
        "-hfd": "speculative.draft_model_path",
        "-hfrd": "speculative.draft_model_path",
        "--hf-repo-draft": "speculative.draft_model_path",
        "--spec-type": "speculative.algorithm",
        "--spec-draft-n-max": "speculative.draft_n_max",
        "--spec-draft-n-min": "speculative.draft_n_min",
        "-t": "threads",
        "--threads": "threads",
        "-c": "ctx_size",
        "--ctx-size": "ctx_size",
        "-np": "parallel",
        "--parallel": "parallel",
        "--host": "host",
        "--port": "port",
        "--api-key": "api_key_env",
        "--api-key-file": "api_key_env",
        "--metrics": "(nothing: the launcher always passes --metrics)",
    }
)
"""llama-server flags that a profile key sets; the same flag in ``extra_args`` is an error. The
``-hf``/``-mu`` forms would download a model, which no fingerprint could describe."""


@dataclass(frozen=True)
class LlamaCppSpeculative:
    """``--spec-type`` and its draft settings; ``None`` n max/min = llama-server's default."""

    type: str
    draft_model_path: str | None = None
    draft_n_max: int | None = None
    draft_n_min: int | None = None

    def server_args(self) -> list[str]:
        args = ["--spec-type", self.type]
        if self.draft_model_path is not None:
            args += ["-md", self.draft_model_path]
        if self.draft_n_max is not None:
            args += ["--spec-draft-n-max", str(self.draft_n_max)]
        if self.draft_n_min is not None:
            args += ["--spec-draft-n-min", str(self.draft_n_min)]
        return args


@dataclass(frozen=True)
class LlamaCppOptions:
    """What a ``llamacpp`` profile sets beyond the keys every profile has. ``None`` = leave it
    to llama-server (``binary``: ``$SPECDECODE_LLAMA_SERVER``, else ``llama-server`` on PATH)."""

    binary: str | None = None
    speculative: LlamaCppSpeculative | None = None
    threads: int | None = None
    ctx_size: int | None = None
    parallel: int | None = None

    @property
    def marker(self) -> str:
        return SPEC_TYPES[self.speculative.type] if self.speculative else "nospec"

    def server_args(self, *, model_path: str, host: str, port: int) -> list[str]:
        """llama-server's flags (everything after the binary), without ``extra_args``."""
        args = ["--model", model_path, "--host", host, "--port", str(port), "--metrics"]
        for flag, value in (("-t", self.threads), ("-c", self.ctx_size), ("-np", self.parallel)):
            if value is not None:
                args += [flag, str(value)]
        if self.speculative is not None:
            args += self.speculative.server_args()
        return args

    def fingerprint_fields(
        self, *, model_path: str, source: str
    ) -> tuple[dict[str, object], dict[str, object]]:
        """The llama.cpp hard and soft fingerprint fields (the profile adds gpus, extra args
        and env). Models count by content, not by path: a moved file is the same model, a
        re-quantised one at the same path is not."""
        spec = self.speculative
        draft = spec.draft_model_path if spec else None
        hard: dict[str, object] = {
            "launcher_class": LAUNCHER,
            "model_sha256": file_sha256(model_path, what="model_path", source=source),
            "speculative_type": spec.type if spec else None,
            "speculative_draft_model_sha256": file_sha256(
                draft, what="speculative.draft_model_path", source=source
            )
            if draft
            else None,
            "speculative_draft_n_max": spec.draft_n_max if spec else None,
            "speculative_draft_n_min": spec.draft_n_min if spec else None,
            "threads": self.threads,
            "ctx_size": self.ctx_size,
            "parallel": self.parallel,
        }
        try:
            binary: str | None = resolve_binary(self.binary, os.environ, source=source)
        except ConfigError:
            binary = None  # launching will say so; the fingerprint's soft part just lacks it
        soft: dict[str, object] = {
            "launcher": LAUNCHER,
            "model_path": model_path,
            "speculative_draft_model_path": draft,
            "binary": binary,
            "llamacpp_build": binary_version(binary) if binary else None,
        }
        return hard, soft


LLAMACPP_SPECULATIVE_KEYS = ("algorithm", "draft_model_path", "draft_n_max", "draft_n_min")


def check_speculative(table: Mapping[str, object], where: str) -> LlamaCppSpeculative:
    """A ``speculative`` table of a llama.cpp profile; ``algorithm`` is a ``--spec-type``
    (any case). ``ConfigError`` naming ``where``, the key, the value and what is allowed."""
    key = "speculative"
    check_keys(table, LLAMACPP_SPECULATIVE_KEYS, where, what="key of speculative")
    types = ", ".join(SPEC_TYPES)
    if "algorithm" not in table:
        fail(where, key, dict(table), f"needs algorithm = one of {types} (a --spec-type)")
    raw_type = table["algorithm"]
    spec_type = raw_type.lower() if isinstance(raw_type, str) else raw_type
    if spec_type not in SPEC_TYPES:
        hint = " (for no speculation leave speculative out)" if spec_type == "none" else ""
        fail(where, f"{key}.algorithm", raw_type, f"must be one of {types}{hint}")
    assert isinstance(spec_type, str)
    draft = table.get("draft_model_path")
    if draft is not None:
        draft = string(draft, f"{key}.draft_model_path", where)
    if spec_type in DRAFT_MODEL_TYPES and draft is None:
        raise ConfigError(
            f"{key}.algorithm = {spec_type!r} needs draft_model_path (the draft GGUF, -md)",
            source=where,
        )
    if spec_type not in DRAFT_MODEL_TYPES and draft is not None:
        raise ConfigError(
            f"{key}.draft_model_path = {draft!r} does not apply to algorithm = {spec_type!r}, "
            "which drafts without a draft model; remove it",
            source=where,
        )
    n_max = table.get("draft_n_max")
    if n_max is not None:
        n_max = integer(n_max, f"{key}.draft_n_max", where, low=1)
    n_min = table.get("draft_n_min")
    if n_min is not None:
        n_min = integer(n_min, f"{key}.draft_n_min", where, low=0)
    if n_min is not None and n_max is not None and n_min > n_max:
        raise ConfigError(
            f"{key}.draft_n_min = {n_min} is above draft_n_max = {n_max}; llama-server would "
            "never draft",
            source=where,
        )
    return LlamaCppSpeculative(spec_type, draft, draft_n_max=n_max, draft_n_min=n_min)


def check_extra_args(groups: Sequence[tuple[str, tuple[str, ...]]], where: str) -> None:
    """``extra_args`` of a llama.cpp profile, as ``(flag, values)`` groups: none of the flags
    its keys set, no knobs of the simulated SGLang server."""
    for flag, _ in groups:
        field_name = LLAMACPP_FIRST_CLASS_FLAGS.get(flag)
        if field_name is not None:
            if field_name == "api_key_env":
                instead = 'api_key_env = "NAME_OF_AN_ENVIRONMENT_VARIABLE"'
            elif field_name.startswith("("):
                instead = "nothing: the launcher always passes it"
            else:
                instead = f"the key {field_name}"
            raise ConfigError(
                f"extra_args contains {flag!r}, which sets what {field_name} sets; use "
                f"{instead} instead (one setting, one place: the fingerprint reads it there)",
                source=where,
            )
        if flag.startswith("--sim-"):
            raise ConfigError(
                f"extra_args contains {flag!r}, a knob of the simulated SGLang server; "
                "llama-server does not know it",
                source=where,
            )


def resolve_binary(configured: str | None, env: Mapping[str, str], *, source: str) -> str:
    """The llama-server to run: ``configured`` (the profile's ``binary``), else
    ``$SPECDECODE_LLAMA_SERVER``, else ``llama-server`` on ``PATH``. A path must be an
    executable file; a bare name is looked up on ``PATH``."""
    if configured:
        origin, value = "binary", os.path.expanduser(configured)
    elif env.get(BINARY_ENV):
        origin, value = f"${BINARY_ENV}", env[BINARY_ENV]
    else:
        found = shutil.which(DEFAULT_BINARY, path=env.get("PATH"))
        if found is None:
            raise ConfigError(
                f'no llama-server to run: the profile sets no binary = "...", {BINARY_ENV} is '
                f"not set, and there is no {DEFAULT_BINARY} on PATH. Build llama.cpp "
                "(cmake --build build --target llama-server) and point one of them at it",
                source=source,
            )
        return found
    if os.sep not in value:
        found = shutil.which(value, path=env.get("PATH"))
        if found is None:
            raise ConfigError(
                f"{origin} = {value!r}: there is no such program on PATH; give the path of "
                "the llama-server binary",
                source=source,
            )
        return found
    if not (os.path.isfile(value) and os.access(value, os.X_OK)):
        raise ConfigError(
            f"{origin} = {value!r} is not an executable file; give the path of the "
            "llama-server binary (e.g. build/bin/llama-server in a llama.cpp build)",
            source=source,
        )
    return os.path.abspath(value)


_VERSIONS: dict[tuple[str, int, int], str | None] = {}
_HASHES: dict[tuple[str, int, int], str] = {}


def binary_version(path: str) -> str | None:
    """The ``version: ...`` line of ``path --version`` (e.g. ``version: 0.5.0-dev (build 1,
    commit 0c1e570)``), cached per (path, size, mtime); None if it does not run."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    key = (os.path.realpath(path), info.st_size, info.st_mtime_ns)
    if key not in _VERSIONS:
        try:
            done = subprocess.run(
                [path, "--version"], capture_output=True, text=True, timeout=30, check=False
            )
        except (OSError, subprocess.SubprocessError):
            _VERSIONS[key] = None
        else:
            lines = (done.stdout + done.stderr).splitlines()
            found = [line.strip() for line in lines if line.startswith("version:")]
            _VERSIONS[key] = found[0] if found and done.returncode == 0 else None
    return _VERSIONS[key]


def file_sha256(path: str, *, what: str, source: str) -> str:
    """SHA-256 of a model file, hashed once per process per (path, size, mtime): a multi-GB
    GGUF takes seconds to hash, and fingerprints are taken often."""
    try:
        info = os.stat(os.path.expanduser(path))
        problem = None if stat.S_ISREG(info.st_mode) else "it is not a file"
    except OSError as exc:
        problem = str(exc.strerror or exc)
    if problem is not None:
        raise ConfigError(
            f"{what} = {path!r} cannot be read ({problem}): the fingerprint hashes the GGUF "
            "file, so that a baseline is never compared with another model; fix the path "
            "(relative paths are taken from the directory pytest runs in)",
            source=source,
        )
    real = os.path.realpath(os.path.expanduser(path))
    key = (real, info.st_size, info.st_mtime_ns)
    if key not in _HASHES:
        digest = hashlib.sha256()
        with Path(real).open("rb") as handle:
            while block := handle.read(1 << 22):
                digest.update(block)
        _HASHES[key] = digest.hexdigest()
    return _HASHES[key]
