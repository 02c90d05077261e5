#!/usr/bin/env bash
# Provision a Python venv holding Apache Otava, for benchmarks/bench_nightly.py's "Otava" column:
# the benchmark sends its nightly series to benchmarks/otava/bridge.py run by this venv's
# interpreter, which analyses them with Otava's own code. A venv of its own because Otava pins
# numpy 2.2 (the plugin's environment has a newer one). Built once into a cache OUTSIDE the
# clone, like scripts/provision-sglang-client.sh; nothing is downloaded when the benchmark runs.
#
#   scripts/provision-otava.sh       # prints the venv's python as its last line
#
# Installs benchmarks/otava/requirements.txt with --no-deps --require-hashes: Otava and the two
# packages its analysis imports (numpy, scipy), at Otava's own pins; its service clients (BigQuery,
# Postgres, Slack, ...) are left out, nothing the analysis runs imports them. A Python the hashed
# files do not fit (they are CPython 3.11's) installs Otava --no-deps and resolves numpy and scipy
# from Otava's own metadata instead.
#
# Environment: SPECDECODE_CACHE (default ~/.cache/pytest-specdecode), OTAVA_BASE_PYTHON (the
# interpreter the venv is made from: python3; 3.10 to 3.14, as Otava requires).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

version=0.8.0
cache="${SPECDECODE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pytest-specdecode}"
root="$cache/otava/$version"
venv="$root/venv"
python="$venv/bin/python"
stamp="$root/complete"
base_python="${OTAVA_BASE_PYTHON:-python3}"
lock="$here/../benchmarks/otava/requirements.txt"
check='import otava.series, otava.analysis'

die() { echo "provision-otava: $*" >&2; exit 1; }

# Finished = stamped, and its interpreter still imports Otava (the base python may be gone).
finished() { [ -f "$stamp" ] && [ -x "$python" ] && "$python" -c "$check" 2>/dev/null; }
if finished; then
  echo "$python"
  exit 0
fi

command -v "$base_python" >/dev/null 2>&1 \
  || die "no interpreter '$base_python' (\$OTAVA_BASE_PYTHON, default python3): set it"
"$base_python" -c 'import sys; sys.exit(not (3, 10) <= sys.version_info[:2] < (3, 15))' \
  || die "'$base_python' is $("$base_python" -V 2>&1); apache-otava $version needs Python" \
    "3.10 to 3.14: set OTAVA_BASE_PYTHON"

mkdir -p "$root"
# Two provisioners at once (scripts/test in two clones) would build into the same directory.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$root/.lock"
  flock 9
fi
if finished; then  # another provisioner finished while this one waited for the lock
  echo "$python"
  exit 0
fi

start=$(date +%s)
echo "provisioning apache-otava==$version into $venv (seconds: three wheels, nothing resolved)" >&2
rm -f "$stamp"
rm -rf "$venv"
"$base_python" -m venv "$venv" >&2 || die "'$base_python -m venv $venv' failed (is the venv module installed?)"
pip=("$python" -m pip install --quiet --disable-pip-version-check)
if "${pip[@]}" --no-deps --require-hashes -r "$lock" >&2; then
  echo "installed the pinned, hashed packages of $lock" >&2
else
  echo "provision-otava: the hashed install of $lock failed (above; another Python than 3.11?):" \
    "resolving Otava's own pins of numpy and scipy instead" >&2
  "${pip[@]}" --no-deps "apache-otava==$version" >&2 \
    || die "'pip install --no-deps apache-otava==$version' failed: is the package index reachable?"
  # Otava's requirements on numpy and scipy, markers and all (pip drops those that do not apply).
  mapfile -t pins < <("$python" - <<'EOF'
import re
from importlib.metadata import requires

for line in requires("apache-otava") or []:
    if "extra ==" in line:
        continue
    if re.match(r"(numpy|scipy)\b", line.strip().lower()):
        print(line.strip())
EOF
  )
  [ "${#pins[@]}" -gt 0 ] || die "apache-otava $version's metadata names no numpy or scipy"
  echo "installing ${pins[*]}; pip will then list Otava's service clients (google-cloud-bigquery," \
    "pg8000, slack-sdk, ...) as missing: they are left out on purpose" >&2
  "${pip[@]}" "${pins[@]}" >&2 || die "'pip install ${pins[*]}' failed: is the package index reachable?"
fi
"$python" -c "$check" >&2 || die "the venv at $venv cannot import Otava's analysis ('$check' failed above)"
"$python" -m pip freeze --disable-pip-version-check >"$stamp"
echo "provisioned in $(( $(date +%s) - start ))s" >&2
echo "$python"
