"""Server profiles: the TOML profile file (e.g. ``perf_tests/specdecode.toml``) → frozen
:class:`ServerProfile`s, and everything derived from one profile in one place: the launch
command, its environment, the :class:`~pytest_specdecode.fingerprint.Fingerprint`, and the
server arguments an attached server must report.

The file has five kinds of table::

    [defaults]            keys every profile inherits unless it sets them itself
    [env.NAME]            named environment sets (string values), e.g. the seed's NCCL tuning
    [profiles.NAME]       one server configuration each
    [targets.NAME]        an overlay applied to every profile when that target runs ("sim")
    [workloads.NAME]      raw workload tables, validated by :mod:`pytest_specdecode.workloads`

A profile is ``[defaults]``, then its own table, then the chosen target's overlay, each key
replacing the one before, except ``extra_args`` of an overlay, which is *appended* (so a sim
overlay adds ``--sim-*`` knobs to the profile's own flags). Target ``"real"`` means no overlay.

Why so strict: the seed's worst mistake was a comparison between configurations that silently
differed (NCCL variables lost on a reboot). So unknown keys, flags in ``extra_args`` that
duplicate a first-class key, NCCL variables inherited from the shell that the profile does not
name, and speculative settings SGLang would silently rewrite are all refused or made explicit.
"""

from __future__ import annotations

import difflib
import importlib
import math
import os
import re
import shlex
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, NoReturn

from pytest_specdecode.errors import ConfigError
from pytest_specdecode.fingerprint import Fingerprint

# tomllib is stdlib from 3.11; the package depends on tomli for 3.10. Imported by name so the
# type checker (configured for 3.10) does not need tomli installed.
_toml: Any = importlib.import_module("tomllib" if sys.version_info >= (3, 11) else "tomli")

LAUNCHERS: tuple[str, ...] = ("sglang", "docker", "sim")
"""How a server is started; a new launcher is added here and in ServerProfile.launch_argv."""
SIMULATED_LAUNCHERS = frozenset({"sim"})
SPEC_ALGORITHMS: tuple[str, ...] = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")
ALGORITHM_MARKERS: tuple[str, ...] = ("eagle3", "eagle", "nextn", "ngram", "standalone", "nospec")
NOSPEC = "nospec"
ALGORITHM_ALIASES: Mapping[str, str] = MappingProxyType({"NEXTN": "EAGLE"})
"""SGLang resolves NEXTN to EAGLE in ``ServerArgs.__post_init__`` (sglang-api.md §5)."""
DRAFT_FREE_ALGORITHMS = frozenset({"NEXTN", "NGRAM"})
"""MTP heads (NEXTN) live in the target model; NGRAM drafts from the prompt."""

TARGET_REAL = "real"
DOCKER_NETWORKS: tuple[str, ...] = ("host", "bridge")
DEFAULT_LAUNCHER = "sglang"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_STARTUP_TIMEOUT = 1800.0  # the seed's loads took ~900 s; twice that before giving up
DEFAULT_WARMUP_REQUESTS = 2
DEFAULT_SHM_SIZE = "32g"  # SGLang's docker instructions
SGLANG_MODULE = "sglang.launch_server"
SIM_MODULE = "pytest_specdecode.sim"
DOCKER_PYTHON = "python3"  # the interpreter inside the lmsysorg/sglang images
LOCAL_NO_PROXY: tuple[str, ...] = ("localhost", "127.0.0.1", "::1")
"""SGLang's warm-up request goes to localhost through ``requests``, which honours http_proxy;
a proxy then fails the warm-up with 502 (sglang-api.md §7 pitfall 4)."""
SCRUBBED_ENV_PREFIXES: tuple[str, ...] = ("NCCL_",)
"""Inherited variables with these prefixes are dropped unless the profile's env sets name them:
the profile, not the shell that happens to run pytest, decides how NCCL is tuned."""

SGLANG_OVERWRITTEN_ENV: Mapping[str, str] = MappingProxyType(
    {
        "NCCL_CUMEM_ENABLE": "use the flag --enable-symm-mem in extra_args instead",
        "NCCL_NVLS_ENABLE": "use the flag --enable-nccl-nvls in extra_args instead",
        "CUDA_DEVICE_MAX_CONNECTIONS": "SGLang always sets it to 4; there is no flag for it",
        "CUDA_MODULE_LOADING": "SGLang always sets it to AUTO; there is no flag for it",
        "TORCH_NCCL_AVOID_RECORD_STREAMS": "SGLang sets it to 1; there is no flag for it",
    }
)
"""Set by SGLang at startup (``_set_envs_and_config``), whatever the environment says."""

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

