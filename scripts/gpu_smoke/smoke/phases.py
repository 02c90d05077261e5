"""The phases that use the GPU: record, check, attach, launches, the noise batches, the probe.

Each phase is made of units (a profile of record or check, the attach, a noise batch, the
probe); a unit starts only when its estimated cost (budget.py) fits before GPU_SMOKE_DEADLINE,
and after each one the caller carries the state out (state.py), so that a call cut short loses
at most the unit in flight.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from smoke import budget
from smoke.common import (
    BASELINES,
    DRY_RUN,
    HERE,
    INCOMPLETE,
    MODELS,
    PROFILE_TESTS,
    RIG,
    SERVER_ENV,
    SGLANG_FLAGS,
    STATE,
    baseline_launches,
    boot_id,
    card,
    card_dir,
    env_int,
    load,
    log,
    logs_dir,
    preflight_times,
    ready_times,
    report_rows,
    results_dir,
    run_pytest,
    save,
    seconds_left,
    sglang_accept_lens,
)  # fmt: skip

Checkpoint = Callable[[], None]  # carries the state out after a unit


def costs() -> budget.Costs:
    prior = budget.DRY_PRIOR if DRY_RUN else budget.PRIOR
    return budget.estimate(budget.sessions_from(results_dir()), prior)


def first_on_boot() -> bool:
    return not budget.launched_on(results_dir(), boot_id())


# -- record and check ------------------------------------------------------------------------------


def has_baseline(profile: str, key: str) -> bool:
    return (BASELINES / key / "test_gpu_smoke" / f"{PROFILE_TESTS[profile]}.json").exists()


def other_cards(profile: str) -> list[str]:
    here = card()
    return sorted(
        p.name for p in BASELINES.glob("*") if p.name != here and has_baseline(profile, p.name)
    )


def unit_done(phase: str, profile: str) -> bool:
    result = load(f"{phase}-{profile}")
    return result is not None and result.get("rc") == 0


def unit_cost(phase: str, launches: int) -> float:
    # check skips SGLang's preflight: record ran it on this card for the same commands
    return costs().unit(launches, preflight=phase == "record", first_on_boot=first_on_boot())


def phase_cost(phase: str) -> tuple[float, int]:
    """(seconds, units) still to do in ``phase`` on this card."""
    left = [p for p in PROFILE_TESTS if not unit_done(phase, p)]
    launches = baseline_launches() if phase == "record" else 1
    first = first_on_boot()
    total = 0.0
    for i, _ in enumerate(left):
        total += costs().unit(launches, preflight=phase == "record", first_on_boot=first and i == 0)
    return total, len(left)


def phase_suite(phase: str, checkpoint: Checkpoint) -> int:
    """record (with --update-baselines) or check, one pytest session per profile, so that a
    call that runs out of time keeps the profiles it finished and the next call goes on with
    the rest. A check of a profile that has no baseline on this card records one first, in
    the same sitting, and says so."""
    for profile, test in PROFILE_TESTS.items():
        if unit_done(phase, profile):
            log(f"[{phase}] {profile}: done in an earlier call")
            continue
        if phase == "check" and not has_baseline(profile, card()):
            elsewhere = other_cards(profile)
            log(
                f"[check] {profile}: no baseline of this card ({card()})"
                + (f"; there are baselines of {', '.join(elsewhere)}" if elsewhere else "")
                + ": recording one now, in this sitting, then checking against it"
            )
            need = unit_cost("record", baseline_launches())
            if need > seconds_left():
                log(f"[check] {profile}: {budget.say_cost('recording', need, seconds_left())}: "
                    "left for the next call")  # fmt: skip
                return INCOMPLETE
            suite_profile("record", profile, test, baseline_launches())
            merge_suite_results("record")
            checkpoint()
        launches = baseline_launches() if phase == "record" else 1
        need = unit_cost(phase, launches)
        left = seconds_left()
        if need > left:
            log(f"[{phase}] {profile}: {budget.say_cost(f'{launches} launch(es)', need, left)}: "
                "left for the next call")  # fmt: skip
            merge_suite_results(phase)
            return INCOMPLETE
        log(f"[{phase}] {profile}: {budget.say_cost(f'{launches} launch(es)', need, left)}")
        suite_profile(phase, profile, test, launches)
        merge_suite_results(phase)
        checkpoint()
    return merge_suite_results(phase)


def suite_profile(phase: str, profile: str, test: str, launches: int) -> None:
    tag = f"{phase}-{profile}"
    basetemp = card_dir() / f"pt-{tag}"
    results = results_dir()
    results.mkdir(parents=True, exist_ok=True)
    report = results / f"{tag}-report.json"
    args = [
        "test_gpu_smoke.py", "-k", test, "--basetemp", str(basetemp),
        "--specdecode-baselines", str(BASELINES),
        "--specdecode-state-dir", str(STATE / "state-suite"),
        "--specdecode-report", str(report),
        "--specdecode-markdown", str(results / f"{tag}-summary.md"),
    ]  # fmt: skip
    if phase == "record":
        args += [
            "--update-baselines",
            "--specdecode-baseline-runs", str(env_int("GPU_SMOKE_BASELINE_RUNS", 10)),
            "--specdecode-baseline-launches", str(launches),
        ]  # fmt: skip
    else:
        args.append("--specdecode-skip-preflight")
    started = time.time()
    rc, output, wall = run_pytest(tag, args)
    save(tag, {
        "kind": "session", "rc": rc, "wall_s": round(wall, 1), "started": started,
        "rows": report_rows(report), "sglang_accept_len": sglang_accept_lens(basetemp),
        "ready_s": ready_times(output), "preflight_s": preflight_times(output),
        "launch_failures": len(re.findall(r"exited with code", output)),
        "baseline_launches": launches if phase == "record" else None,
    })  # fmt: skip


def merge_suite_results(phase: str) -> int:
    """The phase's results/<phase>.json from its profiles' files (what the table reads)."""
    parts = [r for p in PROFILE_TESTS if (r := load(f"{phase}-{p}")) is not None]
    failed = [r for r in parts if r["rc"] != 0]
    done = len(parts) - len(failed)
    if failed:
        status = "failed: " + ", ".join(
            f"{next(iter(r['rows']), '?')} pytest exit {r['rc']}" for r in failed
        )
    elif done < len(PROFILE_TESTS):
        status = f"{done} of {len(PROFILE_TESTS)} profiles done, the rest left for the next call"
    else:
        status = f"done, {done} of {len(PROFILE_TESTS)} profiles"
    complete = done == len(PROFILE_TESTS)
    merged: dict[str, Any] = {
        "rc": max((r["rc"] for r in failed), default=0 if complete else INCOMPLETE),
        "status": status,
        "wall_s": round(sum(r["wall_s"] for r in parts), 1),
        "rows": {k: v for r in parts for k, v in r["rows"].items()},
        "sglang_accept_len": {k: v for r in parts for k, v in r["sglang_accept_len"].items()},
        "ready_s": [t for r in parts for t in r["ready_s"]],
        "preflight_s": [t for r in parts for t in r.get("preflight_s", [])],
        "launch_failures": sum(r["launch_failures"] for r in parts),
        "profiles_done": done,
    }
    save(phase, merged)
    return int(merged["rc"])


# -- attach: a server started by hand --------------------------------------------------------------


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float) -> float:
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


def attach_cost() -> float:
    c = costs()
    return c.unit(1, preflight=False, first_on_boot=first_on_boot()) + budget.ATTACH_EXTRA_S


def phase_attach() -> int:
    done = load("attach")
    if done is not None and done.get("passed"):
        log("[attach] done in an earlier call")
        return 0
    need, left = attach_cost(), seconds_left()
    if need > left:
        log(f"[attach] {budget.say_cost('a server started by hand', need, left)}: left for the "
            "next call")  # fmt: skip
        return INCOMPLETE
    log(f"[attach] {budget.say_cost('a server started by hand, recorded and checked', need, left)}")
    port = env_int("GPU_SMOKE_ATTACH_PORT", 30100)
    logs = logs_dir()
    logs.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "sglang.launch_server", "--model-path", str(MODELS / RIG["target"]),
        "--tp-size", "1", "--mem-fraction-static", os.environ.get("GPU_SMOKE_MEM_FRACTION", "0.5"),
        "--speculative-algorithm", "EAGLE3",
        "--speculative-draft-model-path", str(MODELS / f"{RIG['prefix']}-eagle3-match"),
        "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "3", *SGLANG_FLAGS,
        "--host", "127.0.0.1", "--port", str(port), "--enable-metrics",
    ]  # fmt: skip
    log(f"[attach] starting by hand: {' '.join(cmd)}")
    env = dict(os.environ, **SERVER_ENV, CUDA_VISIBLE_DEVICES="0")
    server_log_path = logs / "attach-server.log"
    started = time.time()
    t0 = time.monotonic()
    result: dict[str, Any] = {"kind": "attach", "port": port, "started": started}
    with server_log_path.open("w") as server_log:
        proc = subprocess.Popen(
            cmd, env=env, stdout=server_log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            result["ready_s"] = round(wait_ready(f"http://127.0.0.1:{port}", proc, 600), 1)
            log(f"[attach] server ready after {result['ready_s']}s")
            results = results_dir()
            common = [
                "test_gpu_smoke.py", "-k", "test_eagle3_match", f"--server-host=127.0.0.1:{port}",
                "--specdecode-baselines", str(card_dir() / "baselines-attach"),
                "--specdecode-state-dir", str(STATE / "state-attach"),
            ]  # fmt: skip
            rc1, _, _ = run_pytest("attach-record", [
                *common, "--update-baselines",
                "--specdecode-baseline-runs", str(env_int("GPU_SMOKE_BASELINE_RUNS", 10)),
                "--specdecode-report", str(results / "attach-record-report.json"),
            ])  # fmt: skip
            rc2, _, _ = run_pytest(
                "attach-check",
                [*common, "--specdecode-report", str(results / "attach-check-report.json")],
            )
            result.update(
                record_rc=rc1, check_rc=rc2, rows=report_rows(results / "attach-check-report.json")
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
    text = server_log_path.read_text("utf-8", "replace")
    result["sglang_accept_len"] = [float(v) for v in re.findall(r"accept len: ([0-9.]+)", text)]
    result["passed"] = result.get("record_rc") == 0 and result.get("check_rc") == 0
    result["wall_s"] = round(time.monotonic() - t0, 1)
    save("attach", result)
    return 0 if result["passed"] else 1


# -- launches: several at once through the plugin --------------------------------------------------


def one_launch(i: int) -> dict[str, Any]:
    d = card_dir() / f"launch-{i:02d}"
    shutil.rmtree(d, ignore_errors=True)
    rc, output, wall = run_pytest(
        f"launch-{i:02d}",
        ["test_launch.py", "--basetemp", str(d / "pt"), "--specdecode-state-dir", str(d / "state")],
        timeout=900,
    )
    port = re.search(r"on http://[0-9.]+:(\d+)", output)
    ready = ready_times(output)
    res: dict[str, Any] = {
        "launch": i, "rc": rc, "wall_s": round(wall, 1),
        "port": int(port.group(1)) if port else None, "ready_s": ready[0] if ready else None,
    }  # fmt: skip
    if rc != 0:
        res["tail"] = [line for line in output.splitlines() if line.strip()][-25:]
    log(f"[launch {i}] rc={rc} port={res['port']} ready={res['ready_s']}s wall={res['wall_s']}s")
    return res


def phase_launches() -> int:
    n = env_int("GPU_SMOKE_LAUNCHES", 10)
    conc = env_int("GPU_SMOKE_CONCURRENCY", 5)
    log(f"[launches] {n} launches through the plugin, {conc} at a time, ports chosen by it "
        "(no deadline check: run it in a call of its own)")  # fmt: skip
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=conc) as pool:
        results = list(pool.map(one_launch, range(n)))
    failures = [r for r in results if r["rc"] != 0]
    wall = round(time.monotonic() - start, 1)
    save("launches", {"launches": results, "count": n, "concurrency": conc,
                      "failures": len(failures), "wall_s": wall})  # fmt: skip
    return 1 if failures else 0


# -- the noise batches (opt-in) and the bandwidth probe --------------------------------------------


def noise_mod() -> Any:
    sys.path.insert(0, str(HERE))
    import noise  # scripts/gpu_smoke/noise.py

    return noise


def machine_facts() -> dict[str, Any]:
    """GPU, driver, versions: what the figures were measured with."""
    from importlib import metadata

    facts: dict[str, Any] = {}
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
    facts["cpus"] = os.cpu_count()
    facts["card"] = card()
    return facts


def phase_probe() -> int:
    """The device-to-device copy that gives the bandwidth ceiling, and the machine's facts."""
    if load("noise-probe") is not None:
        log("[probe] done in an earlier call")
        return 0
    need, left = budget.PROBE_S, seconds_left()
    if need > left:
        log(f"[probe] {budget.say_cost('a 4 GiB device-to-device copy', need, left)}: left for "
            "the next call")  # fmt: skip
        return INCOMPLETE
    log(f"[probe] {budget.say_cost('a 4 GiB device-to-device copy, ten times', need, left)}")
    probe = noise_mod().bandwidth_probe()
    probe["machine"] = machine_facts()
    save("noise-probe", probe)
    log(f"[probe] {json.dumps({k: v for k, v in probe.items() if k != 'machine'})}")
    return 0


