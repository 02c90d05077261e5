"""Which selected profile each ``--server-host`` serves (``session/attached``), and reading the
option's values (``settings``): the matching logic alone, with a server's info as a mapping."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from pytest_specdecode.errors import ConfigError, NotServedHere, ServerMismatchError
from pytest_specdecode.profiles.profile import ServerProfile, Speculative
from pytest_specdecode.session.attached import AttachedServers, decide, describe_speculation
from pytest_specdecode.settings import ServerHosts, resolve

MODEL = "/models/target"
NCCL = {"NCCL_PROTO": "LL"}


def eagle3(name: str, steps: int, env: Mapping[str, str] | None = None) -> ServerProfile:
    spec = Speculative("EAGLE3", "/models/draft", steps, 1, steps + 1)
    return ServerProfile(
        name=name,
        model_path=MODEL,
        tp_size=8,
        speculative=spec,
        env=dict(env or {}),
        env_sets=("nccl_tuned",) if env else (),
    )


NOSPEC = ServerProfile(name="nospec", model_path=MODEL, tp_size=8)
TWO = eagle3("eagle3-2step", 2)
TWO_NCCL = eagle3("eagle3-2step-nccl", 2, NCCL)
FIVE = eagle3("eagle3-5step", 5)


def info_of(profile: ServerProfile) -> dict[str, Any]:
    """What a server running ``profile`` reports (the fields the check reads)."""
    return {"version": "0.5.15", "simulated": True, **profile.expected_server_args("0.5.15")}


URL = "gpu-box:30000"


def test_a_bare_url_runs_the_one_profile_the_server_matches_and_skips_the_others() -> None:
    decisions = decide(URL, named=[], defaulted=[NOSPEC, TWO_NCCL, FIVE], info=info_of(TWO_NCCL))
    assert decisions["eagle3-2step-nccl"].url == URL
    assert decisions["eagle3-5step"].url is None
    assert decisions["eagle3-5step"].skip == (
        "the server at gpu-box:30000 runs EAGLE3, 2 steps, topk 1, 3 draft tokens (profile "
        "'eagle3-2step-nccl'); this test needs profile 'eagle3-5step' (EAGLE3, 5 steps, topk 1, "
        "6 draft tokens): speculative_num_steps: profile wants 5, server reports 2; "
        "speculative_num_draft_tokens: profile wants 6, server reports 3. Give it its own "
        "server with --server-host eagle3-5step=URL"
    )
    nospec = decisions["nospec"].skip or ""
    assert "this test needs profile 'nospec' (no speculation)" in nospec
    assert "speculative_algorithm: profile wants None, server reports 'EAGLE3'" in nospec


def test_profiles_that_differ_only_in_their_environment_fail_instead_of_a_guess() -> None:
    decisions = decide(URL, named=[], defaulted=[TWO, TWO_NCCL, FIVE], info=info_of(TWO))
    assert decisions["eagle3-2step"].url is None
    assert decisions["eagle3-2step-nccl"].url is None
    reason = decisions["eagle3-2step"].fail or ""
    assert "matches profiles 'eagle3-2step', 'eagle3-2step-nccl' alike" in reason
    assert (
        "they differ only in the environment (env sets eagle3-2step: none; "
        "eagle3-2step-nccl: nccl_tuned)"
    ) in reason
    assert reason.endswith("(e.g. --server-host eagle3-2step=gpu-box:30000)")
    assert "(profiles 'eagle3-2step', 'eagle3-2step-nccl')" in (
        decisions["eagle3-5step"].skip or ""
    )


def test_a_named_profile_takes_the_server_and_its_twin_is_skipped() -> None:
    decisions = decide(URL, named=[TWO_NCCL], defaulted=[TWO, FIVE], info=info_of(TWO_NCCL))
    assert decisions["eagle3-2step-nccl"].url == URL
    assert decisions["eagle3-2step"].skip == (
        "the server at gpu-box:30000 serves profile 'eagle3-2step-nccl' (--server-host "
        "eagle3-2step-nccl=gpu-box:30000), and profile 'eagle3-2step' cannot be told apart from "
        "it remotely (they differ only in the environment (env sets eagle3-2step-nccl: "
        "nccl_tuned; eagle3-2step: none), which the server does not report). Give it its own "
        "server with --server-host eagle3-2step=URL"
    )
    assert "needs profile 'eagle3-5step'" in (decisions["eagle3-5step"].skip or "")


def test_a_named_profile_runs_even_when_the_server_contradicts_it() -> None:
    """The user said so: the measurement's attach check then fails it with every difference."""
    decisions = decide(URL, named=[FIVE], defaulted=[], info=info_of(TWO))
    assert decisions["eagle3-5step"].url == URL


