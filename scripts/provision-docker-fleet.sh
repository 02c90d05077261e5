#!/usr/bin/env bash
# A fleet of two Docker engines on this machine, for the fleet tests (#14, item 4), idempotently:
#
#   1. engine A: the one scripts/provision-docker.sh provisions (DOCKER_HOST, or the default
#      socket unix:///var/run/docker.sock), with the base and test images; run first, unchanged.
#   2. TLS certificates for engine B (openssl, into its TLS directory): a CA, a server
#      certificate for 127.0.0.1 and localhost, and a client certificate in client/ as Docker's
#      DOCKER_CERT_PATH convention lays it out (ca.pem, cert.pem, key.pem). Kept while they are
#      all there, signed by that CA and good for another day; made again otherwise.
#   3. engine B: a second dockerd with its own socket, data root, exec root (its own managed
#      containerd, runc state and metrics socket), pid file and log, and the same networking as
#      engine A (no default bridge, no iptables: containers use `--network host`); it listens on
#      its unix socket and on tcp://127.0.0.1:PORT with --tlsverify (clients need a certificate
#      of the CA above), the fleet tests' host "reached over TLS". Reused when both answer (the
#      TLS one with the client certificate of step 2); started in the background (setsid +
#      nohup, it outlives this script) otherwise, after a graceful stop when it runs without
#      that TLS listener (an engine started by an older version of this script).
#   4. the test image pytest-specdecode-sim:local on engine B: `docker save` from A into
#      `docker load` on B, skipped when B already holds the same image id.
#
# Progress goes to stderr, as timed lines. On stdout, two lines for engine B's TLS endpoint and
# its client certificate directory, then, the last line, the two engines' DOCKER_HOST values
# separated by a space, for the fleet tests' SPECDECODE_FLEET_DOCKER_HOSTS:
#
#   SPECDECODE_FLEET_TLS_HOST=tcp://127.0.0.1:2376
#   SPECDECODE_FLEET_TLS_CERTS=/var/lib/docker-specdecode-b-tls/client
#   unix:///var/run/docker.sock unix:///var/run/specdecode-docker-b.sock
#
#   out="$(bash scripts/provision-docker-fleet.sh)"; hosts="$(tail -n 1 <<<"$out")"
#
# Engine B's failures, as the tests simulate them:
#
#   scripts/provision-docker-fleet.sh --stop      graceful: SIGTERM, dockerd stops its containers
#                                                 and its containerd; SIGKILL after 60 s
#   scripts/provision-docker-fleet.sh --kill      the engine crashes: SIGKILL to dockerd (its
#                                                 containerd dies with it, by the parent-death
#                                                 signal dockerd gives it). Its containers (and
#                                                 their servers) run on; the next start of the
#                                                 engine stops them (no live-restore), leaving
#                                                 them exited, not removed
#   scripts/provision-docker-fleet.sh --kill-all  the box goes down: SIGKILL to dockerd, its
#                                                 containerd, shims and every container's
#                                                 processes (the servers stop answering at once)
#   scripts/provision-docker-fleet.sh             starts it again (and reloads the image if the
#                                                 data root lost it)
#   scripts/provision-docker-fleet.sh --status    the lines above if both engines answer (B on
#                                                 its socket and over TLS), exit 1 otherwise;
#                                                 starts nothing
#
# Measured on the CI machine kind (Debian 12, 2 cores, root, docker.io 20.10), engine A and its
# images present: engine B fresh (empty data root) about 10 s (dockerd answers in 0.4 s, save |
# load of the 435 MB image 8-9 s); everything present, 0.25 s (provision-docker.sh's 0.1 s
# included); engine B started again after --kill, --kill-all or --stop, 0.6 s (its data root
# keeps the image); after a change to the package's sources, about 15 s (engine A's image is
# rebuilt, ~8 s, and copied again, ~6 s). --kill and --kill-all take about 2 s, --stop with a
# running container about 3 s. With the TLS listener (measured at the commit that added it, a
# CI run sharing the 2 cores): everything present 0.4 s; engine B started again after --kill,
# --kill-all or --stop 0.8-0.9 s; an engine B without the listener (an older script's) stopped
# and started again, or new certificates (EC P-256, made in 0.2 s), 2.4 s.
#
# Settings (environment); engine A's are provision-docker.sh's (DOCKER_HOST, SPECDECODE_*):
#   SPECDECODE_FLEET_SOCKET          engine B's unix socket   (/var/run/specdecode-docker-b.sock)
#   SPECDECODE_FLEET_DATA_ROOT       its --data-root          (/var/lib/docker-specdecode-b)
#   SPECDECODE_FLEET_EXEC_ROOT       its --exec-root          (/var/run/specdecode-docker-b)
#   SPECDECODE_FLEET_PIDFILE         its --pidfile            (/var/run/dockerd-specdecode-b.pid)
#   SPECDECODE_FLEET_DOCKERD_LOG     its log file             (/var/log/dockerd-specdecode-b.log)
#   SPECDECODE_FLEET_STOP_TIMEOUT    --stop's grace, seconds  (60)
#   SPECDECODE_FLEET_TLS_PORT        its TLS port on 127.0.0.1 (2376)
#   SPECDECODE_FLEET_TLS_DIR         its certificates: ca/ (the CA's key), server/, client/
#                                    (/var/lib/docker-specdecode-b-tls)
#   SPECDECODE_SIM_IMAGE             the image copied to B    (pytest-specdecode-sim:local)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
IMAGE="${SPECDECODE_SIM_IMAGE:-pytest-specdecode-sim:local}"
B_SOCK="${SPECDECODE_FLEET_SOCKET:-/var/run/specdecode-docker-b.sock}"
B_DATA_ROOT="${SPECDECODE_FLEET_DATA_ROOT:-/var/lib/docker-specdecode-b}"
B_EXEC_ROOT="${SPECDECODE_FLEET_EXEC_ROOT:-/var/run/specdecode-docker-b}"
B_PIDFILE="${SPECDECODE_FLEET_PIDFILE:-/var/run/dockerd-specdecode-b.pid}"
B_LOG="${SPECDECODE_FLEET_DOCKERD_LOG:-/var/log/dockerd-specdecode-b.log}"
STOP_TIMEOUT="${SPECDECODE_FLEET_STOP_TIMEOUT:-60}"
TLS_PORT="${SPECDECODE_FLEET_TLS_PORT:-2376}"
TLS_DIR="${SPECDECODE_FLEET_TLS_DIR:-/var/lib/docker-specdecode-b-tls}"
A_HOST="${DOCKER_HOST:-unix:///var/run/docker.sock}"
B_HOST="unix://$B_SOCK"
B_TLS_HOST="tcp://127.0.0.1:$TLS_PORT"
CLIENT_CERTS="$TLS_DIR/client"
SERVER_CERTS="$TLS_DIR/server"
# Engine B's containerd (started by its dockerd, under its exec root).
B_CONTAINERD_PIDFILE="$B_EXEC_ROOT/containerd/containerd.pid"
B_CONTAINERD_SOCK="$B_EXEC_ROOT/containerd/containerd.sock"

