"""Server kinds: what differs between ``launcher = "sglang"``, ``"docker"``, ``"sim"`` and
``"llamacpp"``, one module a kind behind one small interface (``base.ServerKind``), registered
once in ``registry.KINDS``. A new kind is one new module (its command, its build, its
capabilities) plus one line in the registry; nothing outside this folder compares launcher
names (tests/unit/test_architecture.py counts them).
"""

from __future__ import annotations

from pytest_specdecode.profiles.kinds.base import ServerKind
from pytest_specdecode.profiles.kinds.registry import KINDS, kind_of

__all__ = ["KINDS", "ServerKind", "kind_of"]
