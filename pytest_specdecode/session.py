"""One pytest session's worth of work, in plain Python: which profiles, which servers, how a
test is measured and judged, what is recorded.

The plugin (pytest wiring) creates one :class:`SpecdecodeSession` per process and calls it; this
module never imports pytest. The data path of :meth:`SpecdecodeSession.measure` reads straight:
server → client → metrics → stats against baselines → verdict → :class:`SpecdecodeResult`. What
differs between SGLang and llama.cpp servers is asked of the profile's
:class:`~pytest_specdecode.backends.Backend` (server info and checks, the protocol adapter, what
happens around each run), never decided here.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from pytest_specdecode.backends import Backend, backend_for
from pytest_specdecode.baselines.record import BaselineRecord
from pytest_specdecode.baselines.refs import OWN, BaselineLookup
from pytest_specdecode.baselines.store import (
    NOISE_HINT,
    BaselineStore,
    BaselineUpdate,
    noise_problem,
)
from pytest_specdecode.client import MeasurementClient, StallBound
from pytest_specdecode.errors import (
    BaselineError,
    ConfigError,
    RequestError,
    ServerCrashedError,
    ServerError,
    ServerHungError,
    ServerMismatchError,
    ServerStartError,
    SpecdecodeError,
)
from pytest_specdecode.fleet import EngineTLS, Need, Placement, device_gpus, engine, place
from pytest_specdecode.launches import LaunchPrior, prior_for
from pytest_specdecode.machine_load import LoadSampler, comparison_warnings, recording_warning
from pytest_specdecode.markers import MarkerSpec
from pytest_specdecode.metrics import compute_run_metrics
from pytest_specdecode.net import trust_env
from pytest_specdecode.profiles.loader import load_profiles
from pytest_specdecode.profiles.profile import ProfileFile, ServerProfile
from pytest_specdecode.provenance import GpuInfo, collect_provenance, detect_gpus, hardware_key
from pytest_specdecode.redaction import redact_url
from pytest_specdecode.result import SpecdecodeResult, check_json
from pytest_specdecode.sequential import SequentialPlan
from pytest_specdecode.servers.attach import wait_attached
from pytest_specdecode.servers.handle import ServerCounts, ServerHandle
from pytest_specdecode.servers.pool import ServerPool
from pytest_specdecode.servers.readiness import DEFAULT_READY_GRACE, Progress
from pytest_specdecode.settings import Settings
from pytest_specdecode.stats import Verdict
from pytest_specdecode.verdict import BaselineRef, Check, Outcome, evaluate, message, outcome_of
from pytest_specdecode.workloads import Workload, resolve_workload

SGLANG_DEFAULT_PORT = 30000
ATTACH_KINDS = {"sglang": "SGLang", "llamacpp": "llama-server"}
"""The server kinds' names in the attach messages, by backend name."""