ECHOED_FLAGS: Mapping[str, type] = MappingProxyType(
    {
        "--num-continuous-decode-steps": int,
        "--disable-custom-all-reduce": bool,
        "--trust-remote-code": bool,
        "--max-running-requests": int,
        "--cuda-graph-max-bs": int,
        "--disable-cuda-graph": bool,
        "--chunked-prefill-size": int,
        "--disable-radix-cache": bool,
        "--disable-overlap-schedule": bool,
        "--attention-backend": str,
        "--load-format": str,
        "--dtype": str,
        "--kv-cache-dtype": str,
        "--context-length": int,
        "--dp-size": int,
        "--stream-interval": int,
        "--random-seed": int,
        "--speculative-accept-threshold-single": float,
        "--speculative-accept-threshold-acc": float,
        "--speculative-attention-mode": str,
    }
)
"""``extra_args`` flags whose value ``/server_info`` echoes under the flag's name with dashes
as underscores, unchanged by SGLang's resolution; ``bool`` = a flag without a value. Other
flags are passed on but not checked on an attached server (their field name or resolution is
not known here)."""

PROFILE_KEYS: tuple[str, ...] = (
    "description", "launcher", "model_path", "tp_size", "speculative", "mem_fraction_static",
    "extra_args", "env", "python", "image", "shm_size", "volumes", "network", "gpus", "host",
    "port", "startup_timeout", "warmup_requests", "api_key_env",
)  # fmt: skip
SPECULATIVE_KEYS: tuple[str, ...] = (
    "algorithm", "draft_model_path", "num_steps", "eagle_topk", "num_draft_tokens",
)  # fmt: skip
TOP_LEVEL_KEYS: tuple[str, ...] = ("defaults", "env", "profiles", "targets", "workloads")

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # also a valid docker container name part
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SECRET_ENV = re.compile(
    r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS|API_KEY|ACCESS_KEY|SECRET_KEY)$", re.I
)
_SHM_SIZE = re.compile(r"^\d+(b|[kmg]b?)?$", re.I)
_NUMBER = re.compile(r"^-?\d+(\.\d*)?([eE][-+]?\d+)?$")


# -- data types -------------------------------------------------------------------------------


