"""Waiting until a server is really ready, and failing fast when it never will be.

Ready = the process (or container) is alive AND ``GET /health_generate`` answers 200, which is
what SGLang's own CI waits for (sglang-api.md §1.2, §6). ``/health`` is used only for servers that
have no ``/health_generate`` (404). ``/v1/models`` and a bare port check are never used: both
answer before the warm-up generate has finished. A backend may name other probes (llama.cpp's
``llama-server`` has only ``/health``, which answers 503 until the model is loaded), and other
log phases (:mod:`pytest_specdecode.backends`). The launcher's exit code is polled on every
round, so a crash during a 900-second load is reported within about a second, with the tail of
the log, instead of after the timeout.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from pytest_specdecode import net
from pytest_specdecode.errors import ServerHungError, ServerStartError, ServerTimeoutError

LOG_TAIL_LINES = 50
READY_PHASE = "ready"
"""The phase a backend's last log line starts: the server says it serves (SGLang's "fired up
and ready to roll", llama-server's "listening on")."""
DEFAULT_READY_GRACE = 60.0
"""Seconds a server that logged it is ready may leave its health probe unanswered before it
counts as hung: real SGLang 0.5.15 answers ``/health_generate`` within about a second of its
"fired up" line, and its own health check gives up after 20 s."""


class LogTail:
    """Follows a growing log file: the current phase and the last lines, read incrementally.

    ``phases`` are (substring of a log line, the phase it starts, ...), the server kind's own
    (:mod:`pytest_specdecode.backends`); without them only the tail is followed. Further names
    after the first are for later occurrences of the same line (SGLang logs ``Load weight
    begin`` for the target and again for the draft); the last name repeats. The last matching
    line wins.
    """

    def __init__(
        self,
        path: Path,
        phases: Sequence[tuple[str, ...]] = (),
        keep: int = 200,
    ) -> None:
        self.path = path
        self.phases = tuple(phases)
        self.phase = "starting"
        self._seen: dict[str, int] = {}
        self._lines: deque[str] = deque(maxlen=keep)
        self._offset = 0
        self._partial = b""

    def poll(self) -> str:
        """Read what was appended since the last call; return the current phase."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._offset)
                chunk = fh.read()
        except FileNotFoundError:
            return self.phase
        self._offset += len(chunk)
        data = self._partial + chunk
        *complete, self._partial = data.split(b"\n")
        for raw in complete:
            line = raw.decode(errors="replace").rstrip("\r")
            self._lines.append(line)
            for needle, *names in self.phases:
                if needle in line:
                    seen = self._seen.get(needle, 0)
                    self._seen[needle] = seen + 1
                    self.phase = names[min(seen, len(names) - 1)]
        return self.phase

    def tail(self, n: int = LOG_TAIL_LINES) -> list[str]:
        self.poll()
        lines = list(self._lines)
        if self._partial:
            lines.append(self._partial.decode(errors="replace"))
        return lines[-n:]


@dataclass(frozen=True)
class Progress:
    """One tick of the wait, for the live progress line."""

    name: str
    elapsed: float
    phase: str
    timeout: float


def wait_until_ready(
    base_url: str,
    *,
    name: str,
    timeout: float,
    exit_code: Callable[[], int | None] | None = None,
    log: LogTail | None = None,
    api_key: str | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    poll_interval: float = 0.5,
    probe_timeout: float = 5.0,
    transport: httpx.BaseTransport | None = None,
    paths: Sequence[str] = ("/health_generate", "/health"),
    ready_grace: float = DEFAULT_READY_GRACE,
) -> float:
    """Block until the server answers its health probe with 200; return the seconds waited.

    ``paths`` are the probes in order of preference: a 404 moves on to the next.
    Raises :class:`ServerStartError` when ``exit_code()`` reports an exit (or the server rejects
    the API key), :class:`ServerHungError` when the log has said "ready" for ``ready_grace``
    seconds but the probe still gets no 200 (a server frozen right after its load must not
    hold the session for the rest of a 30-minute startup timeout) or when ``timeout`` runs out
    after it said so (a hang, named as one, not a slow load), :class:`ServerTimeoutError`
    after ``timeout`` seconds of loading. All carry the last :data:`LOG_TAIL_LINES` log lines
    and the log's path.
    """
    start = time.monotonic()
    wait = _Wait(
        base_url,
        name=name,
        timeout=timeout,
        start=start,
        log=log,
        paths=paths,
        probe_timeout=probe_timeout,
        ready_grace=ready_grace,
    )
    with _probe_client(base_url, api_key, probe_timeout, transport) as http:
        while True:
            elapsed = time.monotonic() - start
            phase = log.poll() if log else "waiting"
            code = exit_code() if exit_code else None
            if code is not None:
                raise wait.exited(code, elapsed, phase)
            if on_progress:
                on_progress(Progress(name=name, elapsed=elapsed, phase=phase, timeout=timeout))
            wait.note_phase(phase)
            status = wait.probe(http)
            if status == 200:
                return time.monotonic() - start
            if status == 404 and wait.next_path():
                continue
            if status in (401, 403):
                raise wait.key_refused(status)
            hang = wait.hang(elapsed)
            if hang is not None:
                raise hang
            if elapsed >= timeout:
                raise wait.timed_out(elapsed, phase)
            time.sleep(poll_interval)


def _probe_client(
    base_url: str,
    api_key: str | None,
    probe_timeout: float,
    transport: httpx.BaseTransport | None,
) -> httpx.Client:
    """The HTTP client of one wait's health probes."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.Client(
        base_url=base_url,
        headers=headers,
        timeout=httpx.Timeout(probe_timeout, connect=min(probe_timeout, 2.0)),
        transport=transport,
        trust_env=net.trust_env(base_url),  # the client's rule: local direct, remote proxied
        verify=net.tls_context(base_url),
    )