START_NS=$(date +%s%N)
elapsed() { echo "$(( ($(date +%s%N) - START_NS) / 1000000 ))" | awk '{printf "%.1f", $1 / 1000}'; }
say() { printf '[provision-docker-fleet %6ss] %s\n' "$(elapsed)" "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

usage() {
    sed -n '2,/^set -euo pipefail/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2
}

MODE=provision
case "${1:-}" in
    "") ;;
    --stop) MODE=stop ;;
    --kill) MODE=kill ;;
    --kill-all) MODE=kill-all ;;
    --status) MODE=status ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument: $1 (--stop, --kill, --kill-all, --status or --help)" ;;
esac
[ "$#" -le 1 ] || die "one argument at most (got: $*)"

case "$A_HOST" in
    "$B_HOST" | "unix://$(readlink -m "$B_SOCK")")
        die "DOCKER_HOST=$A_HOST is engine B's socket: point DOCKER_HOST at engine A, or unset it" ;;
esac

a_docker() { DOCKER_HOST="$A_HOST" docker "$@"; }
b_docker() { DOCKER_HOST="$B_HOST" docker "$@"; }

b_answers() {
    command -v docker >/dev/null 2>&1 \
        && timeout 10 docker -H "$B_HOST" version --format '{{.Server.Version}}' >/dev/null 2>&1
}