class FrozenMap(Mapping[str, str]):
    """A read-only, hashable, picklable ``str → str`` mapping (``MappingProxyType`` is neither
    hashable nor picklable, and profiles are dictionary keys and may cross processes)."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, str] | Sequence[tuple[str, str]] = ()) -> None:
        self._data: dict[str, str] = dict(data)

    def __getitem__(self, key: str) -> str:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        return hash(frozenset(self._data.items()))

    def __repr__(self) -> str:
        return f"FrozenMap({self._data!r})"

    def __reduce__(self) -> tuple[type[FrozenMap], tuple[dict[str, str]]]:
        return (FrozenMap, (self._data,))


@dataclass(frozen=True)
class Speculative:
    """Speculative-decoding settings; ``None`` steps/topk/draft tokens = SGLang chooses."""

    algorithm: str
    draft_model_path: str | None = None
    num_steps: int | None = None
    eagle_topk: int | None = None
    num_draft_tokens: int | None = None

    @property
    def resolved_algorithm(self) -> str:
        """The algorithm as SGLang runs and reports it (NEXTN is EAGLE)."""
        return ALGORITHM_ALIASES.get(self.algorithm, self.algorithm)

    def server_args(self) -> list[str]:
        args = ["--speculative-algorithm", self.algorithm]
        if self.draft_model_path is not None:
            args += ["--speculative-draft-model-path", self.draft_model_path]
        for flag, value in (
            ("--speculative-num-steps", self.num_steps),
            ("--speculative-eagle-topk", self.eagle_topk),
            ("--speculative-num-draft-tokens", self.num_draft_tokens),
        ):
            if value is not None:
                args += [flag, str(value)]
        return args


@dataclass(frozen=True)
class DockerOptions:
    """How the docker launcher runs the container (only for ``launcher = "docker"``)."""

    image: str
    shm_size: str = DEFAULT_SHM_SIZE
    volumes: Mapping[str, str] = field(default_factory=FrozenMap)  # host path → container path
    network: str = "host"

    def __post_init__(self) -> None:
        object.__setattr__(self, "volumes", FrozenMap(self.volumes))


@dataclass(frozen=True, kw_only=True)
class ServerProfile:
    """One server configuration, fully resolved (defaults and target overlay applied)."""

    name: str
    model_path: str
    description: str = ""
    launcher: str = DEFAULT_LAUNCHER
    tp_size: int = 1
    speculative: Speculative | None = None
    mem_fraction_static: float | None = None
    extra_args: tuple[str, ...] = ()
    env_sets: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=FrozenMap)  # the env sets, merged in order
    gpus: tuple[int, ...] = ()
    host: str = DEFAULT_HOST
    port: int | None = None  # None: a free port is chosen at launch
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT
    warmup_requests: int = DEFAULT_WARMUP_REQUESTS
    python: str | None = None  # sglang launcher only; None = the interpreter running pytest
    docker: DockerOptions | None = None
    api_key_env: str | None = None
    target: str = TARGET_REAL
    source: str = ""  # e.g. "perf_tests/specdecode.toml [profiles.eagle3-2step-nccl]"

    def __post_init__(self) -> None:
        object.__setattr__(self, "env", FrozenMap(self.env))
        object.__setattr__(self, "extra_args", tuple(self.extra_args))
        object.__setattr__(self, "env_sets", tuple(self.env_sets))
        object.__setattr__(self, "gpus", tuple(self.gpus))

    @property
    def algorithm_marker(self) -> str:
        """The pytest marker of this profile's tests: ``eagle3`` ... ``nospec``."""
        return self.speculative.algorithm.lower() if self.speculative else NOSPEC

    @property
    def simulated(self) -> bool:
        return self.launcher in SIMULATED_LAUNCHERS

    def server_args(self, *, host: str, port: int) -> list[str]:
        """The SGLang flags of this profile. Never the API key: the launcher adds
        ``--api-key`` from ``api_key_env`` at launch time so it reaches no log or fingerprint."""
        args = ["--model-path", self.model_path, "--tp-size", str(self.tp_size)]
        args += ["--host", host, "--port", str(port)]
        if self.mem_fraction_static is not None:
            args += ["--mem-fraction-static", str(self.mem_fraction_static)]
        if self.speculative is not None:
            args += self.speculative.server_args()
        return args + list(self.extra_args)

    def launch_argv(self, *, host: str, port: int) -> list[str]:
        """The full command: interpreter, module, :meth:`server_args`. For docker it is the
        container's command (the image brings its own interpreter)."""
        if self.launcher == "sim":
            head = [sys.executable, "-m", SIM_MODULE]
        elif self.launcher == "docker":
            head = [DOCKER_PYTHON, "-m", SGLANG_MODULE]
        else:
            head = [self.python or sys.executable, "-m", SGLANG_MODULE]
        return head + self.server_args(host=host, port=port)

    def launch_env(self, base: Mapping[str, str]) -> dict[str, str]:
        """The server's environment: ``base`` (usually ``os.environ``) without inherited
        ``NCCL_*`` variables the profile does not set, plus the profile's env sets, plus
        ``CUDA_VISIBLE_DEVICES`` from ``gpus`` (sglang launcher only; docker selects GPUs by
        device request and the sim has none), plus ``no_proxy`` for localhost.

        ``gpus`` are indices into the GPUs visible to pytest: if ``base`` already restricts
        them with ``CUDA_VISIBLE_DEVICES``, the profile's indices are translated through it.
        """
        env = {
            name: value
            for name, value in base.items()
            if name in self.env or not name.startswith(SCRUBBED_ENV_PREFIXES)
        }
        env.update(self.env)
        if self.launcher == "sglang":
            env["CUDA_VISIBLE_DEVICES"] = self._visible_devices(base.get("CUDA_VISIBLE_DEVICES"))
        hosts = list(dict.fromkeys([*LOCAL_NO_PROXY, self.host]))
        hosts = [h for h in hosts if h not in ("0.0.0.0", "", "::")]
        for name in ("no_proxy", "NO_PROXY"):
            present = [h.strip() for h in env.get(name, "").split(",") if h.strip()]
            env[name] = ",".join(present + [h for h in hosts if h not in present])
        return env

    def _visible_devices(self, inherited: str | None) -> str:
        if not inherited or not inherited.strip():
            return ",".join(str(gpu) for gpu in self.gpus)
        visible = [device.strip() for device in inherited.split(",") if device.strip()]
        missing = [gpu for gpu in self.gpus if gpu >= len(visible)]
        if missing:
            raise ConfigError(
                f"profile {self.name!r} uses GPUs {list(self.gpus)} (indices into the visible "
                f"GPUs), but CUDA_VISIBLE_DEVICES={inherited!r} makes only {len(visible)} "
                f"visible; unset CUDA_VISIBLE_DEVICES or set gpus to fit",
                source=self.source or None,
            )
        return ",".join(visible[gpu] for gpu in self.gpus)

    def fingerprint(self) -> Fingerprint:
        """Hard fields: everything that changes speed. Soft: the launcher and its versions.

        ``sglang`` and ``docker`` share the hard class ``"real"``: both run SGLang on the same
        GPUs, and what differs between them (the SGLang build, the image) is a version, i.e.
        soft; the server's reported version is added as soft by the caller. A simulated
        server is never comparable with a real one. GPUs count by number, not by id (the ids
        name interchangeable cards on one box). The environment is the profile's env sets
        only, never ``os.environ`` (which holds secrets and noise) - and :meth:`launch_env`
        drops inherited NCCL variables, so the env sets are the whole NCCL truth.
        """
        spec = self.speculative
        hard: dict[str, object] = {
            "launcher_class": "simulated" if self.simulated else "real",
            "model_path": _strip_slash(self.model_path),
            "tp_size": self.tp_size,
            "gpu_count": len(self.gpus),
            "mem_fraction_static": self.mem_fraction_static,
            "speculative_algorithm": spec.resolved_algorithm if spec else None,
            "speculative_draft_model_path": _strip_slash(spec.draft_model_path)
            if spec and spec.draft_model_path
            else None,
            "speculative_num_steps": spec.num_steps if spec else None,
            "speculative_eagle_topk": spec.eagle_topk if spec else None,
            "speculative_num_draft_tokens": spec.num_draft_tokens if spec else None,
            "extra_args": normalized_extra_args(self.extra_args),
            "env": dict(self.env),
        }
        soft: dict[str, object] = {"launcher": self.launcher}
        if self.launcher == "sglang":
            soft["python"] = self.python or sys.executable
        if self.docker is not None:
            soft["image"] = self.docker.image
        return Fingerprint(hard=hard, soft=soft)

    def expected_server_args(self) -> dict[str, object]:
        """What ``/server_info`` must report, with SGLang's field names and resolution.

        ``speculative_algorithm`` is always present (``None`` for a profile without
        speculation); other fields only when the profile sets them.
        """
        expected: dict[str, object] = {
            "model_path": self.model_path,
            "tp_size": self.tp_size,
        }
        if self.mem_fraction_static is not None:
            expected["mem_fraction_static"] = self.mem_fraction_static
        spec = self.speculative
        expected["speculative_algorithm"] = spec.resolved_algorithm if spec else None
        if spec is not None:
            if spec.draft_model_path is not None:
                expected["speculative_draft_model_path"] = spec.draft_model_path
            if spec.num_steps is not None:
                expected["speculative_num_steps"] = spec.num_steps
                expected["speculative_eagle_topk"] = spec.eagle_topk
                # SGLang forces draft tokens to steps + 1 at topk 1 (validation already
                # insists on it; resolving here keeps the rule in one obvious place).
                expected["speculative_num_draft_tokens"] = (
                    spec.num_steps + 1 if spec.eagle_topk == 1 else spec.num_draft_tokens
                )
        for flag, values in flag_groups(self.extra_args):
            kind = ECHOED_FLAGS.get(flag)
            if kind is not None:  # repeated flags: the last one wins, as in argparse
                expected[flag[2:].replace("-", "_")] = _flag_value(kind, values)
        return expected


