"""The trend picture: tok/s and accept length per profile over the nightly history (PNG).

One panel per metric, one line per test (labelled by its profile), each session's mean with the
95% CI of the mean as an error bar. Behind each line, in its colour: the baseline it was compared
with (dashed), the baseline's run-to-run band (mean ± one standard deviation of the baseline's
runs, shaded, when the history knows it) and the margin's threshold (dotted). A session whose
check of that metric failed carries a red ✕, one whose test failed on another check a red ring;
spans where a regression of that metric persisted (see :mod:`pytest_specdecode.outputs.trend`) are
tinted red. Simulated figures say so in the title.

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
from pytest_specdecode.outputs.trend import TrendRow, TrendTable, trend

if TYPE_CHECKING:
    from matplotlib.axes import Axes

PLOTTED_METRICS = ("tok_s", "accept_length")
DEFAULT_SIZE = (1200, 800)
DPI = 100
INSTALL_HINT = "pip install 'pytest-specdecode[plot]'"

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
) -> Path:
    """Draw the trend of ``records`` (history lines) to the PNG ``path``, ``size`` pixels
    (width, height), atomically; returns ``path``."""
    width, height = _check_size(size)
    table = trend(records, persist=persist)
    if not table.rows:
        raise ValueError(f"nothing to plot into {path}: the selected history has no tests")
    try:
        import matplotlib.dates as mdates
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise PlotDependencyError(
            f"drawing the trend picture {path} needs matplotlib, which is not installed "
            f"({exc}); install it with: {INSTALL_HINT}"
        ) from exc

    figure = Figure(figsize=(width / DPI, height / DPI), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(PLOTTED_METRICS), 1, sharex=True, squeeze=False)[:, 0]
    colors = [f"C{i % 10}" for i in range(len(table.rows))]
    labels = _labels(table)

    def to_num(times: Sequence[datetime]) -> list[float]:
        return [float(v) for v in mdates.date2num(list(times))]  # type: ignore[no-untyped-call]

    for ax, metric in zip(axes, PLOTTED_METRICS, strict=True):
        drawn = 0
        for row, color, label in zip(table.rows, colors, labels, strict=True):
            drawn += _draw_series(ax, row, metric, color, label, to_num)
        info = METRICS[metric]
        ax.set_ylabel(f"{info.label} ({info.unit})")
        ax.grid(True, alpha=0.3)
        if not drawn:
            ax.text(
                0.5,
                0.5,
                f"no {info.label} in the selected history",
                transform=ax.transAxes,
                ha="center",
                va="center",
                color="0.4",
            )
        else:
            _legend(ax)
    # matplotlib.dates has no type annotations (the rest of matplotlib has).
    locator = mdates.AutoDateLocator()  # type: ignore[no-untyped-call]
    axes[-1].xaxis.set_major_locator(locator)
    axes[-1].xaxis.set_major_formatter(
        mdates.ConciseDateFormatter(locator)  # type: ignore[no-untyped-call]
    )
    heading = title + (" (SIMULATED: not hardware figures)" if table.simulated else "")
    figure.suptitle(
        f"{heading}\nflags after {table.persist} consecutive sessions; {table.sessions} session(s)",
        fontsize=11,
    )
    _save(figure, Path(path))
    return Path(path)


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
    points = [p for p in row.points if metric in p.means]
    if not points:
        return 0
    x = to_num([p.time for p in points])
    means = [p.means[metric] for p in points]
    below, above = [], []
    for p, mean in zip(points, means, strict=True):
        ci = p.cis.get(metric)
        below.append(mean - ci[0] if ci else 0.0)
        above.append(ci[1] - mean if ci else 0.0)
    ax.errorbar(
        x, means, yerr=[below, above], color=color, marker="o", ms=4, capsize=2, label=label
    )

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
    for flag in row.flags:
        if flag.kind == "regression" and flag.check == metric:
            start, end = to_num([flag.start, flag.end])
            ax.axvspan(start, end, color="red", alpha=0.08)
    return 1


def _legend(ax: Axes) -> None:
    """The series by profile, then grey keys for what every series draws behind it."""
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
