#!/usr/bin/env bash
# Provision a Python venv holding SGLang's own client code (sglang.bench_serving, the frontend
# language's RuntimeEndpoint) and the official openai SDK, so tests/sim can run real SGLang client
# code against the simulated server. Built once into a cache OUTSIDE the clone, like
# scripts/build-llama-server.sh; nothing is downloaded at test time.
#
#   scripts/provision-sglang-client.sh       # prints the venv's python as its last line
#
# sglang itself is installed with --no-deps: its full dependency set pulls torch, flashinfer and
# CUDA wheels (gigabytes) that only its server needs. The client modules import just a few
# packages; those are installed at the versions sglang's own metadata pins (openai==2.6.1 and
# transformers==4.57.1 for 0.5.6), so the client code runs against what it was released with.
# For 0.5.6 every package is pinned and hashed in scripts/sglang-client-requirements.txt and
# installed with --no-deps --require-hashes: pip resolves nothing (77 s from an empty cache on
# the CI machine kind, against 5 min 58 s resolving); another SGLANG_CLIENT_VERSION, or a Python
# the pinned versions have no files for, resolves as before.
#
# Beside the venv, once: the argument code of SGLang releases 0.5.6, 0.5.15 and 0.5.23
# (src_versions below), unpacked from their wheels into $cache/sglang-src/<version>/sglang/ with a
# minimal sglang-<version>.dist-info, for the preflight's contract tests
# (tests/contract/test_preflight.py run it with everything else stubbed: scripts/sglang_stubs.py).
# If that fails, the venv is still printed and those tests skip (or fail under
# SPECDECODE_REQUIRE_SGLANG_CLIENT=1).
#
# Environment: SPECDECODE_CACHE (default ~/.cache/pytest-specdecode), SGLANG_CLIENT_VERSION,
# SGLANG_CLIENT_BASE_PYTHON (the interpreter the venv is made from: python3; 3.10 or newer).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

version="${SGLANG_CLIENT_VERSION:-0.5.6}"
cache="${SPECDECODE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pytest-specdecode}"
root="$cache/sglang-client/$version"
venv="$root/venv"
python="$venv/bin/python"
stamp="$root/complete"
base_python="${SGLANG_CLIENT_BASE_PYTHON:-python3}"
# What the client modules import beyond the standard library (read from sglang/__init__.py,
# sglang/utils.py, sglang/lang/ and sglang/bench_serving.py of 0.5.6); no torch among them.
client_packages="aiohttp datasets IPython numpy openai pillow pybase64 pydantic requests tqdm
transformers"
check='import sglang.bench_serving, sglang.lang.backend.runtime_endpoint, openai'
# The releases whose argument code the preflight's contract tests run, and where it goes.
src_versions="0.5.6 0.5.15 0.5.23"
src_root="$cache/sglang-src"

die() { echo "provision-sglang-client: $*" >&2; exit 1; }
warn() { echo "provision-sglang-client: $*" >&2; }

# A release's folder is stamped inside before it is moved into place: a stamped one is complete.
sources_finished() {
  local v
  for v in $src_versions; do
    [ -f "$src_root/$v/complete" ] || return 1
  done
}

# Download each missing release's wheel (its x86_64 CPython 3.11 build whatever this machine is:
# only its Python sources are used, and 0.5.11+ publish no pure-Python wheel), unpack sglang/srt/
# (compiled extensions left out: nothing imports them under stubs) plus sglang/__init__.py and
# sglang/version.py, and write a dist-info that answers importlib.metadata.version("sglang").
# Uses $python (the venv's, for pip and zipfile). Called in an || list, so set -e does not apply
# inside: every step that can fail returns 1 itself.
provision_sources() {
  local v tmp
  sources_finished && return 0
  mkdir -p "$src_root" || return 1
  if command -v flock >/dev/null 2>&1; then
    exec 8>"$src_root/.lock"
    flock 8
  fi
  for v in $src_versions; do
    [ -f "$src_root/$v/complete" ] && continue
    echo "unpacking sglang==$v's argument code into $src_root/$v (seconds)" >&2
    tmp=$(mktemp -d "$src_root/.tmp-$v.XXXXXX") || return 1
    if ! "$python" -m pip download --quiet --disable-pip-version-check --retries 2 --timeout 60 \
      --no-deps --only-binary=:all: --implementation cp --python-version 3.11 --abi cp311 \
      --platform manylinux_2_34_x86_64 --dest "$tmp/wheel" "sglang==$v" >&2; then
      rm -rf "$tmp"
      warn "'pip download sglang==$v' failed: is the package index reachable?"
      return 1
    fi
    if ! "$python" - "$tmp/wheel" "$tmp/src" "$v" >&2 <<'EOF'; then
import sys
import zipfile
from pathlib import Path

wheel_dir, out, version = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
(wheel,) = wheel_dir.glob(f"sglang-{version}-*.whl")
top = ("sglang/__init__.py", "sglang/version.py", "sglang/_version.py")
with zipfile.ZipFile(wheel) as archive:
    members = [
        name
        for name in archive.namelist()
        if (name.startswith("sglang/srt/") and not name.endswith((".so", ".pyd"))) or name in top
    ]
    if "sglang/srt/server_args.py" not in members:
        sys.exit(f"{wheel.name} has no sglang/srt/server_args.py")
    archive.extractall(out, members=members)
    metadata = archive.read(f"sglang-{version}.dist-info/METADATA").decode("utf-8", "replace")
# Name and Version for importlib.metadata; Requires-Python for the tests to check.
header = metadata.split("\n\n", 1)[0].splitlines()
python = [line for line in header if line.startswith("Requires-Python:")]
dist_info = out / f"sglang-{version}.dist-info"
dist_info.mkdir()
(dist_info / "METADATA").write_text(
    "\n".join(["Metadata-Version: 2.1", "Name: sglang", f"Version: {version}", *python]) + "\n",
    encoding="utf-8",
)
(out / "complete").write_text(f"{wheel.name}\n", encoding="utf-8")
EOF
      rm -rf "$tmp"
      warn "could not unpack sglang==$v's wheel (see above)"
      return 1
    fi
    if ! { rm -rf "${src_root:?}/$v" && mv "$tmp/src" "$src_root/$v"; }; then
      rm -rf "$tmp"
      return 1
    fi
    rm -rf "$tmp"
  done
}
sources_or_warn() {
  provision_sources || warn "no SGLang sources in $src_root: the preflight's contract tests" \
    "(tests/contract/test_preflight.py) will be skipped, or fail under" \
    "SPECDECODE_REQUIRE_SGLANG_CLIENT=1"
}

