"""Import SGLang's real argument code from an unpacked wheel, without SGLang's dependencies.

SGLang's ``sglang.srt.server_args`` (with ``sglang.srt.arg_groups`` and ``sglang.srt.environ``)
defines every ``launch_server`` flag, but importing it pulls torch, transformers, CUDA and half
of SGLang. :func:`install` makes those imports harmless in the current interpreter: every
module outside the standard library, the argument modules and the few third-party packages they
really need (:data:`REAL_THIRD_PARTY`) becomes an inert :class:`Stub`, and the ``sglang`` and
``sglang.srt`` packages are registered bare so that their heavy ``__init__`` modules never run.

Used by ``scripts/gen-sim-flags.py`` (the simulator's per-release flag tables) and by the
contract tests of the preflight (``tests/contract/sglang_sources.py``, through a generated
``sitecustomize.py``), so both read the same real argparse code. Standard library only.

Under stubs argparse is real, so parsing rejects exactly what the release rejects; resolution
(``ServerArgs.__post_init__``) may end in an exception of a stub (a device query, a config
read), which says nothing about the release.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
from typing import Any

#: Modules imported for real; everything else outside the standard library is a stub.
REAL_PREFIXES = ("sglang.srt.server_args", "sglang.srt.arg_groups", "sglang.srt.environ")
#: Third-party packages the argument modules need for real (msgspec: SGLang 0.5.20+ builds
#: ServerArgs as a msgspec struct); they must be installed in the interpreter.
REAL_THIRD_PARTY = ("typing_extensions", "msgspec")
#: Packages registered bare (an empty module with the right ``__path__``).
BARE_PACKAGES = ("sglang", "sglang.srt")


class Stub(types.ModuleType):
    """A module/object that answers every attribute, call, iteration and operator inertly."""

    def __init__(self, name: str = "stub") -> None:
        super().__init__(name)
        self.__path__: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return Stub(f"{self.__name__}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator
        return Stub(self.__name__ + "()")

    def __iter__(self) -> Any:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __bool__(self) -> bool:
        return False

    def __mro_entries__(self, bases: Any) -> tuple[type, ...]:
        return (object,)

    def __getitem__(self, key: Any) -> Any:
        return Stub(self.__name__ + "[]")

    def __or__(self, other: Any) -> Any:
        return self

    __ror__ = __or__

    def __add__(self, other: Any) -> Any:
        return other

    __radd__ = __add__

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)

    def __int__(self) -> int:
        return 0

    __index__ = __int__

    def __float__(self) -> float:
        return 0.0

    def __lt__(self, other: Any) -> bool:
        return False

    __gt__ = __le__ = __ge__ = __lt__

    def __contains__(self, item: Any) -> bool:
        return False

    def keys(self) -> list[Any]:
        return []


class StubLoader(importlib.abc.Loader):
    """Creates a :class:`Stub` for every module it is asked for."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return Stub(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class StubFinder(importlib.abc.MetaPathFinder):
    """First on ``sys.meta_path``: a stub for every module but the standard library's, the
    argument modules and :data:`REAL_THIRD_PARTY` (those go on to the ordinary finders)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.startswith(REAL_PREFIXES) or fullname.startswith(REAL_THIRD_PARTY):
            return None
        if fullname.split(".")[0] in sys.stdlib_module_names:
            return None
        return importlib.machinery.ModuleSpec(fullname, StubLoader(), is_package=True)


def install(src: str | os.PathLike[str]) -> None:
    """Make ``import sglang.srt.server_args`` load the release unpacked at ``src`` (the folder
    holding its ``sglang/``), with everything else stubbed, in this interpreter.

    ``src`` goes first on ``sys.path``, so a ``sglang-<version>.dist-info`` beside ``sglang/``
    answers ``importlib.metadata.version("sglang")``. Installing twice is a no-op for the
    finder; call it before anything imports ``sglang``.
    """
    src = os.fspath(src)
    if src not in sys.path:
        sys.path.insert(0, src)
    if not any(isinstance(finder, StubFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, StubFinder())
    for package in BARE_PACKAGES:  # skip the packages' heavy __init__ modules
        module = types.ModuleType(package)
        module.__path__ = [os.path.join(src, *package.split("."))]
        sys.modules[package] = module
    sys.modules["sglang"].srt = sys.modules["sglang.srt"]  # type: ignore[attr-defined]