class SpecdecodeSession:
    """Profiles, servers, measurement and baselines for one pytest process."""

    def __init__(
        self,
        settings: Settings,
        *,
        run_id: str,
        worker: str,
        is_xdist_worker: bool,
        log_dir: Path,
        rootdir: Path,
        emit: Callable[[str], None] = lambda message: None,
        progress: Callable[[Progress], None] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.run_id = run_id
        self.is_xdist_worker = is_xdist_worker
        self.rootdir = rootdir
        self.env = dict(os.environ if env is None else env)
        self.emit = emit
        self.started = datetime.now(timezone.utc)
        self.results: list[SpecdecodeResult] = []
        """Every measured result of this process (and, on the xdist controller, its workers')."""
        self.warnings: list[str] = []
        """Session-wide warnings (the profile file's), shown in the header, the summary and the
        report; a test's own warnings travel with its result."""
        self.updates: list[str] = []
        """Lines of the baseline updates (old -> new) and of the errors that stopped one."""
        self.output_lines: list[str] = []
        """What the outputs wrote where, and what could not be written."""
        self.servers = ServerCounts()
        """What happened to each profile's server, added up over the workers."""
        self.history: Sequence[Mapping[str, Any]] = ()
        """Earlier nights (the JSON-lines history), for the launch variance of each test."""
        self._planned: Counter[str] | None = None
        self._collected: dict[str, list[tuple[str, str, str]]] = {}
        """Per profile: (test id, workload name, workload hash) of every collected test."""
        self._selected: set[str] | None = None
        self._more_launches: dict[str, list[_PendingLaunches]] = {}
        self._profiles: ProfileFile | None = None
        self._target: str | None = None
        self._target_reason = ""
        self._gpus: GpuInfo | None = None
        self._gpus_detected = False
        self.store = BaselineStore(settings.baselines, lock_dir=settings.state_dir / "locks")
        self.pool = ServerPool(
            state_dir=settings.state_dir,
            log_dir=log_dir,
            run_id=run_id,
            worker=worker,
            keep_alive=settings.keep_server,
            preflight=not settings.skip_preflight,
            env=self.env,
            on_event=emit,
            on_progress=progress,
            warmup=self._warm_up_server,
            ready_grace=settings.stall_timeout or DEFAULT_READY_GRACE,
        )
        self._stalls: dict[str, StallBound] = {}
        self._placement: Placement | None = None
        self._placed: dict[str, ServerProfile] = {}  # profiles bound to their host
        self._host_errors: dict[str, ServerError] = {}  # hosts whose endpoint is unknown
        self._demand_of: dict[str, int] = {}
        self.placement_seen: list[str] = []
        """The placement as the xdist workers reported it (the controller collects nothing)."""
        self._attach_failures: dict[str, ServerError] = {}

    # -- profiles and target -------------------------------------------------------------

    @property
    def gpus(self) -> GpuInfo | None:
        if not self._gpus_detected:
            self._gpus = detect_gpus()
            self._gpus_detected = True
        return self._gpus

    @property
    def target(self) -> str:
        if self._target is None:
            self.profiles()
        assert self._target is not None
        return self._target

    @property
    def target_if_loaded(self) -> str | None:
        """The target, if the profile file was needed in this session (else None)."""
        return self._target

    @property
    def target_reason(self) -> str:
        return self._target_reason

    def profiles(self) -> ProfileFile:
        """The profile file for the chosen target, loaded on first use (plain ``pytest tests``
        runs without a profile file never touch it)."""
        if self._profiles is None:
            path = self.settings.config
            target = self.settings.target
            if target == "auto":
                probe = load_profiles(path, target="real")
                if self.settings.server_host:
                    target, self._target_reason = self._attached_target(probe)
                elif self.gpus is not None:
                    target, self._target_reason = "real", f"{len(self.gpus.names)} GPU(s) found"
                elif "sim" in probe.targets:
                    target = "sim"
                    self._target_reason = "no GPU found: figures are simulated"
                else:
                    target, self._target_reason = "real", "no [targets.sim] in the profile file"
            else:
                self._target_reason = "chosen with --specdecode-target"
            self._profiles = load_profiles(path, target=target)
            self._target = target
            self.warnings.extend(self._profiles.warnings)
        return self._profiles

    def _attached_target(self, probe: ProfileFile) -> tuple[str, str]:
        """With --server-host and target auto: the attached server says whether it is the
        simulator (``"simulated": true`` in its /server_info; real SGLang has no such field),
        so its tests compare with the simulated baselines instead of all failing on the
        fingerprint's launcher class."""
        url = attach_url(self.settings.server_host or "", SGLANG_DEFAULT_PORT)
        simulated, problem = _reports_simulated(url)
        if simulated:
            if "sim" in probe.targets:
                return "sim", f'the server at {url} reports "simulated": true'
            return "real", (
                f'the server at {url} reports "simulated": true, but '
                f"{self.settings.config} has no [targets.sim]: its real profiles are compared"
            )
        if problem is None:
            return "real", f"the server at {url} is not simulated"
        return "real", (
            f"a --server-host is given and its /server_info could not be read ({problem}); "
            "add --specdecode-target sim if it is the simulated server"
        )

    def place(self, demand: Mapping[str, int]) -> None:
        """Place the docker profiles of the collected tests (``demand``: tests per profile) on
        the profile file's ``[hosts.NAME]`` (:mod:`pytest_specdecode.fleet`); nothing to do
        without hosts. Every xdist process computes the same placement from the same
        collection."""
        if not demand or self.settings.server_host:
            return  # a run without specdecode tests never reads the profile file
        hosts = self.profiles().hosts
        if not hosts:
            return
        profiles = self.profiles().profiles
        self._demand_of = dict(demand)
        needs = {
            name: Need(
                gpus=len(profiles[name].gpus),
                hosts=profiles[name].hosts,
                tests=count,
                indices=profiles[name].gpus,
            )
            for name, count in demand.items()
            if profiles[name].launcher == "docker"
        }
        self._placement = place(needs, list(hosts.values()), source=str(self.settings.config))
        engines: dict[str, tuple[str | None, EngineTLS | None]] = {}
        for host in dict.fromkeys(self._placement.host_of.values()):
            try:  # the endpoint, and the TLS its client speaks there (its certificates exist)
                engines[host] = engine(hosts[host], self.env)
            except ConfigError as exc:  # that host's tests fail with it; the others go on
                self._host_errors[host] = ServerStartError(f"host {host!r}: {exc}")
                engines[host] = (None, None)
        for name, host in self._placement.host_of.items():
            docker_host, tls = engines[host]
            self._placed[name] = replace(
                profiles[name],
                placed_on=host,
                docker_host=docker_host,
                docker_tls=tls,
                gpus=device_gpus(hosts[host], profiles[name].gpus),
            )

    def placement_lines(self) -> list[str]:
        """``box-a: eagle3 (4 tests), nospec (2 tests)`` per host, for the terminal."""
        if self._placement is None:
            return []
        lines = []
        for host in self.profiles().hosts:
            names = [n for n, h in self._placement.host_of.items() if h == host]
            shown = ", ".join(self._placed_text(n) for n in names)
            lines.append(f"{host}: {shown or 'nothing'}")
        return lines

    @property
    def host_of(self) -> dict[str, str]:
        """Profile -> the fleet host it was placed on (empty without ``[hosts.NAME]``)."""
        return dict(self._placement.host_of) if self._placement is not None else {}

    def _placed_text(self, name: str) -> str:
        """``eagle3 (4 tests, GPUs 4,5,6,7)``: the GPUs are the box's, after the mapping."""
        tests = self._demand_of.get(name, 0)
        gpus = self._placed[name].gpus
        on = f", GPUs {','.join(map(str, gpus))}" if gpus else ""
        return f"{name} ({tests} test{'s' * (tests != 1)}{on})"

    def group_of(self, profile: str) -> str:
        """The xdist group of a profile's tests: its host's when placed, else its own."""
        if self._placement is not None and profile in self._placement.host_of:
            return self._placement.group(profile)
        return f"specdecode-{profile}"

    def profile(self, name: str, *, where: str) -> ServerProfile:
        if name in self._placed:
            return self._placed[name]
        profiles = self.profiles().profiles
        if name not in profiles:
            import difflib

            hint = difflib.get_close_matches(name, list(profiles), n=1)
            did_you_mean = f"; did you mean {hint[0]!r}?" if hint else ""
            raise ConfigError(
                f"{where} asks for server profile {name!r}, which {self.settings.config} does "
                f"not define{did_you_mean} Defined: {', '.join(sorted(profiles)) or 'none'}"
            )
        return profiles[name]

    def workload(self, spec: str | Mapping[str, Any] | None, *, where: str) -> Workload:
        """The workload a marker asks for (a name from the profile file or built in, or a
        mapping of overrides); an unknown name or bad field is a ``ConfigError`` naming
        ``where``."""
        return resolve_workload(spec, self.profiles().workloads, source=where)

    # -- servers -------------------------------------------------------------------------

    def server_for(self, profile: ServerProfile) -> ServerHandle:
        if profile.placed_on in self._host_errors:
            raise self._host_errors[profile.placed_on]
        if self.settings.server_host:
            return self._attach(profile)
        return self.pool.acquire(profile)

    def release(self, profile: ServerProfile, *, hold: bool = False) -> None:
        """A test is done with ``profile``'s server; ``hold``: this process's next test needs
        it too (see :meth:`ServerPool.release`)."""
        if not self.settings.server_host:
            self.pool.release(profile, hold=hold)
        if self._planned is not None and profile.name in self._planned:
            self._planned[profile.name] -= 1
            if self._planned[profile.name] <= 0 and not hold:
                self._record_more_launches(profile)

    def _attach(self, profile: ServerProfile) -> ServerHandle:
        if profile.name in self._attach_failures:  # it hung: later tests fail at once
            raise self._attach_failures[profile.name]
        backend = backend_for(profile)
        url = attach_url(self.settings.server_host or "", profile.port or backend.default_port)
        api_key = None
        if profile.api_key_env:
            api_key = self.env.get(profile.api_key_env)
        wait_attached(
            url,
            kind=ATTACH_KINDS.get(backend.name, backend.name),
            health_paths=backend.health_paths,
            timeout=min(60.0, profile.startup_timeout),
            api_key=api_key,
        )
        return ServerHandle(profile=profile, base_url=url, origin="attached", api_key=api_key)

    def _warm_up_server(self, handle: ServerHandle) -> None:
        """The profile's server-level warm-up after readiness: short greedy requests, so CUDA
        graphs and caches are hot before any test measures (the seed's slow first requests)."""
        if handle.profile.warmup_requests <= 0:
            return
        warm = resolve_workload(
            {"max_new_tokens": 16, "requests_per_run": 1, "concurrency": 1, "warmup_requests": 0}
        )
        with self._client(handle, backend_for(handle.profile)) as client:
            for i in range(handle.profile.warmup_requests):
                client.run(warm, i)

    def _client(self, handle: ServerHandle, backend: Backend) -> MeasurementClient:
        return MeasurementClient(
            handle.base_url,
            api_key=handle.api_key,
            adapters=backend.adapter,
            request_timeout=self.settings.request_timeout,
            stall=self._stall_for(handle),
        )

    def _stall_for(self, handle: ServerHandle) -> StallBound:
        """One stall bound per server (a relaunch starts afresh): what the warm-up saw of it
        bounds the silence of the measured runs."""
        key = f"{handle.profile.name} {handle.base_url} {id(handle.launcher)}"
        bound = self._stalls.get(key)
        if bound is None:
            bound = self._stalls[key] = StallBound(self.settings.stall_timeout)
        return bound

    # -- measurement ---------------------------------------------------------------------

    def hardware_key(self, simulated: bool, profile: ServerProfile | None = None) -> str:
        """The baselines' directory: a placed profile's host's key (``simulated-`` before it
        for the simulator), else ``--specdecode-hardware-key``, else what this machine has."""
        if profile is not None and profile.placed_on is not None:
            key = self.profiles().hosts[profile.placed_on].hardware_key
            return hardware_key(
                None, simulated=False, override=f"simulated-{key}" if simulated else key
            )
        override = self.settings.hardware_key
        if override is None and self.settings.server_host and self.gpus is None and not simulated:
            host = urlsplit(attach_url(self.settings.server_host, SGLANG_DEFAULT_PORT)).hostname
            override = f"host-{host}"
        return hardware_key(self.gpus, simulated=simulated, override=override)

    def measure(self, test_id: str, spec: MarkerSpec, handle: ServerHandle) -> SpecdecodeResult:
        """Warm up, run, compare (adding runs while a check is undecided), and judge one test.

        With ``--update-baselines`` the runs of this launch are recorded; when the profile's
        baselines span several launches, the others follow once the profile's last test has
        run (:meth:`release`)."""
        profile = handle.profile
        workload = self.workload(spec.workload, where=test_id)
        settings = self.settings
        updating = settings.update_baselines
        alpha = spec.alpha or settings.alpha
        method = spec.method or settings.method
        runs = spec.runs or (settings.baseline_runs if updating else settings.runs)
        max_runs = runs if updating else max(spec.max_runs or settings.max_runs, runs)
        plan = SequentialPlan(initial_runs=runs, max_runs=max_runs, step=1, alpha=alpha)

        backend = backend_for(profile)
        with self._client(handle, backend) as client:
            info = self._server_info(client, backend, handle)
            simulated = profile.simulated or info.get("simulated") is True
            warnings = self._server_checks(profile, backend, handle, info)
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
                name: self.profile(name, where=f"{test_id} (against=)").fingerprint()
                for name in spec.references
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
            priors = self._priors(test_id, spec, refs, hw, fingerprint.digest, workload)
            launch_varies = not simulated or float(info.get("sim_launch_cv") or 0) > 0
            samples: dict[str, list[float]] = {}
            decided: dict[int, Check] = {}
            checks: tuple[Check, ...] = ()
            looks = plan.looks()
            # The machine's load over warm-up and runs, recorded and compared with the baseline's.
            sampler = LoadSampler(settings.machine_load)
            with self.pool.gpu_lock(profile), sampler:
                self._warm_up(client, handle, workload)
                for run_index in range(max_runs):
                    values, extra = self._one_run(client, backend, handle, workload, run_index)
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
        launches = self._launches_for(simulated, launch_varies) if updating else 1
        if updating:
            outcome, text = self._recording_outcome(samples)
        else:
            outcome = outcome_of(checks)
            text = message(checks, outcome)
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
                **collect_provenance(
                    env=profile.launch_env(self.env) if handle.origin != "attached" else {},
                    server_info=info,
                    gpu=self.gpus,
                    repo_dir=self.rootdir,
                ),
                # what the workload hash covers, so a changed workload is named by its field
                "workload": workload.hashed_fields(),
                "machine_load": None if machine is None else machine.to_json(),
            },
            launch_runs=[len(samples.get("tok_s", []))],
            host=profile.placed_on,
        )
        self.results.append(result)
        if outcome is Outcome.RECORDED and launches > 1:
            if handle.origin == "attached":
                result.warnings.append(
                    "an attached server cannot be relaunched: this baseline has one launch, so "
                    "its verdicts cannot carry launch-to-launch variance"
                )
            else:
                self._more_launches.setdefault(profile.name, []).append(
                    _PendingLaunches(result, spec, workload, runs, launches)
                )
        return result

    def _warm_up(self, client: MeasurementClient, handle: ServerHandle, workload: Workload) -> None:
        try:
            client.warmup(workload)
        except RequestError as exc:
            raise self._explain_failure(exc, handle, "during the warm-up") from exc

    def _one_run(
        self,
        client: MeasurementClient,
        backend: Backend,
        handle: ServerHandle,
        workload: Workload,
        run_index: int,
    ) -> tuple[dict[str, float], list[str]]:
        """One measured run: its metric values and the backend's warnings."""
        try:
            state = backend.begin_run(client, workload)
            run = client.run(workload, run_index)
            extras = backend.end_run(client, state, run)
        except RequestError as exc:
            raise self._explain_failure(exc, handle, f"during run {run_index + 1}") from exc
        return {**compute_run_metrics(run).values, **extras.values}, list(extras.warnings)

    def _launches_for(self, simulated: bool, launch_varies: bool) -> int:
        """Launches a baseline is recorded over: the setting, else 3 where launches vary (a
        real server, or the simulator with --sim-launch-cv), else 1."""
        if self.settings.baseline_launches is not None:
            return self.settings.baseline_launches
        return DEFAULT_BASELINE_LAUNCHES if launch_varies else 1

    def note_collected(self, test_id: str, profile: str, workload: Workload) -> None:
        """A collected test (before -m/-k deselect), so an ``against=`` without a baseline can
        name the tests that would record one."""
        entry = (test_id, workload.name, workload.content_hash())
        self._collected.setdefault(profile, []).append(entry)

    def note_selected(self, test_ids: Sequence[str]) -> None:
        """The tests left to run after deselection."""
        self._selected = set(test_ids)

    def recorder_hint(self, profile: str, workload: Workload) -> str:
        """Which tests of this session record ``profile``'s baseline on ``workload``, and what
        to run; or that none does and what test to add."""
        tests = self._collected.get(profile, [])
        same = [t for t, _, digest in tests if digest == workload.content_hash()]
        selected = [t for t in same if self._selected is None or t in self._selected]
        if selected:
            return (
                f"it is recorded by {', '.join(selected)} (in this session): run "
                f"`pytest --update-baselines {' '.join(selected)}` first"
            )
        if same:
            return (
                f"{', '.join(same)} would record it but is not selected (-m, -k or the paths "
                f"given): run `pytest --update-baselines {' '.join(same)}` first"
            )
        add = (
            f"add a test marked @pytest.mark.specdecode({profile!r}, "
            f"workload={workload.name!r}) and record it with --update-baselines"
        )
        if tests:
            others = ", ".join(f"{t} (workload {name!r})" for t, name, _ in tests)
            return (
                f"no collected test measures {profile!r} on this workload ({others} do on "
                f"others): {add}"
            )
        return f"no collected test measures profile {profile!r}: {add}"

    def plan(self, profiles: Sequence[str]) -> None:
        """The profiles of the tests this process will run, one entry per test (from the
        collection): the last test of a profile triggers its remaining baseline launches."""
        self._planned = Counter(profiles)

    def _record_more_launches(self, profile: ServerProfile) -> None:
        """The profile's other baseline launches: relaunch it, measure every recorded test of
        it again, as often as the baselines want launches (one launch = one server start)."""
        pending = self._more_launches.pop(profile.name, [])
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
                with self._client(handle, backend) as client, self.pool.gpu_lock(profile):
                    for p in pending:
                        self._warm_up(client, handle, p.workload)
                        for run_index in range(p.runs):
                            values, _ = self._one_run(
                                client, backend, handle, p.workload, run_index
                            )
                            for name, value in values.items():
                                p.result.samples.setdefault(name, []).append(value)
                        p.result.launch_runs.append(p.runs)
            except SpecdecodeError as exc:
                self._launch_failed(pending, launch, wanted, exc)
                return
            finally:
                self.pool.release(profile)
        for p in pending:
            outcome, text = self._recording_outcome(p.result.samples, p.result.launch_runs)
            p.result.outcome, p.result.message = outcome, text

    def _launch_failed(
        self, pending: list[_PendingLaunches], launch: int, wanted: int, exc: Exception
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
            outcome, text = self._recording_outcome(p.result.samples, p.result.launch_runs)
            p.result.outcome, p.result.message = outcome, text
        self.updates.append(
            f"{pending[0].result.profile}: baseline launch {launch} failed: {first}"
        )

    def _priors(
        self,
        test_id: str,
        spec: MarkerSpec,
        refs: Mapping[str | None, BaselineRef],
        hardware: str,
        digest: str,
        workload: Workload,
    ) -> dict[tuple[str | None, str], LaunchPrior]:
        """The launch variance of each checked metric from the nights of history (the same
        test, hardware, configuration and workload), where the history has enough of them."""
        if not self.history:
            return {}
        priors = {}
        for threshold in spec.thresholds:
            prior = prior_for(
                self.history,
                test_id=test_id,
                hardware_key=hardware,
                fingerprint=digest,
                workload_hash=workload.content_hash(),
                metric=threshold.metric,
            )
            if prior is not None:
                priors[(threshold.reference, threshold.metric)] = prior
        return priors

    def _server_info(
        self, client: MeasurementClient, backend: Backend, handle: ServerHandle
    ) -> dict[str, Any]:
        try:
            return backend.server_info(client)
        except RequestError as exc:
            raise self._explain_failure(exc, handle, "before measuring") from exc

    def _server_checks(
        self,
        profile: ServerProfile,
        backend: Backend,
        handle: ServerHandle,
        info: Mapping[str, Any],
    ) -> list[str]:
        attached = handle.origin == "attached"
        found = backend.compare_args(profile, info, attached=attached)
        # A field this release does not report is not checked, never a reason to refuse it.
        unchecked = [m.field for m in found if not m.reported and not m.required]
        mismatches = [m for m in found if m.reported or m.required]
        version = info.get("version")
        release = f"{backend.name} {version}" if version else f"this {backend.name} server"
        if not attached:
            if mismatches:
                raise ServerMismatchError(
                    f"the server launched for profile {profile.name!r} ({profile.source}) does "
                    "not run it: " + "; ".join(m.describe() for m in mismatches) + ". Its log "
                    "says why",
                    log_path=str(handle.log_path) if handle.log_path else None,
                    log_tail=handle.log_tail(50),
                )
            return []
        warnings = [f"attached to {handle.base_url}: {backend.unverifiable(profile)}"]
        if unchecked:
            warnings.append(
                f"attached to {handle.base_url}: {release} does not report "
                f"{', '.join(unchecked)} in its server info, so the profile's "
                f"{'value was' if len(unchecked) == 1 else 'values were'} not checked"
            )
        if mismatches:
            text = (
                f"the server at {handle.base_url} ({release}) does not run profile "
                f"{profile.name!r} ({profile.source}): "
                + "; ".join(m.describe() for m in mismatches)
            )
            if not self.settings.allow_mismatch:
                raise ServerMismatchError(
                    text + ". Point --server-host at the right server, fix the profile, or pass "
                    "--specdecode-allow-mismatch to measure anyway"
                )
            warnings.append(text)
        return warnings

    def _recording_outcome(
        self, samples: Mapping[str, list[float]], launch_runs: Sequence[int] = ()
    ) -> tuple[Outcome, str]:
        runs = len(samples.get("tok_s", []))
        if not self.settings.force_baseline:
            problem = noise_problem(
                samples, self.settings.max_baseline_cv, launch_runs=tuple(launch_runs)
            )
            if problem is not None:
                return Outcome.FAIL, f"refusing to record a baseline: {problem} {NOISE_HINT}"
        launches = len(launch_runs)
        over = f" over {launches} server launches" if launches > 1 else ""
        return Outcome.RECORDED, f"recorded {runs} runs{over}"

    def _explain_failure(self, exc: RequestError, handle: ServerHandle, when: str) -> Exception:
        """A failed request: if the server died, say so with its exit code and log tail; if it
        hung (no token within the stall bound), fail its later tests at once and stop it."""
        deadline = time.monotonic() + 2.0
        code = handle.exit_code()
        while code is None and time.monotonic() < deadline and handle.origin != "attached":
            time.sleep(0.1)
            code = handle.exit_code()
        if code is None and exc.stalled:
            hung = ServerHungError(
                f"server {handle.profile.name!r} ({handle.origin}) hung {when}: {exc}. Later "
                "tests of this profile fail at once",
                log_path=str(handle.log_path) if handle.log_path else None,
                log_tail=handle.log_tail(50),
            )
            if handle.origin == "attached":
                self._attach_failures[handle.profile.name] = hung
            else:
                self.pool.mark_failed(handle.profile, hung)
            return hung
        if code is None:
            return exc
        crash = ServerCrashedError(
            f"server {handle.profile.name!r} died {when} (exit code {code}); the request "
            f"failed with: {exc}",
            log_path=str(handle.log_path) if handle.log_path else None,
            log_tail=handle.log_tail(50),
            exit_code=code,
        )
        self.pool.mark_failed(handle.profile, crash)
        return crash

    # -- end of session ------------------------------------------------------------------

    def write_baselines(
        self, results: list[SpecdecodeResult]
    ) -> tuple[list[BaselineUpdate], list[str]]:
        """Record every RECORDED result (the xdist controller or a plain session only).

        A baseline that cannot be written (refused, locked, a file system error) does not keep
        the others from being written and reported: its error is returned beside the updates.
        """
        updates: list[BaselineUpdate] = []
        errors: list[str] = []
        for result in results:
            if result.outcome is not Outcome.RECORDED:
                continue
            record = BaselineRecord(
                test_id=result.test_id,
                profile=result.profile,
                hardware_key=result.hardware_key,
                simulated=result.simulated,
                workload_name=result.workload_name,
                workload_hash=result.workload_hash,
                fingerprint=result.fingerprint,
                samples={k: tuple(v) for k, v in result.samples.items()},
                provenance=result.provenance,
                created_unix=time.time(),
                launch_runs=tuple(result.launch_runs) if _whole_launches(result) else (),
            )
            try:
                updates.append(
                    self.store.write(
                        record,
                        max_cv=self.settings.max_baseline_cv,
                        force=self.settings.force_baseline,
                    )
                )
            except BaselineError as exc:
                errors.append(f"{result.test_id}: {exc}")
            except OSError as exc:
                errors.append(
                    f"{result.test_id}: could not write "
                    f"{self.store.path_for(result.hardware_key, result.test_id)}: {exc}"
                )
        return updates, errors

    def finish_launches(self) -> None:
        """Baseline launches still owed (a profile whose last planned test never released its
        server, e.g. skipped before it started one): done now, before the baselines are
        written."""
        for name in list(self._more_launches):
            profile = self._more_launches[name][0].result.profile
            self._record_more_launches(self.profile(profile, where="the remaining launches"))

    def close(self) -> None:
        self.pool.close()


DEFAULT_BASELINE_LAUNCHES = 3
"""Launches of a baseline where launches vary: a launch-to-launch variance estimated from two
launch means has 1 degree of freedom; 3 launches (2) already halve the t quantile of a 99% bound,
at 45 minutes of a GPU box whose load takes 15 (docs/statistics.md)."""


@dataclass
class _PendingLaunches:
    """A test recorded in the first launch of its profile, owed its other launches."""

    result: SpecdecodeResult
    spec: MarkerSpec
    workload: Workload
    runs: int
    launches: int


def _undecided(check: Check) -> bool:
    return check.verdict is Verdict.INCONCLUSIVE


def _whole_launches(result: SpecdecodeResult) -> bool:
    """Every metric has one value per run of the launches (else the record is one launch)."""
    total = sum(result.launch_runs)
    return all(len(values) == total for values in result.samples.values())


def _reports_simulated(url: str, timeout: float = 5.0) -> tuple[bool, str | None]:
    """Whether the server at ``url`` says it is simulated, or why that could not be read."""
    problem = "no /server_info or /get_server_info"
    try:
        with httpx.Client(timeout=timeout, trust_env=trust_env(url)) as client:
            for route in ("/server_info", "/get_server_info"):
                response = client.get(url + route)
                if response.status_code == 404:
                    continue
                if response.status_code != 200:
                    problem = f"GET {route} answered HTTP {response.status_code}"
                    break
                info = response.json()
                return isinstance(info, dict) and info.get("simulated") is True, None
    except (httpx.HTTPError, ValueError) as exc:
        problem = f"{type(exc).__name__}: {exc}"
    return False, problem


def attach_url(spec: str, default_port: int) -> str:
    """``gpu-box``, ``gpu-box:30000`` or ``http://gpu-box:30000`` → ``http://gpu-box:30000``."""
    text = spec.strip().rstrip("/")
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if not parts.hostname:
        raise ConfigError(
            f"--server-host {redact_url(spec)!r} has no host name; use HOST[:PORT] or a URL"
        )
    try:
        port = parts.port or default_port
    except ValueError:
        raise ConfigError(f"--server-host {redact_url(spec)!r} has an invalid port") from None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}:{port}"


class SpecdecodeTest:
    """What the ``specdecode`` fixture gives a test: its server and, once measured, its result.

    A test with thresholds is measured and judged after its body runs; a body that wants the
    numbers itself calls :meth:`measure` (the plugin then judges that same measurement).
    """

    def __init__(
        self, session: SpecdecodeSession, test_id: str, spec: MarkerSpec, server: ServerHandle
    ) -> None:
        self._session = session
        self.test_id = test_id
        self.spec = spec
        self.server = server
        self.result: SpecdecodeResult | None = None

    @property
    def profile(self) -> ServerProfile:
        return self.server.profile

    def measure(self) -> SpecdecodeResult:
        """Measure (once) and return the result with samples, checks and outcome."""
        if self.result is None:
            self.result = self._session.measure(self.test_id, self.spec, self.server)
        return self.result

    def mean(self, metric: str) -> float:
        """Mean of ``metric`` over the measured runs (measures first if needed)."""
        values = self.measure().samples.get(metric)
        if not values:
            raise KeyError(f"{metric!r} was not measured for {self.test_id}")
        return sum(values) / len(values)
