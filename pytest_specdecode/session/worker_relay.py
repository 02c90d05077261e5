"""Results on their way from xdist workers to the controller, in plain values: what a worker
sends up with each test's teardown report and at its end (:class:`Outbox`,
:func:`worker_output`), and what the controller makes of it (:class:`Inbox`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pytest_specdecode.result import SpecdecodeResult
from pytest_specdecode.servers.handle import ServerCounts

if TYPE_CHECKING:
    from pytest_specdecode.session.orchestrator import SpecdecodeSession

RESULTS_ATTR = "specdecode_results"
"""The attribute of a worker's teardown report that carries its results to the controller."""
TEST_ID_ATTR = "specdecode_test_id"
"""The attribute of a specdecode test's reports naming its result's test id (xdist carries it),
so that a failure found after the test can be reported under the test's own node id."""
LATE_ATTR = "specdecode_failed_after_test"
"""Marks the report the plugin makes at the session's end for a failure found after its test."""


class Outbox:
    """What an xdist worker has sent up, so each teardown report carries only what is new or
    changed (a baseline's later launches add runs to a result already sent)."""

    def __init__(self) -> None:
        self._sent: dict[int, dict[str, Any]] = {}

    def take(self, results: list[SpecdecodeResult]) -> list[dict[str, Any]]:
        outgoing = []
        for index, result in enumerate(results):
            data = result.to_json()
            if self._sent.get(index) != data:
                self._sent[index] = data
                outgoing.append({"index": index, "result": data})
        return outgoing


def worker_output(session: SpecdecodeSession, outbox: Outbox) -> dict[str, Any]:
    """What a worker's end hands the controller (xdist's ``workeroutput``): the results the
    teardown reports have not carried up (those of the profiles whose remaining baseline
    launches ran at the end), its server counts and its placement."""
    return {
        "specdecode_results": outbox.take(session.results),
        "specdecode_servers": session.pool.counts.to_json(),
        "specdecode_placement": session.placement_lines(),
    }


class Inbox:
    """The controller's side: the workers' results in the session's results, new ones appended,
    changed ones replaced."""

    def __init__(self, session: SpecdecodeSession) -> None:
        self._session = session
        self._received: dict[tuple[str, int], int] = {}  # (worker, its index) -> our index

    def receive(self, worker: str, entries: list[dict[str, Any]]) -> None:
        results = self._session.results
        for entry in entries:
            result = SpecdecodeResult.from_json(entry["result"])
            key = (worker, int(entry["index"]))
            if key in self._received:
                results[self._received[key]] = result
            else:
                self._received[key] = len(results)
                results.append(result)

    def worker_down(self, worker: str, output: Mapping[str, Any], error: object) -> None:
        """A worker ended (``error``: None, or why it went down): its last results, server
        counts and placement; a worker that went down makes an ERROR line."""
        session = self._session
        self.receive(worker, output.get("specdecode_results", []))
        if error is not None:
            lines = [line for line in str(error).splitlines() if line.strip()]
            last = lines[-1] if lines else repr(error)  # a traceback's last line names it
            session.output_lines.append(
                f"ERROR: xdist worker {worker} went down: {last} "
                "(its traceback is above), so this session fails; the results it had sent "
                "before are kept"
            )
        session.servers.add(ServerCounts.from_json(output.get("specdecode_servers", {})))
        # every worker placed the same collection the same way: the first one's says it all
        session.placement_seen = session.placement_seen or list(
            output.get("specdecode_placement", [])
        )
