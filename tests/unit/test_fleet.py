"""Hosts in the profile file and the placement of profiles on them (issue 14)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from pytest_specdecode.errors import ConfigError
from pytest_specdecode.fleet import LOAD_COST, HostSpec, Need, device_gpus, endpoint, place
from pytest_specdecode.profiles.loader import load_profiles

EIGHT = tuple(range(8))


def hosts(*names: str, gpus: tuple[int, ...] = EIGHT) -> list[HostSpec]:
    return [HostSpec(name=n, docker_host=f"ssh://{n}", gpus=gpus) for n in names]


def test_profiles_spread_over_hosts_longest_first_so_the_night_is_short():
    needs = {f"p{i}": Need(gpus=8, tests=t) for i, t in enumerate([6, 5, 4, 3, 2, 1])}
    placement = place(needs, hosts("a", "b", "c"))
    assert set(placement.host_of.values()) == {"a", "b", "c"}
    costs = sorted(placement.cost.values())
    # LPT: 6+1, 5+2, 4+3 tests, each host one load per profile
    assert costs == [7 + 2 * LOAD_COST] * 3
    assert placement.group("p0") == f"specdecode-host-{placement.host_of['p0']}"


def test_a_profile_goes_only_to_the_hosts_it_names_and_that_have_gpus_enough():
    fleet = [*hosts("big"), *hosts("small", gpus=(0, 1))]
    placement = place(
        {"tp8": Need(gpus=8, tests=1), "tp2": Need(gpus=2, tests=9, hosts=("small",))}, fleet
    )
    assert placement.host_of == {"tp8": "big", "tp2": "small"}
    with pytest.raises(ConfigError, match=r"needs 8 GPU\(s\), but none of its hosts \['small'\]"):
        place({"tp8": Need(gpus=8, hosts=("small",))}, fleet)
    with pytest.raises(ConfigError, match=r"\['gone'\] is not defined; defined: big, small"):
        place({"tp8": Need(gpus=8, hosts=("gone",))}, fleet)


def test_a_profiles_gpus_are_positions_in_its_hosts_gpus_list():
    upper_half = HostSpec(name="upper", docker_host="ssh://u", gpus=(4, 5, 6, 7))
    assert device_gpus(upper_half, (0, 1)) == (4, 5)
    assert device_gpus(upper_half, (2, 3)) == (6, 7)
    assert device_gpus(upper_half, ()) == ()
    # Two GPUs by count, but the third and fourth positions: a two-GPU host cannot take it.
    fleet = [HostSpec(name="two", docker_host="ssh://t", gpus=(0, 1)), upper_half]
    placement = place({"tp2-high": Need(gpus=2, indices=(2, 3))}, fleet)
    assert placement.host_of == {"tp2-high": "upper"}
    with pytest.raises(
        ConfigError,
        match=r"'tp2-high' uses GPUs \[2, 3\] \(positions in a host's gpus list\), so it needs "
        r"a host with 4, but none of its hosts \['two'\] has that many \(two: 2\)",
    ):
        place({"tp2-high": Need(gpus=2, indices=(2, 3), hosts=("two",))}, fleet)


def test_the_placement_is_the_same_in_every_process():
    needs = {f"p{i}": Need(gpus=1 + i % 8, tests=1 + i % 5) for i in range(40)}
    first = place(needs, hosts("a", "b", "c", "d"))
    again = place(dict(reversed(list(needs.items()))), hosts("a", "b", "c", "d"))
    assert first.host_of == again.host_of


def test_an_endpoint_comes_from_the_file_the_environment_or_a_context():
    assert endpoint(HostSpec(name="a", docker_host="ssh://a"), {}) == "ssh://a"
    from_env = HostSpec(name="b", docker_host_env="BOX_B", source="f [hosts.b]")
    assert endpoint(from_env, {"BOX_B": "tcp://b:2376"}) == "tcp://b:2376"
    with pytest.raises(ConfigError, match=r"\$BOX_B, which is not set"):
        endpoint(from_env, {})
    with pytest.raises(ConfigError, match="names the Docker context 'no-such-context'"):
        endpoint(HostSpec(name="c", context="no-such-context"), {})


FILE = """
[defaults]
launcher = "docker"
image = "pytest-specdecode-sim:local"
server_module = "pytest_specdecode.sim"
model_path = "/models/tiny-llm"

