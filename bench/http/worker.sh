# Sourced by the HTTP bench scripts: one worker on a fresh ledger, stopped on exit.
#
#   start_worker BIN TMP    starts `BIN/inbox-worker serve` on TMP/ledger and a free
#                           loopback port; sets WORKER_PID and ADDR (host:port)
#   stop_worker             SIGTERM, and waits for it to finish what is in flight
#
# The script that sources it owns TMP and its removal.

WORKER_PID=""
ADDR=""

start_worker() {
    local bin=$1 tmp=$2
    "$bin/inbox-worker" serve --db "$tmp/ledger" --listen 127.0.0.1:0 \
        >"$tmp/worker.out" 2>"$tmp/worker.err" &
    WORKER_PID=$!
    for _ in $(seq 1 200); do
        ADDR=$(sed -n 's|^listening on http://||p' "$tmp/worker.out" | head -n1)
        [[ -n "$ADDR" ]] && return 0
        kill -0 "$WORKER_PID" 2>/dev/null || { cat "$tmp/worker.err" >&2; exit 1; }
        sleep 0.05
    done
    echo "worker did not start" >&2
    exit 1
}

stop_worker() {
    if [[ -n "$WORKER_PID" ]] && kill -0 "$WORKER_PID" 2>/dev/null; then
        kill -TERM "$WORKER_PID" 2>/dev/null || true
        wait "$WORKER_PID" 2>/dev/null || true
    fi
}