@dataclass(frozen=True)
class ArgMismatch:
    """One server argument an attached server reports differently from its profile."""

    field: str
    expected: object
    actual: object
    reported: bool = True  # False: the server's /server_info does not have the field

    def describe(self) -> str:
        if not self.reported:
            return f"{self.field}: profile wants {self.expected!r}, server does not report it"
        return f"{self.field}: profile wants {self.expected!r}, server reports {self.actual!r}"


def compare_server_args(
    profile: ServerProfile, server_info: Mapping[str, object]
) -> list[ArgMismatch]:
    """Every field of :meth:`ServerProfile.expected_server_args` the server reports
    differently. A field the server does not report is a mismatch only if the profile sets it
    (a profile without speculation does not require ``speculative_algorithm`` to be present)."""
    mismatches = []
    for name, expected in profile.expected_server_args().items():
        if name not in server_info:
            if expected is not None:
                mismatches.append(ArgMismatch(name, expected, None, reported=False))
            continue
        actual = server_info[name]
        if not _same_arg(name, expected, actual):
            mismatches.append(ArgMismatch(name, expected, actual))
    return mismatches


@dataclass(frozen=True)
class ProfileFile:
    """A loaded profile file: the profiles of one target, and the file's other tables."""

    path: Path
    profiles: Mapping[str, ServerProfile]
    targets: tuple[str, ...]  # "real" first, then the [targets.NAME] overlays
    env_sets: Mapping[str, Mapping[str, str]]
    workloads: Mapping[str, Mapping[str, object]]
    warnings: tuple[str, ...] = ()
    target: str = TARGET_REAL


