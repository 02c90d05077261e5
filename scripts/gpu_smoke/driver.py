#!/usr/bin/env python3
"""The phases of scripts/gpu-smoke after installation: record, check, attach, launches, table.

    python3 scripts/gpu_smoke/driver.py PHASE [PHASE ...]

Run by scripts/gpu-smoke (which installs the wheels and the plugin and builds the models first).
State lives in $GPU_SMOKE_STATE (default /tmp/gpu-smoke): the models, the generated suite, the
baselines, one results/*.json per phase. What is worth keeping goes to $OUT (default
$GPU_SMOKE_STATE/out): gpu-smoke-table.md, gpu-smoke-results.json, gpu-smoke-logs.tar.gz.

Environment knobs:
  GPU_SMOKE_FIXED_PORTS=1      give the three suite profiles fixed ports (30001-30003) instead
                               of the plugin's own choice (SGLang 0.5.15 refuses ports > 55535)
  GPU_SMOKE_LAUNCHES=10        launches in the launch phase; GPU_SMOKE_CONCURRENCY=5 at a time
  GPU_SMOKE_BASELINE_RUNS=10   runs recorded per baseline
  GPU_SMOKE_ATTACH_PORT=30100  the hand-started server of the attach phase
  GPU_SMOKE_SPREAD_LAUNCHES=3, GPU_SMOKE_SPREAD_RUNS=8
                               baseline launches and runs per launch of the spread phases
  GPU_SMOKE_SPREAD_BASELINES   an earlier call's baselines-spread.tar.gz (a fresh machine)
  GPU_SMOKE_SPREAD_K           a -k expression for the spread-check phase
  GPU_SMOKE_RIG=llama8b        the models: llama8b (8B-shaped, GPU-bound) or tiny
  GPU_SMOKE_NOISE_LAUNCHES=8, GPU_SMOKE_NOISE_BATCH=6, GPU_SMOKE_NOISE_RUNS=10
                               the noise phase: launches per main profile, servers started
                               together, runs of block A per server (noise.py)
  GPU_SMOKE_BASELINE_LAUNCHES=2
                               launches per recorded baseline (--specdecode-baseline-launches)
  GPU_SMOKE_DEADLINE           seconds since the epoch: no profile of record/check, no attach
                               and no noise batch starts that would end after it (a 10-minute
                               call); an unfinished phase exits 3, and the same command run
                               again goes on where it stopped (the state directory carries over)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
STATE = Path(os.environ.get("GPU_SMOKE_STATE", "/tmp/gpu-smoke"))
OUT = Path(os.environ.get("OUT") or STATE / "out")
MODELS = STATE / "models"
SUITE = STATE / "suite"
RESULTS = STATE / "results"
LOGS = STATE / "logs"
PROFILES = ("smoke-nospec", "smoke-eagle3-match", "smoke-eagle3-miss")
EXPECTED_ACCEPT = {"smoke-eagle3-match": 3.0, "smoke-eagle3-miss": 1.0}
CONTRACT_NOISE = HERE.parents[1] / "tests" / "contract" / "data" / "h200_noise.json"
SERVER_ENV = {  # every launch: the plugin's env set carries the last three; SGLang sets the first
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "HF_HUB_OFFLINE": "1",
}
DRY_RUN = os.environ.get("GPU_SMOKE_DRY_RUN") == "1"
# The rig: "llama8b" (Llama-3.1-8B's shape and size, built on the GPU, GPU-bound with CUDA
# graphs on) or "tiny" (the 4-layer model of 2026-12-01/02, host-bound; the dry run's folders).
RIG_NAME = os.environ.get("GPU_SMOKE_RIG") or ("tiny" if DRY_RUN else "llama8b")
RIG = {
    "tiny": {"target": "tiny-llama", "prefix": "tiny"},
    "llama8b": {"target": "llama8b", "prefix": "llama8b"},
}[RIG_NAME]
# CUDA graphs on for the target and the draft (decode batch sizes up to 4: the workloads send
# one request at a time); triton attention (no FlashAttention-3 library on the image), no
# grammar backend (no xgrammar).
SGLANG_FLAGS = [
    "--attention-backend",
    "triton",
    "--grammar-backend",
    "none",
    "--cuda-graph-max-bs",
    "4",
]
LAUNCH_PROFILE = """
# The launch phase: several of these start at once on the one GPU, each pytest session with its
# own state directory, each server on a port the plugin picks. KV cache capped so that they fit
# together (SGLang sizes it from the memory free at its start).
[profiles.smoke-launch]
description = "tiny Llama + agreeing EAGLE3 head, small KV cache, for concurrent launches"
model_path = "@TARGET@"
mem_fraction_static = 0.9
extra_args = [
    "--attention-backend", "triton", "--grammar-backend", "none", "--cuda-graph-max-bs", "4",
    "--max-total-tokens", "16384", "--max-running-requests", "8", "--chunked-prefill-size", "4096",
]
[profiles.smoke-launch.speculative]
algorithm = "EAGLE3"
draft_model_path = "@DRAFTS@-match"
num_steps = 2
eagle_topk = 1
num_draft_tokens = 3
"""
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


def log(msg: str) -> None:
    print(f"gpu-smoke: {msg}", flush=True)


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


# -- the suite ---------------------------------------------------------------------------------


def write_suite() -> None:
    SUITE.mkdir(parents=True, exist_ok=True)
    fixed = os.environ.get("GPU_SMOKE_FIXED_PORTS") == "1"
    text = (HERE / "suite" / "specdecode.toml.in").read_text()
    for i, key in enumerate(("NOSPEC", "MATCH", "MISS")):
        text = text.replace(f"@PORT_{key}@", f"port = {30001 + i}" if fixed else "")
    text = text.replace("@MEM@", os.environ.get("GPU_SMOKE_MEM_FRACTION", "0.5"))
    text += LAUNCH_PROFILE + SPREAD_PROFILES
    text = text.replace("@TARGET@", str(MODELS / RIG["target"]))
    text = text.replace("@DRAFTS@", str(MODELS / f"{RIG['prefix']}-eagle3"))
    (SUITE / "specdecode.toml").write_text(text)
    for name in ("test_gpu_smoke.py", "test_launch.py", "test_spread.py"):
        shutil.copy(HERE / "suite" / name, SUITE / name)
    # the suite's own ini: none of the repository's settings (filterwarnings = error, testpaths)
    cv, source = baseline_cv_limit()
    (SUITE / "pytest.ini").write_text(
        "[pytest]\naddopts = -ra -p no:cacheprovider\nspecdecode_config = specdecode.toml\n"
        f"# the noise guard, from the measured noise: {source}\n"
        f"specdecode_max_baseline_cv = {cv:.4f}\n"
    )


def baseline_cv_limit() -> tuple[float, str]:
    """The suite's noise guard (max tok/s CV of a baseline's runs), from the rig's measured run
    noise: 3x the largest run CV seen in one launch of any profile, at least 2%. Measured on
    this machine (the noise phase's results) if there are any, else the H200 figures kept in
    tests/contract/data/h200_noise.json, else the plugin's default 8%."""
    worst = None
    source = ""
    if any(RESULTS.glob("noise-b*.json")):
        summary = noise_summary(load_results([RESULTS]))
        cvs = [e["run_cv_max"] for e in summary.values() if e.get("run_cv_max") is not None]
        if cvs:
            worst, source = max(cvs), f"largest run CV {max(cvs):.2%} measured here"
    if worst is None and CONTRACT_NOISE.exists() and RIG_NAME == "llama8b":
        data = json.loads(CONTRACT_NOISE.read_text())
        worst = data.get("largest_run_cv")
        source = f"largest run CV {worst:.2%} in {CONTRACT_NOISE.name}" if worst else ""
    if worst is None:
        return 0.08, "no measurement: the plugin's default"
    return max(0.02, 3 * worst), f"3 x {source}, at least 2%"


def plugin_args() -> list[str]:
    names = {ep.name for ep in metadata.entry_points(group="pytest11")}
    return [] if "specdecode" in names else ["-p", "pytest_specdecode.plugin"]


def run_pytest(
    tag: str, args: list[str], *, timeout: float = 1500, env: dict[str, str] | None = None
) -> tuple[int, str, float]:
    """pytest in the suite directory; its output to the console and logs/<tag>.txt."""
    LOGS.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *plugin_args(),
        "--specdecode-target",
        "real",
        "--specdecode-config",
        str(SUITE / "specdecode.toml"),
        *args,
    ]
    if os.environ.get("GPU_SMOKE_SKIP_PREFLIGHT") == "1":
        cmd.append("--specdecode-skip-preflight")
    log(f"[{tag}] $ {' '.join(cmd)}")
    env = dict(os.environ, **SERVER_ENV, **(env or {}))
    start = time.monotonic()
    with (LOGS / f"{tag}.txt").open("w") as f:
        proc = subprocess.Popen(
            cmd, cwd=SUITE, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            f.write(line)
            if tag.startswith(("record", "check", "attach", "spread")):
                sys.stdout.write(line)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = -9
    return rc, "".join(lines), time.monotonic() - start


def sglang_accept_lens(basetemp: Path) -> dict[str, list[float]]:
    """SGLang's own 'accept len' per profile, from the server logs the plugin wrote."""
    found: dict[str, list[float]] = {}
    for path in sorted(basetemp.rglob("*.log")):
        profile = next((p for p in (*PROFILES, "smoke-launch") if path.name.startswith(p)), None)
        if profile is None:
            continue
        values = [
            float(v)
            for v in re.findall(r"accept len: ([0-9.]+)", path.read_text("utf-8", "replace"))
        ]
        found.setdefault(profile, []).extend(values)
    return found


def report_rows(report: Path) -> dict[str, dict]:
    rows: dict[str, dict] = {}
    if not report.exists():
        return rows
    data = json.loads(report.read_text())
    for t in data.get("tests", []):
        summary = t.get("summary") or {}

        def mean(metric: str, summary: dict = summary) -> float | None:
            m = summary.get(metric) or {}
            return m.get("mean")

        rows[t.get("profile", "?")] = {
            "test": t.get("test_id"),
            "outcome": t.get("outcome"),
            "tok_s": mean("tok_s"),
            "tok_s_cv": (summary.get("tok_s") or {}).get("cv"),
            "accept_length": mean("accept_length"),
            "runs": (summary.get("tok_s") or {}).get("n"),
            "message": (t.get("message") or "")[:400],
        }
    return rows


def save(phase: str, result: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{phase}.json").write_text(json.dumps(result, indent=2) + "\n")


def ready_times(output: str) -> list[float]:
    return [float(v) for v in re.findall(r"ready after ([0-9.]+)s", output)]


# -- phases ------------------------------------------------------------------------------------


PROFILE_TESTS = {
    "smoke-nospec": "test_nospec",
    "smoke-eagle3-match": "test_eagle3_match",
    "smoke-eagle3-miss": "test_eagle3_miss",
}
INCOMPLETE = 3  # a phase that stopped at the call's deadline: run the same command again


def deadline() -> float:
    return float(os.environ.get("GPU_SMOKE_DEADLINE", "inf"))


def baseline_launches() -> int:
    # 2, not the plugin's 3 for a real server: the rig's launch means spread 0.8-1.6% (CV over
    # 8-10 launches, tests/contract/data/h200_noise.json) against the suite's -25% margins, and
    # a third launch per profile (load + CUDA-graph capture) does not fit the 10-minute calls.
    return env_int("GPU_SMOKE_BASELINE_LAUNCHES", 2)


def launch_seconds() -> float:
    """A launch's cost as seen so far on this machine: the slowest profile of the suite's
    phases, its pytest session's wall time per launch (start-up, preflight, load, warm-up,
    runs). The first launch on a fresh machine compiles triton kernels (130-160 s on the H200),
    hence the default; the dry run's simulated server is ready in seconds."""
    seen = [
        r["wall_s"] / len(r["ready_s"])
        for path in RESULTS.glob("*.json")
        if path.name.startswith(("record-", "check-")) and not path.name.endswith("report.json")
        for r in [json.loads(path.read_text())]
        if r.get("ready_s")
    ]
    return max(seen) if seen else 60.0 if DRY_RUN else 210.0


def suite_profile_done(phase: str, profile: str) -> bool:
    path = RESULTS / f"{phase}-{profile}.json"
    return path.exists() and json.loads(path.read_text()).get("rc") == 0


def phase_suite(phase: str) -> int:
    """record (with --update-baselines) or check, one pytest session per profile, so that a
    call that runs out of time keeps the profiles it finished and the next call (same
    GPU_SMOKE_STATE) goes on with the rest. No profile starts that would end after
    GPU_SMOKE_DEADLINE; the phase then returns INCOMPLETE."""
    launches = baseline_launches() if phase == "record" else 1
    for profile, test in PROFILE_TESTS.items():
        if suite_profile_done(phase, profile):
            log(f"[{phase}] {profile}: done in an earlier call")
            continue
        need = launches * launch_seconds()
        left = deadline() - time.time()
        if need > left:
            log(
                f"[{phase}] {profile} left for the next call: it needs about {need:.0f}s "
                f"({launches} launch(es)), {left:.0f}s are left before GPU_SMOKE_DEADLINE"
            )
            merge_suite_results(phase)
            return INCOMPLETE
        suite_profile(phase, profile, test, launches)
    return merge_suite_results(phase)


def suite_profile(phase: str, profile: str, test: str, launches: int) -> None:
    tag = f"{phase}-{profile}"
    basetemp = STATE / f"pt-{tag}"
    report = RESULTS / f"{tag}-report.json"
    RESULTS.mkdir(parents=True, exist_ok=True)
    args = [
        "test_gpu_smoke.py",
        "-k",
        test,
        "--basetemp",
        str(basetemp),
        "--specdecode-baselines",
        str(STATE / "baselines"),
        "--specdecode-state-dir",
        str(STATE / "state-suite"),
        "--specdecode-report",
        str(report),
        "--specdecode-markdown",
        str(RESULTS / f"{tag}-summary.md"),
    ]
    if phase == "record":
        args += [
            "--update-baselines",
            "--specdecode-baseline-runs",
            str(env_int("GPU_SMOKE_BASELINE_RUNS", 10)),
            "--specdecode-baseline-launches",
            str(launches),
        ]
    rc, output, wall = run_pytest(tag, args)
    save(
        tag,
        {
            "rc": rc,
            "wall_s": round(wall, 1),
            "rows": report_rows(report),
            "sglang_accept_len": sglang_accept_lens(basetemp),
            "ready_s": ready_times(output),
            "launch_failures": len(re.findall(r"exited with code", output)),
            "baseline_launches": launches if phase == "record" else None,
        },
    )


def merge_suite_results(phase: str) -> int:
    """The phase's results/<phase>.json from its profiles' files (what the table reads)."""
    parts = [
        json.loads((RESULTS / f"{phase}-{p}.json").read_text())
        for p in PROFILE_TESTS
        if (RESULTS / f"{phase}-{p}.json").exists()
    ]
    merged: dict = {
        "rc": max((r["rc"] for r in parts), default=INCOMPLETE),
        "wall_s": round(sum(r["wall_s"] for r in parts), 1),
        "rows": {k: v for r in parts for k, v in r["rows"].items()},
        "sglang_accept_len": {k: v for r in parts for k, v in r["sglang_accept_len"].items()},
        "ready_s": [t for r in parts for t in r["ready_s"]],
        "launch_failures": sum(r["launch_failures"] for r in parts),
        "profiles_done": len(parts),
    }
    if len(parts) < len(PROFILE_TESTS) and merged["rc"] == 0:
        merged["rc"] = INCOMPLETE
    save(phase, merged)
    return int(merged["rc"])


def wait_ready(url: str, proc: subprocess.Popen, timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health_generate", timeout=5) as r:
                if r.status == 200:
                    return time.monotonic() - start
        except Exception:
            pass
        time.sleep(1)
    raise RuntimeError(f"not ready after {timeout}s")


def phase_attach() -> int:
    done = RESULTS / "attach.json"
    if done.exists() and json.loads(done.read_text()).get("passed"):
        log("[attach] done in an earlier call")
        return 0
    need, left = launch_seconds() + 120, deadline() - time.time()
    if need > left:
        log(f"[attach] left for the next call: it needs about {need:.0f}s, {left:.0f}s are left")
        return INCOMPLETE
    port = env_int("GPU_SMOKE_ATTACH_PORT", 30100)
    LOGS.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(MODELS / RIG["target"]),
        "--tp-size",
        "1",
        "--mem-fraction-static",
        os.environ.get("GPU_SMOKE_MEM_FRACTION", "0.5"),
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        str(MODELS / f"{RIG['prefix']}-eagle3-match"),
        "--speculative-num-steps",
        "2",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "3",
        *SGLANG_FLAGS,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enable-metrics",
    ]
    log(f"[attach] starting by hand: {' '.join(cmd)}")
    env = dict(os.environ, **SERVER_ENV, CUDA_VISIBLE_DEVICES="0")
    server_log = (LOGS / "attach-server.log").open("w")
    proc = subprocess.Popen(
        cmd, env=env, stdout=server_log, stderr=subprocess.STDOUT, start_new_session=True
    )
    result: dict = {"port": port}
    try:
        result["ready_s"] = round(wait_ready(f"http://127.0.0.1:{port}", proc, 600), 1)
        log(f"[attach] server ready after {result['ready_s']}s")
        common = [
            "test_gpu_smoke.py",
            "-k",
            "test_eagle3_match",
            f"--server-host=127.0.0.1:{port}",
            "--specdecode-baselines",
            str(STATE / "baselines-attach"),
            "--specdecode-state-dir",
            str(STATE / "state-attach"),
        ]
        rc1, _, _ = run_pytest(
            "attach-record",
            [
                *common,
                "--update-baselines",
                "--specdecode-report",
                str(RESULTS / "attach-record-report.json"),
            ],
        )
        rc2, _, _ = run_pytest(
            "attach-check",
            [*common, "--specdecode-report", str(RESULTS / "attach-check-report.json")],
        )
        result.update(
            record_rc=rc1, check_rc=rc2, rows=report_rows(RESULTS / "attach-check-report.json")
        )
    except RuntimeError as exc:
        result["error"] = str(exc)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        server_log.close()
    log_text = (LOGS / "attach-server.log").read_text("utf-8", "replace")
    result["sglang_accept_len"] = [float(v) for v in re.findall(r"accept len: ([0-9.]+)", log_text)]
    result["passed"] = result.get("record_rc") == 0 and result.get("check_rc") == 0
    save("attach", result)
    return 0 if result["passed"] else 1


def one_launch(i: int) -> dict:
    d = STATE / f"launch-{i:02d}"
    shutil.rmtree(d, ignore_errors=True)
    rc, output, wall = run_pytest(
        f"launch-{i:02d}",
        [
            "test_launch.py",
            "--basetemp",
            str(d / "pt"),
            "--specdecode-state-dir",
            str(d / "state"),
        ],
        timeout=900,
    )
    port = re.search(r"on http://[0-9.]+:(\d+)", output)
    ready = ready_times(output)
    res = {
        "launch": i,
        "rc": rc,
        "wall_s": round(wall, 1),
        "port": int(port.group(1)) if port else None,
        "ready_s": ready[0] if ready else None,
    }
    if rc != 0:
        tail = [line for line in output.splitlines() if line.strip()][-25:]
        res["tail"] = tail
    log(f"[launch {i}] rc={rc} port={res['port']} ready={res['ready_s']}s wall={res['wall_s']}s")
    return res


def phase_launches() -> int:
    n = env_int("GPU_SMOKE_LAUNCHES", 10)
    conc = env_int("GPU_SMOKE_CONCURRENCY", 5)
    log(f"[launches] {n} launches through the plugin, {conc} at a time, ports chosen by it")
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=conc) as pool:
        results = list(pool.map(one_launch, range(n)))
    failures = [r for r in results if r["rc"] != 0]
    save(
        "launches",
        {
            "launches": results,
            "count": n,
            "concurrency": conc,
            "failures": len(failures),
            "wall_s": round(time.monotonic() - start, 1),
        },
    )
    return 1 if failures else 0


# -- noise: run and launch noise of the GPU-bound rig --------------------------------------------


def noise_mod():
    sys.path.insert(0, str(HERE))
    import noise  # scripts/gpu_smoke/noise.py

    return noise


def noise_summary(res: dict) -> dict:
    nz = noise_mod()
    info = res.get("models_info") or {}
    return nz.summarise(res.get("noise_batches", []), info, env_int("GPU_SMOKE_NOISE_RUNS", 10))


def machine_facts() -> dict:
    """GPU, driver, versions: what the noise figures were measured with."""
    facts: dict = {}
    with contextlib.suppress(Exception):
        facts["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.sm",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=30,
        ).stdout.strip()  # fmt: skip
    for dist in ("sglang", "sglang-kernel", "flashinfer-python", "torch", "triton",
                 "transformers", "pytest-specdecode"):  # fmt: skip
        with contextlib.suppress(Exception):
            facts[dist] = metadata.version(dist)
    facts["python"] = sys.version.split()[0]
    with contextlib.suppress(Exception):
        facts["cpus"] = os.cpu_count()
    return facts


def contract_noise(res: dict) -> dict | None:
    """tests/contract/data/h200_noise.json: the noise figures as contract data."""
    summary = res.get("noise")
    if not summary:
        return None
    nz = noise_mod()
    probe = res.get("noise_probe") or {}
    main = {p: summary[p] for p in nz.MAIN if p in summary}
    run_cvs = [c for e in main.values() for c in e["run_cv_per_launch"]]
    return {
        "what": "run-to-run and launch-to-launch noise of a GPU-bound SGLang server "
        "(scripts/gpu-smoke noise phase), measured on one H200, TP 1",
        "machine": probe.get("machine"),
        "copy_bandwidth_gb_s": probe.get("gb_s"),
        "rig": {
            k: (res.get("models_info") or {}).get(k)
            for k in (
                "shape",
                "target_params",
                "target_bytes_per_step",
                "draft_params",
                "built_s",
                "written_s",
            )
        },
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


def phase_noise() -> int:
    """Batches of servers started together, measured one at a time (noise.py), until every
    main profile has GPU_SMOKE_NOISE_LAUNCHES launches here or the call's time is nearly up
    (GPU_SMOKE_DEADLINE: seconds since the epoch by which the phase must be done)."""
    nz = noise_mod()
    RESULTS.mkdir(parents=True, exist_ok=True)
    probe_path = RESULTS / "noise-probe.json"
    if not probe_path.exists():
        probe = nz.bandwidth_probe()
        probe["machine"] = machine_facts()
        probe_path.write_text(json.dumps(probe, indent=2) + "\n")
        log(f"[noise] device-to-device copy: {probe}")
    want = env_int("GPU_SMOKE_NOISE_LAUNCHES", 8)
    per_batch = env_int("GPU_SMOKE_NOISE_BATCH", 6)
    runs = env_int("GPU_SMOKE_NOISE_RUNS", 10)
    deadline = float(os.environ.get("GPU_SMOKE_DEADLINE", "inf"))
    python = sys.executable
    env = dict(os.environ, **SERVER_ENV, CUDA_VISIBLE_DEVICES="0")
    rc = 0
    last = float(os.environ.get("GPU_SMOKE_NOISE_BATCH_S", 200))
    while True:
        done = dict.fromkeys((*nz.MAIN, *nz.HEADS), 0)
        failed_n = dict.fromkeys(done, 0)
        for path in RESULTS.glob("noise-b*.json"):
            for srv in json.loads(path.read_text())["servers"]:
                if srv.get("runs") and not srv.get("error"):
                    done[srv["profile"]] += 1
                else:
                    failed_n[srv["profile"]] += 1
        for p, n in failed_n.items():  # a profile that failed twice is not tried again
            if n >= 2 and done[p] == 0:
                done[p] = want
                log(f"[noise] {p} failed {n} times: not launched again")
        if min(done[p] for p in nz.MAIN) >= want and min(done[p] for p in nz.HEADS) >= 1:
            break
        if min(done[p] for p in nz.MAIN) >= min(2, want) and min(done[p] for p in nz.HEADS) < 1:
            batch = list(nz.HEADS)  # the heads' exact accept lengths, once
        else:
            need = sorted(nz.MAIN, key=lambda p: done[p])
            batch = [need[i % len(need)] for i in range(per_batch)]
        left = deadline - time.time()
        if left < last * 1.1:
            log(f"[noise] {left:.0f}s left, a batch took {last:.0f}s: stopping; launches {done}")
            rc = rc or INCOMPLETE  # the next call goes on with the launches still missing
            break
        batch_id = time.strftime("%Y%m%d-%H%M%S")
        result = nz.run_batch(
            batch, python=python, models=MODELS, rig=RIG, logs=LOGS, env=env, runs=runs,
            batch_id=batch_id,
        )  # fmt: skip
        last = max(result["wall_s"], 60.0) if len(batch) == per_batch else last
        (RESULTS / f"noise-b{batch_id}.json").write_text(json.dumps(result, indent=2) + "\n")
        failed = [s for s in result["servers"] if s.get("error")]
        if failed:
            rc = 1
            for s in failed:
                log(f"[noise] {s['profile']}: {s['error']}; {s['errors'][:3]}")
        pack_logs()
        phase_table([])  # what is there so far reaches $OUT even if the call is cut short
        if len(failed) == len(result["servers"]):
            break
    return rc


# -- spread: launches against runs, and where NCCL settings go --------------------------------


def env_dumps(directory: Path) -> dict[str, dict]:
    """profile -> what its servers' processes had: the variables by process, and the verdict
    on them (every process has exactly the profile's NCCL values; none from the shell)."""
    out: dict[str, dict] = {}
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


def launch_spread(baselines: Path) -> dict[str, dict]:
    """profile -> tok/s per launch of its baseline: mean and run CV of each launch, and the
    launch-to-launch CV of the launch means (corrected for their own run noise)."""
    out: dict[str, dict] = {}
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
    basetemp = STATE / f"pt-{phase}"
    report = RESULTS / f"{phase}-report.json"
    dump = STATE / f"env-{phase}"
    shutil.rmtree(dump, ignore_errors=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    args = [
        "test_spread.py",
        "--basetemp", str(basetemp),
        "--specdecode-baselines", str(STATE / "baselines-spread"),
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
        ]  # fmt: skip
        env["PYTEST_SPECDECODE_MAX_BASELINE_CV"] = "0.25"
    else:
        carried = os.environ.get("GPU_SMOKE_SPREAD_BASELINES")
        if carried and not (STATE / "baselines-spread").exists():
            # a fresh machine: the baselines an earlier call recorded (its
            # baselines-spread.tar.gz), carried in the checkout
            shutil.unpack_archive(carried, STATE)
    if phase == "spread-record":
        args += ["-k", "not test_nccl_debug"]  # nothing to record there
    elif phase == "spread-check" and os.environ.get("GPU_SMOKE_SPREAD_K"):
        args += ["-k", os.environ["GPU_SMOKE_SPREAD_K"]]
    if phase == "spread-swap":
        # the plain test on the NCCL-tuned server: its baseline was recorded without tuning
        env["GPU_SMOKE_SPREAD_SWAP"] = "1"
        args += ["-k", "test_plain"]
    rc, output, wall = run_pytest(phase, [*args, "-rA"], env=env)
    save(
        phase,
        {
            "rc": rc,
            "wall_s": round(wall, 1),
            "rows": report_rows_by_test(report),
            "ready_s": ready_times(output),
            "launch_failures": len(re.findall(r"exited with code", output)),
            "environments": env_dumps(dump),
            "spread": launch_spread(STATE / "baselines-spread"),
        },
    )
    if phase == "spread-record" and (STATE / "baselines-spread").exists():
        OUT.mkdir(parents=True, exist_ok=True)  # one file: $OUT brings back 2 folders deep only
        shutil.make_archive(str(OUT / "baselines-spread"), "gztar", STATE, "baselines-spread")
    return rc


CHECK_KEYS = ("metric", "reference", "verdict", "ratio", "ci_low", "ci_high", "launches",
              "launch_cv", "problem")  # fmt: skip


def check_text(c: dict) -> str:
    text = f"{c['metric']} vs {c['reference'] or 'own'}: {c['verdict'] or c['problem']}"
    if c.get("ratio"):
        text += f" {c['ratio']:.3f} [{c['ci_low']:.3f}, {c['ci_high']:.3f}]"
    if c.get("launch_cv") is not None:
        text += f", {c['launches']} launches, launch CV {c['launch_cv']:.1%}"
    return text


def report_rows_by_test(report: Path) -> dict[str, dict]:
    rows: dict[str, dict] = {}
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


def spread_table(res: dict[str, dict]) -> list[str]:
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


# -- the table ---------------------------------------------------------------------------------


def fmt(v: object, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec) if isinstance(v, (int, float)) else str(v)


def sglang_summary(values: list[float]) -> str:
    if not values:
        return "-"
    distinct = sorted(set(values))
    if len(distinct) == 1:
        return f"{distinct[0]:.2f} (all {len(values)} log lines)"
    mean = statistics.mean(values)
    return f"{mean:.2f} (lines {distinct[0]:.2f}-{distinct[-1]:.2f}, n={len(values)})"


def load_results(dirs: list[Path]) -> dict[str, dict]:
    res: dict = {"noise_batches": []}
    seen: set[str] = set()

    def add_batches(batches: list[dict]) -> None:
        for b in batches:
            if b["batch"] not in seen:
                seen.add(b["batch"])
                res["noise_batches"].append(b)

    for d in dirs:
        add_batches([json.loads(p.read_text()) for p in sorted(d.glob("noise-b*.json"))])
        for name in ("noise-probe", f"models-{RIG['prefix']}"):
            p = d / f"{name}.json"
            if p.exists():
                res.setdefault("noise_probe" if name == "noise-probe" else "models_info",
                               json.loads(p.read_text()))  # fmt: skip
        for name in (
            *("record", "check", "attach", "launches"),
            *("spread-record", "spread-check", "spread-swap"),
        ):
            p = d / f"{name}.json"
            if p.exists():
                res[name] = json.loads(p.read_text())
        p = d / "gpu-smoke-results.json"
        if p.exists():
            for k, v in json.loads(p.read_text()).items():
                if k == "noise_batches":
                    add_batches(v)
                else:
                    res.setdefault(k, v)
    if "models_info" not in res and (MODELS / f"models-{RIG['prefix']}.json").exists():
        res["models_info"] = json.loads((MODELS / f"models-{RIG['prefix']}.json").read_text())
    res["noise_batches"].sort(key=lambda b: b["batch"])
    if res["noise_batches"]:
        res["noise"] = noise_summary(res)
    return res


def table(res: dict[str, dict]) -> str:
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
    out = ["## gpu-smoke", "", *lines, ""]
    for name in ("record", "check"):
        if name in res:
            r = res[name]
            out.append(
                f"- {name}: pytest exit {r['rc']}, {r['wall_s']} s, servers ready after "
                f"{', '.join(f'{t:.1f}' for t in r['ready_s']) or '-'} s, launch failures "
                f"{r['launch_failures']}"
            )
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
    out += spread_table(res)
    if res.get("noise"):
        out += noise_mod().table(res["noise"], res.get("noise_probe"))
    return "\n".join(out) + "\n"


def phase_table(dirs: list[Path]) -> int:
    res = load_results(dirs or [RESULTS])
    text = table(res)
    print(text)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "gpu-smoke-table.md").write_text(text)
    (OUT / "gpu-smoke-results.json").write_text(json.dumps(res, indent=2) + "\n")
    contract = contract_noise(res)
    if contract:
        (OUT / "h200_noise.json").write_text(json.dumps(contract, indent=2) + "\n")
    return 0


def pack_logs() -> None:
    """Logs of every phase and every server, one tarball in $OUT."""
    OUT.mkdir(parents=True, exist_ok=True)
    with tarfile.open(OUT / "gpu-smoke-logs.tar.gz", "w:gz") as tar:
        shapes = sorted(MODELS.glob("models-*.json"))
        for path in [LOGS, RESULTS, SUITE, MODELS / "models.json", *shapes]:
            if path.exists():
                tar.add(path, arcname=path.relative_to(STATE).as_posix())
        for path in sorted(STATE.glob("pt-*/**/*.log")) + sorted(
            STATE.glob("launch-*/pt/**/*.log")
        ):
            tar.add(
                path, arcname="server-logs/" + path.relative_to(STATE).as_posix().replace("/", "__")
            )


def main(argv: list[str]) -> int:
    phases = argv or ["record", "check", "attach", "noise", "table"]
    if phases[0] == "table":  # scripts/gpu-smoke table [RESULT DIRS...]: no GPU needed
        return phase_table([Path(p) for p in phases[1:]])
    write_suite()
    rc = 0
    for phase in phases:
        t0 = time.monotonic()
        if phase == "check" and merge_suite_results("record") != 0:
            # record unfinished, or run on another machine: its missing profiles first
            log("check: the record phase has profiles left on this machine: recording first")
            code = phase_suite("record")
            if code != 0:
                rc = rc or code
                break
        if phase in ("record", "check"):
            code = phase_suite(phase)
        elif phase == "attach":
            code = phase_attach()
        elif phase == "launches":
            code = phase_launches()
        elif phase == "noise":
            code = phase_noise()
        elif phase in ("spread-record", "spread-check", "spread-swap"):
            code = phase_spread(phase)
        elif phase == "table":
            code = phase_table([])
        else:
            log(
                f"unknown phase {phase!r}: choose record, check, attach, launches, noise, "
                "spread-record, spread-check, spread-swap, table"
            )
            return 2
        log(f"phase {phase}: exit {code} after {time.monotonic() - t0:.0f}s")
        rc = rc or code
        if code == INCOMPLETE:
            break
    pack_logs()
    if "table" not in phases or rc == INCOMPLETE:
        phase_table([])
    if rc == INCOMPLETE:
        log(
            "not finished before GPU_SMOKE_DEADLINE: run the same command again with a new "
            f"deadline (the state in {STATE} carries over; done profiles and phases are kept)"
        )
    elif rc == 0:
        log(f"all phases done: {' '.join(phases)}")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
