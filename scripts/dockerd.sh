#!/usr/bin/env bash
# Start, stop or query a local Docker engine for the Docker sandbox backend (tests and CI).
#
# Usage: scripts/dockerd.sh [--install] start|stop|status|restart
#
# Invariants:
#   * `start` is idempotent: if any engine already answers `docker info` it does nothing and exits 0;
#     otherwise it launches `dockerd --bridge=none --iptables=false` in the background (log file +
#     pidfile under $CLAWGYM_DOCKERD_DIR) and exits 0 only once `docker info` answers (60 s timeout).
#     Containers never need a network here (the sandbox uses network_mode=none), so no bridge and
#     no iptables rules are created. If the default storage driver cannot start (e.g. overlay on
#     overlay inside a container), it retries once with `--storage-driver=vfs`.
#   * `stop` only stops the dockerd this script started (the pid in its pidfile); an engine started
#     some other way (systemd, Docker Desktop) is never touched.
#   * Nothing is installed unless `--install` is given (then: apt-get install -y docker.io).
# Exit codes: 0 ok / running, 1 failure, 3 `status` found no engine.
set -euo pipefail

STATE_DIR="${CLAWGYM_DOCKERD_DIR:-/var/run/clawgym-dockerd}"
PIDFILE="$STATE_DIR/dockerd.pid"
LOGFILE="${CLAWGYM_DOCKERD_LOG:-$STATE_DIR/dockerd.log}"
WAIT_S="${CLAWGYM_DOCKERD_WAIT_S:-60}"
INSTALL=0

say() { echo "dockerd.sh: $*" >&2; }

engine_answers() {
    command -v docker >/dev/null 2>&1 && timeout 10 docker info >/dev/null 2>&1
}

our_pid() {
    # Prints the pid of the dockerd we started, if it is still alive.
    [[ -f "$PIDFILE" ]] || return 1
    local pid
    pid="$(cat "$PIDFILE" 2>/dev/null || true)"
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

install_engine() {
    if command -v dockerd >/dev/null 2>&1; then return 0; fi
    say "installing docker.io (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq docker.io >/dev/null
}

launch() {
    # launch EXTRA_FLAGS... : start dockerd in the background and wait for it; 0 when it answers.
    : > "$LOGFILE"
    # setsid: the daemon must not die with the shell (or pytest) that started it.
    setsid dockerd --bridge=none --iptables=false --ip6tables=false \
        --pidfile "$STATE_DIR/dockerd.internal.pid" "$@" >>"$LOGFILE" 2>&1 < /dev/null &
    local pid=$!
    echo "$pid" > "$PIDFILE"
    local waited=0
    while (( waited < WAIT_S * 2 )); do
        if engine_answers; then return 0; fi
        if ! kill -0 "$pid" 2>/dev/null; then
            say "dockerd exited during start-up; last log lines:"
            tail -n 15 "$LOGFILE" >&2 || true
            rm -f "$PIDFILE"
            return 1
        fi
        sleep 0.5
        waited=$((waited + 1))
    done
    say "dockerd did not answer within ${WAIT_S}s (log: $LOGFILE)"
    return 2
}

start() {
    if engine_answers; then say "a Docker engine already answers"; return 0; fi
    if (( INSTALL )); then install_engine; fi
    if ! command -v dockerd >/dev/null 2>&1; then
        say "dockerd is not installed; run: scripts/dockerd.sh --install start  (or apt-get install -y docker.io)"
        return 1
    fi
    if ! command -v docker >/dev/null 2>&1; then
        say "the docker CLI is missing; run: apt-get install -y docker.io"
        return 1
    fi
    if [[ "$(id -u)" != 0 ]]; then say "starting dockerd needs root"; return 1; fi
    mkdir -p "$STATE_DIR"
    if our_pid >/dev/null; then
        say "our dockerd (pid $(our_pid)) is alive but not answering yet; waiting"
        local waited=0
        while (( waited < WAIT_S )); do engine_answers && return 0; sleep 1; waited=$((waited + 1)); done
        say "it still does not answer; try: scripts/dockerd.sh restart (log: $LOGFILE)"
        return 1
    fi
    local rc=0
    launch ${CLAWGYM_DOCKERD_FLAGS:-} || rc=$?
    if (( rc == 1 )) && grep -qiE "storage.driver|graphdriver|overlay" "$LOGFILE"; then
        say "default storage driver failed; retrying with --storage-driver=vfs"
        rc=0
        launch --storage-driver=vfs ${CLAWGYM_DOCKERD_FLAGS:-} || rc=$?
    fi
    if (( rc != 0 )); then
        stop >/dev/null 2>&1 || true
        return 1
    fi
    say "dockerd is up (pid $(cat "$PIDFILE"), log $LOGFILE)"
}

stop() {
    local pid
    if ! pid="$(our_pid)"; then
        rm -f "$PIDFILE"
        say "no dockerd started by this script is running"
        return 0
    fi
    kill -TERM "$pid" 2>/dev/null || true
    local waited=0
    while kill -0 "$pid" 2>/dev/null && (( waited < 60 )); do sleep 0.5; waited=$((waited + 1)); done
    if kill -0 "$pid" 2>/dev/null; then
        say "dockerd (pid $pid) ignored SIGTERM for 30 s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$PIDFILE"
    say "dockerd stopped"
}

status() {
    if engine_answers; then
        if pid="$(our_pid)"; then echo "running (started by this script, pid $pid)"; else echo "running"; fi
        return 0
    fi
    if pid="$(our_pid)"; then echo "starting or stuck (pid $pid, not answering)"; return 3; fi
    echo "not running"
    return 3
}

cmd=""
for arg in "$@"; do
    case "$arg" in
        --install) INSTALL=1 ;;
        start|stop|status|restart) cmd="$arg" ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) say "unknown argument: $arg"; exit 1 ;;
    esac
done
case "$cmd" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    restart) stop; start ;;
    *) say "usage: scripts/dockerd.sh [--install] start|stop|status|restart"; exit 1 ;;
esac
