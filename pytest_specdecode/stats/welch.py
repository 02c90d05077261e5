"""Welch's standard error and degrees of freedom, and the log variance they are fed with.

The one piece of arithmetic that the comparison (:mod:`pytest_specdecode.stats.intervals`' welch-log
and bootstrap), the power analysis (:mod:`pytest_specdecode.stats.power_analysis`, which integrates
over Welch's df) and the sequential plan (:mod:`pytest_specdecode.stats.sequential`, which simulates
the Welch test at every look) must compute identically. It lives below all three, so the power
analysis needs nothing of the comparison and the comparison can use the power analysis.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["log_variance", "welch_terms"]


def welch_terms(
    var_cur: NDArray[np.float64], n_cur: int, var_base: NDArray[np.float64], n_base: int
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Welch's standard error and Satterthwaite df, elementwise; df = inf where se = 0."""
    q_cur, q_base = var_cur / n_cur, var_base / n_base
    se = np.sqrt(q_cur + q_base)
    with np.errstate(divide="ignore", invalid="ignore"):
        df = (q_cur + q_base) ** 2 / (q_cur**2 / (n_cur - 1) + q_base**2 / (n_base - 1))
    return se, np.where(se > 0, df, np.inf)


def log_variance(log_values: NDArray[np.float64], constant: bool) -> float:
    # np.var of identical values can be a few ulps above 0; constant data must give exactly 0.
    return 0.0 if constant else float(np.var(log_values, ddof=1))
