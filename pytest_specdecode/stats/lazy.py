"""Modules imported when first used, not when the plugin loads.

pytest imports the plugin in every process it starts: a run that only collects, an xdist
controller that measures nothing, `pytest --version`, each pytester run of the plugin's own
tests. ``scipy.stats`` alone takes about 0.7 s of the plugin's 1.1 s import on a CI core, and
only a comparison against a baseline needs it; :class:`LazyModule` defers that cost to the first
attribute read (``stats.t.isf(...)``), after which the real module answers directly.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class LazyModule:
    """Stands in for the module ``name`` until an attribute is read; then imports it once."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attribute: str) -> Any:
        module = self._module
        if module is None:
            module = self._module = importlib.import_module(self._name)
        return getattr(module, attribute)

    def __repr__(self) -> str:
        state = "imported" if self._module is not None else "not imported yet"
        return f"<lazy module {self._name!r}, {state}>"