# Finished = stamped, and its interpreter still runs (the base python may have been removed).
finished() { [ -f "$stamp" ] && [ -x "$python" ] && "$python" -c 'import sys' 2>/dev/null; }
if finished; then
  sources_or_warn
  echo "$python"
  exit 0
fi

command -v "$base_python" >/dev/null 2>&1 \
  || die "no interpreter '$base_python' (\$SGLANG_CLIENT_BASE_PYTHON, default python3): set it"
"$base_python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || die "'$base_python' is $("$base_python" -V 2>&1); sglang $version needs Python 3.10" \
    "or newer: set SGLANG_CLIENT_BASE_PYTHON"

mkdir -p "$root"
# Two provisioners at once (scripts/test in two clones) would build into the same directory.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$root/.lock"
  flock 9
fi
if finished; then  # another provisioner finished while this one waited for the lock
  sources_or_warn
  echo "$python"
  exit 0
fi

start=$(date +%s)
echo "provisioning sglang==$version client code into $venv (about a minute)" >&2
# No stamp, or an interpreter that no longer runs: start again, stamp last.
rm -f "$stamp"
rm -rf "$venv"
"$base_python" -m venv "$venv" >&2 || die "'$base_python -m venv $venv' failed (is the venv module installed?)"
pip=("$python" -m pip install --quiet --disable-pip-version-check)
# The release the lock file holds: every package pinned and hashed, installed as listed (no
# resolution, no dependency of sglang's server). Any other release, or a Python the pinned
# versions have no files for: resolve, as below.
lock="$here/sglang-client-requirements.txt"
locked="$(sed -n 's/^sglang==\([^ ]*\).*/\1/p' "$lock" 2>/dev/null || true)"
if [ "$version" = "$locked" ] && "${pip[@]}" --no-deps --require-hashes -r "$lock" >&2; then
  echo "installed the pinned, hashed packages of $lock" >&2
else
  [ "$version" = "$locked" ] && warn "the hashed install of $lock failed (above): resolving instead"
  "${pip[@]}" --no-deps "sglang==$version" >&2 \
    || die "'pip install --no-deps sglang==$version' failed: is the package index reachable?"

  # The client packages at sglang's own pins (name==x) where it pins them, else the newest.
  requirements=$("$python" - "$client_packages" <<'EOF'
import re
import sys
from importlib.metadata import requires

wanted = {name.lower() for name in sys.argv[1].split()}
found = {}
for line in requires("sglang") or []:
    if ";" in line and "extra" in line.split(";", 1)[1]:
        continue  # optional extras (test, all, ...) are not what the base install asks for
    spec = line.split(";", 1)[0].strip()
    name = re.match(r"[A-Za-z0-9_.-]+", spec).group(0).lower()
    if name in wanted:
        found[name] = spec.replace(" ", "")
for name in sorted(wanted):
    print(found.get(name, name))
EOF
  ) || die "could not read sglang $version's requirements from its metadata"
  echo "$requirements" | grep -q '^openai==' \
    || die "sglang $version's metadata pins no openai version; got: $(echo $requirements)"
  echo "installing $(echo $requirements); pip will then list sglang's server dependencies" \
    "(torch, flashinfer, ...) as missing: they are left out on purpose" >&2
  # shellcheck disable=SC2086  # one requirement per word, on purpose
  "${pip[@]}" $requirements >&2 \
    || die "'pip install $(echo $requirements)' into $venv failed: is the package index reachable?"
fi

"$python" -c "$check" >&2 \
  || die "the venv at $venv cannot import the client modules ('$check' failed above); \
a package the client needs is missing from client_packages in $0"
"$python" -m pip freeze --disable-pip-version-check >"$stamp"
echo "provisioned in $(( $(date +%s) - start ))s" >&2
sources_or_warn
echo "$python"
