"""The Student t, normal and chi-square functions the statistics use, from ``scipy.special``.

They are the functions ``scipy.stats.t``, ``norm`` and ``chi2`` evaluate underneath (their
``_cdf``, ``_sf``, ``_ppf`` and ``_isf``), called directly: the same numbers without importing
``scipy.stats``, which costs every comparing pytest process about 0.7 s of CPU (it builds the
docstrings of a hundred distributions) where ``scipy.special`` takes 0.25 s. ``scipy.stats``
is still imported where it is needed whole: ``stats.bootstrap`` for the bootstrap method.
Arguments are floats or numpy arrays, broadcast as numpy does; ``df`` may be ``inf`` (the normal
limit, where a zero-variance sample puts Welch's df).
"""

from __future__ import annotations

from typing import Any

from pytest_specdecode.lazy import LazyModule

special: Any = LazyModule("scipy.special")

__all__ = [
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