def noise_counts() -> dict[str, int]:
    nz = noise_mod()
    done = dict.fromkeys((*nz.MAIN, *nz.HEADS), 0)
    failed = dict.fromkeys(done, 0)
    for path in results_dir().glob("noise-b*.json"):
        for srv in json.loads(path.read_text())["servers"]:
            if srv.get("runs") and not srv.get("error"):
                done[srv["profile"]] += 1
            else:
                failed[srv["profile"]] += 1
    want = env_int("GPU_SMOKE_NOISE_LAUNCHES", 8)
    for p, n in failed.items():  # a profile that failed twice is not tried again
        if n >= 2 and done[p] == 0:
            done[p] = want
            log(f"[noise] {p} failed {n} times: not launched again")
    return done


def noise_batch_seconds() -> float:
    walls = [json.loads(p.read_text())["wall_s"] for p in results_dir().glob("noise-b*.json")]
    default = 60.0 if DRY_RUN else float(os.environ.get("GPU_SMOKE_NOISE_BATCH_S", 240))
    return max(walls) if walls else default


def phase_noise(checkpoint: Checkpoint) -> int:
    """Batches of servers started together, measured one at a time (noise.py), until every
    main profile has GPU_SMOKE_NOISE_LAUNCHES launches here or the next batch does not fit."""
    nz = noise_mod()
    results = results_dir()
    results.mkdir(parents=True, exist_ok=True)
    want = env_int("GPU_SMOKE_NOISE_LAUNCHES", 8)
    per_batch = env_int("GPU_SMOKE_NOISE_BATCH", 6)
    runs = env_int("GPU_SMOKE_NOISE_RUNS", 10)
    env = dict(os.environ, **SERVER_ENV, CUDA_VISIBLE_DEVICES="0")
    rc = 0
    while True:
        done = noise_counts()
        if min(done[p] for p in nz.MAIN) >= want and min(done[p] for p in nz.HEADS) >= 1:
            break
        if min(done[p] for p in nz.MAIN) >= min(2, want) and min(done[p] for p in nz.HEADS) < 1:
            batch = list(nz.HEADS)  # the heads' exact accept lengths, once
        else:
            need_most = sorted(nz.MAIN, key=lambda p: done[p])
            batch = [need_most[i % len(need_most)] for i in range(per_batch)]
        need, left = noise_batch_seconds(), seconds_left()
        missing = sum(max(0, want - done[p]) for p in nz.MAIN)
        batches_left = -(-missing // per_batch) + (min(done[p] for p in nz.HEADS) < 1)
        if need > left:
            log(f"[noise] {budget.say_cost('the next batch', need, left)}: left for the next "
                f"call ({batches_left} batch(es) to go; launches so far {done})")  # fmt: skip
            rc = rc or INCOMPLETE
            break
        log(f"[noise] {budget.say_cost(f'a batch of {len(batch)} servers', need, left)}; "
            f"about {batches_left} batch(es) to go")  # fmt: skip
        batch_id = time.strftime("%Y%m%d-%H%M%S")
        result = nz.run_batch(
            batch, python=sys.executable, models=MODELS, rig=RIG, logs=logs_dir(), env=env,
            runs=runs, batch_id=batch_id,
        )  # fmt: skip
        result["boot"] = boot_id()
        (results / f"noise-b{batch_id}.json").write_text(json.dumps(result, indent=2) + "\n")
        failed = [s for s in result["servers"] if s.get("error")]
        for s in failed:
            log(f"[noise] {s['profile']}: {s['error']}; {s['errors'][:3]}")
        rc = 1 if failed else rc
        checkpoint()
        if len(failed) == len(result["servers"]):
            break
    return rc


def noise_cost() -> tuple[float, int]:
    nz = noise_mod()
    done = noise_counts()
    want = env_int("GPU_SMOKE_NOISE_LAUNCHES", 8)
    missing = sum(max(0, want - done[p]) for p in nz.MAIN)
    batches = -(-missing // env_int("GPU_SMOKE_NOISE_BATCH", 6)) + (
        min(done[p] for p in nz.HEADS) < 1
    )
    return batches * noise_batch_seconds(), batches
