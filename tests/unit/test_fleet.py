"""Hosts in the profile file and the placement of profiles on them (issue 14)."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from pytest_specdecode.errors import ConfigError
from pytest_specdecode.fleet import (
    LOAD_COST,
    EngineTLS,
    HostSpec,
    Need,
    device_gpus,
    endpoint,
    engine,
    place,
)
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


# -- TLS per host ---------------------------------------------------------------------------------

TLS_FILE = """
[defaults]
launcher = "docker"
image = "pytest-specdecode-sim:local"
server_module = "pytest_specdecode.sim"
model_path = "/models/tiny-llm"

[hosts.box-a]
docker_host = "unix:///var/run/docker.sock"
gpus = 8

[hosts.box-tls]
docker_host = "tcp://gpu-box-2:2376"
tls_cert_path = "certs/box-tls"
gpus = 8

[profiles.anywhere]
"""


def cert_dir(path: Path, *, without: str = "") -> Path:
    """A directory laid out as DOCKER_CERT_PATH is (the contents do not matter here)."""
    path.mkdir(parents=True, exist_ok=True)
    for name in ("ca.pem", "cert.pem", "key.pem"):
        if name != without:
            (path / name).write_text(f"not a real {name}\n")
    return path


def test_a_hosts_tls_cert_path_is_read_relative_to_the_profile_file(tmp_path, monkeypatch):
    monkeypatch.chdir("/")  # not the file's directory: the path is the file's, not pytest's
    file = write(tmp_path, TLS_FILE)
    loaded = load_profiles(file)
    box = loaded.hosts["box-tls"]
    assert box.tls_cert_path == str(tmp_path / "certs" / "box-tls")
    assert box.tls_verify is True  # the default with a cert path, as DOCKER_TLS_VERIFY=1
    assert loaded.hosts["box-a"].tls_cert_path is None  # pytest's DOCKER_* variables apply
    home = write(
        tmp_path,
        TLS_FILE.replace('"certs/box-tls"', '"~/box-tls-certs"\ntls_verify = false'),
    )
    box = load_profiles(home).hosts["box-tls"]
    assert box.tls_cert_path == os.path.join(os.path.expanduser("~"), "box-tls-certs")
    assert box.tls_verify is False
    from_env = TLS_FILE.replace(
        'docker_host = "tcp://gpu-box-2:2376"', 'docker_host_env = "BOX_TLS_HOST"'
    )
    assert load_profiles(write(tmp_path, from_env)).hosts["box-tls"].tls_cert_path


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            ('"tcp://gpu-box-2:2376"', '"ssh://ci@gpu-box-2"'),
            r"tls_cert_path = 'certs/box-tls' \(a string\) is not allowed: TLS applies to a "
            r"tcp:// engine, and docker_host is 'ssh://ci@gpu-box-2'",
        ),
        (
            ('"tcp://gpu-box-2:2376"', '"unix:///var/run/docker.sock"'),
            "TLS applies to a tcp:// engine",
        ),
        (
            ('docker_host = "tcp://gpu-box-2:2376"', 'context = "gpu-box-2"'),
            r"\[hosts.box-tls\]: tls_cert_path is set on a host reached through a Docker "
            "context, which carries its own TLS material",
        ),
        (
            ('tls_cert_path = "certs/box-tls"', "tls_verify = false"),
            r"\[hosts.box-tls\]: tls_verify is set without tls_cert_path",
        ),
        (
            ('tls_cert_path = "certs/box-tls"', 'tls_cert_path = "certs"\ntls_verify = "yes"'),
            r"tls_verify = 'yes' \(a string\) is not allowed: must be true or false",
        ),
        (
            ('tls_cert_path = "certs/box-tls"', "tls_cert_path = 1"),
            r"tls_cert_path = 1 \(an integer\) is not allowed: must be a non-empty string",
        ),
        (
            ('tls_cert_path = "certs/box-tls"', 'tls_certs = "certs"'),
            r"unknown key 'tls_certs' \(did you mean 'tls_cert_path'\?\)",
        ),
    ],
    ids=["ssh", "unix", "context", "verify-alone", "verify-not-bool", "path-not-string", "typo"],
)
def test_a_bad_tls_setting_names_the_host_the_key_and_what_to_do(tmp_path, change, message):
    old, new = change
    assert old in TLS_FILE
    with pytest.raises(ConfigError, match=message):
        load_profiles(write(tmp_path, TLS_FILE.replace(old, new)))


def test_a_hosts_tls_material_is_checked_when_the_host_is_used(tmp_path):
    """The file loads with the certificates missing (only that host's tests fail, later);
    :func:`engine` then names the host, the key, the path and what to do."""
    certs = tmp_path / "certs" / "box-tls"
    loaded = load_profiles(write(tmp_path, TLS_FILE))  # nothing there yet: still loads
    box = loaded.hosts["box-tls"]
    with pytest.raises(ConfigError) as missing_dir:
        engine(box, {})
    text = str(missing_dir.value)
    assert "[hosts.box-tls]: tls_cert_path = " in text
    assert "names the TLS client certificates of host 'box-tls'" in text
    assert f"the directory {certs} does not exist" in text
    assert "must hold ca.pem, cert.pem, key.pem" in text
    assert "point tls_cert_path at the directory that has them" in text
    cert_dir(certs, without="key.pem")
    with pytest.raises(ConfigError, match=rf"but no key.pem \({certs}/key.pem does not exist\)"):
        engine(box, {})
    (certs / "key.pem").write_text("not a real key\n")
    assert engine(box, {}) == ("tcp://gpu-box-2:2376", EngineTLS(str(certs), verify=True))
    assert engine(loaded.hosts["box-a"], {}) == ("unix:///var/run/docker.sock", None)


def test_tls_from_a_variables_endpoint_needs_a_tcp_one(tmp_path):
    certs = cert_dir(tmp_path / "certs")
    box = HostSpec(
        name="box", docker_host_env="BOX", tls_cert_path=str(certs), source="f [hosts.box]"
    )
    assert engine(box, {"BOX": "tcp://box:2376"}) == ("tcp://box:2376", EngineTLS(str(certs)))
    assert engine(box, {"BOX": "https://box:2376"})[1] == EngineTLS(str(certs))
    with pytest.raises(ConfigError) as refused:
        engine(box, {"BOX": "ssh://ci:secret@box"})
    text = str(refused.value)
    assert "host 'box' has tls_cert_path, but its endpoint ($BOX) is a ssh:// address" in text
    assert "secret" not in text  # the variable's value may carry credentials: never shown


def test_the_tls_a_server_was_reached_with_is_recorded_and_read_back():
    tls = EngineTLS("/certs/box", verify=False)
    assert tls.identity() == {"docker_cert_path": "/certs/box", "docker_tls_verify": False}
    assert EngineTLS.from_identity({"docker_host": "tcp://box:2376", **tls.identity()}) == tls
    assert EngineTLS.from_identity({"docker_host": "tcp://box:2376"}) is None  # pytest's env
    named = EngineTLS("/ctx/tls/docker", True, ("ca-x.pem", "cert-x.pem", "key-x.pem"))
    assert EngineTLS.from_identity(named.identity()) == named
    assert EngineTLS.from_identity({"docker_cert_path": 3}) is None


@pytest.fixture
def docker_config(tmp_path, monkeypatch) -> Path:
    """A Docker configuration directory of our own (the SDK reads contexts only beside a
    config.json), so no context of this machine's is seen or touched."""
    config = tmp_path / "docker-config"
    config.mkdir()
    (config / "config.json").write_text(json.dumps({}))
    monkeypatch.setenv("DOCKER_CONFIG", str(config))
    return config


def test_a_contexts_tls_material_is_used_for_its_host(tmp_path, docker_config):
    from docker.context import ContextAPI
    from docker.tls import TLSConfig

    certs = cert_dir(tmp_path / "certs")
    material = TLSConfig(
        client_cert=(str(certs / "cert.pem"), str(certs / "key.pem")),
        ca_cert=str(certs / "ca.pem"),
        verify=True,
    )
    ContextAPI.create_context("box-tls", host="tcp://gpu-box-2:2376", tls_cfg=material)
    ContextAPI.create_context(
        "box-unverified", host="tcp://gpu-box-3:2376", tls_cfg=material, skip_tls_verify=True
    )
    ContextAPI.create_context("box-plain", host="tcp://gpu-box-4:2375", skip_tls_verify=True)
    ContextAPI.create_context("box-ssh", host="ssh://ci@gpu-box-5")

    address, tls = engine(HostSpec(name="b", context="box-tls"), {})
    assert address == "https://gpu-box-2:2376"  # as the SDK writes it; the CLI, tcp://
    assert tls is not None
    assert tls.verify is True
    stored = Path(tls.cert_path)  # the context store's copy, not the files it was made from
    assert stored.is_relative_to(docker_config / "contexts" / "tls")
    assert tls.missing() == []
    assert tls.ca_cert == str(stored / "ca.pem")
    assert tls.client_cert == (str(stored / "cert.pem"), str(stored / "key.pem"))
    address, tls = engine(HostSpec(name="b", context="box-unverified"), {})
    assert address == "tcp://gpu-box-3:2376"  # the SDK wrote http://: TLS all the same
    assert tls is not None
    assert tls.verify is False  # SkipTLSVerify
    # no TLS material: pytest's DOCKER_TLS_VERIFY / DOCKER_CERT_PATH apply, as before
    assert engine(HostSpec(name="b", context="box-plain"), {}) == ("http://gpu-box-4:2375", None)
    assert engine(HostSpec(name="b", context="box-ssh"), {}) == ("ssh://ci@gpu-box-5:22", None)


def test_a_context_with_part_of_its_tls_material_is_an_error_naming_it(tmp_path, docker_config):
    from docker.context import ContextAPI
    from docker.tls import TLSConfig

    certs = cert_dir(tmp_path / "certs")
    material = TLSConfig(
        client_cert=(str(certs / "cert.pem"), str(certs / "key.pem")), ca_cert=str(certs / "ca.pem")
    )
    context = ContextAPI.create_context("box-tls", host="tcp://gpu-box-2:2376", tls_cfg=material)
    os.remove(os.path.join(context.tls_path, "docker", "key.pem"))
    with pytest.raises(ConfigError) as partial:
        engine(HostSpec(name="b", context="box-tls", source="f [hosts.b]"), {})
    text = str(partial.value)
    assert "the Docker context 'box-tls' has TLS material in" in text
    assert "found ca.pem, cert.pem" in text
    assert "docker context update box-tls" in text