# -- extra_args helpers -----------------------------------------------------------------------


def flag_groups(args: Sequence[str]) -> list[tuple[str, tuple[str, ...]]]:
    """``["--a", "1", "--b", "--c=x"]`` → ``[("--a", ("1",)), ("--b", ()), ("--c", ("x",))]``.
    A token that starts with ``-`` and is not a number starts a new flag. Tokens before the
    first flag are returned under the flag ``""``."""
    groups: list[tuple[str, list[str]]] = []
    for token in args:
        if token.startswith("-") and not _NUMBER.match(token):
            flag, eq, value = token.partition("=")
            groups.append((flag, [value] if eq else []))
        elif groups:
            groups[-1][1].append(token)
        else:
            groups.append(("", [token]))
    return [(flag, tuple(values)) for flag, values in groups]


def normalized_extra_args(args: Sequence[str]) -> list[str]:
    """``extra_args`` for a fingerprint: one ``"--flag value"`` string per flag, ``--a=b``
    written as ``--a b``, sorted by flag. argparse does not care about the order of different
    flags, so neither does the fingerprint; a repeated flag keeps its relative order (the
    sort is stable) because there the last one wins."""
    groups = sorted(flag_groups(args), key=lambda group: group[0])
    return [shlex.join([flag, *values] if flag else list(values)) for flag, values in groups]


def _flag_value(kind: type, values: tuple[str, ...]) -> object:
    if kind is bool:
        return True
    return kind(values[-1]) if values else None


def _strip_slash(path: str) -> str:
    return path.rstrip("/") or path


def _same_arg(name: str, expected: object, actual: object) -> bool:
    if name.endswith("_path") and isinstance(expected, str) and isinstance(actual, str):
        return _strip_slash(expected) == _strip_slash(actual)
    if name == "speculative_algorithm" and isinstance(expected, str) and isinstance(actual, str):
        resolve = ALGORITHM_ALIASES.get
        return resolve(expected.upper(), expected.upper()) == resolve(
            actual.upper(), actual.upper()
        )
    if isinstance(expected, bool) or isinstance(actual, bool):
        return expected is actual
    if isinstance(expected, (int, float)) and isinstance(actual, (int, float)):
        return math.isclose(expected, actual, rel_tol=1e-9, abs_tol=1e-12)
    return expected == actual


# -- loading ----------------------------------------------------------------------------------


def load_profiles(path: Path, *, target: str = TARGET_REAL) -> ProfileFile:
    """Load and validate a profile file; return the profiles of ``target``.

    ``target`` ``"real"`` applies no overlay; any other name must be a ``[targets.NAME]``
    table. Every profile is built under every target, so a mistake in an overlay surfaces on
    any run, not only on the run that uses it. Raises :class:`ConfigError` naming the file, the
    table, the key, the bad value and what is allowed.
    """
    path = Path(path)
    data = _read_toml(path)
    return _Loader(path, data).load(target)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"server profile file {str(path)!r} does not exist; point to another with "
            "--specdecode-config PATH or the ini key specdecode_config (see "
            "perf_tests/specdecode.toml in pytest-specdecode for an example)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the server profile file: {exc}", source=str(path)) from None
    try:
        data: dict[str, Any] = _toml.loads(text)
    except _toml.TOMLDecodeError as exc:  # the message carries "(at line L, column C)"
        raise ConfigError(f"is not valid TOML: {exc}", source=str(path)) from None
    return data


