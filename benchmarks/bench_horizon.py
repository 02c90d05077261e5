"""What the cross-night detector can see, by the box's launch noise and the nights since a new
baseline (prints figures; not a test). Issue 44, item 3.

For each launch CV, a series as the session reads it: 30 nights of an earlier regime (the noise
carried over), a baseline recorded over 3 launches, then ``N`` nights; one launch of 10 runs a
night at run CV 3 % (the night SD is sqrt(ln(1 + launch CV^2) + ln(1 + 0.03^2) / 10)). The
figures are ``stats.horizon.horizon`` on ``crossnight.detect``'s state, as each session prints
them: the smallest drops flagged with 90 % within 7, 14 and 28 nights if they started the next
night. ``launches a night`` is the fewest launches a night (their mean is the night's value)
with which a 5 % drop is flagged within 14 nights with 90 %, on the 30th night after the
baseline. Seeded; a drop is found by the horizon's own simulation (4,000 paths).

    python benchmarks/bench_horizon.py [--seed 1]
"""

from __future__ import annotations

import argparse
import math

import numpy as np
from tabulate import tabulate

from pytest_specdecode.stats.crossnight import DetectorConfig, Night, detect
from pytest_specdecode.stats.horizon import horizon

RUN_CV, RUNS = 0.03, 10
LAUNCH_CVS = (0.01, 0.02, 0.03, 0.05, 0.10)
SINCE = (1, 7, 30, 90)
CONFIG = DetectorConfig(attribute=False)


def series(rng: np.random.Generator, sd: float, nights: int) -> list[Night]:
    before = [Night(100 * math.exp(v), runs=RUNS, run_sd=RUN_CV)
              for v in rng.normal(0, sd, 30)]  # fmt: skip
    base = Night(None, acknowledged=True, launch_means=tuple(100 * np.exp(rng.normal(0, sd, 3))),
                 note="the baseline")  # fmt: skip
    after = [Night(100 * math.exp(v), runs=RUNS, run_sd=RUN_CV)
             for v in rng.normal(0, sd, nights)]  # fmt: skip
    return [*before, base, *after]


def night_sd(launch_cv: float, launches: int = 1) -> float:
    return math.sqrt((math.log1p(launch_cv**2) + math.log1p(RUN_CV**2) / RUNS) / launches)


def launches_for(launch_cv: float, seed: int, most: int = 16) -> str:
    for launches in range(1, most + 1):
        state = detect(series(np.random.default_rng(seed), night_sd(launch_cv, launches), 30),
                       CONFIG)  # fmt: skip
        seen = horizon(state)
        if seen is not None and dict(seen.within)[14] <= 0.05:
            return str(launches)
    return f"> {most}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rows = []
    for launch_cv in LAUNCH_CVS:
        for since in SINCE:
            state = detect(series(np.random.default_rng(args.seed), night_sd(launch_cv), since),
                           CONFIG)  # fmt: skip
            seen = horizon(state)
            assert seen is not None
            cells = [f"{drop:.1%}" if math.isfinite(drop) else "none" for _, drop in seen.within]
            needed = launches_for(launch_cv, args.seed) if since == 30 else ""
            rows.append([f"{launch_cv:.0%}", f"{night_sd(launch_cv):.1%}", since, seen.points,
                         *cells, needed])  # fmt: skip
    print("one launch of 10 runs a night, run CV 3%; noise carried from 30 earlier nights; the "
          "drops flagged with 90% if they start the next night")  # fmt: skip
    print(tabulate(rows, headers=["launch CV", "night SD", "night since the baseline",
                                  "level from points", "within 7 nights", "within 14",
                                  "within 28", "launches a night for 5% within 14"],
                   tablefmt="github"))  # fmt: skip


if __name__ == "__main__":
    main()
