"""The plugin's measurement on a real engine: llama.cpp's llama-server (prints figures; not a test).

For each configuration it starts ``llama-server`` the way the plugin does (a ``launcher =
"llamacpp"`` profile, :func:`~pytest_specdecode.servers.factory.make_launcher`, readiness on
``/health``) with the tiny GGUF models that ``tests/llamacpp/tinymodels.py`` generates, and
measures with the plugin's own client, backend and metrics. It prints, per configuration:

* ``client tok/s``: the plugin's ``tok_s`` (Σ completion tokens / wall time of the run);
* ``server tok/s``: llama-server's own account, Σ completion tokens / Σ (``timings.prompt_ms`` +
  ``predicted_ms``) of the run's sequential requests; ``error``: client / server - 1 (mean over
  runs, worst run in brackets). The difference is what the server does not count: HTTP, JSON,
  SSE framing, and its own queueing and scheduling between requests;
* ``accept length``: 1 + Δaccepted / Δdrafts of the ``spec_decode_*`` counters around each run
  (all runs agreeing shows as one value), with the expectation in brackets: n_max + 1 for the
  fixed pair, 1 for the random head, 1 + Σ rates for synthetic acceptance (before the shorter
  last step of each request);
* ``scrape ms``: what reading ``/metrics`` before and after a run costs (two GETs and the
  parse), per run, beside the run's own duration;
* ``client CPU s / 1k tok``: this process's CPU time per 1,000 generated tokens.

``python benchmarks/bench_llamacpp.py [--runs 5] [--tokens 128] [--threads 1]``. The binary comes
from ``$SPECDECODE_LLAMA_SERVER`` or the cache of ``scripts/build-llama-server.sh``; the models
are generated into a temporary directory (about a second). About a minute on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tabulate import tabulate

from pytest_specdecode.backends import backend_for
from pytest_specdecode.client import MeasurementClient
from pytest_specdecode.metrics import compute_run_metrics
from pytest_specdecode.profiles import ServerProfile, load_profiles
from pytest_specdecode.servers.factory import make_launcher
from pytest_specdecode.servers.launcher import find_free_port
from pytest_specdecode.servers.readiness import wait_until_ready
from pytest_specdecode.workloads import Workload, resolve_workload

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from llamacpp.conftest import default_binary_path  # noqa: E402
from llamacpp.tinymodels import TinyModels, generate  # noqa: E402

N_MAX = 4
SYNTH_RATES = (0.9, 0.7, 0.5, 0.3)


@dataclass(frozen=True)
class Result:
    profile: str
    expected_accept: str
    client_tok_s: float
    server_tok_s: float
    errors: tuple[float, ...]
    accept_lengths: tuple[float, ...]
    scrape_ms: float
    run_ms: float
    cpu_per_1k: float


def profile_file(models: TinyModels, threads: int, directory: Path) -> Path:
    """Four llama.cpp profiles on the tiny models, as a user would write them."""
    fixed = f'draft_model_path = "{models.fixed_eagle3}", draft_n_max = {N_MAX}'
    random = f'draft_model_path = "{models.eagle3}", draft_n_max = {N_MAX}'
    rates = ",".join(map(str, SYNTH_RATES))
    path = directory / "specdecode.toml"
    path.write_text(
        f"""
[defaults]
launcher = "llamacpp"
threads = {threads}
ctx_size = 2048
parallel = 1
startup_timeout = 60

[profiles.nospec]
model_path = "{models.fixed_target}"

[profiles.eagle3-fixed]
model_path = "{models.fixed_target}"
speculative = {{ algorithm = "draft-eagle3", {fixed} }}

[profiles.eagle3-random]
model_path = "{models.fixed_target}"
speculative = {{ algorithm = "draft-eagle3", {random} }}

