//! A deterministic simulation of the whole exactly-once path.
//!
//! One seeded RNG drives a few clients with scripted intents (deposits, withdrawals and
//! refunds, each under its own key), an at-least-once broker, a lossy network and a worker
//! whose store can crash at any of its six crash points (around the journal's write and
//! sync, after the apply to sled, and in a checkpoint) or between two commits. The store
//! (`store.rs`) is the sled store's own decider (`ledger::store::sled::decider`), which
//! makes every decision and group and renders every answer, driven step by step over an
//! index in memory; its journal is the product's journal over a simulated disk
//! (`journal::simfs`) whose power is cut at the crash, and every open is the product's
//! recovery (`ledger::store::sled::recover`): the journal's torn tail cut, its groups
//! replayed, or the index rebuilt from its base. sled's disk is a second file that loses
//! what was not flushed, independently of the journal.
//! After every step, and after a final phase that retries every unresolved intent with its
//! own key until it is resolved, the reference model (`model.rs`) checks: after every
//! crash the ledger opens to exactly the journal's durable end, one effect per intent, no
//! acknowledged outcome lost or changed, no negative user balance, every currency summing
//! to zero, replays identical (every answer as an outcome, a rotating third of the keys
//! byte for byte after expiry), and no refund rejected as `withdrawal_not_found` while its
//! withdrawal was claimed and not yet decided (it must be told 409 and retried).
//!
//! A run is a pure function of its seed: `SEED=n cargo test -p idem-tests --test
//! simulation -- --nocapture` replays seed n with a step trace.

mod model;
mod rng;
mod store;
mod world;

pub use rng::Rng;
pub use store::Point;

/// A bug planted around the decider (in what drives it, the files, or what it reads), to
/// prove that the checker can fail. Bugs in the decider itself are its mutations, which
/// `cargo mutants` makes (docs/testing.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutation {
    /// The real store.
    None,
    /// The compare forgets the fingerprint: another command under a done key is answered
    /// with the stored outcome instead of `idempotency_key_reused`.
    ReuseIsReplay,
    /// The journal never syncs (its `SyncMode::Never`, for benchmarks): a group is
    /// answered once its write returns, and a power cut can lose it.
    LoseSyncedGroup,
    /// Answers leave once the group's record is written, before the journal's sync.
    AnswerBeforeJournalSync,
    /// A group is applied to sled's memory before its journal sync, so sled's disk can
    /// hold a group whose record the journal then loses.
    ApplyBeforeJournalSync,
    /// A compaction deletes the journal's segments up to the checkpoint's group without
    /// writing its base first, so an index rebuilt after a crash that damaged sled's files
    /// misses groups the journal no longer holds.
    CheckpointDeletesNeeded,
    /// A refund whose withdrawal is claimed and not decided yet is decided anyway, as
    /// `withdrawal_not_found`, instead of being told to come again.
    RefundOvertakesWithdrawal,
}

impl Mutation {
    pub const ALL: [Mutation; 6] = [
        Mutation::ReuseIsReplay,
        Mutation::LoseSyncedGroup,
        Mutation::AnswerBeforeJournalSync,
        Mutation::ApplyBeforeJournalSync,
        Mutation::CheckpointDeletesNeeded,
        Mutation::RefundOvertakesWithdrawal,
    ];
}

#[derive(Debug, Clone)]
pub struct Options {
    pub mutation: Mutation,
    /// Print every step to stderr.
    pub trace: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            mutation: Mutation::None,
            trace: false,
        }
    }
}

/// A guarantee that did not hold, with what it takes to see it again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub seed: u64,
    pub step: usize,
    pub what: String,
    pub mutation: Mutation,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "simulation seed {} failed at step {}: {}",
            self.seed, self.step, self.what
        )?;
        if self.mutation != Mutation::None {
            write!(f, "\n  (with the planted bug {:?})", self.mutation)?;
        }
        write!(f, "\n  replay: {}", replay_command(self.seed))
    }
}

/// What one run did; `violation` is the first guarantee that failed, if any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub seed: u64,
    pub steps: usize,
    pub intents: usize,
    pub facts: usize,
    pub crashes: usize,
    /// Crashes at each of [`Point::ALL`], while a group or a checkpoint was passing it; the
    /// rest of `crashes` fell between two commits.
    pub crash_points: [usize; Point::ALL.len()],
    /// Checkpoints taken, and journal segments their compactions deleted.
    pub checkpoints: usize,
    pub segments_deleted: usize,
    /// Appends the power cut whose group recovery found whole (it is replayed, unanswered).
    pub cut_appends_kept: usize,
    /// Opens whose journal ended in a torn or damaged unsynced tail, cut off.
    pub tails_cut: usize,
    /// Journal groups replayed into sled by recoveries, sled's disk being behind them.
    pub replayed: usize,
    /// Opens that found sled's files damaged and rebuilt the index from the journal.
    pub rebuilt: usize,
    pub answers: usize,
    pub replays: usize,
    pub deliveries: usize,
    /// 409 answers and broker deliveries refused as in flight.
    pub in_flight: usize,
    /// Other commands under a used key, refused as they must be.
    pub reused_refused: usize,
    /// Reused message ids, quarantined as they must be.
    pub quarantined: usize,
    pub dropped: usize,
    pub duplicated: usize,
    pub expired: usize,
    pub clock_back: usize,
    /// A hash of the run's choices: equal for two runs of one seed.
    pub digest: u64,
    pub violation: Option<Violation>,
}

/// Runs one seed to the end, or to its first violation.
pub fn run(seed: u64, options: &Options) -> Report {
    world::World::new(seed, options).run()
}

/// The command that replays a seed with its trace.
pub fn replay_command(seed: u64) -> String {
    format!("SEED={seed} cargo test -p idem-tests --test simulation -- --nocapture")
}

/// The first seed in `seeds` whose run finds a violation with `mutation` planted.
pub fn first_violation(mutation: Mutation, seeds: std::ops::Range<u64>) -> Option<Violation> {
    let options = Options {
        mutation,
        ..Options::default()
    };
    seeds
        .into_iter()
        .find_map(|seed| run(seed, &options).violation)
}
