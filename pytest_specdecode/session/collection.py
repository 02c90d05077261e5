"""The collected tests, planned: which are specdecode tests, their profile, workload and test
id, the order they run in and the xdist group that keeps a profile's tests on one worker.

The plugin reads each collected item into a :class:`Collected` (plain values), hands the list
to :func:`plan_collection` and applies the :class:`CollectionPlan` to pytest's items.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_specdecode.errors import ConfigError
from pytest_specdecode.markers import MARKER_HELP, MarkerSpec, parse_marker
from pytest_specdecode.profiles.profile import ALGORITHM_MARKERS
from pytest_specdecode.settings import project_test_id

if TYPE_CHECKING:
    from pytest_specdecode.session.orchestrator import SpecdecodeSession


NO_PROFILE = (
    "specdecode_server needs a profile: mark the test with @pytest.mark.specdecode('PROFILE') "
    "or parametrize specdecode_server indirectly"
)


def untaggable(pytest_version: str) -> str:
    """The warning when this pytest keeps a node id from taking its xdist group's tag."""
    return (
        f"cannot tag node ids with their xdist_group on pytest {pytest_version}: a profile's "
        "tests may run on several workers, each launching its own server"
    )


def marker_lines() -> list[str]:
    """The ini ``markers`` lines the plugin registers: its own marker, and one per algorithm
    (each test gets its profile's, before ``-m`` deselects)."""
    return [MARKER_HELP] + [
        f"{name}: tests whose server profile uses {name} (added automatically by pytest-specdecode)"
        for name in ALGORITHM_MARKERS
    ]


@dataclass(frozen=True)
class Collected:
    """A collected test as the plugin read it from pytest."""

    nodeid: str
    path: Path
    marker: tuple[Sequence[Any], Mapping[str, Any]] | None
    """The ``specdecode`` marker's args and kwargs, or None without one."""
    server_param: str | None
    """The profile ``specdecode_server`` is parametrized with (``indirect``), if any."""


@dataclass(frozen=True)
class Planned:
    """A specdecode test, planned."""

    spec: MarkerSpec
    """The marker's arguments, its ``server`` the profile the test runs on."""
    test_id: str
    """The id its baselines are stored under (``settings.project_test_id``)."""
    algorithm_marker: str
    """The marker of its profile's algorithm (``eagle3`` ... ``nospec``)."""
    group: str
    """Its xdist group: its profile's, or its host's when placed."""


@dataclass(frozen=True)
class CollectionPlan:
    tests: list[Planned | None]
    """Per collected test, in the order given: its plan, or None for a test without specdecode."""
    order: list[int]
    """The indices of the collected tests in the order they run: the others first, then the
    specdecode tests grouped by profile (in the order profiles first appear)."""


def plan_collection(
    session: SpecdecodeSession, collected: Sequence[Collected], rootdir: Path
) -> CollectionPlan:
    """Parse markers, resolve profiles and workloads, place the profiles on their hosts and
    group the tests by profile; a bad marker, profile or workload is a
    :class:`~pytest_specdecode.errors.SpecdecodeError` naming the test."""
    found: list[tuple[str, MarkerSpec, str, str] | None] = []  # server, spec, id, marker
    order: dict[str, int] = {}
    demand: Counter[str] = Counter()
    for test in collected:
        if test.marker is None and test.server_param is None:
            found.append(None)
            continue
        args, kwargs = test.marker if test.marker is not None else ((), {})
        spec = parse_marker(args, kwargs, where=test.nodeid) if test.marker else None
        spec = spec or MarkerSpec(server=None)
        server = test.server_param or spec.server
        if server is None:
            raise ConfigError(
                f"{test.nodeid} uses specdecode but names no server profile: "
                "write @pytest.mark.specdecode('PROFILE', ...)"
            )
        profile = session.profile(server, where=test.nodeid)
        for reference in spec.references:
            session.profile(reference, where=f"{test.nodeid} (against=)")
        workload = session.workload(spec.workload, where=test.nodeid)
        test_id = project_test_id(test.nodeid, test.path, rootdir, session.settings.project_root)
        session.note_collected(test_id, profile.name, workload)
        found.append((server, replace(spec, server=server), test_id, profile.algorithm_marker))
        order.setdefault(profile.name, len(order))
        demand[profile.name] += 1
    session.place(demand)  # the profiles' hosts, when the profile file has [hosts.NAME]
    # One group per profile, or per host when placed: one worker takes a host's profiles in
    # turn (one server per box at a time), different hosts run on different workers.
    tests: list[Planned | None] = []
    for entry in found:
        if entry is None:
            tests.append(None)
            continue
        server, spec, test_id, marker = entry
        tests.append(Planned(spec, test_id, marker, group=session.group_of(server)))

    def key(index: int) -> tuple[int, int, int]:
        planned = tests[index]
        if planned is None or planned.spec.server is None:
            return (0, 0, index)
        return (1, order[planned.spec.server], index)

    return CollectionPlan(tests=tests, order=sorted(range(len(collected)), key=key))


def start_selected(session: SpecdecodeSession, selected: Sequence[Planned]) -> None:
    """The specdecode tests left to run after ``-m``/``-k`` deselection, in their order: the
    pool's demand per profile, the baseline launches' plan and the recorder hints."""
    demand = Counter(test.spec.server for test in selected if test.spec.server)
    session.pool.set_demand(None if session.is_xdist_worker else demand, hosts=session.host_of)
    session.plan(list(demand.elements()))
    session.note_selected([test.test_id for test in selected], list(demand))


def group_tagged(
    nodeid: str, marks: Iterable[tuple[Sequence[Any], Mapping[str, Any]]]
) -> str | None:
    """``nodeid`` with the "@group" tag xdist's ``--dist loadgroup`` gives it (from its
    ``xdist_group`` marks' args and kwargs), or None when it is tagged already or has no group.

    The group name is the one xdist 3.8 builds in
    ``WorkerInteractor.pytest_collection_modifyitems``; "tagged already" is
    ``LoadGroupScheduling._split_scope``'s test for a tagged id.
    """
    if nodeid.rfind("@") > nodeid.rfind("]"):
        return None
    names = {str(args[0] if args else kwargs.get("name", "default")) for args, kwargs in marks}
    return f"{nodeid}@{'_'.join(sorted(names))}" if names else None
