"""``python -m pytest_specdecode COMMAND``: the tools around the plugin's outputs.

``report HISTORY`` prints the trend table of the nightly history (one row per test: sessions,
recent outcomes, latest tok/s and accept length, status) and the flags raised by the persistence
rule, with ``--png`` draws the trend picture and with ``--html DIR`` writes the static dashboard
of the history. Exit status:

* 0: the report was printed and no regression persists at the end of the history;
* 1: at least one test has an ongoing persistent regression (``--persist`` sessions in a row);
* 2: bad usage or bad input (unknown option, missing or malformed history file, matplotlib
  missing for ``--png``).

``init [DIR]`` writes a performance suite of one's own (a commented profile file for one model,
draft, TP size and NCCL set, and one marked test: :mod:`pytest_specdecode.profiles.scaffold`),
refusing to replace any file, and says how to record its baselines and what that costs: 0 when
written, 2 on bad usage or when a file exists.

``acknowledge HISTORY --test TEST --by WHO --why WHY`` accepts a change as the new normal
without a launch (:mod:`pytest_specdecode.outputs.acknowledge`): the cross-night detector's level
of the test's series restarts from the next night, keeping the night SD; 0 when written, 2 on
bad usage or when the history has no such test.

``compare OLD NEW`` judges NEW's runs against OLD's (JSON reports or baseline files) with a live
run's statistics and table (:mod:`pytest_specdecode.outputs.compare`): 0 when no test fails, 1
when one FAILs, mismatches or errored in NEW, 2 on bad usage or an unreadable file.
"""

from __future__ import annotations

import argparse
import functools
import getpass
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from pytest_specdecode import __version__
from pytest_specdecode.errors import SpecdecodeError
from pytest_specdecode.markers import METRIC_KEYS
from pytest_specdecode.outputs import compare
from pytest_specdecode.outputs.history import HistoryError, read_history
from pytest_specdecode.outputs.trend import format_table, select, trend
from pytest_specdecode.profiles import scaffold
from pytest_specdecode.profiles.loader import load_profiles
from pytest_specdecode.settings import OPTIONS_BY_NAME
from pytest_specdecode.verdict import Threshold

EXIT_OK = 0
EXIT_REGRESSION = 1
EXIT_USAGE = 2

PROG = "python -m pytest_specdecode"


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be 1 or more")
    return value


def _reference_nights(text: str) -> int:
    value = _positive(text)
    if value < 5:
        raise argparse.ArgumentTypeError(f"{text!r}: at least 5 nights")
    return value


def _size(text: str) -> tuple[int, int]:
    width, sep, height = text.lower().partition("x")
    try:
        if not sep:
            raise ValueError
        size = int(width), int(height)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not WIDTHxHEIGHT in pixels, e.g. 1200x800"
        ) from None
    if not all(100 <= v <= 10000 for v in size):
        raise argparse.ArgumentTypeError(f"{text!r}: each side must be 100 to 10000 pixels")
    return size


def _setting(name: str) -> Any:
    """A parser for one value of the plugin's option ``name`` (the same checks)."""
    option = OPTIONS_BY_NAME[name]

    def parse(text: str) -> Any:
        try:
            return option.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{text!r} {exc}") from None

    return parse


def _margin(text: str) -> Threshold:
    metric, sep, value = text.partition("=")
    if not sep or metric not in METRIC_KEYS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not METRIC=FRACTION with METRIC one of {', '.join(METRIC_KEYS)}, "
            "e.g. tok_s=-0.03"
        )
    try:
        margin = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: {value!r} is not a number") from None
    if not (margin > -1 and margin < 10):
        raise argparse.ArgumentTypeError(
            f"{text!r}: a margin is a signed fraction above -1 (-0.03: at most 3% worse)"
        )
    return Threshold(metric, margin)


