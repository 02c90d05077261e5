"""Every knob of the plugin, defined once and resolved once: command line > environment > ini >
default.

:data:`OPTIONS` is the single definition the plugin turns into ``parser.addoption`` and
``parser.addini`` calls, so the help texts of the flag and the ini key never drift apart.
:func:`resolve` turns the raw values into a frozen :class:`Settings`; a bad value is a
:class:`ConfigError` that says which value, from where (flag, environment variable or ini file),
and what is allowed.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_specdecode.errors import ConfigError
from pytest_specdecode.redaction import redact_url

INCONCLUSIVE_POLICIES = ("fail", "warn", "xfail")
MISSING_BASELINE_POLICIES = ("skip", "fail")
METHODS = ("welch-log", "bootstrap", "rank")


@dataclass(frozen=True)
class Option:
    """One setting: its flag, ini key, environment variable, parser and default."""

    name: str
    flag: str
    help: str
    default: Any
    parse: Callable[[str], Any]
    metavar: str | None = None
    ini: bool = True
    env: bool = True
    is_flag: bool = False  # a store_true switch on the command line
    repeatable: bool = False
    """The flag may be given several times; its values are parsed together, as one
    comma-separated value (as the environment variable gives them)."""

    @property
    def ini_key(self) -> str:
        return f"specdecode_{self.name}"

    @property
    def env_var(self) -> str:
        return f"PYTEST_SPECDECODE_{self.name.upper()}"


def _run_count(text: str) -> int:
    value = int(text)
    if value < 2:
        raise ValueError(
            "must be a whole number of at least 2 (one run has no run-to-run variance, so no "
            "confidence interval)"
        )
    return value


def _launch_count(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 20:
        raise ValueError("must be a whole number of launches from 1 to 20")
    return value


def _reference_nights(text: str) -> int:
    value = int(text)
    if not 5 <= value <= 1000:
        raise ValueError("must be a whole number of nights from 5 to 1000")
    return value


def _probability(text: str) -> float:
    value = float(text)
    if not 0.0 < value < 0.5:
        raise ValueError("must lie between 0 and 0.5 (a one-sided error rate such as 0.05)")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError("must be a positive number")
    return value


def _seconds_or_auto(text: str) -> float | None:
    if text.strip().lower() == "auto":
        return None
    return _positive_float(text)


def _machine_load(text: str) -> float | str:
    lowered = text.strip().lower()
    if lowered in ("measure", "off"):
        return lowered
    try:
        value = float(lowered)
    except ValueError:
        value = -1.0
    if not 0.0 <= value < float("inf"):
        raise ValueError(
            "must be 'measure', 'off', or the machine's load as runnable tasks per CPU (a "
            "number of at least 0, such as 0.5)"
        )
    return value


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}")
        return text

    return parse


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("must be true or false")


def _text(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be empty")
    return text.strip()


@dataclass(frozen=True)
class ServerHosts:
    """``--server-host``: the servers someone else runs. ``default`` (a bare ``URL``) serves
    every selected profile it runs (by its ``/server_info``); ``named`` (``PROFILE=URL``) says
    which server serves which profile. The URLs are as written (``HOST[:PORT]`` or a URL);
    ``servers.attach.attach_url`` completes them."""

    default: str | None = None
    named: Mapping[str, str] = field(default_factory=dict)

    def url_for(self, profile: str) -> str | None:
        """The server given for ``profile``: its own, else the default (None: none given)."""
        return self.named.get(profile, self.default)

    @property
    def specs(self) -> list[str]:
        """Every server given, the default first, each once."""
        urls = ([self.default] if self.default else []) + list(self.named.values())
        return list(dict.fromkeys(urls))

    def __str__(self) -> str:
        """As the user would write it, passwords in URLs redacted."""
        parts = [f"{name}={url}" for name, url in self.named.items()]
        if self.default:
            parts.insert(0, self.default)
        return redact_url(", ".join(parts))


_PROFILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
"""What may stand before ``=`` in ``PROFILE=URL``: a profile name. A URL's own ``=`` (in a
password) has ``:``, ``/`` or ``@`` before it, so it is never taken for one."""


def _server_hosts(text: str) -> ServerHosts:
    """``URL`` and/or ``PROFILE=URL`` values, separated by commas or whitespace (the flag may
    be repeated). At most one bare URL; a profile named twice must name one server."""
    default: str | None = None
    named: dict[str, str] = {}
    for item in re.split(r"[,\s]+", text.strip()):
        if not item:
            continue
        name, sep, url = item.partition("=")
        if not (sep and _PROFILE_NAME.fullmatch(name)):
            if default is not None and default != item:
                raise ValueError(
                    f"gives two servers without a profile ({redact_url(default)} and "
                    f"{redact_url(item)}): give at most one bare URL (it serves the profiles it "
                    "runs) and name the others PROFILE=URL"
                )
            default = item
            continue
        if not url:
            raise ValueError(f"{name}= names no server: write {name}=HOST[:PORT] or a URL")
        if named.get(name, url) != url:
            raise ValueError(
                f"names two servers for profile {name!r} ({redact_url(named[name])} and "
                f"{redact_url(url)}): one profile is measured on one server"
            )
        named[name] = url
    if default is None and not named:
        raise ValueError("must not be empty")
    return ServerHosts(default=default, named=named)


def default_state_dir() -> Path:
    """The machine-wide state directory (per user): ``$XDG_CACHE_HOME`` or ``~/.cache``."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "pytest-specdecode"


