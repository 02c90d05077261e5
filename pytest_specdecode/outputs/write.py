"""The session's machine-readable outputs, written once at the end by the process that owns
the results (the xdist controller, or the only process): the JSON report, the history line, the
Markdown summary for people and CI pages, and the dashboard.

One failing output never stops the others: each error is returned as a line for the terminal
summary, and the caller makes the session fail. The dashboard reads the history back past a bad
line (named once in the session's warnings, :class:`~pytest_specdecode.outputs.history.BadLines`),
so one torn line costs no later night its dashboard.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_specdecode.errors import SpecdecodeError
from pytest_specdecode.outputs.history import (
    BadLines,
    append_history,
    history_record,
    read_history,
)
from pytest_specdecode.outputs.json_report import build_report, write_report
from pytest_specdecode.outputs.markdown import markdown_summary, write_markdown
from pytest_specdecode.result import SpecdecodeResult
from pytest_specdecode.settings import Settings


def write_outputs(
    results: Sequence[SpecdecodeResult],
    *,
    settings: Settings,
    session_info: Mapping[str, Any],
    env: Mapping[str, str],
    night: Callable[[Sequence[str]], tuple[str, str]] | None = None,
    warnings: list[str] | None = None,
) -> tuple[list[str], list[str]]:
    """Write what the settings ask for; return (lines saying what was written, error lines).

    ``night``: the kind of night and why, given the errors so far, for the Markdown summary's
    first lines; ``warnings``: the session's, where a history line mended by the append or
    skipped by the dashboard's reader is named (each once)."""
    written: list[str] = []
    errors: list[str] = []
    warned = warnings if warnings is not None else []

    def attempt(what: str, path: Path, action: Any) -> None:
        try:
            note = action()
        except (OSError, SpecdecodeError, ValueError) as exc:
            errors.append(f"could not write the {what} to {path}: {exc}")
        else:
            written.append(f"{what}: {path}")
            if isinstance(note, str):
                warned.append(note)

    if settings.report is not None:
        report_path = settings.report
        attempt(
            "JSON report",
            report_path,
            lambda: write_report(report_path, build_report(results, session_info=session_info)),
        )
    if not results:
        return written, errors  # a history line or summary of nothing helps nobody
    record = history_record(results, session_info=session_info)
    if settings.history is not None:
        history_path = settings.history
        attempt("history", history_path, lambda: append_history(history_path, record))
    if settings.html is not None:
        html_dir = settings.html
        attempt(
            "dashboard",
            html_dir / "index.html",
            lambda: _dashboard(record, settings, html_dir, BadLines(warned)),
        )
    summary = markdown_summary(results, night=night(errors) if night is not None else None)
    step_summary = env.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        attempt(
            "Markdown summary",
            Path(step_summary),
            lambda: write_markdown(Path(step_summary), summary, append=True),
        )
    if settings.markdown is not None:
        markdown_path = settings.markdown
        attempt(
            "Markdown summary",
            markdown_path,
            lambda: write_markdown(markdown_path, summary, append=False),
        )
    return written, errors


def _dashboard(
    record: Mapping[str, Any], settings: Settings, directory: Path, bad_lines: BadLines
) -> None:
    """The dashboard of the history with tonight appended (past its bad lines), or of tonight
    alone without one."""
    # imported here: a session that writes no dashboard does not load it
    from pytest_specdecode.outputs.dashboard.site import write_site

    path = settings.history
    records = (
        read_history(path, on_bad_line=bad_lines)
        if path is not None and path.is_file()
        else [record]
    )
    write_site(records, directory, reference_nights=settings.reference_nights)
