"""The Student t, normal and chi-square functions the statistics use, from ``scipy.special``.

They are the functions ``scipy.stats.t``, ``norm`` and ``chi2`` evaluate underneath (their
``_cdf``, ``_sf``, ``_ppf`` and ``_isf``), called directly: the same numbers without importing
``scipy.stats``, which costs every comparing pytest process about 0.7 s of CPU (it builds the
docstrings of a hundred distributions) where ``scipy.special`` takes 0.25 s. ``scipy.stats``
is still imported where it is needed whole: ``stats.bootstrap`` for the bootstrap method.
Arguments are floats or numpy arrays, broadcast as numpy does; ``df`` may be ``inf`` (the normal
limit, where a zero-variance sample puts Welch's df).

Both imports wait for the first call (:class:`LazyModule`): pytest imports the plugin in every
process it starts (a run that only collects, an xdist controller that measures nothing,
`pytest --version`, each pytester run of the plugin's own tests), and only a comparison against a
baseline needs scipy. ``scipy.stats`` alone takes about 0.7 s of the plugin's 1.1 s import on a
CI core; :class:`LazyModule` defers that cost to the first attribute read (``stats.t.isf(...)``),
after which the real module answers directly. The modules that need more of scipy
(``intervals``, ``power_analysis``) hold their own :class:`LazyModule`.
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


special: Any = LazyModule("scipy.special")

__all__ = [
    "LazyModule",
    "chi2_ppf",
    "f_isf",
    "norm_cdf",
    "norm_isf",
    "norm_ppf",
    "norm_sf",
    "t_cdf",
    "t_isf",
    "t_ppf",
    "t_sf",
]


def t_cdf(x: Any, df: Any) -> Any:
    """P(T <= x) for Student's t with ``df`` degrees of freedom."""
    return special.stdtr(df, x)


def t_sf(x: Any, df: Any) -> Any:
    """P(T > x)."""
    return special.stdtr(df, -x)


def t_ppf(q: Any, df: Any) -> Any:
    """The x with P(T <= x) = q."""
    return special.stdtrit(df, q)


def t_isf(q: Any, df: Any) -> Any:
    """The x with P(T > x) = q."""
    return -special.stdtrit(df, q)


def norm_cdf(x: Any) -> Any:
    return special.ndtr(x)


def norm_sf(x: Any) -> Any:
    return special.ndtr(-x)


def norm_ppf(q: Any) -> Any:
    return special.ndtri(q)


def norm_isf(q: Any) -> Any:
    return -special.ndtri(q)


def chi2_ppf(q: Any, df: Any) -> Any:
    """The x with P(X <= x) = q for the chi-square distribution with ``df`` degrees of freedom."""
    return 2.0 * special.gammaincinv(df / 2.0, q)


def f_isf(q: Any, dfn: Any, dfd: Any) -> Any:
    """The x with P(X > x) = q for the F distribution with ``dfn`` and ``dfd`` degrees of
    freedom."""
    return special.fdtri(dfn, dfd, 1.0 - q)
