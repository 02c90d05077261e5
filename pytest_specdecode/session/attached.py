"""``--server-host``: which selected profile each attached server serves.

A bare ``URL`` serves the selected tests of the profile that server runs, decided from its
``/server_info`` by the same check that guards every attached measurement
(``Backend.compare_args``); the other selected profiles are skipped, each with what the server
runs and what the test needs. ``PROFILE=URL`` names the server of one profile; that server must
run it (a mismatch fails its tests, as before), and a bare URL then serves only the profiles
not named.

What a server does not report (its environment, hence the NCCL variables of an env set) cannot
tell two profiles apart. Such profiles are never guessed between:

* when a server at a bare URL matches one selected profile, that one runs;
* when it matches several that differ only in what it does not report, their tests fail with
  the choice to make (``--server-host PROFILE=URL``), instead of measuring one server against
  the baselines of two configurations;
* when a profile named for that server is among them, the others are skipped as
  indistinguishable from it;
* when it matches none, every test is measured and fails with its differences (or, with
  ``--specdecode-allow-mismatch``, measured with a warning): a mismatch is never a silent skip.

The decision is made once per server, at the first test that asks, from the tests left after
``-m``/``-k``/paths; every xdist worker collects the same tests and decides the same.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_specdecode.backends import backend_for
from pytest_specdecode.errors import NotServedHere, ServerMismatchError
from pytest_specdecode.profiles.profile import ArgMismatch, ServerProfile
from pytest_specdecode.redaction import redact_url
from pytest_specdecode.settings import ServerHosts


@dataclass(frozen=True)
class Decision:
    """What a profile's tests do with the server given for them."""

    url: str | None
    """The server to attach to (as written in ``--server-host``); None: skipped."""
    skip: str | None = None
    """Why the tests are skipped (another profile's server, or none given)."""
    fail: str | None = None
    """Why the tests fail before measuring (the server matches several profiles alike)."""


def mismatches(profile: ServerProfile, info: Mapping[str, Any]) -> list[ArgMismatch]:
    """Where the server's info contradicts ``profile``: exactly the differences the attach
    check refuses (a field this release does not report is not one)."""
    found = backend_for(profile).compare_args(profile, info, attached=True)
    return [m for m in found if m.reported or m.required]


def describe_speculation(values: Mapping[str, Any]) -> str:
    """``EAGLE3, 2 steps, topk 1, 3 draft tokens`` or ``no speculation``, from SGLang's field
    names (a server's ``/server_info`` or a profile's expected arguments); llama-server
    reports speculation only as on or off."""
    if "speculative_algorithm" not in values:
        spec = values.get("speculative")
        return "speculation " + ("on" if spec else "off") if spec is not None else "its own"
    algorithm = values.get("speculative_algorithm")
    if not algorithm:
        return "no speculation"
    parts = [str(algorithm)]
    for field, unit in (
        ("speculative_num_steps", "steps"),
        ("speculative_eagle_topk", "topk"),
        ("speculative_num_draft_tokens", "draft tokens"),
    ):
        value = values.get(field)
        if value is not None:
            parts.append(f"topk {value}" if unit == "topk" else f"{value} {unit}")
    return ", ".join(parts)


def hidden_difference(profiles: Sequence[ServerProfile]) -> str:
    """What tells ``profiles`` apart although a server reports them alike: their fingerprints'
    differing fields, the environment as its env sets."""
    hards = [p.fingerprint().hard for p in profiles]
    keys = sorted({key for hard in hards for key in hard})
    parts = []
    for key in keys:
        if len({repr(hard.get(key)) for hard in hards}) == 1:
            continue
        if key == "env":
            sets = "; ".join(f"{p.name}: {', '.join(p.env_sets) or 'none'}" for p in profiles)
            parts.append(f"the environment (env sets {sets})")
        else:
            parts.append(key)
    return ", ".join(parts) or "nothing the plugin can see"


