"""Every knob of the plugin, defined once: :data:`OPTIONS` is the single definition the plugin
turns into ``parser.addoption`` and ``parser.addini`` calls (the help texts of the flag and the
ini key never drift apart), README's options table, and the list of the environment variables
the plugin reads, against which a misspelt one is named.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pytest_specdecode.settings.values import (
    EXIT_STATUS_MODES,
    INCONCLUSIVE_POLICIES,
    METHODS,
    MISSING_BASELINE_POLICIES,
    choice,
    launch_count,
    machine_load,
    positive_float,
    probability,
    reference_nights,
    run_count,
    seconds_or_auto,
    server_hosts,
    switch,
    text_value,
)


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

    @property
    def default_text(self) -> str:
        return "" if self.default is None else f" (default: {self.default})"

    def cli_arguments(self) -> dict[str, Any]:
        """What argparse (pytest's ``addoption``) takes for the flag, but the flag itself."""
        # argparse %-formats command-line help ("8%" would crash `pytest --help`); ini help
        # is printed as it is.
        cli_help = (self.help + ("" if self.is_flag else self.default_text)).replace("%", "%%")
        kind: dict[str, Any] = {"metavar": self.metavar}
        if self.is_flag:
            kind = {"action": "store_true"}
        elif self.repeatable:
            kind["action"] = "append"
        return {"dest": f"specdecode_{self.name}", "default": None, "help": cli_help, **kind}


OPTIONS: tuple[Option, ...] = (
    Option(
        "config",
        "--specdecode-config",
        "Server profile file (TOML)",
        "perf_tests/specdecode.toml",
        text_value,
        "PATH",
    ),
    Option(
        "target",
        "--specdecode-target",
        "Which profiles to run: 'real', 'sim' or another [targets.NAME] overlay of the profile "
        "file; 'auto' = real when GPUs are found, else sim; with --server-host, sim when the "
        'server reports "simulated": true in its /server_info, else real',
        "auto",
        text_value,
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
        server_hosts,
        "[PROFILE=]URL",
        ini=False,
        repeatable=True,
    ),
    Option(
        "update_baselines",
        "--update-baselines",
        "Record the measured runs as the new baselines (prints old -> new)",
        False,
        switch,
        ini=False,
        env=False,
        is_flag=True,
    ),
    Option(
        "force_baseline",
        "--specdecode-force-baseline",
        "With --update-baselines: record even when the runs are noisier than max_baseline_cv",
        False,
        switch,
        ini=False,
        is_flag=True,
    ),
    Option(
        "baselines",
        "--specdecode-baselines",
        "Directory of the stored baselines",
        "baselines",
        text_value,
        "DIR",
    ),
    Option(
        "keep_server",
        "--specdecode-keep-server",
        "Leave the last server running after the session so the next one skips the load",
        False,
        switch,
        is_flag=True,
    ),
    Option(
        "skip_preflight",
        "--specdecode-skip-preflight",
        "Launch SGLang without first checking the command with its own argument parser "
        "(the check runs in the server's interpreter before the load and took 20-29 s per "
        "launch on SGLang 0.5.15, most of it the import of SGLang's server arguments)",
        False,
        switch,
        is_flag=True,
    ),
    Option(
        "allow_mismatch",
        "--specdecode-allow-mismatch",
        "With --server-host: warn instead of failing when the server's arguments differ "
        "from the profile's",
        False,
        switch,
        is_flag=True,
    ),
    Option(
        "runs",
        "--specdecode-runs",
        "Measured runs per test before the first verdict",
        5,
        run_count,
        "N",
    ),
    Option(
        "max_runs",
        "--specdecode-max-runs",
        "Most runs per test when the verdict stays inconclusive",
        10,
        run_count,
        "N",
    ),
    Option(
        "baseline_runs",
        "--specdecode-baseline-runs",
        "Runs recorded per test and server launch with --update-baselines (more runs = a "
        "sharper baseline)",
        60,
        run_count,
        "N",
    ),
    Option(
        "baseline_launches",
        "--specdecode-baseline-launches",
        "Server launches a baseline is recorded over with --update-baselines, so that the "
        "verdicts can carry launch-to-launch variance (default: 3 on real servers, 1 on the "
        "simulated one, which does not vary by launch unless --sim-launch-cv says so)",
        None,
        launch_count,
        "K",
    ),
    Option(
        "alpha",
        "--specdecode-alpha",
        "One-sided error rate of each verdict at the margin (false FAIL and false PASS of a "
        "build exactly at the margin; docs/statistics.md)",
        0.15,
        probability,
        "ALPHA",
    ),
    Option(
        "alpha_no_change",
        "--specdecode-alpha-no-change",
        "For a negative margin, a FAIL must also be worse than the baseline itself at this "
        "level, and for a claim against another profile's baseline that held when recorded, "
        "worse than the test's own baseline: an unchanged build FAILs about this often at most; "
        "a tenth of it once 10 nights of history exist, 3 hundredths once the history also "
        "carries the noise of an earlier regime (docs/statistics.md)",
        0.01,
        probability,
        "ALPHA",
    ),
    Option(
        "reference_nights",
        "--specdecode-reference-nights",
        "The most nights before a candidate change that the cross-night detector takes its "
        "level from (it watches from the first night after a baseline or an acknowledge; the "
        "level is the baseline's launches and every night since, at most this many; "
        "docs/statistics.md)",
        90,
        reference_nights,
        "N",
    ),
    Option(
        "method",
        "--specdecode-method",
        f"Confidence interval of current/baseline: {', '.join(METHODS)}",
        "welch-log",
        choice(*METHODS),
        "METHOD",
    ),
    Option(
        "on_inconclusive",
        "--specdecode-on-inconclusive",
        "What an inconclusive verdict after max_runs does: fail, warn (pass with a warning) "
        "or xfail",
        "xfail",
        choice(*INCONCLUSIVE_POLICIES),
        "POLICY",
    ),
    Option(
        "on_missing_baseline",
        "--specdecode-on-missing-baseline",
        "What a test with thresholds but no stored baseline does: skip or fail",
        "skip",
        choice(*MISSING_BASELINE_POLICIES),
        "POLICY",
    ),
    Option(
        "max_baseline_cv",
        "--specdecode-max-baseline-cv",
        "Refuse to record a baseline whose tok/s CV is above this (e.g. 0.08 = 8%)",
        0.08,
        positive_float,
        "CV",
    ),
    Option(
        "hardware_key",
        "--specdecode-hardware-key",
        "Name of this hardware in baselines/ (default: detected GPUs, or 'simulated')",
        None,
        text_value,
        "KEY",
    ),
    Option(
        "state_dir",
        "--specdecode-state-dir",
        "Where running servers are recorded for reuse, machine-wide (default: "
        "$XDG_CACHE_HOME/pytest-specdecode, else ~/.cache/pytest-specdecode)",
        None,
        text_value,
        "DIR",
    ),
    Option(
        "report",
        "--specdecode-report",
        "Write a JSON report of every measured test (samples, verdicts, fingerprints, "
        "provenance) to PATH",
        None,
        text_value,
        "PATH",
    ),
    Option(
        "history",
        "--specdecode-history",
        "Append this session's summary to a JSON-lines history file (read by "
        "'python -m pytest_specdecode report PATH')",
        None,
        text_value,
        "PATH",
    ),
    Option(
        "markdown",
        "--specdecode-markdown",
        "Write the Markdown summary to PATH (it is also appended to $GITHUB_STEP_SUMMARY "
        "when that is set)",
        None,
        text_value,
        "PATH",
    ),
    Option(
        "html",
        "--specdecode-html",
        "Write the dashboard, a static site of the nightly history (--specdecode-history, with "
        "this session appended; this session alone without one), to DIR: a new or empty "
        "folder, or an earlier dashboard's. Open DIR/index.html",
        None,
        text_value,
        "DIR",
    ),
    Option(
        "exit_status",
        "--specdecode-exit-status",
        "pytest: pytest's own exit statuses. nightly: one per kind of night, for whoever is "
        "on call: 10 the build regressed (a FAIL, a cross-night alarm), 11 the box or the "
        "setup is broken (a server that did not start, crashed or hung, a missing baseline, an "
        "output not written), 12 nothing could be judged (all INCONCLUSIVE), 0 otherwise "
        "(docs/nightly-ci.md)",
        "pytest",
        choice(*EXIT_STATUS_MODES),
        "pytest|nightly",
    ),
    Option(
        "request_timeout",
        "--specdecode-request-timeout",
        "Seconds one measurement request may take",
        600.0,
        positive_float,
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
        seconds_or_auto,
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
        machine_load,
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