def test_a_server_that_matches_none_of_the_profiles_measures_them_all() -> None:
    """A mismatch is never a silent skip: each test fails with its differences (or, with
    --specdecode-allow-mismatch, is measured with a warning)."""
    decisions = decide(URL, named=[], defaulted=[TWO, FIVE], info=info_of(NOSPEC))
    assert {name: d.url for name, d in decisions.items()} == {
        "eagle3-2step": URL,
        "eagle3-5step": URL,
    }


def test_the_speculation_is_described_from_either_side() -> None:
    assert describe_speculation(info_of(NOSPEC)) == "no speculation"
    assert describe_speculation(info_of(FIVE)) == "EAGLE3, 5 steps, topk 1, 6 draft tokens"
    assert describe_speculation({"speculative": True}) == "speculation on"


class FakeServers:
    """info_of for AttachedServers: each URL runs one profile; counts the questions."""

    def __init__(self, runs: Mapping[str, ServerProfile]) -> None:
        self.runs = runs
        self.asked: list[str] = []

    def __call__(self, profile: ServerProfile, url: str) -> Mapping[str, Any]:
        self.asked.append(url)
        return info_of(self.runs[url])


def test_attached_servers_decide_once_per_server_from_the_selection() -> None:
    fake = FakeServers({"a:1": FIVE, "b:2": TWO_NCCL})
    servers = AttachedServers(ServerHosts(default="b:2", named={"eagle3-5step": "a:1"}), fake)
    servers.select([NOSPEC, TWO_NCCL, FIVE])
    assert servers.url_for(FIVE) == "a:1"  # named, alone on its server: nothing to ask
    assert servers.url_for(TWO_NCCL) == "b:2"
    with pytest.raises(NotServedHere, match="this test needs profile 'nospec'"):
        servers.url_for(NOSPEC)
    assert fake.asked == ["b:2"]  # one question for the server that had a choice to make


def test_attached_servers_skip_a_profile_no_server_is_given_for() -> None:
    servers = AttachedServers(ServerHosts(named={"eagle3-5step": "a:1"}), FakeServers({}))
    servers.select([NOSPEC, FIVE])
    with pytest.raises(NotServedHere) as caught:
        servers.url_for(NOSPEC)
    assert str(caught.value) == (
        "--server-host names no server for profile 'nospec' (it names eagle3-5step=a:1): add "
        "--server-host nospec=URL, or a bare URL that serves the profiles it runs"
    )


def test_attached_servers_fail_twins_with_the_choice() -> None:
    servers = AttachedServers(ServerHosts(default="b:2"), FakeServers({"b:2": TWO}))
    servers.select([TWO, TWO_NCCL])
    with pytest.raises(ServerMismatchError, match="Say which it runs"):
        servers.url_for(TWO_NCCL)


# -- the option's values -----------------------------------------------------------------------


def hosts(*values: str, env: str | None = None) -> ServerHosts | None:
    settings = resolve(
        cli={"server_host": list(values) or None},
        ini={},
        env={"PYTEST_SPECDECODE_SERVER_HOST": env} if env else {},
        invocation_dir=Path("."),
        ini_dir=Path("."),
    )
    return settings.server_host


def test_server_host_values_are_a_default_and_named_servers() -> None:
    given = hosts("gpu-box", "eagle3-5step=http://other:30001")
    assert given == ServerHosts(default="gpu-box", named={"eagle3-5step": "http://other:30001"})
    assert given.url_for("eagle3-5step") == "http://other:30001"
    assert given.url_for("nospec") == "gpu-box"
    assert hosts() is None
    # The variable takes them comma-separated; a password's "=" is not a profile's.
    from_env = hosts(env="a=h:1, http://me:pw=x@h:2")
    assert from_env == ServerHosts(default="http://me:pw=x@h:2", named={"a": "h:1"})
    assert str(from_env) == "http://<redacted>@h:2, a=h:1"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (("h:1", "h:2"), "gives two servers without a profile (h:1 and h:2)"),
        (("a=h:1", "a=h:2"), "names two servers for profile 'a' (h:1 and h:2)"),
        (("a=",), "a= names no server: write a=HOST[:PORT] or a URL"),
        (("me:secret@h:1", "h:2"), "(<redacted>@h:1 and h:2)"),
    ],
)
def test_bad_server_host_values_are_named(values: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        hosts(*values)
    assert message in str(caught.value)
    assert "from --server-host" in str(caught.value)
    assert "secret" not in str(caught.value)
