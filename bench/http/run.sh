#!/usr/bin/env bash
# HTTP benchmark of inbox-worker. From the workspace root:
#
#   bench/http/run.sh
#
# Builds inbox-worker and idem-bench in release, starts `inbox-worker serve` on a fresh
# ledger in a temporary folder and a free loopback port, seeds 100 accounts and 10,000
# done keys, then measures with 64 keep-alive connections:
#
#   wrk new-key / replay              max throughput, wrk (Debian package) + bench/http/*.lua
#   idem-bench load new-key / replay  max throughput, the project's generator (bench/src)
#   idem-bench load at a fixed rate   half the targets (10,000 and 25,000/s), and half of
#                                     the idem-bench load max measured just before if that
#                                     is lower; latency from each request's scheduled send
#                                     time
#
# and prints a markdown table. Then SIGTERM, `inbox-worker verify`, and a check that
# the facts in the log are those `load seed` wrote plus the first executions the generators saw.
#
# Environment: DURATION (s, 10), CONNECTIONS (64), THREADS (2, of the generator),
# NEW_RATE (10000), REPLAY_RATE (25000), WRK (1: also run wrk if installed),
# PERF (0; 1: perf record the worker during the idem-bench load new-key run),
# KEEP (0; 1: keep the temporary folder), CARGO_TARGET_DIR.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE="$ROOT/bench/http"
DURATION=${DURATION:-10}
CONNECTIONS=${CONNECTIONS:-64}
THREADS=${THREADS:-2}
NEW_RATE=${NEW_RATE:-10000}
REPLAY_RATE=${REPLAY_RATE:-25000}
WRK=${WRK:-1}
PERF=${PERF:-0}
KEEP=${KEEP:-0}
ACCOUNTS=100
REPLAY_KEYS=10000
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}

cd "$ROOT"
cargo build --release -q -p inbox-worker -p idem-bench
BIN="$TARGET/release"