def _add_compare(commands: Any) -> None:
    epilog = "exit status: 0 no test fails, 1 a test FAILs (or mismatches, or errored), 2 usage"
    parser = commands.add_parser(
        "compare",
        help="judge a saved run against another one, with the statistics of a live run",
        description=(
            "Compare two saved runs: JSON reports (--specdecode-report), baseline files or "
            "directories of baseline files. Tests are matched by test id and profile; NEW's "
            "runs are judged against OLD's with the verdicts, table and statistics of a live "
            "run, at the margins each test's report recorded (tok_s -3% where none is "
            "recorded) or those given with --margin."
        ),
        epilog=epilog,
    )
    parser.add_argument("old", type=Path, metavar="OLD", help="the earlier run (the baseline)")
    parser.add_argument("new", type=Path, metavar="NEW", help="the later run, judged against OLD")
    parser.add_argument(
        "--margin",
        type=_margin,
        action="append",
        default=[],
        metavar="METRIC=FRACTION",
        help="a margin for every test instead of its own, e.g. tok_s=-0.03 (repeatable)",
    )
    for name, flag in (
        ("alpha", "--alpha"),
        ("alpha_no_change", "--alpha-no-change"),
        ("method", "--method"),
    ):
        option = OPTIONS_BY_NAME[name]
        parser.add_argument(
            flag,
            type=_setting(name),
            default=option.default,
            metavar=option.metavar,
            help=f"as {option.flag} (default {option.default})".replace("%", "%%"),
        )
    parser.add_argument(
        "--allow-mismatch",
        action="store_true",
        help="compare tests whose configuration differs between OLD and NEW (each difference "
        "is a warning) instead of reporting a mismatch",
    )


def _add_init(commands: Any) -> None:
    parser = commands.add_parser(
        "init",
        help="write a performance suite of your own: a profile file and one marked test",
        description=(
            "Write DIR/specdecode.toml (one server profile for your model, its EAGLE3 draft or "
            "none, the TP size and an NCCL set, every key commented, with a simulated target "
            "that runs without a GPU) and DIR/test_perf.py (one marked test), plus "
            "DIR/pytest.ini when DIR is not perf_tests/. An existing file is never replaced: "
            "then nothing is written."
        ),
        epilog="exit status: 0 written, 2 usage error or a file exists",
    )
    parser.add_argument(
        "directory",
        type=Path,
        nargs="?",
        default=scaffold.DEFAULT_DIRECTORY,
        metavar="DIR",
        help="where the suite goes (default perf_tests)",
    )
    parser.add_argument("--model", required=True, help="the target model's path or id")
    parser.add_argument("--draft-model", help="the EAGLE3 draft model's path or id")
    parser.add_argument(
        "--algorithm",
        choices=scaffold.ALGORITHMS,
        help="speculative algorithm (default: eagle3 with --draft-model, else none)",
    )
    parser.add_argument("--tp", type=_positive, default=1, metavar="N", help="tensor parallel size")
    parser.add_argument(
        "--steps", type=_positive, default=2, metavar="N", help="EAGLE3 draft steps (default 2)"
    )
    parser.add_argument(
        "--nccl",
        nargs="+",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        help="the server's NCCL variables, e.g. --nccl NCCL_PROTO=LL NCCL_ALGO=Ring",
    )


