"""The trend picture: tok/s and accept length per profile over the nightly history (PNG).

One panel per metric, one line per test (labelled by its profile), each session's mean with the
95% CI of the mean as an error bar. Behind each line, in its colour: the baseline it was compared
with (dashed), the baseline's run-to-run band (mean ± one standard deviation of the baseline's
runs, shaded, when the history knows it) and the margin's threshold (dotted). A session whose
check of that metric failed carries a red ✕, one whose test failed on another check a red ring;
spans where a regression of that metric persisted (see :mod:`pytest_specdecode.outputs.trend`) are
tinted red. A session in which a test errored or crashed (its server did not start or died, its
body raised) has no value: it carries a letter E in the test's colour at that session's time, in
a shaded strip at the bottom of every panel of a metric the test measures (a test never measured:
every panel). The E's are placed in axes coordinates and the y axis is lowered so that every value
lies above the strip: an E never reads as a value; the E's of several tests stack. The x axis
keeps that session's date even when all its tests errored, the legend explains the E, the title
counts the sessions with errors, and a history in which every test errored is a picture of E's,
each test still named in the legend (a history without any test has none: ValueError).
Simulated figures say so in the title.

:func:`trend_figure` builds the picture as a matplotlib ``Figure`` (for a look at its artists);
:func:`plot_trend` writes it to a PNG.

matplotlib is an optional dependency (``pip install 'pytest-specdecode[plot]'``), imported only
when a picture is drawn; the rest of the package works without it. The picture is drawn with the
Agg canvas directly, never through pyplot, so no global backend is touched.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_specdecode.errors import SpecdecodeError
from pytest_specdecode.metrics import METRICS
from pytest_specdecode.outputs.trend import TrendPoint, TrendRow, TrendTable, trend

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PLOTTED_METRICS = ("tok_s", "accept_length")
DEFAULT_SIZE = (1200, 800)
DPI = 100
INSTALL_HINT = "pip install 'pytest-specdecode[plot]'"
ERRORED_MARKER = "$E$"  # mathtext: the letter E as a marker
ERRORED_GID = "errored"  # the gid of the artists marking errored sessions
ERRORED_KEY = "errored or crashed (no value)"
# heights (axes fraction) of the E marks: the n-th test with errors sits on ERRORED_HEIGHTS[n % 4]
ERRORED_HEIGHTS = (0.04, 0.10, 0.16, 0.22)
ERRORED_STRIP_PAD = 0.04  # the strip of E marks ends this far (axes fraction) above the top one

DateConverter = Callable[[Sequence[datetime]], list[float]]


class PlotDependencyError(SpecdecodeError):
    """matplotlib, needed only for the trend picture, is not installed."""


def plot_trend(
    records: Iterable[Mapping[str, Any]],
    path: Path,
    *,
    size: tuple[int, int] = DEFAULT_SIZE,
    persist: int = 2,
    title: str = "pytest-specdecode trend",
    reference_nights: int | None = None,
) -> Path:
    """Draw the trend of ``records`` (history lines) to the PNG ``path``, ``size`` pixels
    (width, height), atomically; returns ``path``."""
    figure = _figure(records, size, persist, title, f" into {path}", reference_nights)
    _save(figure, Path(path))
    return Path(path)


def trend_figure(
    records: Iterable[Mapping[str, Any]],
    *,
    size: tuple[int, int] = DEFAULT_SIZE,
    persist: int = 2,
    title: str = "pytest-specdecode trend",
    reference_nights: int | None = None,
) -> Figure:
    """The picture :func:`plot_trend` draws, as a matplotlib ``Figure`` on an Agg canvas,
    not saved."""
    return _figure(records, size, persist, title, "", reference_nights)


def _figure(
    records: Iterable[Mapping[str, Any]],
    size: tuple[int, int],
    persist: int,
    title: str,
    target: str,
    reference_nights: int | None = None,
) -> Figure:
    width, height = _check_size(size)
    table = trend(records, persist=persist, reference_nights=reference_nights)
    if not table.rows:
        raise ValueError(f"nothing to plot{target}: the selected history has no tests")
    try:
        import matplotlib.dates as mdates
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise PlotDependencyError(
            f"drawing the trend picture{target} needs matplotlib, which is not installed "
            f"({exc}); install it with: {INSTALL_HINT}"
        ) from exc

    figure = Figure(figsize=(width / DPI, height / DPI), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(PLOTTED_METRICS), 1, sharex=True, squeeze=False)[:, 0]
    colors = [f"C{i % 10}" for i in range(len(table.rows))]
    labels = _labels(table)
    heights = _errored_heights(table)

    def to_num(times: Sequence[datetime]) -> list[float]:
        return [float(v) for v in mdates.date2num(list(times))]  # type: ignore[no-untyped-call]

    for ax, metric in zip(axes, PLOTTED_METRICS, strict=True):
        _draw_panel(ax, table, metric, colors, labels, heights, to_num)
    _date_axis(axes[-1], table, to_num)
    figure.suptitle(_heading(table, title), fontsize=11)
    return figure


def _draw_panel(
    ax: Axes,
    table: TrendTable,
    metric: str,
    colors: Sequence[str],
    labels: Sequence[str],
    heights: Mapping[int, float],
    to_num: DateConverter,
) -> None:
    """The panel of one metric: each test's series and E marks, the strip under the E's, a
    note when no test has a value, and the legend."""
    drawn, marks = 0, []
    for index, (row, color, label) in enumerate(zip(table.rows, colors, labels, strict=True)):
        series = _draw_series(ax, row, metric, color, label, to_num)
        drawn += series
        # the label names the colour once: on the E marks where the test has no series here
        mark_label = "_nolegend_" if series else label
        at = heights.get(index, ERRORED_HEIGHTS[0])
        if _draw_errored(ax, row, metric, color, mark_label, at, to_num):
            marks.append(at)
    info = METRICS[metric]
    ax.set_ylabel(f"{info.label} ({info.unit})")
    ax.grid(True, alpha=0.3)
    if marks:
        _errored_strip(ax, max(marks) + ERRORED_STRIP_PAD, values=bool(drawn))
    if not drawn:
        _no_values(ax, info.label, errored=bool(marks))
    if drawn or marks:
        _legend(ax, values=bool(drawn), errored=bool(marks))


def _no_values(ax: Axes, label: str, *, errored: bool) -> None:
    """Say in the middle of an empty panel that the history has no values of its metric, and
    drop its y scale."""
    note = " (its tests errored or crashed)" if errored else ""
    ax.text(
        0.5,
        0.5,
        f"no {label} in the selected history{note}",
        transform=ax.transAxes,
        ha="center",
        va="center",
        color="0.4",
    )
    ax.tick_params(axis="y", left=False, labelleft=False)  # no values, no scale


def _date_axis(ax: Axes, table: TrendTable, to_num: DateConverter) -> None:
    """The shared x axis (the bottom panel's): session dates, concisely labelled."""
    import matplotlib.dates as mdates

    times = {p.time for row in table.rows for p in row.points}
    if len(times) == 1:  # a day either side, not the two years matplotlib gives one date
        (only,) = to_num(list(times))
        ax.set_xlim(only - 1.0, only + 1.0)
    # matplotlib.dates has no type annotations (the rest of matplotlib has).
    locator = mdates.AutoDateLocator()  # type: ignore[no-untyped-call]
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(
        mdates.ConciseDateFormatter(locator)  # type: ignore[no-untyped-call]
    )


def _heading(table: TrendTable, title: str) -> str:
    """The figure's title: ``title`` (marked when simulated), the persistence rule, and how
    many sessions there are and how many had errors."""
    heading = title + (" (SIMULATED: not hardware figures)" if table.simulated else "")
    errors = (
        f", {table.errored_sessions} with tests that errored or crashed"
        if table.errored_sessions
        else ""
    )
    return (
        f"{heading}\nflags after {table.persist} consecutive sessions; "
        f"{table.sessions} session(s){errors}"
    )


def _check_size(size: tuple[int, int]) -> tuple[int, int]:
    try:
        width, height = size
    except (TypeError, ValueError):
        raise ValueError(f"size={size!r}: give (width, height) in pixels") from None
    for value in (width, height):
        if isinstance(value, bool) or not isinstance(value, int) or not 100 <= value <= 10000:
            raise ValueError(
                f"size={size!r}: width and height must be whole numbers of pixels between "
                "100 and 10000"
            )
    return width, height


def _labels(table: TrendTable) -> list[str]:
    profiles = [row.profile for row in table.rows]
    several_hw = len(table.hardware_keys) > 1
    labels = []
    for row in table.rows:
        label = row.profile
        if profiles.count(row.profile) > 1:
            label += f" · {row.test_id.split('::', 1)[-1]}"
        if several_hw:
            label += f" @ {row.hardware_key}"
        labels.append(label)
    return labels


def _draw_series(
    ax: Axes, row: TrendRow, metric: str, color: str, label: str, to_num: DateConverter
) -> int:
    """Draw ``row``'s series of ``metric`` in layers (its values, the baseline behind them,
    the failure marks, the regression spans, the detected changes); 0 when it has none."""
    points = [p for p in row.points if metric in p.means]
    if not points:
        return 0
    x = to_num([p.time for p in points])
    _draw_values(ax, x, points, metric, color, label)
    _draw_baseline(ax, x, points, metric, color)
    _draw_failures(ax, x, points, metric)
    _draw_regressions(ax, row, metric, to_num)
    _draw_changes(ax, row, metric, to_num)
    return 1


def _draw_values(
    ax: Axes,
    x: Sequence[float],
    points: Sequence[TrendPoint],
    metric: str,
    color: str,
    label: str,
) -> None:
    """Each session's mean, with the 95% CI of the mean as an error bar."""
    means = [p.means[metric] for p in points]
    below, above = [], []
    for p, mean in zip(points, means, strict=True):
        ci = p.cis.get(metric)
        below.append(mean - ci[0] if ci else 0.0)
        above.append(ci[1] - mean if ci else 0.0)
    ax.errorbar(
        x, means, yerr=[below, above], color=color, marker="o", ms=4, capsize=2, label=label
    )


def _draw_baseline(
    ax: Axes, x: Sequence[float], points: Sequence[TrendPoint], metric: str, color: str
) -> None:
    """Behind the values: the baseline each session was compared with (dashed), its
    run-to-run band (shaded, where known) and the margin's threshold (dotted)."""
    base_x, base_mean, band_x, band_low, band_high, line_x, line_y = [], [], [], [], [], [], []
    for x_value, p in zip(x, points, strict=True):
        check = p.check(metric)
        if check is None or check.baseline_mean is None:
            continue
        base_x.append(x_value)
        base_mean.append(check.baseline_mean)
        if check.baseline_std is not None:
            band_x.append(x_value)
            band_low.append(check.baseline_mean - check.baseline_std)
            band_high.append(check.baseline_mean + check.baseline_std)
        if check.threshold is not None:
            line_x.append(x_value)
            line_y.append(check.threshold)
    if base_x:
        ax.plot(base_x, base_mean, color=color, ls="--", lw=1, alpha=0.7, drawstyle="steps-mid")
    if band_x:
        ax.fill_between(
            band_x,
            band_low,
            band_high,
            color=color,
            alpha=0.15,
            step="mid",
        )
    if line_x:
        ax.plot(line_x, line_y, color=color, ls=":", lw=1, alpha=0.8, drawstyle="steps-mid")


def _draw_failures(ax: Axes, x: Sequence[float], points: Sequence[TrendPoint], metric: str) -> None:
    """A red ✕ on each session whose check of ``metric`` failed, a red ring on each whose test
    failed on another check."""
    failed_check, failed_other = [], []
    for x_value, p in zip(x, points, strict=True):
        check = p.check(metric)
        if check is not None and check.state == "worse":
            failed_check.append((x_value, p.means[metric]))
        elif p.outcome == "fail":
            failed_other.append((x_value, p.means[metric]))
    if failed_check:
        ax.scatter(
            [v for v, _ in failed_check],
            [v for _, v in failed_check],
            marker="X",
            s=90,
            color="red",
            edgecolors="black",
            linewidths=0.5,
            zorder=5,
        )
    if failed_other:
        ax.scatter(
            [v for v, _ in failed_other],
            [v for _, v in failed_other],
            marker="o",
            s=110,
            facecolors="none",
            edgecolors="red",
            linewidths=1.5,
            zorder=5,
        )


def _draw_regressions(ax: Axes, row: TrendRow, metric: str, to_num: DateConverter) -> None:
    """Tint red the spans where a regression of ``metric`` persisted."""
    for flag in row.flags:
        if flag.kind == "regression" and flag.check == metric:
            start, end = to_num([flag.start, flag.end])
            ax.axvspan(start, end, color="red", alpha=0.08)


def _draw_changes(ax: Axes, row: TrendRow, metric: str, to_num: DateConverter) -> None:
    """A vertical line, with its size, where the cross-night detector dates a change of
    ``metric`` (red for an alarm, green otherwise)."""
    for found in row.detections:
        began = found.start
        if found.metric != metric or found.state.direction is None or began is None:
            continue
        # the night the cross-night detector dates the change to, with its size
        (at,) = to_num([began])
        ax.axvline(at, color="red" if found.state.alarm else "green", ls="-.", lw=1.2)
        ax.annotate(
            f"{found.state.shift or 0:+.1%} from here",
            xy=(at, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(3, -12),
            textcoords="offset points",
            color="red" if found.state.alarm else "green",
            fontsize=8,
        )


def _errored_heights(table: TrendTable) -> dict[int, float]:
    """The height of the E marks of each row with errored sessions, by row index: rows with
    errors take the heights in turn, so the E's of one night do not hide each other."""
    with_errors = [i for i, row in enumerate(table.rows) if any(p.errored for p in row.points)]
    return {index: ERRORED_HEIGHTS[n % len(ERRORED_HEIGHTS)] for n, index in enumerate(with_errors)}


def _draw_errored(
    ax: Axes,
    row: TrendRow,
    metric: str,
    color: str,
    label: str,
    height: float,
    to_num: DateConverter,
) -> int:
    """An E in the row's colour at each errored session of ``row``, pinned near the bottom of
    ``ax``; none in the panel of a metric the test measured in other sessions but never this
    one (no accept length without speculation)."""
    errored = [p for p in row.points if p.errored]
    measured = any(p.means for p in row.points)
    if not errored or (measured and not any(metric in p.means for p in row.points)):
        return 0
    from matplotlib.transforms import blended_transform_factory

    # A line without a line, not a scatter: matplotlib widens the x limits to its x data (in
    # data coordinates) and leaves the y limits alone (in axes coordinates), so a session whose
    # tests all errored keeps its date on the x axis.
    ax.plot(
        to_num([p.time for p in errored]),
        [height] * len(errored),
        transform=blended_transform_factory(ax.transData, ax.transAxes),
        ls="",
        marker=ERRORED_MARKER,
        ms=10,
        color=color,
        mec="black",
        mew=0.3,
        label=label,
        gid=ERRORED_GID,
        zorder=6,
        clip_on=False,
    )
    return 1


def _errored_strip(ax: Axes, top: float, *, values: bool) -> None:
    """Shade the bottom ``top`` of ``ax`` (axes fraction), where the E marks are, and, when the
    panel has ``values``, lower its y limits so that no value is drawn in that strip."""
    from matplotlib.patches import Rectangle

    ax.add_patch(
        Rectangle((0.0, 0.0), 1.0, top, transform=ax.transAxes, color="0.5", alpha=0.08, lw=0)
    )
    if values:
        low, high = ax.get_ylim()
        ax.set_ylim(low - (high - low) * top / (1.0 - top), high)


def _legend(ax: Axes, *, values: bool = True, errored: bool = False) -> None:
    """The series by profile, then grey keys for what every series draws behind it (when the
    panel has ``values``) and for the E marks (when it has ``errored`` sessions)."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles, labels = ax.get_legend_handles_labels()
    keys = [
        (Line2D([], [], color="0.3", ls="--", lw=1), "baseline mean"),
        (Patch(color="0.3", alpha=0.2), "baseline ± 1 sd of its runs"),
        (Line2D([], [], color="0.3", ls=":", lw=1), "margin threshold"),
        (
            Line2D([], [], ls="", marker="X", ms=9, color="red", markeredgecolor="black"),
            "this check failed",
        ),
        (
            Line2D([], [], ls="", marker="o", ms=10, mfc="none", mec="red", mew=1.5),
            "test failed on another check",
        ),
        (Patch(color="red", alpha=0.12), "persistent regression"),
    ]
    if not values:  # no series: nothing behind one to explain
        keys.clear()
    if errored:
        keys.append(
            (
                Line2D([], [], ls="", marker=ERRORED_MARKER, ms=10, color="0.3", mec="black"),
                ERRORED_KEY,
            )
        )
    ax.legend(
        [*handles, *(h for h, _ in keys)],
        [*labels, *(text for _, text in keys)],
        fontsize="small",
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        borderaxespad=0.0,
    )


def _save(figure: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            figure.savefig(handle, format="png", dpi=DPI)
        os.chmod(temp_name, 0o644)
        os.replace(temp_name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp_name)
        raise
