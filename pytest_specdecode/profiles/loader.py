"""Reading and validating a profile file: every key checked, every error naming the file, the
table, the key, the bad value and what is allowed. This module holds the file's shape (which
tables and keys exist, which keys belong to which launcher) and the rules across keys and
tables; the check of each key's value is :mod:`pytest_specdecode.profiles.fields`', the
warnings about variables SGLang overwrites :mod:`pytest_specdecode.profiles.sglang_env`'. The
types it builds, and what is derived from a profile, live in
:mod:`pytest_specdecode.profiles.profile`.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from pytest_specdecode.errors import ConfigError
from pytest_specdecode.fleet import HostSpec
from pytest_specdecode.profiles.fields import (
    ENV_NAME_PATTERN,
    NAME_PATTERN,
    VALIDATORS,
    gpu_indices,
    llamacpp_speculative,
    sglang_speculative,
)
from pytest_specdecode.profiles.kinds.base import SGLANG_MODULE, ServerKind
from pytest_specdecode.profiles.kinds.llamacpp import LAUNCHER as LLAMACPP
from pytest_specdecode.profiles.kinds.registry import kind_of
from pytest_specdecode.profiles.kinds.sim import SIM_MODULE
from pytest_specdecode.profiles.llamacpp import (
    LlamaCppOptions,
)
from pytest_specdecode.profiles.llamacpp import (
    check_extra_args as check_llamacpp_extra_args,
)
from pytest_specdecode.profiles.profile import (
    DEFAULT_HOST,
    DEFAULT_LAUNCHER,
    DEFAULT_SHM_SIZE,
    DEFAULT_STARTUP_TIMEOUT,
    DEFAULT_WARMUP_REQUESTS,
    TARGET_REAL,
    DockerOptions,
    FrozenMap,
    ProfileFile,
    ServerProfile,
    flag_groups,
)
from pytest_specdecode.profiles.sglang_env import sglang_env_warnings
from pytest_specdecode.profiles.values import check_keys as _check_keys
from pytest_specdecode.profiles.values import counted as _counted
from pytest_specdecode.profiles.values import did_you_mean as _did_you_mean
from pytest_specdecode.profiles.values import fail as _fail
from pytest_specdecode.profiles.values import string as _string
from pytest_specdecode.profiles.values import strings as _strings
from pytest_specdecode.workloads import builtin_overrides

# tomllib is stdlib from 3.11; the package depends on tomli for 3.10. Imported by name so the
# type checker (configured for 3.10) does not need tomli installed.
_toml: Any = importlib.import_module("tomllib" if sys.version_info >= (3, 11) else "tomli")

# -- the file's tables and keys (only the loader reads them) ----------------------------------

PROFILE_KEYS: tuple[str, ...] = (
    "description", "launcher", "model_path", "tp_size", "speculative", "mem_fraction_static",
    "extra_args", "env", "python", "server_module", "image", "shm_size", "volumes", "network",
    "gpus", "host", "port", "startup_timeout", "warmup_requests", "api_key_env",
    "binary", "threads", "ctx_size", "parallel", "hosts",
)  # fmt: skip
LLAMACPP_ONLY_KEYS: tuple[str, ...] = ("binary", "threads", "ctx_size", "parallel")
SGLANG_ONLY_KEYS: tuple[str, ...] = (
    "tp_size", "mem_fraction_static", "python", "server_module", "image", "shm_size", "volumes",
    "network", "hosts",
)  # fmt: skip
"""Keys that mean nothing to the other kind of server: refused in a profile's own table,
ignored when inherited from ``[defaults]`` (which a file's SGLang and llama.cpp profiles
share)."""
TOP_LEVEL_KEYS: tuple[str, ...] = (
    "defaults", "env", "profiles", "targets", "workloads", "hosts",
)  # fmt: skip
HOST_KEYS: tuple[str, ...] = (
    "docker_host", "docker_host_env", "context", "gpus", "hardware", "tls_cert_path",
    "tls_verify",
)  # fmt: skip
"""Keys of a ``[hosts.NAME]`` table (:class:`~pytest_specdecode.fleet.HostSpec`)."""
_SECRET_ENV = re.compile(
    r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS|API_KEY|ACCESS_KEY|SECRET_KEY)$", re.I
)

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
        self.hosts: dict[str, HostSpec] = {}

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
        for name, overlay in overlays.items():
            if "launcher" in overlay and kind_of(overlay["launcher"]).llamacpp_options:
                raise ConfigError(
                    f'launcher = "{LLAMACPP}" cannot be a target: a llama.cpp server '
                    "is a profile of its own (its speculative settings, threads and models are "
                    f"llama.cpp's). Define [profiles.NAME] tables with launcher = "
                    f'"{LLAMACPP}" instead',
                    source=self.where(f"targets.{name}"),
                )
        targets = (TARGET_REAL, *overlays)
        if target not in targets:
            raise ConfigError(
                f"unknown target {target!r}{_did_you_mean(target, targets)}; this file defines "
                f"{', '.join(repr(t) for t in targets)} (add a [targets.{target}] table to "
                "define it)",
                source=self.file,
            )
        self.hosts = {
            name: self._host(name, table) for name, table in self._tables("hosts", "host").items()
        }
        tables = self._tables("profiles", "profile")
        chosen: dict[str, ServerProfile] = {}
        for name, table in tables.items():
            if not NAME_PATTERN.match(name):
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
        workloads = {
            name: MappingProxyType(dict(table))
            for name, table in self._tables("workloads", "workload").items()
        }
        self.warnings.extend(builtin_overrides(workloads, self.file))
        return ProfileFile(
            path=self.path,
            profiles=MappingProxyType(chosen),
            targets=targets,
            env_sets=MappingProxyType(dict(self.env_sets)),
            workloads=MappingProxyType(workloads),
            warnings=_counted(self.warnings),
            target=target,
            hosts=MappingProxyType(dict(self.hosts)),
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

    def _host(self, name: str, table: Mapping[str, Any]) -> HostSpec:
        """``[hosts.NAME]``: one Docker endpoint (written, from a variable, or a context) and
        its GPUs. An endpoint with credentials in it belongs in the environment."""
        where = self.where(f"hosts.{name}")
        if not NAME_PATTERN.match(name):
            _fail(self.where("hosts"), name, name, "host names are letters, digits, '-', '_', '.'")
        _check_keys(table, HOST_KEYS, where, what="key")
        given = [key for key in ("docker_host", "docker_host_env", "context") if key in table]
        if len(given) != 1:
            raise ConfigError(
                'a host needs exactly one of docker_host (e.g. "ssh://gpu-box-2"), '
                "docker_host_env (the name of a variable that holds it) or context (a Docker "
                f"context name); found {given or 'none'}",
                source=where,
            )
        docker_host = table.get("docker_host")
        if docker_host is not None:
            text = _string(docker_host, "docker_host", where)
            if urlsplit(text).password:
                raise ConfigError(
                    "docker_host carries a password, and the file is committed: put the "
                    "endpoint in an environment variable and name it with docker_host_env",
                    source=where,
                )
            if not re.match(r"^(unix|tcp|ssh|npipe|http|https)://", text):
                _fail(where, "docker_host", text, "must be a unix://, tcp:// or ssh:// address")
        env_name = table.get("docker_host_env")
        if env_name is not None and (
            not isinstance(env_name, str) or not ENV_NAME_PATTERN.match(env_name)
        ):
            _fail(where, "docker_host_env", env_name, "must be the NAME of an environment variable")
        if "gpus" not in table:
            raise ConfigError(
                "gpus is missing: list the GPUs of this host the plugin may use, e.g. "
                "gpus = [0, 1, 2, 3, 4, 5, 6, 7] (or a count, gpus = 8)",
                source=where,
            )
        hardware = table.get("hardware")
        if hardware is not None:
            hardware = _string(hardware, "hardware", where)
        context = table.get("context")
        cert_path, verify = self._host_tls(table, where)
        return HostSpec(
            name=name,
            docker_host=docker_host,
            docker_host_env=env_name,
            context=_string(context, "context", where) if context is not None else None,
            gpus=gpu_indices(table["gpus"], "gpus", where),
            hardware=hardware,
            tls_cert_path=cert_path,
            tls_verify=verify,
            source=where,
        )

    def _host_tls(self, table: Mapping[str, Any], where: str) -> tuple[str | None, bool]:
        """``tls_cert_path`` (``~`` expanded, relative to this file's directory) and
        ``tls_verify`` of a host reached over ``tcp://``. Whether the files exist is asked when
        the host is used (:func:`~pytest_specdecode.fleet.engine`): a missing certificate fails
        that host's tests, not the file."""
        verify = table.get("tls_verify", True)
        if not isinstance(verify, bool):
            _fail(where, "tls_verify", verify, "must be true or false (no quotes)")
        if "tls_cert_path" not in table:
            if "tls_verify" in table:
                raise ConfigError(
                    "tls_verify is set without tls_cert_path: give tls_cert_path, the "
                    "directory of the host's ca.pem, cert.pem and key.pem (without it, "
                    "pytest's DOCKER_TLS_VERIFY and DOCKER_CERT_PATH apply)",
                    source=where,
                )
            return None, True
        text = _string(table["tls_cert_path"], "tls_cert_path", where)
        if "context" in table:
            raise ConfigError(
                "tls_cert_path is set on a host reached through a Docker context, which "
                "carries its own TLS material: remove tls_cert_path, and give the certificates "
                "to the context (`docker context update NAME --docker "
                '"host=tcp://HOST:2376,ca=ca.pem,cert=cert.pem,key=key.pem"`)',
                source=where,
            )
        address = table.get("docker_host")
        if isinstance(address, str) and not re.match(r"^(tcp|https)://", address):
            _fail(
                where,
                "tls_cert_path",
                text,
                f"TLS applies to a tcp:// engine, and docker_host is {address!r}: give a "
                "tcp://HOST:2376 docker_host, or remove tls_cert_path",
            )
        expanded = Path(os.path.expanduser(text))
        if not expanded.is_absolute():
            expanded = self.path.absolute().parent / expanded
        return os.path.normpath(expanded), verify

    def _env_set(self, name: str, table: Mapping[str, Any]) -> FrozenMap:
        where = self.where(f"env.{name}")
        for var, value in table.items():
            if not ENV_NAME_PATTERN.match(var):
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
                out[key] = VALIDATORS[key](value, key, where)
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
        """One profile under one target: [defaults], then its own table, then the target's
        overlay; every rule across keys and tables checked on the result."""
        merged = {**defaults, **own}
        where = self.where(f"profiles.{name}")
        if kind_of(merged.get("launcher", DEFAULT_LAUNCHER)).llamacpp_options:
            # llama-server runs on any machine: a target's overlay (which swaps SGLang for the
            # simulated server or a container) does not apply to it.
            return self._build_llamacpp(name, merged, own, where, target)
        own_layers = {**own, **overlay}
        _drop_llamacpp_keys(merged, own_layers, where)
        _apply_overlay(merged, overlay)
        if target != TARGET_REAL:
            where += f" with [targets.{target}]"
        return self._build_sglang(name, merged, own_layers, where, target)

    def _build_sglang(
        self,
        name: str,
        merged: Mapping[str, Any],
        own_layers: Mapping[str, Any],
        where: str,
        target: str,
    ) -> ServerProfile:
        """An SGLang-like profile (the real server, the simulated one, or either in a
        container) from its merged keys; ``own_layers``: the keys its own table and the
        target's overlay wrote, not inherited from [defaults]."""
        if "model_path" not in merged:
            raise ConfigError(
                "model_path is missing: set it in the profile or in [defaults]", source=where
            )
        launcher: str = merged.get("launcher", DEFAULT_LAUNCHER)
        tp_size: int = merged.get("tp_size", 1)
        extra_args: tuple[str, ...] = tuple(merged.get("extra_args", ()))
        kind = kind_of(launcher)
        server_module = _server_module(merged, kind, launcher, where)
        simulated = kind.simulated or server_module == SIM_MODULE
        if not simulated:
            _refuse_sim_flags(extra_args, launcher, server_module, where)
        gpus = _gpus(merged, simulated, tp_size, where)
        docker = _docker_options(merged, kind, launcher, where)
        hosts = self._placement(merged, own_layers, kind, target, where)
        env_sets: tuple[str, ...] = merged.get("env", ())
        spec = merged.get("speculative")
        profile = ServerProfile(
            name=name,
            description=merged.get("description", ""),
            launcher=launcher,
            model_path=merged["model_path"],
            tp_size=tp_size,
            speculative=sglang_speculative(spec) if spec is not None else None,
            mem_fraction_static=merged.get("mem_fraction_static"),
            extra_args=extra_args,
            env_sets=env_sets,
            env=self._merged_env(name, env_sets),
            gpus=gpus,
            host=merged.get("host", DEFAULT_HOST),
            port=merged.get("port"),
            startup_timeout=merged.get("startup_timeout", DEFAULT_STARTUP_TIMEOUT),
            warmup_requests=merged.get("warmup_requests", DEFAULT_WARMUP_REQUESTS),
            server_module=server_module,
            python=merged.get("python") if kind.own_python else None,
            docker=docker,
            api_key_env=merged.get("api_key_env"),
            target=target,
            source=where,
            hosts=hosts if kind.placed_on_hosts else (),
        )
        self._warn_sglang_env(profile, env_sets)
        return profile

    def _placement(
        self,
        merged: Mapping[str, Any],
        own_layers: Mapping[str, Any],
        kind: ServerKind,
        target: str,
        where: str,
    ) -> tuple[str, ...]:
        """``hosts``: the [hosts.NAME] a profile runs on, each one defined in the file; under
        the real target, only a kind placed on hosts (docker) may set them in its own table
        or overlay."""
        hosts: tuple[str, ...] = merged.get("hosts", ())
        if "hosts" in own_layers and not kind.placed_on_hosts and target == TARGET_REAL:
            _fail(
                where,
                "hosts",
                list(hosts),
                'only launcher = "docker" profiles run on [hosts.NAME] (through their Docker '
                "engines); remove hosts, or make the profile a docker one",
            )
        unknown = [h for h in hosts if h not in self.hosts]
        if unknown:
            _fail(
                where,
                "hosts",
                list(hosts),
                f"{unknown} {'is' if len(unknown) == 1 else 'are'} not defined; defined: "
                f"{', '.join(self.hosts) or 'none'} (add [hosts.NAME] tables)",
            )
        return hosts

    def _warn_sglang_env(self, profile: ServerProfile, env_sets: Sequence[str]) -> None:
        """Warn about the profile's variables that SGLang overwrites, each named with the
        [env.NAME] table it was written in."""
        # Where each variable was written: the last of the profile's sets that holds it wins.
        origin = {
            var: self.where(f"env.{set_name}")
            for set_name in env_sets
            for var in self.env_sets[set_name]
        }
        self.warnings.extend(sglang_env_warnings(profile, origin))

    def _build_llamacpp(
        self,
        name: str,
        merged: dict[str, Any],
        own: Mapping[str, Any],
        where: str,
        target: str,
    ) -> ServerProfile:
        if "model_path" not in merged:
            raise ConfigError(
                "model_path is missing: set it in the profile or in [defaults] (the target "
                "model's GGUF file)",
                source=where,
            )
        for key in SGLANG_ONLY_KEYS:
            if key in own:
                _fail(
                    where,
                    key,
                    own[key],
                    f'it is an SGLang setting, which launcher "{LLAMACPP}" does not '
                    "have; remove it (llama-server's own settings: threads, ctx_size, "
                    "parallel, speculative, extra_args)",
                )
            merged.pop(key, None)  # inherited from [defaults]: meant for the SGLang profiles
        extra_args: tuple[str, ...] = tuple(merged.get("extra_args", ()))
        check_llamacpp_extra_args(flag_groups(extra_args), where)
        spec = merged.get("speculative")
        env_sets: tuple[str, ...] = merged.get("env", ())
        options = LlamaCppOptions(
            binary=merged.get("binary"),
            speculative=llamacpp_speculative(spec) if spec is not None else None,
            threads=merged.get("threads"),
            ctx_size=merged.get("ctx_size"),
            parallel=merged.get("parallel"),
        )
        return ServerProfile(
            name=name,
            description=merged.get("description", ""),
            launcher=LLAMACPP,
            model_path=merged["model_path"],
            extra_args=extra_args,
            env_sets=env_sets,
            env=self._merged_env(name, env_sets),
            gpus=tuple(merged.get("gpus", ())),
            host=merged.get("host", DEFAULT_HOST),
            port=merged.get("port"),
            startup_timeout=merged.get("startup_timeout", DEFAULT_STARTUP_TIMEOUT),
            warmup_requests=merged.get("warmup_requests", DEFAULT_WARMUP_REQUESTS),
            api_key_env=merged.get("api_key_env"),
            llamacpp=options,
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


# -- the SGLang profile's rules across keys ---------------------------------------------------


def _drop_llamacpp_keys(merged: dict[str, Any], own_layers: Mapping[str, Any], where: str) -> None:
    """Refuse a llama.cpp key the profile's own table or the target's overlay wrote; drop one
    inherited from [defaults]."""
    for key in LLAMACPP_ONLY_KEYS:
        if key in own_layers:
            _fail(
                where,
                key,
                own_layers[key],
                f'it is a key of launcher "{LLAMACPP}" profiles only; remove it',
            )
        merged.pop(key, None)  # inherited from [defaults]: meant for llama.cpp profiles


def _apply_overlay(merged: dict[str, Any], overlay: Mapping[str, Any]) -> None:
    """The target's overlay on top: its keys replace the profile's, except ``extra_args``,
    which it appends to."""
    for key, value in overlay.items():
        if key == "extra_args":
            merged[key] = (*merged.get(key, ()), *value)
        else:
            merged[key] = value


def _server_module(
    merged: Mapping[str, Any], kind: ServerKind, launcher: str, where: str
) -> str | None:
    """``server_module``, refused for a launcher that always runs the simulated server."""
    server_module: str | None = merged.get("server_module")
    if server_module is not None and not kind.takes_server_module:
        raise ConfigError(
            f"server_module = {server_module!r} does not apply to launcher {launcher!r}, "
            f"which always runs {SIM_MODULE}; remove it",
            source=where,
        )
    return server_module


def _refuse_sim_flags(
    extra_args: tuple[str, ...], launcher: str, server_module: str | None, where: str
) -> None:
    """A real server's ``extra_args`` must not hold the simulated server's ``--sim-*`` knobs."""
    sim_flags = [flag for flag, _ in flag_groups(extra_args) if flag.startswith("--sim-")]
    if sim_flags:
        raise ConfigError(
            f"extra_args {sim_flags} are knobs of the simulated server, but launcher "
            f"is {launcher!r} running {server_module or SGLANG_MODULE}; put them in a "
            f"[targets.sim] overlay (or set server_module = {SIM_MODULE!r})",
            source=where,
        )


def _gpus(merged: Mapping[str, Any], simulated: bool, tp_size: int, where: str) -> tuple[int, ...]:
    """``gpus``: by default none for a simulated server, else the first ``tp_size``; a real
    server's list must give ``tp_size`` GPUs at least."""
    gpus = merged.get("gpus")
    if gpus is None:
        gpus = () if simulated else tuple(range(tp_size))
    if not simulated and len(gpus) < tp_size:
        raise ConfigError(
            f"gpus = {list(gpus)} gives {len(gpus)} GPU(s), but tp_size = {tp_size} needs "
            f"at least {tp_size}; list more GPUs or leave gpus out (default: the first "
            "tp_size GPUs)",
            source=where,
        )
    return tuple(gpus)


def _docker_options(
    merged: Mapping[str, Any], kind: ServerKind, launcher: str, where: str
) -> DockerOptions | None:
    """The container's settings of a launcher that runs in one (``image`` required), else
    ``None``."""
    if not kind.in_container:
        return None
    if "image" not in merged:
        raise ConfigError(
            f'launcher "{launcher}" needs image = "..." (e.g. "lmsysorg/sglang:v0.5.15-cu129")',
            source=where,
        )
    return DockerOptions(
        image=merged["image"],
        shm_size=merged.get("shm_size", DEFAULT_SHM_SIZE),
        volumes=merged.get("volumes", FrozenMap()),
        network=merged.get("network", "host"),
    )