def _add_acknowledge(commands: Any) -> None:
    ack = commands.add_parser(
        "acknowledge",
        help="accept a change as the new normal: the cross-night detector restarts its level",
        description=(
            "Mark in the history that a change is accepted (an intended slowdown, an upgrade "
            "kept): the cross-night detector's level of the test's series restarts from the "
            "next night and keeps its night-to-night SD; no server is launched and no baseline "
            "changes (the nightly gate still compares with the stored baseline: record a new "
            "one with --update-baselines when the claim itself should move)."
        ),
        epilog="exit status: 0 written, 2 usage or input error (no such test in the history)",
    )
    ack.add_argument("history", type=Path, metavar="HISTORY", help="the JSON-lines history")
    ack.add_argument("--test", required=True, metavar="TEST_ID",
                     help="the test id as the history names it, or '*' for every test")  # fmt: skip
    ack.add_argument("--hardware-key", metavar="KEY", help="only this hardware key's series")
    ack.add_argument("--metric", metavar="METRIC", help="only this metric's series (tok_s, ...)")
    ack.add_argument("--by", metavar="WHO", help="who accepts the change (default: this user)")
    ack.add_argument("--why", required=True, metavar="TEXT", help="what is accepted, and why")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Tools around pytest-specdecode's outputs.",
        epilog="exit status: 0 ok, 1 a regression (report) or a FAIL (compare), 2 usage or input "
        "error",
    )
    parser.add_argument("--version", action="version", version=f"pytest-specdecode {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    report = commands.add_parser(
        "report",
        help="print the trend table of a history file and optionally draw the trend picture",
        description=(
            "Print the trend of a history file written with --specdecode-history: per test its "
            "sessions, latest figures, the cross-night detector's statistic against its "
            "threshold (and on an alarm the size of the drop and when it started) and status. A "
            "FAIL is flagged only when it persists for --persist consecutive sessions."
        ),
        epilog="exit status: 0 ok, 1 a persistent regression is flagged, 2 usage or input error",
    )
    report.add_argument("history", type=Path, metavar="HISTORY", help="the JSON-lines history")
    report.add_argument("--png", type=Path, metavar="PATH", help="also draw the trend picture")
    report.add_argument(
        "--html",
        type=Path,
        metavar="DIR",
        help=(
            "also write the dashboard: a static site of the history in DIR (a new or empty "
            "folder, or an earlier dashboard's), opened from disk: DIR/index.html"
        ),
    )
    report.add_argument(
        "--size",
        type=_size,
        default=(1200, 800),
        metavar="WxH",
        help="picture size in pixels (default 1200x800)",
    )
    report.add_argument(
        "--profile",
        action="append",
        default=[],
        metavar="NAME",
        help="only tests of this server profile (repeatable)",
    )
    report.add_argument(
        "--last", type=_positive, metavar="N", help="only the last N sessions (by time)"
    )
    report.add_argument(
        "--persist",
        type=_positive,
        default=2,
        metavar="K",
        help="consecutive sessions a change must last to be flagged (default 2)",
    )
    report.add_argument(
        "--reference-nights",
        type=_reference_nights,
        default=None,
        metavar="N",
        help=(
            "the most nights before a candidate change that the cross-night detector takes its "
            "level from (default: what the history's sessions recorded, as "
            "--specdecode-reference-nights; 90 where they recorded nothing)"
        ),
    )
    report.add_argument(
        "--skip-bad-lines",
        action="store_true",
        help="report malformed history lines on stderr and go on instead of stopping",
    )
    _add_init(commands)
    _add_compare(commands)
    _add_acknowledge(commands)
    return parser


