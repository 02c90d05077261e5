"""Detection across nights, by the night a drop lands after a new baseline (prints figures; not a
test). Issues #23 and #44.

Each trial is one check's life around an acknowledged change: ``--earlier`` nights of an earlier
regime (30 by default; 0: a box's first baseline, no history at all), then a baseline recorded
over 3 launches x 60 runs at a level 4 % higher (the accepted change, say an SGLang upgrade),
then one launch a night of up to 10 runs (run CV 3 %), lognormal at both levels. On the same
random nights, an unchanged build is followed for 120 nights (false alarms in nights 1-30,
31-60, 61-90 and 91-120 after the reset) and, for each change (-5, -10, -29 %) and each landing
night (1, 2, 3, 4, 5, 10, 30, 60, 91: the first changed night), the build is that much slower from
that night on for up to 28 nights (the nights before are the unchanged build's).

Everything a session does goes through the plugin's own code: every night is judged by
``stats.compare`` look by look with the sequential plan's alphas and the no-change guard spent
in proportion, with the launch prior the session uses (``night_series.launch_prior`` over the
history records, ``two_level.bridged`` with the stated prior while the history is short); each
night is written as a history record (the shape of ``outputs/history.history_record``, checked
by its parser; the baseline as a ``recorded`` line with its launches), and the cross-night
detector reads its series with ``night_series.series_from_history`` and judges it with
``crossnight.detect`` as the session configures it. The rules, on the same nights:

* **new**: the nightly gate OR the cross-night scan (``crossnight.detect``), watching from the
  first night after the baseline;
* **90-night rule**: the rule before issue 44: the gate with the history prior replacing the
  stated one from the third night, OR the CUSUM against a reference frozen after 90 nights
  (``benchmarks/previous_crossnight.py``, moved there unchanged);
* **Otava**: Apache Otava 0.8.0 itself (``otava analyze``'s defaults, E-divisive on windows of
  50 points, t-test at 0.001) on every prefix a nightly job would have, in a venv of its own
  (``scripts/provision-otava.sh``); a regression change point at most 5 nights before the
  landing counts; Otava knows no acknowledged change and reads the whole series;
* **oracle**: Page's CUSUM with the true level and noise of the new build from night 1 (the
  limit any detector of this k has), h for 3.5 % per 30 nights.

"Flagged within N nights" counts from the landing night (1 = the landing night itself) among
the trials in which the rule had not raised a cross-night alarm before the drop landed (an alarm
stays until acknowledged; the share left out is printed); a nightly FAIL does not stay. Monte
Carlo error: +-sqrt(p(1-p)/trials) on every rate.

    python benchmarks/bench_nightly.py [--trials 400] [--seed 1] [--earlier 30] [--jobs 2]
        [--only NAME] [--no-otava] [--ci] [--false-alarms-only]
    python benchmarks/bench_nightly.py --e2e   # the user's path, through pytest and the simulator

Scenarios: launch CV 3 % and 5 % at run CV 3 %, and the noise measured on one H200 at TP 1
(``tests/contract/data/h200_noise.json``, read at run time).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import binomtest
from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parent))

import nightly_e2e
import previous_crossnight

from pytest_specdecode.outputs.history import (
    HISTORY_SCHEMA_VERSION,
    append_history,
    parse_record,
    read_history,
)
from pytest_specdecode.settings import OPTIONS_BY_NAME
from pytest_specdecode.stats.comparison import Verdict, compare
from pytest_specdecode.stats.crossnight import DetectorConfig, detect
from pytest_specdecode.stats.night_series import launch_prior, series_from_history
from pytest_specdecode.stats.scan import clip_for
from pytest_specdecode.stats.sequential import SequentialPlan
from pytest_specdecode.stats.two_level import (
    STATED_LAUNCH_CV,
    STATED_PRIOR_DF,
    LaunchPrior,
    bridged,
    guard_alpha,
    prior_for,
    stated_prior,
)

LEVEL = 88.8  # tok/s, the seed's NCCL-tuned baseline
ACCEPTED = 0.04  # the accepted change at the reset: the new build is 4 % faster
MARGIN = -0.02
ALPHA = float(OPTIONS_BY_NAME["alpha"].default)
ALPHA_NO_CHANGE = float(OPTIONS_BY_NAME["alpha_no_change"].default)
RUNS = int(OPTIONS_BY_NAME["runs"].default)
MAX_RUNS = int(OPTIONS_BY_NAME["max_runs"].default)
BASELINE_RUNS = int(OPTIONS_BY_NAME["baseline_runs"].default)
BASELINE_LAUNCHES = 3
NEW = DetectorConfig(attribute=False, stated_launch_cv=STATED_LAUNCH_CV, stated_df=STATED_PRIOR_DF)
BEFORE = previous_crossnight.DetectorConfig(attribute=False)
LANDINGS = (1, 2, 3, 4, 5, 10, 30, 60, 91)
WITHIN = (7, 14, 28)
NULL_NIGHTS = 120
WINDOWS = ((1, 30), (31, 60), (61, 90), (91, 120))
CHANGES = (-0.05, -0.10, -0.29)
OTAVA_EARLY = 5  # a change point up to this many nights before the landing counts
OTAVA_VERSION = "0.8.0"
OTAVA_BRIDGE = Path(__file__).resolve().parent / "otava" / "bridge.py"
OTAVA_BUILD = "scripts/provision-otava.sh"
KEY = {"test_id": "bench::test_tok_s", "hardware_key": "sim", "fingerprint": "f",
       "workload_hash": "w"}  # fmt: skip
RULES = ("new", "90-night rule", "oracle")
SOURCES = ("new: the gate alone", "new: the scan alone")
"""The new rule's false alarms split by what raised them (the null path only)."""
OTAVA = "Otava"
START = datetime(2026, 1, 1, 3, 0, tzinfo=timezone.utc)


