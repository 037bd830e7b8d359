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
# Environment: MODE (new-key; replay; or both: replays, then new keys, at the same rate,
# then the disk's floor at that rate, `idem-bench sync`: bare group commit of 4 KiB
# `pwrite` + `fdatasync` on the same file system; with the ratios each reads against the
# replays, so the goals' ratios stand beside the best a new key could do), BIN (a folder
# with both binaries: compare two builds side by side without rebuilding),
# CARGO_TARGET_DIR, and anything the worker reads (e.g. TOKIO_WORKER_THREADS).
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
cpu() { awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$WORKER_PID/stat"; }
# voluntary and involuntary switches per thread group (sled-io-0..6 count as sled-io)
switches() {
    for t in /proc/"$WORKER_PID"/task/*; do
        printf '%s ' "$(tr ' ' _ <"$t/comm")"
        awk '/^voluntary_ctxt/ { v = $2 } /^nonvoluntary_ctxt/ { n = $2 } END { print v, n }' "$t/status"
    done | awk '{ g = $1; sub(/-[0-9]+$/, "", g); v[g] += $2; n[g] += $3 } END { for (g in v) print g, v[g], n[g] }' | sort
}
ms() { awk -v u="$1" 'BEGIN { printf "%.2f", u / 1000 }'; }
# journal syncs so far (batches: one journal write and sync each)
syncs() { curl -sf "http://$ADDR/metrics" | awk '$1 == "idem_commit_batches_total" { print $2 }'; }

# measure MODE: warms for 3 s, measures for DURATION, prints the figures, and leaves the
# p99 from the send (µs) in P99_SEND, the worker's CPU (cores) in CORES and its journal
# syncs a second in SYNCS.
measure() {
    local mode=$1 out cpu0 cpu1 syncs0 syncs1
    "${LOAD[@]}" run --mode "$mode" --duration 3 --rate "$RATE" --tag warm >/dev/null
    switches >"$TMP/sw0"; cpu0=$(cpu); syncs0=$(syncs)
    out=$("${LOAD[@]}" run --mode "$mode" --duration "$DURATION" --rate "$RATE" --tag measured)
    cpu1=$(cpu); syncs1=$(syncs); switches >"$TMP/sw1"
    get() { printf '%s\n' "$out" | sed -n "s/^$1=//p"; }
    P99_SEND=$(get p99_from_send_us)
    CORES=$(awk -v t=$((cpu1 - cpu0)) -v d="$DURATION" 'BEGIN { printf "%.2f", t / 100 / d }')
    echo "$mode at $RATE/s for ${DURATION}s: $(get rps) req/s, non-201 $(get non201), errors $(get errors)"
    echo "latency from the schedule: p50 $(ms "$(get p50_us)") ms, p99 $(ms "$(get p99_us)") ms, max $(ms "$(get max_us)") ms"
    echo "latency from the send: p99 $(ms "$P99_SEND") ms; send lag p99 $(ms "$(get p99_send_lag_us)") ms"
    SYNCS=$(awk -v s=$((syncs1 - syncs0)) -v d="$DURATION" 'BEGIN { printf "%.0f", s / d }')
    echo "worker CPU: $CORES cores (clock ticks are 1/100 s); journal syncs: $SYNCS/s"
    echo "worker context switches per second, by thread group:"
    join "$TMP/sw0" "$TMP/sw1" | awk -v d="$DURATION" '
        { v = ($4 - $2) / d; n = ($5 - $3) / d; tv += v; tn += n
          printf "  %-18s voluntary %8.0f  involuntary %7.0f\n", $1, v, n }
        END { printf "  %-18s voluntary %8.0f  involuntary %7.0f\n", "all", tv, tn }'
}

if [[ "$MODE" == both ]]; then
    # Replays and new keys at the same rate on the same worker, back to back: what a new
    # key costs beyond answering (the commit path), as ratios.
    measure replay
    replay_p99=$P99_SEND replay_cores=$CORES
    measure new-key
    # The worker stopped first, and what it left in the page cache written out: its
    # checkpoint and sled's writeback would share the disk with the floor's syncs.
    stop_worker
    sync
    floor=$("$BIN/idem-bench" sync --rate "$RATE" --duration "$DURATION" --dir "$TMP")
    fget() { printf '%s\n' "$floor" | sed -n "s/^$1=//p"; }
    floor_p99=$(fget p99_us) floor_cores=$(fget syncer_cores)
    echo "the disk's floor at $RATE/s (bare group commit): $(fget syncs_per_s) syncs/s," \
        "p99 from arrival $(ms "$floor_p99") ms, syncing thread's CPU $floor_cores cores"
    awk -v n="$P99_SEND" -v r="$replay_p99" -v nc="$CORES" -v rc="$replay_cores" \
        -v fp="$floor_p99" -v fc="$floor_cores" -v fs="$(fget syncs_per_s)" -v ws="$SYNCS" 'BEGIN {
        r = r > 0 ? r : 1; rc = rc > 0 ? rc : 0.01; fs = fs > 0 ? fs : 1
        printf "ratios new key / replay at the same rate: p99 from the send %.1fx, worker CPU %.1fx\n",
            n / r, nc / rc
        # The floor CPU also at the syncs a second the worker made: it groups more per sync.
        printf "floor ratios (replay + the floor) / replay: p99 %.1fx, CPU %.1fx (%.1fx at the worker'"'"'s %d syncs/s)\n",
            (r + fp) / r, (rc + fc) / rc, (rc + fc * ws / fs) / rc, ws }'
else
    measure "$MODE"
fi
