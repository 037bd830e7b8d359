//! The deterministic simulation of the exactly-once path (see `idem_tests::sim`).
//!
//! - `cargo test -p idem-tests --test simulation` runs 10,000 seeds (0..10,000).
//! - `IDEM_SIM_SEEDS=N` runs N seeds instead, from `IDEM_SIM_FIRST` (default 0).
//! - `SEED=n` runs seed n alone and prints its step trace.
//!
//! The mutation tests plant known bugs in the simulated store and require the checker to
//! catch each one, so a checker that can no longer fail does not pass unnoticed.

use std::io::Write;
use std::time::Instant;

use idem_tests::sim::{self, Mutation, Options, Report, Violation};

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    match v.trim().parse() {
        Ok(n) => Some(n),
        Err(_) => panic!("{name} must be a whole number, not {v:?}"),
    }
}

#[test]
fn simulation() {
    if let Some(seed) = env_u64("SEED") {
        let report = sim::run(
            seed,
            &Options {
                trace: true,
                ..Options::default()
            },
        );
        eprintln!("{report:#?}");
        if let Some(v) = report.violation {
            panic!("{v}");
        }
        return;
    }
    let count = env_u64("IDEM_SIM_SEEDS").unwrap_or(10_000);
    let first = env_u64("IDEM_SIM_FIRST").unwrap_or(0);
    let started = Instant::now();
    let threads = std::thread::available_parallelism()
        .map_or(2, usize::from)
        .clamp(1, 8);
    let threads_u64 = u64::try_from(threads).expect("a handful of threads");
    let reports: Vec<Report> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads_u64)
            .map(|t| {
                s.spawn(move || {
                    let options = Options::default();
                    (first + t..first + count)
                        .step_by(threads)
                        .map(|seed| sim::run(seed, &options))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a simulation thread panicked"))
            .collect()
    });
    let total = |f: fn(&Report) -> usize| reports.iter().map(f).sum::<usize>();
    let mut failures: Vec<&Violation> = reports
        .iter()
        .filter_map(|r| r.violation.as_ref())
        .collect();
    failures.sort_by_key(|v| v.seed);
    // Straight to the stderr handle: libtest captures `eprintln!` of passing tests, and
    // this line is the run's figures.
    let mut err = std::io::stderr();
    let _ = writeln!(
        err,
        "simulation: {} seeds ({first}..{}), {} steps, {} intents, {} facts, {} crashes \
         (at {}: {}), {} cut appends found whole, {} torn tails cut, {} journal groups replayed, \
         {} index rebuilds, \
         {} checkpoints ({} journal segments deleted), {} answers ({} replays), {} deliveries, {} in flight, {} reused keys refused, \
         {} reused message ids quarantined, {} packets lost, {} duplicated, {} keys expired, \
         {} clock steps back, {} violations, {:.1}s on {threads} threads",
        reports.len(),
        first + count,
        total(|r| r.steps),
        total(|r| r.intents),
        total(|r| r.facts),
        total(|r| r.crashes),
        sim::Point::ALL.map(sim::Point::name).join(", "),
        (0..sim::Point::ALL.len())
            .map(|i| reports
                .iter()
                .map(|r| r.crash_points[i])
                .sum::<usize>()
                .to_string())
            .collect::<Vec<_>>()
            .join(", "),
        total(|r| r.cut_appends_kept),
        total(|r| r.tails_cut),
        total(|r| r.replayed),
        total(|r| r.rebuilt),
        total(|r| r.checkpoints),
        total(|r| r.segments_deleted),
        total(|r| r.answers),
        total(|r| r.replays),
        total(|r| r.deliveries),
        total(|r| r.in_flight),
        total(|r| r.reused_refused),
        total(|r| r.quarantined),
        total(|r| r.dropped),
        total(|r| r.duplicated),
        total(|r| r.expired),
        total(|r| r.clock_back),
        failures.len(),
        started.elapsed().as_secs_f64(),
    );
    if !failures.is_empty() {
        let shown: Vec<String> = failures.iter().take(5).map(ToString::to_string).collect();
        panic!(
            "{} of {} seeds failed; the first:\n{}",
            failures.len(),
            reports.len(),
            shown.join("\n")
        );
    }
}

#[test]
fn a_seed_replays_the_same_run() {
    for seed in [0, 1, 42, 9_999] {
        let a = sim::run(seed, &Options::default());
        let b = sim::run(seed, &Options::default());
        assert_eq!(a, b, "seed {seed} ran differently twice");
    }
    let a = sim::run(3, &Options::default());
    let b = sim::run(4, &Options::default());
    assert_ne!(a.digest, b.digest, "two seeds ran the same choices");
}

#[test]
fn the_runs_exercise_every_fault() {
    let reports: Vec<Report> = (0..200).map(|s| sim::run(s, &Options::default())).collect();
    let total = |f: fn(&Report) -> usize| reports.iter().map(f).sum::<usize>();
    for (what, n) in [
        ("crashes", total(|r| r.crashes)),
        ("checkpoints", total(|r| r.checkpoints)),
        ("journal segments deleted", total(|r| r.segments_deleted)),
        ("cut appends found whole", total(|r| r.cut_appends_kept)),
        ("torn tails cut", total(|r| r.tails_cut)),
        ("journal groups replayed", total(|r| r.replayed)),
        ("replays", total(|r| r.replays)),
        ("in-flight answers", total(|r| r.in_flight)),
        ("reused keys refused", total(|r| r.reused_refused)),
        ("reused message ids quarantined", total(|r| r.quarantined)),
        ("lost packets", total(|r| r.dropped)),
        ("duplicated packets", total(|r| r.duplicated)),
        ("expired keys", total(|r| r.expired)),
        ("clock steps back", total(|r| r.clock_back)),
        ("index rebuilds", total(|r| r.rebuilt)),
    ] {
        assert!(n > 0, "200 seeds never produced any {what}");
    }
    for (i, point) in sim::Point::ALL.iter().enumerate() {
        let n: usize = reports.iter().map(|r| r.crash_points[i]).sum();
        assert!(n > 0, "200 seeds never crashed at {}", point.name());
    }
}

/// Each planted bug must be caught, with its seed in the message.
fn caught(mutation: Mutation) {
    let v = sim::first_violation(mutation, 0..2_000)
        .unwrap_or_else(|| panic!("the checker missed {mutation:?} in 2,000 seeds"));
    let text = v.to_string();
    assert!(
        text.contains(&format!("SEED={}", v.seed)),
        "no replay command in: {text}"
    );
    eprintln!("{mutation:?} caught: {text}");
}

#[test]
fn catches_a_reused_key_answered_as_a_replay() {
    caught(Mutation::ReuseIsReplay);
}

#[test]
fn catches_a_lost_synced_group() {
    caught(Mutation::LoseSyncedGroup);
}

#[test]
fn catches_an_answer_before_the_journal_sync() {
    caught(Mutation::AnswerBeforeJournalSync);
}

#[test]
fn catches_a_group_applied_to_sled_before_its_journal_sync() {
    caught(Mutation::ApplyBeforeJournalSync);
}

#[test]
fn catches_a_compaction_that_deletes_segments_no_base_holds() {
    caught(Mutation::CheckpointDeletesNeeded);
}

#[test]
fn catches_a_refund_decided_while_its_withdrawal_is_in_flight() {
    caught(Mutation::RefundOvertakesWithdrawal);
}

#[test]
fn every_mutation_has_a_test() {
    assert_eq!(
        Mutation::ALL.len(),
        6,
        "add a catches_* test for the new mutation"
    );
}
