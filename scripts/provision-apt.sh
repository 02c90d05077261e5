#!/usr/bin/env bash
# Debian packages for scripts/test's services (docker.io and debootstrap for the Docker engines
# and the sim's base image, chromium for the dashboard's browser test), installed with apt-get
# where missing, and recorded: every package an install added to the machine, the named ones and
# what they pulled in, goes to a list, so that scripts/test can say what it installed and
# `scripts/test --clean` can purge exactly those (and nothing that was there before).
#
#   scripts/provision-apt.sh PACKAGE...   install what is missing (nothing to do: no apt at all)
#   scripts/provision-apt.sh --list       the packages scripts/test's runs added, one a line
#   scripts/provision-apt.sh --purge      purge them (only when apt would remove nothing else)
#
# The list: $SPECDECODE_CACHE/scripts-test/apt-installed (default
# ${XDG_CACHE_HOME:-~/.cache}/pytest-specdecode/scripts-test/apt-installed). Packages installed
# by a scripts/test older than this list are not in it: docker.io, debootstrap, chromium and what
# they pulled in (/var/log/dpkg.log says when).
set -euo pipefail

cache="${SPECDECODE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pytest-specdecode}"
state="$cache/scripts-test"
record="$state/apt-installed"
say() { echo "provision-apt: $*" >&2; }

present() {  # the packages installed now, one a line, sorted
  dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' 2>/dev/null | awk '$1 == "ii" {print $2}' \
    | LC_ALL=C sort -u
}
recorded() {  # the recorded packages still installed
  [ -s "$record" ] || return 0
  LC_ALL=C comm -12 <(LC_ALL=C sort -u "$record") <(present)
}

case "${1:-}" in
  "")
    say "usage: scripts/provision-apt.sh PACKAGE... | --list | --purge"
    exit 2
    ;;
  --list)
    recorded
    exit 0
    ;;
  --purge)
    mapfile -t ours < <(recorded)
    if [ "${#ours[@]}" = 0 ]; then
      say "no package that scripts/test installed is installed"
      exit 0
    fi
    # What apt would purge: only ours, or nothing (a package of yours that needs one of them).
    mapfile -t would < <(apt-get -s purge "${ours[@]}" 2>/dev/null | sed -n 's/^Purg \([^ ]*\).*/\1/p')
    mapfile -t others < <(LC_ALL=C comm -23 <(printf '%s\n' "${would[@]}" | LC_ALL=C sort -u) \
      <(printf '%s\n' "${ours[@]}" | LC_ALL=C sort -u))
    if [ "${#others[@]}" != 0 ] && [ -n "${others[0]}" ]; then
      say "not purged: apt would also remove ${others[*]}, which scripts/test did not install" \
        "(they need what it did). To purge anyway: apt-get purge ${ours[*]}"
      exit 1
    fi
    say "purging ${#ours[@]} packages that scripts/test installed: ${ours[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq -o DPkg::Lock::Timeout=600 "${ours[@]}" \
      >/dev/null
    rm -f "$record"
    exit 0
    ;;
esac

missing=()
for package in "$@"; do
  dpkg-query -W -f='${db:Status-Abbrev}' "$package" 2>/dev/null | grep -q '^ii' \
    || missing+=("$package")
done
[ "${#missing[@]}" = 0 ] && exit 0
command -v apt-get >/dev/null 2>&1 || { say "no apt-get here to install ${missing[*]}"; exit 1; }

# One install of ours at a time, so that what it adds is told apart from the next one's.
mkdir -p "$state"
exec 9>"$state/apt.lock"
flock -w 900 9 || { say "another provision-apt.sh held $state/apt.lock for 900 s"; exit 1; }
before="$(mktemp)"
log="$(mktemp)"
trap 'rm -f "$before" "$log"' EXIT
present >"$before"
export DEBIAN_FRONTEND=noninteractive
apt=(apt-get -y -qq -o DPkg::Lock::Timeout=600)
say "apt-get install ${missing[*]}"
if ! "${apt[@]}" install "${missing[@]}" >"$log" 2>&1; then
  # The package lists may be missing or stale (a fresh machine): update them once, try again.
  "${apt[@]}" update >>"$log" 2>&1 && "${apt[@]}" install "${missing[@]}" >>"$log" 2>&1 || {
    tail -n 30 "$log" >&2
    say "apt-get install ${missing[*]} failed (log above)"
    # what a half-done install added is ours all the same
    LC_ALL=C comm -13 "$before" <(present) >>"$record"
    exit 1
  }
fi
added="$(LC_ALL=C comm -13 "$before" <(present))"
printf '%s\n' "$added" | sed '/^$/d' >>"$record"
say "installed ${missing[*]}: $(printf '%s\n' "$added" | sed '/^$/d' | wc -l) packages added" \
  "(recorded in $record; scripts/test --clean purges them)"