@dataclass(frozen=True)
class Scenario:
    """The noise of one box: the launch CV (lognormal launch effects) and the run CV."""

    name: str
    launch_cv: float
    run_cv: float

    def launches(self, rng: np.random.Generator, k: int, r: int) -> np.ndarray:
        offsets = rng.normal(0.0, math.sqrt(math.log1p(self.launch_cv**2)), (k, 1))
        run_sd = math.sqrt(math.log1p(self.run_cv**2))
        return LEVEL * np.exp(offsets + rng.normal(0.0, run_sd, (k, r)))


SCENARIOS = (Scenario("launch CV 3%", 0.03, 0.03), Scenario("launch CV 5%", 0.05, 0.03))
H200_NOISE = Path(__file__).resolve().parents[1] / "tests" / "contract" / "data" / "h200_noise.json"
MEASURED_H200 = {"noise-eagle3-2": "EAGLE3 2-step", "noise-nospec": "no speculation"}


def measured_h200(profile: str = "noise-eagle3-2") -> Scenario:
    """The H200's noise for ``profile``, read from the contract file now: the launch CV beyond
    what the runs explain and the pooled run CV inside a launch."""
    measured = json.loads(H200_NOISE.read_text(encoding="utf-8"))["profiles"][profile]
    return Scenario(
        f"measured H200 TP1 ({MEASURED_H200[profile]})",
        float(measured["launch_cv_beyond_runs"]),
        float(measured["run_cv_rms"]),
    )


# --------------------------------------------------------------------------- history lines


def _when(index: int) -> str:
    return (START + timedelta(days=index)).isoformat().replace("+00:00", "Z")


def night_record(
    index: int, runs: np.ndarray, verdict: str, baseline_mean: float
) -> dict[str, Any]:
    """One session's history line, in the shape ``history_record`` writes (the fields the
    readers use), checked by the history's own parser."""
    mean = float(runs.mean())
    record = {
        "schema_version": HISTORY_SCHEMA_VERSION,
        "time_utc": _when(index),
        "run_id": f"night-{index}",
        "tests": [{
            **KEY, "profile": "bench", "outcome": verdict,
            "metrics": {"tok_s": {"n": int(runs.size), "mean": mean,
                                  "cv": float(runs.std(ddof=1) / mean)}},
            "checks": [{"metric": "tok_s", "reference": None, "verdict": verdict,
                        "baseline_mean": baseline_mean, "ratio": mean / baseline_mean}],
        }],
    }  # fmt: skip
    return parse_record(json.dumps(record), where=f"night {index}")


def recorded_record(index: int, launches: np.ndarray) -> dict[str, Any]:
    """A ``--update-baselines`` session's line: outcome ``recorded``, every run and the runs of
    each launch (the detector's first points of the new level)."""
    values = launches.ravel()
    record = {
        "schema_version": HISTORY_SCHEMA_VERSION,
        "time_utc": _when(index),
        "run_id": f"baseline-{index}",
        "tests": [{
            **KEY, "profile": "bench", "outcome": "recorded",
            "metrics": {"tok_s": {"n": int(values.size), "mean": float(values.mean()),
                                  "cv": float(values.std(ddof=1) / values.mean())}},
            "checks": [], "samples": {"tok_s": [float(v) for v in values]},
            "launch_runs": [int(launches.shape[1])] * int(launches.shape[0]),
        }],
    }  # fmt: skip
    return parse_record(json.dumps(record), where=f"baseline {index}")


# --------------------------------------------------------------------------- the nightly gate


def gate(
    runs: np.ndarray, baseline: list[float], plan: SequentialPlan, prior: LaunchPrior | None
) -> tuple[Verdict, int]:
    """The night's verdict and the runs it took, look by look as ``measurement.py`` runs them
    (the guard from ``two_level.guard_alpha``, spent across the looks as alpha is)."""
    looks = plan.looks()
    guard = guard_alpha(ALPHA_NO_CHANGE, prior)
    verdict = Verdict.INCONCLUSIVE
    for index, n in enumerate(looks):
        look_alpha = plan.alpha_at(index)
        verdict = compare(
            list(runs[:n]), baseline, margin=MARGIN, alpha=look_alpha,
            launch_runs=[BASELINE_RUNS] * BASELINE_LAUNCHES, prior=prior,
            alpha_no_change=guard * look_alpha / ALPHA,
        ).verdict  # fmt: skip
        if verdict is not Verdict.INCONCLUSIVE:
            return verdict, n
    return verdict, looks[-1]


