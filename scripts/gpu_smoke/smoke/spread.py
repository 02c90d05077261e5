"""The spread phases (on request): launches against runs, and where NCCL settings go.

``scripts/gpu-smoke spread-record spread-check spread-swap`` (suite file
``scripts/gpu_smoke/suite/test_spread.py``): two profiles of the tiny Llama without speculation
that differ only in their NCCL environment, recorded over several launches by the plugin and
checked in later sessions; docs/gpu-smoke.md has what they showed on the H200 (2026-12-02).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
from pathlib import Path
from typing import Any

from smoke.common import (
    STATE,
    card_dir,
    env_int,
    fmt,
    ready_times,
    results_dir,
    run_pytest,
    save,
)  # fmt: skip

PHASES = ("spread-record", "spread-check", "spread-swap")
SPREAD_PROFILES = """
# The spread phases: two profiles that differ only in the NCCL environment (the seed's six
# variables, or none), each recorded over several launches, so that the launch-to-launch spread
# can be set beside the run-to-run one. At TP 1 NCCL moves no data: the variables must reach the
# processes, and the fingerprint must keep the two apart, whatever tok/s does.
[env.seed_nccl]
NCCL_PROTO = "LL"
NCCL_ALGO = "Ring"
NCCL_P2P_LEVEL = "SYS"
NCCL_MAX_NCHANNELS = "16"
NCCL_BUFFSIZE = "16777216"
NCCL_NTHREADS = "512"
NCCL_NVLS_ENABLE = "0"
TORCH_SYMM_MEM_DISABLE_MULTICAST = "1"
NVSHMEM_DISABLE_NVLS = "1"
HF_HUB_OFFLINE = "1"

[profiles.spread-plain]
description = "tiny Llama, no speculation, no NCCL tuning"
model_path = "@TARGET@"

[profiles.spread-nccl]
description = "tiny Llama, no speculation, the seed's six NCCL variables"
model_path = "@TARGET@"
env = "seed_nccl"

[env.seed_nccl_debug]
NCCL_PROTO = "LL"
NCCL_ALGO = "Ring"
NCCL_P2P_LEVEL = "SYS"
NCCL_MAX_NCHANNELS = "16"
NCCL_BUFFSIZE = "16777216"
NCCL_NTHREADS = "512"
NCCL_NVLS_ENABLE = "0"
TORCH_SYMM_MEM_DISABLE_MULTICAST = "1"
NVSHMEM_DISABLE_NVLS = "1"
HF_HUB_OFFLINE = "1"
NCCL_DEBUG = "INFO"
NCCL_DEBUG_SUBSYS = "INIT,ENV,TUNING"

