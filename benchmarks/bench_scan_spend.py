"""What the cross-night scan spends of its false-alarm budget, month by month after a reset, on
enough unchanged nights to tell 3.5 % from 5 % (prints figures; not a test). Issue #44.

`bench_nightly.py` judges every night through the plugin's whole path (the gate look by look,
the history records, ``crossnight.detect``), about a second a trial: its 400 trials a row give
each month's false-alarm share to +-1 point, so a window at 5.3 % there does not say whether
the budget (5 % in any 30 nights, 3.5 % of it the scan's) holds. This benchmark asks the scan's
part alone on 24,000 paths a row, in seconds: the same random nights (``bench_nightly.draw``:
30 earlier nights and a 3-launch baseline, lognormal launches of 10 runs at run CV 3 %), the
noise carried over by the detector's own ``crossnight.earlier_regimes_noise``, k from it as
``detect`` takes it (``scan.grid_k``), the plan's thresholds (``scan.thresholds``) and the
statistic itself (``scan.scan``) on all paths at once. Left out, so that it is fast: the
gate's FAILs (their share is `bench_nightly.py`'s "the gate alone" row), the conflict check
that drops the carried noise (rare on unchanged nights: it decided none of the alarms looked
at) and the run-noise floor of the night SD (far below a 3-5 % launch CV). To show that these
leave the alarms alone, ``--agree`` paths of each row that alarm and as many that do not are also
judged night by night by ``crossnight.detect`` and the first alarm nights compared.

Each row is one box's noise and history length on several independent sets of nights (seeds);
the control row is the calibration's own model (normal nights in night-SD units, k fixed, the
carried df drawn as a chi-square) on paths the calibration never saw.

    python benchmarks/bench_scan_spend.py [--paths 24000] [--seeds 3 4 5] [--agree 20]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from scipy.stats import binomtest
from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_nightly as bn

from pytest_specdecode.stats.crossnight import (
    EARLIER_POINTS,
    DetectorConfig,
    Night,
    detect,
    earlier_regimes_noise,
    plan_df,
)
from pytest_specdecode.stats.scan import ScanPlan, grid_k, per_night, scan, thresholds

NIGHTS = bn.NULL_NIGHTS
CONFIG = DetectorConfig(attribute=False)


def earlier_nights(drawn: bn.Drawn) -> list[Night]:
    """The earlier regime as the history gives it: its baseline, then one night a launch."""
    nights = [Night(None, acknowledged=True, launch_means=tuple(drawn.first_base.mean(axis=1)))]
    return nights + [Night(float(runs.mean()), runs=runs.size) for runs in drawn.earlier]


def carried(drawn: bn.Drawn) -> tuple[float, float]:
    """The earlier regime's noise as the detector carries it: sum of squares and df."""
    ss, df, _ = earlier_regimes_noise(earlier_nights(drawn), 1.0)
    return ss, df


def points(drawn: bn.Drawn) -> NDArray[np.float64]:
    """The new level's points: the baseline's launch means, then one mean a night (log)."""
    means = np.concatenate([drawn.base.mean(axis=1), drawn.nights.mean(axis=1)])
    return np.asarray(np.log(means), dtype=np.float64)


def first_alarms(
    values: NDArray[np.float64], ss: NDArray[np.float64], df: float, sds: NDArray[np.float64]
) -> NDArray[np.int64]:
    """The first night each path's scan crosses its threshold (NIGHTS + 1: never), k from each
    path's own SD estimate ``sds`` as ``detect`` takes it, paths of one k scanned together."""
    change = abs(math.log1p(-CONFIG.min_change))
    ks = np.array([grid_k(change / (2.0 * sd)) for sd in sds])
    first = np.full(values.shape[0], NIGHTS + 1)
    for k in np.unique(ks):
        rows = np.flatnonzero(ks == k)
        plan = ScanPlan(launches=bn.BASELINE_LAUNCHES, k=float(k),
                        extra_df=plan_df(df), learn=False,
                        window=CONFIG.reference_nights, false_alarm=CONFIG.false_alarm,
                        horizon=CONFIG.horizon)  # fmt: skip
        path = scan(values[rows], plan.launches, plan.k, plan.window, ss[rows], df, full=False,
                    learn=False)  # fmt: skip
        over = path.down > per_night(thresholds(plan), NIGHTS)[None, :]
        hit = over.any(axis=1)
        first[rows[hit]] = over[hit].argmax(axis=1) + 1
    return first


def bench_row(scenario: bn.Scenario, earlier: int, seed: int, paths: int) -> NDArray[np.int64]:
    drawn = [bn.draw(scenario, earlier, seed, index, NIGHTS) for index in range(paths)]
    noise = [carried(d) for d in drawn]
    df = noise[0][1]
    assert all(n[1] == df for n in noise), "every path carries the same df"
    ss = np.array([n[0] for n in noise])
    return first_alarms(np.array([points(d) for d in drawn]), ss, df, np.sqrt(ss / df))


