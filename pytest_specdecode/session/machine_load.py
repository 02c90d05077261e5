"""How busy this machine's CPUs were while a test measured, and when two such figures differ
enough to matter.

A busy machine lowers measured tok/s even where the server keeps its own schedule: the client's
HTTP and stream parsing, the server's request handling and the wake-ups between them all wait
for a CPU. ``benchmarks/bench_sim_load.py`` measured it with the simulated server on a 2-core
machine: the simulator's own schedule stayed exact (0.00% from its model under 8 busy loops),
while the plugin's tok/s dropped by 0.25-0.5% per extra runnable task per CPU (the client's
per-request overhead grew from about 6 to 11-18 ms). On a GPU box the same holds for a real server's
tokenizer, scheduler and detokenizer processes. That cannot be removed from a client-side
measurement, so it is recorded with every baseline and run (``provenance["machine_load"]``)
and a comparison across very different loads is warned about (:func:`load_warning`).

The figure compared is the **run queue per CPU** over the measured runs: the mean number of
runnable tasks (``/proc/loadavg``'s running count, sampled every half second by a thread, the
sampling thread itself left out) divided by ``os.cpu_count()``. It counts the server and
client being measured too, which the baseline and the run share. Where there is no
``/proc/loadavg`` (not Linux) the 1-minute load average at the end of the runs stands in; it
lags (a load that started 20 s ago shows at about a third). Also recorded, for readers: the
load averages, and the share of all CPUs' time that was busy and that a hypervisor stole.

The rule (:func:`loads_differ`): warn when the run queues differ by at least
:data:`LOAD_DIFFERENCE` runnable tasks per CPU and the busier of the two exceeded
:data:`SATURATED` (more runnable tasks than CPUs: tasks waited for a CPU). Below saturation
every task finds a CPU and no effect was measurable; at the threshold the measured effect is
0.25-0.5% of tok/s with bare CPU spinners (similar with memory-copying ones), a third of a
typical run-to-run CV and a tenth of a 3% margin, so that smaller differences would warn about
noise. Real loads (compilers, test suites) can cost more per task than the benchmark's loops.

**A FAIL the load could explain is not called** (:func:`held_back_by_load`): where the rule
holds and tonight's runs were the busier side, a timed check that FAILs by less than the load
could cost is INCONCLUSIVE instead, saying why. The cost allowed is
:data:`MAX_COST_PER_TASK` of the metric per runnable task per CPU beyond the baseline's: the
average measured was 0.25-0.5 %, but beside two busy loops on a 2-core box the main job once
measured a profile 8.7 % slow at 4.9 runnable tasks per CPU (its baseline: 0.11) with nothing
changed in the build (``benchmarks/bench_busy_main_job.py``), 1.8 % per task. A FAIL whose
interval lies wholly beyond that allowance (a 30 % slower build on a busy box) stands. A busy
*baseline* only hides slowdowns, so nothing is held back for it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import TracebackType

from pytest_specdecode.stats.comparison import Verdict
from pytest_specdecode.verdict import BaselineRef, Check, Threshold

LOAD_DIFFERENCE = 1.0
"""Runnable tasks per CPU by which a run's load must differ from its baseline's to warn."""

SATURATED = 1.0
"""Runnable tasks per CPU above which tasks wait for a CPU; the busier side must exceed it."""

MAX_COST_PER_TASK = 0.02
"""The most a runnable task per CPU beyond the baseline's is taken to cost a timed metric (a
share of it): above the worst measured, 1.8 % (module docstring)."""

MAX_COST = 0.25
"""However busy the machine, a FAIL by more than this share beyond its margin stands."""

SAMPLE_SECONDS = 0.5

COUNTED_METRICS = frozenset({"accept_length", "spec_accept_length"})
"""Metrics that count tokens rather than time them: a busy CPU does not move them."""


def read_running() -> int | None:
    """Runnable tasks on the machine now (``/proc/loadavg``), or None where it is absent."""
    try:
        with open("/proc/loadavg", encoding="ascii") as handle:
            return int(handle.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return None


def read_loadavg() -> tuple[float, float, float] | None:
    try:
        return os.getloadavg()
    except (OSError, AttributeError):  # AttributeError: no getloadavg on Windows
        return None


def read_cpu_times() -> tuple[int, int, int] | None:
    """(idle + iowait, steal, total) jiffies of all CPUs from ``/proc/stat``, or None."""
    try:
        with open("/proc/stat", encoding="ascii") as handle:
            fields = [int(v) for v in handle.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    if len(fields) < 8:
        return None
    return fields[3] + fields[4], fields[7], sum(fields)


def cpu_count() -> int:
    return os.cpu_count() or 1


@dataclass(frozen=True)
class MachineLoad:
    """The machine's load over one test's measured runs (see the module docstring)."""

    cpus: int
    runnable_per_cpu: float | None
    loadavg: tuple[float, float, float] | None
    cpu_busy: float | None
    cpu_steal: float | None
    seconds: float
    declared: bool = False
    """Given by ``--specdecode-machine-load LOAD`` rather than measured."""

    @property
    def per_cpu(self) -> float | None:
        """The figure the rule compares: the run queue per CPU, else the 1-minute load average
        per CPU, else None (nothing known)."""
        if self.runnable_per_cpu is not None:
            return self.runnable_per_cpu
        if self.loadavg is not None:
            return self.loadavg[0] / self.cpus
        return None

    def describe(self) -> str:
        figure = self.per_cpu
        what = "runnable tasks per CPU" if self.runnable_per_cpu is not None else "load per CPU"
        text = "unknown" if figure is None else f"{figure:.2f} {what}"
        how = ", as declared" if self.declared else ""
        return f"{text} ({self.cpus} CPUs{how})"

    def to_json(self) -> dict[str, object]:
        return {
            "cpus": self.cpus,
            "runnable_per_cpu": _rounded(self.runnable_per_cpu),
            "loadavg": None if self.loadavg is None else [round(v, 2) for v in self.loadavg],
            "cpu_busy": _rounded(self.cpu_busy),
            "cpu_steal": _rounded(self.cpu_steal),
            "seconds": round(self.seconds, 1),
            "declared": self.declared,
        }

    @classmethod
    def from_json(cls, data: object) -> MachineLoad | None:
        """The load a baseline recorded, or None: baselines before this field, or a value
        written by hand that is not what :meth:`to_json` writes."""
        if not isinstance(data, Mapping):
            return None
        try:
            cpus = int(data["cpus"])
            stored = data.get("loadavg")
            loadavg = None
            if stored is not None:
                loadavg = (float(stored[0]), float(stored[1]), float(stored[2]))
            return cls(
                cpus=max(1, cpus),
                runnable_per_cpu=_number(data.get("runnable_per_cpu")),
                loadavg=loadavg,
                cpu_busy=_number(data.get("cpu_busy")),
                cpu_steal=_number(data.get("cpu_steal")),
                seconds=float(data.get("seconds") or 0.0),
                declared=data.get("declared") is True,
            )
        except (KeyError, TypeError, ValueError, IndexError):
            return None


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _number(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, (int, float, str)):
        return float(value)
    raise TypeError(f"not a number: {value!r}")


class LoadSampler:
    """Samples the run queue while measuring: ``with LoadSampler() as sampler: ...``, then
    :meth:`result`. One sample is taken at the start and one at the end, so even a run shorter
    than the sampling interval has a figure. The reader functions are looked up at call time,
    so tests can replace them on the module."""

    def __init__(self, mode: float | str = "measure", interval: float = SAMPLE_SECONDS) -> None:
        """``mode``: ``"measure"``, ``"off"`` (:meth:`result` is None) or a declared load in
        runnable tasks per CPU (recorded as given, nothing sampled)."""
        self._mode = mode
        self._interval = interval
        self._samples: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cpu_start: tuple[int, int, int] | None = None
        self._started = 0.0
        self._result: MachineLoad | None = None

    def _sample(self) -> None:
        running = read_running()
        if running is not None:
            self._samples.append(running)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def __enter__(self) -> LoadSampler:
        self._started = time.monotonic()
        if self._mode != "measure":
            return self
        self._cpu_start = read_cpu_times()
        self._sample()
        # A daemon thread: an interrupted session must not wait for it.
        self._thread = threading.Thread(target=self._loop, name="specdecode-load", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is None:
            self._result = self._declared()
            return
        self._thread.join()
        self._sample()
        self._result = self._summarise()

    def _declared(self) -> MachineLoad | None:
        if isinstance(self._mode, str):
            return None  # "off"
        return MachineLoad(
            cpus=cpu_count(),
            runnable_per_cpu=float(self._mode),
            loadavg=None,
            cpu_busy=None,
            cpu_steal=None,
            seconds=time.monotonic() - self._started,
            declared=True,
        )

    def _summarise(self) -> MachineLoad:
        cpus = cpu_count()
        runnable = None
        if self._samples:
            # The reading thread is itself running when it reads the count.
            mean = sum(self._samples) / len(self._samples)
            runnable = max(0.0, mean - 1.0) / cpus
        busy = steal = None
        start, end = self._cpu_start, read_cpu_times()
        if start is not None and end is not None and end[2] > start[2]:
            total = end[2] - start[2]
            busy = 1.0 - (end[0] - start[0]) / total
            steal = (end[1] - start[1]) / total
        return MachineLoad(
            cpus=cpus,
            runnable_per_cpu=runnable,
            loadavg=read_loadavg(),
            cpu_busy=busy,
            cpu_steal=steal,
            seconds=time.monotonic() - self._started,
        )

    def result(self) -> MachineLoad | None:
        """The load over the ``with`` block; None with ``mode="off"``."""
        if self._thread is None and self._mode == "measure":
            raise RuntimeError("LoadSampler.result() before the sampler was used")
        return self._result


def loads_differ(current: float, baseline: float) -> bool:
    """The rule: differ by at least :data:`LOAD_DIFFERENCE` per CPU, the busier side above
    :data:`SATURATED` (module docstring for why)."""
    return abs(current - baseline) >= LOAD_DIFFERENCE and max(current, baseline) > SATURATED


def load_warning(current: MachineLoad, baseline: MachineLoad | None, label: str) -> str | None:
    """The warning for a comparison with ``label`` (e.g. "its own baseline") across loads that
    differ enough to matter; None when they do not, or when either load is unknown."""
    if baseline is None:
        return None
    now, then = current.per_cpu, baseline.per_cpu
    if now is None or then is None or not loads_differ(now, then):
        return None
    if then > now:
        effect = (
            f"{label} was recorded on the busier machine, so its tok/s may read low and hide a "
            "slowdown"
        )
    else:
        effect = (
            "this run was measured on the busier machine, so its tok/s may read low: a slowdown "
            "may be the machine's, not the build's"
        )
    return (
        f"machine load differs between these runs and {label}: {current.describe()} now, "
        f"{baseline.describe()} when it was recorded. A busy CPU slows the client and the "
        "server's CPU side (0.25-0.5% of tok/s per runnable task per CPU, measured on a 2-core "
        f"box); {effect}. Measure on a quieter machine, or re-record the baseline on one "
        "(see 'Machine load' in docs/guide.md)."
    )


def comparison_warnings(
    current: MachineLoad | None,
    thresholds: Iterable[Threshold],
    refs: Mapping[str | None, BaselineRef],
) -> list[str]:
    """One :func:`load_warning` per baseline that a timed metric of this test is compared
    with (accept length counts tokens, so a test that checks only it is never warned)."""
    if current is None:
        return []
    warnings: list[str] = []
    seen: set[int] = set()
    for threshold in thresholds:
        ref = refs.get(threshold.reference)
        if threshold.metric in COUNTED_METRICS or ref is None or ref.samples is None:
            continue
        if id(ref) in seen:
            continue
        seen.add(id(ref))
        text = load_warning(current, MachineLoad.from_json(ref.machine_load), ref.label)
        if text is not None:
            warnings.append(text)
    return warnings


def held_back_by_load(checks: Sequence[Check], current: MachineLoad | None) -> tuple[Check, ...]:
    """``checks`` with every FAIL of a timed metric that was measured on a machine busier than
    its baseline's, by :func:`loads_differ`, by less than that load could cost, made
    INCONCLUSIVE with the reason in its text (module docstring: the slowdown may be the
    machine's, not the build's)."""
    now = None if current is None else current.per_cpu
    if now is None:
        return tuple(checks)
    return tuple(_held_back(check, now) for check in checks)


def _held_back(check: Check, now: float) -> Check:
    comparison = check.comparison
    if comparison is None or comparison.verdict is not Verdict.FAIL:
        return check
    if check.threshold.metric in COUNTED_METRICS:
        return check  # a token count does not slow down with the CPU
    recorded = MachineLoad.from_json(check.ref.machine_load)
    then = None if recorded is None else recorded.per_cpu
    if then is None or now <= then or not loads_differ(now, then):
        return check
    cost = min(MAX_COST, MAX_COST_PER_TASK * (now - then))
    reachable = comparison.threshold * (1.0 - cost)
    if comparison.ci_high < reachable:
        return check  # more than the load could cost: the build's
    note = (
        f"Not called a FAIL: measured at {now:.2f} runnable tasks per CPU against {then:.2f} "
        f"when {check.ref.label} was recorded; that much busier a CPU can cost up to "
        f"{cost:.1%} on its own ({MAX_COST_PER_TASK:.0%} per runnable task per CPU), and the "
        f"upper bound {comparison.ci_high:.3f} is within that of the {comparison.threshold:.3f} "
        "required. Judge it on a quieter night."
    )
    held = replace(comparison, verdict=Verdict.INCONCLUSIVE, warnings=(*comparison.warnings, note))
    return replace(check, comparison=held)


def recording_warning(current: MachineLoad | None) -> str | None:
    """Said when a baseline is recorded on a saturated machine: the runs compared with it later
    on a quiet one will be warned about, and it may be better recorded again."""
    figure = None if current is None else current.per_cpu
    if current is None or figure is None or figure <= SATURATED:
        return None
    return (
        f"this baseline was recorded on a busy machine ({current.describe()}: tasks waited for "
        "a CPU), so its tok/s may read low and hide a later slowdown; runs on a quieter machine "
        "will warn that the loads differ. Record it again on a quieter machine if you can "
        "(see 'Machine load' in docs/guide.md)."
    )