# Engine B over TCP, with the client certificate (and verifying its server certificate).
b_tls_answers() {
    command -v docker >/dev/null 2>&1 \
        && DOCKER_CERT_PATH="$CLIENT_CERTS" DOCKER_TLS_VERIFY=1 \
            timeout 10 docker -H "$B_TLS_HOST" version --format '{{.Server.Version}}' >/dev/null 2>&1
}

# What a run prints on stdout; the last line is what scripts/test has always read.
report() {
    echo "SPECDECODE_FLEET_TLS_HOST=$B_TLS_HOST"
    echo "SPECDECODE_FLEET_TLS_CERTS=$CLIENT_CERTS"
    echo "$A_HOST $B_HOST"
}

# The pid in PIDFILE if that process is alive and its command line contains NEEDLE (a pid file
# left by a killed engine may name a pid the kernel gave to someone else since).
live_pid() {  # live_pid PIDFILE NEEDLE
    local pid
    [ -f "$1" ] || return 1
    pid="$(cat "$1" 2>/dev/null || true)"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$2" || return 1
    echo "$pid"
}
dockerd_pid() { live_pid "$B_PIDFILE" "$B_SOCK"; }
containerd_pid() { live_pid "$B_CONTAINERD_PIDFILE" "$B_EXEC_ROOT"; }

# Engine B's containerd shims: their command line names its containerd socket.
shim_pids() {
    local pid
    for pid in $(pgrep -f -- "containerd-shim.*-address $B_CONTAINERD_SOCK" || true); do
        echo "$pid"
    done
}

wait_gone() {  # wait_gone SECONDS PID... : 0 when every pid has exited
    local deadline=$((SECONDS + $1)) pid alive
    shift
    while :; do
        alive=0
        for pid in "$@"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [ "$alive" = 0 ] && return 0
        [ "$SECONDS" -ge "$deadline" ] && return 1
        sleep 0.2
    done
}

# One provisioning or stop at a time (concurrent CI jobs, a test restarting the engine).
mkdir -p "$(dirname "$B_PIDFILE")"
exec 9>"$B_PIDFILE.lock"
flock -w 300 9 || die "another provision-docker-fleet.sh holds $B_PIDFILE.lock for 300 s"

# -- stopping and killing engine B ----------------------------------------------------------------

if [ "$MODE" = stop ]; then
    if pid="$(dockerd_pid)"; then
        say "stopping engine B (dockerd pid $pid, $B_HOST): SIGTERM, SIGKILL after $STOP_TIMEOUT s"
        kill -TERM "$pid"
        if ! wait_gone "$STOP_TIMEOUT" "$pid"; then
            say "dockerd $pid still runs after $STOP_TIMEOUT s: SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            wait_gone 10 "$pid" || die "dockerd $pid survived SIGKILL"
        fi
        say "engine B stopped"
    else
        say "engine B is not running (no live dockerd in $B_PIDFILE)"
    fi
    exit 0
fi

if [ "$MODE" = kill ] || [ "$MODE" = kill-all ]; then
    pids=()
    if pid="$(dockerd_pid)"; then pids+=("$pid"); fi
    if [ "$MODE" = kill-all ]; then
        if pid="$(containerd_pid)"; then pids+=("$pid"); fi
        for shim in $(shim_pids); do
            # A container's first process is a child of its shim; SIGKILL to it (docker-init,
            # PID 1 of the container's pid namespace) ends every process of that container.
            for child in $(pgrep -P "$shim" || true); do pids+=("$child"); done
            pids+=("$shim")
        done
    fi
    if [ "${#pids[@]}" = 0 ]; then
        say "engine B is not running: nothing to kill"
        exit 0
    fi
    say "$MODE: SIGKILL to ${pids[*]} (engine B, $B_HOST)"
    kill -KILL "${pids[@]}" 2>/dev/null || true
    wait_gone 10 "${pids[@]}" || die "some of ${pids[*]} survived SIGKILL"
    say "engine B killed"
    exit 0
fi

if [ "$MODE" = status ]; then
    if timeout 10 docker -H "$A_HOST" version >/dev/null 2>&1 && b_answers && b_tls_answers; then
        report
        exit 0
    fi
    say "engine A ($A_HOST) or engine B ($B_HOST, or over TLS at $B_TLS_HOST) does not answer"
    exit 1
fi

# -- 1. engine A and its images -------------------------------------------------------------------