def model_row(launch_cv: float, earlier: int, seed: int, paths: int) -> NDArray[np.int64]:
    """The calibration's model: normal nights, the true night SD giving k."""
    rng = np.random.default_rng([seed, 7])
    df = float(min(earlier + bn.BASELINE_LAUNCHES, EARLIER_POINTS) - 1)  # as carried
    ss = rng.chisquare(df, paths)
    values = rng.standard_normal((paths, bn.BASELINE_LAUNCHES + NIGHTS))
    sd = math.sqrt(math.log1p(launch_cv**2) + math.log1p(0.03**2) / bn.MAX_RUNS)
    return first_alarms(values * sd, ss * sd**2, df, np.full(paths, sd))


def agreement(scenario: bn.Scenario, earlier: int, seed: int, count: int) -> tuple[int, int, int]:
    """Of ``count`` paths the fast path alarms on and ``count`` it does not (the first of each
    among 40 x ``count``), how many ``detect``, night by night over the series the history
    would give, first alarms on the same night (or never, as the fast path); and of those that
    differ, how many on a night whose carried noise the conflict check had dropped."""
    fast = bench_row(scenario, earlier, seed, 40 * count)
    alarmed = np.flatnonzero(fast <= NIGHTS)[:count]
    quiet = np.flatnonzero(fast > NIGHTS)[:count]
    same = dropped = 0
    for index in [*alarmed, *quiet]:
        drawn = bn.draw(scenario, earlier, seed, int(index), NIGHTS)
        series = earlier_nights(drawn)
        series.append(Night(None, acknowledged=True, launch_means=tuple(drawn.base.mean(axis=1))))
        first, contradicted = NIGHTS + 1, False
        for night, runs in enumerate(drawn.nights[:NIGHTS], start=1):
            series.append(Night(float(runs.mean()), runs=runs.size))
            state = detect(series, CONFIG)
            contradicted |= "was not used" in state.sigma_source
            if state.alarm or night == fast[index]:
                first = night if state.alarm else first
                break
        same += int(first == fast[index])
        dropped += int(first != fast[index] and contradicted)
    return same, alarmed.size + quiet.size, dropped


def cells(first: NDArray[np.int64]) -> list[str]:
    """Each window's share of alarms among the paths with none before it, with its two-sided
    95 % Wilson interval."""
    out = []
    for low, high in bn.WINDOWS:
        alive = first >= low
        hits = int(np.sum(alive & (first <= high)))
        ci = binomtest(hits, int(alive.sum())).proportion_ci(0.95, method="wilson")
        out.append(f"{hits / alive.sum():.2%} ({ci.low:.1%}-{ci.high:.1%})")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paths", type=int, default=24_000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[3, 4, 5])
    parser.add_argument("--earlier", type=int, nargs="+", default=[30, 90])
    parser.add_argument("--agree", type=int, default=20,
                        help="alarmed and as many quiet paths a row also judged night by night "
                        "by detect")  # fmt: skip
    args = parser.parse_args()
    started = time.monotonic()
    rows, checks = [], []
    for scenario in bn.SCENARIOS:
        for earlier in args.earlier:
            where = f"{scenario.name}, {earlier} earlier nights"
            for seed in args.seeds:
                rows.append([where, f"nights, seed {seed}",
                             *cells(bench_row(scenario, earlier, seed, args.paths))])  # fmt: skip
            rows.append([where, "calibration model",
                         *cells(model_row(scenario.launch_cv, earlier, args.seeds[0],
                                          args.paths))])  # fmt: skip
            if args.agree:
                same, judged, dropped = agreement(scenario, earlier, args.seeds[0], args.agree)
                checks.append(f"{where}: crossnight.detect, night by night, alarms first on the "
                              f"same night on {same} of {judged} paths (half alarmed on the fast "
                              f"path, half quiet); of the {judged - same} that differ, {dropped} "
                              "had the carried noise dropped by the conflict check")  # fmt: skip
    print(
        f"The cross-night scan alone on unchanged nights: the share of paths whose first alarm "
        f"falls in each window after the reset, among those with none before it (95% Wilson "
        f"interval), {args.paths} paths a row; calibrated for "
        f"{CONFIG.false_alarm:.1%} per {CONFIG.horizon} nights. Every figure is simulated.\n"
    )
    windows = [f"nights {a}-{b}" for a, b in bn.WINDOWS]
    print(tabulate(rows, headers=["box", "paths", *windows], tablefmt="github"))
    print()
    print("\n".join(checks))
    print(f"\n({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
