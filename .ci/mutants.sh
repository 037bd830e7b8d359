#!/usr/bin/env bash
# Measures the tests' strength on the commit path with cargo-mutants: each mutant (an
# operator flipped, a function body replaced by a default) of the decider (decider.rs),
# the committer and syncer (committer.rs), the journal, an open's recovery steps
# (recover.rs) and the index's rebuild is built,
# and the tests that guard them run against it; a mutant they do not catch is a test to add, or an
# equivalent change to explain in docs/testing.md. Too long for CI (hours for all
# files): run it by hand or nightly, a shard at a time.
#
# Usage: .ci/mutants.sh [FILE...] [-- extra cargo-mutants options]
#   FILE   the sources to mutate (default: decider.rs, committer.rs, journal.rs,
#          recover.rs, rebuild.rs)
# Examples:
#   .ci/mutants.sh ledger/src/store/sled/committer.rs -- --shard 1/12
#   .ci/mutants.sh -- --list
# The decider alone, against its unit tests and the simulation (about 25 s a mutant;
# cargo-mutants runs its unmutated baseline on the mutated package only, so it is
# skipped when the tests named are another package's):
#   IDEM_SIM_SEEDS=2000 .ci/mutants.sh ledger/src/store/sled/decider.rs -- \
#     --cargo-test-arg=--lib --cargo-test-arg=--test=simulation --baseline skip --timeout 300
# Needs `cargo install --locked cargo-mutants` and the PostgreSQL of the tests (the
# conformance suite runs on both stores). The report lands in mutants.out/.
set -euo pipefail
cd "$(dirname "$0")/.."

files=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  files+=(--file "$1")
  shift
done
[ "${1:-}" = "--" ] && shift
if [ ${#files[@]} -eq 0 ]; then
  files=(--file ledger/src/store/sled/decider.rs
         --file ledger/src/store/sled/committer.rs
         --file ledger/src/store/sled/journal.rs
         --file ledger/src/store/sled/recover.rs
         --file ledger/src/store/sled/rebuild.rs)
fi

# The tests that hold the commit path: the ledger's own (conformance on both stores,
# recovery, the model, the journal's unit tests) and the process-level ones (crash
# points, crash loops, power loss, group commit, the simulation). A service that is
# missing fails the run rather than letting mutants pass untested.
export IDEM_REQUIRE_SERVICES=1
exec cargo mutants "${files[@]}" \
  --test-package ledger --test-package idem-tests \
  --timeout-multiplier 3 \
  "$@"
