"""The session's Markdown summary, for ``$GITHUB_STEP_SUMMARY`` or a file.

GitHub-flavoured Markdown: a heading that says which kind of night it was (the build
regressed, the box or setup broke, nothing could be judged, or ok: see
:mod:`pytest_specdecode.session.exit_status`) and why, a SIMULATED warning when any figure is
simulated, the outcome counts, the results table with the same columns and wording as the
terminal table (:func:`pytest_specdecode.outputs.terminal.results_table`), then the failures
found after their tests had finished (which fail the session), the cause of every test that
errored or crashed, the verdict paragraphs of every test that failed, was inconclusive, had no
baseline or a mismatched one, what the cross-night detector sees of each series (its state,
the nights since the last acknowledged change, the drops it would flag from tonight), and the
warnings of any test.

Free text (verdict paragraphs, warnings, table cells) is escaped so that ``*``, ``<`` or a
``|`` in a parametrised test id render literally. GitHub refuses step summaries over 1 MiB, so
the details are cut, with a note saying so, when the text would exceed ``max_bytes``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from tabulate import tabulate

from pytest_specdecode.files import atomic_write_text
from pytest_specdecode.outputs.terminal import SIMULATED_BANNER, TABLE_HEADERS, short_id, table_rows
from pytest_specdecode.result import Outcome, SpecdecodeResult

DETAILED = (Outcome.FAIL, Outcome.INCONCLUSIVE, Outcome.NO_BASELINE, Outcome.MISMATCH)
"""Outcomes whose verdict paragraphs the summary spells out."""

MAX_SUMMARY_BYTES = 1_000_000  # GitHub's limit per step summary is 1 MiB

# Characters GFM could read as markup; "_" only where it may open or close emphasis (GFM never
# treats an underscore between two letters or digits as emphasis, so test_ids stay readable).
_SPECIAL = re.compile(r"[\\`*<>|~]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")


def escape(text: str) -> str:
    """``text`` with the characters Markdown would interpret backslash-escaped."""
    return _SPECIAL.sub(lambda m: "\\" + m.group(0), text)


def code(text: str) -> str:
    """``text`` as an inline code span, whatever backticks it contains."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


# --------------------------------------------------------------------------- table cells


def markdown_table(results: Sequence[SpecdecodeResult]) -> str:
    rows = [[escape(cell) for cell in row] for row in table_rows(results)]
    return tabulate(rows, headers=list(TABLE_HEADERS), tablefmt="github", disable_numparse=True)


# --------------------------------------------------------------------------- summary


def _counts(results: Sequence[SpecdecodeResult]) -> str:
    parts = []
    for outcome in Outcome:
        n = sum(1 for r in results if r.outcome is outcome)
        if n:
            parts.append(f"{n} {outcome.value}")
    noun = "test" if len(results) == 1 else "tests"
    return f"**{len(results)} {noun}**: " + ", ".join(parts)


def _detail(result: SpecdecodeResult) -> list[str]:
    lines = [
        f"#### {code(short_id(result.test_id))} ({escape(result.profile)}): "
        f"{result.outcome.value.upper()}",
        "",
        f"Test id: {code(result.test_id)}; hardware {code(result.hardware_key)}; "
        f"{result.runs} runs.",
        "",
    ]
    for paragraph in result.message.split("\n\n"):
        text = " ".join(line.strip() for line in paragraph.splitlines() if line.strip())
        if text:
            lines += [f"- {escape(text)}", ""]
    if result.error is not None and result.outcome is not Outcome.ERROR:
        lines += [f"- Then errored: {escape(result.error.describe())}", ""]
    return lines


def _warnings(result: SpecdecodeResult) -> list[str]:
    head = f"{code(short_id(result.test_id))} ({escape(result.profile)})"
    return [f"- {head}: {escape(' '.join(w.split()))}" for w in result.warnings]


