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

A profile with ``launcher = "llamacpp"`` describes llama.cpp's ``llama-server`` instead of SGLang:
its own keys (``binary``, ``threads``, ``ctx_size``, ``parallel``, a ``speculative`` table with a
``--spec-type``) live in :class:`~pytest_specdecode.profiles.llamacpp.LlamaCppOptions`,
SGLang-only keys are refused in its table and ignored from ``[defaults]`` (and the other way
round), and target overlays do not apply to it (llama-server runs on any machine). See
docs/llamacpp.md.

Why so strict: the seed's worst mistake was a comparison between configurations that silently
differed (NCCL variables lost on a reboot). So unknown keys, flags in ``extra_args`` that
duplicate a first-class key, NCCL variables inherited from the shell that the profile does not
name, and speculative settings SGLang would silently rewrite are all refused or made explicit.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from pytest_specdecode.errors import ConfigError
from pytest_specdecode.fingerprint import Fingerprint
from pytest_specdecode.fleet import EngineTLS, HostSpec
from pytest_specdecode.profiles.kinds.base import ServerKind
from pytest_specdecode.profiles.kinds.registry import kind_of
from pytest_specdecode.profiles.kinds.sim import SIM_MODULE
from pytest_specdecode.profiles.llamacpp import LlamaCppOptions
from pytest_specdecode.redaction import is_secret_flag
from pytest_specdecode.sglang_releases import flag_dest

ALGORITHM_MARKERS: tuple[str, ...] = ("eagle3", "eagle", "nextn", "ngram", "standalone", "nospec")
NOSPEC = "nospec"
ALGORITHM_ALIASES: Mapping[str, str] = MappingProxyType({"NEXTN": "EAGLE"})
"""SGLang resolves NEXTN to EAGLE in ``ServerArgs.__post_init__`` (sglang-api.md §5)."""

