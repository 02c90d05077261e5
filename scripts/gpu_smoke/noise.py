"""The noise phase of scripts/gpu-smoke: how noisy a GPU-bound SGLang server is, run to run and
launch to launch, with CUDA graphs on (target and draft) and the Llama-3.1-8B-shaped rig.

Servers are started by hand in batches (GPU_SMOKE_NOISE_BATCH servers at once, each on its own
port, KV cache capped so that they fit together), and once every server of a batch is ready
they are measured **one at a time**, the others idle: the startup is concurrent, the timing is
not. Each server runs the same protocol:

* block A, GPU_SMOKE_NOISE_RUNS (10) runs with ``/flush_cache`` before each and no warm-up
  request: runs 1-2 show what warm-up would have hidden, runs 3.. are the plugin's protocol
  (flush, warm) and give the run CV and the launch mean;
* block B, 4 runs without the flush (the prefix cache then holds the prompts).

A run is the smoke workload: its 2 prompts, one request at a time, 127 new tokens each,
greedy, ignore_eos, streamed from ``/generate``; tok/s is the plugin's (generated tokens over the
run's wall time), accept length SGLang's (sum(c - 1) / sum(spec_verify_ct)), the decode step
time (last token - first token) / decode steps (verify steps with speculation). Results:
$GPU_SMOKE_STATE/results/noise-*.json, one per batch; ``summarise`` merges them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

MAX_NEW_TOKENS = 127  # 1 + 42 * 3 = 1 + 21 * 6 = 1 + 63 * 2: every accept length lands exactly
PROFILES = {
    # name: (draft head or None, num_steps)
    "noise-nospec": (None, 0),
    "noise-eagle3-2": ("match", 2),
    "noise-eagle3-5": ("match", 5),
    "noise-eagle3-2-miss": ("miss", 2),
    "noise-eagle3-2-first": ("first", 2),
    "noise-eagle3-5-first": ("first", 5),
}
EXPECTED_ACCEPT = {
    "noise-eagle3-2": 3.0,
    "noise-eagle3-5": 6.0,
    "noise-eagle3-2-miss": 1.0,
    "noise-eagle3-2-first": 2.0,
    "noise-eagle3-5-first": 2.0,
}
MAIN = ("noise-nospec", "noise-eagle3-2", "noise-eagle3-5")
HEADS = ("noise-eagle3-2-miss", "noise-eagle3-2-first", "noise-eagle3-5-first")
# What every noise server runs with: CUDA graphs on for target and draft, batch sizes up to 4
# (the workload sends one request at a time), a KV cache small enough for 6 servers on 1 GPU.
NOISE_FLAGS = [
    "--attention-backend", "triton", "--grammar-backend", "none",
    "--cuda-graph-max-bs", "4", "--max-total-tokens", "16384", "--chunked-prefill-size", "4096",
    "--mem-fraction-static", "0.9",
]  # fmt: skip


def log(msg: str) -> None:
    print(f"gpu-smoke: [noise] {msg}", flush=True)


def prompts() -> list[str]:
    try:
        from pytest_specdecode.workloads import load_prompt_set

        return [p.text for p in load_prompt_set("mixed")[:2]]
    except Exception:
        return ["def fib(n):", "What is 12 * 13?"]


def http(url: str, data: dict | None = None, timeout: float = 120) -> bytes:
    req = urllib.request.Request(
        url,
        data=None if data is None else json.dumps(data).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read()


def one_request(base: str, text: str) -> dict:
    body = {
        "text": text,
        "sampling_params": {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0, "ignore_eos": True},
        "stream": True,
    }
    req = urllib.request.Request(
        f"{base}/generate", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    start = time.perf_counter()
    first = None
    last_chunk: dict = {}
    with urllib.request.urlopen(req, timeout=300) as r:
        for raw in r:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            chunk = json.loads(payload)
            if "error" in chunk:
                raise RuntimeError(chunk["error"])
            if first is None and chunk.get("meta_info", {}).get("completion_tokens", 0) > 0:
                first = time.perf_counter()
            last_chunk = chunk
    end = time.perf_counter()
    meta = last_chunk.get("meta_info", {})
    return {
        "start": start,
        "end": end,
        "ttft": None if first is None else first - start,
        "decode_s": None if first is None else end - first,
        "completion_tokens": int(meta.get("completion_tokens", 0)),
        "spec_verify_ct": meta.get("spec_verify_ct"),
        "text_ok": set(re.findall(r"\S+", last_chunk.get("text", ""))) <= {"the"},
    }


def one_run(base: str, texts: list[str], flush: bool) -> dict:
    if flush:
        for _ in range(20):
            try:
                http(f"{base}/flush_cache", timeout=30)
                break
            except Exception:
                time.sleep(0.2)
    reqs = [one_request(base, t) for t in texts]
    wall = reqs[-1]["end"] - reqs[0]["start"]
    tokens = sum(r["completion_tokens"] for r in reqs)
    verify = [r["spec_verify_ct"] for r in reqs]
    steps = sum(v for v in verify if v) if all(v is not None for v in verify) else None
    decode_steps = steps if steps else sum(r["completion_tokens"] - 1 for r in reqs)
    decode_s = sum(r["decode_s"] or 0.0 for r in reqs)
    return {
        "flush": flush,
        "tok_s": tokens / wall,
        "tokens": tokens,
        "wall_s": wall,
        "ttft_s": [r["ttft"] for r in reqs],
        "accept_length": (sum(r["completion_tokens"] - 1 for r in reqs) / steps if steps else None),
        "decode_steps": decode_steps,
        "step_ms": 1000 * decode_s / decode_steps if decode_steps else None,
        "text_ok": all(r["text_ok"] for r in reqs),
    }


def measure(base: str, runs: int) -> list[dict]:
    texts = prompts()
    out = [one_run(base, texts, flush=True) for _ in range(runs)]
    out += [one_run(base, texts, flush=False) for _ in range(4)]
    return out


def server_cmd(python: str, models: Path, rig: dict, profile: str, port: int) -> list[str]:
    head, steps = PROFILES[profile]
    cmd = [
        python, "-m", "sglang.launch_server", "--model-path", str(models / rig["target"]),
        "--tp-size", "1", "--host", "127.0.0.1", "--port", str(port), *NOISE_FLAGS,
    ]  # fmt: skip
    if head:
        cmd += [
            "--speculative-algorithm", "EAGLE3",
            "--speculative-draft-model-path", str(models / f"{rig['prefix']}-eagle3-{head}"),
            "--speculative-num-steps", str(steps), "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", str(steps + 1),
        ]  # fmt: skip
    return cmd


def wait_all(servers: list[dict], timeout: float) -> None:
    start = time.monotonic()
    pending = list(servers)
    while pending and time.monotonic() - start < timeout:
        for s in list(pending):
            if s["proc"].poll() is not None:
                s["error"] = f"exited with code {s['proc'].returncode}"
                pending.remove(s)
                continue
            try:
                http(f"{s['base']}/health_generate", timeout=5)
                s["ready_s"] = round(time.monotonic() - s["t0"], 1)
                pending.remove(s)
            except Exception:
                pass
        time.sleep(1)
    for s in pending:
        s["error"] = f"not ready after {timeout:.0f}s"


def log_facts(text: str) -> dict:
    decode = re.findall(r"Decode batch.*", text)
    return {
        "sglang_accept_len": [float(v) for v in re.findall(r"accept len: ([0-9.]+)", text)],
        "cuda_graph_in_decode": sorted(set(re.findall(r"cuda graph: (\w+)", text))),
        "gen_throughput": [
            float(v) for v in re.findall(r"gen throughput \(token/s\): ([0-9.]+)", text)
        ],
        "decode_lines": len(decode),
        "capture_lines": re.findall(r"Capture (?:draft )?cuda graph end[^\n]*", text)[:6]
        + re.findall(r"Capture[^\n]*graph[^\n]*end[^\n]*", text)[:6],
        "load_lines": re.findall(r"Load weight end[^\n]*", text)[:3],
        "errors": re.findall(r"(?:Error|Traceback)[^\n]*", text)[:10],
    }


def run_batch(
    profiles: list[str], *, python: str, models: Path, rig: dict, logs: Path, env: dict,
    runs: int, batch_id: str, base_port: int = 30200,
) -> dict:  # fmt: skip
    logs.mkdir(parents=True, exist_ok=True)
    servers = []
    t0 = time.monotonic()
    for i, profile in enumerate(profiles):
        port = base_port + i
        path = logs / f"noise-{batch_id}-{i}-{profile}.log"
        f = path.open("w")
        cmd = server_cmd(python, models, rig, profile, port)
        proc = subprocess.Popen(
            cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
        servers.append({"profile": profile, "port": port, "base": f"http://127.0.0.1:{port}",
                        "proc": proc, "file": f, "log": path, "t0": time.monotonic(),
                        "cmd": cmd})  # fmt: skip
    log(f"batch {batch_id}: started {len(servers)} servers: {', '.join(profiles)}")
    try:
        wait_all(servers, float(os.environ.get("GPU_SMOKE_NOISE_READY_TIMEOUT", 420)))
        ready_at = time.monotonic()
        log(
            f"batch {batch_id}: ready after "
            + ", ".join(f"{s['profile']}={s.get('ready_s', s.get('error'))}" for s in servers)
        )
        time.sleep(2)  # the last server's own warm-up request settles
        for s in servers:
            if "error" in s:
                continue
            m0 = time.monotonic()
            try:
                s["runs"] = measure(s["base"], runs)
            except Exception as exc:
                s["error"] = f"measurement failed: {exc!r}"
            s["measure_s"] = round(time.monotonic() - m0, 1)
            r = s.get("runs") or []
            warm = [x["tok_s"] for x in r[2:runs]]
            if warm:
                log(
                    f"  {s['profile']}:{s['port']} tok/s {statistics.mean(warm):.1f} (CV "
                    f"{statistics.stdev(warm) / statistics.mean(warm):.2%} over {len(warm)}), "
                    f"step {statistics.mean(x['step_ms'] for x in r[2:runs]):.2f} ms, accept "
                    f"{r[-1]['accept_length']}, run1 {r[0]['tok_s']:.1f} run2 {r[1]['tok_s']:.1f}"
                )
        measured_s = time.monotonic() - ready_at
    finally:
        for s in servers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(s["proc"].pid, signal.SIGTERM)
        for s in servers:
            try:
                s["proc"].wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(s["proc"].pid, signal.SIGKILL)
            s["file"].close()
    result = {"batch": batch_id, "concurrent_start": len(servers), "wall_s": None,
              "runs_a": runs, "servers": []}  # fmt: skip
    for s in servers:
        text = s["log"].read_text("utf-8", "replace")
        result["servers"].append({
            "profile": s["profile"], "port": s["port"], "ready_s": s.get("ready_s"),
            "error": s.get("error"), "measure_s": s.get("measure_s"), "runs": s.get("runs"),
            "cmd": " ".join(s["cmd"][1:]), **log_facts(text),
        })  # fmt: skip
    result["wall_s"] = round(time.monotonic() - t0, 1)
    result["measured_s"] = round(measured_s, 1)
    return result


def bandwidth_probe() -> dict:
    """Device-to-device copy of 4 GiB, timed with CUDA events: the ceiling a decode step that
    reads its weights once can reach (bytes read + bytes written over the time)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return {"skipped": "no CUDA"}
        n = 1 << 31  # bf16 elements: 4 GiB
        a = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
        b = torch.empty_like(a)
        for _ in range(3):
            b.copy_(a)
        torch.cuda.synchronize()
        times = []
        for _ in range(10):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            b.copy_(a)
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1) / 1000)
        med = statistics.median(times)
        out = {"bytes_moved": 2 * 2 * n, "median_s": med, "gb_s": 2 * 2 * n / med / 1e9}
        del a, b
        torch.cuda.empty_cache()
        return out
    except Exception as exc:
        return {"error": repr(exc)}


