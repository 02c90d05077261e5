"""Detection across nights: delays and false alarms of every rule on the same simulated nights
(prints figures; not a test). Issue #23.

Each trial is one check's life after an acknowledged change: a baseline of 3 launches x 60 runs,
then the nightly sessions, one launch of up to 10 runs each (run CV 3 %), lognormal at both
levels. The first ``REFERENCE`` nights (the detector's reference, 90) are unchanged; then either
30 more unchanged nights (false alarms per 30 nights) or a persistent drop of 5, 10 or 29 % from
the first evaluated night on, followed for up to ``CHANGE_NIGHTS`` nights (the delay).

Everything a session does goes through the plugin's own code: every evaluated night is judged by
``stats.compare`` look by look with the sequential plan's alphas and the no-change guard spent in
proportion (as ``measurement.py`` does), with the launch prior that ``launches.prior_for`` reads
from the history records; each night is written as a history record (the shape of
``outputs/history.history_record``, checked by ``history.parse_record``; ``--ci`` also appends
every night to a real history file with ``append_history`` and reads it back with
``read_history``), and the cross-night detector reads its series with
``crossnight.series_from_history`` and judges it with ``crossnight.detect``. The rules, on the
same nights:

* **new**: the nightly gate with the guard tightened once history exists
  (``launches.guard_alpha``) OR the cross-night CUSUM (``crossnight.detect``, 90-night frozen
  reference); **new, R=30**: the same with a 30-night reference (active three times sooner);
* **previous**: today's trend rule, two nightly FAILs in a row (guard 0.01, ``outputs/trend.py``);
* **mean:5%**: pytest-benchmark's ``--benchmark-compare-fail=mean:5%`` each night against the
  saved baseline (the mean of the night's 10 runs more than 5 % below the baseline's mean);
* **asv-style**: a reimplementation (asv is not a dependency) of asv's step detection: the
  optimal piecewise-constant fit of the nightly log means with a BIC-like penalty (3 ln n per
  segment, noise from the successive differences), a regression when the latest segment of >= 2
  nights lies more than 5 % (asv's ``regressions_thresholds`` default) below the one before;
* **Otava**: Apache Otava 0.8.0 itself, in a venv of its own (``scripts/provision-otava.sh``;
  Otava pins numpy 2.2): every row's series go, in one batch, to ``benchmarks/otava/bridge.py`` run
  by that venv's interpreter, which runs Otava's ``Series.analyze`` with the defaults of ``otava
  analyze`` (E-divisive on windows of 50 points, t-test at 0.001) on every prefix a nightly job
  would have (night n: all nights up to n) and returns the first night Otava reports a
  regression change point lying at most 5 nights before the change; ``--no-otava`` leaves it out;
* **Otava-like**: the reimplementation that stood in for it before: the E-divisive split of the
  trailing 30 nights (``changepoint`` Q, power 1) and one two-sided Student t-test on it at
  Otava's ``max_pvalue`` 0.001, the same 5-night tolerance;
* **oracle**: the CUSUM with the true level and noise (the limit any detector of this k has), h
  calibrated to the same 3.5 % per 30 nights.

Delays count nights from the change (1 = flagged on the first changed night); ">N" means not
flagged by the cap in at least that share of trials. Monte Carlo error: +-sqrt(p(1-p)/trials) on
rates (printed), and the order-statistic interval on the 95th percentile (printed as a range).

Scenarios: launch CV 3 % and 5 % at run CV 3 %, and the noise measured on one H200 at TP 1
(``tests/contract/data/h200_noise.json``, read at run time: the launch CV beyond the runs and the
pooled run CV of "measured H200 TP1 (EAGLE3 2-step)", 1.22 % and 0.77 % when written, and of
"(no speculation)", 0.75 % and 0.63 %, the latter not under ``--ci``).

    python benchmarks/bench_nightly.py [--trials 200] [--seed 1] [--ci] [--no-otava]
        [--scenario NAME=LAUNCH_CV,RUN_CV] [--measured launch_means.json] [--only NAME]

The Otava column needs Otava's venv, built once (seconds) by ``scripts/provision-otava.sh``; the
benchmark finds it in the same cache (or ``--otava-python``, ``SPECDECODE_OTAVA_PYTHON``) and
stops with that command when it is missing, unless ``--no-otava``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
from tabulate import tabulate

from pytest_specdecode.outputs.history import (
    HISTORY_SCHEMA_VERSION,
    append_history,
    parse_record,
    read_history,
)
from pytest_specdecode.settings import OPTIONS_BY_NAME
from pytest_specdecode.stats.changepoint import energy_split
from pytest_specdecode.stats.comparison import Verdict, compare
from pytest_specdecode.stats.crossnight import (
    DetectorConfig,
    clip_for,
    detect,
    series_from_history,
)
from pytest_specdecode.stats.distributions import t_sf
from pytest_specdecode.stats.sequential import SequentialPlan
from pytest_specdecode.stats.two_level import LaunchPrior, guard_alpha, prior_for, stated_prior

LEVEL = 88.8  # tok/s, the seed's NCCL-tuned baseline
MARGIN = -0.02
ALPHA = float(OPTIONS_BY_NAME["alpha"].default)
ALPHA_NO_CHANGE = float(OPTIONS_BY_NAME["alpha_no_change"].default)
RUNS = int(OPTIONS_BY_NAME["runs"].default)
MAX_RUNS = int(OPTIONS_BY_NAME["max_runs"].default)
BASELINE_RUNS = int(OPTIONS_BY_NAME["baseline_runs"].default)
BASELINE_LAUNCHES = 3
CONFIG = DetectorConfig(attribute=False)
SHORT = DetectorConfig(reference_nights=30, attribute=False)
REFERENCE = CONFIG.reference_nights
NULL_NIGHTS = 30
CHANGE_NIGHTS = 40
CHANGES = (-0.05, -0.10, -0.29)
OTAVA_WINDOW, OTAVA_P = 30, 0.001
#: A change point up to this many nights before the change counts as finding it (E-divisive
#: dates a step a night or two early when a low night precedes it); one earlier is noise.
OTAVA_EARLY = 5
OTAVA_VERSION = "0.8.0"
OTAVA_BRIDGE = Path(__file__).resolve().parent / "otava" / "bridge.py"
OTAVA_BUILD = "scripts/provision-otava.sh"
ASV_THRESHOLD = 0.05
LOAD_S, RUN_S = 900.0, 5.5
KEY = {"test_id": "bench::test_tok_s", "hardware_key": "sim", "fingerprint": "f",
       "workload_hash": "w"}  # fmt: skip
RULES = ("new", "new, R=30", "previous", "mean:5%", "asv-style", "Otava-like", "oracle")
#: The rule judged outside this process, after a row's trials (``otava_first``).
OTAVA = "Otava"
START = datetime(2026, 1, 1, 3, 0, tzinfo=timezone.utc)


@dataclass(frozen=True)
class Scenario:
    """The noise of one box. ``launch_effects`` (log deviations of measured launch means from
    their mean) replaces the lognormal launch effect by resampling: the hook for measured GPU
    noise (``--measured``). ``measured_run_cv``: the run CV is a measurement, kept in the
    first-night table too (which otherwise puts every box at the seed's 4 %)."""

    name: str
    launch_cv: float
    run_cv: float
    launch_effects: tuple[float, ...] = ()
    measured_run_cv: bool = False

    def launches(self, rng: np.random.Generator, k: int, r: int) -> np.ndarray:
        if self.launch_effects:
            offsets = rng.choice(np.asarray(self.launch_effects), (k, 1))
        else:
            offsets = rng.normal(0.0, math.sqrt(math.log1p(self.launch_cv**2)), (k, 1))
        run_sd = math.sqrt(math.log1p(self.run_cv**2))
        return LEVEL * np.exp(offsets + rng.normal(0.0, run_sd, (k, r)))


SCENARIOS = (Scenario("launch CV 3%", 0.03, 0.03), Scenario("launch CV 5%", 0.05, 0.03))
#: Run and launch noise of a GPU-bound SGLang server measured on one H200 at TP 1 (the contract
#: file the simulator's noise presets are held to; docs/gpu-smoke-2026-12-03/ has the evidence).
H200_NOISE = Path(__file__).resolve().parents[1] / "tests" / "contract" / "data" / "h200_noise.json"
MEASURED_H200 = {"noise-eagle3-2": "EAGLE3 2-step", "noise-nospec": "no speculation"}


def measured_h200(profile: str = "noise-eagle3-2") -> Scenario:
    """The H200's noise for ``profile``, read from the contract file now: the launch CV beyond
    what the runs explain (the launch effect) and the pooled run CV inside a launch."""
    measured = json.loads(H200_NOISE.read_text(encoding="utf-8"))["profiles"][profile]
    return Scenario(
        f"measured H200 TP1 ({MEASURED_H200[profile]})",
        float(measured["launch_cv_beyond_runs"]),
        float(measured["run_cv_rms"]),
        measured_run_cv=True,
    )


# --------------------------------------------------------------------------- a night's records


def night_record(
    index: int, runs: np.ndarray, verdict: str, baseline_mean: float
) -> dict[str, Any]:
    """One session's history line, in the shape ``history_record`` writes (the fields the
    readers use), checked by the history's own parser."""
    mean = float(runs.mean())
    record = {
        "schema_version": HISTORY_SCHEMA_VERSION,
        "time_utc": (START + timedelta(days=index)).isoformat().replace("+00:00", "Z"),
        "run_id": f"night-{index}",
        "tests": [
            {
                **KEY,
                "profile": "bench",
                "outcome": verdict,
                "metrics": {
                    "tok_s": {
                        "n": int(runs.size),
                        "mean": mean,
                        "cv": float(runs.std(ddof=1) / mean),
                    }
                },
                "checks": [
                    {
                        "metric": "tok_s",
                        "reference": None,
                        "verdict": verdict,
                        "baseline_mean": baseline_mean,
                        "ratio": mean / baseline_mean,
                    }
                ],
            }
        ],
    }
    return parse_record(json.dumps(record), where=f"night {index}")


# --------------------------------------------------------------------------- the nightly gate


def gate(
    runs: np.ndarray,
    baseline: list[float],
    plan: SequentialPlan,
    prior: LaunchPrior | None,
) -> tuple[Verdict, Verdict]:
    """Today's verdict (guard 0.01 spent across the looks) and the new one (the guard from
    ``launches.guard_alpha``), look by look as ``measurement.py`` runs them. The two differ only
    where today's is FAIL, so the new rule reuses today's comparisons elsewhere."""
    looks = plan.looks()
    memo: dict[tuple[int, float], Verdict] = {}

    def at(index: int, guard: float) -> Verdict:
        if (index, guard) not in memo:
            look_alpha = plan.alpha_at(index)
            memo[index, guard] = compare(
                list(runs[: looks[index]]),
                baseline,
                margin=MARGIN,
                alpha=look_alpha,
                launch_runs=[BASELINE_RUNS] * BASELINE_LAUNCHES,
                prior=prior,
                alpha_no_change=guard * look_alpha / ALPHA,
            ).verdict
        return memo[index, guard]

    def sequence(guard: float) -> Verdict:
        verdict = Verdict.INCONCLUSIVE
        for index in range(len(looks)):
            verdict = at(index, ALPHA_NO_CHANGE)
            if verdict is Verdict.FAIL and guard != ALPHA_NO_CHANGE:
                verdict = at(index, guard)
            if verdict is not Verdict.INCONCLUSIVE:
                return verdict
        return verdict

    return sequence(ALPHA_NO_CHANGE), sequence(guard_alpha(ALPHA_NO_CHANGE, prior))


# --------------------------------------------------------------------------- comparators


def asv_regression(values: np.ndarray) -> bool:
    """asv-style: the latest step of an optimal piecewise-constant fit is a drop > 5 %."""
    n = values.size
    if n < 4:
        return False
    noise = max(float(np.mean(np.diff(values) ** 2) / 2.0), 1e-12)
    penalty = 3.0 * math.log(n)
    s1 = np.concatenate([[0.0], np.cumsum(values)])
    s2 = np.concatenate([[0.0], np.cumsum(values**2)])
    best = np.full(n + 1, np.inf)
    best[0] = -penalty
    cut = np.zeros(n + 1, dtype=np.int64)
    for j in range(1, n + 1):
        i = np.arange(j)
        cost = (s2[j] - s2[i]) - (s1[j] - s1[i]) ** 2 / (j - i)
        total = best[i] + cost / noise + penalty
        cut[j] = int(np.argmin(total))
        best[j] = total[cut[j]]
    last = cut[n]
    if last == 0 or n - last < 2:
        return False
    previous = cut[last]
    before = float(values[previous:last].mean())
    after = float(values[last:].mean())
    return math.expm1(after - before) < -ASV_THRESHOLD


def otava_split(values: np.ndarray) -> int | None:
    """Otava-like: the E-divisive split of the trailing window, kept when a two-sided Student
    t-test gives p <= 0.001 and the later side is lower; its index in ``values``."""
    window = values[-OTAVA_WINDOW:]
    split = energy_split(window, permutations=0)
    if split is None or split.after >= split.before:
        return None
    left, right = window[: split.index], window[split.index :]
    df = left.size + right.size - 2
    pooled = ((left.size - 1) * left.var(ddof=1) + (right.size - 1) * right.var(ddof=1)) / df
    se = math.sqrt(pooled * (1 / left.size + 1 / right.size))
    if se == 0:
        return None
    p_value = 2.0 * float(t_sf(abs(left.mean() - right.mean()) / se, df))
    return values.size - window.size + split.index if p_value <= OTAVA_P else None


def otava_python(given: Path | None) -> Path:
    """Otava's venv interpreter: ``given``, else ``SPECDECODE_OTAVA_PYTHON``, else where
    ``scripts/provision-otava.sh`` builds it (the project's cache, as that script computes it)."""
    if given is not None:
        return given
    if os.environ.get("SPECDECODE_OTAVA_PYTHON"):
        return Path(os.environ["SPECDECODE_OTAVA_PYTHON"])
    cache = os.environ.get("SPECDECODE_CACHE") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pytest-specdecode"
    )
    return Path(cache) / "otava" / OTAVA_VERSION / "venv" / "bin" / "python"