say "engine A: scripts/provision-docker.sh (DOCKER_HOST=$A_HOST)"
# (9>&-: an engine it starts must not inherit, and hold forever, this script's lock)
DOCKER_HOST="$A_HOST" bash "$REPO/scripts/provision-docker.sh" >&2 9>&- \
    || die "scripts/provision-docker.sh failed (engine A, $A_HOST)"
A_ID="$(a_docker image inspect --format '{{.Id}}' "$IMAGE")" \
    || die "engine A has no image $IMAGE after scripts/provision-docker.sh"

# -- 2. engine B's TLS certificates ---------------------------------------------------------------

# Whether the certificates are all there, signed by the CA there, and good for another day.
certs_good() {
    local dir file
    for dir in "$SERVER_CERTS" "$CLIENT_CERTS"; do
        for file in ca.pem cert.pem key.pem; do [ -s "$dir/$file" ] || return 1; done
        cmp -s "$TLS_DIR/ca/ca.pem" "$dir/ca.pem" || return 1
        openssl verify -CAfile "$TLS_DIR/ca/ca.pem" "$dir/cert.pem" >/dev/null 2>&1 || return 1
        openssl x509 -checkend 86400 -noout -in "$dir/cert.pem" >/dev/null 2>&1 || return 1
    done
}

# A fresh CA, a server certificate for 127.0.0.1/localhost and a client certificate, made in a
# new directory that then replaces the old one (a half-made set is never left in place).
make_certs() {
    local new="$TLS_DIR.new.$$"
    rm -rf "$new"
    mkdir -p "$new/ca" "$new/server" "$new/client"
    chmod 755 "$new"
    chmod 700 "$new/ca"
    (
        set -e
        cd "$new"
        umask 077
        key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
        key ca/ca-key.pem
        openssl req -x509 -new -key ca/ca-key.pem -sha256 -days 3650 \
            -subj "/CN=pytest-specdecode fleet engine B test CA" \
            -addext "basicConstraints=critical,CA:TRUE" \
            -addext "keyUsage=critical,keyCertSign,cRLSign" \
            -out ca/ca.pem 2>/dev/null
        leaf() {  # leaf DIR CN EXTENSIONS
            key "$1/key.pem"
            openssl req -new -key "$1/key.pem" -subj "/CN=$2" -out "$1/req.csr" 2>/dev/null
            printf '%s\n' "basicConstraints=critical,CA:FALSE" \
                "keyUsage=critical,digitalSignature" "subjectKeyIdentifier=hash" \
                "authorityKeyIdentifier=keyid,issuer" "$3" >"$1/ext.cnf"
            openssl x509 -req -in "$1/req.csr" -CA ca/ca.pem -CAkey ca/ca-key.pem \
                -CAcreateserial -days 825 -sha256 -extfile "$1/ext.cnf" -out "$1/cert.pem" 2>/dev/null
            rm -f "$1/req.csr" "$1/ext.cnf"
            cp ca/ca.pem "$1/ca.pem"
        }
        leaf server 127.0.0.1 $'extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost'
        leaf client pytest-specdecode-fleet-client "extendedKeyUsage=clientAuth"
        chmod 644 ca/ca.pem server/ca.pem server/cert.pem client/ca.pem client/cert.pem
        chmod 755 server client
    ) || { rm -rf "$new"; die "openssl could not make engine B's certificates"; }
    rm -rf "$TLS_DIR.old.$$"
    [ -e "$TLS_DIR" ] && mv "$TLS_DIR" "$TLS_DIR.old.$$"
    mv "$new" "$TLS_DIR"
    rm -rf "$TLS_DIR.old.$$"
}

command -v openssl >/dev/null 2>&1 || die "openssl is needed for engine B's TLS certificates (apt-get install openssl)"
if certs_good; then
    say "engine B's TLS certificates are in $TLS_DIR (client: $CLIENT_CERTS)"
else
    say "making engine B's TLS certificates in $TLS_DIR (a CA, a server certificate for 127.0.0.1, a client certificate)"
    make_certs
    say "engine B's TLS certificates made (client: $CLIENT_CERTS)"
fi

# -- 3. engine B ----------------------------------------------------------------------------------

