"""What a unit of work will cost, from what the launches on this card cost so far.

A unit is one pytest session of record or check (one profile), the attach phase, a noise batch
or the probe. Its cost is mostly server launches: start-up, load, CUDA-graph capture, warm-up,
the runs, the stop. The first launch on a fresh machine also compiles triton's kernels (a
minute or more on the H100 and the H200); later ones find them in the cache. So the estimate
keeps three figures apart:

* ``launch_s``: a warm launch without SGLang's preflight (the pytest session's wall time per
  launch, less its preflights and less what the compiling launch added);
* ``preflight_s``: SGLang's own argument check before a launch (it imports torch: 18-30 s);
* ``first_extra_s``: what the first launch on a machine adds (its ready time less a warm one's).

Each is the largest seen on this card so far (a unit must fit, not fit on average), else a
prior. A call starts a unit only when ``cost <= seconds left``: it stops only when the next
unit really does not fit.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Session:
    """One pytest session (or the hand-started server of attach) that launched servers."""

    wall_s: float | None  # None: not one launch's session (attach: a server and two sessions)
    ready_s: tuple[float, ...]
    preflight_s: tuple[float, ...]
    first_on_boot: bool  # it held the first launch of its machine (triton compiling)


@dataclass(frozen=True)
class Costs:
    launch_s: float
    preflight_s: float
    first_extra_s: float
    warm_ready_s: float
    basis: str

    def unit(self, launches: int, *, preflight: bool, first_on_boot: bool) -> float:
        """Seconds for a pytest session of ``launches`` launches."""
        per = self.launch_s + (self.preflight_s if preflight else 0.0)
        return launches * per + (self.first_extra_s if first_on_boot and launches else 0.0)

    def describe(self) -> str:
        return (
            f"a warm launch {self.launch_s:.0f}s, preflight {self.preflight_s:.0f}s, the first "
            f"launch on a machine +{self.first_extra_s:.0f}s ({self.basis})"
        )


# Before anything is seen: what the H200 and the H100 gave on 2026-12-03/05 (warm ready
# 54-85 s, a launch's session about 100-125 s with its preflight of 18-27 s, the first launch
# ready after 125-150 s). The dry run's simulated server is ready in seconds.
PRIOR = Costs(launch_s=100.0, preflight_s=25.0, first_extra_s=80.0, warm_ready_s=75.0,
              basis="prior: the H100/H200 figures of 2026-12-03/05")  # fmt: skip
DRY_PRIOR = Costs(launch_s=30.0, preflight_s=0.0, first_extra_s=0.0, warm_ready_s=5.0,
                  basis="prior: the simulated server")  # fmt: skip
ATTACH_EXTRA_S = 30.0  # attach runs two pytest sessions against its one server
PROBE_S = 15.0  # the bandwidth probe: torch's import and a 4 GiB copy, ten times (3 s, H100)


def estimate(sessions: Iterable[Session], prior: Costs) -> Costs:
    seen = [s for s in sessions if s.ready_s]
    if not seen:
        return prior
    warm_ready = [
        r for s in seen for i, r in enumerate(s.ready_s) if not (s.first_on_boot and i == 0)
    ]
    typical_ready = statistics.median(warm_ready) if warm_ready else prior.warm_ready_s
    extras = [max(0.0, s.ready_s[0] - typical_ready) for s in seen if s.first_on_boot]
    preflights = [p for s in seen for p in s.preflight_s]
    per_launch = []
    for s in seen:
        if s.wall_s is None:
            continue
        extra = max(0.0, s.ready_s[0] - typical_ready) if s.first_on_boot else 0.0
        per_launch.append((s.wall_s - sum(s.preflight_s) - extra) / len(s.ready_s))
    return Costs(
        launch_s=max(per_launch) if per_launch else prior.launch_s,
        preflight_s=max(preflights) if preflights else prior.preflight_s,
        first_extra_s=max(extras) if extras else prior.first_extra_s,
        warm_ready_s=typical_ready,
        basis=f"the largest of {len(seen)} session(s) on this card"
        + ("" if warm_ready else "; no warm launch yet: its ready time is the prior's"),
    )


def sessions_from(results: Path) -> list[Session]:
    """The sessions that the results of one card record, in the order they ran; the first
    one with launches on ``boot`` (and on every other boot) is the compiling one."""
    rows: list[tuple[float, str, Session]] = []
    for path in results.glob("*.json"):
        if path.name.endswith("-report.json"):
            continue
        data: dict[str, Any] = json.loads(path.read_text())
        if not data.get("ready_s") or "profiles_done" in data:
            continue  # merged phase files repeat their profiles' sessions
        given = data["ready_s"]
        ready = tuple(given) if isinstance(given, list) else (float(given),)
        wall = data.get("wall_s") if data.get("kind") == "session" else None
        session = Session(
            wall_s=None if wall is None else float(wall),
            ready_s=ready,
            preflight_s=tuple(data.get("preflight_s") or ()),
            first_on_boot=False,
        )
        rows.append((float(data.get("started", 0.0)), str(data.get("boot", "")), session))
    rows.sort(key=lambda r: r[0])
    out = []
    booted: set[str] = set()
    for _, b, s in rows:
        first = b not in booted and b != ""
        booted.add(b)
        out.append(Session(s.wall_s, s.ready_s, s.preflight_s, first_on_boot=first))
    return out


def launched_on(results: Path, boot: str) -> bool:
    """Whether a server was started on this boot already (then no compiling launch is left)."""
    for path in results.glob("*.json"):
        if path.name.endswith("-report.json"):
            continue
        data = json.loads(path.read_text())
        if data.get("boot") == boot and data.get("ready_s"):
            return True
    return False


def fits(need: float, left: float) -> bool:
    return need <= left


def say_cost(what: str, need: float, left: float) -> str:
    room = "no deadline" if left == float("inf") else f"{left:.0f}s left before the deadline"
    return f"{what}: about {need:.0f}s; {room}"
