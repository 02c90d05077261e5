"""The value of each key of a profile table, checked and normalised on its own: one validator
per key (:data:`VALIDATORS`), the choices they allow (launchers, SGLang's speculative
algorithms, Docker networks), the SGLang flags a key owns and so ``extra_args`` refuses, and
the ``speculative`` table of either launcher. Rules that span keys or tables (a launcher's own
keys, ``[defaults]`` and ``[targets]``, env sets, hosts) are the loader's
(:mod:`pytest_specdecode.profiles.loader`): a validator here sees one value, its key and where
it was written, nothing else of the file, so it can be read (and tested) on its own.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from pytest_specdecode.errors import ConfigError
from pytest_specdecode.profiles.kinds.llamacpp import LAUNCHER as LLAMACPP
from pytest_specdecode.profiles.kinds.registry import KINDS
from pytest_specdecode.profiles.llamacpp import (
    SPEC_TYPES as LLAMACPP_SPEC_TYPES,
)
from pytest_specdecode.profiles.llamacpp import (
    LlamaCppSpeculative,
    check_speculative,
)
from pytest_specdecode.profiles.profile import (
    ECHOED_FLAGS,
    FrozenMap,
    Speculative,
    check_secret_flags,
    flag_groups,
)
from pytest_specdecode.profiles.values import check_keys as _check_keys
from pytest_specdecode.profiles.values import choice as _choice
from pytest_specdecode.profiles.values import fail as _fail
from pytest_specdecode.profiles.values import integer as _integer
from pytest_specdecode.profiles.values import string as _string
from pytest_specdecode.profiles.values import strings as _strings

# -- what the values may be -------------------------------------------------------------------

LAUNCHERS: tuple[str, ...] = tuple(KINDS)
"""How a server is started: the registered kinds (:mod:`pytest_specdecode.profiles.kinds`).
``llamacpp`` runs llama.cpp's ``llama-server`` (:mod:`pytest_specdecode.profiles.llamacpp`)."""
SPEC_ALGORITHMS: tuple[str, ...] = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")
DRAFT_FREE_ALGORITHMS = frozenset({"NEXTN", "NGRAM"})
"""MTP heads (NEXTN) live in the target model; NGRAM drafts from the prompt."""
DOCKER_NETWORKS: tuple[str, ...] = ("host", "bridge")
FIRST_CLASS_FLAGS: Mapping[str, str] = MappingProxyType(
    {
        "--model-path": "model_path",
        "--model": "model_path",
        "--tp-size": "tp_size",
        "--tp": "tp_size",
        "--tensor-parallel-size": "tp_size",
        "--host": "host",
        "--port": "port",
        "--mem-fraction-static": "mem_fraction_static",
        "--speculative-algorithm": "speculative.algorithm",
        "--speculative-draft-model-path": "speculative.draft_model_path",
        "--speculative-draft-model": "speculative.draft_model_path",
        "--speculative-num-steps": "speculative.num_steps",
        "--speculative-eagle-topk": "speculative.eagle_topk",
        "--speculative-num-draft-tokens": "speculative.num_draft_tokens",
        "--api-key": "api_key_env",
    }
)
"""SGLang flags that a profile key sets; the same flag in ``extra_args`` is an error. Other
``--speculative-*`` flags (accept thresholds, token map, attention mode) have no key and are
allowed in ``extra_args``."""
SPECULATIVE_KEYS: tuple[str, ...] = (
    "algorithm", "draft_model_path", "num_steps", "eagle_topk", "num_draft_tokens",
)  # fmt: skip
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
"""A profile, host or docker volume name; also a valid part of a docker container name."""
ENV_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
"""An environment variable's name (``api_key_env``, the variables of an env set)."""
_SHM_SIZE = re.compile(r"^\d+(b|[kmg]b?)?$", re.I)

# -- validators of single keys ----------------------------------------------------------------