class _Loader:
    """One pass over one parsed file; collects warnings instead of printing them."""

    def __init__(self, path: Path, data: Mapping[str, Any]) -> None:
        self.path = path
        self.file = str(path)
        self.data = data
        self.warnings: list[str] = []
        self.env_sets: dict[str, FrozenMap] = {}

    def where(self, section: str) -> str:
        return f"{self.file} [{section}]"

    def load(self, target: str) -> ProfileFile:
        _check_keys(self.data, TOP_LEVEL_KEYS, self.file, what="top-level table")
        self.env_sets = {
            name: self._env_set(name, table)
            for name, table in self._tables("env", "env set").items()
        }
        defaults = self._layer(self.data.get("defaults", {}), "defaults")
        overlays = {
            name: self._layer(table, f"targets.{name}")
            for name, table in self._tables("targets", "target").items()
        }
        if TARGET_REAL in overlays:
            raise ConfigError(
                f"the target name {TARGET_REAL!r} is reserved (it means: no overlay); "
                "rename the table",
                source=self.where(f"targets.{TARGET_REAL}"),
            )
        targets = (TARGET_REAL, *overlays)
        if target not in targets:
            raise ConfigError(
                f"unknown target {target!r}{_did_you_mean(target, targets)}; this file defines "
                f"{', '.join(repr(t) for t in targets)} (add a [targets.{target}] table to "
                "define it)",
                source=self.file,
            )
        tables = self._tables("profiles", "profile")
        chosen: dict[str, ServerProfile] = {}
        for name, table in tables.items():
            if not _NAME.match(name):
                raise ConfigError(
                    f"profile name {name!r} is not allowed: use letters, digits, '-', '_' "
                    "and '.', starting with a letter or digit (it names log files and "
                    "containers)",
                    source=self.where(f"profiles.{name}"),
                )
            own = self._layer(table, f"profiles.{name}")
            for each in targets:
                built = self._build(name, defaults, own, overlays.get(each, {}), each)
                if each == target:
                    chosen[name] = built
        return ProfileFile(
            path=self.path,
            profiles=MappingProxyType(chosen),
            targets=targets,
            env_sets=MappingProxyType(dict(self.env_sets)),
            workloads=MappingProxyType(
                {
                    name: MappingProxyType(dict(table))
                    for name, table in self._tables("workloads", "workload").items()
                }
            ),
            warnings=tuple(dict.fromkeys(self.warnings)),
            target=target,
        )

    def _tables(self, key: str, what: str) -> dict[str, Mapping[str, Any]]:
        """``[key.NAME]`` tables, each checked to be a table."""
        section = self.data.get(key, {})
        if not isinstance(section, Mapping):
            _fail(self.file, key, section, f"must be a table of [{key}.NAME] tables")
        for name, table in section.items():
            if not isinstance(table, Mapping):
                _fail(self.where(key), name, table, f"each {what} must be a table [{key}.{name}]")
        return dict(section)

    def _env_set(self, name: str, table: Mapping[str, Any]) -> FrozenMap:
        where = self.where(f"env.{name}")
        for var, value in table.items():
            if not _ENV_NAME.match(var):
                raise ConfigError(
                    f"{var!r} is not an environment variable name (letters, digits and "
                    "underscores, not starting with a digit)",
                    source=where,
                )
            if _SECRET_ENV.search(var):  # the value is never echoed
                raise ConfigError(
                    f"{var} looks like a secret; secrets do not belong in a profile file (it "
                    "is committed, and env sets are recorded in baselines). Export it in the "
                    "shell that runs pytest instead; for the server's API key set api_key_env",
                    source=where,
                )
            if var == "CUDA_VISIBLE_DEVICES":
                raise ConfigError(
                    f"CUDA_VISIBLE_DEVICES = {value!r} is not allowed in an env set: choose "
                    "GPUs with the profile key gpus (e.g. gpus = [0, 1, 2, 3]), which the "
                    "plugin also uses to keep two servers off the same GPUs",
                    source=where,
                )
            if not isinstance(value, str):
                shown = str(value).lower() if isinstance(value, bool) else str(value)
                _fail(
                    where,
                    var,
                    value,
                    f'environment values must be strings; write {var} = "{shown}"',
                )
            if var in SGLANG_OVERWRITTEN_ENV:
                self.warnings.append(
                    f"{where}: {var} = {value!r} has no effect: SGLang overwrites {var} at "
                    f"startup; {SGLANG_OVERWRITTEN_ENV[var]}"
                )
        return FrozenMap(table)

    def _layer(self, table: object, section: str) -> dict[str, Any]:
        """One table of profile keys ([defaults], [profiles.X] or [targets.X]), each value
        checked and normalised on its own; cross-key rules wait for :meth:`_build`."""
        where = self.where(section)
        if not isinstance(table, Mapping):
            _fail(self.file, section, table, "must be a table")
        if "api_key" in table:  # checked before the unknown-key check: a better message
            raise ConfigError(
                "api_key must not be written in the file (it is committed and would leak); "
                'set api_key_env = "NAME_OF_AN_ENVIRONMENT_VARIABLE" that holds the key',
                source=where,
            )
        _check_keys(table, PROFILE_KEYS, where, what="key")
        out: dict[str, Any] = {}
        for key, value in table.items():
            if key == "env":
                out[key] = self._env_names(value, where)
            else:
                out[key] = _VALIDATORS[key](value, key, where)
        return out

    def _env_names(self, value: object, where: str) -> tuple[str, ...]:
        names = _strings(value, "env", where, allow_single=True)
        for name in names:
            if name not in self.env_sets:
                known = sorted(self.env_sets)
                raise ConfigError(
                    f"env = {value!r}: there is no env set {name!r}"
                    f"{_did_you_mean(name, known)}; defined: {', '.join(known) or 'none'} "
                    f"(add an [env.{name}] table)",
                    source=where,
                )
        return names

    def _build(
        self,
        name: str,
        defaults: Mapping[str, Any],
        own: Mapping[str, Any],
        overlay: Mapping[str, Any],
        target: str,
    ) -> ServerProfile:
        merged = {**defaults, **own}
        for key, value in overlay.items():
            if key == "extra_args":
                merged[key] = (*merged.get(key, ()), *value)
            else:
                merged[key] = value
        where = self.where(f"profiles.{name}")
        if target != TARGET_REAL:
            where += f" with [targets.{target}]"
        if "model_path" not in merged:
            raise ConfigError(
                "model_path is missing: set it in the profile or in [defaults]", source=where
            )
        launcher: str = merged.get("launcher", DEFAULT_LAUNCHER)
        tp_size: int = merged.get("tp_size", 1)
        extra_args: tuple[str, ...] = tuple(merged.get("extra_args", ()))
        if launcher not in SIMULATED_LAUNCHERS:
            sim_flags = [flag for flag, _ in flag_groups(extra_args) if flag.startswith("--sim-")]
            if sim_flags:
                raise ConfigError(
                    f"extra_args {sim_flags} are knobs of the simulated server, but launcher "
                    f"is {launcher!r}; put them in a [targets.sim] overlay",
                    source=where,
                )
        gpus = merged.get("gpus")
        if gpus is None:
            gpus = () if launcher in SIMULATED_LAUNCHERS else tuple(range(tp_size))
        if launcher not in SIMULATED_LAUNCHERS and len(gpus) < tp_size:
            raise ConfigError(
                f"gpus = {list(gpus)} gives {len(gpus)} GPU(s), but tp_size = {tp_size} needs "
                f"at least {tp_size}; list more GPUs or leave gpus out (default: the first "
                "tp_size GPUs)",
                source=where,
            )
        docker = None
        if launcher == "docker":
            if "image" not in merged:
                raise ConfigError(
                    'launcher "docker" needs image = "..." (e.g. "lmsysorg/sglang:v0.5.5.post2")',
                    source=where,
                )
            docker = DockerOptions(
                image=merged["image"],
                shm_size=merged.get("shm_size", DEFAULT_SHM_SIZE),
                volumes=merged.get("volumes", FrozenMap()),
                network=merged.get("network", "host"),
            )
        env_sets: tuple[str, ...] = merged.get("env", ())
        return ServerProfile(
            name=name,
            description=merged.get("description", ""),
            launcher=launcher,
            model_path=merged["model_path"],
            tp_size=tp_size,
            speculative=merged.get("speculative"),
            mem_fraction_static=merged.get("mem_fraction_static"),
            extra_args=extra_args,
            env_sets=env_sets,
            env=self._merged_env(name, env_sets),
            gpus=tuple(gpus),
            host=merged.get("host", DEFAULT_HOST),
            port=merged.get("port"),
            startup_timeout=merged.get("startup_timeout", DEFAULT_STARTUP_TIMEOUT),
            warmup_requests=merged.get("warmup_requests", DEFAULT_WARMUP_REQUESTS),
            python=merged.get("python") if launcher == "sglang" else None,
            docker=docker,
            api_key_env=merged.get("api_key_env"),
            target=target,
            source=where,
        )

    def _merged_env(self, profile: str, names: Sequence[str]) -> FrozenMap:
        merged: dict[str, str] = {}
        origin: dict[str, str] = {}
        for set_name in names:
            for var, value in self.env_sets[set_name].items():
                if var in merged and merged[var] != value:
                    self.warnings.append(
                        f"{self.where(f'profiles.{profile}')}: env sets {origin[var]!r} and "
                        f"{set_name!r} both set {var} ({merged[var]!r} vs {value!r}); the later "
                        f"one, {value!r}, wins"
                    )
                merged[var], origin[var] = value, set_name
        return FrozenMap(merged)


