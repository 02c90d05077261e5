"""Before a 900-second load: ask the SGLang that will serve whether it accepts the command.

SGLang parses and resolves its arguments (``prepare_server_args``: argparse, then
``ServerArgs.__post_init__``) in the first seconds of a launch, but the server only dies of a
bad flag after its imports, and a resolution it does not refuse (NGRAM's topk, a reset
``max_running_requests``) shows only in ``/server_info`` once the load is done. The preflight
runs that same function of the same SGLang, in the interpreter and environment the server will
get, and returns within seconds:

* a flag the release rejects (unknown, removed, a bad choice or type): argparse's own message,
  naming the flag and the SGLang version;
* a value ``__post_init__`` refuses (``ValueError``, e.g. 0.5.11-0.5.15's derived gRPC port
  above 65535);
* a resolution that contradicts the profile (compared like an attached server's
  ``/server_info``);
* an interpreter without SGLang, or without a module SGLang's arguments import: the launch
  would die of it too.

Other exceptions of ``__post_init__`` (a device query that needs what only the running server
sets up) do not decide anything: the preflight reports them as not run and the launch goes on.
Only the ``sglang`` launcher is preflighted: a container runs an image's SGLang that the host
may not have, and the simulator rejects what its release rejects within a second anyway.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_specdecode.profiles.profile import ServerProfile, compare_server_args

PREFLIGHT_TIMEOUT = 180.0
"""Seconds for the import of SGLang's server arguments (about 20 s with torch on a cold disk)
and their resolution; past it the preflight is abandoned and the launch goes on."""

# Run in the server's interpreter: prepare_server_args(argv) as launch_server calls it, and the
# resolved fields as JSON on the last line of stdout. Compatible with SGLang 0.5.6-0.5.23
# (dataclass ServerArgs up to 0.5.19, a msgspec struct from 0.5.20 on).
_SCRIPT = r"""
import contextlib, dataclasses, io, json, sys

argv = json.loads(sys.argv[1])
sys.argv = ["launch_server.py", *argv]  # argparse names the program after argv[0]

def emit(**data):
    sys.stdout.write("\n" + json.dumps(data, default=repr) + "\n")
    sys.exit(0)

try:
    import sglang
    from sglang.srt.server_args import prepare_server_args
except ImportError as exc:
    emit(stage="import", error=f"{type(exc).__name__}: {exc}", missing=getattr(exc, "name", None))
version = getattr(sglang, "__version__", None)
if version is None:
    try:
        from importlib.metadata import version as dist_version
        version = dist_version("sglang")
    except Exception:
        version = None
errors = io.StringIO()
try:
    with contextlib.redirect_stderr(errors):
        args = prepare_server_args(argv)
except SystemExit as exc:
    emit(stage="parse", version=version, error=errors.getvalue().strip(), code=exc.code)
except (ValueError, AssertionError) as exc:
    emit(stage="resolve", version=version, error=f"{type(exc).__name__}: {exc}")
except Exception as exc:
    emit(stage="environment", version=version, error=f"{type(exc).__name__}: {exc}")
if dataclasses.is_dataclass(args):
    names = [f.name for f in dataclasses.fields(args)]
else:
    names = list(getattr(type(args), "__struct_fields__", ())) or list(vars(args))
fields = {}
for name in names:
    value = getattr(args, name, None)
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        value = repr(value)
    fields[name] = value
fields["version"] = version
emit(stage="ok", version=version, fields=fields)
"""


@dataclass(frozen=True)
class PreflightResult:
    """What the server's SGLang said about a launch command.

    ``problem`` is set when the launch would fail or run something else than the profile
    (launch nothing); ``note`` when the preflight could not decide (launch anyway)."""

    version: str | None
    problem: str | None = None
    note: str | None = None
    fields: Mapping[str, Any] | None = None


def preflight(
    profile: ServerProfile,
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    timeout: float = PREFLIGHT_TIMEOUT,
) -> PreflightResult:
    """Run SGLang's own argument handling on ``argv`` (the flags after ``-m
    sglang.launch_server``) with the interpreter ``argv[0]`` of the launch, in ``env``."""
    python, flags = argv[0], list(argv[argv.index("-m") + 2 :])
    try:
        # A session of its own: on a timeout the whole group goes, including any helper process
        # SGLang's imports started that would otherwise keep the pipes open.
        process = subprocess.Popen(
            [python, "-c", _SCRIPT, json.dumps(flags)],
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
    except (FileNotFoundError, PermissionError):
        return PreflightResult(
            None,
            problem=f"the interpreter {python!r} does not exist or cannot be run; set python = "
            "in the profile to the Python that has SGLang installed",
        )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return PreflightResult(
            None, note=f"not run: SGLang's argument check took more than {timeout:g}s"
        )
    done = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    try:
        answer: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        return PreflightResult(
            None,
            note=f"not run: {python} exited with {done.returncode} without an answer"
            + (f" ({' / '.join(tail)})" if tail else ""),
        )
    return _judge(profile, python, answer)


SGLANG_PACKAGE = "sglang"
"""The Python package the interpreter could not import (not a launcher name)."""


def _judge(profile: ServerProfile, python: str, answer: Mapping[str, Any]) -> PreflightResult:
    version = answer.get("version")
    who = f"SGLang {version}" if version else "SGLang"
    stage, error = answer.get("stage"), str(answer.get("error") or "")
    if stage == "import":
        missing = answer.get("missing")
        if missing in (SGLANG_PACKAGE, None) or str(missing).startswith(SGLANG_PACKAGE):
            return PreflightResult(
                None,
                problem=f"{python} cannot import SGLang ({error}); install it there or set "
                "python = in the profile to the interpreter that has it",
            )
        return PreflightResult(
            None,
            problem=f"{python} has SGLang but not the module {missing!r} that its server "
            f"arguments import ({error}): the server would die of it the same way; install "
            "SGLang's dependencies in that environment",
        )
    if stage == "parse":
        lines = [line for line in error.splitlines() if line.strip()]
        reason = lines[-1] if lines else f"argparse exited with {answer.get('code')}"
        return PreflightResult(
            version,
            problem=f"{who} ({python}) rejects the launch command: {reason}. Fix the flag in "
            f"the profile's extra_args or speculative settings ({profile.source})",
        )
    if stage == "resolve":
        return PreflightResult(
            version,
            problem=f"{who} ({python}) refuses the launch command while resolving it: {error}",
        )
    if stage == "environment":
        return PreflightResult(
            version, note=f"{who} could not resolve the arguments outside the server: {error}"
        )
    fields = answer.get("fields")
    if not isinstance(fields, Mapping):
        return PreflightResult(version, note=f"not run: an unexpected answer {answer!r}")
    mismatches = [m for m in compare_server_args(profile, fields) if m.reported]
    if mismatches:
        return PreflightResult(
            version,
            problem=f"{who} ({python}) would not run profile {profile.name!r} as written "
            f"({profile.source}): " + "; ".join(m.describe() for m in mismatches),
            fields=fields,
        )
    return PreflightResult(version, fields=fields)
