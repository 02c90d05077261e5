#!/usr/bin/env bash
# The pytest / pytest-xdist / pytest-benchmark versions pyproject.toml admits, tested at both
# ends: the oldest it allows and the newest tested. Each pin set gets its own venv (cached in
# ~/.cache/pytest-specdecode/compat-*), and runs the tests that depend on pytest's and xdist's
# internals: grouping a profile's tests onto one worker (tests/e2e/test_lifecycle.py -k xdist,
# broken by pytest 9.2's structured node ids until the plugin repaired xdist's tag) and the
# benchmark bridge. Called by scripts/test; prints each pin set's time.
#
# `scripts/test-compat.sh [INSTALLED_FLAG]`: the venvs are installed first, one after another,
# then FLAG is created, then the tests run. scripts/test starts its main pytest run at the flag:
# the installs write the checkout's egg-info, which a pytest started in the checkout reads.
set -euo pipefail
cd "$(dirname "$0")/.."

cache="${SPECDECODE_CACHE:-$HOME/.cache/pytest-specdecode}"
installed_flag="${1:-}"
pins=(
  "pytest==8.0.0 pytest-xdist==3.5.0 pytest-benchmark==4.0.0"  # the bounds in pyproject.toml
  "pytest==9.2.0 pytest-xdist==3.8.0 pytest-benchmark==5.2.3"  # the newest tested
)
venv_of() { echo "$cache/compat-$(echo "$1" | sha256sum | cut -c1-12)"; }
# one pin set's venv and install (skipped when already there)
install() {
  local spec=$1 t0 venv stamp want
  t0=$(date +%s)
  venv="$(venv_of "$spec")"
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
  fi
  # The install is skipped when this venv already holds this checkout (same path, same
  # pyproject.toml) with these pins: on a warm cache that is most of a pin set's setup time.
  stamp="$venv/.specdecode-installed"
  want="$(pwd) $(sha256sum pyproject.toml | cut -c1-16) $spec"
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    # one install at a time: setuptools writes the checkout's egg-info while it builds
    # shellcheck disable=SC2086  # the pins are separate words
    flock "$cache/compat-install.lock" \
      "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e . jsonschema $spec
    echo "$want" >"$stamp"
  fi
  echo "scripts/test-compat: $spec: installed in $(( $(date +%s) - t0 )) s" >&2
}
# one pin set's tests
check() {
  local spec=$1 t0 venv rc=0
  t0=$(date +%s)
  venv="$(venv_of "$spec")"
  "$venv/bin/python" -m pytest -q -p no:randomly -p no:cacheprovider \
    tests/e2e/test_lifecycle.py tests/e2e/test_outputs_e2e.py -k "xdist or benchmark" || rc=$?
  echo "scripts/test-compat: $spec: tests $(( $(date +%s) - t0 )) s" >&2
  return "$rc"
}

for spec in "${pins[@]}"; do
  install "$spec"
done
if [ -n "$installed_flag" ]; then
  touch "$installed_flag"
fi

# The pin sets side by side (their tests mostly wait on servers), each one's output shown whole
# when it is done.
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
pids=()
for i in "${!pins[@]}"; do
  check "${pins[$i]}" >"$logs/$i.log" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!pins[@]}"; do
  if ! wait "${pids[$i]}"; then
    echo "scripts/test-compat: FAILED with ${pins[$i]}" >>"$logs/$i.log"
    status=1
  fi
  cat "$logs/$i.log" >&2
done
# the editable install above pointed the package at this checkout from other venvs; the main
# interpreter's own install is left as it was
exit $status
