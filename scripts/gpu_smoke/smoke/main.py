"""The order of a call: restore, plan, the phases unit by unit (each priced before it starts),
the state carried out after every unit, the table.

    scripts/gpu_smoke/driver.py [PHASE ...]     # default: record check attach noise-summary table
    scripts/gpu_smoke/driver.py table [DIR ...] # merge results folders (no GPU)
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from smoke import budget, phases, spread, state, suite
from smoke import table as tables
from smoke.common import (
    DRY_RUN,
    INCOMPLETE,
    OUT,
    PROFILE_TESTS,
    STATE,
    baseline_launches,
    card,
    load,
    log,
    seconds_left,
)  # fmt: skip

DEFAULT = ["record", "check", "attach", "noise-summary", "table"]
KNOWN = (
    "record", "check", "attach", "noise-summary", "table",  # the default
    "noise", "launches", "spread-record", "spread-check", "spread-swap",  # on request
)  # fmt: skip


def phase_cost(phase: str, first: bool) -> tuple[float, str]:
    """(seconds, what) the phase still needs on this card; ``first``: its first launch is
    the first on this machine."""
    c = phases.costs()
    if phase in ("record", "check"):
        todo = [p for p in PROFILE_TESTS if not phases.unit_done(phase, p)]
        launches = baseline_launches() if phase == "record" else 1
        need = sum(
            c.unit(launches, preflight=phase == "record", first_on_boot=first and i == 0)
            for i in range(len(todo))
        )
        what = f"{len(todo)} profile(s) x {launches} launch(es)" if todo else "done"
        if phase == "check":
            what += ", SGLang's preflight skipped (record ran it)" if todo else ""
        return need, what
    if phase == "attach":
        done = (load("attach") or {}).get("passed")
        cost = c.unit(1, preflight=False, first_on_boot=first) + budget.ATTACH_EXTRA_S
        return (0.0, "done") if done else (cost, "1 server by hand, 2 pytest sessions")
    if phase == "noise-summary":
        done = load("noise-probe") is not None
        return (0.0, "done") if done else (budget.PROBE_S, "the copy probe; no launch")
    if phase == "noise":
        need, batches = phases.noise_cost()
        return need, f"{batches} batch(es) of servers started together"
    return 0.0, "not priced" if phase in ("launches", *spread.PHASES) else ""


def plan(wanted: list[str]) -> None:
    c = phases.costs()
    first = phases.first_on_boot()
    machine = "fresh: its first launch compiles" if first else "has launched servers before"
    log(f"card {card()}; this machine {machine}")
    log(f"costs: {c.describe()}")
    total = 0.0
    for phase in wanted:
        need, what = phase_cost(phase, first)
        first = first and need == 0.0
        total += need
        log(f"  {phase}: about {need:.0f}s ({what})" if what else f"  {phase}")
    left = seconds_left()
    room = "no deadline" if left == float("inf") else f"{left:.0f}s left before the deadline"
    log(f"  in all about {total:.0f}s; {room}")


def checkpoint() -> None:
    """The table and the state archive to $OUT: what a call cut short still brings back."""
    try:
        tables.phase_table([], guard=GUARD.get("text"))
    except Exception as exc:  # the state matters more than the table
        log(f"the table could not be written: {exc!r}")
    files = state.pack(STATE, OUT)
    size = sum(f.stat().st_size for f in files)
    log(f"state carried out: {', '.join(f.name for f in files)} ({size / 1024:.0f} KiB)")


GUARD: dict[str, str] = {}


def run_phase(phase: str) -> int:
    if phase in ("record", "check"):
        return phases.phase_suite(phase, checkpoint)
    if phase == "attach":
        return phases.phase_attach()
    if phase == "noise-summary":
        return phases.phase_probe()
    if phase == "noise":
        return phases.phase_noise(checkpoint)
    if phase == "launches":
        return phases.phase_launches()
    if phase in spread.PHASES:
        return spread.phase_spread(phase)
    return 0  # table: written at the end of every call


def main(argv: list[str]) -> int:
    wanted = argv or DEFAULT
    if wanted[0] == "table" and len(wanted) > 1:  # table DIR...: merge results, no GPU
        return tables.phase_table([Path(p) for p in wanted[1:]])
    unknown = [p for p in wanted if p not in KNOWN]
    if unknown:
        log(f"unknown phase(s) {unknown}: choose among {', '.join(KNOWN)}")
        return 2
    source = os.environ.get("GPU_SMOKE_RESTORE")
    if source:
        try:
            log(state.restore(Path(source), STATE))
        except (OSError, ValueError) as exc:
            log(f"GPU_SMOKE_RESTORE={source}: {exc}")
            return 2
    GUARD["text"] = suite.write_suite()
    plan(wanted)
    rc = 0
    for phase in wanted:
        t0 = time.monotonic()
        need, what = phase_cost(phase, phases.first_on_boot())
        if phase != "table":
            log(budget.say_cost(f"phase {phase}, {what}", need, seconds_left()))
        code = run_phase(phase)
        log(f"phase {phase}: exit {code} after {time.monotonic() - t0:.0f}s")
        rc = rc or code
        if phase != "table":
            checkpoint()
        if code == INCOMPLETE:
            break
    checkpoint()
    problems = state.out_problems(OUT)
    for problem in problems:
        log(f"$OUT would not come back whole from a lent machine: {problem}")
    restore_hint = f"GPU_SMOKE_RESTORE=<the {state.ARCHIVE} of this call>"
    if rc == INCOMPLETE:
        log(
            "not finished before GPU_SMOKE_DEADLINE: run the same command again with a new "
            f"deadline; on this machine the state in {STATE} carries over, on a fresh one "
            f"give {restore_hint} (in {OUT} now)"
        )
    elif rc == 0:
        log(f"all phases done: {' '.join(wanted)}" + (" (dry run)" if DRY_RUN else ""))
    return rc or (1 if problems else 0)
