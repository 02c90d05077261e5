"""Writing the dashboard: an overview page and one page per series, into one folder.

The pages are plain HTML with their data inlined as JSON; ``assets/dashboard.js`` (drawing the
SVG charts and sparklines, the filters, the run-level samples on demand) and
``assets/dashboard.css`` ship inside the package and are copied beside them. Nothing is fetched
at view time, so the folder opens from ``file://``, as a CI artifact or a Pages site.

A folder that holds anything but an earlier dashboard is refused: the user's files are never
overwritten. An earlier dashboard (it carries :data:`MARK`) is replaced.
"""

from __future__ import annotations

import html
import json
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_specdecode.errors import SpecdecodeError
from pytest_specdecode.outputs.dashboard.model import build_model
from pytest_specdecode.outputs.terminal import SIMULATED_BANNER

ASSETS = Path(__file__).parent / "assets"
MARK = ".specdecode-dashboard"
"""The file that marks a folder as a dashboard this module wrote (and may replace)."""

VERDICT_CLASS = {"pass": "ok", "fail": "bad", "error": "bad", "inconclusive": "warn"}


class DashboardError(SpecdecodeError):
    """The dashboard cannot be written where it was asked to be."""


@dataclass(frozen=True)
class Written:
    """What :func:`write_site` wrote: the overview page, the page count and the folder's size."""

    index: Path
    pages: int
    size_bytes: int

    def describe(self) -> str:
        return f"{self.index} ({self.pages} test pages, {self.size_bytes / 1e6:.2f} MB)"


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _json_script(data: Any) -> str:
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    # inside <script> only "</" can end the element early
    return text.replace("</", "<\\/")


def _page(title: str, body: str, *, depth: int, data: Any = None) -> str:
    up = "../" * depth
    script = (
        f'<script type="application/json" id="specdecode-data">{_json_script(data)}</script>\n'
        if data is not None
        else ""
    )
    return (
        "<!doctype html>\n<html lang=en><head><meta charset=utf-8>"
        '<meta name=viewport content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title>"
        f'<link rel=stylesheet href="{up}assets/dashboard.css"></head>\n'
        f"<body>\n{body}\n{script}"
        f'<script src="{up}assets/dashboard.js"></script>\n</body></html>\n'
    )


def _day(when: Any) -> str:
    return str(when or "")[:16].replace("T", " ")


def _detector_settings(reference_nights: int | None) -> str:
    if reference_nights is None:
        return "cross-night detector: each series judged with the settings its sessions recorded"
    return f"cross-night detector: level window {reference_nights} nights (given, not recorded)"


def _banner(simulated: bool) -> str:
    return f'<p class="simulated-banner">{_e(SIMULATED_BANNER)}</p>' if simulated else ""


# --------------------------------------------------------------------------- overview


def _select(name: str, label: str, values: Sequence[str]) -> str:
    options = "".join(f"<option>{_e(v)}</option>" for v in sorted(set(values)))
    return (
        f'<label>{_e(label)} <select data-filter="{name}">'
        f'<option value="">all</option>{options}</select></label>'
    )


def _overview_row(s: Mapping[str, Any]) -> str:
    tok = s["metrics"].get("tok_s") or {}
    spark = {"x": s["nights"]["x"], "y": tok.get("mean") or []}
    badges = ""
    if s["simulated"]:
        badges += ' <span class="badge sim">simulated</span>'
    if s.get("new_hardware"):
        badges += ' <span class="badge new">new hardware key</span>'
    if s.get("renamed_from") or s.get("renamed_to"):
        badges += ' <span class="badge new">renamed</span>'
    detector = "<br>".join(
        f'<span class="det {_e(d["status"]).replace(" ", "-")}">{_e(d["cell"])}</span>'
        for d in s["detector"]
    )
    outcome = str(s["last_outcome"] or "")
    return (
        f'<tr class="series{" alarm" if s["alarm"] else ""}" data-profile="{_e(s["profile"])}" '
        f'data-algorithm="{_e(s["algorithm"])}" data-hardware="{_e(s["hardware_key"])}">'
        f'<td><a href="tests/{_e(s["id"])}.html">{_e(s["test_id"])}</a>{badges}</td>'
        f"<td>{_e(s['profile'])}</td><td>{_e(s['algorithm'])}</td>"
        f"<td>{_e(s['hardware_key'])}</td><td>{_e(_day(s['last_night']))}</td>"
        f'<td><span class="verdict {VERDICT_CLASS.get(outcome, "")}">{_e(outcome)}</span></td>'
        f"<td>{detector or '-'}</td>"
        f"<td><svg class=spark width=160 height=28 data-spark='{_e(_json_script(spark))}'>"
        f"</svg></td><td>{_e(s['status'])}</td></tr>"
    )


