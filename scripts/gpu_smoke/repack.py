#!/usr/bin/env python3
"""Cut a wheel down to what scripts/gpu-smoke needs, keeping it installable by pip.

    python3 repack.py IN.whl OUT_DIR --drop GLOB [--drop GLOB ...] [--keep GLOB ...]

A member is dropped when it matches a --drop glob and no --keep glob (fnmatch on the path
inside the wheel). The dist-info RECORD loses the dropped lines, so pip installs the rest
without complaint. The output keeps the input's file name.

Used by fetch-wheels.sh for:
  sglang-kernel   without its FlashAttention-3 library (flash_ops.abi3.so, 1.7 GB unpacked)
                  and the sm100 (Blackwell) ops: an H200 loads sgl_kernel/sm90/common_ops
  flashinfer      only the sources its RMSNorm JIT module compiles (norm.cu and the headers
                  it reaches), no CUTLASS, no spdlog
  sglang          without the gRPC extension (_core.so, unused without --grpc-mode), the
                  diffusion runtime (multimodal_gen) and its tests
"""

from __future__ import annotations

import argparse
import base64
import csv
import fnmatch
import hashlib
import io
import re
import sys
import zipfile
from pathlib import Path


def includes_closure(zf: zipfile.ZipFile, roots: list[str], starts: list[str]) -> set[str]:
    """Paths inside the wheel that #include chains from `starts` reach (for --keep-includes)."""
    names = set(zf.namelist())
    seen: set[str] = set()
    todo = list(starts)
    while todo:
        f = todo.pop()
        if f in seen or f not in names:
            continue
        seen.add(f)
        src = zf.read(f).decode("utf-8", "ignore")
        for m in re.finditer(r'#\s*include\s*[<"]([^>"]+)[>"]', src):
            inc = m.group(1)
            for base in [f.rsplit("/", 1)[0], *roots]:
                cand = _norm(f"{base}/{inc}")
                if cand in names:
                    todo.append(cand)
                    break
    return seen


def _norm(path: str) -> str:
    out: list[str] = []
    for part in path.split("/"):
        if part == "..":
            if out:
                out.pop()
        elif part not in ("", "."):
            out.append(part)
    return "/".join(out)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("wheel", type=Path)
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--drop", action="append", default=[])
    ap.add_argument("--keep", action="append", default=[])
    ap.add_argument(
        "--keep-includes",
        action="append",
        default=[],
        metavar="ROOTS:START,...",
        help="keep what #include reaches: include roots ';'-separated, ':', "
        "start files ','-separated",
    )
    args = ap.parse_args(argv)
    args.outdir.mkdir(parents=True, exist_ok=True)
    out_path = args.outdir / args.wheel.name
    with zipfile.ZipFile(args.wheel) as zin:
        keep_exact: set[str] = set()
        for spec in args.keep_includes:
            roots, starts = spec.split(":", 1)
            keep_exact |= includes_closure(zin, roots.split(";"), starts.split(","))
        record_name = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))

        def dropped(name: str) -> bool:
            if name == record_name or name in keep_exact:
                return False
            if any(fnmatch.fnmatch(name, k) for k in args.keep):
                return False
            return any(fnmatch.fnmatch(name, d) for d in args.drop)

        kept, gone, gone_bytes = [], 0, 0
        with zipfile.ZipFile(out_path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
            for info in zin.infolist():
                if dropped(info.filename):
                    gone += 1
                    gone_bytes += info.file_size
                    continue
                if info.filename == record_name:
                    continue
                data = zin.read(info)
                zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
                kept.append([info.filename, f"sha256={digest.decode()}", str(len(data))])
            kept.append([record_name, "", ""])
            buf = io.StringIO()
            csv.writer(buf, lineterminator="\n").writerows(kept)  # quotes names with commas
            zout.writestr(record_name, buf.getvalue())
    print(
        f"{out_path.name}: dropped {gone} files ({gone_bytes / 2**20:.1f} MiB unpacked); "
        f"{args.wheel.stat().st_size / 2**20:.1f} -> {out_path.stat().st_size / 2**20:.1f} MiB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