def _across_nights(result: SpecdecodeResult) -> list[str]:
    """One line per series of the cross-night detector: its state, the nights since the last
    acknowledged change and what it would flag from tonight (docs/statistics.md)."""
    lines = []
    head = f"{code(short_id(result.test_id))} ({escape(result.profile)})"
    for metric, state in result.crossnight.items():
        if not isinstance(state, dict):
            continue
        status = str(state.get("status"))
        if state.get("direction"):
            shift = state.get("shift")
            status += f", {state['direction']}" + (
                f" of {shift:+.1%}" if isinstance(shift, int | float) else ""
            )
        since = state.get("opened_by") or "the start of the history"
        text = f"{status}; night {state.get('nights')} since {since}"
        seen = state.get("horizon") or {}
        within = seen.get("within") if isinstance(seen, dict) else None
        if isinstance(within, dict) and within:
            drops = ", ".join(
                f"{drop:.1%} within {nights} nights" if isinstance(drop, float) else
                f"none within {nights}"
                for nights, drop in within.items()
            )  # fmt: skip
            text += f"; flags with {seen.get('power', 0.9):.0%}: {drops}"
        lines.append(f"- {head}, {code(metric)}: {escape(text)}")
    return lines


def markdown_summary(
    results: Sequence[SpecdecodeResult],
    *,
    title: str = "pytest-specdecode",
    max_bytes: int = MAX_SUMMARY_BYTES,
    night: tuple[str, str] | None = None,
) -> str:
    """The summary as GitHub-flavoured Markdown, ending with a newline. ``night``: the kind of
    night (``REGRESSED: the build regressed (exit status 10)``) and why, for whoever is on
    call: the kind goes into the first line, the heading, and why under it."""
    heading = f"{title}: {night[0]}" if night is not None else title
    head = [f"## {escape(heading)}", ""]
    if night is not None and night[1]:
        head += [escape(night[1]), ""]
    if not results:
        return "\n".join([*head, "No specdecode test was measured in this session.", ""])
    if any(r.simulated for r in results):
        head += ["> [!WARNING]", f"> {escape(SIMULATED_BANNER)}.", ""]
    head += [_counts(results), ""]
    late_count = sum(1 for r in results if r.late_failure)
    if late_count:
        head += [
            f"**The session fails**: {late_count} failure(s) found after the test had "
            "finished (below).",
            "",
        ]
    head += [markdown_table(results), ""]

    sections: list[list[str]] = []
    late = [r for r in results if r.late_failure]
    if late:
        # First of all: these fail the session although pytest passed their tests.
        sections.append(
            [
                "### Failed after the test had finished",
                "",
                "These fail the session (exit status 1), though pytest had passed the test "
                "before its later baseline launch or baseline write:",
                "",
                *(
                    f"- {code(short_id(r.test_id))} ({escape(r.profile)}): "
                    f"{escape(' '.join((r.late_failure or '').split()))}"
                    for r in late
                ),
                "",
            ]
        )
    # Then errors, since a crashed server means the night measured less than it should have.
    errored = [r for r in results if r.error is not None]
    if errored:
        sections.append(["### Errored or crashed", ""])
        sections.extend(_detail(r) for r in errored)
    notable = [r for r in results if r.outcome in DETAILED and r.error is None]
    if notable:
        sections.append(["### Failed, inconclusive or not compared", ""])
        sections.extend(_detail(r) for r in notable)
    watched = [line for r in results for line in _across_nights(r)]
    if watched:
        sections.append(["### Across nights", "", *watched, ""])
    warned = [line for r in results for line in _warnings(r)]
    if warned:
        sections.append(["### Warnings", "", *warned, ""])

    text = "\n".join(head)
    limit = max_bytes - 200  # room for the truncation note
    for index, section in enumerate(sections):
        chunk = "\n".join(section)
        if len((text + "\n" + chunk).encode()) > limit:
            left = len(sections) - index
            text += (
                f"\n_Summary cut at {max_bytes} bytes (GitHub's step-summary limit): {left} "
                "more section(s) are in the terminal output and the JSON report._\n"
            )
            break
        text += "\n" + chunk
    return text.rstrip("\n") + "\n"


def write_markdown(path: Path, text: str, *, append: bool) -> None:
    """Append ``text`` (``$GITHUB_STEP_SUMMARY``, which other steps also write) or replace
    the file with it (a path the user asked for). Parent directories are created."""
    path = Path(path)
    if not text.endswith("\n"):
        text += "\n"
    if not append:
        atomic_write_text(path, text)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+", encoding="utf-8", newline="\n") as handle:
        handle.seek(0, 2)
        if handle.tell() > 0:
            text = "\n" + text  # a blank line keeps our heading out of the previous paragraph
        handle.write(text)
