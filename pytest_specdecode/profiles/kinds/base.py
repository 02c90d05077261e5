"""The interface of a server kind: the facts and functions that depend only on a profile's
data, asked by the rest of the package instead of comparing launcher names.

A kind sees a profile through :class:`ProfileView` (the few fields it reads), not through
:class:`~pytest_specdecode.profiles.profile.ServerProfile`, which consults the kinds: so this
folder sits below ``profiles/profile`` (and ``profiles/llamacpp``) in the import order and
imports nothing else of the package: a kind module adds at most two floors (its module and
this one) under whatever consults it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

SGLANG_MODULE = "sglang.launch_server"
"""The module that serves when a profile names none (``python -m sglang.launch_server``)."""


class BinaryOptions(Protocol):
    """A profile's options that name an executable (``LlamaCppOptions``)."""

    @property
    def binary(self) -> str | None: ...


class ProfileView(Protocol):
    """What a kind reads of a profile (a ``ServerProfile`` is one)."""

    @property
    def python(self) -> str | None: ...
    @property
    def module(self) -> str: ...
    @property
    def model_path(self) -> str: ...
    @property
    def tp_size(self) -> int: ...
    @property
    def extra_args(self) -> tuple[str, ...]: ...
    @property
    def llamacpp(self) -> BinaryOptions | None: ...
    def server_args(self, *, host: str, port: int) -> list[str]: ...


@dataclass(frozen=True)
class BuildFacts:
    """What a launch's build is read from (resolved by ``servers/factory``: the engine's image
    id and the binary on ``PATH`` are the machine's, not the profile's)."""

    python: str | None = None
    image: str | None = None
    image_id: str | None = None
    binary: str | None = None
    engine: str | None = None


class ServerKind:
    """One value of a profile's ``launcher``. Subclasses set the capabilities that differ and
    override :meth:`command` and :meth:`build_parts`; the defaults are an SGLang server run as
    a local process by the interpreter running pytest."""

    name: str = ""
    backend: str = "sglang"
    """Which backend (protocol family, ``backends.Backend.name``) talks to its servers."""
    server_name: str = "SGLang"
    """What the attach messages call its servers."""
    simulated: bool = False
    """Always the simulated server (whatever ``server_module`` says)."""
    takes_server_module: bool = True
    """``server_module`` may choose the module that serves (else: refused)."""
    own_python: bool = False
    """The profile's ``python`` runs the server (a soft fingerprint field)."""
    local_gpus: bool = False
    """A local process whose GPUs ``CUDA_VISIBLE_DEVICES`` selects from ``gpus``."""
    in_container: bool = False
    """Run by the Docker launcher; needs ``image``; its build is the image's id."""
    placed_on_hosts: bool = False
    """May run on the profile file's ``[hosts.NAME]`` (through their Docker engines)."""
    sglang_preflight: bool = False
    """SGLang's own argument check runs on the command before the launch."""
    llamacpp_options: bool = False
    """Its profiles carry llama.cpp's options and keys (``LlamaCppOptions``) instead of
    SGLang's, and target overlays do not apply to them."""

    def serving_module(self, server_module: str | None) -> str:
        """The module ``python -m`` runs."""
        return server_module or SGLANG_MODULE

    def command(
        self, profile: ProfileView, *, host: str, port: int, binary: str | None
    ) -> list[str]:
        """The full command line of a launch (``binary``: a resolved executable, if any)."""
        raise NotImplementedError

    def build_parts(self, facts: BuildFacts) -> dict[str, Any]:
        """What this kind's build is read from (servers/build.py adds the environment)."""
        raise NotImplementedError

    def describe_build(self, parts: Mapping[str, Any]) -> str:
        """The headline of a build's recorded ``parts``."""
        return "an unknown build"

    def __repr__(self) -> str:
        return f"<server kind {self.name!r}>"
