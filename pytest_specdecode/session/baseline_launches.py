"""Recording a baseline over several server launches (``--update-baselines``).

Launches of a real server differ (docs/statistics.md), so a baseline is recorded over several.
A test records its runs on the server the session gave it (the first launch); once the profile's
last planned test has released that server, :class:`BaselineLaunches` relaunches it as often as
the baselines want, measuring every recorded test of the profile again in each launch. Whether
what was recorded may become a baseline at all (not too noisy) is :func:`recording_outcome`;
writing it is the session's, from :func:`baseline_record` (which samples and launch structure
the file gets).

These launches run after pytest has reported the tests they measure (in the teardown of the
profile's last test, or at the session's end), so a refusal or a failed launch is recorded on
the result as its ``late_failure``: the plugin turns it into a failure of the session.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_specdecode.backends import backend_for
from pytest_specdecode.baselines.baseline import BaselineRecord
from pytest_specdecode.baselines.store import NOISE_HINT, noise_problem
from pytest_specdecode.errors import SpecdecodeError
from pytest_specdecode.markers import MarkerSpec
from pytest_specdecode.profiles.profile import ServerProfile
from pytest_specdecode.result import Outcome, SpecdecodeResult
from pytest_specdecode.settings import Settings
from pytest_specdecode.workloads import Workload

if TYPE_CHECKING:
    from pytest_specdecode.servers.pool import ServerPool
    from pytest_specdecode.session.runner import ServerRunner

DEFAULT_BASELINE_LAUNCHES = 3
"""Launches of a baseline where launches vary: a launch-to-launch variance estimated from two
launch means has 1 degree of freedom; 3 launches (2) already halve the t quantile of a 99% bound,
at 45 minutes of a GPU box whose load takes 15 (docs/statistics.md)."""


@dataclass
class PendingLaunches:
    """A test recorded in the first launch of its profile, owed its other launches."""

    result: SpecdecodeResult
    spec: MarkerSpec
    workload: Workload
    runs: int
    launches: int


def launches_for(settings: Settings, launch_varies: bool) -> int:
    """Launches a baseline is recorded over: the setting, else 3 where launches vary (a
    real server, or the simulator with --sim-launch-cv), else 1."""
    if settings.baseline_launches is not None:
        return settings.baseline_launches
    return DEFAULT_BASELINE_LAUNCHES if launch_varies else 1


def planned_launches(profile: ServerProfile, settings_launches: int | None) -> int:
    """Launches a baseline of ``profile`` will be recorded over, known before any server runs:
    :func:`launches_for` with "launches vary" judged from the profile (a real server, or the
    simulator given ``--sim-launch-cv``) rather than from the running server's answer."""
    if settings_launches is not None:
        return settings_launches
    varies = not profile.simulated or _sim_launches_vary(list(profile.extra_args), profile)
    return DEFAULT_BASELINE_LAUNCHES if varies else 1


def _sim_launches_vary(args: list[str], profile: ServerProfile) -> bool:
    """Whether the simulator's flags make its launches vary: ``--sim-launch-cv``, or a noise
    preset measured on hardware (``--sim-noise-preset NAME``; ``auto`` only where it applies, at
    tp 1 with CUDA graphs on; the sim's ``noise.py`` has the rule)."""
    if any(arg.startswith("--sim-launch-cv") for arg in args):
        return True
    preset = None
    for index, arg in enumerate(args):
        if arg.startswith("--sim-noise-preset="):
            preset = arg.split("=", 1)[1]
        elif arg == "--sim-noise-preset" and index + 1 < len(args):
            preset = args[index + 1]
    if preset is None or preset == "none":
        return False
    if preset == "auto":
        return profile.tp_size == 1 and "--disable-cuda-graph" not in args
    return True


def baseline_cost(profiles: Sequence[ServerProfile], settings_launches: int | None) -> str:
    """What recording the baselines of ``profiles`` costs in launches and loading, e.g.
    ``12 server launches (3 per profile x 4 profiles), each loading within its startup_timeout
    (1800 s): up to 6.0 h of loading, plus the runs``: the timeout is a bound, not a load
    measured."""
    counts = [planned_launches(profile, settings_launches) for profile in profiles]
    total = sum(counts)
    if len(set(counts)) <= 1:
        plural = "s" if len(counts) != 1 else ""
        each = f"{counts[0] if counts else 0} per profile x {len(counts)} profile{plural}"
    else:
        each = ", ".join(f"{n} x {p.name}" for p, n in zip(profiles, counts, strict=True))
    timeouts = sorted({profile.startup_timeout for profile in profiles})
    bound = f"{timeouts[0]:g} s" if len(timeouts) == 1 else "its own"
    seconds = sum(n * p.startup_timeout for p, n in zip(profiles, counts, strict=True))
    return (
        f"{total} server launch{'es' if total != 1 else ''} ({each}), each loading within its "
        f"startup_timeout ({bound}): up to {_duration(seconds)} of loading, plus the runs"
    )


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def recording_outcome(
    settings: Settings, samples: Mapping[str, list[float]], launch_runs: Sequence[int] = ()
) -> tuple[Outcome, str]:
    """RECORDED with what was recorded, or FAIL when the samples are too noisy to be a baseline
    (unless ``--specdecode-force-baseline``)."""
    runs = len(samples.get("tok_s", []))
    if not settings.force_baseline:
        problem = noise_problem(samples, settings.max_baseline_cv, launch_runs=tuple(launch_runs))
        if problem is not None:
            return Outcome.FAIL, f"refusing to record a baseline: {problem} {NOISE_HINT}"
    launches = len(launch_runs)
    over = f" over {launches} server launches" if launches > 1 else ""
    return Outcome.RECORDED, f"recorded {runs} runs{over}"