# -- summary ------------------------------------------------------------------------------------


def _cv(xs: list[float]) -> float | None:
    return statistics.stdev(xs) / statistics.mean(xs) if len(xs) > 1 else None


def summarise(batches: list[dict], models_info: dict | None, runs: int) -> dict:
    by_profile: dict[str, list[dict]] = {}
    for b in batches:
        for s in b["servers"]:
            by_profile.setdefault(s["profile"], []).append(
                {**s, "batch": b["batch"], "n_a": b.get("runs_a", runs)}
            )
    out: dict[str, dict] = {}
    bytes_step = (models_info or {}).get("target_bytes_per_step")
    for profile, servers in by_profile.items():
        good = [s for s in servers if s.get("runs") and not s.get("error")]
        warm = [[r["tok_s"] for r in s["runs"][2 : s["n_a"]]] for s in good]
        means = [statistics.mean(w) for w in warm if w]
        run_cvs = [c for c in (_cv(w) for w in warm) if c is not None]
        n_runs = statistics.mean(len(w) for w in warm) if warm else 0
        spread = _cv(means)
        within = statistics.mean(c * c for c in run_cvs) / n_runs if run_cvs else 0.0
        steps = [statistics.mean(r["step_ms"] for r in s["runs"][2 : s["n_a"]]) for s in good]
        accept = [s["runs"][-1]["accept_length"] for s in good]
        first = [
            s["runs"][0]["tok_s"] / statistics.mean(w)
            for s, w in zip(good, warm, strict=False)
            if w
        ]
        second = [
            s["runs"][1]["tok_s"] / statistics.mean(w)
            for s, w in zip(good, warm, strict=False)
            if w
        ]
        noflush = [
            statistics.mean(r["tok_s"] for r in s["runs"][s["n_a"] :]) / statistics.mean(w)
            for s, w in zip(good, warm, strict=False)
            if w and s["runs"][s["n_a"] :]
        ]
        ttft_flush = [
            statistics.mean(r["ttft_s"][0] for r in s["runs"][2 : s["n_a"]]) for s in good
        ]
        ttft_noflush = [
            statistics.mean(r["ttft_s"][0] for r in s["runs"][s["n_a"] :])
            for s in good
            if s["runs"][s["n_a"] :]
        ]
        sg = [v for s in good for v in s["sglang_accept_len"]]
        entry = {
            "launches": len(good),
            "failed_launches": len(servers) - len(good),
            "runs_per_launch": n_runs,
            "launch_means_tok_s": [round(m, 2) for m in means],
            "tok_s_mean": statistics.mean(means) if means else None,
            "run_cv_per_launch": [round(c, 5) for c in run_cvs],
            "run_cv_median": statistics.median(run_cvs) if run_cvs else None,
            "run_cv_max": max(run_cvs) if run_cvs else None,
            "run_cv_rms": (statistics.mean(c * c for c in run_cvs)) ** 0.5 if run_cvs else None,
            "launch_mean_cv": spread,
            "launch_cv_beyond_runs": None
            if spread is None
            else max(0.0, spread**2 - within) ** 0.5,
            "step_ms_mean": statistics.mean(steps) if steps else None,
            "step_ms_per_launch": [round(x, 4) for x in steps],
            "accept_length": sorted({round(a, 4) for a in accept if a is not None}),
            "expected_accept_length": EXPECTED_ACCEPT.get(profile),
            "sglang_log_accept_len": sorted(set(sg)),
            "sglang_log_lines": len(sg),
            "cuda_graph_in_decode": sorted({v for s in good for v in s["cuda_graph_in_decode"]}),
            "text_all_the": all(r["text_ok"] for s in good for r in s["runs"]),
            "run1_over_warm": [round(x, 4) for x in first],
            "run2_over_warm": [round(x, 4) for x in second],
            "noflush_over_flush": [round(x, 4) for x in noflush],
            "ttft_ms_flush": statistics.mean(ttft_flush) * 1000 if ttft_flush else None,
            "ttft_ms_noflush": statistics.mean(ttft_noflush) * 1000 if ttft_noflush else None,
            "ready_s": [s["ready_s"] for s in servers],
            "batches": sorted({s["batch"] for s in servers}),
        }
        if profile == "noise-nospec" and bytes_step and steps:
            entry["bytes_per_step"] = bytes_step
            entry["achieved_gb_s"] = bytes_step / (statistics.mean(steps) / 1000) / 1e9
        out[profile] = entry
    base = (out.get("noise-nospec") or {}).get("tok_s_mean")
    for profile, entry in out.items():
        if base and entry["tok_s_mean"] and profile != "noise-nospec":
            entry["speedup_vs_nospec"] = entry["tok_s_mean"] / base
    return out


