"""One pytest session's worth of work, in plain Python: which profiles, which servers, what is
recorded.

The plugin (pytest wiring) creates one :class:`SpecdecodeSession` per process and calls it; this
module never imports pytest. The session owns what lasts the whole run: the profile file and its
target, where each profile is placed, the servers (the pool, or ``--server-host``), what was
collected, the results, the baseline updates and the warnings. Measuring one test is
:class:`~pytest_specdecode.session.measurement.Measurer`'s (its data path reads straight: server →
client → metrics → stats against baselines → verdict → :class:`SpecdecodeResult`), the requests sent
to a server go through :class:`~pytest_specdecode.session.runner.ServerRunner`, and a baseline's
further server launches are done by
:class:`~pytest_specdecode.session.baseline_launches.BaselineLaunches`. What differs between SGLang
and llama.cpp servers is asked of the profile's :class:`~pytest_specdecode.backends.Backend`, never
decided here.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pytest_specdecode.backends import backend_for
from pytest_specdecode.baselines.store import BaselineStore, BaselineUpdate
from pytest_specdecode.errors import BaselineError, ConfigError, ServerError, ServerStartError
from pytest_specdecode.fleet import EngineTLS, Need, Placement, device_gpus, engine, place
from pytest_specdecode.markers import MarkerSpec
from pytest_specdecode.net import is_local_host
from pytest_specdecode.profiles.loader import load_profiles
from pytest_specdecode.profiles.profile import TARGET_SIM, ProfileFile, ServerProfile
from pytest_specdecode.result import Outcome, SpecdecodeResult, TestError
from pytest_specdecode.servers.attach import (
    SGLANG_DEFAULT_PORT,
    attach,
    attach_url,
    attached_target,
)
from pytest_specdecode.servers.handle import ServerCounts, ServerHandle
from pytest_specdecode.servers.pool import ServerPool
from pytest_specdecode.servers.readiness import DEFAULT_READY_GRACE, Progress
from pytest_specdecode.session.attached import AttachedServers
from pytest_specdecode.session.baseline_launches import BaselineLaunches, baseline_record
from pytest_specdecode.session.measurement import Measurer
from pytest_specdecode.session.provenance import (
    GpuInfo,
    collect_provenance,
    detect_gpus,
    hardware_key,
)
from pytest_specdecode.session.runner import ServerRunner
from pytest_specdecode.settings import Settings
from pytest_specdecode.workloads import Workload, resolve_workload


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
        self._collected: dict[str, list[tuple[str, str, str]]] = {}
        """Per profile: (test id, workload name, workload hash) of every collected test."""
        self._selected: set[str] | None = None
        self._profiles: ProfileFile | None = None
        self._target: str | None = None
        self._target_reason = ""
        self._gpus: GpuInfo | None = None
        self._gpus_detected = False
        self._assemble(log_dir=log_dir, worker=worker, progress=progress)
        self._placement: Placement | None = None
        self._placed: dict[str, ServerProfile] = {}  # profiles bound to their host
        self._host_errors: dict[str, ServerError] = {}  # hosts whose endpoint is unknown
        self._demand_of: dict[str, int] = {}
        self.placement_seen: list[str] = []
        """The placement as the xdist workers reported it (the controller collects nothing)."""

    def _assemble(
        self, *, log_dir: Path, worker: str, progress: Callable[[Progress], None] | None
    ) -> None:
        """The session's parts: the baseline store, the server pool and the runner that talks
        to its servers, the attached servers, the baseline launches and the measurer."""
        settings = self.settings
        self.store = BaselineStore(settings.baselines, lock_dir=settings.state_dir / "locks")
        self.pool = ServerPool(
            state_dir=settings.state_dir,
            log_dir=log_dir,
            run_id=self.run_id,
            worker=worker,
            keep_alive=settings.keep_server,
            preflight=not settings.skip_preflight,
            env=self.env,
            on_event=self.emit,
            on_progress=progress,
            # the runner, made just below, needs the pool: a server that crashes is marked there
            warmup=lambda handle: self.runner.warm_up_server(handle),
            ready_grace=settings.stall_timeout or DEFAULT_READY_GRACE,
        )
        self.runner = ServerRunner(settings, self.pool)
        self.attached = (
            AttachedServers(settings.server_host, self._attached_info)
            if settings.server_host
            else None
        )
        """With --server-host: which selected profile each given server serves."""
        self.launches = BaselineLaunches(
            settings,
            pool=self.pool,
            runner=self.runner,
            emit=self.emit,
            on_update=self.updates.append,
        )
        self.measurer = Measurer(
            settings,
            store=self.store,
            pool=self.pool,
            runner=self.runner,
            launches=self.launches,
            emit=self.emit,
            hardware_key=self.hardware_key,
            fingerprint_of=lambda name, where: self.profile(name, where=where).fingerprint(),
            recorder_hint=self.recorder_hint,
            provenance=self._provenance,
            run_id=self.run_id,
        )

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
                    # The first server given says whether it is simulated (the default first).
                    target, self._target_reason = attached_target(
                        self.settings.server_host.specs[0], probe, self.settings.config
                    )
                elif self.gpus is not None:
                    target, self._target_reason = "real", f"{len(self.gpus.names)} GPU(s) found"
                elif TARGET_SIM in probe.targets:
                    target = TARGET_SIM
                    self._target_reason = "no GPU found: figures are simulated"
                else:
                    target, self._target_reason = "real", "no [targets.sim] in the profile file"
            else:
                self._target_reason = "chosen with --specdecode-target"
            self._profiles = load_profiles(path, target=target)
            self._target = target
            self.warnings.extend(self._profiles.warnings)
            self._check_server_hosts(self._profiles)
        return self._profiles

    def _check_server_hosts(self, loaded: ProfileFile) -> None:
        """Every ``--server-host PROFILE=URL`` names a profile of the file, and every URL
        has a host: a usage error before anything runs, not a skip per test."""
        hosts = self.settings.server_host
        if hosts is None:
            return
        for spec in hosts.specs:
            attach_url(spec, SGLANG_DEFAULT_PORT)
        unknown = [name for name in hosts.named if name not in loaded.profiles]
        if unknown:
            import difflib

            known = list(loaded.profiles)
            hints = [difflib.get_close_matches(name, known, n=1) for name in unknown]
            said = ", ".join(
                f"{name!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "")
                for name, hint in zip(unknown, hints, strict=True)
            )
            raise ConfigError(
                f"--server-host {hosts} names profile {said}, which {self.settings.config} does "
                f"not define. Defined: {', '.join(sorted(loaded.profiles)) or 'none'}; write "
                "--server-host PROFILE=URL with one of them, or a bare URL for the profiles "
                "the server runs"
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
            if profiles[name].kind.placed_on_hosts
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
            if profile.name in self.runner.attached_hung:  # it hung: later tests fail at once
                raise self.runner.attached_hung[profile.name]
            assert self.attached is not None
            return attach(profile, self.attached.url_for(profile), self.env)
        return self.pool.acquire(profile)

    def _attached_info(self, profile: ServerProfile, spec: str) -> dict[str, Any]:
        """What the server at ``spec`` reports, once it is ready (for
        :class:`~pytest_specdecode.session.attached.AttachedServers` to decide which profile it
        serves)."""
        handle = attach(profile, spec, self.env)
        backend = backend_for(profile)
        with self.runner.client(handle, backend) as client:
            return self.runner.server_info(client, backend, handle)

    def attached_host(self, profile: ServerProfile | None) -> str | None:
        """The host name of the server given for ``profile`` (the default one for None)."""
        hosts = self.settings.server_host
        if hosts is None:
            return None
        spec = hosts.url_for(profile.name) if profile is not None else hosts.default
        spec = spec or hosts.specs[0]
        return urlsplit(attach_url(spec, SGLANG_DEFAULT_PORT)).hostname

    def release(self, profile: ServerProfile, *, hold: bool = False) -> None:
        """A test is done with ``profile``'s server; ``hold``: this process's next test needs
        it too (see :meth:`ServerPool.release`)."""
        if not self.settings.server_host:
            self.pool.release(profile, hold=hold)
        self.launches.released(profile, hold=hold)

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
        host = self.attached_host(profile)
        # A server on this machine runs on the GPUs nvidia-smi lists here: the box's own
        # baselines. Another host's GPUs are not ours to see: that host's own key.
        remote = host is not None and (self.gpus is None or not is_local_host(host))
        if override is None and remote and not simulated:
            override = f"host-{host}"
        return hardware_key(self.gpus, simulated=simulated, override=override)

    def measure(self, test_id: str, spec: MarkerSpec, handle: ServerHandle) -> SpecdecodeResult:
        """Measure and judge one test (:meth:`Measurer.measure`); the result is the session's."""
        workload = self.workload(spec.workload, where=test_id)
        result = self.measurer.measure(test_id, spec, handle, workload, self.history)
        self.results.append(result)
        return result

    def _provenance(self, handle: ServerHandle, info: Mapping[str, Any]) -> dict[str, Any]:
        """Where a result was measured: the launch environment (not an attached server's, which
        is not ours to know), the server's info, the GPUs and this repository's state."""
        record = collect_provenance(
            env=handle.profile.launch_env(self.env) if handle.origin != "attached" else {},
            server_info=info,
            gpu=self.gpus,
            repo_dir=self.rootdir,
        )
        if handle.origin != "attached":
            # What ran: SGLang's version and installed files in the server's interpreter, the
            # image id, the binary (environment variables by name only: values may be secret).
            # The history carries it, so that a change across nights names what changed.
            parts = dict(self.pool.build_for(handle.profile).parts)
            parts["env"] = sorted(parts.get("env") or {})
            record["build"] = parts
        return record

    def note_collected(self, test_id: str, profile: str, workload: Workload) -> None:
        """A collected test (before -m/-k deselect), so an ``against=`` without a baseline can
        name the tests that would record one."""
        entry = (test_id, workload.name, workload.content_hash())
        self._collected.setdefault(profile, []).append(entry)

    def note_selected(self, test_ids: Sequence[str], profiles: Sequence[str] = ()) -> None:
        """The tests left to run after deselection, and their profiles."""
        self._selected = set(test_ids)
        if self.attached is not None:
            self.attached.select([self.profile(name, where="--server-host") for name in profiles])

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
        self.launches.plan(profiles)

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
            record, left_out = baseline_record(result, created_unix=time.time())
            result.warnings.extend(left_out)
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
                _not_written(result, exc, str(exc))
            except OSError as exc:
                text = (
                    f"could not write {self.store.path_for(result.hardware_key, result.test_id)}"
                    f": {exc}"
                )
                errors.append(f"{result.test_id}: {text}")
                _not_written(result, exc, text)
        return updates, errors

    def finish_launches(self) -> None:
        """Baseline launches still owed (a profile whose last planned test never released its
        server, e.g. skipped before it started one): done now, before the baselines are
        written."""
        for name in self.launches.owed():
            self.launches.record_more(self.profile(name, where="the remaining launches"))

    def close(self) -> None:
        self.pool.close()


def _not_written(result: SpecdecodeResult, exc: Exception, text: str) -> None:
    """A RECORDED result whose baseline could not be written: its row says ERROR (no baseline
    was recorded) and the session fails, though pytest passed the test long before. Its samples
    stay in the result, so the JSON report still holds every run measured."""
    first = text.splitlines()[0] if text else type(exc).__name__
    result.error = TestError(phase="session end", type=type(exc).__name__, cause=first)
    result.outcome = Outcome.ERROR
    result.message = f"measured {result.runs} runs, but its baseline could not be written: {first}"
    result.late_failure = f"its baseline could not be written: {first}"


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