[profiles.spread-nccl-debug]
description = "the NCCL-tuned profile with NCCL_DEBUG=INFO: NCCL's own account of its settings"
model_path = "@TARGET@"
env = "seed_nccl_debug"
"""
SHELL_NCCL = {  # exported by the shell around the spread phases, with values no profile uses
    "NCCL_PROTO": "Simple",
    "NCCL_ALGO": "Tree",
    "NCCL_P2P_LEVEL": "NVL",
    "NCCL_MAX_NCHANNELS": "2",
    "NCCL_BUFFSIZE": "4194304",
    "NCCL_NTHREADS": "64",
}
SEED_NCCL = {
    "NCCL_PROTO": "LL",
    "NCCL_ALGO": "Ring",
    "NCCL_P2P_LEVEL": "SYS",
    "NCCL_MAX_NCHANNELS": "16",
    "NCCL_BUFFSIZE": "16777216",
    "NCCL_NTHREADS": "512",
}


def env_dumps(directory: Path) -> dict[str, dict[str, Any]]:
    """profile -> what its servers' processes had: the variables by process, and the verdict
    on them (every process has exactly the profile's NCCL values; none from the shell)."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(directory.glob("*.json")):
        if path.name == "nccl-debug-lines.json":
            continue
        data = json.loads(path.read_text())
        profile = data["profile"]
        expected = SEED_NCCL if profile.startswith("spread-nccl") else {}
        procs = data["processes"]
        bad, unreadable = [], []
        for pid, proc in procs.items():
            if not proc.get("environ_readable", True):
                unreadable.append(proc["cmdline"].strip())
                continue
            nccl = {k: v for k, v in proc["env"].items() if k in SEED_NCCL}
            if nccl != expected:
                bad.append({"pid": pid, "cmdline": proc["cmdline"].strip(), "nccl": nccl})
        entry = out.setdefault(
            profile, {"servers": 0, "processes": 0, "wrong": [], "unreadable": [], "sample": {}}
        )
        entry["servers"] += 1
        entry["processes"] += len(procs)
        entry["wrong"] += bad
        entry["unreadable"] += unreadable
    lines = directory / "nccl-debug-lines.json"
    if lines.exists():
        found = json.loads(lines.read_text())
        out["nccl-debug"] = {
            "lines": len(found),
            "env_lines": [line for line in found if "set by environment" in line][:20],
        }
        readable = [p for p in procs.values() if p.get("environ_readable", True)]
        if readable and not entry["sample"]:
            entry["sample"] = {"cmdline": readable[0]["cmdline"], "env": readable[0]["env"]}
    return out


def launch_spread(baselines: Path) -> dict[str, dict[str, Any]]:
    """profile -> tok/s per launch of its baseline: mean and run CV of each launch, and the
    launch-to-launch CV of the launch means (corrected for their own run noise)."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(baselines.rglob("*.json")):
        data = json.loads(path.read_text())
        values = [float(v) for v in data["samples"]["tok_s"]]
        counts = data.get("launch_runs") or [len(values)]
        launches, start = [], 0
        for n in counts:
            part = values[start : start + n]
            start += n
            launches.append(part)
        means = [statistics.mean(p) for p in launches]
        run_cvs = [statistics.stdev(p) / statistics.mean(p) for p in launches if len(p) > 1]
        level = statistics.mean(means)
        spread = statistics.stdev(means) / level if len(means) > 1 else None
        within = statistics.mean(cv**2 for cv in run_cvs) / statistics.mean(counts)
        launch_cv = None if spread is None else max(0.0, spread**2 - within) ** 0.5
        out[path.stem] = {
            "profile": data.get("profile") or path.stem,
            "fingerprint": (data.get("fingerprint") or {}).get("digest"),
            "launch_means": [round(m, 2) for m in means],
            "run_cv": [round(cv, 4) for cv in run_cvs],
            "launch_cv": None if launch_cv is None else round(launch_cv, 4),
        }
    return out


def phase_spread(phase: str) -> int:
    """One pytest session of test_spread.py: record (over several launches), check, or swap
    (the plain test on the NCCL-tuned server). The baselines of a fresh machine come back with
    the state (GPU_SMOKE_RESTORE)."""
    d = card_dir()
    basetemp = d / f"pt-{phase}"
    results = results_dir()
    results.mkdir(parents=True, exist_ok=True)
    report = results / f"{phase}-report.json"
    dump = d / f"env-{phase}"
    baselines = d / "baselines-spread"
    shutil.rmtree(dump, ignore_errors=True)
    args = [
        "test_spread.py",
        "--basetemp", str(basetemp),
        "--specdecode-baselines", str(baselines),
        "--specdecode-state-dir", str(STATE / "state-spread"),
        "--specdecode-report", str(report),
        # SGLang's own argument check ran in the other phases; here a launch costs a minute
        "--specdecode-skip-preflight",
    ]  # fmt: skip
    env = {**SHELL_NCCL, "GPU_SMOKE_ENV_DUMP": str(dump)}
    if phase == "spread-record":
        args += [
            "--update-baselines",
            "--specdecode-baseline-launches", str(env_int("GPU_SMOKE_SPREAD_LAUNCHES", 3)),
            "--specdecode-baseline-runs", str(env_int("GPU_SMOKE_SPREAD_RUNS", 8)),
            "-k", "not test_nccl_debug",  # nothing to record there
        ]  # fmt: skip
        env["PYTEST_SPECDECODE_MAX_BASELINE_CV"] = "0.25"
    elif phase == "spread-check" and os.environ.get("GPU_SMOKE_SPREAD_K"):
        args += ["-k", os.environ["GPU_SMOKE_SPREAD_K"]]
    if phase == "spread-swap":
        # the plain test on the NCCL-tuned server: its baseline was recorded without tuning
        env["GPU_SMOKE_SPREAD_SWAP"] = "1"
        args += ["-k", "test_plain"]
    rc, output, wall = run_pytest(phase, [*args, "-rA"], env=env)
    save(phase, {
        "rc": rc, "wall_s": round(wall, 1), "rows": report_rows_by_test(report),
        "ready_s": ready_times(output),
        "launch_failures": len(re.findall(r"exited with code", output)),
        "environments": env_dumps(dump), "spread": launch_spread(baselines),
    })  # fmt: skip
    return rc


CHECK_KEYS = ("metric", "reference", "verdict", "ratio", "ci_low", "ci_high", "launches",
              "launch_cv", "problem")  # fmt: skip


def check_text(c: dict[str, Any]) -> str:
    text = f"{c['metric']} vs {c['reference'] or 'own'}: {c['verdict'] or c['problem']}"
    if c.get("ratio"):
        text += f" {c['ratio']:.3f} [{c['ci_low']:.3f}, {c['ci_high']:.3f}]"
    if c.get("launch_cv") is not None:
        text += f", {c['launches']} launches, launch CV {c['launch_cv']:.1%}"
    return text


def report_rows_by_test(report: Path) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    if not report.exists():
        return rows
    for t in json.loads(report.read_text()).get("tests", []):
        tok = (t.get("summary") or {}).get("tok_s") or {}
        rows[t.get("test_id", "?").rsplit("::", 1)[-1]] = {
            "profile": t.get("profile"),
            "outcome": t.get("outcome"),
            "tok_s": tok.get("mean"),
            "tok_s_cv": tok.get("cv"),
            "runs": tok.get("n"),
            "launch_runs": t.get("launch_runs"),
            "checks": [{k: c.get(k) for k in CHECK_KEYS} for c in t.get("checks") or []],
            "message": (t.get("message") or "")[:600],
        }
    return rows


def spread_table(res: dict[str, dict[str, Any]]) -> list[str]:
    rec, chk, swap = (res.get(f"spread-{n}") for n in ("record", "check", "swap"))
    if not rec and not chk:
        return []
    out = [
        "",
        "## spread: launches against runs, NCCL environment (TP 1)",
        "",
        "| test | profile | tok/s per launch (baseline) | run CV per launch | launch CV | "
        "fingerprint |",
        "|---|---|---|---|---|---|",
    ]
    for test, sp in sorted((chk or rec or {}).get("spread", {}).items()):
        launch_cv = "-" if sp["launch_cv"] is None else f"{sp['launch_cv']:.1%}"
        out.append(
            f"| {test} | {sp['profile']} | {', '.join(f'{m:.1f}' for m in sp['launch_means'])} | "
            f"{', '.join(f'{cv:.1%}' for cv in sp['run_cv'])} | "
            f"{launch_cv} | "
            f"{(sp['fingerprint'] or '-')[:12]} |"
        )
    for name, r in (("record", rec), ("check", chk), ("swap", swap)):
        if not r:
            continue
        out.append(
            f"- {name}: pytest exit {r['rc']}, {r['wall_s']} s, servers ready after "
            f"{', '.join(f'{t:.1f}' for t in r['ready_s']) or '-'} s"
        )
        for test, row in sorted(r["rows"].items()):
            recorded = row["outcome"] == "recorded"  # a recording compares nothing
            checks = "" if recorded else "; ".join(check_text(c) for c in row["checks"])
            out.append(
                f"  - {test} on {row['profile']}: **{row['outcome']}**, "
                f"{fmt(row['tok_s'], '.1f')} tok/s over {row['runs']} runs"
                + (f"; {checks}" if checks else "")
            )
        debug = r.get("environments", {}).get("nccl-debug")
        if debug:
            taken = debug["env_lines"] or "none logged"
            out.append(
                f"  - NCCL_DEBUG=INFO: {debug['lines']} NCCL lines in the server log; taken "
                f"from the environment: {taken}"
            )
        for profile, e in sorted(r.get("environments", {}).items()):
            if profile == "nccl-debug":
                continue
            verdict = "as the profile says" if not e["wrong"] else f"WRONG in {e['wrong']}"
            if e.get("unreadable"):
                verdict += f" (environ unreadable, title rewritten: {sorted(set(e['unreadable']))})"
            out.append(
                f"  - {profile}: {e['processes']} processes of {e['servers']} server(s), NCCL "
                f"variables {verdict}; e.g. `{e['sample'].get('cmdline', '')[:60]}`: "
                f"{e['sample'].get('env')}"
            )
    return out