def baseline_record(
    result: SpecdecodeResult, *, created_unix: float
) -> tuple[BaselineRecord, list[str]]:
    """The baseline a RECORDED result becomes, and a line for each metric left out of it.

    A metric needs one value per run to be split into launches. One that some runs did not
    yield (the ITL percentiles, when a short response arrived in one chunk on a slow machine)
    is left out of a baseline of several launches, and named, so that the launch layout of the
    metrics every run measured, tok/s first, is kept; before, one missing ITL value recorded the
    whole baseline as a single launch without a word. One launch keeps every metric.
    """
    samples = {name: tuple(values) for name, values in result.samples.items()}
    launch_runs = tuple(result.launch_runs)
    total = sum(launch_runs)
    uneven = sorted(name for name, values in samples.items() if len(values) != total)
    whole = {name: values for name, values in samples.items() if name not in uneven}
    notes: list[str] = []
    if uneven and (len(launch_runs) < 2 or not whole):
        launch_runs = ()  # one launch of however many runs
    elif uneven:
        samples = whole
        notes = [
            f"{name} is left out of the baseline: {len(result.samples[name])} of the {total} "
            f"runs yielded it, and a baseline over {len(launch_runs)} server launches needs one "
            "value per run (a longer workload gives every run one)"
            for name in uneven
        ]
    record = BaselineRecord(
        test_id=result.test_id,
        profile=result.profile,
        hardware_key=result.hardware_key,
        simulated=result.simulated,
        workload_name=result.workload_name,
        workload_hash=result.workload_hash,
        fingerprint=result.fingerprint,
        samples=samples,
        provenance=result.provenance,
        created_unix=created_unix,
        launch_runs=launch_runs,
    )
    return record, notes


class BaselineLaunches:
    """The baseline launches a session still owes, by profile, and doing them."""

    def __init__(
        self,
        settings: Settings,
        *,
        pool: ServerPool,
        runner: ServerRunner,
        emit: Callable[[str], None],
        on_update: Callable[[str], None],
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.runner = runner
        self.emit = emit
        self.on_update = on_update  # a line for the session's baseline updates
        self._planned: Counter[str] | None = None
        self._pending: dict[str, list[PendingLaunches]] = {}

    def plan(self, profiles: Sequence[str]) -> None:
        """The profiles of the tests this process will run, one entry per test (from the
        collection): the last test of a profile triggers its remaining baseline launches."""
        self._planned = Counter(profiles)

    def owe(self, profile: str, pending: PendingLaunches) -> None:
        self._pending.setdefault(profile, []).append(pending)

    def owed(self) -> list[str]:
        """The profiles whose tests are still owed launches."""
        return [pending[0].result.profile for pending in self._pending.values()]

    def released(self, profile: ServerProfile, *, hold: bool) -> None:
        """A test of ``profile`` is done with its server: after the last planned one (and
        unless the next test holds the server), the profile's other launches are done now."""
        if self._planned is not None and profile.name in self._planned:
            self._planned[profile.name] -= 1
            if self._planned[profile.name] <= 0 and not hold:
                self.record_more(profile)

    def record_more(self, profile: ServerProfile) -> None:
        """The profile's other baseline launches: relaunch it, measure every recorded test of
        it again, as often as the baselines want launches (one launch = one server start)."""
        pending = self._pending.pop(profile.name, [])
        if not pending:
            return
        wanted = max(p.launches for p in pending)
        for launch in range(2, wanted + 1):
            self.emit(f"{profile.name}: baseline launch {launch} of {wanted}")
            try:
                handle = self.pool.relaunch(profile, reason=f"baseline launch {launch}")
            except SpecdecodeError as exc:
                self._launch_failed(pending, launch, wanted, exc)
                return
            try:
                backend = backend_for(profile)
                with self.runner.client(handle, backend) as client, self.pool.gpu_lock(profile):
                    for p in pending:
                        self.runner.measured_runs(
                            client, backend, handle, p.workload, p.runs, into=p.result.samples
                        )
                        p.result.launch_runs.append(p.runs)
            except SpecdecodeError as exc:
                self._launch_failed(pending, launch, wanted, exc)
                return
            finally:
                self.pool.release(profile)
        for p in pending:
            outcome, text = recording_outcome(self.settings, p.result.samples, p.result.launch_runs)
            p.result.outcome, p.result.message = outcome, text
            if outcome is Outcome.FAIL:
                # pytest passed the test after its first launch; the session must fail now
                p.result.late_failure = text

    def _launch_failed(
        self, pending: list[PendingLaunches], launch: int, wanted: int, exc: Exception
    ) -> None:
        """A later baseline launch failed: what the earlier launches measured is kept."""
        first = str(exc).splitlines()[0]
        for p in pending:
            # a launch measured half-way is dropped, so every sample belongs to a whole launch
            kept = sum(p.result.launch_runs)
            p.result.samples = {k: v[:kept] for k, v in p.result.samples.items()}
            done = len(p.result.launch_runs)
            p.result.warnings.append(
                f"the baseline has {done} of {wanted} launches: launch {launch} failed: {first}"
            )
            outcome, text = recording_outcome(self.settings, p.result.samples, p.result.launch_runs)
            p.result.outcome, p.result.message = outcome, text
            # What was measured is still written (a launch of a GPU box is minutes of load),
            # but the baseline is not the one asked for, so the session fails.
            kept_text = (
                text
                if outcome is Outcome.FAIL
                else f"the baseline is recorded over {done} of {wanted} launches"
            )
            p.result.late_failure = (
                f"baseline launch {launch} of {wanted} failed: {first}; {kept_text}"
            )
        self.on_update(f"{pending[0].result.profile}: baseline launch {launch} failed: {first}")