def run_init(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    algorithm = args.algorithm or ("eagle3" if args.draft_model else "none")
    spec = scaffold.SuiteSpec(
        model=args.model,
        draft_model=args.draft_model,
        algorithm=algorithm,
        tp=args.tp,
        steps=args.steps,
        nccl=scaffold.parse_env_pairs(args.nccl),
    )
    directory: Path = args.directory
    own_ini = scaffold.ini_needed(directory, Path.cwd())
    written = scaffold.write_suite(directory, spec, default_place=not own_ini)
    profiles = load_profiles(directory / scaffold.PROFILE_FILE)  # what pytest will read
    for path in written:
        print(f"wrote {path}", file=out)
    suite = str(directory)
    # Deferred: the session's modules load the server pool and the client, which `report` and
    # `compare` never need (tests/unit/test_architecture.py).
    from pytest_specdecode.session.baseline_launches import baseline_cost

    cost = baseline_cost(list(profiles.profiles.values()), None)
    baselines = directory / "baselines" if own_ini else Path("baselines")
    wrap = functools.partial(textwrap.fill, width=96, break_on_hyphens=False)
    print(
        f"""
The test measures the profile {spec.profile}. Try the suite now without a GPU, on the simulated
server (its figures are labelled simulated):
    pytest {suite} --specdecode-target sim --update-baselines
    pytest {suite} --specdecode-target sim
On the GPU box, record the baselines, commit {baselines}/, then run the check (nightly):
    pytest {suite} --update-baselines
    pytest {suite} --specdecode-on-missing-baseline fail
"""
        + wrap(
            f"Recording costs {cost}. The load time is a bound, the profile's startup_timeout; "
            "a real load can be far shorter (the seed's TP8 Kimi-K2.5 took ~900 s). Launches "
            "per baseline: --specdecode-baseline-launches; runs per launch: "
            "--specdecode-baseline-runs (default 60)."
        ),
        file=out,
    )
    if own_ini:
        print(
            wrap(
                f"{directory / scaffold.INI_FILE} points pytest at the profile file when it "
                f"runs {suite}; to run it under your own pytest configuration instead, set "
                f"specdecode_config = {directory / scaffold.PROFILE_FILE} there."
            ),
            file=out,
        )
    return EXIT_OK


def run_compare(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    old, new = compare.read_side(args.old), compare.read_side(args.new)
    compared = compare.compare_sides(
        old,
        new,
        alpha=args.alpha,
        method=args.method,
        alpha_no_change=args.alpha_no_change,
        margins=args.margin,
        allow_mismatch=args.allow_mismatch,
    )
    for line in compare.lines(compared, old=args.old, new=args.new, margins=args.margin):
        print(line, file=out)
    return EXIT_REGRESSION if compared.failed else EXIT_OK


def run_report(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    def bad_line(exc: HistoryError) -> None:
        print(f"{PROG} report: skipping {exc}", file=err)

    records = read_history(args.history, on_bad_line=bad_line if args.skip_bad_lines else None)
    known = {t["profile"] for r in records for t in r["tests"]}
    unknown = [p for p in args.profile if p not in known]
    if unknown:
        raise HistoryError(
            f"--profile {', '.join(unknown)}: no such profile in {args.history}; it has "
            f"{', '.join(sorted(known)) or 'no tests'}"
        )
    chosen = select(records, profiles=args.profile, last=args.last)
    table = trend(chosen, persist=args.persist, reference_nights=args.reference_nights)
    for line in format_table(table):
        print(line, file=out)
    if args.png is not None:
        from pytest_specdecode.outputs.trend_plot import plot_trend

        if table.rows:
            path = plot_trend(
                chosen,
                args.png,
                size=args.size,
                persist=args.persist,
                reference_nights=args.reference_nights,
            )
            print(f"trend picture: {path} ({args.size[0]}x{args.size[1]} px)", file=out)
        else:
            print(f"trend picture: not drawn, no tests in {args.history}", file=err)
    if args.html is not None:
        from pytest_specdecode.outputs.dashboard.site import write_site

        written = write_site(chosen, args.html, reference_nights=args.reference_nights)
        print(f"dashboard: {written.describe()}", file=out)
    return EXIT_REGRESSION if table.regressed else EXIT_OK


def _user() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError, ImportError):  # no login name in a bare container
        raise SpecdecodeError(
            "--by: this user has no login name here; say who accepts it"
        ) from None


def run_acknowledge(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from pytest_specdecode.outputs.acknowledge import Acknowledgement, acknowledge

    def bad_line(exc: HistoryError) -> None:
        print(f"{PROG} acknowledge: skipping {exc}", file=err)

    records = read_history(args.history, on_bad_line=bad_line)
    ack = Acknowledgement(args.test, args.by or _user(), args.why, args.hardware_key, args.metric)
    restarted = acknowledge(args.history, ack, records)
    print(f"acknowledged in {args.history} by {ack.by}: {ack.why}", file=out)
    print("the cross-night level restarts from the next night (the night SD carries over) for:",
          file=out)  # fmt: skip
    for line in restarted:
        print(f"  {line}", file=out)
    print(
        "the nightly gate still compares with the stored baselines; record new ones "
        "(--update-baselines) when a claim itself should move",
        file=out,
    )
    return EXIT_OK


def main(
    argv: Sequence[str] | None = None, *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Run the command line; returns the exit status (see the module docstring)."""
    out = out or sys.stdout
    err = err or sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help/--version exit 0, usage errors exit 2
        return int(exc.code or 0) if isinstance(exc.code, int | None) else EXIT_USAGE
    command = {
        "report": run_report,
        "compare": run_compare,
        "init": run_init,
        "acknowledge": run_acknowledge,
    }[args.command]
    try:
        return command(args, out, err)
    except (SpecdecodeError, ValueError) as exc:  # bad input file, no matplotlib, bad picture
        print(f"{PROG} {args.command}: error: {exc}", file=err)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
