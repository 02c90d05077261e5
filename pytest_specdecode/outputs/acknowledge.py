"""``python -m pytest_specdecode acknowledge``: accept a change as the new normal, without a GPU.

A team that keeps a change the cross-night detector flagged (an intended slowdown, an upgrade it
lives with) marks it in the history: one line of its own, with no tests, naming the test (or
``*``), optionally a hardware key and a metric, who accepted it and why. Every reader of the
history (the session's detector, ``report``, the dashboard) then starts that series' level anew
from the nights after it and keeps the night-to-night SD it had learnt
(:mod:`pytest_specdecode.stats.night_series`). Nothing is launched and no baseline changes: the
nightly gate still compares with the stored baseline, so a claim that no longer holds needs a
new baseline (``--update-baselines``) all the same.
"""

from __future__ import annotations

import difflib
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pytest_specdecode import __version__
from pytest_specdecode.errors import SpecdecodeError
from pytest_specdecode.outputs.history import HISTORY_SCHEMA_VERSION, append_history
from pytest_specdecode.stats.night_series import acknowledgement_matches

__all__ = ["Acknowledgement", "acknowledge"]


@dataclass(frozen=True)
class Acknowledgement:
    """What is accepted: a test's series (``*``: every test), narrowed by hardware key and
    metric when given, by whom and why."""

    test_id: str
    by: str
    why: str
    hardware_key: str | None = None
    metric: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "test_id": self.test_id,
            "hardware_key": self.hardware_key,
            "metric": self.metric,
            "by": self.by,
            "why": self.why,
        }


def acknowledge(
    path: Path,
    ack: Acknowledgement,
    records: Sequence[Mapping[str, Any]],
    *,
    now: datetime | None = None,
) -> list[str]:
    """Append ``ack`` to the history at ``path`` (whose parsed ``records`` are given, to check
    that it names series that exist) and return what it restarts, one line per series."""
    for name, value in (("--by", ack.by), ("--why", ack.why), ("--test", ack.test_id)):
        if not value.strip():
            raise SpecdecodeError(f"acknowledge: {name} is empty; say who accepts what, and why")
    matched = sorted(
        {
            (str(test.get("test_id")), str(test.get("hardware_key")), metric)
            for record in records
            for test in record.get("tests") or ()
            if isinstance(test, Mapping) and test.get("outcome") != "recorded"
            for metric in (test.get("crossnight") or test.get("metrics") or {})
            if acknowledgement_matches(
                ack.to_json(), str(test.get("test_id")), str(test.get("hardware_key")), metric
            )
        }
    )
    if not matched:
        raise SpecdecodeError(_nothing_matches(path, ack, records))
    when = (now or datetime.now(timezone.utc)).isoformat(timespec="seconds")
    record = {
        "schema_version": HISTORY_SCHEMA_VERSION,
        "time_utc": when.replace("+00:00", "Z"),
        "started_utc": None,
        "run_id": f"acknowledge-{uuid.uuid4().hex[:8]}",
        "commit": None,
        "dirty": None,
        "plugin_version": __version__,
        "target": None,
        "hardware_keys": [ack.hardware_key] if ack.hardware_key else [],
        "gpu": None,
        "exit_status": None,
        "simulated": False,
        "tests": [],
        "acknowledgements": [ack.to_json()],
    }
    append_history(path, record)
    return [f"{test_id} on {hardware} ({metric})" for test_id, hardware, metric in matched]


def _nothing_matches(path: Path, ack: Acknowledgement, records: Sequence[Mapping[str, Any]]) -> str:
    tests = sorted({str(t.get("test_id")) for r in records for t in r.get("tests") or ()})
    keys = sorted({str(t.get("hardware_key")) for r in records for t in r.get("tests") or ()})
    what = (
        f"test {ack.test_id!r}"
        + (f" on hardware key {ack.hardware_key!r}" if ack.hardware_key else "")
        + (f", metric {ack.metric!r}" if ack.metric else "")
    )
    close = difflib.get_close_matches(ack.test_id, tests, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return (
        f"acknowledge: no night in {path} measured {what}, so nothing would restart{hint} The "
        f"history has the tests {', '.join(tests) or '(none)'} on {', '.join(keys) or '(none)'}; "
        "use --test '*' for every test"
    )
