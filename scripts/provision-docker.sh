#!/usr/bin/env bash
# Provision what the docker launcher's tests need, idempotently:
#
#   1. a Docker engine that answers. If none does: `apt-get install docker.io` (no systemd here, so
#      the package cannot start it) and start dockerd by hand in the background, without the
#      default bridge and without iptables; containers use `--network host`.
#   2. the base image local/debian-py:bookworm (Debian bookworm minbase + python3 + venv, made by
#      debootstrap and `docker import`; nothing is pulled from a registry), unless present.
#   3. the test image pytest-specdecode-sim:local (its Dockerfile is below, in this script): this
#      repository's package as a wheel, pip-installed with its dependencies, able to run
#      `python3 -m pytest_specdecode.sim ...`. It is labelled with a hash of the package's sources
#      and of this script; it is rebuilt only when that hash changes.
#
#      docker run --rm --network host pytest-specdecode-sim:local \
#          python3 -m pytest_specdecode.sim --model-path sim/model --port 30000
#
# Measured on the CI machine kind (Debian 12, 2 cores, root): fresh, about 2 minutes (docker.io
# ~20 s, debootstrap + import ~60 s, wheel + image build ~30 s); everything present, 0.2 s; after a
# change to the package's sources, ~6 s (the dependency layer is cached).
#
# The Debian packages (docker.io, debootstrap) come through scripts/provision-apt.sh, which
# records what they added to the machine for `scripts/test --clean`.
#
#   scripts/provision-docker.sh --stop    stop the engine this script started (the dockerd of its
#                                         pid file, and the containerd that dockerd started);
#                                         an engine it did not start is never touched
#
# Settings (environment):
#   DOCKER_HOST                       a remote engine (tcp://, ssh://) is used as it is, never
#                                     started; unix:///path starts dockerd on that socket
#   SPECDECODE_DOCKER_DATA_ROOT       dockerd's --data-root   (/var/lib/docker-specdecode)
#   SPECDECODE_DOCKERD_LOG            dockerd's log file      (/var/log/dockerd-specdecode.log)
#   SPECDECODE_DOCKER_PIDFILE         dockerd's pid file      (/var/run/dockerd-specdecode.pid)
#   SPECDECODE_SIM_IMAGE              the test image's tag    (pytest-specdecode-sim:local)
#   SPECDECODE_BASE_IMAGE             the base image's tag    (local/debian-py:bookworm)
#   SPECDECODE_DEBIAN_MIRROR          debootstrap's mirror    (http://deb.debian.org/debian)
#   SPECDECODE_PROVISION_FORCE=1      rebuild both images even if they look current
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
IMAGE="${SPECDECODE_SIM_IMAGE:-pytest-specdecode-sim:local}"
BASE_IMAGE="${SPECDECODE_BASE_IMAGE:-local/debian-py:bookworm}"
DATA_ROOT="${SPECDECODE_DOCKER_DATA_ROOT:-/var/lib/docker-specdecode}"
DOCKERD_LOG="${SPECDECODE_DOCKERD_LOG:-/var/log/dockerd-specdecode.log}"
DOCKERD_PIDFILE="${SPECDECODE_DOCKER_PIDFILE:-/var/run/dockerd-specdecode.pid}"
MIRROR="${SPECDECODE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
FORCE="${SPECDECODE_PROVISION_FORCE:-0}"
# What the base image holds; part of its label, so changing the list rebuilds it.
BASE_PACKAGES="python3,python3-venv,ca-certificates"
BASE_RECIPE="debootstrap --variant=minbase --include=${BASE_PACKAGES} bookworm"
HASH_LABEL="pytest-specdecode.source-hash"
RECIPE_LABEL="pytest-specdecode.base-recipe"

START_NS=$(date +%s%N)
elapsed() { echo "$(( ($(date +%s%N) - START_NS) / 1000000 ))" | awk '{printf "%.1f", $1 / 1000}'; }
say() { printf '[provision-docker %6ss] %s\n' "$(elapsed)" "$*"; }
die() { say "ERROR: $*" >&2; exit 1; }

