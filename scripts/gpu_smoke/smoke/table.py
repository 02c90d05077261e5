"""The table: what one card gave, from its results, to $OUT.

``$OUT/gpu-smoke-table.md`` (the table), ``$OUT/gpu-smoke-results.json`` (everything it was
made from) and, once the opt-in noise batches ran, ``$OUT/gpu-smoke-noise.json`` (the form of
tests/contract/data/h200_noise.json). ``scripts/gpu-smoke table DIR ...`` merges the results
folders of several calls or machines (no GPU).
"""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path
from typing import Any

from smoke import summary as noise_summary
from smoke.common import (
    EXPECTED_ACCEPT,
    MODELS,
    OUT,
    PROFILES,
    RIG,
    card,
    env_int,
    fmt,
    results_dir,
)  # fmt: skip
from smoke.phases import noise_mod
from smoke.spread import spread_table


def sglang_summary(values: list[float]) -> str:
    if not values:
        return "-"
    distinct = sorted(set(values))
    if len(distinct) == 1:
        return f"{distinct[0]:.2f} (all {len(values)} log lines)"
    mean = statistics.mean(values)
    return f"{mean:.2f} (lines {distinct[0]:.2f}-{distinct[-1]:.2f}, n={len(values)})"


def batches_summary(res: dict[str, Any]) -> dict[str, Any]:
    info = res.get("models_info") or {}
    runs = env_int("GPU_SMOKE_NOISE_RUNS", 10)
    result: dict[str, Any] = noise_mod().summarise(res.get("noise_batches", []), info, runs)
    return result


def load_results(dirs: list[Path]) -> dict[str, Any]:
    res: dict[str, Any] = {"noise_batches": []}
    seen: set[str] = set()

    def add_batches(batches: list[dict[str, Any]]) -> None:
        for b in batches:
            if b["batch"] not in seen:
                seen.add(b["batch"])
                res["noise_batches"].append(b)

    for d in dirs:
        add_batches([json.loads(p.read_text()) for p in sorted(d.glob("noise-b*.json"))])
        for name in ("noise-probe", f"models-{RIG['prefix']}"):
            p = d / f"{name}.json"
            if p.exists():
                key = "noise_probe" if name == "noise-probe" else "models_info"
                res.setdefault(key, json.loads(p.read_text()))
        for name in (
            *("record", "check", "attach", "launches"),
            *("spread-record", "spread-check", "spread-swap"),
        ):
            p = d / f"{name}.json"
            if p.exists():
                res.setdefault(name, json.loads(p.read_text()))
        if "noise_summary" not in res and any(d.glob("*-report.json")):
            res.setdefault("results_dir", str(d))
        p = d / "gpu-smoke-results.json"
        if p.exists():
            for k, v in json.loads(p.read_text()).items():
                if k == "noise_batches":
                    add_batches(v)
                else:
                    res.setdefault(k, v)
    if "models_info" not in res and (MODELS / f"models-{RIG['prefix']}.json").exists():
        res["models_info"] = json.loads((MODELS / f"models-{RIG['prefix']}.json").read_text())
    if "results_dir" in res and "noise_summary" not in res:
        res["noise_summary"] = noise_summary.summarise(
            Path(res["results_dir"]), res.get("models_info")
        )
    res["noise_batches"].sort(key=lambda b: b["batch"])
    if res["noise_batches"]:
        res["noise"] = batches_summary(res)
    return res


def phase_line(name: str, r: dict[str, Any]) -> str:
    # "status" since 2026-12-06; earlier results have only pytest's exit code
    status = r.get("status") or f"pytest exit {r['rc']}"
    ready = ", ".join(f"{t:.1f}" for t in r["ready_s"]) or "-"
    preflight = ", ".join(f"{t:.1f}" for t in r.get("preflight_s") or [])
    return (
        f"- {name}: {status}; {r['wall_s']} s of pytest sessions, servers ready after {ready} s, "
        + (f"SGLang's preflight {preflight} s" if preflight else "SGLang's preflight skipped")
        + f", launch failures {r['launch_failures']}"
    )


