"""The server kinds' registry (pytest_specdecode/profiles/kinds/): every kind module registered
once under a unique name, the names the architecture test counts, and a profile's launcher
resolving to its kind with the capabilities the rest of the package asks."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path

import pytest

import pytest_specdecode.profiles.kinds as kinds_package
from pytest_specdecode.backends import BACKENDS
from pytest_specdecode.profiles.fields import LAUNCHERS
from pytest_specdecode.profiles.kinds.base import BuildFacts, ServerKind
from pytest_specdecode.profiles.kinds.registry import KINDS, kind_of, recorded_in_container
from pytest_specdecode.profiles.llamacpp import LlamaCppOptions
from pytest_specdecode.profiles.profile import ServerProfile
from pytest_specdecode.servers.build import BuildKey, build_key

sys.path.insert(0, str(Path(__file__).parent))
from test_architecture import LAUNCHER_NAMES

NOT_KINDS = {"base", "registry"}


def kind_modules() -> list[str]:
    return sorted(
        info.name
        for info in pkgutil.iter_modules(kinds_package.__path__)
        if info.name not in NOT_KINDS
    )


def test_every_kind_module_is_registered_once_under_a_unique_name() -> None:
    registered = list(KINDS.values())
    assert len({id(kind) for kind in registered}) == len(registered)
    assert len({kind.name for kind in registered}) == len(registered)
    assert all(name == kind.name and name for name, kind in KINDS.items())
    for module_name in kind_modules():
        module = importlib.import_module(f"{kinds_package.__name__}.{module_name}")
        kind = module.KIND
        assert isinstance(kind, ServerKind)
        assert KINDS[kind.name] is kind, f"{module_name}.KIND is not in registry.KINDS"
    assert len(kind_modules()) == len(KINDS)


def test_the_names_are_the_launchers_the_file_allows_and_the_architecture_test_counts() -> None:
    assert LAUNCHERS[:4] == ("sglang", "docker", "sim", "llamacpp")  # the messages' order
    assert set(KINDS) == LAUNCHER_NAMES == set(LAUNCHERS)


def test_every_kind_names_a_backend_that_exists() -> None:
    assert {kind.backend for kind in KINDS.values()} <= set(BACKENDS)


def test_a_profile_resolves_to_its_kind() -> None:
    sglang = ServerProfile(name="s", model_path="/m")
    assert sglang.kind is kind_of("sglang") is kind_of(sglang) is KINDS["sglang"]
    assert sglang.kind.sglang_preflight
    assert sglang.kind.own_python
    assert sglang.kind.local_gpus
    docker = ServerProfile(name="d", model_path="/m", launcher="docker")
    assert docker.kind.in_container
    assert docker.kind.placed_on_hosts
    assert not docker.kind.sglang_preflight
    sim = ServerProfile(name="x", model_path="/m", launcher="sim")
    assert sim.kind.simulated
    assert sim.simulated
    assert not sim.kind.takes_server_module
    llama = ServerProfile(
        name="l", model_path="/m.gguf", launcher="llamacpp", llamacpp=LlamaCppOptions()
    )
    assert llama.kind.llamacpp_options
    assert llama.kind.backend == "llamacpp"
    assert llama.launch_argv(host="h", port=1, binary="/b/llama-server")[0] == "/b/llama-server"


def test_an_unknown_launcher_names_the_kinds() -> None:
    with pytest.raises(
        ValueError, match="unknown launcher 'no-such-kind'; the server kinds are sglang"
    ):
        kind_of("no-such-kind")


def test_a_recorded_identity_is_a_container_only_by_its_kind() -> None:
    assert recorded_in_container("docker")
    assert not recorded_in_container("sglang")
    assert not recorded_in_container(None)
    assert not recorded_in_container("no-such-kind")


def test_each_kind_describes_its_own_build() -> None:
    sim = build_key("sim", python=None, launch_env={})
    assert sim.describe().startswith("the simulator of pytest-specdecode ")
    llama = build_key("llamacpp", python=None, launch_env={}, binary="/no/such/llama-server")
    assert llama.describe() == "llama-server /no/such/llama-server (missing)"
    docker = build_key(
        "docker", python=None, launch_env={}, image="i:1", image_id="sha256:" + "a" * 64
    )
    assert docker.describe() == f"image i:1 (sha256:{'a' * 12})"
    assert (
        build_key("docker", python=None, launch_env={}, image="i:1").describe()
        == "an unknown build"
    )
    assert BuildKey(key="k", parts={"launcher": "gone"}).describe() == "an unknown build"
    assert (
        KINDS["docker"].build_parts(BuildFacts(image="i", engine="tcp://h:2376"))["engine"]
        == "tcp://h:2376"
    )
