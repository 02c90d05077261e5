"""Measuring and judging one test: the data path, in one place.

:meth:`Measurer.measure` is a short driver over named steps, each visited once:

1. the runner asks the server what it runs and checks that against the profile
   (:meth:`~pytest_specdecode.session.runner.ServerRunner.identify`);
2. :meth:`Measurer._subject`: what is measured, the hardware key and fingerprint the baselines
   are found by, and the baselines (the test's own and its ``against=`` profiles');
3. :meth:`Measurer._looks`: the sequential plan and the launch variance each check is judged
   with (:class:`~pytest_specdecode.verdict.SequentialChecks`);
4. the runner's warm-up and runs under the profile's GPU lock, judged at each look and stopped
   once no check is undecided
   (:meth:`~pytest_specdecode.session.runner.ServerRunner.measured_runs`);
5. :meth:`Measurer._judge`: the verdict, held against the machine's load and then the
   cross-night detector (:func:`~pytest_specdecode.session.cross_night.judge_across_nights`);
6. :meth:`Measurer._result`, and with ``--update-baselines`` the baseline launches still owed,
   handed to :class:`~pytest_specdecode.session.baseline_launches.BaselineLaunches`
   (:meth:`Measurer._owe_launches`).

What the session knows (its profiles and hosts, what was collected, the repository and GPUs for
the provenance) comes in as callables, so this module needs nothing of session.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, NamedTuple

from pytest_specdecode.backends import backend_for
from pytest_specdecode.baselines.refs import OWN, BaselineLookup
from pytest_specdecode.baselines.store import BaselineStore
from pytest_specdecode.fingerprint import Fingerprint
from pytest_specdecode.markers import MarkerSpec
from pytest_specdecode.profiles.profile import ServerProfile
from pytest_specdecode.result import Outcome, SpecdecodeResult
from pytest_specdecode.servers.handle import ServerHandle
from pytest_specdecode.session.baseline_launches import (
    BaselineLaunches,
    PendingLaunches,
    launches_for,
    recording_outcome,
)
from pytest_specdecode.session.cross_night import Tonight, judge_across_nights
from pytest_specdecode.session.machine_load import (
    LoadSampler,
    MachineLoad,
    comparison_warnings,
    held_back_by_load,
    recording_warning,
)
from pytest_specdecode.settings import Settings
from pytest_specdecode.stats.night_series import launch_prior
from pytest_specdecode.stats.sequential import SequentialPlan
from pytest_specdecode.stats.two_level import (
    TIMING_METRICS,
    LaunchPrior,
    bridged,
    stated_prior,
)
from pytest_specdecode.verdict import (
    BaselineRef,
    Check,
    SequentialChecks,
    check_json,
    message,
    outcome_of,
)
from pytest_specdecode.workloads import Workload

if TYPE_CHECKING:
    from pytest_specdecode.servers.pool import ServerPool
    from pytest_specdecode.session.runner import ServerRunner

History = Sequence[Mapping[str, Any]]
"""Earlier nights (the JSON-lines history), for the launch variance of each test."""


@dataclass
class Measured:
    """What one test measures (:meth:`Measurer._subject`): the server as it answered, the
    hardware key and fingerprint its baselines are found by, and those baselines."""

    test_id: str
    workload: Workload
    info: dict[str, Any]  # the server's own answer (server info)
    simulated: bool
    hardware_key: str
    version: str | None
    fingerprint: Fingerprint
    warnings: list[str]  # the result's, in the order they arose
    launch_varies: bool  # a real server, or the simulated one with a launch CV
    refs: dict[str | None, BaselineRef] = field(default_factory=dict)


class Judged(NamedTuple):
    outcome: Outcome
    message: str
    crossnight: dict[str, Any]  # each series' detector state, as the history records it


class Measurer:
    """Measures and judges the tests of one session, one at a time."""

    def __init__(
        self,
        settings: Settings,
        *,
        store: BaselineStore,
        pool: ServerPool,
        runner: ServerRunner,
        launches: BaselineLaunches,
        emit: Callable[[str], None],
        hardware_key: Callable[[bool, ServerProfile], str],
        fingerprint_of: Callable[[str, str], Fingerprint],
        recorder_hint: Callable[[str, Workload], str],
        provenance: Callable[[ServerHandle, Mapping[str, Any]], Mapping[str, Any]],
        run_id: str = "",
    ) -> None:
        self.settings = settings
        self.run_id = run_id  # tonight's session, as the history names it
        self.store = store
        self.pool = pool  # its GPU lock is held over the warm-up and the runs
        self.runner = runner
        self.launches = launches
        self.emit = emit
        self.hardware_key = hardware_key  # (simulated, profile) -> the baselines' directory
        self.fingerprint_of = fingerprint_of  # (profile name, where it is asked for)
        self.recorder_hint = recorder_hint  # (profile name, workload) -> who records it
        self.provenance = provenance  # (server, its server info) -> the result's provenance

    def measure(
        self,
        test_id: str,
        spec: MarkerSpec,
        handle: ServerHandle,
        workload: Workload,
        history: History,
    ) -> SpecdecodeResult:
        """Warm up, run, compare (adding runs while a check is undecided), and judge one test.

        With ``--update-baselines`` the runs of this launch are recorded; when the profile's
        baselines span several launches, the others follow once the profile's last test has
        run (:meth:`BaselineLaunches.released`)."""
        backend = backend_for(handle.profile)
        with self.runner.client(handle, backend) as client:
            info, warnings = self.runner.identify(client, backend, handle)
            subject = self._subject(test_id, spec, handle, workload, info, warnings)
            looks = self._looks(test_id, spec, workload, subject, history)
            # The machine's load over warm-up and runs, recorded and compared with the baseline's.
            sampler = LoadSampler(self.settings.machine_load)
            with self.pool.gpu_lock(handle.profile), sampler:
                samples, extra = self.runner.measured_runs(
                    client, backend, handle, workload, looks.plan.max_runs, stop_after=looks.look
                )
        subject.warnings.extend(w for w in extra if w not in subject.warnings)
        machine = sampler.result()
        judged = self._judge(subject, spec, samples, looks, machine, history)
        result = self._result(subject, handle, samples, looks.checks, judged, machine)
        self._owe_launches(result, spec, handle, subject, looks.plan.initial_runs)
        return result

    def _subject(
        self,
        test_id: str,
        spec: MarkerSpec,
        handle: ServerHandle,
        workload: Workload,
        info: dict[str, Any],
        warnings: list[str],
    ) -> Measured:
        """What is measured: the server (simulated or not, its version, the hardware key its
        baselines live under), the configuration's fingerprint, and the baselines it is held
        against (the test's own and its ``against=`` profiles'), each found or not, and why."""
        profile = handle.profile
        simulated = profile.simulated or info.get("simulated") is True
        version = info.get("version")
        subject = Measured(
            test_id=test_id,
            workload=workload,
            info=info,
            simulated=simulated,
            hardware_key=self.hardware_key(simulated, profile),
            version=str(version) if version is not None else None,
            fingerprint=profile.fingerprint().with_soft(
                server_version=str(version) if version is not None else None
            ),
            warnings=warnings,
            launch_varies=not simulated or float(info.get("sim_launch_cv") or 0) > 0,
        )
        lookup = BaselineLookup(
            self.store,
            subject.hardware_key,
            workload.name,
            workload.content_hash(),
            workload_fields=workload.hashed_fields(),
            recorders={name: self.recorder_hint(name, workload) for name in spec.references},
        )
        others = {
            name: self.fingerprint_of(name, f"{test_id} (against=)") for name in spec.references
        }
        subject.refs, soft = lookup.resolve(test_id, subject.fingerprint, others)
        warnings.extend(soft)
        if not self.settings.update_baselines:
            # Said now, not after minutes of runs: the runs still go to the table and reports.
            for ref in {id(r): r for r in subject.refs.values() if r.samples is None}.values():
                first = (ref.problem or "").splitlines()[0]
                self.emit(f"{test_id}: {ref.label} cannot be compared: {first}")
        return subject

    def _looks(
        self,
        test_id: str,
        spec: MarkerSpec,
        workload: Workload,
        subject: Measured,
        history: History,
    ) -> SequentialChecks:
        """How many runs, when to judge, and the launch variance each check is judged with."""
        settings = self.settings
        updating = settings.update_baselines
        alpha = spec.alpha or settings.alpha
        runs = spec.runs or (settings.baseline_runs if updating else settings.runs)
        max_runs = runs if updating else max(spec.max_runs or settings.max_runs, runs)
        plan = SequentialPlan(initial_runs=runs, max_runs=max_runs, step=1, alpha=alpha)
        own = subject.refs[OWN].samples
        if own and own.get("tok_s"):
            # The per-look alphas are calibrated for the stored baseline's size.
            plan = plan.for_baseline(len(own["tok_s"]))
        priors = launch_priors(
            history,
            test_id,
            spec,
            subject.hardware_key,
            subject.fingerprint.digest,
            workload,
            stated=subject.launch_varies,
        )
        return SequentialChecks(
            spec.thresholds,
            subject.refs,
            plan,
            method=spec.method or settings.method,
            alpha_no_change=settings.alpha_no_change,
            priors=priors,
            warn_single_launch=subject.launch_varies,
            first_look_decides=updating,
        )

    def _judge(
        self,
        subject: Measured,
        spec: MarkerSpec,
        samples: dict[str, list[float]],
        looks: SequentialChecks,
        machine: MachineLoad | None,
        history: History,
    ) -> Judged:
        """Tonight's verdict (a recording's, or the checks' held against the machine's load and
        then the cross-night detector's): outcome, message and the detector's states."""
        if self.settings.update_baselines:
            busy = recording_warning(machine)
            subject.warnings.extend([busy] if busy is not None else [])
            return Judged(*recording_outcome(self.settings, samples), {})
        subject.warnings.extend(comparison_warnings(machine, spec.thresholds, subject.refs))
        looks.checks = held_back_by_load(looks.checks, machine)
        outcome = outcome_of(looks.checks)
        tonight = Tonight(
            test_id=subject.test_id,
            hardware_key=subject.hardware_key,
            fingerprint=subject.fingerprint.digest,
            workload_hash=subject.workload.content_hash(),
            when=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            session=self.run_id,
        )
        return Judged(
            *judge_across_nights(
                history or [],
                tonight,
                samples,
                spec.thresholds,
                (outcome, message(looks.checks, outcome)),
                reference_nights=self.settings.reference_nights,
                launches_vary=subject.launch_varies,
            )
        )

    def _result(
        self,
        subject: Measured,
        handle: ServerHandle,
        samples: dict[str, list[float]],
        checks: Sequence[Check],
        judged: Judged,
        machine: MachineLoad | None,
    ) -> SpecdecodeResult:
        workload = subject.workload
        return SpecdecodeResult(
            test_id=subject.test_id,
            profile=handle.profile.name,
            simulated=subject.simulated,
            hardware_key=subject.hardware_key,
            workload_name=workload.name,
            workload_hash=workload.content_hash(),
            fingerprint=subject.fingerprint,
            samples=samples,
            outcome=judged.outcome,
            message=judged.message,
            checks=[check_json(c) for c in checks],
            server_origin=handle.origin,
            server_version=subject.version,
            warnings=subject.warnings,
            provenance={
                **self.provenance(handle, subject.info),
                # what the workload hash covers, so a changed workload is named by its field
                "workload": workload.hashed_fields(),
                "machine_load": None if machine is None else machine.to_json(),
            },
            launch_runs=[len(samples.get("tok_s", []))],
            host=handle.profile.placed_on,
            crossnight=judged.crossnight,
        )

    def _owe_launches(
        self,
        result: SpecdecodeResult,
        spec: MarkerSpec,
        handle: ServerHandle,
        subject: Measured,
        runs: int,
    ) -> None:
        """A recording whose baselines span several launches of ``runs`` runs: the others are
        owed (done once the profile's last test has run), or, for an attached server, said to
        be impossible."""
        launches = launches_for(self.settings, subject.launch_varies)
        if result.outcome is not Outcome.RECORDED or launches <= 1:
            return
        if handle.origin == "attached":
            result.warnings.append(
                "an attached server cannot be relaunched: this baseline has one launch, so "
                "its verdicts cannot carry launch-to-launch variance"
            )
        else:
            pending = PendingLaunches(result, spec, subject.workload, runs, launches)
            self.launches.owe(result.profile, pending)


def launch_priors(
    history: History,
    test_id: str,
    spec: MarkerSpec,
    hardware: str,
    digest: str,
    workload: Workload,
    *,
    stated: bool = False,
) -> dict[tuple[str | None, str], LaunchPrior]:
    """The launch variance of each checked metric from the nights of history (the same
    test, hardware, configuration and workload: the series the cross-night detector reads, with
    the noise it carries over from earlier regimes), where the history has enough of them; else,
    with ``stated`` (servers whose launches vary), the stated prior of
    :func:`~pytest_specdecode.stats.two_level.stated_prior`, so that the first nights after a
    baseline
    recording are not judged on 2 df (docs/statistics.md, "The first night")."""
    priors = {}
    for threshold in spec.thresholds:
        prior = launch_prior(
            history or [],
            test_id=test_id,
            hardware_key=hardware,
            fingerprint=digest,
            workload_hash=workload.content_hash(),
            metric=threshold.metric,
        )
        if stated and threshold.metric in TIMING_METRICS:
            # the stated prior bridges the first nights until the history has enough of its own
            prior = bridged(prior, stated_prior(where="the project's default; docs/statistics.md"))
        if prior is not None:
            priors[(threshold.reference, threshold.metric)] = prior
    return priors