def _module_name(value: object, key: str, where: str) -> str:
    text = _string(value, key, where)
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", text):
        _fail(where, key, value, "must be a dotted Python module name, run as `python -m MODULE`")
    return text


def _launcher(value: object, key: str, where: str) -> str:
    return _choice(value, key, where, LAUNCHERS)


def _network(value: object, key: str, where: str) -> str:
    return _choice(value, key, where, DOCKER_NETWORKS)


def _tp_size(value: object, key: str, where: str) -> int:
    return _integer(value, key, where, low=1)


def _port(value: object, key: str, where: str) -> int:
    return _integer(value, key, where, low=1, high=65535)


def _warmup_requests(value: object, key: str, where: str) -> int:
    return _integer(value, key, where, low=0)


def _description(value: object, key: str, where: str) -> str:
    if not isinstance(value, str):
        _fail(where, key, value, "must be a string")
    return value


def _mem_fraction(value: object, key: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        _fail(where, key, value, "must be a number between 0 and 1 (exclusive), e.g. 0.88")
    return float(value)


def _startup_timeout(value: object, key: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        _fail(where, key, value, "must be a positive number of seconds, e.g. 1800")
    return float(value)


def _shm_size(value: object, key: str, where: str) -> str:
    if not isinstance(value, str) or not _SHM_SIZE.match(value):
        _fail(where, key, value, 'must be a size such as "32g", "16384m" (docker --shm-size)')
    return value


def _api_key_env(value: object, key: str, where: str) -> str:
    if not isinstance(value, str) or not ENV_NAME_PATTERN.match(value):
        _fail(where, key, value, "must be the NAME of an environment variable holding the key")
    return value


def gpu_indices(value: object, key: str, where: str) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        return tuple(range(_integer(value, key, where, low=0)))
    if not isinstance(value, list):
        _fail(where, key, value, "must be an array of GPU indices (e.g. [0, 1]) or a count")
    for index, gpu in enumerate(value):
        _integer(gpu, f"{key}[{index}]", where, low=0)
    if len(set(value)) != len(value):
        _fail(where, key, value, "must not list a GPU twice")
    return tuple(value)


def _volumes(value: object, key: str, where: str) -> FrozenMap:
    if not isinstance(value, Mapping):
        _fail(
            where,
            key,
            value,
            'must be a table of host path = container path, e.g. { "/data" = "/data" }',
        )
    out = {}
    for host, container in value.items():
        expanded = os.path.expanduser(host)
        if not (os.path.isabs(expanded) or NAME_PATTERN.match(host)):
            _fail(
                where,
                f"{key}.{host!r}",
                container,
                "the host side must be an absolute path, "
                "a path starting with ~, or a docker volume name",
            )
        if not isinstance(container, str) or not container.startswith("/"):
            _fail(
                where, f"{key}.{host!r}", container, "the container side must be an absolute path"
            )
        out[expanded] = container
    return FrozenMap(out)


def _extra_args(value: object, key: str, where: str) -> tuple[str, ...]:
    args = _strings(value, key, where)
    groups = flag_groups(args)
    for flag, values in groups:
        if not flag:
            _fail(where, key, list(args), f"must start with a flag; {values[0]!r} has none")
        field_name = _first_class_field(flag)
        if field_name is not None:
            instead = (
                'api_key_env = "NAME_OF_AN_ENVIRONMENT_VARIABLE"'
                if field_name == "api_key_env"
                else f"the key {field_name}"
            )
            raise ConfigError(
                f"{key} contains {flag!r}, which sets what {field_name} sets; use {instead} "
                "instead (one setting, one place: the fingerprint and the attach check read it "
                "there)",
                source=where,
            )
        kind = ECHOED_FLAGS.get(flag)
        if kind is None:
            continue
        if kind is bool and values:
            _fail(where, key, list(args), f"{flag} takes no value, but is followed by {values}")
        if kind is not bool:
            try:
                if len(values) != 1:
                    raise ValueError
                kind(values[0])
            except ValueError:
                _fail(
                    where,
                    key,
                    list(args),
                    f"{flag} needs one {kind.__name__} value, got {list(values)}",
                )
    # After the loop: --api-key has its own message (api_key_env), other credentials this one.
    check_secret_flags(groups, key, where)
    return args


def _first_class_field(flag: str) -> str | None:
    """The profile key a flag sets, also for an argparse abbreviation (``--mem-frac``)."""
    if flag in FIRST_CLASS_FLAGS:
        return FIRST_CLASS_FLAGS[flag]
    if len(flag) < 4:  # "--x" is too short to be an unambiguous abbreviation of anything
        return None
    fields = sorted({name for full, name in FIRST_CLASS_FLAGS.items() if full.startswith(flag)})
    if not fields:
        return None
    return ", ".join(fields)


@dataclass(frozen=True)
class SpeculativeTable:
    """A ``speculative`` table, checked once the profile's launcher is known (SGLang and
    llama.cpp have different keys); ``where`` is the table it was written in."""

    table: Mapping[str, Any]
    where: str


def _speculative_table(value: object, key: str, where: str) -> SpeculativeTable:
    if not isinstance(value, Mapping):
        _fail(where, key, value, 'must be a table, e.g. { algorithm = "EAGLE3", ... }')
    return SpeculativeTable(dict(value), where)


def sglang_speculative(raw: SpeculativeTable) -> Speculative:
    """SGLang's speculative settings."""
    value, where, key = raw.table, raw.where, "speculative"
    _check_keys(value, SPECULATIVE_KEYS, where, what="key of speculative")
    if "algorithm" in value and str(value["algorithm"]).lower() in LLAMACPP_SPEC_TYPES:
        _fail(
            where,
            f"{key}.algorithm",
            value["algorithm"],
            f'that is a llama.cpp --spec-type; set launcher = "{LLAMACPP}" for a '
            f"llama-server profile, or use one of SGLang's: {', '.join(SPEC_ALGORITHMS)}",
        )
    if "algorithm" not in value:
        _fail(where, key, dict(value), f"needs algorithm = one of {', '.join(SPEC_ALGORITHMS)}")
    raw_algorithm = value["algorithm"]
    if not isinstance(raw_algorithm, str) or raw_algorithm.upper() not in SPEC_ALGORITHMS:
        _fail(
            where,
            f"{key}.algorithm",
            raw_algorithm,
            f"must be one of {', '.join(SPEC_ALGORITHMS)} (any case)",
        )
    algorithm = raw_algorithm.upper()
    draft = value.get("draft_model_path")
    if draft is not None:
        draft = _string(draft, f"{key}.draft_model_path", where)
    numbers = {
        name: _integer(value[name], f"{key}.{name}", where, low=1)
        for name in ("num_steps", "eagle_topk", "num_draft_tokens")
        if name in value
    }
    if algorithm == "NGRAM":
        _check_ngram_numbers(numbers, key, where)
    elif numbers and len(numbers) != 3:
        missing = [n for n in ("num_steps", "eagle_topk", "num_draft_tokens") if n not in numbers]
        raise ConfigError(
            f"{key} sets {', '.join(numbers)} but not {', '.join(missing)}: SGLang wants all "
            "three of num_steps, eagle_topk and num_draft_tokens, or none (then it chooses)",
            source=where,
        )
    if (
        algorithm != "NGRAM"
        and numbers.get("eagle_topk") == 1
        and numbers["num_draft_tokens"] != numbers["num_steps"] + 1
    ):
        steps = numbers["num_steps"]
        raise ConfigError(
            f"{key}.num_draft_tokens = {numbers['num_draft_tokens']} is not allowed with "
            f"eagle_topk = 1 and num_steps = {steps}: SGLang forces num_draft_tokens to "
            f"num_steps + 1 when eagle_topk is 1, so set num_draft_tokens = {steps + 1}",
            source=where,
        )
    if draft is None and algorithm not in DRAFT_FREE_ALGORITHMS:
        raise ConfigError(
            f"{key}.algorithm = {algorithm!r} needs draft_model_path (only "
            f"{' and '.join(sorted(DRAFT_FREE_ALGORITHMS))} run without a draft model)",
            source=where,
        )
    return Speculative(
        algorithm=algorithm,
        draft_model_path=draft,
        num_steps=numbers.get("num_steps"),
        eagle_topk=numbers.get("eagle_topk"),
        num_draft_tokens=numbers.get("num_draft_tokens"),
    )


def _check_ngram_numbers(numbers: Mapping[str, int], key: str, where: str) -> None:
    """NGRAM's one knob is ``num_draft_tokens``: every SGLang release from 0.5.6 to 0.5.23 sets
    its topk from ``--speculative-ngram-max-bfs-breadth`` (overriding any
    ``--speculative-eagle-topk``), derives its steps as draft tokens // topk, and applies no
    topk-1 rule (``_handle_ngram`` in ``srt/server_args.py``, later
    ``srt/arg_groups/speculative_hook.py``)."""
    others = [name for name in ("num_steps", "eagle_topk") if name in numbers]
    if others:
        raise ConfigError(
            f"{key} sets {' and '.join(others)} for NGRAM, which SGLang does not use as given: "
            "it takes the topk from --speculative-ngram-max-bfs-breadth (default 10; put it "
            "in extra_args) and the steps from num_draft_tokens // topk. Set only "
            "num_draft_tokens (SGLang's default for NGRAM is 12)",
            source=where,
        )


def llamacpp_speculative(raw: SpeculativeTable) -> LlamaCppSpeculative:
    """llama.cpp's speculative settings (:func:`check_speculative`), after the
    mistakes of someone who knows SGLang's: its step keys and its algorithm names."""
    sglang_keys = [name for name in SPECULATIVE_KEYS[2:] if name in raw.table]
    if sglang_keys:
        raise ConfigError(
            f"speculative sets {', '.join(sglang_keys)}, which are SGLang settings; "
            "llama-server drafts up to draft_n_max tokens per step (--spec-draft-n-max) and at "
            "least draft_n_min (--spec-draft-n-min)",
            source=raw.where,
        )
    algorithm = raw.table.get("algorithm")
    if isinstance(algorithm, str) and algorithm.upper() in SPEC_ALGORITHMS:
        _fail(
            raw.where,
            "speculative.algorithm",
            algorithm,
            f"SGLang's names do not apply to launcher {LLAMACPP!r}: EAGLE3 is "
            "'draft-eagle3', STANDALONE is 'draft-simple', NGRAM is one of the ngram-* types; "
            f"choose one of {', '.join(LLAMACPP_SPEC_TYPES)}",
        )
    return check_speculative(raw.table, raw.where)


def _positive(value: object, key: str, where: str) -> int:
    return _integer(value, key, where, low=1)


VALIDATORS: Mapping[str, Callable[[object, str, str], object]] = MappingProxyType(
    {
        "description": _description,
        "launcher": _launcher,
        "model_path": _string,
        "tp_size": _tp_size,
        "speculative": _speculative_table,
        "mem_fraction_static": _mem_fraction,
        "extra_args": _extra_args,
        "python": _string,
        "server_module": _module_name,
        "image": _string,
        "shm_size": _shm_size,
        "volumes": _volumes,
        "network": _network,
        "gpus": gpu_indices,
        "host": _string,
        "port": _port,
        "startup_timeout": _startup_timeout,
        "warmup_requests": _warmup_requests,
        "api_key_env": _api_key_env,
        "binary": _string,
        "threads": _positive,
        "ctx_size": _positive,
        "parallel": _positive,
        "hosts": lambda value, key, where: _strings(value, key, where, allow_single=True),
    }
)
"""One checker per key except ``env`` (which needs the file's env sets): value, key, where →
the normalised value, or a :class:`ConfigError`."""
