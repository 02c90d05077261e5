"""Realistic results and nightly histories for the report, history and CLI tests.

``data/seed_results.json`` holds the four ``SpecdecodeResult.to_json()`` records of one real run
of the example suite (``pytest perf_tests`` against the simulated server, every test PASS). The
helpers below derive other nights from them: throughput and accept length scaled by a factor, with
the own-baseline checks and the outcome made consistent with that factor.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_specdecode.outputs.history import history_record
from pytest_specdecode.result import Outcome, SpecdecodeResult, TestError

DATA = Path(__file__).parent / "data" / "seed_results.json"
PROFILES = ("nospec-nccl", "eagle3-5step", "eagle3-5step-nccl", "eagle3-2step-nccl")
CI_HALF = 0.015  # half-width of the fake ratio CI of a derived night


def seed_json() -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = json.loads(DATA.read_text(encoding="utf-8"))
    return data


def seed_results() -> list[SpecdecodeResult]:
    return [SpecdecodeResult.from_json(item) for item in seed_json()]


def seed_result(profile: str = "eagle3-2step-nccl") -> SpecdecodeResult:
    for item in seed_json():
        if item["profile"] == profile:
            return SpecdecodeResult.from_json(item)
    raise LookupError(profile)


def _judge(ratio: float, margin: float) -> tuple[float, float, str]:
    low, high = ratio - CI_HALF, ratio + CI_HALF
    if low > 1 + margin:
        return low, high, "pass"
    if high < 1 + margin:
        return low, high, "fail"
    return low, high, "inconclusive"


def scaled(
    result: SpecdecodeResult,
    tok_s: float = 1.0,
    accept: float = 1.0,
    *,
    baseline_std: float | None = None,
) -> SpecdecodeResult:
    """``result`` with tok/s (and decode tok/s) scaled by ``tok_s`` and accept length by
    ``accept``; own-baseline checks get ratio = factor, a ±1.5% CI, the verdict that follows
    from the margin, and ``baseline_std`` when given; the outcome is the worst verdict."""
    data = copy.deepcopy(result.to_json())
    factors = {"tok_s": tok_s, "decode_tok_s": tok_s, "accept_length": accept}
    for name, factor in factors.items():
        if name in data["samples"]:
            data["samples"][name] = [v * factor for v in data["samples"][name]]
    verdicts = []
    for check in data["checks"]:
        if check.get("ratio") is None:
            continue
        if check["reference"] is None and check["metric"] in factors:
            factor = factors[check["metric"]]
            low, high, verdict = _judge(factor, check["margin"])
            check.update(ratio=factor, ci_low=low, ci_high=high, verdict=verdict)
            check["current_mean"] = check["baseline_mean"] * factor
            if baseline_std is not None:
                check["baseline_std"] = baseline_std * check["baseline_mean"]
        verdicts.append(check["verdict"])
    if "fail" in verdicts:
        data["outcome"] = Outcome.FAIL.value
    elif "inconclusive" in verdicts:
        data["outcome"] = Outcome.INCONCLUSIVE.value
    else:
        data["outcome"] = Outcome.PASS.value
    return SpecdecodeResult.from_json(data)


def night(
    day: int,
    factors: Mapping[str, float] | None = None,
    *,
    accept: Mapping[str, float] | None = None,
    profiles: tuple[str, ...] = PROFILES,
    baseline_std: float | None = 0.012,
) -> dict[str, Any]:
    """The history record of a session on 2026-11-``day`` at 03:00 UTC, each profile's tok/s
    scaled by ``factors[profile]`` (default 1.0) and accept length by ``accept[profile]``."""
    factors = factors or {}
    accept = accept or {}
    results = [
        scaled(seed_result(p), factors.get(p, 1.0), accept.get(p, 1.0), baseline_std=baseline_std)
        for p in profiles
    ]
    failed = any(r.outcome is Outcome.FAIL for r in results)
    return history_record(
        results,
        session_info={
            "started_utc": f"2026-11-{day:02d}T02:40:00Z",
            "finished_utc": f"2026-11-{day:02d}T03:00:00Z",
            "target": "sim",
            "pytest_args": ["perf_tests"],
            "exit_status": 1 if failed else 0,
            "run_id": f"night-{day}",
            "git": {"commit": f"{day:02d}" + "c0ffee" * 6, "dirty": False},
        },
    )


def errored(profile: str, error: TestError) -> SpecdecodeResult:
    """The seed's test of ``profile`` as a test that errored or crashed with ``error``."""
    seed = seed_result(profile)
    return SpecdecodeResult.errored(
        seed.test_id,
        profile=seed.profile,
        simulated=seed.simulated,
        hardware_key=seed.hardware_key,
        workload_name=seed.workload_name,
        workload_hash=seed.workload_hash,
        fingerprint=seed.fingerprint,
        error=error,
    )