def priors(history: Sequence[dict[str, Any]]) -> tuple[LaunchPrior, LaunchPrior]:
    """The launch prior of the new rule (the history's, bridged with the stated prior while
    short) and of the rule before (the history's replacing the stated prior from 3 nights)."""
    measured = launch_prior(history, metric="tok_s", **KEY)
    before = prior_for(history, metric="tok_s", **KEY)
    stated = stated_prior(where="the project's default; docs/statistics.md")
    return bridged(measured, stated), before if before is not None else stated


# --------------------------------------------------------------------------- one trial


@dataclass(frozen=True)
class Oracle:
    level: float  # the true expected log night mean of the new build
    sd: float
    k: float
    h: float


def oracle_for(scenario: Scenario, seed: int) -> Oracle:
    """The known-noise CUSUM: the level and SD of a night's log mean by simulation (200,000
    nights), h for 3.5 % per 30 nights on 20,000 null paths."""
    rng = np.random.default_rng([seed, 99])
    nights = np.log(scenario.launches(rng, 200_000, MAX_RUNS).mean(axis=1) * (1 + ACCEPTED))
    level, sd = float(nights.mean()), float(nights.std())
    k = abs(math.log1p(-NEW.min_change)) / (2 * sd)
    clip = clip_for(k)
    z = np.clip(rng.standard_normal((20_000, 30)), -clip, clip)
    s, peak = np.zeros(z.shape[0]), np.zeros(z.shape[0])
    for t in range(30):
        s = np.maximum(0.0, s - z[:, t] - k)
        peak = np.maximum(peak, s)
    return Oracle(level, sd, k, max(float(np.quantile(peak, 1 - NEW.false_alarm)), clip - k))


@dataclass
class Branch:
    """The nights after the reset on one path: the history as the readers see it, and each
    rule's first flag (1-based night after the reset)."""

    history: list[dict[str, Any]]
    baseline: list[float]
    baseline_mean: float
    oracle_s: float = 0.0
    judge_before: bool = True  # the rule before too (its gate and detector are half the cost)
    first: dict[str, int | None] = field(default_factory=lambda: dict.fromkeys((*RULES, *SOURCES)))
    alarmed: dict[str, int | None] = field(default_factory=lambda: dict.fromkeys(RULES))
    history_file: Path | None = None

    def night(self, night: int, runs: np.ndarray, plan: SequentialPlan, oracle: Oracle,
              offset: int) -> set[str]:  # fmt: skip
        """Judge one night on this path; the rules that flagged it."""
        new_prior, old_prior = priors(self.history)
        verdict, n = gate(runs, self.baseline, plan, new_prior)
        old_fail = False  # the rule before, where it is judged: its own gate
        if self.judge_before:
            old = verdict
            if old_prior is not new_prior:
                old = gate(runs, self.baseline, plan, old_prior)[0]
            old_fail = old is Verdict.FAIL
        record = night_record(offset + night, runs[:n], verdict.value, self.baseline_mean)
        self.history.append(record)
        if self.history_file is not None:  # through a real file, as a session appends it
            append_history(self.history_file, record)
            self.history[:] = read_history(self.history_file)
        series = series_from_history(self.history, metric="tok_s", **KEY)
        new_alarm = detect(series, NEW).alarm
        old_alarm = self.judge_before and previous_crossnight.detect(series, BEFORE).alarm
        z = (math.log(float(runs[:n].mean())) - oracle.level) / oracle.sd
        z = max(-clip_for(oracle.k), min(clip_for(oracle.k), z))
        self.oracle_s = max(0.0, self.oracle_s - z - oracle.k)
        gate_fail = verdict is Verdict.FAIL
        flags = {  # (flagged tonight, a cross-night alarm tonight); the sources: null path only
            "new": (gate_fail or new_alarm, new_alarm),
            "90-night rule": (old_fail or old_alarm, old_alarm),
            "oracle": (self.oracle_s > oracle.h, self.oracle_s > oracle.h),
            SOURCES[0]: (gate_fail, False),
            SOURCES[1]: (new_alarm, False),
        }
        for rule, (flagged, alarm) in flags.items():
            if flagged and self.first[rule] is None:
                self.first[rule] = night
            if alarm and self.alarmed[rule] is None:
                self.alarmed[rule] = night
        return {rule for rule in RULES if flags[rule][0]}

    def fork(self) -> Branch:
        return Branch(list(self.history), self.baseline, self.baseline_mean, self.oracle_s,
                      self.judge_before, dict(self.first), dict(self.alarmed))  # fmt: skip


@dataclass
class TrialResult:
    null_first: dict[str, int | None]  # first flag on the unchanged path, 1-based night
    delays: dict[tuple[float, int], dict[str, int | str | None]]  # "alarmed": left out
    otava_series: list[tuple[list[float], int, int]]  # (values, monitored_from, counts_from)
    otava_keys: list[tuple[float, int] | None]  # None: the null path


