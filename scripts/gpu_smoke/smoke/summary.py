"""The noise summary of the default phases: what record and check measured, launch by launch.

No launch of its own: every profile is launched once by record (or more, with
GPU_SMOKE_BASELINE_LAUNCHES) and once by check, so each has two launches or more on this card,
each with its runs. From the plugin's JSON reports: the run CV inside each launch, how far the
launch means lie apart, the no-speculation decode step against the bytes it must read and the
device-to-device copy of the probe (is the rig GPU-bound here?), and the largest run CV against
the suite's noise guard. The heavy noise batches (8+ launches per profile, warm-up and flush
effects: ``scripts/gpu-smoke noise``) are an opt-in phase of their own.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from smoke.common import CONTRACT_NOISE, PROFILES, report_tests


def _cv(xs: list[float]) -> float | None:
    return statistics.stdev(xs) / statistics.mean(xs) if len(xs) > 1 else None


def launches_of(results: Path) -> dict[str, list[dict[str, Any]]]:
    """profile -> one entry per launch that record and check measured (from their reports)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for phase in ("record", "check"):
        for profile in PROFILES:
            for t in report_tests(results / f"{phase}-{profile}-report.json"):
                samples = t.get("samples") or {}
                tok = [float(v) for v in samples.get("tok_s") or []]
                tpot = [float(v) for v in samples.get("tpot") or []]
                counts = t.get("launch_runs") or [len(tok)]
                start = 0
                for i, n in enumerate(counts):
                    part = tok[start : start + n]
                    step = tpot[start : start + n]
                    start += n
                    if not part:
                        continue
                    out.setdefault(profile, []).append({
                        "phase": phase, "launch": i + 1, "runs": len(part),
                        "tok_s": statistics.mean(part), "run_cv": _cv(part),
                        "tpot_ms": 1000 * statistics.mean(step) if step else None,
                    })  # fmt: skip
    return out


def summarise(results: Path, models_info: dict[str, Any] | None) -> dict[str, Any]:
    launches = launches_of(results)
    probe_path = results / "noise-probe.json"
    probe = json.loads(probe_path.read_text()) if probe_path.exists() else {}
    profiles: dict[str, Any] = {}
    for profile, entries in launches.items():
        means = [e["tok_s"] for e in entries]
        cvs = [e["run_cv"] for e in entries if e["run_cv"] is not None]
        profiles[profile] = {
            "launches": entries,
            "launch_means_tok_s": [round(m, 2) for m in means],
            "launch_spread": (max(means) - min(means)) / statistics.mean(means)
            if len(means) > 1
            else None,
            "launch_mean_cv": _cv(means),
            "run_cv_median": statistics.median(cvs) if cvs else None,
            "run_cv_max": max(cvs) if cvs else None,
        }
    summary: dict[str, Any] = {
        "profiles": profiles,
        "largest_run_cv": max(
            (p["run_cv_max"] for p in profiles.values() if p["run_cv_max"] is not None),
            default=None,
        ),
        "copy_gb_s": probe.get("gb_s"),
        "probe": {k: v for k, v in probe.items() if k != "machine"} or None,
    }
    nospec = [e["tpot_ms"] for e in launches.get("smoke-nospec", []) if e["tpot_ms"]]
    bytes_step = (models_info or {}).get("target_bytes_per_step")
    if nospec and bytes_step:
        step_ms = statistics.mean(nospec)
        summary["nospec_step_ms"] = step_ms
        summary["bytes_per_step"] = bytes_step
        summary["achieved_gb_s"] = bytes_step / (step_ms / 1000) / 1e9
    if CONTRACT_NOISE.exists():
        data = json.loads(CONTRACT_NOISE.read_text())
        main = {k: v for k, v in data.get("profiles", {}).items() if v.get("launches", 0) >= 8}
        summary["h200_reference"] = {
            "file": "tests/contract/data/h200_noise.json",
            "run_cv_median": [round(v["run_cv_median"], 5) for v in main.values()],
            "launch_mean_cv": [round(v["launch_mean_cv"], 5) for v in main.values()],
            "launches": [v["launches"] for v in main.values()],
        }
    return summary


def pct(v: float | None, spec: str = ".2%") -> str:
    return "-" if v is None else format(v, spec)


def table(summary: dict[str, Any], card: str, guard: str | None) -> list[str]:
    lines = [
        "",
        f"## noise summary ({card}): the launches of record and check, one at a time",
        "",
        "| profile | launches | tok/s per launch | run CV per launch (runs) | launch means "
        "differ by | decode ms/token |",
        "|---|---|---|---|---|---|",
    ]
    for profile in PROFILES:
        p = summary["profiles"].get(profile)
        if not p:
            continue
        entries = p["launches"]
        phases = ", ".join(e["phase"] for e in entries)
        toks = ", ".join(format(e["tok_s"], ".1f") for e in entries)
        cvs = ", ".join(f"{pct(e['run_cv'])} ({e['runs']})" for e in entries)
        steps = ", ".join("-" if e["tpot_ms"] is None else format(e["tpot_ms"], ".2f")
                          for e in entries)  # fmt: skip
        lines.append(
            f"| {profile} | {len(entries)} ({phases}) | {toks} | {cvs} | "
            f"{pct(p['launch_spread'])} | {steps} |"
        )
    if summary.get("achieved_gb_s"):
        copy = summary.get("copy_gb_s")
        lines.append(
            f"- GPU-bound: the no-speculation decode step, {summary['nospec_step_ms']:.2f} ms, "
            f"reads {summary['bytes_per_step'] / 1e9:.2f} GB of weights: "
            f"{summary['achieved_gb_s']:.0f} GB/s"
            + (
                f", {summary['achieved_gb_s'] / copy:.0%} of the {copy:.0f} GB/s a "
                "device-to-device copy reached here"
                if copy
                else ""
            )
        )
    elif summary.get("copy_gb_s"):
        lines.append(f"- device-to-device copy: {summary['copy_gb_s']:.0f} GB/s")
    if summary.get("largest_run_cv") is not None:
        lines.append(
            f"- largest run CV of one launch here: {pct(summary['largest_run_cv'])}"
            + (f"; the suite's noise guard: {guard}" if guard else "")
        )
    ref = summary.get("h200_reference")
    if ref:
        lines.append(
            f"- the H200's noise batches ({ref['file']}, {min(ref['launches'])}-"
            f"{max(ref['launches'])} launches a profile): run CV median "
            f"{pct(min(ref['run_cv_median']))}-{pct(max(ref['run_cv_median']))}, launch-mean CV "
            f"{pct(min(ref['launch_mean_cv']))}-{pct(max(ref['launch_mean_cv']))}; more "
            "launches of this card: `scripts/gpu-smoke noise` (opt-in, about 4 minutes a batch)"
        )
    return lines