# The dockerd of the pid file, if that process is alive and is a dockerd (a pid file left by a
# killed engine may name a pid the kernel gave to someone else since).
our_dockerd() {
    local pid
    [ -f "$DOCKERD_PIDFILE" ] || return 1
    pid="$(cat "$DOCKERD_PIDFILE" 2>/dev/null || true)"
    [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "--pidfile $DOCKERD_PIDFILE" || return 1
    echo "$pid"
}

if [ "${1:-}" = "--stop" ]; then
    if ! pid="$(our_dockerd)"; then
        say "no engine of this script runs (no live dockerd in $DOCKERD_PIDFILE): nothing to stop"
        exit 0
    fi
    # The containerd it started itself (when no system containerd ran), to wait for it too.
    children="$(ps -o pid= --ppid "$pid" 2>/dev/null | tr -s ' \n' ' ' || true)"
    say "stopping engine A (dockerd pid $pid): SIGTERM, SIGKILL after 60 s"
    kill -TERM "$pid"
    for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
        say "dockerd $pid still runs after 60 s: SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    for child in $children; do
        for _ in $(seq 1 50); do kill -0 "$child" 2>/dev/null || break; sleep 0.2; done
        kill -0 "$child" 2>/dev/null && kill -KILL "$child" 2>/dev/null || true
    done
    rm -f "$DOCKERD_PIDFILE"
    say "engine A stopped"
    exit 0
fi

WORK="$(mktemp -d /var/tmp/provision-docker.XXXXXX)"
cleanup() { rm -rf "$WORK"; }
trap cleanup EXIT

export DOCKER_BUILDKIT=0   # the engine (docker.io 20.10) has no buildx here; use the legacy builder

# -- 1. the engine -------------------------------------------------------------------------------

engine_answers() {
    command -v docker >/dev/null 2>&1 && timeout 10 docker version --format '{{.Server.Version}}' >/dev/null 2>&1
}

socket_path() {
    case "${DOCKER_HOST:-}" in
        "") echo /var/run/docker.sock ;;
        unix://*) echo "${DOCKER_HOST#unix://}" ;;
        *) return 1 ;;
    esac
}

start_dockerd() {
    local sock
    sock="$(socket_path)" || die "DOCKER_HOST=${DOCKER_HOST} does not answer, and this script starts only a local engine; start that engine, or unset DOCKER_HOST"
    if ! command -v dockerd >/dev/null 2>&1 && [ ! -x /usr/sbin/dockerd ]; then
        say "no dockerd: apt-get install docker.io"
        local t0=$SECONDS
        # The postinst says "policy-rc.d denied execution of start": expected, no systemd here.
        bash "$REPO/scripts/provision-apt.sh" docker.io || die "apt-get install docker.io failed"
        say "installed docker.io in $((SECONDS - t0)) s"
    fi
    if our_dockerd >/dev/null; then
        say "dockerd (pid $(our_dockerd)) is running but not answering yet; waiting for it"
    else
        rm -f "$DOCKERD_PIDFILE"
        mkdir -p "$DATA_ROOT" "$(dirname "$DOCKERD_LOG")" "$(dirname "$sock")"
        say "starting dockerd: data root $DATA_ROOT, socket $sock, log $DOCKERD_LOG"
        # setsid + nohup: the engine outlives this script and the shell that ran it.
        setsid nohup /usr/sbin/dockerd \
            --bridge=none --iptables=false --ip6tables=false \
            --data-root "$DATA_ROOT" \
            --host "unix://$sock" \
            --pidfile "$DOCKERD_PIDFILE" \
            >>"$DOCKERD_LOG" 2>&1 </dev/null &
    fi
    local deadline=$((SECONDS + 60))
    until engine_answers; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            tail -n 40 "$DOCKERD_LOG" >&2 || true
            die "dockerd did not answer within 60 s; its log is $DOCKERD_LOG (tail above)"
        fi
        if [ -f "$DOCKERD_PIDFILE" ] && ! kill -0 "$(cat "$DOCKERD_PIDFILE")" 2>/dev/null; then
            tail -n 40 "$DOCKERD_LOG" >&2 || true
            die "dockerd exited while starting; its log is $DOCKERD_LOG (tail above)"
        fi
        sleep 0.3
    done
}