if b_answers && ! b_tls_answers && pid="$(dockerd_pid)"; then
    # An engine without this TLS listener (started by an older version of this script), or one
    # with certificates made before the ones now in $TLS_DIR: it starts again with them.
    say "engine B (dockerd pid $pid) does not answer over TLS at $B_TLS_HOST: stopping it to start it with its TLS listener"
    kill -TERM "$pid"
    if ! wait_gone "$STOP_TIMEOUT" "$pid"; then
        kill -KILL "$pid" 2>/dev/null || true
        wait_gone 10 "$pid" || die "dockerd $pid survived SIGKILL"
    fi
fi

if b_answers && b_tls_answers; then
    say "engine B answers ($B_HOST and $B_TLS_HOST, server $(b_docker version --format '{{.Server.Version}}'))"
elif b_answers && ! dockerd_pid >/dev/null; then
    die "an engine answers on $B_HOST but not over TLS at $B_TLS_HOST, and it is not the dockerd of $B_PIDFILE: stop it, or set SPECDECODE_FLEET_SOCKET to another socket"
else
    if pid="$(dockerd_pid)"; then
        say "engine B's dockerd (pid $pid) is running but not answering yet; waiting for it"
    else
        rm -f "$B_PIDFILE"
        mkdir -p "$B_DATA_ROOT" "$B_EXEC_ROOT" "$(dirname "$B_LOG")" "$(dirname "$B_SOCK")"
        say "starting engine B: socket $B_SOCK and $B_TLS_HOST (TLS), data root $B_DATA_ROOT, exec root $B_EXEC_ROOT, log $B_LOG"
        # The networking flags are engine A's (scripts/provision-docker.sh): no default bridge,
        # no iptables; containers on either engine use host networking, so the two engines'
        # servers share this machine's ports (the plugin picks free ones).
        setsid nohup /usr/sbin/dockerd \
            --bridge=none --iptables=false --ip6tables=false \
            --data-root "$B_DATA_ROOT" \
            --exec-root "$B_EXEC_ROOT" \
            --host "$B_HOST" \
            --host "$B_TLS_HOST" \
            --tlsverify \
            --tlscacert "$SERVER_CERTS/ca.pem" \
            --tlscert "$SERVER_CERTS/cert.pem" \
            --tlskey "$SERVER_CERTS/key.pem" \
            --pidfile "$B_PIDFILE" \
            >>"$B_LOG" 2>&1 </dev/null 9>&- &
    fi
    deadline=$((SECONDS + 60))
    until b_answers && b_tls_answers; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            tail -n 40 "$B_LOG" >&2 || true
            die "engine B did not answer within 60 s; its log is $B_LOG (tail above)"
        fi
        if [ -f "$B_PIDFILE" ] && ! dockerd_pid >/dev/null; then
            tail -n 40 "$B_LOG" >&2 || true
            die "engine B's dockerd exited while starting; its log is $B_LOG (tail above)"
        fi
        sleep 0.3
    done
    say "engine B answers ($B_HOST and $B_TLS_HOST, server $(b_docker version --format '{{.Server.Version}}'), dockerd pid $(dockerd_pid || echo '?'))"
fi

# -- 4. the test image on engine B ----------------------------------------------------------------

B_ID="$(b_docker image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)"
if [ "$B_ID" = "$A_ID" ]; then
    say "engine B holds $IMAGE (${A_ID#sha256:} as on engine A)"
else
    say "copying $IMAGE (${A_ID#sha256:}) from engine A to engine B: docker save | docker load${B_ID:+ (B had ${B_ID#sha256:})}"
    t0=$SECONDS
    a_docker save "$IMAGE" | b_docker load --quiet >/dev/null \
        || die "docker save $IMAGE (engine A) | docker load (engine B) failed"
    B_ID="$(b_docker image inspect --format '{{.Id}}' "$IMAGE")"
    [ "$B_ID" = "$A_ID" ] || die "engine B's $IMAGE is ${B_ID#sha256:} after the load, engine A's ${A_ID#sha256:}"
    # The previous copy of this tag, now untagged: drop it (only ours, by label).
    b_docker image prune --force --filter "label=pytest-specdecode.image=sim" >/dev/null || true
    say "copied in $((SECONDS - t0)) s"
fi

say "ready: engine A $A_HOST, engine B $B_HOST (and $B_TLS_HOST over TLS, client certificates in $CLIENT_CERTS), both with $IMAGE (total $(elapsed) s)"
report
