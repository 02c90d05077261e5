#!/usr/bin/env python3
"""Regenerate ``pytest_specdecode/sglang_releases.json``: SGLang's flags and ServerArgs fields.

For every SGLang release given, this imports that release's ``sglang.srt.server_args`` from an
unpacked wheel (third-party and GPU modules replaced by inert stubs, so no torch is needed; see
``scripts/sglang_stubs.py``), calls ``ServerArgs.add_cli_args`` on a fresh ``argparse`` parser
and records each option (its strings, ``nargs``, action kind, type and choices) and each
ServerArgs field (name, default). The simulator builds one parser per requested version from
this data, so it accepts and rejects exactly what that release's ``launch_server`` does; the core
reads the same data (``pytest_specdecode/sglang_releases.py``) for the ``/server_info`` field a
flag sets.

The file has one flag or field per line, so a regenerated file's diff shows what changed.

Usage (msgspec must be importable: SGLang 0.5.20+ builds ServerArgs with it)::

    for v in 0.5.6 0.5.7 ...; do pip download --no-deps -d whl sglang==$v; done
    # unzip each wheel's sglang/ into SRC/<version>/
    python scripts/gen-sim-flags.py SRC            # every SRC/<version>/sglang
    python scripts/gen-sim-flags.py SRC --check    # exit 1 if the data file is out of date
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

# The stub importer lives beside this script (shared with the preflight's contract tests).
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from sglang_stubs import Stub, install

OUT = Path(__file__).resolve().parents[1] / "pytest_specdecode" / "sglang_releases.json"


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        items = [_jsonable(v) for v in value]
        return items
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return None


def _kind(action: argparse.Action) -> str:
    kinds = {
        argparse._StoreAction: "store",
        argparse._StoreTrueAction: "store_true",
        argparse._StoreFalseAction: "store_false",
        argparse._StoreConstAction: "store_const",
        argparse._AppendAction: "append",
        argparse._CountAction: "count",
        argparse.BooleanOptionalAction: "boolean_optional",
    }
    return kinds.get(type(action), "custom")


def extract(src: Path) -> dict[str, Any]:
    """One release: {"flags": [...], "fields": {name: default}} (run in a fresh process)."""
    install(src)  # scripts/sglang_stubs.py: real argument modules, everything else stubbed
    server_args = importlib.import_module("sglang.srt.server_args")
    parser = argparse.ArgumentParser(prog="sglang")
    server_args.ServerArgs.add_cli_args(parser)
    flags = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        kind = _kind(action)
        nargs = action.nargs
        if kind == "custom" and nargs is None:
            nargs = "1"  # a custom action that takes one value (argparse's default)
        type_name = getattr(action.type, "__name__", None) if action.type else None
        if type_name not in ("int", "float", "str", None):
            type_name = "str"
        choices = None
        if action.choices is not None and not isinstance(action.choices, Stub):
            choices = sorted({str(c) for c in action.choices})
        flags.append(
            {
                "opts": list(action.option_strings),
                "dest": action.dest,
                "kind": kind,
                "nargs": None if nargs is None else str(nargs),
                "type": type_name,
                "choices": choices,
            }
        )
    cls = server_args.ServerArgs
    fields: dict[str, Any] = {}
    if dataclasses.is_dataclass(cls):
        for field in dataclasses.fields(cls):
            default = field.default
            if default is dataclasses.MISSING and field.default_factory is not dataclasses.MISSING:
                default = field.default_factory()
            fields[field.name] = _jsonable(None if default is dataclasses.MISSING else default)
    else:  # 0.5.20+: a msgspec struct assembled from arg_groups/fields
        import msgspec.structs

        for field in msgspec.structs.fields(cls):
            default = field.default
            if default is msgspec.NODEFAULT and field.default_factory is not msgspec.NODEFAULT:
                default = field.default_factory()
            fields[field.name] = _jsonable(None if default is msgspec.NODEFAULT else default)
    return {"flags": flags, "fields": fields}


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def _ranges(indexes: list[int]) -> list[list[int]]:
    """Consecutive runs of version indexes as [first, last] pairs."""
    runs: list[list[int]] = []
    for index in indexes:
        if runs and runs[-1][1] == index - 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    return runs


def build(src_root: Path) -> str:
    versions = sorted(
        (p.name for p in src_root.iterdir() if re.fullmatch(r"\d+\.\d+\.\d+", p.name)),
        key=_version_key,
    )
    per_version = {}
    for version in versions:
        done = subprocess.run(
            [sys.executable, __file__, "--one", str(src_root / version)],
            capture_output=True,
            text=True,
            check=True,
        )
        per_version[version] = json.loads(done.stdout)
    # Flags: one entry per distinct definition, with the version indexes that have it.
    flag_versions: dict[str, list[int]] = {}
    for index, version in enumerate(versions):
        for flag in per_version[version]["flags"]:
            flag_versions.setdefault(json.dumps(flag, sort_keys=True), []).append(index)
    flags = [
        {**json.loads(key), "versions": _ranges(indexes)}
        for key, indexes in sorted(flag_versions.items(), key=lambda kv: json.loads(kv[0])["dest"])
    ]
    field_versions: dict[str, list[int]] = {}
    defaults: dict[str, Any] = {}
    for index, version in enumerate(versions):
        for name, default in per_version[version]["fields"].items():
            field_versions.setdefault(name, []).append(index)
            defaults[name] = default  # the newest release's default
    # Declaration order of the newest release, then fields it dropped (newest last seen first).
    order = list(per_version[versions[-1]]["fields"])
    for version in reversed(versions):
        order += [name for name in per_version[version]["fields"] if name not in order]
    fields = {
        name: {"versions": _ranges(field_versions[name]), "default": defaults[name]}
        for name in order
    }
    return render({"versions": versions, "flags": flags, "fields": fields})


def render(data: dict[str, Any]) -> str:
    """The data file's text: compact JSON with one flag or field per line (key order kept)."""

    def dumps(value: Any) -> str:
        return json.dumps(value, separators=(",", ":"))

    lines = [
        "{",
        f'"versions":{dumps(data["versions"])},',
        '"flags":[',
        ",\n".join(dumps(flag) for flag in data["flags"]),
        "],",
        '"fields":{',
        ",\n".join(f"{dumps(name)}:{dumps(field)}" for name, field in data["fields"].items()),
        "}",
        "}",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", type=Path, help="folder of unpacked wheels: SRC/<version>/sglang")
    parser.add_argument("--check", action="store_true", help="only compare with the data file")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.one:
        print(json.dumps(extract(ns.src)))
        return 0
    text = build(ns.src)
    if ns.check:
        current = OUT.read_text(encoding="utf-8") if OUT.exists() else ""
        if current != text:
            print(f"{OUT} is out of date; run {Path(__file__).name} without --check")
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT} ({len(text)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
