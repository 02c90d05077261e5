"""The ``specdecode`` marker: which server a test measures, on what workload, and what it must
show against which baseline.

    @pytest.mark.specdecode(
        "eagle3-2step-nccl",                      # the server profile (or server=...)
        tok_s=-0.03, accept_length=-0.05,          # against its own baseline
        against={"nospec-nccl": {"tok_s": +0.05}}, # and must beat another profile's by 5%
        workload="seed", runs=5,
    )

Margins are signed fractions on the higher-is-better scale (docs/architecture.md). Parsing is
plain Python so the rules are unit-testable; the plugin turns a :class:`ConfigError` into a
``pytest.UsageError`` naming the test.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_specdecode.errors import ConfigError
from pytest_specdecode.settings import INCONCLUSIVE_POLICIES, METHODS, MISSING_BASELINE_POLICIES
from pytest_specdecode.verdict import Threshold

METRIC_KEYS = ("tok_s", "decode_tok_s", "accept_length", "ttft", "tpot", "itl_p50", "itl_p99")
OPTION_KEYS = (
    "server",
    "workload",
    "against",
    "runs",
    "max_runs",
    "method",
    "alpha",
    "on_inconclusive",
    "on_missing_baseline",
)
ALL_KEYS = OPTION_KEYS + METRIC_KEYS

MARKER_HELP = (
    "specdecode(server, *, tok_s=None, accept_length=None, decode_tok_s=None, ttft=None, "
    "tpot=None, itl_p50=None, itl_p99=None, against=None, workload=None, runs=None, "
    "max_runs=None, method=None, alpha=None, on_inconclusive=None, on_missing_baseline=None): "
    "measure the server profile SERVER (from the specdecode profile file) and compare with the "
    "stored baseline; metric keywords are signed margins on the higher-is-better scale "
    "(+0.05 = must beat the baseline by 5%, -0.03 = may be at most 3% worse); "
    "against={'PROFILE': {'tok_s': 0.05}} compares with another profile's stored baseline."
)


@dataclass(frozen=True)
class MarkerSpec:
    server: str | None
    thresholds: tuple[Threshold, ...] = ()
    workload: str | Mapping[str, Any] | None = None
    runs: int | None = None
    max_runs: int | None = None
    method: str | None = None
    alpha: float | None = None
    on_inconclusive: str | None = None
    on_missing_baseline: str | None = None

    @property
    def references(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t.reference for t in self.thresholds if t.reference))


def parse_marker(args: Sequence[Any], kwargs: Mapping[str, Any], *, where: str) -> MarkerSpec:
    """Validate one ``specdecode`` marker; ``where`` names the test for error messages."""

    def fail(message: str) -> ConfigError:
        return ConfigError(f"specdecode marker on {where}: {message}")

    if len(args) > 1:
        raise fail(f"takes at most one positional argument (the server profile), got {args!r}")
    unknown = [key for key in kwargs if key not in ALL_KEYS]
    if unknown:
        key = unknown[0]
        hint = difflib.get_close_matches(key, ALL_KEYS, n=1)
        did_you_mean = f"; did you mean {hint[0]!r}?" if hint else ""
        raise fail(f"unknown key {key!r}{did_you_mean} Allowed keys: {', '.join(ALL_KEYS)}")
    if args and "server" in kwargs:
        raise fail("the server is given twice (positionally and as server=...)")
    server = args[0] if args else kwargs.get("server")
    if server is not None and (not isinstance(server, str) or not server):
        raise fail(f"server must be a profile name (a string), got {server!r}")

    thresholds = [
        Threshold(key, _margin(kwargs[key], key, fail)) for key in METRIC_KEYS if key in kwargs
    ]
    against = kwargs.get("against")
    if against is not None:
        if not isinstance(against, Mapping) or not against:
            raise fail(
                f"against must map profile names to margins, e.g. "
                f"{{'nospec-nccl': {{'tok_s': 0.05}}}}; got {against!r}"
            )
        for profile, margins in against.items():
            if not isinstance(profile, str) or not isinstance(margins, Mapping) or not margins:
                raise fail(
                    f"against[{profile!r}] must be a non-empty mapping of metric to margin, "
                    f"e.g. {{'tok_s': 0.05}}; got {margins!r}"
                )
            for metric, value in margins.items():
                if metric not in METRIC_KEYS:
                    hint = difflib.get_close_matches(str(metric), METRIC_KEYS, n=1)
                    did_you_mean = f"; did you mean {hint[0]!r}?" if hint else ""
                    raise fail(
                        f"against[{profile!r}] has unknown metric {metric!r}{did_you_mean} "
                        f"Metrics: {', '.join(METRIC_KEYS)}"
                    )
                label = f"against[{profile!r}][{metric!r}]"
                thresholds.append(Threshold(metric, _margin(value, label, fail), profile))

    workload = kwargs.get("workload")
    if workload is not None and not isinstance(workload, (str, Mapping)):
        raise fail(f"workload must be a name or a mapping of overrides, got {workload!r}")
    runs = _optional_runs(kwargs.get("runs"), "runs", fail)
    max_runs = _optional_runs(kwargs.get("max_runs"), "max_runs", fail)
    if runs is not None and max_runs is not None and max_runs < runs:
        raise fail(f"max_runs ({max_runs}) is smaller than runs ({runs})")
    alpha = kwargs.get("alpha")
    if alpha is not None and (
        isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 0.5
    ):
        raise fail(f"alpha must be a number between 0 and 0.5, got {alpha!r}")
    return MarkerSpec(
        server=server,
        thresholds=tuple(thresholds),
        workload=workload,
        runs=runs,
        max_runs=max_runs,
        method=_optional_choice(kwargs.get("method"), "method", METHODS, fail),
        alpha=float(alpha) if alpha is not None else None,
        on_inconclusive=_optional_choice(
            kwargs.get("on_inconclusive"), "on_inconclusive", INCONCLUSIVE_POLICIES, fail
        ),
        on_missing_baseline=_optional_choice(
            kwargs.get("on_missing_baseline"),
            "on_missing_baseline",
            MISSING_BASELINE_POLICIES,
            fail,
        ),
    )


def _margin(value: Any, label: str, fail: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail(f"{label} must be a signed fraction such as -0.03 or +0.05, got {value!r}")
    if not -1.0 < value <= 10.0:
        raise fail(
            f"{label} = {value!r} is not a plausible margin: it is a fraction of the baseline "
            "(-0.03 = at most 3% worse, +0.05 = at least 5% better); use a value in (-1, 10]"
        )
    return float(value)


def _optional_runs(value: Any, label: str, fail: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise fail(
            f"{label} must be a whole number of at least 2 (one run has no run-to-run "
            f"variance, so no confidence interval), got {value!r}"
        )
    return value


def _optional_choice(value: Any, label: str, allowed: Sequence[str], fail: Any) -> str | None:
    if value is None:
        return None
    if value not in allowed:
        raise fail(f"{label} must be one of {', '.join(allowed)}, got {value!r}")
    return str(value)