OPTIONS: tuple[Option, ...] = (
    Option(
        "config",
        "--specdecode-config",
        "Server profile file (TOML)",
        "perf_tests/specdecode.toml",
        _text,
        "PATH",
    ),
    Option(
        "target",
        "--specdecode-target",
        "Which profiles to run: 'real', 'sim' or another [targets.NAME] overlay of the profile "
        "file; 'auto' = real when GPUs are found, else sim; with --server-host, sim when the "
        'server reports "simulated": true in its /server_info, else real',
        "auto",
        _text,
        "NAME",
    ),
    Option(
        "server_host",
        "--server-host",
        "Measure servers someone else runs instead of launching them. URL (HOST[:PORT] or a "
        "URL): the selected tests of the profile that server runs, by its /server_info; the "
        "others are skipped with the reason. PROFILE=URL (repeatable, or comma-separated): "
        "that profile's server, which must run it; a bare URL then serves the other profiles",
        None,
        _server_hosts,
        "[PROFILE=]URL",
        ini=False,
        repeatable=True,
    ),
    Option(
        "update_baselines",
        "--update-baselines",
        "Record the measured runs as the new baselines (prints old -> new)",
        False,
        _bool,
        ini=False,
        env=False,
        is_flag=True,
    ),
    Option(
        "force_baseline",
        "--specdecode-force-baseline",
        "With --update-baselines: record even when the runs are noisier than max_baseline_cv",
        False,
        _bool,
        ini=False,
        is_flag=True,
    ),
    Option(
        "baselines",
        "--specdecode-baselines",
        "Directory of the stored baselines",
        "baselines",
        _text,
        "DIR",
    ),
    Option(
        "keep_server",
        "--specdecode-keep-server",
        "Leave the last server running after the session so the next one skips the load",
        False,
        _bool,
        is_flag=True,
    ),
    Option(
        "skip_preflight",
        "--specdecode-skip-preflight",
        "Launch SGLang without first checking the command with its own argument parser "
        "(the check runs in the server's interpreter before the load and took 20-29 s per "
        "launch on SGLang 0.5.15, most of it the import of SGLang's server arguments)",
        False,
        _bool,
        is_flag=True,
    ),
    Option(
        "allow_mismatch",
        "--specdecode-allow-mismatch",
        "With --server-host: warn instead of failing when the server's arguments differ "
        "from the profile's",
        False,
        _bool,
        is_flag=True,
    ),
    Option(
        "runs",
        "--specdecode-runs",
        "Measured runs per test before the first verdict",
        5,
        _run_count,
        "N",
    ),
    Option(
        "max_runs",
        "--specdecode-max-runs",
        "Most runs per test when the verdict stays inconclusive",
        10,
        _run_count,
        "N",
    ),
    Option(
        "baseline_runs",
        "--specdecode-baseline-runs",
        "Runs recorded per test and server launch with --update-baselines (more runs = a "
        "sharper baseline)",
        60,
        _run_count,
        "N",
    ),
    Option(
        "baseline_launches",
        "--specdecode-baseline-launches",
        "Server launches a baseline is recorded over with --update-baselines, so that the "
        "verdicts can carry launch-to-launch variance (default: 3 on real servers, 1 on the "
        "simulated one, which does not vary by launch unless --sim-launch-cv says so)",
        None,
        _launch_count,
        "K",
    ),
    Option(
        "alpha",
        "--specdecode-alpha",
        "One-sided error rate of each verdict at the margin (false FAIL and false PASS of a "
        "build exactly at the margin; docs/statistics.md)",
        0.15,
        _probability,
        "ALPHA",
    ),
    Option(
        "alpha_no_change",
        "--specdecode-alpha-no-change",
        "For a negative margin, a FAIL must also be worse than the baseline itself at this "
        "level: an unchanged build FAILs about this often at most; a tenth of it once 10 nights "
        "of history exist (docs/statistics.md)",
        0.01,
        _probability,
        "ALPHA",
    ),
    Option(
        "reference_nights",
        "--specdecode-reference-nights",
        "Nights of history after a baseline recording that the cross-night detector takes as "
        "its frozen reference before it watches for a persistent drop (90 meets the detection "
        "targets in docs/statistics.md; fewer: active sooner, slower to flag small drops)",
        90,
        _reference_nights,
        "N",
    ),
    Option(
        "method",
        "--specdecode-method",
        f"Confidence interval of current/baseline: {', '.join(METHODS)}",
        "welch-log",
        _choice(*METHODS),
        "METHOD",
    ),
    Option(
        "on_inconclusive",
        "--specdecode-on-inconclusive",
        "What an inconclusive verdict after max_runs does: fail, warn (pass with a warning) "
        "or xfail",
        "xfail",
        _choice(*INCONCLUSIVE_POLICIES),
        "POLICY",
    ),
    Option(
        "on_missing_baseline",
        "--specdecode-on-missing-baseline",
        "What a test with thresholds but no stored baseline does: skip or fail",
        "skip",
        _choice(*MISSING_BASELINE_POLICIES),
        "POLICY",
    ),
    Option(
        "max_baseline_cv",
        "--specdecode-max-baseline-cv",
        "Refuse to record a baseline whose tok/s CV is above this (e.g. 0.08 = 8%)",
        0.08,
        _positive_float,
        "CV",
    ),
    Option(
        "hardware_key",
        "--specdecode-hardware-key",
        "Name of this hardware in baselines/ (default: detected GPUs, or 'simulated')",
        None,
        _text,
        "KEY",
    ),
    Option(
        "state_dir",
        "--specdecode-state-dir",
        "Where running servers are recorded for reuse, machine-wide (default: "
        "$XDG_CACHE_HOME/pytest-specdecode, else ~/.cache/pytest-specdecode)",
        None,
        _text,
        "DIR",
    ),
    Option(
        "report",
        "--specdecode-report",
        "Write a JSON report of every measured test (samples, verdicts, fingerprints, "
        "provenance) to PATH",
        None,
        _text,
        "PATH",
    ),
    Option(
        "history",
        "--specdecode-history",
        "Append this session's summary to a JSON-lines history file (read by "
        "'python -m pytest_specdecode report PATH')",
        None,
        _text,
        "PATH",
    ),
    Option(
        "markdown",
        "--specdecode-markdown",
        "Write the Markdown summary to PATH (it is also appended to $GITHUB_STEP_SUMMARY "
        "when that is set)",
        None,
        _text,
        "PATH",
    ),
    Option(
        "html",
        "--specdecode-html",
        "Write the dashboard, a static site of the nightly history (--specdecode-history, with "
        "this session appended; this session alone without one), to DIR: a new or empty "
        "folder, or an earlier dashboard's. Open DIR/index.html",
        None,
        _text,
        "DIR",
    ),
    Option(
        "request_timeout",
        "--specdecode-request-timeout",
        "Seconds one measurement request may take",
        600.0,
        _positive_float,
        "SECONDS",
    ),
    Option(
        "stall_timeout",
        "--specdecode-stall-timeout",
        "Seconds without a token (or, after the server logged it is ready, without a health "
        "answer) after which a server counts as hung: its test fails and later tests of its "
        "profile fail at once. auto (the default): 10x the longest silence seen on that server "
        "so far, at least 30 s (120 s before anything was seen); 60 s for the health answer",
        None,
        _seconds_or_auto,
        "SECONDS|auto",
    ),
    Option(
        "machine_load",
        "--specdecode-machine-load",
        "The machine's CPU load during each test's runs, recorded with baselines and results: "
        "'measure' (the run queue per CPU; a comparison across loads that differ enough to "
        "move tok/s warns), a number of runnable tasks per CPU to record instead of measuring, "
        "or 'off' (record nothing, never warn)",
        "measure",
        _machine_load,
        "measure|off|LOAD",
    ),
)

