"""Measuring and judging one test: the data path, in one place.

:meth:`Measurer.measure` reads straight: server (what it runs, checked against the profile) →
baselines (the test's own and its ``against=`` profiles', found by hardware key, fingerprint and
workload) → warm-up and runs through the client → metrics → a verdict at each look of the
sequential plan, adding runs while a check is undecided → one :class:`SpecdecodeResult`. With
``--update-baselines`` the runs are recorded instead, and the baseline launches still owed are
handed to :class:`~pytest_specdecode.session.baseline_launches.BaselineLaunches`.

What the session knows (its profiles and hosts, what was collected, the repository and GPUs for
the provenance) comes in as callables, so this module needs nothing of session.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

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
from pytest_specdecode.session.cross_night import (
    Tonight,
    alarm_message,
    cross_night,
    night_sensitivity,
)
from pytest_specdecode.session.machine_load import (
    LoadSampler,
    comparison_warnings,
    held_back_by_load,
    recording_warning,
)
from pytest_specdecode.settings import Settings
from pytest_specdecode.stats.comparison import Verdict
from pytest_specdecode.stats.sequential import SequentialPlan
from pytest_specdecode.stats.two_level import (
    TIMING_METRICS,
    LaunchPrior,
    bridged,
    prior_for,
    stated_prior,
)
from pytest_specdecode.verdict import Check, check_json, evaluate, message, outcome_of
from pytest_specdecode.workloads import Workload

if TYPE_CHECKING:
    from pytest_specdecode.servers.pool import ServerPool
    from pytest_specdecode.session.runner import ServerRunner

History = Sequence[Mapping[str, Any]]
"""Earlier nights (the JSON-lines history), for the launch variance of each test."""


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
        profile = handle.profile
        settings = self.settings
        updating = settings.update_baselines
        alpha = spec.alpha or settings.alpha
        method = spec.method or settings.method
        runs = spec.runs or (settings.baseline_runs if updating else settings.runs)
        max_runs = runs if updating else max(spec.max_runs or settings.max_runs, runs)
        plan = SequentialPlan(initial_runs=runs, max_runs=max_runs, step=1, alpha=alpha)

        backend = backend_for(profile)
        with self.runner.client(handle, backend) as client:
            info = self.runner.server_info(client, backend, handle)
            simulated = profile.simulated or info.get("simulated") is True
            warnings = self.runner.server_checks(profile, backend, handle, info)
            hw = self.hardware_key(simulated, profile)
            version = info.get("version")
            fingerprint = profile.fingerprint().with_soft(
                server_version=str(version) if version is not None else None
            )
            lookup = BaselineLookup(
                self.store,
                hw,
                workload.name,
                workload.content_hash(),
                workload_fields=workload.hashed_fields(),
                recorders={name: self.recorder_hint(name, workload) for name in spec.references},
            )
            others = {
                name: self.fingerprint_of(name, f"{test_id} (against=)") for name in spec.references
            }
            refs, soft = lookup.resolve(test_id, fingerprint, others)
            warnings.extend(soft)
            if not updating:
                # Said now, not after minutes of runs: the runs still go to the table and reports.
                for ref in {id(r): r for r in refs.values() if r.samples is None}.values():
                    first = (ref.problem or "").splitlines()[0]
                    self.emit(f"{test_id}: {ref.label} cannot be compared: {first}")
            own = refs[OWN].samples
            if own and own.get("tok_s"):
                # The per-look alphas are calibrated for the stored baseline's size.
                plan = plan.for_baseline(len(own["tok_s"]))
            launch_varies = not simulated or float(info.get("sim_launch_cv") or 0) > 0
            priors = launch_priors(
                history, test_id, spec, hw, fingerprint.digest, workload, stated=launch_varies
            )
            samples: dict[str, list[float]] = {}
            decided: dict[int, Check] = {}
            checks: tuple[Check, ...] = ()
            looks = plan.looks()
            # The machine's load over warm-up and runs, recorded and compared with the baseline's.
            sampler = LoadSampler(settings.machine_load)
            with self.pool.gpu_lock(profile), sampler:
                self.runner.warm_up(client, handle, workload)
                for run_index in range(max_runs):
                    values, extra = self.runner.one_run(
                        client, backend, handle, workload, run_index
                    )
                    for name, value in values.items():
                        samples.setdefault(name, []).append(value)
                    warnings.extend(w for w in extra if w not in warnings)
                    n = run_index + 1
                    if n not in looks:
                        continue
                    look_alpha = plan.alpha_at(looks.index(n))
                    fresh = evaluate(
                        spec.thresholds,
                        samples,
                        refs,
                        alpha=look_alpha,
                        method=method,
                        # the no-change guard spends its level across the looks as alpha does
                        alpha_no_change=settings.alpha_no_change * look_alpha / alpha,
                        priors=priors,
                        warn_single_launch=launch_varies,
                    )
                    # A check decided at one look stays decided (that is what the per-look
                    # alphas were calibrated for); the undecided ones are looked at again, even
                    # when another check has already failed, so every check gets its verdict.
                    for index, check in enumerate(fresh):
                        if index not in decided and not _undecided(check):
                            decided[index] = check
                    checks = tuple(decided.get(i, check) for i, check in enumerate(fresh))
                    if updating or not any(_undecided(check) for check in checks):
                        break

        machine = sampler.result()
        if updating:
            busy = recording_warning(machine)
            warnings.extend([busy] if busy is not None else [])
        else:
            warnings.extend(comparison_warnings(machine, spec.thresholds, refs))
            checks = held_back_by_load(checks, machine)
        launches = launches_for(settings, launch_varies) if updating else 1
        crossnight: dict[str, Any] = {}
        if updating:
            outcome, text = recording_outcome(settings, samples)
        else:
            outcome = outcome_of(checks)
            text = message(checks, outcome)
            tonight = Tonight(
                test_id=test_id,
                hardware_key=hw,
                fingerprint=fingerprint.digest,
                workload_hash=workload.content_hash(),
                when=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                session=self.run_id,
            )
            states = cross_night(
                history or [],
                tonight,
                samples,
                spec.thresholds,
                reference_nights=settings.reference_nights,
                launches_vary=launch_varies,
            )
            crossnight = {s.metric: s.to_json() for s in states}
            alarm = alarm_message(states)
            if alarm is not None:
                # A persistent drop fails the night whatever tonight's own verdict was: a PASS
                # or INCONCLUSIVE night of a real regression must not show green.
                outcome = Outcome.FAIL
                text = f"{text}\n{alarm}"
            else:
                text += "".join(f"\n{s.describe()}" for s in states if s.state.direction)
            seen = night_sensitivity(states)
            if seen is not None:
                text += f"\n{seen}"
        result = SpecdecodeResult(
            test_id=test_id,
            profile=profile.name,
            simulated=simulated,
            hardware_key=hw,
            workload_name=workload.name,
            workload_hash=workload.content_hash(),
            fingerprint=fingerprint,
            samples=samples,
            outcome=outcome,
            message=text,
            checks=[check_json(c) for c in checks],
            server_origin=handle.origin,
            server_version=str(version) if version is not None else None,
            warnings=warnings,
            provenance={
                **self.provenance(handle, info),
                # what the workload hash covers, so a changed workload is named by its field
                "workload": workload.hashed_fields(),
                "machine_load": None if machine is None else machine.to_json(),
            },
            launch_runs=[len(samples.get("tok_s", []))],
            host=profile.placed_on,
            crossnight=crossnight,
        )
        if outcome is Outcome.RECORDED and launches > 1:
            if handle.origin == "attached":
                result.warnings.append(
                    "an attached server cannot be relaunched: this baseline has one launch, so "
                    "its verdicts cannot carry launch-to-launch variance"
                )
            else:
                self.launches.owe(
                    profile.name, PendingLaunches(result, spec, workload, runs, launches)
                )
        return result


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
    test, hardware, configuration and workload), where the history has enough of them; else, with
    ``stated`` (servers whose launches vary), the stated prior of
    :func:`~pytest_specdecode.stats.two_level.stated_prior`, so that the first nights after a
    baseline
    recording are not judged on 2 df (docs/statistics.md, "The first night")."""
    priors = {}
    for threshold in spec.thresholds:
        prior = prior_for(
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


def _undecided(check: Check) -> bool:
    return check.verdict is Verdict.INCONCLUSIVE