def table(summary: dict, probe: dict | None) -> list[str]:
    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:.2%}"

    lines = [
        "",
        "## noise: GPU-bound 8B-shaped rig, CUDA graphs on (launches started together, "
        "measured one at a time)",
        "",
        "| profile | launches | tok/s (mean of launch means) | run CV (median, max) | "
        "launch-mean CV | step ms | accept len (client; SGLang log) | speed-up | run 1, run 2 / "
        "warm | no flush / flush |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for profile in (*MAIN, *HEADS):
        e = summary.get(profile)
        if not e:
            continue

        def rng(xs: list[float]) -> str:
            return f"{min(xs):.3f}-{max(xs):.3f}" if xs else "-"

        tok = "-" if e["tok_s_mean"] is None else f"{e['tok_s_mean']:.1f}"
        step = "-" if e["step_ms_mean"] is None else f"{e['step_ms_mean']:.2f}"
        sp = e.get("speedup_vs_nospec")
        lines.append(
            f"| {profile} | {e['launches']} (+{e['failed_launches']} failed) | {tok} | "
            f"{pct(e['run_cv_median'])}, {pct(e['run_cv_max'])} | {pct(e['launch_mean_cv'])} | "
            f"{step} | {e['accept_length'] or '-'}; {e['sglang_log_accept_len'] or '-'} "
            f"({e['sglang_log_lines']} lines) | {'-' if sp is None else f'{sp:.2f}x'} | "
            f"{rng(e['run1_over_warm'])}, {rng(e['run2_over_warm'])} | "
            f"{rng(e['noflush_over_flush'])} |"
        )
    ns = summary.get("noise-nospec") or {}
    if ns.get("achieved_gb_s"):
        lines.append(
            f"- GPU-bound: no-speculation decode step {ns['step_ms_mean']:.2f} ms reads "
            f"{ns['bytes_per_step'] / 1e9:.2f} GB of weights = {ns['achieved_gb_s']:.0f} GB/s"
            + (
                f", against a device-to-device copy of {probe['gb_s']:.0f} GB/s "
                f"({ns['achieved_gb_s'] / probe['gb_s']:.0%})"
                if probe and probe.get("gb_s")
                else ""
            )
        )
    graphs = sorted({v for e in summary.values() for v in e["cuda_graph_in_decode"]})
    lines.append(f"- SGLang's `Decode batch` lines say `cuda graph: {', '.join(graphs) or '-'}`")
    return lines


def main() -> int:  # python3 noise.py RESULTS_DIR: print the summary of the batches there
    d = Path(sys.argv[1])
    batches = [json.loads(p.read_text()) for p in sorted(d.glob("noise-b*.json"))]
    s = summarise(batches, None, int(os.environ.get("GPU_SMOKE_NOISE_RUNS", 10)))
    print("\n".join(table(s, None)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