def trial(scenario: Scenario, earlier: int, seed: int, index: int, oracle: Oracle,
          plan: SequentialPlan, changes: Sequence[float], landings: Sequence[int],
          null_nights: int, history_file: Path | None = None,
          comparators: bool = True) -> TrialResult:  # fmt: skip
    """One check's nights around a reset (module docstring), every rule on the same nights.
    ``comparators=False``: a changed path stops once the new rule and the oracle have flagged
    (the rule before and Otava are judged on the first ``--comparator-trials`` trials only:
    the rule before rarely flags a small drop within 28 nights, so its nights are most of the
    cost)."""
    watched = RULES if comparators else ("new", "oracle")
    longest = max(null_nights, max(landings, default=0) + max(WITHIN) - 1)
    drawn = draw(scenario, earlier, seed, index, longest)
    history: list[dict[str, Any]] = []
    if earlier:
        history.append(recorded_record(0, drawn.first_base))
        for night, runs in enumerate(drawn.earlier, start=1):
            record = night_record(night, runs, "inconclusive", float(drawn.first_base.mean()))
            history.append(record)
    base, draws = drawn.base, drawn.nights
    offset = earlier + 1
    history.append(recorded_record(offset, base))
    path = Branch(
        history,
        list(base.ravel()),
        float(base.mean()),
        judge_before=comparators,
        history_file=history_file,
    )
    snapshots: dict[int, Branch] = {}
    for night in range(1, null_nights + 1):
        if night in landings:
            snapshots[night] = path.fork()
        path.night(night, draws[night - 1], plan, oracle, offset)
    otava, keys = otava_inputs(drawn, changes, landings, null_nights) if comparators else ([], [])
    delays: dict[tuple[float, int], dict[str, int | str | None]] = {}
    for change in changes:
        for landing in landings:
            start = snapshots[landing]
            branch = start.fork()
            result: dict[str, int | str | None] = {}
            for rule in RULES:
                if start.alarmed[rule] is not None:
                    result[rule] = "alarmed"
            for night in range(landing, landing + max(WITHIN)):
                if all(rule in result for rule in watched):
                    break
                # The first flag on or after the landing: a nightly FAIL before it (a false
                # one on the unchanged nights) does not stay, so it neither counts nor hides
                # a later flag (it did until 2026-12-07: such trials counted as never flagged).
                tonight = branch.night(night, draws[night - 1] * (1 + change), plan, oracle, offset)
                for rule in RULES:
                    if rule not in result and rule in tonight:
                        result[rule] = night - landing + 1
            for rule in RULES:
                result.setdefault(rule, None if rule in watched else "skipped")
            delays[change, landing] = result
    return TrialResult(path.first, delays, otava, keys)


@dataclass(frozen=True)
class Drawn:
    """The random nights of one trial: the earlier regime's baseline and nights, the new
    baseline, and every night after the reset (unchanged; a drop multiplies them)."""

    first_base: np.ndarray
    earlier: list[np.ndarray]
    base: np.ndarray
    nights: np.ndarray


def draw(scenario: Scenario, earlier: int, seed: int, index: int, longest: int) -> Drawn:
    """Trial ``index``'s nights, seeded by the trial alone (not by the chunk that runs it)."""
    rng = np.random.default_rng([seed, round(scenario.launch_cv * 1e4), earlier, index])
    first_base = np.zeros((0, 0))
    before = []
    if earlier:
        first_base = scenario.launches(rng, BASELINE_LAUNCHES, BASELINE_RUNS)
        before = [scenario.launches(rng, 1, MAX_RUNS)[0] for _ in range(earlier)]
    base = scenario.launches(rng, BASELINE_LAUNCHES, BASELINE_RUNS) * (1 + ACCEPTED)
    nights = scenario.launches(rng, longest, MAX_RUNS) * (1 + ACCEPTED)
    return Drawn(first_base, before, base, nights)


def otava_inputs(
    drawn: Drawn, changes: Sequence[float], landings: Sequence[int], null_nights: int
) -> tuple[list[tuple[list[float], int, int]], list[tuple[float, int] | None]]:
    """What Otava is given for one trial: the nightly means (10 runs each) of the unchanged
    path and of each changed one, with the first monitored index and the first index a change
    point counts from; and the (change, landing) each series is for (None: unchanged)."""
    before = [float(runs.mean()) for runs in drawn.earlier]
    at0 = len(before)
    series = [([*before, *(float(d.mean()) for d in drawn.nights[:null_nights])], at0, at0)]
    keys: list[tuple[float, int] | None] = [None]
    for change in changes:
        for landing in landings:
            end = landing - 1 + max(WITHIN)
            unchanged = [float(d.mean()) for d in drawn.nights[: landing - 1]]
            changed = [float(d.mean()) * (1 + change) for d in drawn.nights[landing - 1 : end]]
            at = at0 + landing - 1
            series.append(([*before, *unchanged, *changed], at, max(at0, at - OTAVA_EARLY)))
            keys.append((change, landing))
    return series, keys


# --------------------------------------------------------------------------- Otava


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


