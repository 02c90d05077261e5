"""A fleet of GPU boxes: which host each profile's server runs on.

The plugin schedules nothing itself: the Docker Engine API reaches each box (``ssh://``,
``tcp://``, a unix socket or a Docker context), and pytest-xdist runs the tests. What is decided
here is the *placement*, once per session and identically in every xdist process (it depends on
the collected tests alone): each profile goes to one host it may run on, so that

* one host runs one profile's server at a time (its tests form one xdist group, so one worker
  takes them in turn and never two servers load on the same GPUs), and
* different hosts load and measure in parallel (one group per host, spread over the workers).

The assignment is "least flexible, then longest first": profiles ordered by how few hosts can
take them, then by decreasing cost (a load plus their tests), each to the allowed host with the
least cost so far that has GPUs enough, ties to the host named first. That keeps the night's
length near the longest host's share, which is what a team waiting for the nightly verdict pays
for (benchmarks/bench_fleet.py: within 5% of the lower bound up to 1,000 hosts; placing pinned
profiles first cut a 10-host night from 37 to 27 tests' time, where plain longest-first was
never more than 1.2% better).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pytest_specdecode.errors import ConfigError

LOAD_COST = 3.0
"""The cost of a server load, in tests: a TP8 load is about 15 minutes, a test about 5."""


@dataclass(frozen=True)
class HostSpec:
    """``[hosts.NAME]``: a Docker engine and the GPUs behind it."""

    name: str
    docker_host: str | None = None  # unix://, tcp://, ssh://; None with env or context
    docker_host_env: str | None = None  # the variable that holds the endpoint (secrets stay out)
    context: str | None = None  # a Docker context name
    gpus: tuple[int, ...] = ()
    hardware: str | None = None  # the hardware key of its baselines (default: host-NAME)
    source: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpus", tuple(self.gpus))

    @property
    def hardware_key(self) -> str:
        return self.hardware or f"host-{self.name}"


@dataclass(frozen=True)
class Need:
    """What one profile asks of a host: how many GPUs, which hosts it may use, how many tests.

    ``indices`` are the profile's ``gpus`` as written: positions in a host's ``gpus`` list (as
    ``gpus`` index the GPUs ``CUDA_VISIBLE_DEVICES`` leaves visible on one box), so a host must
    have more GPUs than the highest of them, not merely as many as there are."""

    gpus: int
    hosts: tuple[str, ...] = ()  # empty: any host
    tests: int = 1
    indices: tuple[int, ...] = ()

    @property
    def gpus_needed(self) -> int:
        """How many GPUs a host must list to take this profile."""
        return max(self.gpus, max(self.indices, default=-1) + 1)


@dataclass
class Placement:
    """Profile name -> host name, and each host's cost (a load per profile plus its tests)."""

    host_of: dict[str, str] = field(default_factory=dict)
    cost: dict[str, float] = field(default_factory=dict)

    def group(self, profile: str) -> str:
        """The xdist group of ``profile``'s tests: its host's (one worker per host at a time)."""
        return f"specdecode-host-{self.host_of[profile]}"

    @property
    def makespan(self) -> float:
        """The largest host's cost: the night takes about this long, in tests."""
        return max(self.cost.values(), default=0.0)


def place(
    needs: Mapping[str, Need], hosts: Sequence[HostSpec], *, source: str = "the profile file"
) -> Placement:
    """Assign every profile of ``needs`` to one host (see the module docstring). A profile that
    names an unknown host, or that no allowed host has GPUs enough for, is a ``ConfigError``."""
    by_name = {host.name: host for host in hosts}
    order = {host.name: index for index, host in enumerate(hosts)}
    placement = Placement(cost=dict.fromkeys(by_name, 0.0))
    fitting = {name: _fitting(name, need, by_name, source) for name, need in needs.items()}
    ranked = sorted(
        needs.items(),
        key=lambda item: (len(fitting[item[0]]), -(LOAD_COST + item[1].tests), item[0]),
    )
    for name, need in ranked:
        best = min(fitting[name], key=lambda h: (placement.cost[h], order[h]))
        placement.host_of[name] = best
        placement.cost[best] += LOAD_COST + need.tests
    return placement


def _fitting(name: str, need: Need, by_name: Mapping[str, HostSpec], source: str) -> list[str]:
    """The hosts ``name`` may run on that have GPUs enough; a ``ConfigError`` when none."""
    allowed = need.hosts or tuple(by_name)
    unknown = [h for h in allowed if h not in by_name]
    if unknown:
        raise ConfigError(
            f"profile {name!r} may run on hosts {list(allowed)}, but {unknown} "
            f"{'is' if len(unknown) == 1 else 'are'} not defined; defined: "
            f"{', '.join(sorted(by_name)) or 'none'} (add [hosts.NAME] tables)",
            source=source,
        )
    fitting = [h for h in allowed if len(by_name[h].gpus) >= need.gpus_needed]
    if not fitting:
        asks = (
            f"uses GPUs {list(need.indices)} (positions in a host's gpus list), so it needs "
            f"a host with {need.gpus_needed}"
            if need.gpus_needed > need.gpus
            else f"needs {need.gpus} GPU(s)"
        )
        raise ConfigError(
            f"profile {name!r} {asks}, but none of its hosts "
            f"{list(allowed)} has that many ("
            + ", ".join(f"{h}: {len(by_name[h].gpus)}" for h in allowed)
            + "); give a host more gpus or the profile another host",
            source=source,
        )
    return fitting


def device_gpus(host: HostSpec, indices: Sequence[int]) -> tuple[int, ...]:
    """The GPUs of ``host`` a profile with ``gpus = indices`` gets: the host's ``gpus`` at those
    positions (``gpus = [4, 5, 6, 7]`` on the host and ``[0, 1]`` in the profile: GPUs 4 and 5
    of that box), the ids its engine is asked for and its GPU locks are named by. A profile
    without GPUs gets none. :func:`place` has checked that the positions exist."""
    return tuple(host.gpus[index] for index in indices)


def endpoint(host: HostSpec, env: Mapping[str, str]) -> str:
    """The Docker endpoint of ``host``: written in the file, read from the variable it names, or
    the Docker context's (as ``docker --context NAME`` would use). Raises ``ConfigError``."""
    if host.docker_host:
        return host.docker_host
    if host.docker_host_env:
        value = env.get(host.docker_host_env, "").strip()
        if not value:
            raise ConfigError(
                f"host {host.name!r} takes its Docker endpoint from ${host.docker_host_env}, "
                "which is not set; export it (e.g. ssh://gpu-box-2 or tcp://gpu-box-2:2376) "
                "before running pytest",
                source=host.source,
            )
        return value
    from docker.context import ContextAPI

    context = ContextAPI.get_context(host.context)
    if context is None or not context.Host:
        known = [c.Name for c in ContextAPI.contexts()]
        raise ConfigError(
            f"host {host.name!r} names the Docker context {host.context!r}, which does not "
            f"exist here (known: {', '.join(known) or 'none'}); create it with `docker context "
            "create` or give docker_host",
            source=host.source,
        )
    return str(context.Host)
