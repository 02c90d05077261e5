"""Resolving the options once, command line > environment > ini > default, into a frozen
:class:`Settings`; a bad value is a :class:`ConfigError` that says which value, from where (flag,
environment variable or ini file), and what is allowed. Also where a project's defaults and its
tests' baseline ids are anchored (:func:`find_project_root`, :func:`project_test_id`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_specdecode.errors import ConfigError
from pytest_specdecode.redaction import redact_url
from pytest_specdecode.settings.options import OPTIONS, PATH_OPTIONS, Option
from pytest_specdecode.settings.values import ServerHosts, default_state_dir


@dataclass(frozen=True)
class Settings:
    config: Path
    target: str
    server_host: ServerHosts | None
    update_baselines: bool
    force_baseline: bool
    baselines: Path
    keep_server: bool
    skip_preflight: bool
    allow_mismatch: bool
    runs: int
    max_runs: int
    baseline_runs: int
    baseline_launches: int | None
    alpha: float
    alpha_no_change: float
    reference_nights: int
    method: str
    on_inconclusive: str
    on_missing_baseline: str
    max_baseline_cv: float
    hardware_key: str | None
    state_dir: Path
    report: Path | None
    history: Path | None
    markdown: Path | None
    html: Path | None
    request_timeout: float
    stall_timeout: float | None
    """Seconds of silence that make a server hung; ``None``: derived (client.StallBound)."""
    project_root: Path = Path(".")
    """Where the defaults (the profile file, ``baselines/``) and the baseline test ids are
    anchored: the ini file's directory, or without one the directory above the rootdir that
    holds the default profile file (:func:`find_project_root`)."""
    config_source: str = "the default"
    """Where :attr:`config` came from, for the header: the flag, the variable, the ini key, or
    the default and how it was found."""
    machine_load: float | str = "measure"
    """``"measure"``, ``"off"``, or a declared load in runnable tasks per CPU
    (:mod:`pytest_specdecode.session.machine_load`)."""
    exit_status: str = "pytest"
    """``"pytest"`` (pytest's own exit statuses) or ``"nightly"`` (one per kind of night,
    :mod:`pytest_specdecode.session.exit_status`)."""


DEFAULT_CONFIG = Path("perf_tests/specdecode.toml")


def find_project_root(start: Path) -> Path | None:
    """The nearest directory at or above ``start`` that holds ``perf_tests/specdecode.toml``,
    not climbing past a repository root (a directory with ``.git``): without an ini file
    pytest's rootdir is wherever the run starts (``perf_tests/`` itself for ``cd perf_tests;
    pytest``), and the default paths must not move with it."""
    for directory in (start, *start.parents):
        if (directory / DEFAULT_CONFIG).is_file():
            return directory
        if (directory / ".git").exists():
            return None
    return None


def project_test_id(nodeid: str, path: Path, rootdir: Path, project_root: Path) -> str:
    """The test id baselines are stored under: pytest's node id, with its file part relative to
    the project root rather than the rootdir, so that a test keeps its baseline whichever
    directory pytest runs from (``test_seed.py::t`` from inside ``perf_tests/`` is
    ``perf_tests/test_seed.py::t``)."""
    if project_root.resolve() == rootdir.resolve():
        return nodeid
    _, sep, rest = nodeid.partition("::")
    try:
        relative = path.resolve().relative_to(project_root.resolve())
    except ValueError:
        return nodeid  # a test outside the project keeps pytest's id
    return relative.as_posix() + sep + rest


def resolve(
    *,
    cli: Mapping[str, Any],
    ini: Mapping[str, str | None],
    env: Mapping[str, str],
    invocation_dir: Path,
    ini_dir: Path,
    ini_file: str = "the ini file",
    search_from: Path | None = None,
) -> Settings:
    """Resolve every option: ``cli`` (None = not given) > ``env`` > ``ini`` > default.

    Relative paths are taken from where they were written: the ini file's directory for ini
    values, the invocation directory for flags and environment variables. Defaults are taken
    from ``ini_dir``; ``search_from`` (the rootdir, given when there is no ini file) makes them
    relative to the project root found above it instead (:func:`find_project_root`).
    """
    given = _Given(cli, ini, env, invocation_dir, ini_dir, ini_file)
    project_root, found_above = _project_root(ini_dir, search_from)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for option in OPTIONS:
        raw, where, base = given.raw(option)
        sources[option.name] = where
        values[option.name] = option.default if raw is None else _parsed(option, raw, where, base)
    _check_run_counts(values)
    config_source = sources["config"] or (
        f"the default, found above the rootdir {search_from}" if found_above else "the default"
    )
    return _settings(values, project_root, config_source)


@dataclass(frozen=True)
class _Given:
    """What the command line, the environment and the ini file say, and the directories their
    relative paths are taken from."""

    cli: Mapping[str, Any]
    ini: Mapping[str, str | None]
    env: Mapping[str, str]
    invocation_dir: Path
    ini_dir: Path
    ini_file: str

    def raw(self, option: Option) -> tuple[Any, str, Path]:
        """The option's raw value from the first source that gives it (``None``: none does),
        where it came from (``""`` for none) and the directory a relative path is taken from."""
        if self.cli.get(option.name) not in (None, False, []):
            raw = self.cli[option.name]
            if isinstance(raw, list):  # a repeatable flag, given once or more
                raw = ", ".join(str(value) for value in raw)
            return raw, f"{option.flag}", self.invocation_dir
        if option.env and self.env.get(option.env_var):
            where = f"environment variable {option.env_var}"
            return self.env[option.env_var], where, self.invocation_dir
        if option.ini and self.ini.get(option.name):
            where = f"ini key {option.ini_key} in {self.ini_file}"
            return self.ini[option.name], where, self.ini_dir
        return None, "", self.invocation_dir


def _project_root(ini_dir: Path, search_from: Path | None) -> tuple[Path, bool]:
    """Where the defaults are anchored, and whether it was found above ``search_from``: the
    project root found from ``search_from`` when one is given and found, else ``ini_dir``."""
    if search_from is not None:
        found = find_project_root(search_from)
        if found is not None:
            return found, found != search_from
    return ini_dir, False


def _parsed(option: Option, raw: Any, where: str, base: Path) -> Any:
    """``raw`` through the option's parser (a switch's ``bool`` as it is); a path option's
    relative path taken from ``base``. A bad value names itself (a server URL redacted) and
    ``where`` it came from."""
    try:
        value = option.parse(str(raw)) if not isinstance(raw, bool) else raw
    except ValueError as exc:
        shown = redact_url(str(raw)) if option.name == "server_host" else raw
        raise ConfigError(f"invalid value {shown!r} from {where}: {exc}") from None
    if option.name in PATH_OPTIONS:
        path = Path(str(value)).expanduser()
        value = str(path if path.is_absolute() else base / path)
    return value


def _check_run_counts(values: Mapping[str, Any]) -> None:
    """The most runs a test may take must allow the runs it takes."""
    if values["max_runs"] < values["runs"]:
        raise ConfigError(
            f"max_runs ({values['max_runs']}) is smaller than runs ({values['runs']}): "
            "set --specdecode-max-runs to at least --specdecode-runs"
        )


def _settings(values: Mapping[str, Any], project_root: Path, config_source: str) -> Settings:
    """The frozen settings, paths as :class:`Path`: the profile file and the baselines, still
    relative only when they are the defaults, anchored at the project root; the state directory
    defaulted."""
    state_dir = values["state_dir"] or str(default_state_dir())
    config = values["config"]
    baselines = values["baselines"]
    if not Path(config).is_absolute():
        config = str(project_root / config)
    if not Path(baselines).is_absolute():
        baselines = str(project_root / baselines)
    return Settings(
        **{
            **values,
            "config": Path(config),
            "baselines": Path(baselines),
            "state_dir": Path(state_dir),
            "project_root": project_root,
            "config_source": config_source,
            **{
                name: Path(values[name]) if values[name] else None
                for name in ("report", "history", "markdown", "html")
            },
        }
    )