[hosts.box-a]
docker_host = "unix:///var/run/docker.sock"
gpus = 8
hardware = "8xH200"

[hosts.box-b]
docker_host_env = "BOX_B_DOCKER_HOST"
gpus = [0, 1, 2, 3]

[profiles.anywhere]

[profiles.pinned]
hosts = ["box-b"]
"""


# a profile of local processes cannot go to a Docker host
PINNED_LOCAL = '[profiles.pinned]\nlauncher = "sglang"\nserver_module = "x"\nhosts = ["box-b"]'


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "specdecode.toml"
    path.write_text(textwrap.dedent(text))
    return path


def test_hosts_are_read_from_the_profile_file(tmp_path):
    loaded = load_profiles(write(tmp_path, FILE))
    assert list(loaded.hosts) == ["box-a", "box-b"]
    assert loaded.hosts["box-a"].gpus == EIGHT
    assert loaded.hosts["box-a"].hardware_key == "8xH200"
    assert loaded.hosts["box-b"].hardware_key == "host-box-b"
    assert loaded.profiles["anywhere"].hosts == ()
    assert loaded.profiles["pinned"].hosts == ("box-b",)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            ('docker_host = "unix:///var/run/docker.sock"', 'docker_host = "tcp://u:pw@box:2376"'),
            "docker_host carries a password",
        ),
        (("gpus = 8\n", ""), "gpus is missing"),
        (
            ('hosts = ["box-b"]', 'hosts = ["box-c"]'),
            r"\['box-c'\] is not defined; defined: box-a, box-b",
        ),
        (
            ('docker_host_env = "BOX_B_DOCKER_HOST"', ""),
            "needs exactly one of docker_host",
        ),
        (
            (
                '[profiles.pinned]\nhosts = ["box-b"]',
                PINNED_LOCAL,
            ),
            'only launcher = "docker" profiles run on',
        ),
    ],
)
def test_a_bad_host_table_names_the_key_and_what_to_do(tmp_path, change, message):
    old, new = change
    assert old in FILE
    with pytest.raises(ConfigError, match=message):
        load_profiles(write(tmp_path, FILE.replace(old, new)))


MAPPED = """
[defaults]
launcher = "docker"
image = "lmsysorg/sglang:v0.5.15-cu129"
model_path = "/models/llama"
tp_size = 2

[hosts.low]
docker_host = "ssh://gpu-box-low"
gpus = [0, 1]

[hosts.high]
docker_host = "ssh://gpu-box-high"
gpus = [4, 5, 6, 7]

[profiles.first-pair]
hosts = ["high"]
gpus = [0, 1]

[profiles.second-pair]
hosts = ["high"]
gpus = [2, 3]

[profiles.anywhere]
gpus = [0, 1]
"""

MAPPED_TESTS = """
import pytest

@pytest.mark.specdecode("first-pair")
def test_first(): pass

@pytest.mark.specdecode("second-pair")
def test_second(): pass

@pytest.mark.specdecode("anywhere")
def test_anywhere(): pass
"""


def test_a_placed_profile_gets_its_hosts_gpus_at_its_positions(pytester):
    """The containers of two profiles pinned to the upper half of a box ask its engine for
    GPUs 4,5 and 6,7 (not 0,1 and 2,3 of the box, which the host never offered), and the
    placement printed says which GPUs of the box each profile got."""
    pytester.makefile(".toml", specdecode=MAPPED)
    pytester.makeini(
        "[pytest]\nspecdecode_config = specdecode.toml\nspecdecode_baselines = baselines\n"
    )
    pytester.makepyfile(test_perf=MAPPED_TESTS)
    result = pytester.runpytest_subprocess("--collect-only", "-q")
    result.assert_outcomes()
    out = result.stdout.str()
    assert "specdecode: placed on low: anywhere (1 test, GPUs 0,1)" in out, out
    assert (
        "specdecode: placed on high: first-pair (1 test, GPUs 4,5), "
        "second-pair (1 test, GPUs 6,7)" in out
    ), out