if engine_answers; then
    say "Docker engine answers (server $(docker version --format '{{.Server.Version}}'))"
else
    start_dockerd
    say "Docker engine answers (server $(docker version --format '{{.Server.Version}}'))"
fi

label_of() {  # label_of IMAGE LABEL -> the label's value, or nothing if the image is missing
    docker image inspect --format "{{ index .Config.Labels \"$2\" }}" "$1" 2>/dev/null || true
}

# -- 2. the base image ---------------------------------------------------------------------------

BASE_RECIPE_HASH="$(printf '%s' "$BASE_RECIPE" | sha256sum | cut -c1-16)"
if [ "$FORCE" != 1 ] && [ "$(label_of "$BASE_IMAGE" "$RECIPE_LABEL")" = "$BASE_RECIPE_HASH" ]; then
    say "base image $BASE_IMAGE is present"
else
    if ! command -v debootstrap >/dev/null 2>&1; then
        say "apt-get install debootstrap"
        bash "$REPO/scripts/provision-apt.sh" debootstrap || die "apt-get install debootstrap failed"
    fi
    say "building $BASE_IMAGE: $BASE_RECIPE from $MIRROR (about 1-2 minutes)"
    t0=$SECONDS
    rootfs="$WORK/rootfs"
    debootstrap --variant=minbase --include="$BASE_PACKAGES" bookworm "$rootfs" "$MIRROR" \
        >"$WORK/debootstrap.log" 2>&1 \
        || { tail -n 30 "$WORK/debootstrap.log" >&2; die "debootstrap failed (log tail above)"; }
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
        "$rootfs"/debootstrap
    say "debootstrap done in $((SECONDS - t0)) s; importing"
    tar -C "$rootfs" -c . | docker import \
        --change "LABEL $RECIPE_LABEL=$BASE_RECIPE_HASH" \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["python3"]' \
        - "$BASE_IMAGE" >/dev/null
    rm -rf "$rootfs"
    say "base image $BASE_IMAGE built in $((SECONDS - t0)) s"
fi

# -- 3. the test image ---------------------------------------------------------------------------

# The test image's Dockerfile. It lives here, not in a top-level docker/ folder: a folder named
# `docker` in the repository root makes ruff sort `import docker` (the SDK) as first-party.
# The build context holds requirements.txt (read from the wheel's metadata), wheels/ (the
# package's wheel) and host-ca.crt (this machine's CA bundle, so pip in the build trusts what pip
# here trusts, a TLS-intercepting proxy's CA included). Legacy builder: no BuildKit syntax.
write_dockerfile() {
    cat <<'DOCKERFILE'
ARG BASE_IMAGE=local/debian-py:bookworm
FROM ${BASE_IMAGE}

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

RUN python3 -m venv /opt/venv

# Dependencies first, in their own layer: it is rebuilt only when the dependency list changes,
# so a change to the package's sources costs seconds, not a new download of scipy.
COPY host-ca.crt /tmp/host-ca.crt
COPY requirements.txt /tmp/requirements.txt
RUN PIP_CERT=/tmp/host-ca.crt pip install --progress-bar off -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

COPY wheels/ /tmp/wheels/
RUN pip install --progress-bar off --no-deps /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels /tmp/host-ca.crt \
    && python3 -c "import pytest_specdecode"

CMD ["python3", "-m", "pytest_specdecode.sim", "--help"]
DOCKERFILE
}

# The files that make up the package (what the wheel is built from), this script (which holds
# the Dockerfile) and the base image's id: if any of them changes, the image is rebuilt.
source_files() {
    (
        cd "$REPO"
        find pytest_specdecode -type f ! -path '*/__pycache__/*' \
            ! -name '*.py[co]' ! -name '*.sw[po]' ! -name '*~' ! -name '.#*'
        for f in pyproject.toml setup.py setup.cfg README.md LICENSE MANIFEST.in; do
            [ -f "$f" ] && echo "$f"
        done
        true
    ) | LC_ALL=C sort
}
BASE_ID="$(docker image inspect --format '{{.Id}}' "$BASE_IMAGE")"
SOURCE_HASH="$(
    {
        # (a file deleted between find and sha256sum, by someone editing the tree, is skipped)
        (cd "$REPO" && source_files | tr '\n' '\0' | xargs -0 sha256sum 2>/dev/null || true)
        sha256sum "$REPO/scripts/provision-docker.sh" | awk '{print $1}'
        echo "$BASE_ID"
    } | sha256sum | cut -c1-16
)"