class _Wait:
    """What one :func:`wait_until_ready` knows between its rounds (the probe path still tried,
    when the log said "ready", what the last probe got), and the checks and errors of a round."""

    def __init__(
        self,
        base_url: str,
        *,
        name: str,
        timeout: float,
        start: float,
        log: LogTail | None,
        paths: Sequence[str],
        probe_timeout: float,
        ready_grace: float,
    ) -> None:
        self.base_url = base_url
        self.name = name
        self.timeout = timeout
        self.start = start
        self.log = log
        self.log_path = str(log.path) if log else None
        self.paths = list(paths)
        self.probe_timeout = probe_timeout
        self.ready_grace = ready_grace
        self.ready_since: float | None = None
        self.last = "no answer yet"

    def tail(self) -> list[str]:
        return self.log.tail() if self.log else []

    def exited(self, code: int, elapsed: float, phase: str) -> ServerStartError:
        """The process (or container) is gone: no probe can succeed any more."""
        return ServerStartError(
            f"{self.name} exited with code {code} after {elapsed:.1f}s while {phase}",
            log_path=self.log_path,
            log_tail=self.tail(),
            exit_code=code,
        )

    def note_phase(self, phase: str) -> None:
        """Start the hang clock the first time the log says the server is ready."""
        if phase == READY_PHASE and self.ready_since is None:
            self.ready_since = time.monotonic()

    def probe(self, http: httpx.Client) -> int | None:
        """One GET of the preferred health path: its status code, or ``None`` without an answer;
        what it got is kept for the hang message."""
        try:
            response = http.get(self.paths[0])
        except httpx.TimeoutException:
            self.last = f"timed out after {self.probe_timeout:g}s"
        except httpx.TransportError as exc:
            # the port opens only after weights and CUDA graphs are loaded
            self.last = f"{type(exc).__name__}"
        else:
            self.last = f"HTTP {response.status_code}"
            return response.status_code
        return None

    def next_path(self) -> bool:
        """After a 404: move on to the next health path, if there is one."""
        if len(self.paths) > 1:
            self.paths.pop(0)  # an older or non-SGLang server without /health_generate
            return True
        return False

    def key_refused(self, status: int) -> ServerStartError:
        """A 401 or 403: the server wants an API key this session does not send."""
        return ServerStartError(
            f"{self.name} at {self.base_url} refused the health probe with "
            f"{status}: it requires an API key; set the profile's "
            "api_key_env to the name of an environment variable that holds it",
            log_path=self.log_path,
            log_tail=self.tail(),
        )

    def hang(self, elapsed: float) -> ServerHungError | None:
        """The error of a server that said "ready" and has stayed silent past the hang bound or
        the startup timeout since; ``None`` while it has not."""
        ready_since = self.ready_since
        if ready_since is None or not (
            time.monotonic() - ready_since >= self.ready_grace or elapsed >= self.timeout
        ):
            return None
        # Said "ready", then silence: a hang after the load, whichever bound ran out
        # first. Never "raise startup_timeout": waiting longer would not help.
        quiet = time.monotonic() - ready_since
        bound = (
            f"hang bound of {self.ready_grace:g}s"
            if quiet >= self.ready_grace
            else f"startup_timeout {self.timeout:g}s"
        )
        said = next((line for line in reversed(self.tail()) if line.strip()), "")
        return ServerHungError(
            f"{self.name} logged that it is ready {ready_since - self.start:.0f}s after its "
            f"launch, but GET {self.paths[0]} has not answered 200 in the {quiet:.0f}s since "
            f"(last probe: {self.last}); gave up at the {bound}: the "
            "server is hung after its load, not loading slowly, so a longer "
            f'startup_timeout would not help. Its last log line: "{said}"; the log '
            "tail follows. --specdecode-stall-timeout sets how long a server that said "
            "it is ready may stay silent",
            log_path=self.log_path,
            log_tail=self.tail(),
        )

    def timed_out(self, elapsed: float, phase: str) -> ServerTimeoutError:
        """Still loading when the startup timeout ran out (it never said "ready")."""
        return ServerTimeoutError(
            f"{self.name} was not ready after {elapsed:.0f}s (startup_timeout {self.timeout:g}s); "
            f"last phase: {phase}. Raise the profile's startup_timeout if loading is "
            "just slow",
            log_path=self.log_path,
            log_tail=self.tail(),
        )