def otava_missing(python: Path) -> str | None:
    """Why ``python`` cannot run the Otava column (with the command that builds it), or None."""
    if not python.is_file():
        return f"Apache Otava's venv is missing: no {python}"
    done = subprocess.run(
        [str(python), "-c", "import otava.series"], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        return f"{python} cannot import Otava: {done.stderr.strip().splitlines()[-1:]}"
    return None


@dataclass
class OtavaCost:
    """What the Otava column cost: subprocess wall time, and Otava's own analysing time."""

    trials: int = 0
    analyses: int = 0
    wall_s: float = 0.0
    analysis_s: float = 0.0


def otava_first(
    python: Path, series: Sequence[Sequence[float]], cost: OtavaCost
) -> list[int | None]:
    """The first monitored night Otava flags in each series (nightly means, the reference
    first), by one run of ``bridge.py`` under Otava's interpreter for all of them."""
    request = {
        "series": [[float(v) for v in values] for values in series],
        "monitored_from": REFERENCE,
        "counts_from": REFERENCE - OTAVA_EARLY,
    }
    started = time.monotonic()
    done = subprocess.run(
        [str(python), str(OTAVA_BRIDGE)],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{OTAVA_BRIDGE.name} under {python} failed:\n{done.stderr}")
    answer = json.loads(done.stdout)
    first = [None if night is None else int(night) for night in answer["first"]]
    if len(first) != len(series):
        raise SystemExit(f"{OTAVA_BRIDGE.name} answered {len(first)} series of {len(series)}")
    cost.trials += len(series)
    cost.analyses += int(answer["analyses"])
    cost.wall_s += time.monotonic() - started
    cost.analysis_s += float(answer["seconds"])
    return first


@dataclass(frozen=True)
class Oracle:
    level: float  # the true expected log night mean of the unchanged build
    sd: float
    k: float
    h: float


def oracle_for(scenario: Scenario, seed: int) -> Oracle:
    """The known-noise CUSUM: the level and SD of a night's log mean by simulation (200,000
    nights), h for 3.5 % per 30 nights on 20,000 null paths."""
    rng = np.random.default_rng([seed, 99])
    nights = np.log(scenario.launches(rng, 200_000, MAX_RUNS).mean(axis=1))
    level, sd = float(nights.mean()), float(nights.std())
    k = abs(math.log1p(-CONFIG.min_change)) / (2 * sd)
    clip = clip_for(k)  # as the detector clips (a quiet box's k exceeds Z_CLIP)
    z = np.clip(rng.standard_normal((20_000, NULL_NIGHTS)), -clip, clip)
    s, peak = np.zeros(z.shape[0]), np.zeros(z.shape[0])
    for t in range(NULL_NIGHTS):
        s = np.maximum(0.0, s - z[:, t] - k)
        peak = np.maximum(peak, s)
    h = max(float(np.quantile(peak, 1 - CONFIG.false_alarm)), clip - k)
    return Oracle(level, sd, k, h)


# --------------------------------------------------------------------------- one trial


def trial(
    scenario: Scenario,
    change: float,
    rng: np.random.Generator,
    oracle: Oracle,
    plan: SequentialPlan,
    history_file: Path | None = None,
) -> tuple[dict[str, int | None], list[float]]:
    """The first night each rule flags (1-based from the change), None when not flagged; and
    the nightly means of all the trial's nights to the horizon, for the rules judged later
    (Otava). Nights after the other rules have all flagged are drawn from a child of ``rng``
    (``spawn`` leaves ``rng``'s own stream as it was), so the other rules' figures do not depend
    on whether the Otava column runs."""
    base = scenario.launches(rng, BASELINE_LAUNCHES, BASELINE_RUNS)
    baseline = list(base.ravel())
    baseline_mean = float(base.mean())
    history: list[dict[str, Any]] = []

    def add(record: dict[str, Any]) -> None:
        history.append(record)
        if history_file is not None:
            append_history(history_file, record)

    means: list[float] = []
    for index in range(REFERENCE):  # the reference nights: only their records matter here
        runs = scenario.launches(rng, 1, MAX_RUNS)[0]
        add(night_record(index, runs, "inconclusive", baseline_mean))
        means.append(float(runs.mean()))
    horizon = NULL_NIGHTS if change == 0 else CHANGE_NIGHTS
    found: dict[str, int | None] = dict.fromkeys(RULES)
    previous_fail = False
    oracle_s = 0.0
    for night in range(1, horizon + 1):
        runs = scenario.launches(rng, 1, MAX_RUNS)[0] * (1.0 + change)
        means.append(float(runs.mean()))
        if history_file is not None:
            history[:] = read_history(history_file)
        prior = prior_for(history, metric="tok_s", **KEY)
        old, new = gate(runs, baseline, plan, prior)
        add(night_record(REFERENCE + night - 1, runs, new.value, baseline_mean))
        series = series_from_history(history, metric="tok_s", **KEY)
        values = np.log([n.mean for n in series if n.mean is not None])
        flags = {
            "new": new is Verdict.FAIL or detect(series, CONFIG).alarm,
            "new, R=30": new is Verdict.FAIL
            or detect(series[REFERENCE - SHORT.reference_nights :], SHORT).alarm,
            "previous": old is Verdict.FAIL and previous_fail,
            "mean:5%": float(runs.mean()) < 0.95 * baseline_mean,
            "asv-style": asv_regression(values),
        }
        split = otava_split(values)
        flags["Otava-like"] = split is not None and split >= REFERENCE - OTAVA_EARLY
        clip = clip_for(oracle.k)
        z = max(-clip, min(clip, (float(values[-1]) - oracle.level) / oracle.sd))
        oracle_s = max(0.0, oracle_s - z - oracle.k)
        flags["oracle"] = oracle_s > oracle.h
        previous_fail = old is Verdict.FAIL
        for rule, flagged in flags.items():
            if flagged and found[rule] is None:
                found[rule] = night
        if all(value is not None for value in found.values()):
            break
    rest = horizon - (len(means) - REFERENCE)
    if rest:
        later = rng.spawn(1)[0]
        means.extend(float(v) for v in scenario.launches(later, rest, MAX_RUNS).mean(axis=1)
                     * (1.0 + change))  # fmt: skip
    return found, means


# --------------------------------------------------------------------------- tables


def delay_cell(delays: Sequence[int | None], cap: int) -> str:
    """Median and 95th percentile of the delay in nights, the latter with the order-statistic
    95 % interval as its Monte Carlo error."""
    n = len(delays)
    values = np.sort([d if d is not None else math.inf for d in delays])

    def at(q: float) -> float:
        return float(values[min(n - 1, math.ceil(q * n) - 1)])

    def text(value: float) -> str:
        return f">{cap}" if math.isinf(value) else f"{value:.0f}"

    spread = 1.96 * math.sqrt(n * 0.95 * 0.05)
    low = float(values[max(0, math.floor(0.95 * n - spread) - 1)])
    high = float(values[min(n - 1, math.ceil(0.95 * n + spread) - 1)])
    return f"{text(at(0.5))} / {text(at(0.95))} ({text(low)}-{text(high)})"


def rate_cell(hits: int, n: int) -> str:
    p = hits / n
    return f"{p:.1%} ±{math.sqrt(max(p * (1 - p), 1 / n) / n):.1%}"


def columns(otava: bool) -> list[str]:
    """The rules as printed: Otava's own column beside its reimplementation, when it runs."""
    if not otava:
        return list(RULES)
    at = RULES.index("Otava-like")
    return [*RULES[:at], OTAVA, *RULES[at:]]


def run(
    scenarios: Sequence[Scenario],
    trials: int,
    seed: int,
    history_file: Callable[[], Path] | None = None,
    changes: Sequence[float] = (0.0, *CHANGES),
    otava: Path | None = None,
    cost: OtavaCost | None = None,
) -> list[list[str]]:
    """The table's rows; ``otava``: Otava's venv interpreter (None: no Otava column)."""
    cost = cost if cost is not None else OtavaCost()
    rules = columns(otava is not None)
    plan = SequentialPlan(initial_runs=RUNS, max_runs=MAX_RUNS, alpha=ALPHA).for_baseline(
        BASELINE_LAUNCHES * BASELINE_RUNS
    )
    simulated: list[tuple[str, float, list[dict[str, int | None]], list[Sequence[float]]]] = []
    for scenario in scenarios:
        oracle = oracle_for(scenario, seed)
        for change in changes:
            rng = np.random.default_rng(
                [seed, round(scenario.launch_cv * 1e4), round(-change * 1e3)]
            )
            done = [
                trial(scenario, change, rng, oracle, plan,
                      history_file() if history_file is not None and i == 0 else None)
                for i in range(trials)
            ]  # fmt: skip
            results = [found for found, _ in done]
            simulated.append((scenario.name, change, results, [means for _, means in done]))
    if otava is not None:  # every row's series in one batch: one Otava process (1.4 CPU-s to start)
        nights = otava_first(otava, [means for *_, series in simulated for means in series], cost)
        for found, night in zip(
            (found for _, _, results, _ in simulated for found in results), nights, strict=True
        ):
            found[OTAVA] = night
    rows = []
    for name, change, results, _ in simulated:
        if change == 0:
            cells = [rate_cell(sum(r[rule] is not None for r in results), trials)
                     for rule in rules]  # fmt: skip
            label = "false alarms / 30 nights"
        else:
            cells = [delay_cell([r[rule] for r in results], CHANGE_NIGHTS) for rule in rules]
            label = f"{change:+.0%}: delay median / p95"
        rows.append([name, label, *cells])
    return rows


def first_night(scenarios: Sequence[Scenario], trials: int, seed: int) -> list[list[str]]:
    """P(FAIL) on the first night after a baseline recording (no history), at the seed's run CV
    4 % (a measured scenario: its own), with today's 2 df and with the stated prior
    (``launches.stated_prior``)."""
    plan = SequentialPlan(initial_runs=RUNS, max_runs=MAX_RUNS, alpha=ALPHA).for_baseline(
        BASELINE_LAUNCHES * BASELINE_RUNS
    )
    rows = []
    for scenario in scenarios:
        run_cv = scenario.run_cv if scenario.measured_run_cv else 0.04
        seed_noise = Scenario(scenario.name, scenario.launch_cv, run_cv, scenario.launch_effects)
        for change in (0.0, -0.29):
            rng = np.random.default_rng([seed, 7, round(scenario.launch_cv * 1e4)])
            fails = {"today": 0, "stated prior": 0}
            count = trials * (3 if change == 0 else 1)  # 1 % needs more trials to show
            for _ in range(count):
                base = list(seed_noise.launches(rng, BASELINE_LAUNCHES, BASELINE_RUNS).ravel())
                runs = seed_noise.launches(rng, 1, MAX_RUNS)[0] * (1 + change)
                fails["today"] += gate(runs, base, plan, None)[0] is Verdict.FAIL
                fails["stated prior"] += gate(runs, base, plan, stated_prior())[0] is Verdict.FAIL
            rows.append([scenario.name, f"{change:+.0%}", *(rate_cell(v, count)
                                                             for v in fails.values())])  # fmt: skip
    return rows


# --------------------------------------------------------------------------- end to end

E2E_PROFILES = """
[defaults]
launcher = "sim"
model_path = "/models/tiny-llm"
startup_timeout = 60
warmup_requests = 1

[profiles.eagle3]
extra_args = ["--sim-speed", "20", "--sim-load-seconds", "0.2", "--sim-noise-cv", "0.03",
              "--sim-launch-cv", "LAUNCH_CV"]
[profiles.eagle3.speculative]
algorithm = "EAGLE3"
draft_model_path = "/models/tiny-eagle3"
num_steps = 2
eagle_topk = 1
num_draft_tokens = 3

[workloads.nightly]
prompt_set = "mixed"
max_new_tokens = 96
concurrency = 1
requests_per_run = 2
warmup_requests = 1
"""

E2E_TEST = """
import pytest

@pytest.mark.specdecode("eagle3", workload="nightly", tok_s=-0.05)
def test_eagle3():
    pass
"""


def end_to_end(
    nights: int, change_night: int, reference: int, launch_cv: float, keep: Path | None = None
) -> int:
    """Nights through pytest and the simulated server, as a user's nightly job runs them: a
    baseline over 3 launches, then one launch a night (``--sim-launch-cv``), the history
    appended each night, a 10 % slower server (``SPECDECODE_SIM_SLOWDOWN``, fingerprint
    unchanged) from ``change_night`` on. Prints each night's verdict and the detector's state;
    returns 0 when the alarm fired on or after the change and never before it. ``keep``: where
    to copy the history file at the end (the dashboard's test data is made this way)."""
    work = Path(tempfile.mkdtemp(prefix="bench-nightly-e2e-"))
    (work / "specdecode.toml").write_text(E2E_PROFILES.replace("LAUNCH_CV", str(launch_cv)))
    (work / "test_nightly.py").write_text(E2E_TEST)
    (work / "pytest.ini").write_text(
        "[pytest]\nspecdecode_config = specdecode.toml\nspecdecode_baselines = baselines\n"
    )
    history = work / "history.jsonl"
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]
    env = {**os.environ, "PYTEST_SPECDECODE_STATE_DIR": str(work / "state")}
    started = time.monotonic()
    subprocess.run(
        [*base, "--update-baselines", "--specdecode-baseline-launches", "3",
         "--specdecode-baseline-runs", "10", "--specdecode-force-baseline"],
        cwd=work, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    print(
        f"end to end in {work}: simulated server, launch CV {launch_cv:.0%}, run CV 3%, "
        f"baseline 3 launches x 10 runs, one launch of 10 runs a night, reference {reference} "
        f"nights, 10 % slower from night {change_night} (all figures simulated)\n"
    )
    rows, first_alarm = [], None
    for night in range(1, nights + 1):
        slow = night >= change_night
        night_env = {**env, **({"SPECDECODE_SIM_SLOWDOWN": "1.111"} if slow else {})}
        done = subprocess.run(
            [*base, "--specdecode-runs", "10", "--specdecode-max-runs", "10",
             f"--specdecode-history={history}", f"--specdecode-reference-nights={reference}"],
            cwd=work, env=night_env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        line = json.loads(history.read_text().splitlines()[-1])
        (test,) = line["tests"]
        state = test["crossnight"]["tok_s"]
        if state["alarm"] and first_alarm is None:
            first_alarm = night
        rows.append([
            night, "-10%" if slow else "", f"{test['metrics']['tok_s']['mean']:.0f}",
            test["outcome"].upper(), done.returncode, state["status"],
            f"{state['statistic']:.2f}" if state["threshold"] is not None else "-",
            f"{state['threshold']:.2f}" if state["threshold"] is not None else "-",
            f"{state['shift']:+.1%}" if state["shift"] is not None else "",
        ])  # fmt: skip
    headers = ["night", "change", "tok/s (sim)", "verdict", "exit", "detector", "CUSUM", "h"]
    print(tabulate(rows, headers=[*headers, "shift"], tablefmt="github"))
    held = first_alarm is not None and first_alarm >= change_night
    if keep is not None:
        keep.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(history, keep)
        print(f"history of {nights} simulated nights copied to {keep}")
    print(
        f"\nfirst alarm: night {first_alarm} ({time.monotonic() - started:.0f} s)"
        if first_alarm
        else f"\nno alarm within {nights} nights ({time.monotonic() - started:.0f} s)"
    )
    return 0 if held else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--first-night-trials", type=int, default=400)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--ci", action="store_true", help="a small, quick configuration")
    parser.add_argument("--changes", type=float, nargs="+", default=[0.0, *CHANGES],
                        help="true changes, 0 for the false-alarm row (default 0 -0.05 -0.1 "
                        "-0.29)")  # fmt: skip
    parser.add_argument("--no-first-night", action="store_true")
    parser.add_argument("--no-otava", action="store_true",
                        help="leave out the Otava column (no Otava venv needed)")  # fmt: skip
    parser.add_argument("--otava-python", type=Path, metavar="PATH",
                        help="Otava's venv interpreter (default: $SPECDECODE_OTAVA_PYTHON, else "
                        f"where {OTAVA_BUILD} builds it)")  # fmt: skip
    parser.add_argument("--scenario", action="append", default=[],
                        help="NAME=LAUNCH_CV,RUN_CV: another box's noise")  # fmt: skip
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="run only the scenarios of these names (e.g. 'measured H200 TP1 "
                        "(EAGLE3 2-step)')")  # fmt: skip
    parser.add_argument(
        "--e2e",
        type=int,
        metavar="NIGHTS",
        help="instead: run NIGHTS nights through pytest and the simulated "
        "server (a 10%% drop from --e2e-change-night, --e2e-reference nights)",
    )
    parser.add_argument("--e2e-change-night", type=int, default=9)
    parser.add_argument("--e2e-reference", type=int, default=6)
    parser.add_argument("--e2e-launch-cv", type=float, default=0.03)
    parser.add_argument("--e2e-history", type=Path, metavar="PATH",
                        help="copy the --e2e nights' history file here at the end")  # fmt: skip
    parser.add_argument("--measured", type=Path,
                        help="JSON list of measured launch means of one build: their log "
                        "deviations are resampled as launch effects")  # fmt: skip
    args = parser.parse_args()
    if args.e2e:
        raise SystemExit(
            end_to_end(
                args.e2e,
                args.e2e_change_night,
                args.e2e_reference,
                args.e2e_launch_cv,
                args.e2e_history,
            )
        )
    scenarios = [*SCENARIOS, measured_h200("noise-eagle3-2")]
    if not args.ci:
        scenarios.append(measured_h200("noise-nospec"))
    for text in args.scenario:
        name, _, numbers = text.partition("=")
        launch_cv, run_cv = (float(v) for v in numbers.split(","))
        scenarios.append(Scenario(name, launch_cv, run_cv))
    if args.measured is not None:
        means = np.log(np.asarray(json.loads(args.measured.read_text()), dtype=float))
        effects = tuple(float(v) for v in means - means.mean())
        scenarios.append(Scenario(f"measured ({args.measured.name})", float(np.std(means)), 0.03,
                                  effects))  # fmt: skip
    if args.only:
        unknown = sorted(set(args.only) - {scenario.name for scenario in scenarios})
        if unknown:
            parser.error(f"--only {unknown}: no such scenario; there are "
                         f"{[scenario.name for scenario in scenarios]}")  # fmt: skip
        scenarios = [scenario for scenario in scenarios if scenario.name in args.only]
    trials, first_trials = (8, 40) if args.ci else (args.trials, args.first_night_trials)
    otava: Path | None = None
    if not args.no_otava:  # before the simulation: a missing venv stops it at once
        otava = otava_python(args.otava_python)
        why = otava_missing(otava)
        if why is not None:
            raise SystemExit(
                f"{why}\nThe Otava column runs Apache Otava {OTAVA_VERSION} in a venv of its own. "
                f"Build it once (seconds, three wheels) with\n    {OTAVA_BUILD}\nor give its "
                "interpreter with --otava-python PATH, or leave the column out with --no-otava."
            )
    started = time.monotonic()
    print(
        f"one launch of {RUNS}..{MAX_RUNS} runs a night, run CV 3% (measured scenarios: "
        f"their own), margin {MARGIN:+.0%}, "
        f"baseline {BASELINE_LAUNCHES} launches x {BASELINE_RUNS} runs; detector: reference "
        f"{REFERENCE} nights, min change {CONFIG.min_change:.0%}, false alarms "
        f"{CONFIG.false_alarm:.1%} per {CONFIG.horizon} nights; {trials} trials per row\n"
    )
    cost = OtavaCost()
    with tempfile.TemporaryDirectory() as directory:
        history = (lambda: Path(directory) / "history.jsonl") if args.ci else None
        rows = run(scenarios, trials, args.seed, history, args.changes, otava, cost)
    headers = ["scenario", "row", *columns(otava is not None)]
    print(tabulate(rows, headers=headers, tablefmt="github"))
    if otava is None:
        print(f"\n(no Otava column: --no-otava; {OTAVA_BUILD} builds its venv)")
    else:
        print(
            f"\nOtava: Apache Otava {OTAVA_VERSION} ({otava}), `otava analyze`'s defaults, on "
            f"each night's whole series: {cost.analyses} analyses for {cost.trials} trials, "
            f"{cost.wall_s:.1f} s ({cost.wall_s / max(cost.trials, 1) * 1e3:.0f} ms a trial, "
            f"{cost.analysis_s / max(cost.analyses, 1) * 1e3:.1f} ms an analysis)"
        )
    print(
        f"\ndelays in nights from the change, median / 95th percentile (its 95 % Monte Carlo "
        f"interval); >{CHANGE_NIGHTS}: not flagged within {CHANGE_NIGHTS} nights. The new "
        f"rule's CUSUM is active after {REFERENCE} nights of reference (R=30: after 30).\n"
    )
    if args.no_first_night:
        print(f"({time.monotonic() - started:.0f} s)")
        return
    first = first_night(scenarios, first_trials, args.seed)
    print(
        "first night after a baseline recording (3 launches x 60 runs, run CV 4 % or a measured "
        "scenario's own, no history):"
    )
    print(tabulate(first, headers=["scenario", "change", "FAIL today (2 df)",
                                   "FAIL with the stated prior"], tablefmt="github"))  # fmt: skip
    for k in (3, 6):
        minutes = (k * LOAD_S + k * BASELINE_RUNS * RUN_S) / 60
        print(f"recording a baseline: {k} launches x {BASELINE_RUNS} runs = {minutes:.0f} GPU min")
    print(f"({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