def overview_html(model: Mapping[str, Any]) -> str:
    series = model["series"]
    sessions = model["sessions"]
    span = f"{_day(sessions[0]['when'])} to {_day(sessions[-1]['when'])}" if sessions else "-"
    rows = "\n".join(_overview_row(s) for s in series)
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "test", "profile", "algorithm", "hardware", "last night", "verdict",
            "across nights (scan/h)", "tok/s over the nights", "status",
        )
    )  # fmt: skip
    body = (
        "<header><h1>pytest-specdecode: nightly history</h1>"
        f"<p>{len(sessions)} sessions, {span}; {len(series)} series (test x profile x hardware); "
        f"{_detector_settings(model['reference_nights'])}</p>"
        f"{_banner(model['simulated'])}</header>\n"
        '<nav class="filters">'
        + _select("profile", "profile", [s["profile"] for s in series])
        + _select("algorithm", "algorithm", [s["algorithm"] for s in series])
        + _select("hardware", "hardware", [s["hardware_key"] for s in series])
        + ' <span id="shown">showing all</span></nav>\n'
        f'<table id="overview"><thead><tr>{head}</tr></thead><tbody>\n{rows}\n</tbody></table>'
    )
    return _page("pytest-specdecode nightly history", body, depth=0)


# --------------------------------------------------------------------------- a series


def _markers_html(markers: Sequence[Mapping[str, Any]], when: Mapping[int, str]) -> str:
    changes = [m for m in markers if m["kind"] == "change"]
    others = [m for m in markers if m["kind"] != "change"]
    out = ["<section><h2>Changes the detector found</h2>"]
    if not changes:
        out.append("<p>none</p>")
    for m in changes:
        items = "".join(f"<li>{_e(line)}</li>" for line in m["changed"])
        out.append(
            f'<div class="change" data-x="{m["x"]}"><p><b>night {m["x"] + 1} '
            f"({_e(_day(when.get(m['x'])))})</b>: {_e(m['label'])}</p>"
            f"<p>what changed that night:</p><ul>{items}</ul></div>"
        )
    out.append("</section>")
    if others:
        out.append("<section><h2>Not changes</h2><ul>")
        out += [
            f'<li class="marker {_e(m["kind"])}">night {m["x"] + 1}'
            + (f"-{m['x2'] + 1}" if "x2" in m else "")
            + f": {_e(m['label'])}</li>"
            for m in others
        ]
        out.append("</ul></section>")
    return "".join(out)


def _mean_cell(series: Mapping[str, Any], metric: str, i: int) -> str:
    column = series["metrics"].get(metric)
    if column is None or column["mean"][i] is None:
        return "-"
    lo, hi = column["lo"][i], column["hi"][i]
    interval = f" [{lo:g}, {hi:g}]" if lo is not None and hi is not None else ""
    return f"{column['mean'][i]:g}{interval}"


def _nights_table(series: Mapping[str, Any]) -> str:
    nights = series["nights"]
    rows = []
    for i in reversed(range(len(nights["x"]))):
        runs = sum(len(series["samples"][m][i]) > 0 for m in series["samples"])
        details = (
            f'<details data-i="{i}"><summary>run-level samples</summary></details>' if runs else "-"
        )
        outcome = str(nights["outcome"][i] or "")
        sim = ' <span class="badge sim">simulated</span>' if nights["simulated"][i] else ""
        rows.append(
            f"<tr><td>{nights['x'][i] + 1}</td><td>{_e(_day(nights['when'][i]))}{sim}</td>"
            f'<td><span class="verdict {VERDICT_CLASS.get(outcome, "")}">{_e(outcome)}</span>'
            f"</td><td>{_e(_mean_cell(series, 'tok_s', i))}</td>"
            f"<td>{_e(_mean_cell(series, 'accept_length', i))}</td>"
            f"<td>{_e(nights['session'][i])}</td><td>{details}</td></tr>"
        )
    return (
        "<section><h2>Nights</h2><table class=nights><thead><tr><th>night</th><th>when</th>"
        "<th>verdict</th><th>tok/s [95% CI]</th><th>accept length [95% CI]</th>"
        "<th>session</th><th>runs</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table></section>"
    )


