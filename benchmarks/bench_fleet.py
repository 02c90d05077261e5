"""The fleet's scheduler against many simulated hosts, and what the controller pays per host
(prints figures; not a test).

Issue 14, item 5: how the design scales to 10 and 100 boxes, measured. Three sections:

1. **Placement.** For fleets of 2, 10, 100 and 1000 hosts (three in four with 8 GPUs, the rest
   with 4; the first always 8) and 1x, 3x and 10x as many profiles (each needs 1, 2, 4 or 8 GPUs
   at random, has 1-10 tests, and three in ten may run only on a random subset of the hosts
   that fit it; fixed seed), the time :func:`pytest_specdecode.fleet.place` takes (best of a
   few calls; every xdist process computes it once per session), the makespan it reaches in
   the plugin's cost unit (a test = 1, a load = ``LOAD_COST``) against the lower bound
   ``max(total cost / hosts, largest single profile cost)`` (``bound``) and a tighter one
   that also counts the 8-GPU profiles' work over the 8-GPU hosts (``bound+gpu``: neither
   bound is always reached, since the placement has constraints), the night's length in
   hours at 5 minutes a test (a 15-minute load), and what grows with the hosts in use on the
   controller: xdist workers needed for every host to work at once (one per host in use), Docker
   clients (one per host in use), state-file entries at the peak (one live server per host),
   state-file edits over the night (about two per test, a lease taken and given back, plus
   about four per launch).
2. **The state file.** :meth:`pytest_specdecode.servers.state.StateFile.edit` (lock, load every
   entry, change one lease, write everything back), what every acquire and release goes
   through, with 10, 100 and 1000 docker entries as the pool writes them: median and 95th
   percentile per edit, the file's size; then the same edit from several processes at once
   (the lock serialises them: the edits per second the one file sustains).
3. **The engine round trip under the lock.** Each acquire prunes the state file under its lock,
   and for every ready docker entry that means
   :func:`pytest_specdecode.servers.docker.recorded.docker_server_alive`: a new client, a ping and a
   container lookup on that entry's engine. Measured against the engines of
   ``SPECDECODE_FLEET_DOCKER_HOSTS`` (space-separated; default: ``DOCKER_HOST`` or the local
   socket) with a sleeping container of the simulated server's image, and multiplied out to
   10 and 100 ready entries. Skipped (and said so) when no engine answers; ``--no-docker``
   skips it.

``python benchmarks/bench_fleet.py [--seed 14] [--sections 1 2 3] [--max-hosts 1000]``; the
defaults take about a minute on a 2-core machine, most of it the 1000-host placements.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tabulate import tabulate

from pytest_specdecode.fleet import LOAD_COST, HostSpec, Need, Placement, place
from pytest_specdecode.servers.state import Entry, Owner, StateFile

GPU_NEEDS = (1, 2, 4, 8)
MINUTES_PER_TEST = 5.0  # fleet.LOAD_COST's unit: a test about 5 minutes, a TP8 load about 15
EDITS_PER_TEST = 2  # acquire (_plan) and release (_drop_lease, or the hold's last_used stamp)
EDITS_PER_LAUNCH = 4  # _plan's loading entry, the identity, ready, and the stop's removal


# -- 1. placement ----------------------------------------------------------------------------


@dataclass
class Fleet:
    hosts: list[HostSpec]
    needs: dict[str, Need]


def make_fleet(n_hosts: int, n_profiles: int, rng: random.Random) -> Fleet:
    hosts = [
        HostSpec(
            name=f"box-{i:04d}",
            docker_host=f"ssh://ci@box-{i:04d}",
            gpus=tuple(range(8 if i == 0 or rng.random() < 0.75 else 4)),
        )
        for i in range(n_hosts)
    ]
    needs: dict[str, Need] = {}
    for p in range(n_profiles):
        gpus = rng.choice(GPU_NEEDS)
        allowed: tuple[str, ...] = ()
        if rng.random() < 0.3:
            fitting = [h.name for h in hosts if len(h.gpus) >= gpus]
            k = rng.randint(1, max(1, min(len(fitting), n_hosts // 10)))
            allowed = tuple(rng.sample(fitting, k))
        needs[f"profile-{p:05d}"] = Need(gpus=gpus, hosts=allowed, tests=rng.randint(1, 10))
    return Fleet(hosts, needs)


def cost_of(need: Need) -> float:
    return LOAD_COST + need.tests


def fitting_hosts(need: Need, hosts: Sequence[HostSpec]) -> frozenset[str]:
    allowed = set(need.hosts) if need.hosts else None
    return frozenset(
        h.name for h in hosts if (allowed is None or h.name in allowed) and len(h.gpus) >= need.gpus
    )


def bounds(fleet: Fleet) -> tuple[float, float]:
    """Lower bounds on the makespan: ``max(total / hosts, largest)``, and the best of that and
    of what the constraints force: for every set S of hosts that some profile is confined to
    (its allowed hosts with GPUs enough: the 8-GPU hosts for an 8-GPU profile, a pin), the work
    of the profiles confined within S, over the size of S."""
    costs = [cost_of(n) for n in fleet.needs.values()]
    basic = max(sum(costs) / len(fleet.hosts), max(costs))
    confined: dict[frozenset[str], float] = {}
    for need in fleet.needs.values():
        hosts = fitting_hosts(need, fleet.hosts)
        if len(hosts) < len(fleet.hosts):
            confined[hosts] = confined.get(hosts, 0.0) + cost_of(need)
    by_first: dict[str, list[frozenset[str]]] = {}  # a set within S has its first host in S
    for hosts in confined:
        by_first.setdefault(min(hosts), []).append(hosts)
    best = basic
    for outer in confined:
        candidates = (inner for h in outer for inner in by_first.get(h, ()))
        work = sum(confined[inner] for inner in candidates if inner <= outer)
        best = max(best, work / len(outer))
    return basic, best


def place_fewest_hosts_first(needs: dict[str, Need], hosts: Sequence[HostSpec]) -> Placement:
    """Not the plugin's: place() with the profiles ordered by how few hosts fit them, then by
    decreasing cost (the least flexible first), for comparison."""
    by_name = {h.name: h for h in hosts}
    order = {h.name: i for i, h in enumerate(hosts)}
    fits = {name: fitting_hosts(need, hosts) for name, need in needs.items()}
    placement = Placement(cost=dict.fromkeys(by_name, 0.0))
    ranked = sorted(needs.items(), key=lambda it: (len(fits[it[0]]), -cost_of(it[1]), it[0]))
    for name, need in ranked:
        best = min(fits[name], key=lambda h: (placement.cost[h], order[h]))
        placement.host_of[name] = best
        placement.cost[best] += cost_of(need)
    return placement


def time_place(fleet: Fleet, budget_s: float = 0.5, most: int = 5) -> tuple[float, Placement]:
    """The best of a few calls of place(), in seconds, and its placement."""
    best = float("inf")
    placement = Placement()
    spent = 0.0
    calls = 0
    while calls < most and (calls == 0 or spent < budget_s):
        t0 = time.perf_counter()
        placement = place(fleet.needs, fleet.hosts)
        took = time.perf_counter() - t0
        best = min(best, took)
        spent += took
        calls += 1
    return best, placement


def hours(cost: float) -> str:
    return f"{cost * MINUTES_PER_TEST / 60:.1f}"


def bench_placement(seed: int, host_counts: Sequence[int], ratios: Sequence[int]) -> None:
    rows = []
    for n_hosts in host_counts:
        for ratio in ratios:
            rng = random.Random(f"{seed}-{n_hosts}-{ratio}")
            fleet = make_fleet(n_hosts, n_hosts * ratio, rng)
            seconds, placement = time_place(fleet)
            basic, tight = bounds(fleet)
            other = place_fewest_hosts_first(fleet.needs, fleet.hosts).makespan
            in_use = sum(1 for c in placement.cost.values() if c > 0)
            tests = sum(n.tests for n in fleet.needs.values())
            total = sum(cost_of(n) for n in fleet.needs.values())
            restricted = sum(1 for n in fleet.needs.values() if n.hosts)
            edits = EDITS_PER_TEST * tests + EDITS_PER_LAUNCH * len(fleet.needs)
            rows.append(
                [
                    n_hosts,
                    f"{len(fleet.needs)} ({restricted} pinned)",
                    f"{seconds * 1000:.2f}" if seconds < 1 else f"{seconds * 1000:.0f}",
                    f"{placement.makespan:g}",
                    f"{basic:.1f}",
                    f"{placement.makespan / basic:.3f}",
                    f"{tight:.1f}",
                    f"{placement.makespan / tight:.3f}",
                    f"{other:g} ({other / tight:.3f})",
                    hours(placement.makespan),
                    hours(total),
                    in_use,
                    edits,
                ]
            )
            print(f"   placed {n_hosts} hosts x{ratio} in {seconds:.3f} s", file=sys.stderr)
    print(
        "\n1. Placement (fleet.place): least flexible, then longest first, over simulated hosts "
        f"(seed {seed}; cost unit: a test = 1, a load = {LOAD_COST:g})"
    )
    print(
        tabulate(
            rows,
            headers=[
                "hosts",
                "profiles",
                "place ms",
                "makespan",
                "bound",
                "/ bound",
                "bound*",
                "/ bound*",
                "fewest hosts first (/ bound*)",
                "night h",
                "one box h",
                "hosts in use = workers = clients = peak entries",
                "state edits / night",
            ],
            tablefmt="github",
            disable_numparse=True,
        )
    )
    print(
        f"   night h: the makespan at {MINUTES_PER_TEST:g} min a test; one box h: everything on "
        "one box. Every xdist process (the controller and each worker) computes the placement "
        "once; the state edits are the whole night's, about "
        f"{EDITS_PER_TEST} per test and {EDITS_PER_LAUNCH} per launch."
    )


# -- 2. the state file -----------------------------------------------------------------------


def docker_entry(i: int, pid: int) -> Entry:
    """A ready docker entry the size the pool writes (identity, build parts, a lease)."""
    fingerprint = f"{i:08x}" + "f" * 56
    digest = f"{fingerprint}-{'b' * 16}"
    port = 10000 + i % 10000
    name = f"box-{i:04d}"
    fields: dict[str, Any] = {
        "digest": digest,
        "profile": f"eagle3-{i}-step-nccl",
        "url": f"http://{name}:{port}",
        "identity": {
            "kind": "docker",
            "container_id": f"{i:064x}",
            "name": f"specdecode-eagle3-{i}-step-nccl-{port}",
            "image": "lmsysorg/sglang:v0.5.15-cu129",
            "host": name,
            "port": port,
            "network": "host",
            "docker_host": f"ssh://ci@{name}",
        },
        "gpus": list(range(8)),
        "status": "ready",
        "owner": Owner(run=f"run-{'r' * 12}", pid=pid),
        "log_path": f"/tmp/pytest-of-ci/pytest-7/specdecode/eagle3-{i}-20261202-031500-{pid}.log",
        "leases": {f"run-{'r' * 12}:gw{i}:{pid}": 1},
        "fingerprint": fingerprint,
        "build": {
            "image": "lmsysorg/sglang:v0.5.15-cu129",
            "image_id": "sha256:" + "c" * 64,
            "env": "e" * 16,
        },
    }
    if any(f.name == "host" for f in dataclasses.fields(Entry)):
        fields["host"] = name  # the pool's host awareness (#14) records the [hosts.NAME]
    return Entry(**fields)


def fill_state(directory: Path, n_entries: int) -> StateFile:
    state = StateFile(directory)
    with state.edit() as entries:
        for i in range(n_entries):
            entry = docker_entry(i, os.getpid())
            entries[entry.digest] = entry
    return state


def one_edit(state: StateFile, key: str, i: int) -> None:
    """What an acquire does to the file: take one lease on one entry (here: toggle it)."""
    with state.edit() as entries:
        entry = entries[key]
        if entry.leases.pop(f"bench:{i}", None) is None:
            entry.leases[f"bench:{i}"] = 1
        entry.last_used_unix = time.time()


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _hammer(directory: str, key: str, edits: int, start_at: float, out: Any) -> None:
    state = StateFile(Path(directory))
    while time.time() < start_at:
        time.sleep(0.001)
    waits = []
    for i in range(edits):
        t0 = time.perf_counter()
        one_edit(state, key, os.getpid() * 1000 + i)
        waits.append(time.perf_counter() - t0)
    out.put(waits)


def contended(directory: Path, key: str, processes: int, edits: int) -> tuple[float, list[float]]:
    """Edits per second the one file sustains from ``processes`` at once, and the time each
    edit took (waiting for the lock included)."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    start_at = time.time() + 0.5
    procs = [
        ctx.Process(target=_hammer, args=(str(directory), key, edits, start_at, queue))
        for _ in range(processes)
    ]
    for proc in procs:
        proc.start()
    waits: list[float] = []
    for _ in procs:
        waits.extend(queue.get())
    for proc in procs:
        proc.join()
    wall = time.time() - start_at
    return processes * edits / wall, waits


