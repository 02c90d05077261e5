"""The requests a session sends to the servers it measures, and what a failed one means.

:class:`ServerRunner` opens a measurement client on a server with that server's stall bound, asks
the server what it runs and checks that against the profile, warms it up, does one measured run
(metrics plus the backend's extras), and turns a failed request into what happened to the server:
it died (exit code and log tail), it hung (its later tests fail at once), or only the request
failed. A test's measurement and a baseline's later launches both go through it; what differs
between server kinds is asked of the profile's :class:`~pytest_specdecode.backends.Backend`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pytest_specdecode.backends import Backend, backend_for
from pytest_specdecode.client import MeasurementClient, StallBound
from pytest_specdecode.errors import (
    RequestError,
    ServerCrashedError,
    ServerError,
    ServerHungError,
    ServerMismatchError,
)
from pytest_specdecode.metrics import compute_run_metrics
from pytest_specdecode.profiles.profile import ServerProfile
from pytest_specdecode.servers.handle import ServerHandle
from pytest_specdecode.servers.startup import probe_health
from pytest_specdecode.settings import Settings
from pytest_specdecode.workloads import Workload, resolve_workload

if TYPE_CHECKING:
    from pytest_specdecode.servers.pool import ServerPool

HUNG_PROBE_SECONDS = 5.0
"""How long a server whose request timed out has to answer its health probe before it counts
as hung: SGLang answers ``/health_generate`` within about a second, busy or not."""


class ServerRunner:
    """Talks to the servers of one session's tests (launched, reused or attached)."""

    def __init__(self, settings: Settings, pool: ServerPool) -> None:
        self.settings = settings
        self.pool = pool  # a server that crashed or hung is marked failed there
        self.attached_hung: dict[str, ServerError] = {}
        """Attached servers that hung, by profile: the pool cannot mark what it did not launch,
        so the session fails their later tests at once from here."""
        self._stalls: dict[str, StallBound] = {}

    def client(self, handle: ServerHandle, backend: Backend) -> MeasurementClient:
        return MeasurementClient(
            handle.base_url,
            api_key=handle.api_key,
            adapters=backend.adapter,
            request_timeout=self.settings.request_timeout,
            stall=self._stall_for(handle),
            simulated=handle.profile.simulated,
        )

    def _stall_for(self, handle: ServerHandle) -> StallBound:
        """One stall bound per server (a relaunch starts afresh): what the warm-up saw of it
        bounds the silence of the measured runs."""
        key = f"{handle.profile.name} {handle.base_url} {id(handle.launcher)}"
        bound = self._stalls.get(key)
        if bound is None:
            bound = self._stalls[key] = StallBound(self.settings.stall_timeout)
        return bound

    def warm_up_server(self, handle: ServerHandle) -> None:
        """The profile's server-level warm-up after readiness: short greedy requests, so CUDA
        graphs and caches are hot before any test measures (the seed's slow first requests)."""
        if handle.profile.warmup_requests <= 0:
            return
        warm = resolve_workload(
            {"max_new_tokens": 16, "requests_per_run": 1, "concurrency": 1, "warmup_requests": 0}
        )
        with self.client(handle, backend_for(handle.profile)) as client:
            for i in range(handle.profile.warmup_requests):
                client.run(warm, i)

    def identify(
        self, client: MeasurementClient, backend: Backend, handle: ServerHandle
    ) -> tuple[dict[str, Any], list[str]]:
        """What the server runs, checked against its profile: its server info and the warnings
        of the check (:meth:`server_checks`)."""
        info = self.server_info(client, backend, handle)
        return info, self.server_checks(handle.profile, backend, handle, info)

    def server_info(
        self, client: MeasurementClient, backend: Backend, handle: ServerHandle
    ) -> dict[str, Any]:
        try:
            return backend.server_info(client)
        except RequestError as exc:
            raise self._explain_failure(exc, handle, "before measuring") from exc

    def server_checks(
        self,
        profile: ServerProfile,
        backend: Backend,
        handle: ServerHandle,
        info: Mapping[str, Any],
    ) -> list[str]:
        """The server against its profile: a launched server that does not run it is an error;
        an attached one is a warning with ``--specdecode-allow-mismatch``, else an error."""
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
        # What no server reports (its environment) is said once, in the session header.
        warnings = []
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

    def warm_up(self, client: MeasurementClient, handle: ServerHandle, workload: Workload) -> None:
        try:
            client.warmup(workload)
        except RequestError as exc:
            raise self._explain_failure(exc, handle, "during the warm-up") from exc

    def measured_runs(
        self,
        client: MeasurementClient,
        backend: Backend,
        handle: ServerHandle,
        workload: Workload,
        max_runs: int,
        *,
        into: dict[str, list[float]] | None = None,
        stop_after: Callable[[Mapping[str, Sequence[float]], int], bool] | None = None,
    ) -> tuple[dict[str, list[float]], list[str]]:
        """The workload's warm-up, then up to ``max_runs`` measured runs: each metric's values
        (appended to ``into`` when given) and the backend's warnings, each once.
        ``stop_after(samples, n)`` is asked after the n-th run whether enough are in."""
        samples: dict[str, list[float]] = {} if into is None else into
        warnings: list[str] = []
        self.warm_up(client, handle, workload)
        for run_index in range(max_runs):
            values, extra = self.one_run(client, backend, handle, workload, run_index)
            for name, value in values.items():
                samples.setdefault(name, []).append(value)
            warnings.extend(w for w in extra if w not in warnings)
            if stop_after is not None and stop_after(samples, run_index + 1):
                break
        return samples, warnings

    def one_run(
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

    def _explain_failure(self, exc: RequestError, handle: ServerHandle, when: str) -> Exception:
        """A failed request: if the server died, say so with its exit code and log tail; if it
        hung (no token within the stall bound, or a timed-out request and then no answer to a
        health probe either), fail its later tests at once and stop it."""
        failed_at = time.monotonic()
        probe = None
        if exc.timed_out and not exc.stalled:
            # Out of time, but hung or only slow? A live server answers its health probe
            # within seconds even while busy; a frozen one does not, and must not make each
            # later test of its profile wait out the request timeout again.
            probe = probe_health(
                handle.base_url,
                handle.api_key,
                timeout=HUNG_PROBE_SECONDS,
                paths=backend_for(handle.profile).health_paths,
            )
        deadline = failed_at + 2.0
        code = handle.exit_code()
        while code is None and time.monotonic() < deadline and handle.origin != "attached":
            time.sleep(0.1)
            code = handle.exit_code()
        if code is None and (exc.stalled or probe is not None):
            why = (
                "" if probe is None else f"; then {probe}, so the server, not the request, is stuck"
            )
            hung = ServerHungError(
                f"server {handle.profile.name!r} ({handle.origin}) hung {when}: {exc}{why}. "
                "Later tests of this profile fail at once",
                log_path=str(handle.log_path) if handle.log_path else None,
                log_tail=handle.log_tail(50),
            )
            if handle.origin == "attached":
                self.attached_hung[handle.profile.name] = hung
            else:
                self.pool.mark_failed(handle.profile, hung)
            return hung
        if code is None:
            if exc.timed_out and not exc.stalled:
                return RequestError(
                    f"{exc} (the server still answers its health probe, so only this request "
                    "ran out of time: raise --specdecode-request-timeout if its responses are "
                    "just long)",
                    url=exc.url,
                    status=exc.status,
                    timed_out=True,
                )
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