if [ "$FORCE" != 1 ] && [ "$(label_of "$IMAGE" "$HASH_LABEL")" = "$SOURCE_HASH" ]; then
    say "image $IMAGE is current (source hash $SOURCE_HASH)"
else
    say "building $IMAGE (source hash $SOURCE_HASH)"
    t0=$SECONDS
    # Build the wheel from a copy of exactly the hashed files, so the build leaves nothing
    # (build/, *.egg-info) in the work tree other engineers are editing.
    mkdir -p "$WORK/src" "$WORK/context/wheels"
    (cd "$REPO" && source_files | tar -c -T - -f -) | tar -C "$WORK/src" -x -f -
    if ! python3 -m pip wheel --quiet --no-deps --no-build-isolation -w "$WORK/context/wheels" "$WORK/src" \
        >"$WORK/wheel.log" 2>&1; then
        # No setuptools/wheel on this Python: let pip fetch the build backend itself.
        python3 -m pip wheel --quiet --no-deps -w "$WORK/context/wheels" "$WORK/src" >"$WORK/wheel.log" 2>&1 \
            || { tail -n 30 "$WORK/wheel.log" >&2; die "building the package's wheel failed"; }
    fi
    wheel="$(ls "$WORK"/context/wheels/*.whl)"
    say "built $(basename "$wheel") in $((SECONDS - t0)) s"
    # The dependency list from the wheel's own metadata (extras left out): the image's
    # dependency layer is cached by docker as long as this list does not change.
    python3 - "$wheel" >"$WORK/context/requirements.txt" <<'PY'
import sys
import zipfile

with zipfile.ZipFile(sys.argv[1]) as whl:
    meta = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
    for line in whl.read(meta).decode().splitlines():
        if line.startswith("Requires-Dist:"):
            req = line.split(":", 1)[1].strip()
            if "extra ==" not in req:
                print(req)
PY
    write_dockerfile >"$WORK/context/Dockerfile"
    # pip inside the build must trust what pip on this host trusts (a TLS-intercepting proxy's
    # CA, for one): hand it the host's CA bundle.
    ca=""
    for c in "${PIP_CERT:-}" "${REQUESTS_CA_BUNDLE:-}" "${SSL_CERT_FILE:-}" /etc/ssl/certs/ca-certificates.crt; do
        if [ -n "$c" ] && [ -s "$c" ]; then ca="$c"; break; fi
    done
    [ -n "$ca" ] || die "no CA bundle found (looked at PIP_CERT, REQUESTS_CA_BUNDLE, SSL_CERT_FILE, /etc/ssl/certs/ca-certificates.crt)"
    cp "$ca" "$WORK/context/host-ca.crt"
    say "docker build --network host (pip installs the dependencies from PyPI; build log: $WORK/build.log)"
    if ! docker build --network host --force-rm \
        --build-arg "BASE_IMAGE=$BASE_IMAGE" \
        --label "$HASH_LABEL=$SOURCE_HASH" \
        --label "pytest-specdecode.image=sim" \
        -t "$IMAGE" "$WORK/context" >"$WORK/build.log" 2>&1; then
        tail -n 40 "$WORK/build.log" >&2
        trap - EXIT   # keep the build log for a look
        die "docker build failed (tail above; full log $WORK/build.log)"
    fi
    # The previous build of this tag is now untagged: drop it (only ours, by label).
    docker image prune --force --filter "label=pytest-specdecode.image=sim" >/dev/null || true
    say "image $IMAGE built in $((SECONDS - t0)) s"
fi

say "ready: $(docker image inspect --format '{{.RepoTags}} {{.Size}} bytes' "$IMAGE") (total $(elapsed) s)"