def decide(
    url: str,
    *,
    named: Sequence[ServerProfile],
    defaulted: Sequence[ServerProfile],
    info: Mapping[str, Any],
) -> dict[str, Decision]:
    """The decision for every selected profile served at ``url``: ``named`` with
    ``PROFILE=URL``, ``defaulted`` by a bare URL; ``info`` is what that server reports."""
    shown = redact_url(url)
    runs = describe_speculation(info)
    decisions = {p.name: Decision(url) for p in named}
    matching = [p for p in defaulted if not mismatches(p, info)]

    def other_server(profile: ServerProfile, serves: str) -> Decision:
        wanted = describe_speculation(profile.expected_server_args(_version(info)))
        differences = "; ".join(m.describe() for m in mismatches(profile, info))
        return Decision(
            None,
            skip=(
                f"the server at {shown} runs {runs} ({serves}); this test needs profile "
                f"{profile.name!r} ({wanted}): {differences}. Give it its own server with "
                f"--server-host {profile.name}=URL"
            ),
        )

    if named:
        serves = _serving(named, shown)
        for profile in defaulted:
            if profile in matching:
                twins = [*named, profile]
                decisions[profile.name] = Decision(
                    None,
                    skip=(
                        f"the server at {shown} serves {serves}, and profile {profile.name!r} "
                        f"cannot be told apart from it remotely (they differ only in "
                        f"{hidden_difference(twins)}, which the server does not report). Give "
                        f"it its own server with --server-host {profile.name}=URL"
                    ),
                )
            else:
                decisions[profile.name] = other_server(profile, serves)
        return decisions
    if not matching:  # runs none of them: each test says how it differs (the attach check)
        decisions.update({p.name: Decision(url) for p in defaulted})
        return decisions
    if len(matching) == 1:
        served = matching[0]
        decisions[served.name] = Decision(url)
        for profile in defaulted:
            if profile is not served:
                decisions[profile.name] = other_server(profile, f"profile {served.name!r}")
        return decisions
    names = ", ".join(repr(p.name) for p in matching)
    for profile in defaulted:
        if profile in matching:
            decisions[profile.name] = Decision(
                None,
                fail=(
                    f"the server at {shown} runs {runs}, which matches profiles {names} alike: "
                    f"they differ only in {hidden_difference(matching)}, which a server does "
                    "not report, so which of them it runs cannot be checked remotely and no "
                    f"test is measured against a guess. Say which it runs: --server-host "
                    f"PROFILE={shown} (e.g. --server-host {profile.name}={shown})"
                ),
            )
        else:
            decisions[profile.name] = other_server(profile, f"profiles {names}")
    return decisions


def _serving(named: Sequence[ServerProfile], shown: str) -> str:
    return ", ".join(f"profile {p.name!r} (--server-host {p.name}={shown})" for p in named)


def _version(info: Mapping[str, Any]) -> str | None:
    version = info.get("version")
    return version if isinstance(version, str) else None


class AttachedServers:
    """The servers of ``--server-host`` and the selected profiles each serves, decided at the
    first test that asks for a server (:meth:`url_for`)."""

    def __init__(
        self, hosts: ServerHosts, info_of: Callable[[ServerProfile, str], Mapping[str, Any]]
    ) -> None:
        self.hosts = hosts
        self._info_of = info_of  # (a profile, its server as written) -> the server's info
        self._selected: dict[str, ServerProfile] = {}
        self._decided: dict[str, Decision] = {}

    def select(self, profiles: Sequence[ServerProfile]) -> None:
        """The profiles of the tests left to run (after ``-m``/``-k``/paths)."""
        self._selected = {p.name: p for p in profiles}
        self._decided.clear()

    def url_for(self, profile: ServerProfile) -> str:
        """The server ``profile``'s tests are measured on; raises :class:`NotServedHere`
        (skip) or :class:`ServerMismatchError` (fail) with the reason."""
        decision = self._decided.get(profile.name) or self._decide(profile)
        if decision.fail is not None:
            raise ServerMismatchError(decision.fail)
        if decision.url is None:
            raise NotServedHere(decision.skip or "no server given")
        return decision.url

    def _decide(self, profile: ServerProfile) -> Decision:
        url = self.hosts.url_for(profile.name)
        if url is None:
            given = ", ".join(f"{name}={u}" for name, u in self.hosts.named.items())
            return Decision(
                None,
                skip=redact_url(
                    f"--server-host names no server for profile {profile.name!r} (it names "
                    f"{given}): add --server-host {profile.name}=URL, or a bare URL that serves "
                    "the profiles it runs"
                ),
            )
        selected = {**self._selected, profile.name: profile}  # a profile asked for is selected
        here = [p for p in selected.values() if self.hosts.url_for(p.name) == url]
        named = [p for p in here if p.name in self.hosts.named]
        defaulted = [p for p in here if p.name not in self.hosts.named]
        if len(defaulted) <= 1 and not (named and defaulted):
            decisions = {p.name: Decision(url) for p in here}  # nothing to choose between
        else:
            info = self._info_of(profile, url)
            decisions = decide(url, named=named, defaulted=defaulted, info=info)
        self._decided.update(decisions)
        return decisions[profile.name]