OPTIONS_BY_NAME = {option.name: option for option in OPTIONS}
PATH_OPTIONS = ("config", "baselines", "state_dir", "report", "history", "markdown", "html")

ENV_PREFIX = "PYTEST_SPECDECODE_"
OTHER_ENV_VARS: Mapping[str, str] = {
    "PYTEST_SPECDECODE_CALIBRATION_CACHE": "where the sequential plans' calibrations are "
    "cached (read by pytest_specdecode.stats.calibration_cache)",
}
"""``PYTEST_SPECDECODE_*`` variables read outside :data:`OPTIONS`; a test keeps this list in
step with the package's sources, so a misspelling of one of them is warned about too."""


def unknown_env_warnings(env: Mapping[str, str]) -> list[str]:
    """One warning per ``PYTEST_SPECDECODE_*`` variable that nothing reads, naming the closest
    known name: a misspelled variable would otherwise be ignored without a word. A variable of
    an option that has none (``--update-baselines``) says to pass the flag instead."""
    known = [o.env_var for o in OPTIONS if o.env] + list(OTHER_ENV_VARS)
    flag_only = {o.env_var: o for o in OPTIONS if not o.env}
    found = []
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name in known:
            continue
        if name in flag_only:
            found.append(
                f"environment variable {name} is ignored: {flag_only[name].flag} has no "
                "environment variable (pass the flag on the command line)"
            )
            continue
        # Compared without the shared prefix, which would make every name look close.
        close = difflib.get_close_matches(
            name.removeprefix(ENV_PREFIX), [k.removeprefix(ENV_PREFIX) for k in known], n=1
        )
        hint = f"; did you mean {ENV_PREFIX}{close[0]}?" if close else ""
        found.append(
            f"environment variable {name} is not a pytest-specdecode setting and is "
            f"ignored{hint} (the settings: `pytest --help`, README's options table)"
        )
    return found


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def options_table() -> str:
    """README's options table, generated from :data:`OPTIONS` (``scripts/gen-options-table.py``
    writes it; a unit test fails when README's copy differs), so a flag's ini key, environment
    variable and default in the README are the ones the plugin reads."""
    lines = [
        "| option | ini key | environment variable | default | what |",
        "|---|---|---|---|---|",
    ]
    for option in OPTIONS:
        flag = option.flag if option.is_flag else f"{option.flag} {option.metavar}"
        default = "" if option.default in (None, False) else f"`{option.default}`"
        lines.append(
            "| "
            + " | ".join(
                _cell(cell)
                for cell in (
                    f"`{flag}`",
                    f"`{option.ini_key}`" if option.ini else "—",
                    f"`{option.env_var}`" if option.env else "—",
                    default,
                    option.help,
                )
            )
            + " |"
        )
    return "\n".join(lines) + "\n"


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