# -- validators of single keys ----------------------------------------------------------------


def _describe_type(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    for kind, text in ((str, "a string"), (int, "an integer"), (float, "a float")):
        if isinstance(value, kind):
            return text
    if isinstance(value, list):
        return "an array"
    if isinstance(value, Mapping):
        return "a table"
    return type(value).__name__


def _fail(where: str, key: str, value: object, allowed: str) -> NoReturn:
    raise ConfigError(
        f"{key} = {value!r} ({_describe_type(value)}) is not allowed: {allowed}", source=where
    )


def _did_you_mean(word: str, choices: Sequence[str]) -> str:
    hint = difflib.get_close_matches(word, list(choices), n=1)
    if not hint and len(word) >= 2:  # difflib misses abbreviations: "tp" for "tp_size"
        hint = [choice for choice in choices if choice.startswith(word)][:1]
    return f" (did you mean {hint[0]!r}?)" if hint else ""


def _check_keys(table: Mapping[str, Any], allowed: Sequence[str], where: str, *, what: str) -> None:
    for key in table:
        if key not in allowed:
            raise ConfigError(
                f"unknown {what} {key!r}{_did_you_mean(key, allowed)}; allowed: "
                f"{', '.join(allowed)}",
                source=where,
            )


def _string(value: object, key: str, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        _fail(where, key, value, "must be a non-empty string")
    return value


def _strings(value: object, key: str, where: str, *, allow_single: bool = False) -> tuple[str, ...]:
    if allow_single and isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        single = "a string or " if allow_single else ""
        _fail(where, key, value, f"must be {single}an array of strings")
    for index, item in enumerate(value):
        if not isinstance(item, str) or (allow_single and not item.strip()):
            shown = str(item).lower() if isinstance(item, bool) else str(item)
            _fail(where, f"{key}[{index}]", item, f'every element must be a string, e.g. "{shown}"')
    return tuple(value)


def _integer(value: object, key: str, where: str, *, low: int, high: int | None = None) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        limit = f"between {low} and {high}" if high is not None else f">= {low}"
        _fail(where, key, value, f"must be an integer {limit} (no quotes)")
    return value


def _choice(value: object, key: str, where: str, choices: Sequence[str]) -> str:
    if value not in choices:
        _fail(where, key, value, f"must be one of {', '.join(repr(c) for c in choices)}")
    assert isinstance(value, str)
    return value


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
    if not isinstance(value, str) or not _ENV_NAME.match(value):
        _fail(where, key, value, "must be the NAME of an environment variable holding the key")
    return value


def _gpus(value: object, key: str, where: str) -> tuple[int, ...]:
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
        if not (os.path.isabs(expanded) or _NAME.match(host)):
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
    for flag, values in flag_groups(args):
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


def _speculative(value: object, key: str, where: str) -> Speculative:
    if not isinstance(value, Mapping):
        _fail(where, key, value, 'must be a table, e.g. { algorithm = "EAGLE3", ... }')
    _check_keys(value, SPECULATIVE_KEYS, where, what="key of speculative")
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
    if numbers and len(numbers) != 3:
        missing = [n for n in ("num_steps", "eagle_topk", "num_draft_tokens") if n not in numbers]
        raise ConfigError(
            f"{key} sets {', '.join(numbers)} but not {', '.join(missing)}: SGLang wants all "
            "three of num_steps, eagle_topk and num_draft_tokens, or none (then it chooses)",
            source=where,
        )
    if numbers.get("eagle_topk") == 1 and numbers["num_draft_tokens"] != numbers["num_steps"] + 1:
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


_VALIDATORS: Mapping[str, Callable[[object, str, str], object]] = MappingProxyType(
    {
        "description": _description,
        "launcher": _launcher,
        "model_path": _string,
        "tp_size": _tp_size,
        "speculative": _speculative,
        "mem_fraction_static": _mem_fraction,
        "extra_args": _extra_args,
        "python": _string,
        "image": _string,
        "shm_size": _shm_size,
        "volumes": _volumes,
        "network": _network,
        "gpus": _gpus,
        "host": _string,
        "port": _port,
        "startup_timeout": _startup_timeout,
        "warmup_requests": _warmup_requests,
        "api_key_env": _api_key_env,
    }
)
"""One checker per key except ``env`` (which needs the file's env sets): value, key, where →
the normalised value, or a :class:`ConfigError`."""
