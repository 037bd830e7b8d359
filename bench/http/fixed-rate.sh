#!/usr/bin/env bash
# One fixed-rate point of the HTTP worker, with where its CPU and wake-ups go. From the
# workspace root:
#
#   bench/http/fixed-rate.sh [RATE] [DURATION]      # defaults: 10000 new keys/s, 8 s
#
# Builds inbox-worker and idem-bench in release, starts `inbox-worker serve` on a fresh
# ledger in a temporary folder, seeds it (100 accounts, 10,000 done keys), warms it for
# 3 s at the rate, then measures RATE new-key withdrawals per second over 64 keep-alive
# connections for DURATION seconds. Prints the generator's latency figures (from each
# request's scheduled send, from the actual send, and the send's lag), the worker's CPU
# (cores) and its context switches per second by thread group, read from /proc.
#
# Environment: MODE (new-key; or replay), BIN (a folder with both binaries: compare two
# builds side by side without rebuilding), CARGO_TARGET_DIR, and anything the worker
# reads (e.g. TOKIO_WORKER_THREADS).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
RATE=${1:-10000}
DURATION=${2:-8}
MODE=${MODE:-new-key}
if [[ -z "${BIN:-}" ]]; then
    (cd "$ROOT" && cargo build --release -q -p inbox-worker -p idem-bench)
    BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release
fi

TMP=$(mktemp -d -t idem-fixed-XXXXXX)
# shellcheck source=bench/http/worker.sh
source "$ROOT/bench/http/worker.sh"
cleanup() {
    stop_worker
    rm -rf "$TMP"
}
trap cleanup EXIT
start_worker "$BIN" "$TMP"

LOAD=("$BIN/idem-bench" load --addr "$ADDR")
"${LOAD[@]}" seed >/dev/null
"${LOAD[@]}" run --mode "$MODE" --duration 3 --rate "$RATE" --tag warm >/dev/null

cpu() { awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$WORKER_PID/stat"; }
# voluntary and involuntary switches per thread group (sled-io-0..6 count as sled-io)
switches() {
    for t in /proc/"$WORKER_PID"/task/*; do
        printf '%s ' "$(tr ' ' _ <"$t/comm")"
        awk '/^voluntary_ctxt/ { v = $2 } /^nonvoluntary_ctxt/ { n = $2 } END { print v, n }' "$t/status"
    done | awk '{ g = $1; sub(/-[0-9]+$/, "", g); v[g] += $2; n[g] += $3 } END { for (g in v) print g, v[g], n[g] }' | sort
}
switches >"$TMP/sw0"; cpu0=$(cpu)
out=$("${LOAD[@]}" run --mode "$MODE" --duration "$DURATION" --rate "$RATE" --tag measured)
cpu1=$(cpu); switches >"$TMP/sw1"

get() { printf '%s\n' "$out" | sed -n "s/^$1=//p"; }
ms() { awk -v u="$1" 'BEGIN { printf "%.2f", u / 1000 }'; }
echo "$MODE at $RATE/s for ${DURATION}s: $(get rps) req/s, non-201 $(get non201), errors $(get errors)"
echo "latency from the schedule: p50 $(ms "$(get p50_us)") ms, p99 $(ms "$(get p99_us)") ms, max $(ms "$(get max_us)") ms"
echo "latency from the send: p99 $(ms "$(get p99_from_send_us)") ms; send lag p99 $(ms "$(get p99_send_lag_us)") ms"
echo "worker CPU: $(awk -v t=$((cpu1 - cpu0)) -v d="$DURATION" 'BEGIN { printf "%.2f", t / 100 / d }') cores (clock ticks are 1/100 s)"
echo "worker context switches per second, by thread group:"
join "$TMP/sw0" "$TMP/sw1" | awk -v d="$DURATION" '
    { v = ($4 - $2) / d; n = ($5 - $3) / d; tv += v; tn += n
      printf "  %-18s voluntary %8.0f  involuntary %7.0f\n", $1, v, n }
    END { printf "  %-18s voluntary %8.0f  involuntary %7.0f\n", "all", tv, tn }'