TMP=$(mktemp -d -t idem-bench-XXXXXX)
DB="$TMP/ledger"
# shellcheck source=bench/http/worker.sh
source "$HERE/worker.sh"
cleanup() {
    stop_worker
    if [[ "$KEEP" == 1 ]]; then echo "kept $TMP" >&2; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
start_worker "$BIN" "$TMP"

LOAD=("$BIN/idem-bench" load --addr "$ADDR" --connections "$CONNECTIONS" --threads "$THREADS"
    --accounts "$ACCOUNTS" --replay-keys "$REPLAY_KEYS")
seed_start=$(date +%s.%N)
"${LOAD[@]}" seed >/dev/null
seed_end=$(date +%s.%N)

ticks=$(getconf CLK_TCK)
machine_busy() { # ticks not idle nor iowait, all CPUs
    awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat
}
worker_cpu() { # utime + stime of the worker, in clock ticks
    awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$WORKER_PID/stat"
}

ROWS=()
FIRST_TOTAL=0     # first executions seen by the generators
WRK_NEW_RUNS=0    # wrk abandons up to CONNECTIONS requests in flight at its deadline
# measure LABEL COMMAND...: runs one measurement, appends a table row.
measure() {
    local label=$1; shift
    local out="$TMP/m.out" err="$TMP/m.err" tim="$TMP/m.time"
    local before after
    local busy_before busy_after
    before=$(worker_cpu); busy_before=$(machine_busy)
    local TIMEFORMAT='%R %U %S'
    { time "$@" >"$out" 2>"$err"; } 2>"$tim" || { cat "$err" >&2; exit 1; }
    after=$(worker_cpu); busy_after=$(machine_busy)
    declare -A v=()
    while IFS='=' read -r k val; do [[ -n "$k" && -n "$val" ]] && v[$k]=$val; done \
        < <(grep -E '^[a-z0-9_]+=' "$out")
    read -r wall user sys <"$tim"
    local wcpu gcpu ocpu
    wcpu=$(awk -v t=$((after - before)) -v hz="$ticks" -v s="${v[seconds]}" 'BEGIN { printf "%.2f", t / hz / s }')
    gcpu=$(awk -v u="$user" -v s="$sys" -v w="$wall" 'BEGIN { printf "%.2f", (u + s) / w }')
    # everything else on the machine (another build, the kernel's softirqs on its behalf)
    ocpu=$(awk -v t=$((busy_after - busy_before)) -v hz="$ticks" -v w="$wall" -v a="$wcpu" -v b="$gcpu" \
        'BEGIN { o = t / hz / w - a - b; if (o < 0) o = 0; printf "%.2f", o }')
    ms() { awk -v u="$1" 'BEGIN { printf "%.2f", u / 1000 }'; }
    # wrk reports neither; idem-bench load at a fixed rate: p99 from each request's actual send,
    # and the p99 of the send's lag behind its schedule (a late generator, not the server)
    local p99_sent="–" lag99="–"
    if [[ -n "${v[rate]:-}" && "${v[rate]}" != max ]]; then
        p99_sent=$(ms "${v[p99_from_send_us]}"); lag99=$(ms "${v[p99_send_lag_us]}")
    fi
    ROWS+=("| $label | $CONNECTIONS | ${v[rps]} | $(ms "${v[p50_us]}") | $(ms "${v[p99_us]}") | $p99_sent | $lag99 | $(ms "${v[max_us]}") | ${v[requests]} | ${v[first]} | ${v[replayed]} | ${v[non201]} | ${v[errors]} | $wcpu | $gcpu | $ocpu |")
    LAST_FIRST=${v[first]}
    LAST_RPS=${v[rps]}
}

if [[ "$WRK" == 1 ]] && command -v wrk >/dev/null; then
    measure "wrk, new key, max" wrk -t"$THREADS" -c"$CONNECTIONS" -d"${DURATION}s" \
        -s "$HERE/new_key.lua" "http://$ADDR" -- wrk-nk "$ACCOUNTS" "$REPLAY_KEYS"
    FIRST_TOTAL=$((FIRST_TOTAL + LAST_FIRST)); WRK_NEW_RUNS=$((WRK_NEW_RUNS + 1))
    measure "wrk, replay, max" wrk -t"$THREADS" -c"$CONNECTIONS" -d"${DURATION}s" \
        -s "$HERE/replay.lua" "http://$ADDR" -- x "$ACCOUNTS" "$REPLAY_KEYS"
fi

if [[ "$PERF" == 1 ]]; then
    perf record -F 499 -g -p "$WORKER_PID" -o "$TMP/perf.data" -- sleep "$DURATION" \
        >/dev/null 2>"$TMP/perf.err" &
    PERF_PID=$!
fi
measure "idem-bench load, new key, max" "${LOAD[@]}" run --mode new-key --duration "$DURATION" --tag il-nk
FIRST_TOTAL=$((FIRST_TOTAL + LAST_FIRST))
NEW_MAX=$LAST_RPS
if [[ "$PERF" == 1 ]]; then
    wait "$PERF_PID" || true
    {
        echo "perf, worker during 'idem-bench load, new key, max', by thread:"
        perf report -i "$TMP/perf.data" --no-children --percent-limit 1 --stdio \
            --sort comm -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -n 15
        echo "by function:"
        perf report -i "$TMP/perf.data" --no-children --percent-limit 0.8 --stdio \
            --sort comm,dso,sym -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -n 40
    } >"$TMP/perf.txt" || true
fi
measure "idem-bench load, replay, max" "${LOAD[@]}" run --mode replay --duration "$DURATION"
REPLAY_MAX=$LAST_RPS
measure "idem-bench load, new key, ${NEW_RATE}/s" "${LOAD[@]}" run --mode new-key \
    --duration "$DURATION" --rate "$NEW_RATE" --tag il-nk-rate
FIRST_TOTAL=$((FIRST_TOTAL + LAST_FIRST))
measure "idem-bench load, replay, ${REPLAY_RATE}/s" "${LOAD[@]}" run --mode replay \
    --duration "$DURATION" --rate "$REPLAY_RATE"

# The same at half of what this machine measured above, when that is below the target.
NEW_HALF=$((NEW_MAX / 2)); REPLAY_HALF=$((REPLAY_MAX / 2))
if (( NEW_HALF < NEW_RATE )); then
    measure "idem-bench load, new key, ${NEW_HALF}/s (half of max)" "${LOAD[@]}" run --mode new-key \
        --duration "$DURATION" --rate "$NEW_HALF" --tag il-nk-half
    FIRST_TOTAL=$((FIRST_TOTAL + LAST_FIRST))
fi
if (( REPLAY_HALF < REPLAY_RATE )); then
    measure "idem-bench load, replay, ${REPLAY_HALF}/s (half of max)" "${LOAD[@]}" run --mode replay \
        --duration "$DURATION" --rate "$REPLAY_HALF"
fi

METRICS=$(curl -s "http://$ADDR/metrics" || true)
kill -TERM "$WORKER_PID"
wait "$WORKER_PID" || { echo "worker exited with $?" >&2; cat "$TMP/worker.err" >&2; }
WORKER_PID=""

echo
echo "worker: $ADDR, ledger in a fresh temporary folder; seeding $ACCOUNTS deposits + $REPLAY_KEYS keys took $(awk -v a="$seed_start" -v b="$seed_end" 'BEGIN { printf "%.2f", b - a }') s"
echo "machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), kernel $(uname -r); worker and generator share them"
echo
echo "| run | conns | req/s | p50 ms | p99 ms | p99 ms from send | send lag p99 ms | max ms | answers | 201 first | 201 replay | non-201 | errors | worker CPU | generator CPU | other CPU |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
printf '%s\n' "${ROWS[@]}"
echo
echo "CPU columns: cores busy on average (CPU seconds / wall seconds), $(nproc) = the whole machine;"
echo "other = the rest of the machine (other processes); high values mean a disturbed run."
echo "Fixed-rate rows: latency from each request's scheduled time (1 ms grid); 'from send'"
echo "leaves out the generator's own lateness, which 'send lag' shows."
echo
if [[ "$PERF" == 1 ]]; then cat "$TMP/perf.txt"; echo; fi
echo "verify:"
"$BIN/inbox-worker" verify --db "$DB" | sed 's/^/  /'
facts=$("$BIN/inbox-worker" verify --db "$DB" | sed -n 's/^checked \([0-9]*\) facts.*/\1/p')
expected=$((ACCOUNTS + REPLAY_KEYS + FIRST_TOTAL))
batches=$(printf '%s\n' "$METRICS" | awk '/^idem_commit_batches_total / { print $2 }')
commands=$(printf '%s\n' "$METRICS" | awk '/^idem_commit_commands_total / { print $2 }')
echo "commit groups: ${batches:-?} batches for ${commands:-?} commands (mean $(awk -v b="${batches:-0}" -v c="${commands:-0}" 'BEGIN { if (b > 0) printf "%.1f", c / b; else printf "?" }') per flush + fdatasync)"
echo "facts in the log: $facts; seeded $((ACCOUNTS + REPLAY_KEYS)) + first executions seen by the generators $FIRST_TOTAL = $expected"
slack=$((WRK_NEW_RUNS * CONNECTIONS))
if (( facts == expected )); then
    echo "effects check: OK, every effect was seen by a generator exactly once"
elif (( facts > expected && facts - expected <= slack )); then
    echo "effects check: OK, $((facts - expected)) effects of requests wrk abandoned in flight at its deadline (at most $slack)"
else
    echo "effects check: MISMATCH" >&2
    exit 1
fi