def otava_first(python: Path, series: Sequence[tuple[list[float], int, int]]) -> list[int | None]:
    """For each (nightly means, index of the first monitored night, first index a change point
    counts from): the first monitored night (1-based) Otava flags, by one run of ``bridge.py``
    under Otava's interpreter for all of them."""
    request = {
        "series": [[float(v) for v in values] for values, _, _ in series],
        "monitored_from": [at for _, at, _ in series],
        "counts_from": [counts for _, _, counts in series],
    }
    done = subprocess.run(
        [str(python), str(OTAVA_BRIDGE)], input=json.dumps(request), capture_output=True,
        text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{OTAVA_BRIDGE.name} under {python} failed:\n{done.stderr}")
    first = [None if n is None else int(n) for n in json.loads(done.stdout)["first"]]
    if len(first) != len(series):
        raise SystemExit(f"{OTAVA_BRIDGE.name} answered {len(first)} series of {len(series)}")
    return first


# --------------------------------------------------------------------------- tables


def rate(hits: int, n: int) -> str:
    if n == 0:
        return "-"
    p = hits / n  # one decimal: a budget of 5 % is judged against figures like 4.6 and 5.4
    return f"{p:.1%} ±{math.sqrt(max(p * (1 - p), 1 / n) / n):.1%}"


def within_cell(delays: Sequence[int | str | None]) -> str:
    """P(flagged within 7 / 14 / 28 nights) among the trials not alarmed before the landing."""
    judged = [d for d in delays if d not in ("alarmed", "skipped")]
    if not judged:
        return "-"
    parts = [
        f"{sum(1 for d in judged if isinstance(d, int) and d <= n) / len(judged):.0%}"
        for n in WITHIN
    ]
    return " / ".join(parts)


def delay_cell(delays: Sequence[int | str | None]) -> str:
    """Median and 95th percentile of the delay (nights from the landing, 1 = that night)."""
    judged = sorted(
        d if isinstance(d, int) else math.inf for d in delays if d not in ("alarmed", "skipped")
    )
    if not judged:
        return "-"

    def at(q: float) -> str:
        value = judged[min(len(judged) - 1, math.ceil(q * len(judged)) - 1)]
        return f">{max(WITHIN)}" if math.isinf(value) else f"{value:.0f}"

    return f"{at(0.5)} / {at(0.95)}"


def false_alarm_cells(
    firsts: Sequence[int | None], windows: Sequence[tuple[int, int]]
) -> list[str]:
    """P(first flag in each window | none before it), as the share of checks, with its
    one-sided 95 % upper bound (Wilson): the budget is a limit, and 400 trials cannot tell
    4.5 % from 5.5 %."""
    cells = []
    for low, high in windows:
        at_risk = [f for f in firsts if f is None or f >= low]
        hits = sum(1 for f in at_risk if f is not None and f <= high)
        cell = rate(hits, len(at_risk))
        if at_risk:
            bound = binomtest(hits, len(at_risk)).proportion_ci(0.90, method="wilson").high
            cell += f" <={bound:.1%}"
        cells.append(cell)
    return cells


@dataclass(frozen=True)
class Job:
    """A chunk of one row's trials: ``trials`` of them from trial index ``first``."""

    scenario: Scenario
    earlier: int
    trials: int
    seed: int
    changes: tuple[float, ...]
    landings: tuple[int, ...]
    null_nights: int
    otava: Path | None
    history_dir: str | None
    comparator_trials: int
    first: int = 0

    @property
    def row(self) -> tuple[str, int]:
        return self.scenario.name, self.earlier


def result_json(result: TrialResult) -> dict[str, Any]:
    return {
        "null_first": result.null_first,
        "delays": [[change, landing, rules] for (change, landing), rules in result.delays.items()],
        "otava_series": result.otava_series,
        "otava_keys": result.otava_keys,
    }


def result_from_json(data: dict[str, Any]) -> TrialResult:
    return TrialResult(
        dict(data["null_first"]),
        {(float(c), int(n)): dict(rules) for c, n, rules in data["delays"]},
        [(list(v), int(a), int(b)) for v, a, b in data["otava_series"]],
        [None if k is None else (float(k[0]), int(k[1])) for k in data["otava_keys"]],
    )


def run_job(job: Job) -> tuple[Job, list[TrialResult], float]:
    """The trials of one chunk (the trial index, not the chunk, seeds each trial: the figures
    do not depend on how the trials are split among processes)."""
    started = time.monotonic()
    plan = SequentialPlan(initial_runs=RUNS, max_runs=MAX_RUNS, alpha=ALPHA).for_baseline(
        BASELINE_LAUNCHES * BASELINE_RUNS
    )
    oracle = oracle_for(job.scenario, job.seed)
    results = []
    for index in range(job.first, job.first + job.trials):
        file = (
            Path(job.history_dir) / f"{job.earlier}-{index}.jsonl"
            if job.history_dir and index == 0
            else None
        )
        results.append(trial(job.scenario, job.earlier, job.seed, index, oracle, plan,
                             job.changes, job.landings, job.null_nights, file,
                             index < job.comparator_trials))  # fmt: skip
    return job, results, time.monotonic() - started


def judge_otava(python: Path, results: Sequence[TrialResult]) -> None:
    """Otava's first flags for a row's comparator trials, in one run of the bridge."""
    flat = [item for r in results for item in r.otava_series]
    found = iter(otava_first(python, flat))
    for r in results:
        for key in r.otava_keys:  # the comparator trials' (the others have none)
            night = next(found)
            if key is None:
                r.null_first[OTAVA] = night
            else:
                r.delays[key][OTAVA] = night


def chunks(job: Job, count: int) -> list[Job]:
    """``job``'s trials in ``count`` chunks of consecutive trial indices."""
    size = math.ceil(job.trials / count)
    return [replace(job, first=start, trials=min(size, job.trials - start))
            for start in range(0, job.trials, size)]  # fmt: skip


def tables(job: Job, results: Sequence[TrialResult]) -> tuple[list[list[str]], list[list[str]]]:
    rules = [*RULES, *([OTAVA] if job.otava is not None else [])]
    history = f"{job.earlier} earlier nights" if job.earlier else "no history"
    where = f"{job.scenario.name}, {history}"
    windows = [w for w in WINDOWS if w[1] <= job.null_nights]
    false_rows = [
        [where, rule, *false_alarm_cells([r.null_first.get(rule) for r in results[:n]], windows)]
        for rule in [*rules, *SOURCES]
        for n in [job.comparator_trials if rule in ("90-night rule", OTAVA) else len(results)]
    ]
    landing_rows = []
    for change in job.changes:
        for landing in job.landings:
            cells = []
            for rule in rules:
                delays = [r.delays[change, landing].get(rule) for r in results]
                left = sum(1 for d in delays if d == "alarmed")
                cells.append(f"{within_cell(delays)} ({delay_cell(delays)})"
                             + (f" [{left} out]" if left else ""))  # fmt: skip
            landing_rows.append([where, f"{change:+.0%}", landing, *cells])
    return false_rows, landing_rows


# targets of issue 44: (launch CV, change, landing nights, within, probability, history needed)
TARGETS = (
    ("launch CV 3%", -0.10, (1, 2, 3, 5, 10, 30, 60, 91), 7, 0.90),
    ("launch CV 3%", -0.05, (2,), 28, 0.70),
    ("launch CV 3%", -0.05, (10, 30, 60, 91), 14, 0.90),
    ("launch CV 5%", -0.10, (2,), 14, 0.75),
    ("launch CV 5%", -0.10, (5, 10, 30, 60, 91), 14, 0.90),
    ("launch CV 5%", -0.05, (10, 30, 60, 91), 28, 0.75),
    ("launch CV 5%", -0.29, (1, 4), 1, 0.95),
)


def target_rows(done: Sequence[tuple[Job, list[TrialResult]]]) -> list[list[str]]:
    """Each target of issue 44 against the new rule's figure, in every history condition run."""
    rows = []
    for job, results in done:
        where = "no history" if not job.earlier else f"{job.earlier} earlier nights"
        for name, change, landings, within, wanted in TARGETS:
            if job.scenario.name != name or change not in job.changes:
                continue
            for landing in landings:
                if landing not in job.landings:
                    continue
                delays = [r.delays[change, landing]["new"] for r in results]
                judged = [d for d in delays if d != "alarmed"]
                hits = sum(1 for d in judged if isinstance(d, int) and d <= within)
                p = hits / len(judged) if judged else 0.0
                rows.append([name, where, f"{change:+.0%}", landing, within,
                             f">= {wanted:.0%}", rate(hits, len(judged)),
                             "met" if p >= wanted else "MISSED"])  # fmt: skip
    return rows


def simulate(
    jobs: Sequence[Job], processes: int, save: Path | None
) -> list[tuple[Job, list[TrialResult], float]]:
    """Run the chunks (in ``processes`` processes), each saved to ``save`` as it ends (a JSON
    line: what was run and its trials, so a run cut short keeps what it did), and put each
    row's chunks back together in trial order."""
    finished: list[tuple[Job, list[TrialResult], float]] = []

    def keep(item: tuple[Job, list[TrialResult], float]) -> None:
        finished.append(item)
        if save is not None:
            job, results, cost = item
            line = {"job": {**{k: getattr(job, k) for k in ("earlier", "trials", "seed",
                    "changes", "landings", "null_nights", "comparator_trials", "first")},
                    "scenario": vars(job.scenario)}, "cost": cost,
                    "results": [result_json(r) for r in results]}  # fmt: skip
            with save.open("a") as handle:
                handle.write(json.dumps(line) + "\n")

    if processes > 1:
        with multiprocessing.Pool(processes) as pool:
            for item in pool.imap_unordered(run_job, jobs):
                keep(item)
    else:
        for job in jobs:
            keep(run_job(job))
    return merged(finished)


def load(paths: Sequence[Path]) -> list[tuple[Job, list[TrialResult], float]]:
    """Chunks saved with ``--save`` (by this machine or another, e.g. a lent GPU machine's 16
    cores), put back together per row."""
    finished = []
    for path in paths:
        for text in path.read_text().splitlines():
            data = json.loads(text)
            meta = data["job"]
            job = Job(Scenario(**meta["scenario"]), meta["earlier"], meta["trials"], meta["seed"],
                      tuple(meta["changes"]), tuple(meta["landings"]), meta["null_nights"], None,
                      None, meta["comparator_trials"], meta["first"])  # fmt: skip
            finished.append((job, [result_from_json(r) for r in data["results"]], data["cost"]))
    return merged(finished)


def merged(
    finished: Sequence[tuple[Job, list[TrialResult], float]],
) -> list[tuple[Job, list[TrialResult], float]]:
    rows: dict[tuple[str, int], list[tuple[Job, list[TrialResult], float]]] = {}
    for item in finished:
        rows.setdefault(item[0].row, []).append(item)
    out = []
    for parts in rows.values():
        parts.sort(key=lambda item: item[0].first)
        results = [r for _, chunk, _ in parts for r in chunk]
        job = replace(parts[0][0], first=0, trials=len(results))
        out.append((job, results, sum(cost for _, _, cost in parts)))
    return out


def otava_only(job: Job, python: Path) -> tuple[list[list[str]], list[list[str]]]:
    """Otava's column alone for a row's comparator trials: their nights drawn again (the same
    streams as ``trial``; no rule is run) and judged by Otava here. For a row simulated on
    another machine (``--save`` files over the device's size limit did not come back)."""
    longest = max(job.null_nights, max(job.landings) + max(WITHIN) - 1)
    results = []
    for index in range(job.comparator_trials):
        drawn = draw(job.scenario, job.earlier, job.seed, index, longest)
        series, keys = otava_inputs(drawn, job.changes, job.landings, job.null_nights)
        delays: dict[tuple[float, int], dict[str, int | str | None]] = {
            key: {} for key in keys if key is not None
        }
        results.append(TrialResult({}, delays, series, keys))
    judge_otava(python, results)
    for r in results:  # Otava's first flag, counted from the landing night as every rule's
        for (_change, _landing), rules in r.delays.items():
            night = rules.get(OTAVA)
            rules[OTAVA] = None if night is None or night > max(WITHIN) else night
    history = f"{job.earlier} earlier nights" if job.earlier else "no history"
    where = f"{job.scenario.name}, {history}"
    windows = [w for w in WINDOWS if w[1] <= job.null_nights]
    false_rows = [[where, OTAVA, *false_alarm_cells([r.null_first.get(OTAVA) for r in results],
                                                    windows)]]  # fmt: skip
    landing_rows = [
        [where, f"{change:+.0%}", landing,
         within_cell([r.delays[change, landing].get(OTAVA) for r in results])
         + f" ({delay_cell([r.delays[change, landing].get(OTAVA) for r in results])})"]
        for change in job.changes for landing in job.landings
    ]  # fmt: skip
    return false_rows, landing_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=400)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--earlier", type=int, nargs="+", default=[30, 0],
                        help="nights of an earlier regime before the reset (0: none)")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=1, help="processes (rows run in parallel)")
    parser.add_argument("--chunks", type=int, default=1,
                        help="split each row's trials into this many chunks")  # fmt: skip
    parser.add_argument("--save", type=Path, metavar="PATH",
                        help="append each chunk's trials to PATH as it ends")  # fmt: skip
    parser.add_argument("--load", type=Path, nargs="+", metavar="PATH",
                        help="instead of simulating: the chunks saved with --save, judged by "
                        "Otava here when its venv is, and printed")  # fmt: skip
    parser.add_argument("--otava-only", action="store_true",
                        help="only Otava's column, for the comparator trials (their nights are "
                        "drawn again, no rule is run)")  # fmt: skip
    parser.add_argument("--comparator-trials", type=int, default=100,
                        help="trials on which the rule before and Otava are judged too "
                        "(default 100; the new rule and the oracle: every trial)")  # fmt: skip
    parser.add_argument("--ci", action="store_true", help="a small, quick configuration")
    parser.add_argument("--changes", type=float, nargs="+", default=list(CHANGES))
    parser.add_argument("--landings", type=int, nargs="+", default=list(LANDINGS))
    parser.add_argument("--only", action="append", default=[], metavar="NAME")
    parser.add_argument("--false-alarms-only", action="store_true",
                        help="only the unchanged nights (no drop, no landing night): the "
                        "false-alarm table with more trials for the same time")  # fmt: skip
    parser.add_argument("--no-otava", action="store_true")
    parser.add_argument("--otava-python", type=Path, metavar="PATH")
    parser.add_argument("--e2e", action="store_true",
                        help="instead: the user's path through pytest and the simulator "
                        "(nightly_e2e.py)")  # fmt: skip
    args, rest = parser.parse_known_args()
    if args.e2e:
        raise SystemExit(nightly_e2e.main(rest))
    if rest:
        parser.error(f"unrecognised arguments: {' '.join(rest)}")
    scenarios = [*SCENARIOS, measured_h200("noise-eagle3-2"), measured_h200("noise-nospec")]
    if args.only:
        unknown = sorted(set(args.only) - {s.name for s in scenarios})
        if unknown:
            parser.error(
                f"--only {unknown}: no such scenario; there are {[s.name for s in scenarios]}"
            )
        scenarios = [s for s in scenarios if s.name in args.only]
    trials, landings, changes, null_nights = args.trials, args.landings, args.changes, NULL_NIGHTS
    if args.ci:
        trials, landings, changes, null_nights = 3, [1, 10], [-0.10, -0.29], 40
        scenarios = [s for s in scenarios if s.name in ("launch CV 5%", measured_h200().name)]
    if args.false_alarms_only:
        landings, changes = [], []
    otava: Path | None = None
    if not args.no_otava:
        otava = otava_python(args.otava_python)
        why = otava_missing(otava)
        if why is not None:
            raise SystemExit(
                f"{why}\nThe Otava column runs Apache Otava {OTAVA_VERSION} in a venv of its own. "
                f"Build it once (seconds, three wheels) with\n    {OTAVA_BUILD}\nor give its "
                "interpreter with --otava-python PATH, or leave the column out with --no-otava."
            )
    started = time.monotonic()
    if args.otava_only:
        if otava is None:
            parser.error("--otava-only needs Otava's venv")
        comparator = min(trials, args.comparator_trials)
        rows = [otava_only(Job(s, e, trials, args.seed, tuple(changes), tuple(landings),
                               null_nights, otava, None, comparator), otava)
                for s in scenarios for e in args.earlier]  # fmt: skip
        windows = [f"nights {a}-{b}" for a, b in WINDOWS if b <= null_nights]
        print(f"Apache Otava {OTAVA_VERSION}, `otava analyze`'s defaults, on the nights of the "
              f"first {comparator} trials of each row (seed {args.seed})\n")  # fmt: skip
        print(tabulate([r for f, _ in rows for r in f], headers=["scenario", "rule", *windows],
                       tablefmt="github"))  # fmt: skip
        print()
        print(tabulate([r for _, lr in rows for r in lr],
                       headers=["scenario", "change", "lands on night", OTAVA],
                       tablefmt="github"))  # fmt: skip
        print(f"\n({time.monotonic() - started:.0f} s)")
        return
    if args.load:
        done = load(args.load)
        trials = max(job.trials for job, _, _ in done)
        comparator = max(job.comparator_trials for job, _, _ in done)
        null_nights = done[0][0].null_nights
        changes = sorted({change for job, _, _ in done for change in job.changes})
        args.seed = done[0][0].seed  # the header names the nights that were run
    else:
        comparator = min(trials, args.comparator_trials)
        with tempfile.TemporaryDirectory() as directory:
            jobs = [Job(s, e, trials, args.seed, tuple(changes), tuple(landings), null_nights,
                        None, directory if args.ci else None, comparator)
                    for s in scenarios for e in args.earlier]  # fmt: skip
            done = simulate([c for job in jobs for c in chunks(job, args.chunks)], args.jobs,
                            args.save)  # fmt: skip
    if otava is not None:
        for _, results, _ in done:
            judge_otava(otava, results)
    done = [(replace(job, otava=otava), results, cost) for job, results, cost in done]
    print(
        f"one launch of {RUNS}..{MAX_RUNS} runs a night, run CV 3% (measured scenarios: their "
        f"own), margin {MARGIN:+.0%}; a baseline of {BASELINE_LAUNCHES} launches x "
        f"{BASELINE_RUNS} runs at a level {ACCEPTED:+.0%} from the earlier regime's; new rule: "
        f"the gate OR the cross-night scan (false alarms {NEW.false_alarm:.1%} per "
        f"{NEW.horizon} nights); {trials} trials per row for the new rule and the oracle, "
        f"{comparator} for the rule before and Otava; seed {args.seed}. Every figure is "
        "simulated (seeded nights through the plugin's statistics; no server, no GPU).\n"
    )
    rules = [*RULES, *([OTAVA] if otava is not None else [])]
    windows = [f"nights {a}-{b}" for a, b in WINDOWS if b <= null_nights]
    false_rows = [row for job, results, _ in done for row in tables(job, results)[0]]
    print("false alarms: the share of checks with a false flag in each window after the reset "
          "(among those with none before it), +- its standard error, <= its one-sided 95% "
          "upper bound")  # fmt: skip
    print(tabulate(false_rows, headers=["scenario", "rule", *windows], tablefmt="github"))
    if not changes:
        print(f"\n({time.monotonic() - started:.0f} s; the unchanged nights only)")
        return
    landing_rows = [row for job, results, _ in done for row in tables(job, results)[1]]
    print(
        "\nflagged within 7 / 14 / 28 nights of the landing night (median / p95 delay; "
        f">{max(WITHIN)}: not within {max(WITHIN)}); [n out]: trials alarmed before the landing"
    )
    print(tabulate(landing_rows, headers=["scenario", "change", "lands on night", *rules],
                   tablefmt="github"))  # fmt: skip
    print("\nthe targets of issue 44 (the new rule):")
    print(tabulate(target_rows([(j, r) for j, r, _ in done]),
                   headers=["scenario", "history", "change", "lands on night", "within",
                            "target", "measured", ""], tablefmt="github"))  # fmt: skip
    cost = ", ".join(f"{j.scenario.name}/{j.earlier}: {s:.0f} s" for j, _, s in done)
    print(f"\n({time.monotonic() - started:.0f} s; {cost})")


if __name__ == "__main__":
    main()