def table(res: dict[str, Any], key: str, guard: str | None = None) -> str:
    lines = [
        "| profile | accept len (SGLang log) | accept len (plugin) | expected | tok/s record | "
        "tok/s check | record | check |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rec, chk = res.get("record", {}), res.get("check", {})
    for p in PROFILES:
        r = rec.get("rows", {}).get(p, {})
        c = chk.get("rows", {}).get(p, {})
        sg = (chk.get("sglang_accept_len", {}).get(p) or []) + (
            rec.get("sglang_accept_len", {}).get(p) or []
        )
        plugin_accept = fmt(c.get("accept_length", r.get("accept_length")))
        lines.append(
            f"| {p} | {sglang_summary(sg)} | {plugin_accept} | {fmt(EXPECTED_ACCEPT.get(p))} | "
            f"{fmt(r.get('tok_s'), '.1f')} | {fmt(c.get('tok_s'), '.1f')} | "
            f"{fmt(r.get('outcome'))} | {fmt(c.get('outcome'))} |"
        )
    out = [f"## gpu-smoke ({key})", "", *lines, ""]
    for name in ("record", "check"):
        if name in res:
            out.append(phase_line(name, res[name]))
    la = res.get("launches")
    if la:
        ok = [x for x in la["launches"] if x["rc"] == 0]
        ready = [x["ready_s"] for x in ok if x.get("ready_s")]
        ports = sorted(x["port"] for x in la["launches"] if x["port"])
        out.append(
            f"- launches: {la['count']} ({la['concurrency']} at a time), failures "
            f"**{la['failures']}**; ports {ports}; "
            f"ready after {min(ready):.1f}-{max(ready):.1f} s"
            if ready
            else f"- launches: {la['count']}, failures **{la['failures']}**"
        )
    at = res.get("attach")
    if at:
        row = (at.get("rows") or {}).get("smoke-eagle3-match", {})
        out.append(
            f"- attach (server started by hand on port {at['port']}, ready after "
            f"{at.get('ready_s', '-')} s): record exit {at.get('record_rc')}, check exit "
            f"{at.get('check_rc')}, verdict {row.get('outcome', '-')}, accept len "
            f"{fmt(row.get('accept_length'))} (SGLang log "
            f"{sglang_summary(at.get('sglang_accept_len') or [])}): "
            f"**{'PASS' if at.get('passed') else 'FAIL'}**"
            + (f" ({at['error']})" if at.get("error") else "")
        )
    if res.get("noise_summary"):
        out += noise_summary.table(res["noise_summary"], key, guard)
    out += spread_table(res)
    if res.get("noise"):
        out += noise_mod().table(res["noise"], res.get("noise_probe"))
    return "\n".join(out) + "\n"


def gpu_name(key: str) -> str:
    """'1xNVIDIA-H200' -> 'H200'; 'simulated' stays."""
    name = key.split("x", 1)[1] if key[:1].isdigit() and "x" in key else key
    return name.removeprefix("NVIDIA-")


def contract_noise(res: dict[str, Any], key: str) -> dict[str, Any] | None:
    """The noise batches' figures in the form of tests/contract/data/h200_noise.json."""
    summary = res.get("noise")
    if not summary:
        return None
    nz = noise_mod()
    probe = res.get("noise_probe") or {}
    main = {p: summary[p] for p in nz.MAIN if p in summary}
    run_cvs = [c for e in main.values() for c in e["run_cv_per_launch"]]
    info = res.get("models_info") or {}
    rig_keys = ("shape", "target_params", "target_bytes_per_step", "draft_params", "built_s",
                "written_s")  # fmt: skip
    return {
        "what": "run-to-run and launch-to-launch noise of a GPU-bound SGLang server "
        f"(scripts/gpu-smoke noise phase), measured on one {gpu_name(key)}, TP 1",
        "machine": probe.get("machine"),
        "copy_bandwidth_gb_s": probe.get("gb_s"),
        "rig": {k: info.get(k) for k in rig_keys},
        "server_flags": nz.NOISE_FLAGS,
        "protocol": {
            "workload": "2 prompts of the mixed set, one at a time, 127 new tokens, greedy, "
            "ignore_eos, streamed /generate",
            "runs_per_launch": env_int("GPU_SMOKE_NOISE_RUNS", 10),
            "run_cv_from": "runs 3.. of block A (flush before each run; runs 1-2 stand for "
            "the warm-up)",
            "launches": "started together in batches, measured one at a time (the others idle)",
        },
        "largest_run_cv": max(run_cvs) if run_cvs else None,
        "profiles": summary,
        "batches": [b["batch"] for b in res.get("noise_batches", [])],
    }


def phase_table(dirs: list[Path], guard: str | None = None) -> int:
    key = card() if not dirs else ", ".join(sorted({d.parent.name for d in dirs}))
    info = MODELS / f"models-{RIG['prefix']}.json"
    if not dirs and info.exists() and results_dir().exists():
        # the rig's facts (bytes a decode step reads) travel with the results, not the models
        shutil.copy(info, results_dir() / info.name)
    res = load_results(dirs or [results_dir()])
    text = table(res, key, guard)
    print(text)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "gpu-smoke-table.md").write_text(text)
    (OUT / "gpu-smoke-results.json").write_text(json.dumps(res, indent=2) + "\n")
    contract = contract_noise(res, key)
    if contract:
        (OUT / "gpu-smoke-noise.json").write_text(json.dumps(contract, indent=2) + "\n")
    return 0
