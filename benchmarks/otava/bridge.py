"""Run Apache Otava's own analysis on benchmark series, night by night; run by Otava's venv
interpreter (``scripts/provision-otava.sh``), not the plugin's: it imports nothing of
pytest_specdecode, and numpy only through Otava.

stdin: one JSON object, ``{"series": [[night mean, ...], ...], "monitored_from": R,
"counts_from": I}`` (R and I: one number for every series, or a list of one per series): each
series is one trial's nightly means (tok/s, higher is better) in night order; nights
``0..R-1`` come before, and night ``R + n - 1`` is monitored night ``n``.

stdout: one JSON object, ``{"first": [n or null, ...], "analyses": A, "seconds": S, "otava":
VERSION, "options": {...}}``: per series, the first monitored night ``n`` on which Otava, given
only nights ``0..R+n-1`` (what a nightly job that runs ``otava analyze`` after night ``n`` has),
reports a regression whose change point lies at index ``I`` or later, else null.

What is Otava's, called here rather than copied: ``Series.analyze`` with ``AnalysisOptions()``,
the analysis ``otava analyze`` runs (E-divisive on sliding windows of 50 points with a
Student t-test at max_pvalue 0.01 for the weak change points, merged down at 0.001, no minimum
magnitude: the CLI's defaults), on the whole series (``otava analyze`` reads a year's points by
default, more than the 130 nights here). A change point is a regression as ``otava analyze
--output regressions_only`` decides it: ``metric.direction * forward_change_percent() < 0``.
"""

from __future__ import annotations

import json
import sys
import time
from importlib.metadata import version
from typing import Any

from otava.series import AnalysisOptions, Metric, Series

METRIC = "tok_s"


def regression_indices(values: list[float], options: AnalysisOptions) -> list[int]:
    """The indices of the change points Otava reports as regressions in ``values``."""
    metric = Metric(direction=1)  # tok/s: higher is better
    series = Series(
        test_name="bench_nightly",
        branch=None,
        time=list(range(len(values))),  # one point a night; Otava only orders by it
        metrics={METRIC: metric},
        data={METRIC: list(values)},
        attributes={},
    )
    analyzed = series.analyze(options)
    return [
        cp.index
        for cp in analyzed.change_points[METRIC]
        if metric.direction * cp.forward_change_percent() < 0
    ]


def first_alarm(
    values: list[float], monitored_from: int, counts_from: int, options: AnalysisOptions
) -> tuple[int | None, int]:
    """The first monitored night Otava flags, from the prefixes a nightly job would have, and
    how many analyses that took (the search stops at the first alarm, as the bench's rules do)."""
    analyses = 0
    for end in range(monitored_from + 1, len(values) + 1):
        analyses += 1
        if any(index >= counts_from for index in regression_indices(values[:end], options)):
            return end - monitored_from, analyses
    return None, analyses


def main() -> None:
    request: dict[str, Any] = json.load(sys.stdin)
    options = AnalysisOptions()
    started = time.perf_counter()
    first, analyses = [], 0
    count_series = len(request["series"])
    monitored, counts = (
        value if isinstance(value, list) else [value] * count_series
        for value in (request["monitored_from"], request["counts_from"])
    )
    for values, monitored_from, counts_from in zip(
        request["series"], monitored, counts, strict=True
    ):
        night, count = first_alarm(
            [float(v) for v in values], int(monitored_from), int(counts_from), options
        )
        first.append(night)
        analyses += count
    json.dump(
        {
            "first": first,
            "analyses": analyses,
            "seconds": time.perf_counter() - started,
            "otava": version("apache-otava"),
            "options": {
                "window_len": options.window_len,
                "max_pvalue": options.max_pvalue,
                "min_magnitude": options.min_magnitude,
                "orig_edivisive": options.orig_edivisive,
            },
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main()