[profiles.eagle3-synthetic]
model_path = "{models.fixed_target}"
speculative = {{ algorithm = "draft-eagle3", {fixed} }}
extra_args = ["--spec-synth-rates", "{rates}"]
"""
    )
    return path


EXPECTED = {
    "nospec": "-",
    "eagle3-fixed": f"{N_MAX + 1}",
    "eagle3-random": "1",
    "eagle3-synthetic": f"{1 + sum(SYNTH_RATES):g}",
}


def workload_for(tokens: int) -> Workload:
    return resolve_workload(
        {
            "prompt_set": "mixed",
            "max_new_tokens": tokens,
            "concurrency": 1,
            "requests_per_run": 4,
            "warmup_requests": 1,
            "api": "completions-stream",
        },
        source="bench_llamacpp",
    )


def measure(profile: ServerProfile, workload: Workload, runs: int, log_dir: Path) -> Result:
    backend = backend_for(profile)
    port = find_free_port(profile.host)
    launcher = make_launcher(
        profile, port=port, log_path=log_dir / f"{profile.name}.log", env=os.environ, api_key=None
    )
    launcher.start()
    try:
        url = launcher.base_url
        wait_until_ready(
            url,
            name=profile.name,
            timeout=profile.startup_timeout,
            exit_code=launcher.exit_code,
            paths=backend.health_paths,
        )
        client_rates, server_rates, accepts = [], [], []
        scrape = spent = cpu = 0.0
        generated = 0
        with MeasurementClient(url, adapters=backend.adapter) as client:
            client.warmup(workload)
            for index in range(runs):
                cpu_start = time.process_time()
                t0 = time.perf_counter()
                state = backend.begin_run(client, workload)
                t1 = time.perf_counter()
                run = client.run(workload, index)
                t2 = time.perf_counter()
                extras = backend.end_run(client, state, run)
                t3 = time.perf_counter()
                metrics = compute_run_metrics(run)
                cpu += time.process_time() - cpu_start
                scrape += (t1 - t0) + (t3 - t2)
                spent += t2 - t1
                generated += metrics.completion_tokens
                client_rates.append(metrics.values["tok_s"])
                server_seconds = [r.server_e2e_latency for r in run.records]
                if any(s is None for s in server_seconds):
                    raise RuntimeError(f"{profile.name}: a response had no timings")
                tokens = sum(r.completion_tokens for r in run.records)
                server_rates.append(tokens / sum(float(s or 0.0) for s in server_seconds))
                if "accept_length" in extras.values:
                    accepts.append(extras.values["accept_length"])
    finally:
        launcher.stop(grace=10.0)
    return Result(
        profile=profile.name,
        expected_accept=EXPECTED[profile.name],
        client_tok_s=statistics.fmean(client_rates),
        server_tok_s=statistics.fmean(server_rates),
        errors=tuple(c / s - 1.0 for c, s in zip(client_rates, server_rates, strict=True)),
        accept_lengths=tuple(accepts),
        scrape_ms=1000.0 * scrape / runs,
        run_ms=1000.0 * spent / runs,
        cpu_per_1k=cpu / generated * 1000.0,
    )


def report(results: Sequence[Result]) -> str:
    rows = []
    for result in results:
        mean_error = statistics.fmean(result.errors)
        worst = max(result.errors, key=abs)
        accepts = sorted({round(a, 3) for a in result.accept_lengths})
        accept = ", ".join(f"{a:.3f}" for a in accepts) if accepts else "-"
        rows.append(
            [
                result.profile,
                f"{result.client_tok_s:.1f}",
                f"{result.server_tok_s:.1f}",
                f"{mean_error:+.2%} [{worst:+.2%}]",
                f"{accept} ({result.expected_accept})",
                f"{result.scrape_ms:.1f} of {result.run_ms:.0f}",
                f"{result.cpu_per_1k:.3f}",
            ]
        )
    headers = [
        "profile",
        "client tok/s",
        "server tok/s",
        "error (worst run)",
        "accept length (expected)",
        "scrape ms of run ms",
        "client CPU s / 1k tok",
    ]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128, help="max_new_tokens per request")
    parser.add_argument("--threads", type=int, default=1, help="llama-server -t")
    args = parser.parse_args(argv)
    binary = os.environ.get("SPECDECODE_LLAMA_SERVER") or str(default_binary_path())
    if not Path(binary).is_file():
        print(f"no llama-server at {binary}: run `bash scripts/build-llama-server.sh`")
        return 2
    os.environ["SPECDECODE_LLAMA_SERVER"] = binary  # the launcher's binary lookup
    started = time.perf_counter()
    workload = workload_for(args.tokens)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-llamacpp-") as tmp:
        directory = Path(tmp)
        models = generate(directory / "models")
        profiles = load_profiles(profile_file(models, args.threads, directory)).profiles
        for name in EXPECTED:
            result = measure(profiles[name], workload, args.runs, directory)
            results.append(result)
            print(f"{name}: client {result.client_tok_s:.1f} tok/s", flush=True)
    print()
    print(
        f"REAL llama-server ({binary}), tiny generated models, {args.runs} runs of 4 sequential "
        f"streamed requests x {args.tokens} tokens, -t {args.threads}, on {os.cpu_count()} CPUs"
    )
    print(report(results))
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