def series_html(series: Mapping[str, Any], simulated: bool) -> str:
    when = dict(zip(series["nights"]["x"], series["nights"]["when"], strict=False))
    notes = "".join(f'<p class="note">{_e(n)}</p>' for n in series["notes"])
    detector = "".join(
        f'<li class="det {_e(d["status"]).replace(" ", "-")}">{_e(d["metric"])}: '
        f"{_e(d['text'])}"
        + (f"<br>from tonight: {_e(d['seen'])}" if d.get("seen") else "")
        + "</li>"
        for d in series["detector"]
    )
    charts = "".join(
        f'<figure class="chart" data-metric="{_e(m)}"><figcaption>{_e(c["label"])} '
        f"({_e(c['unit'])}){' (simulated)' if simulated else ''}</figcaption></figure>"
        for m, c in series["metrics"].items()
    )
    body = (
        '<header><p><a href="../index.html">&larr; all tests</a></p>'
        f"<h1>{_e(series['test_id'])}</h1>"
        f"<p>profile <b>{_e(series['profile'])}</b> · algorithm <b>{_e(series['algorithm'])}</b>"
        f" · hardware <b>{_e(series['hardware_key'])}</b> · latest: "
        f"<b>{_e(series['status'])}</b></p>{_banner(simulated)}{notes}</header>\n"
        f"<section><h2>Across nights</h2><ul>{detector or '<li>no series</li>'}</ul></section>\n"
        + _markers_html(series["markers"], when)
        + "\n<section><h2>Over the nights</h2><p class=legend>each night's launch mean with its "
        "95% interval; shaded: the baseline's mean ± its run-to-run SD; dashed: the margin line "
        "(where the check fails); red: a change the detector found; grey: a baseline "
        "re-recorded; hatched: nights not run</p>" + charts + "</section>\n" + _nights_table(series)
    )
    return _page(series["test_id"], body, depth=1, data=series)


# --------------------------------------------------------------------------- the folder


def _prepare(directory: Path) -> None:
    if directory.exists() and not directory.is_dir():
        raise DashboardError(
            f"cannot write the dashboard to {directory}: it is a file; name a folder"
        )
    if directory.is_dir() and any(directory.iterdir()):
        if not (directory / MARK).is_file():
            raise DashboardError(
                f"cannot write the dashboard to {directory}: the folder holds other files, and "
                "they are not overwritten; name a new or empty folder (or an earlier dashboard's)"
            )
        for old in ("index.html", "tests", "assets"):  # an earlier dashboard's own files
            path = directory / old
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
    directory.mkdir(parents=True, exist_ok=True)


def write_site(
    records: Sequence[Mapping[str, Any]], directory: Path, *, reference_nights: int | None = None
) -> Written:
    """Write the dashboard of ``records`` into ``directory`` (see the module docstring)."""
    directory = Path(directory)
    model = build_model(records, reference_nights=reference_nights)
    try:
        _prepare(directory)
        (directory / MARK).write_text(
            "written by pytest-specdecode's dashboard; the folder is replaced when it is "
            "written again\n",
            encoding="utf-8",
        )
        shutil.copytree(ASSETS, directory / "assets", ignore=shutil.ignore_patterns("*.py*"))
        (directory / "tests").mkdir()
        for series in model["series"]:
            page = series_html(series, series["simulated"])
            (directory / "tests" / f"{series['id']}.html").write_text(page, encoding="utf-8")
        index = directory / "index.html"
        index.write_text(overview_html(model), encoding="utf-8")
    except OSError as exc:
        raise DashboardError(f"cannot write the dashboard to {directory}: {exc}") from exc
    size = sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
    return Written(index, len(model["series"]), size)
