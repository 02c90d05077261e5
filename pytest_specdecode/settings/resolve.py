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
from pytest_specdecode.settings.options import OPTIONS, PATH_OPTIONS
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
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    project_root = ini_dir
    found_above = False
    if search_from is not None:
        found = find_project_root(search_from)
        if found is not None:
            project_root, found_above = found, found != search_from
    for option in OPTIONS:
        raw: Any = None
        where = ""
        base = invocation_dir
        if cli.get(option.name) not in (None, False, []):
            raw, where = cli[option.name], f"{option.flag}"
            if isinstance(raw, list):  # a repeatable flag, given once or more
                raw = ", ".join(str(value) for value in raw)
        elif option.env and env.get(option.env_var):
            raw, where = env[option.env_var], f"environment variable {option.env_var}"
        elif option.ini and ini.get(option.name):
            raw, where = ini[option.name], f"ini key {option.ini_key} in {ini_file}"
            base = ini_dir
        sources[option.name] = where
        if raw is None:
            values[option.name] = option.default
            continue
        try:
            value = option.parse(str(raw)) if not isinstance(raw, bool) else raw
        except ValueError as exc:
            shown = redact_url(str(raw)) if option.name == "server_host" else raw
            raise ConfigError(f"invalid value {shown!r} from {where}: {exc}") from None
        if option.name in PATH_OPTIONS:
            path = Path(str(value)).expanduser()
            value = str(path if path.is_absolute() else base / path)
        values[option.name] = value

    if values["max_runs"] < values["runs"]:
        raise ConfigError(
            f"max_runs ({values['max_runs']}) is smaller than runs ({values['runs']}): "
            "set --specdecode-max-runs to at least --specdecode-runs"
        )
    state_dir = values["state_dir"] or str(default_state_dir())
    config = values["config"]
    baselines = values["baselines"]
    if not Path(config).is_absolute():
        config = str(project_root / config)
    if not Path(baselines).is_absolute():
        baselines = str(project_root / baselines)
    config_source = sources["config"]
    if not config_source:
        config_source = (
            f"the default, found above the rootdir {search_from}" if found_above else "the default"
        )
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
