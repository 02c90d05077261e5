#!/usr/bin/env bash
# The pytest / pytest-xdist / pytest-benchmark versions pyproject.toml admits, tested at both
# ends: the oldest it allows and the newest tested. Each pin set gets its own venv (cached in
# ~/.cache/pytest-specdecode/compat-*), and runs the tests that depend on pytest's and xdist's
# internals: grouping a profile's tests onto one worker (tests/e2e/test_lifecycle.py -k xdist,
# broken by pytest 9.2's structured node ids until the plugin repaired xdist's tag), the
# benchmark bridge, and the nights with --benchmark-json as docs/nightly-ci.md's script gives it
# (each kind of night's exit status, and a night that measured nothing, which pytest-benchmark
# would not write; tests/e2e/test_night_kinds_e2e.py, tests/e2e/test_nightly_doc.py). Called by
# scripts/test; prints each pin set's time.
#
# `scripts/test-compat.sh`: the venvs are installed, one after another, then the tests run.
# `--install` only installs, `--tests` only runs the tests (installing what is missing first).
# scripts/test installs early and waits for it before its main pytest run (the installs write
# the checkout's egg-info, which a pytest started in the checkout reads), and runs the tests
# beside the live-speed tests, at nice 19: they claim no speed.
# Every other package is held at the lock's version (scripts/test-requirements.txt, as
# constraints): only the pinned three differ from the main suite's environment.
#
# `scripts/test-compat.sh --newest`: the newest releases of pytest, pytest-xdist,
# pytest-benchmark, httpx and scipy (the rest of .[test] floats too) in a venv of its own, made
# anew each time, running the tests that lean on them; prints what broke, and always exits 0:
# it tells what `scripts/lock --upgrade` would bring, it does not gate.
set -euo pipefail
cd "$(dirname "$0")/.."

cache="${SPECDECODE_CACHE:-$HOME/.cache/pytest-specdecode}"
mkdir -p "$cache"
lock=scripts/test-requirements.txt
tests=(tests/e2e/test_lifecycle.py tests/e2e/test_outputs_e2e.py tests/e2e/test_night_kinds_e2e.py
  tests/e2e/test_nightly_doc.py -k "xdist or benchmark")

if [ "${1:-}" = "--newest" ]; then
  floating="pytest pytest-xdist pytest-benchmark httpx scipy"
  venv="$cache/compat-newest"
  log="$(mktemp)"
  trap 'rm -f "$log"' EXIT
  t0=$(date +%s)
  say() { echo "scripts/test-compat --newest: $*"; }
  rm -rf "$venv"
  # shellcheck disable=SC2086  # one package a word
  if ! { python3 -m venv "$venv" && flock "$cache/compat-install.lock" \
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade \
    -e '.[test]' $floating; } >"$log" 2>&1; then
    tail -n 20 "$log"
    say "the install of the newest releases failed (above); nothing was tested"
    exit 0
  fi
  # the newest versions against the lock's
  for name in $floating; do
    now="$("$venv/bin/python" -c 'import sys; from importlib.metadata import version
print(version(sys.argv[1]))' "$name")"
    locked="$(sed -n "s/^$name==\([^ ]*\).*/\1/p" "$lock")"
    if [ "$now" = "$locked" ]; then
      say "$name $now (as locked)"
    else
      say "$name $now (locked: $locked)"
    fi
  done
  # The tests that lean on these packages: xdist grouping, the pytest-benchmark bridge and its
  # --benchmark-json check, the statistics (scipy) and the HTTP client (httpx).
  rc=0
  "$venv/bin/python" -m pytest -q -p no:randomly -p no:cacheprovider -rfE \
    tests/e2e/test_lifecycle.py tests/e2e/test_outputs_e2e.py tests/e2e/test_night_kinds_e2e.py \
    tests/e2e/test_nightly_doc.py -k "xdist or benchmark or every_output or not e2e" \
    tests/unit/test_stats.py tests/unit/test_verdict.py tests/unit/test_client.py \
    tests/unit/test_benchmark_json.py tests/unit/test_settings.py >"$log" 2>&1 || rc=$?
  broke="$(sed -n 's/^\(FAILED\|ERROR\) \([^ ]*\).*/\2/p' "$log" | sort -u)"
  summary="$(tail -n 1 "$log" | sed 's/=//g; s/^ *//; s/ *$//')"
  if [ "$rc" = 0 ]; then
    say "nothing broke ($summary) in $(( $(date +%s) - t0 )) s"
  else
    # pytest's own output, then the list; a report, not a verdict: exit 0
    sed 's/^/  | /' "$log" | tail -n 60
    say "BROKE with the newest releases (pytest exit $rc: $summary):"
    if [ -n "$broke" ]; then
      echo "$broke" | sed 's/^/    /'
      say "their first error lines:"
      grep -E '^E ' "$log" | head -n 20 | sed 's/^/    /'
    fi
  fi
  exit 0
fi

mode="${1:-all}"
case "$mode" in
  all | --install | --tests) ;;
  *)
    echo "scripts/test-compat.sh: unknown argument '$mode': expected --install, --tests or" \
      "--newest, or none (install, then test)" >&2
    exit 2
    ;;
esac
pins=(
  "pytest==8.0.0 pytest-xdist==3.5.0 pytest-benchmark==4.0.0"  # the bounds in pyproject.toml
  "pytest==9.2.0 pytest-xdist==3.8.0 pytest-benchmark==5.3.1"  # the newest tested
)
# The lock's versions as constraints, less the three each pin set chooses (hashes dropped:
# constraints carry versions only).
constraints="$cache/compat-constraints.txt"
sed -n 's/^\([A-Za-z0-9_.-]*==[^ ]*\).*/\1/p' "$lock" \
  | grep -v -i -E '^(pytest|pytest-xdist|pytest-benchmark)==' >"$constraints.$$"
mv "$constraints.$$" "$constraints"
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
  want="$(pwd) $(cat pyproject.toml "$lock" | sha256sum | cut -c1-16) $spec"
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    # one install at a time: setuptools writes the checkout's egg-info while it builds; the
    # build backend first, at the lock's versions, then the checkout built with it (and
    # matplotlib: the nightly script of docs/nightly-ci.md draws the trend)
    (
      flock 9
      "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        -c "$constraints" setuptools wheel
      # shellcheck disable=SC2086  # the pins are separate words
      "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        --no-build-isolation -c "$constraints" -e . jsonschema matplotlib $spec
    ) 9>"$cache/compat-install.lock"
    echo "$want" >"$stamp"
  elif [ "$mode" = --tests ]; then
    return 0  # installed by the earlier --install: nothing to say
  fi
  echo "scripts/test-compat: $spec: installed in $(( $(date +%s) - t0 )) s" >&2
}
# one pin set's tests
check() {
  local spec=$1 t0 venv rc=0
  t0=$(date +%s)
  venv="$(venv_of "$spec")"
  "$venv/bin/python" -m pytest -q -p no:randomly -p no:cacheprovider "${tests[@]}" || rc=$?
  echo "scripts/test-compat: $spec: tests $(( $(date +%s) - t0 )) s" >&2
  return "$rc"
}

for spec in "${pins[@]}"; do
  install "$spec"
done
if [ "$mode" = --install ]; then
  exit 0
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
