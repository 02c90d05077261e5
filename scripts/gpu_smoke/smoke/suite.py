"""The suite that pytest runs: scripts/gpu_smoke/suite/ copied into the state directory, its
profiles pointed at the rig's models, and its own pytest.ini with the noise guard."""

from __future__ import annotations

import json
import os
import shutil

from smoke.common import CONTRACT_NOISE, HERE, MODELS, RIG, RIG_NAME, SUITE, env_int, results_dir
from smoke.spread import SPREAD_PROFILES

LAUNCH_PROFILE = """
# The launch phase: several of these start at once on the one GPU, each pytest session with its
# own state directory, each server on a port the plugin picks. KV cache capped so that they fit
# together (SGLang sizes it from the memory free at its start).
[profiles.smoke-launch]
description = "the rig's target + agreeing EAGLE3 head, small KV cache, for concurrent launches"
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


def write_suite() -> str:
    """Write the suite; return what its noise guard is and where it comes from."""
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
    return f"{cv:.2%} ({source})"


def baseline_cv_limit() -> tuple[float, str]:
    """The suite's noise guard (max tok/s CV of a baseline's runs), from the rig's measured run
    noise: 3x the largest run CV seen in one launch of any profile, at least 2%. Measured on
    this card (its noise batches) if there are any, else the H200 figures kept in
    tests/contract/data/h200_noise.json, else the plugin's default 8%."""
    from smoke.phases import noise_mod

    worst = None
    source = ""
    batches = [json.loads(p.read_text()) for p in sorted(results_dir().glob("noise-b*.json"))]
    if batches:
        summary = noise_mod().summarise(batches, None, env_int("GPU_SMOKE_NOISE_RUNS", 10))
        cvs = [e["run_cv_max"] for e in summary.values() if e.get("run_cv_max") is not None]
        if cvs:
            worst, source = max(cvs), f"largest run CV {max(cvs):.2%} measured on this card"
    if worst is None and CONTRACT_NOISE.exists() and RIG_NAME == "llama8b":
        data = json.loads(CONTRACT_NOISE.read_text())
        worst = data.get("largest_run_cv")
        source = f"largest run CV {worst:.2%} in {CONTRACT_NOISE.name}" if worst else ""
    if worst is None:
        return 0.08, "no measurement: the plugin's default"
    return max(0.02, 3 * worst), f"3 x {source}, at least 2%"