def bench_state_file(sizes: Sequence[int], processes: int) -> None:
    rows = []
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="bench-fleet-state-") as tmp:
            state = fill_state(Path(tmp), n)
            key = next(iter(state.snapshot()))
            repeats = max(20, min(200, 20_000 // n))
            times = []
            for i in range(repeats):
                t0 = time.perf_counter()
                one_edit(state, key, i)
                times.append(time.perf_counter() - t0)
            size_kb = state.path.stat().st_size / 1024
            per_s, waits = contended(Path(tmp), key, processes, max(10, repeats // 4))
            rows.append(
                [
                    n,
                    f"{size_kb:.0f}",
                    f"{statistics.median(times) * 1000:.2f}",
                    f"{percentile(times, 0.95) * 1000:.2f}",
                    f"{per_s:.0f}",
                    f"{statistics.median(waits) * 1000:.1f}",
                    f"{percentile(waits, 0.95) * 1000:.1f}",
                ]
            )
    print("\n2. The state file (StateFile.edit: lock, load all, change one lease, write back)")
    print(
        tabulate(
            rows,
            headers=[
                "entries",
                "file KiB",
                "edit ms (median)",
                "edit ms (p95)",
                f"edits/s, {processes} processes at once",
                "there: ms per edit, median",
                "p95 (lock wait incl.)",
            ],
            tablefmt="github",
            disable_numparse=True,
        )
    )


# -- 3. the engine round trip under the lock ---------------------------------------------------


def engines() -> list[str]:
    listed = os.environ.get("SPECDECODE_FLEET_DOCKER_HOSTS", "").split()
    return listed or [os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"]


@contextlib.contextmanager
def sleeping_container(docker_host: str) -> Iterator[str | None]:
    """A running container with the plugin's managed label on ``docker_host``; its id, or
    ``None`` when the engine or the image is not there."""
    from pytest_specdecode.servers.docker.container import LABEL_MANAGED, SIM_IMAGE
    from pytest_specdecode.servers.docker.engine import connect

    try:
        client = connect(docker_host)
    except Exception as exc:
        print(f"   {docker_host}: no engine ({str(exc).splitlines()[0][:120]})", file=sys.stderr)
        yield None
        return
    try:
        try:
            client.images.get(SIM_IMAGE)
        except Exception:
            print(f"   {docker_host}: no {SIM_IMAGE} (scripts/provision-docker-fleet.sh)")
            yield None
            return
        container = client.containers.run(
            SIM_IMAGE,
            ["python3", "-c", "import time; time.sleep(600)"],
            detach=True,
            network_mode="host",
            init=True,
            labels={LABEL_MANAGED: "1", "pytest-specdecode.bench": "fleet"},
            name=f"bench-fleet-{os.getpid()}-{time.time_ns() % 10**6}",
        )
        try:
            yield str(container.id)
        finally:
            container.remove(force=True)
    finally:
        client.close()


def bench_engine_round_trip(repeats: int) -> None:
    from pytest_specdecode.servers.docker.recorded import docker_server_alive

    rows = []
    for docker_host in engines():
        with sleeping_container(docker_host) as container_id:
            if container_id is None:
                continue
            identity = {"kind": "docker", "container_id": container_id, "docker_host": docker_host}
            assert docker_server_alive(identity), "the sleeping container should be alive"
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                docker_server_alive(identity)
                times.append(time.perf_counter() - t0)
            median = statistics.median(times)
            rows.append(
                [
                    docker_host,
                    f"{median * 1000:.1f}",
                    f"{percentile(times, 0.95) * 1000:.1f}",
                    f"{10 * median * 1000:.0f}",
                    f"{100 * median * 1000:.0f}",
                ]
            )
    print("\n3. docker_server_alive (new client + ping + container lookup), once per ready docker")
    print("   entry in every acquire's prune, under the state file's lock")
    if not rows:
        print("   skipped: no engine with the simulated server's image answered")
        return
    print(
        tabulate(
            rows,
            headers=[
                "engine",
                "ms (median)",
                "ms (p95)",
                "prune ms, 10 ready entries",
                "prune ms, 100 ready entries",
            ],
            tablefmt="github",
            disable_numparse=True,
        )
    )


# -- main --------------------------------------------------------------------------------------


def commit() -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "pytest_specdecode"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return head + (" + uncommitted changes to pytest_specdecode/" if dirty else "")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--sections", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--max-hosts", type=int, default=1000)
    parser.add_argument("--processes", type=int, default=4, help="section 2's writers at once")
    parser.add_argument("--repeats", type=int, default=30, help="section 3's calls per engine")
    parser.add_argument("--no-docker", action="store_true", help="skip section 3")
    args = parser.parse_args(argv)
    import pytest_specdecode

    print(
        f"bench_fleet: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
        f"pytest_specdecode from {Path(pytest_specdecode.__file__).parent} at {commit()}"
    )
    if 1 in args.sections:
        counts = [n for n in (2, 10, 100, 1000) if n <= args.max_hosts]
        bench_placement(args.seed, counts, (1, 3, 10))
    if 2 in args.sections:
        bench_state_file((10, 100, 1000), args.processes)
    if 3 in args.sections and not args.no_docker:
        bench_engine_round_trip(args.repeats)


if __name__ == "__main__":
    main()