TARGET_REAL = "real"
TARGET_SIM = "sim"  # the overlay chosen when no GPU is found
DEFAULT_LAUNCHER = "sglang"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_STARTUP_TIMEOUT = 1800.0  # the seed's loads took ~900 s; twice that before giving up
DEFAULT_WARMUP_REQUESTS = 2
DEFAULT_SHM_SIZE = "32g"  # SGLang's docker instructions
LOCAL_NO_PROXY: tuple[str, ...] = ("localhost", "127.0.0.1", "::1")
"""SGLang's warm-up request goes to localhost through ``requests``, which honours http_proxy;
a proxy then fails the warm-up with 502 (sglang-api.md §7 pitfall 4)."""
SCRUBBED_ENV_PREFIXES: tuple[str, ...] = ("NCCL_", "LLAMA_ARG_")
"""Inherited variables with these prefixes are dropped unless the profile's env sets name them:
the profile, not the shell that happens to run pytest, decides how NCCL is tuned (and which
settings llama-server reads from ``LLAMA_ARG_*`` variables)."""


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

    def expected_counts(self) -> dict[str, int]:
        """The step, topk and draft-token fields ``/server_info`` must report, resolved as
        SGLang resolves them: only what the profile sets; for the EAGLE family and STANDALONE
        the draft tokens are num_steps + 1 at topk 1; for NGRAM only the draft tokens (its topk
        and steps come from the n-gram settings)."""
        if self.resolved_algorithm == "NGRAM":
            if self.num_draft_tokens is None:
                return {}
            return {"speculative_num_draft_tokens": self.num_draft_tokens}
        steps, topk, drafts = self.num_steps, self.eagle_topk, self.num_draft_tokens
        if steps is None or topk is None or drafts is None:
            return {}  # all three or none (the loader insists): SGLang chooses
        return {
            "speculative_num_steps": steps,
            "speculative_eagle_topk": topk,
            "speculative_num_draft_tokens": steps + 1 if topk == 1 else drafts,
        }

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
    # The Python module that serves (sglang and docker launchers): SGLang's launch_server by
    # default; "pytest_specdecode.sim" runs the simulated server, e.g. in a container.
    server_module: str | None = None
    docker: DockerOptions | None = None
    api_key_env: str | None = None
    llamacpp: LlamaCppOptions | None = None  # launcher "llamacpp" only
    target: str = TARGET_REAL
    source: str = ""  # e.g. "perf_tests/specdecode.toml [profiles.eagle3-2step-nccl]"
    hosts: tuple[str, ...] = ()  # docker launcher: the [hosts.NAME] it may run on (empty: any)
    # Set by the placement (pytest_specdecode.fleet) for one session: the host the server runs
    # on, that host's Docker endpoint and the TLS its client speaks there (None: pytest's
    # DOCKER_TLS_VERIFY / DOCKER_CERT_PATH). None is part of the fingerprint: which box ran a
    # configuration is the hardware key's business.
    placed_on: str | None = None
    docker_host: str | None = None
    docker_tls: EngineTLS | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "env", FrozenMap(self.env))
        object.__setattr__(self, "extra_args", tuple(self.extra_args))
        object.__setattr__(self, "env_sets", tuple(self.env_sets))
        object.__setattr__(self, "gpus", tuple(self.gpus))
        object.__setattr__(self, "hosts", tuple(self.hosts))

    @property
    def algorithm_marker(self) -> str:
        """The pytest marker of this profile's tests: ``eagle3`` ... ``nospec``."""
        if self.llamacpp is not None:
            return self.llamacpp.marker
        return self.speculative.algorithm.lower() if self.speculative else NOSPEC

    @property
    def kind(self) -> ServerKind:
        """What the launcher of this profile is (:mod:`pytest_specdecode.profiles.kinds`)."""
        return kind_of(self.launcher)

    @property
    def simulated(self) -> bool:
        return self.kind.simulated or self.module == SIM_MODULE

    @property
    def module(self) -> str:
        """The module that serves: the sim for launcher ``sim``, else ``server_module``."""
        return self.kind.serving_module(self.server_module)

    def server_args(self, *, host: str, port: int) -> list[str]:
        """The server flags of this profile (SGLang's, or llama-server's for ``llamacpp``).
        Never the API key: the launcher adds ``--api-key`` from ``api_key_env`` at launch time
        so it reaches no log or fingerprint."""
        if self.llamacpp is not None:
            own = self.llamacpp.server_args(model_path=self.model_path, host=host, port=port)
            return own + list(self.extra_args)
        args = ["--model-path", self.model_path, "--tp-size", str(self.tp_size)]
        args += ["--host", host, "--port", str(port)]
        if self.mem_fraction_static is not None:
            args += ["--mem-fraction-static", str(self.mem_fraction_static)]
        if self.speculative is not None:
            args += self.speculative.server_args()
        return args + list(self.extra_args)

    def launch_argv(self, *, host: str, port: int, binary: str | None = None) -> list[str]:
        """The full command: interpreter, module, :meth:`server_args`. For docker it is the
        container's command (the image brings its own interpreter); for llamacpp ``binary``
        (resolved by the launcher from the environment), else the profile's, else
        ``llama-server``, then :meth:`server_args`."""
        return self.kind.command(self, host=host, port=port, binary=binary)

    def launch_env(self, base: Mapping[str, str]) -> dict[str, str]:
        """The server's environment: ``base`` (usually ``os.environ``) without inherited
        ``NCCL_*`` variables the profile does not set, plus the profile's env sets, plus
        ``CUDA_VISIBLE_DEVICES`` from ``gpus`` (sglang and llamacpp launchers; docker selects
        GPUs by device request and the sim has none; a llama.cpp profile without gpus sees no
        GPU), plus ``no_proxy`` for localhost.

        ``gpus`` are indices into the GPUs visible to pytest: if ``base`` already restricts
        them with ``CUDA_VISIBLE_DEVICES``, the profile's indices are translated through it.
        """
        env = {
            name: value
            for name, value in base.items()
            if name in self.env or not name.startswith(SCRUBBED_ENV_PREFIXES)
        }
        env.update(self.env)
        if self.kind.local_gpus:
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

        A ``llamacpp`` profile has a class of its own and fields of its own
        (:meth:`LlamaCppOptions.fingerprint_fields`: the GGUF files' SHA-256, the spec type,
        draft n max/min, threads, context, slots; soft: the build and the paths).
        """
        if self.llamacpp is not None:
            own_hard, own_soft = self.llamacpp.fingerprint_fields(
                model_path=self.model_path, source=self.source or f"profile {self.name!r}"
            )
            own_hard["gpu_count"] = len(self.gpus)
            own_hard["extra_args"] = normalized_extra_args(self.extra_args)
            own_hard["env"] = dict(self.env)
            return Fingerprint(hard=own_hard, soft=own_soft)
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
        if self.server_module is not None:
            soft["server_module"] = self.module
        if self.kind.own_python:
            soft["python"] = self.python or sys.executable
        if self.docker is not None:
            soft["image"] = self.docker.image
        return Fingerprint(hard=hard, soft=soft)

    def expected_server_args(self, sglang_version: str | None = None) -> dict[str, object]:
        """What ``/server_info`` must report, with SGLang's field names and resolution.

        ``speculative_algorithm`` is always present (``None`` for a profile without
        speculation); other fields only when the profile sets them. ``sglang_version`` (the
        running server's ``version``) names the fields as that release does: a flag's field
        can move (``--cuda-graph-max-bs`` sets ``cuda_graph_max_bs_decode`` from 0.5.14 on).
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
            expected.update(spec.expected_counts())
        for flag, values in flag_groups(self.extra_args):
            kind = ECHOED_FLAGS.get(flag)
            if kind is not None:  # repeated flags: the last one wins, as in argparse
                expected[echoed_field(flag, sglang_version)] = _flag_value(kind, values)
        return expected


CORE_SERVER_ARGS = frozenset({"model_path", "tp_size", "speculative_algorithm"})
"""Fields every supported SGLang release reports; a server without them is not SGLang."""


@dataclass(frozen=True)
class ArgMismatch:
    """One server argument an attached server reports differently from its profile."""

    field: str
    expected: object
    actual: object
    reported: bool = True  # False: the server's /server_info does not have the field
    required: bool = True  # False: a release may lack the field; then it is only not checked

    def describe(self) -> str:
        if not self.reported:
            return f"{self.field}: profile wants {self.expected!r}, server does not report it"
        return f"{self.field}: profile wants {self.expected!r}, server reports {self.actual!r}"


def compare_server_args(
    profile: ServerProfile, server_info: Mapping[str, object]
) -> list[ArgMismatch]:
    """Every field of :meth:`ServerProfile.expected_server_args` the server reports
    differently. A field the server does not report is listed with ``reported=False``; only
    the :data:`CORE_SERVER_ARGS` are ``required`` (a profile without speculation does not
    require ``speculative_algorithm`` to be present): the others a release may simply not
    have, and the caller says they were not checked rather than refusing the server."""
    version = server_info.get("version")
    mismatches = []
    expected_args = profile.expected_server_args(version if isinstance(version, str) else None)
    for name, expected in expected_args.items():
        if name not in server_info:
            if expected is not None:
                mismatches.append(
                    ArgMismatch(
                        name, expected, None, reported=False, required=name in CORE_SERVER_ARGS
                    )
                )
            continue
        actual = server_info[name]
        if not _same_arg(name, expected, actual):
            mismatches.append(ArgMismatch(name, expected, actual))
    return mismatches


def echoed_field(flag: str, sglang_version: str | None) -> str:
    """The ``/server_info`` field a ``launch_server`` flag sets in ``sglang_version``: the
    flag's argparse destination in that release (known for the releases in
    :mod:`~pytest_specdecode.sglang_releases`), else the flag's name with dashes as underscores."""
    default = flag[2:].replace("-", "_")
    if sglang_version is None:
        return default
    return flag_dest(flag, sglang_version.split("+", 1)[0]) or default


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
    hosts: Mapping[str, HostSpec] = field(default_factory=dict)  # [hosts.NAME], in file order


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


# The only value a credential flag may have in a profile file: a reference to an environment
# variable, resolved when the server is launched (expand_secret_references).
_ENV_REFERENCE = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")


def check_secret_flags(groups: Sequence[tuple[str, tuple[str, ...]]], key: str, where: str) -> None:
    """Credential flags (:func:`~pytest_specdecode.redaction.is_secret_flag`: ``--admin-api-key``,
    ``--hf-token``, ...) in ``extra_args`` take only an environment reference, ``"${NAME}"``:
    a literal secret in the profile file would be committed, recorded in every baseline's
    fingerprint and written to the server log. The value is never echoed."""
    for flag, values in groups:
        if not flag or not is_secret_flag(flag):
            continue
        if len(values) == 1 and _ENV_REFERENCE.match(values[0]):
            continue
        name = re.sub(r"[^A-Za-z0-9]+", "_", flag.lstrip("-")).upper()
        raise ConfigError(
            f"{key} contains {flag!r}, a flag that takes a credential, with a value written "
            "in the file (not shown here); a secret in a profile file is committed, recorded in "
            f"every baseline and shown in the server log. Write it as an environment reference, "
            f'["{flag}", "${{{name}}}"], and export {name} in the shell that runs pytest',
            source=where,
        )


def expand_secret_references(
    argv: Sequence[str], env: Mapping[str, str], *, profile: str, source: str | None
) -> list[str]:
    """``argv`` with the ``"${NAME}"`` value of each credential flag replaced by ``env[NAME]``
    (at launch only: the profile, its fingerprint and the logged command keep the reference).
    A variable that is not set is a ``ConfigError``."""
    out: list[str] = []
    secret_flag = ""
    for token in argv:
        flag, eq, value = token.partition("=")
        if token.startswith("-") and eq and is_secret_flag(flag):
            out.append(f"{flag}={_resolve(flag, value, env, profile, source)}")
            secret_flag = ""
            continue
        out.append(_resolve(secret_flag, token, env, profile, source) if secret_flag else token)
        secret_flag = token if token.startswith("-") and is_secret_flag(token) else ""
    return out


def check_python(python: str, env: Mapping[str, str], *, profile: str, source: str | None) -> None:
    """The profile's ``python`` (sglang launcher) must be a program that exists: an executable
    file, or a name found on ``env``'s ``PATH``. Checked at launch, not at load: the same file
    is loaded on machines (a laptop, CI collecting for the simulator) that never launch it."""
    expanded = os.path.expanduser(python)
    if os.sep not in expanded:
        if shutil.which(expanded, path=env.get("PATH")) is None:
            raise ConfigError(
                f"profile {profile!r} sets python = {python!r}, but there is no such program "
                "on PATH; give the path of the Python that has SGLang installed (e.g. "
                "/opt/sglang/.venv/bin/python), or remove the key to use the one running pytest",
                source=source,
            )
        return
    if not (os.path.isfile(expanded) and os.access(expanded, os.X_OK)):
        problem = "does not exist" if not os.path.exists(expanded) else "is not an executable file"
        raise ConfigError(
            f"profile {profile!r} sets python = {python!r}, which {problem}; give the path of "
            "the Python that has SGLang installed (e.g. /opt/sglang/.venv/bin/python), or "
            "remove the key to use the one running pytest",
            source=source,
        )


def _resolve(
    flag: str, value: str, env: Mapping[str, str], profile: str, source: str | None
) -> str:
    match = _ENV_REFERENCE.match(value)
    if match is None:
        return value
    name = match.group(1)
    if name not in env:
        raise ConfigError(
            f"profile {profile!r} passes {flag} {value}, but the environment variable {name} "
            "is not set; export it in the shell that runs pytest",
            source=source,
        )
    return env[name]


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
