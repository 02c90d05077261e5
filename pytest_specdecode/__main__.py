"""``python -m pytest_specdecode report HISTORY``: the trend of the nightly history.

Prints the trend table (one row per test: sessions, recent outcomes, latest tok/s and accept
length, status) and the flags raised by the persistence rule, with ``--png`` draws the trend
picture and with ``--html DIR`` writes the static dashboard of the history. Exit status:

* 0: the report was printed and no regression persists at the end of the history;
* 1: at least one test has an ongoing persistent regression (``--persist`` sessions in a row);
* 2: bad usage or bad input (unknown option, missing or malformed history file, matplotlib
  missing for ``--png``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from pytest_specdecode import __version__
from pytest_specdecode.errors import SpecdecodeError
from pytest_specdecode.outputs.history import HistoryError, read_history
from pytest_specdecode.outputs.trend import format_table, select, trend

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Tools around pytest-specdecode's outputs.",
        epilog="exit status: 0 ok, 1 a persistent regression is flagged, 2 usage or input error",
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
        default=90,
        metavar="N",
        help=(
            "nights after a baseline recording the cross-night detector takes as its reference "
            "(default 90, as --specdecode-reference-nights)"
        ),
    )
    report.add_argument(
        "--skip-bad-lines",
        action="store_true",
        help="report malformed history lines on stderr and go on instead of stopping",
    )
    return parser


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
    try:
        return run_report(args, out, err)
    except (SpecdecodeError, ValueError) as exc:  # bad history, no matplotlib, bad picture
        print(f"{PROG} report: error: {exc}", file=err)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
