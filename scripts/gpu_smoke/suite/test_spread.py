"""gpu-smoke spread phase: launch-to-launch against run-to-run spread, and where NCCL settings go.

Two profiles that differ only in their NCCL environment: ``spread-nccl`` sets the seed's six
variables (one env set), ``spread-plain`` none. The shell that runs pytest exports the same six
with *other* values (GPU_SMOKE_SHELL_NCCL), so the dump below shows that a profile's processes
get exactly the profile's values and a profile without them gets none from the shell. Each test
writes the NCCL_* / multicast variables of every process of its server (the server runs in its
own session, so its processes are those whose session id is the server's pid) to
$GPU_SMOKE_ENV_DUMP/<profile>-<pid>.json.

``test_nccl_debug`` launches a third profile, the NCCL-tuned one with ``NCCL_DEBUG=INFO``, and
keeps the NCCL lines of its server log: NCCL itself saying which variables it took from the
environment, in the processes that run it (the scheduler), whose environ cannot be read.

With GPU_SMOKE_SPREAD_SWAP=1 the plain test is measured on the NCCL-tuned server: its baseline
was recorded without NCCL tuning, so the plugin must refuse to compare (a fingerprint mismatch).
"""

import json
import os
from pathlib import Path

import pytest

DUMP = Path(os.environ.get("GPU_SMOKE_ENV_DUMP", "env-dump"))
PREFIXES = ("NCCL_", "TORCH_SYMM_MEM", "NVSHMEM_", "CUDA_DEVICE_MAX_CONNECTIONS")
PLAIN = "spread-nccl" if os.environ.get("GPU_SMOKE_SPREAD_SWAP") == "1" else "spread-plain"
TOK_S = -0.5  # launches of these tiny models moved tok/s by up to 28%: the spread is the point


def session_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[3])  # field 6: session id


def dump_environments(profile: str, server: object) -> None:
    pid = int(getattr(server, "identity", {}).get("pid") or 0)
    processes = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if session_of(int(entry.name)) != pid:
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:160]
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue  # gone, or not ours to read
        env = dict(item.decode().split("=", 1) for item in environ if b"=" in item)
        processes[entry.name] = {
            "cmdline": cmdline,
            # SGLang renames its subprocesses (setproctitle: "sglang::scheduler"), and a title
            # longer than the command line is written over the environ area, so what
            # /proc/PID/environ shows of those is not their environment: say so
            "environ_readable": "PATH" in env,
            "env": {k: v for k, v in sorted(env.items()) if k.startswith(PREFIXES)},
        }
    DUMP.mkdir(parents=True, exist_ok=True)
    record = {"profile": profile, "server_pid": pid, "processes": processes}
    (DUMP / f"{profile}-{pid}.json").write_text(json.dumps(record, indent=2) + "\n")


@pytest.mark.specdecode(PLAIN, workload="smoke", tok_s=TOK_S)
def test_plain(specdecode_server):
    """No NCCL variables in the profile (the shell's must not leak in)."""
    dump_environments(PLAIN, specdecode_server)


@pytest.mark.specdecode(
    "spread-nccl", workload="smoke", tok_s=TOK_S, against={"spread-plain": {"tok_s": TOK_S}}
)
def test_nccl(specdecode_server):
    """The seed's six NCCL variables, and a verdict against the plain profile's baseline."""
    dump_environments("spread-nccl", specdecode_server)


@pytest.mark.parametrize("specdecode_server", ["spread-nccl-debug"], indirect=True)
def test_nccl_debug(specdecode_server):
    """NCCL's own account of the variables it was given, from the server's log."""
    dump_environments("spread-nccl-debug", specdecode_server)
    log = Path(specdecode_server.log_path).read_text("utf-8", "replace")
    lines = [line for line in log.splitlines() if "NCCL INFO" in line or "NCCL WARN" in line]
    (DUMP / "nccl-debug-lines.json").write_text(json.dumps(lines, indent=2) + "\n")
