//! SledStore's opening, a facet of it: sled opened and the journal replayed into it, the
//! log's tail checked against the projections, the index rebuilt from the journal when
//! sled's files cannot be trusted, and then the committer started. It sits above
//! everything it starts.

use std::fs::File;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use parking_lot::{Mutex, RwLock};

use crate::fact::Fact;
use crate::projection::{Balances, Stats};
use crate::store::{CommitMetrics, LedgerError, OpenReport, Rules};

use super::claims::{SHARDS, Shard};
use super::committer::{Committer, Lead, Syncer};
use super::config::{SledConfig, sled_config};
use super::error::{Result, open_err};
use super::folder::{JOURNAL_DIR, LockReleased, ensure_folder, sync_dir, wait_until_released};
use super::handle::SledStore;
use super::journal::{self, OsFs};
use super::recover::{self, heal};
use super::shared::{Deferred, Shared, State};
use super::{rebuild, statements};

impl SledStore {
    /// Opens (or creates) the ledger at `config.path`: recovers sled, checks the log tail
    /// against the projections, and refuses to start on any disagreement. Never deletes.
    pub fn open(config: SledConfig) -> Result<(SledStore, OpenReport)> {
        let started = Instant::now();
        let path = config.path.clone();
        let shown = path.display().to_string();
        ensure_folder(&path)?;
        let mut rebuilt = None;
        if path.join(rebuild::REBUILDING).exists() {
            let began = std::fs::read_to_string(path.join(rebuild::REBUILDING)).unwrap_or_default();
            rebuilt = Some(rebuild::rebuild(
                &config,
                &format!("a rebuild of the index did not finish (it began because {began})"),
            )?);
        }
        // Dropped after `db`, also when opening fails below once sled has opened.
        let mut released = LockReleased { data_file: None };
        let index = match open_index(&config, &shown, &mut released) {
            Ok(index) => index,
            Err((e, true))
                if rebuilt.is_none()
                    && recover::log_is_complete(&OsFs, &path.join(JOURNAL_DIR))? =>
            {
                drop(released);
                wait_until_released(&path);
                let reason = match &e {
                    LedgerError::Corrupt { detail, .. } => detail.clone(),
                    other => other.to_string(),
                };
                rebuilt = Some(rebuild::rebuild(&config, &reason)?);
                released = LockReleased { data_file: None };
                open_index(&config, &shown, &mut released).map_err(|(e, _)| e)?
            }
            Err((e, _)) => return Err(e),
        };
        let Index {
            db,
            tree,
            journal,
            replayed_groups,
            checkpoint_at_open,
            stats,
            last_fact,
            balances,
        } = index;
        let fresh = stats.is_none();
        let stats = stats.unwrap_or_default();
        let data_file = if config.fsync {
            Some(File::open(path.join("db")).map_err(|e| {
                LedgerError::Unavailable(format!("opening the data file for fdatasync: {e}"))
            })?)
        } else {
            None
        };
        let report = OpenReport {
            fresh,
            facts: stats.last_seq,
            keys_done: stats.keys_done,
            keys_expired: stats.keys_expired,
            accounts: balances.accounts.keys().filter(|a| !a.is_system()).count(),
            last_fact_at: last_fact.as_ref().map(|f| f.at.to_rfc3339()),
            replayed_groups,
            rebuilt,
            open_ms: 0,
        };
        let next_group = journal.next_group();
        let observed = stats.observed;
        let shared = Arc::new(Shared {
            path,
            db,
            tree,
            data_file,
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            durable_seq: AtomicU64::new(stats.last_seq),
            applied_group: AtomicU64::new(next_group - 1),
            checkpoint_at_open,
            next_token: AtomicU64::new(1),
            replayed: AtomicU64::new(observed.replayed),
            conflicts_in_flight: AtomicU64::new(observed.conflicts_in_flight),
            conflicts_reused: AtomicU64::new(observed.conflicts_reused),
            tails: AtomicU64::new(0),
            tails_bytes: AtomicU64::new(0),
            deferred: Mutex::new(Deferred::default()),
            state: RwLock::new(State { balances, stats }),
            failed: Mutex::new(None),
            metrics: Mutex::new(CommitMetrics::default()),
            rules: Rules {
                retention: config.retention,
                lease: config.lease,
                clock: config.clock.clone(),
            },
            config,
            _released: released,
        });
        if fresh {
            // Write the stats record now, so that a later open can tell a new ledger from
            // one whose stats vanished.
            let committer = Committer::new(shared.clone(), next_group);
            committer
                .write_new_ledger()
                .map_err(|e| open_err_l(&shown, e))?;
        }
        // The log of record starts at a base. A new ledger's is its first records; a
        // ledger last opened by a build that deleted old segments gets one of its whole
        // index now, once, before anything else is written.
        let base_bytes = recover::ensure_base(
            &OsFs,
            &shared.path.join(JOURNAL_DIR),
            &shared.tree,
            next_group - 1,
            || {
                if !fresh {
                    shared.config.progress.say(&format!(
                        "writing the journal's base from the index of {shown} (once)"
                    ));
                }
            },
        )?;
        {
            let mut m = shared.metrics.lock();
            m.journal_base_bytes = base_bytes;
            m.index_rebuilt = report.rebuilt.as_ref().map(ToString::to_string);
        }
        let mut report = report;
        report.open_ms = started.elapsed().as_millis();
        let (tx, rx) = crossbeam_channel::unbounded();
        let lead = Arc::new(Lead::new(
            Committer::new(shared.clone(), next_group),
            Syncer::new(&shared, journal),
        ));
        let committer_lead = lead.clone();
        let handle = std::thread::Builder::new()
            .name("idem-committer".into())
            .spawn(move || Committer::run(&committer_lead, rx))
            .map_err(|e| LedgerError::Unavailable(format!("starting the committer: {e}")))?;
        Ok((
            SledStore {
                shared,
                tx,
                lead,
                committer: Arc::new(Mutex::new(Some(handle))),
            },
            report,
        ))
    }

    /// Rebuilds the index of the ledger at `config.path` from its journal on demand, as an
    /// open does when it finds the index damaged: sled's files are moved aside into a
    /// `damaged-<time>` folder and a new index is built from the journal's base and every
    /// group after it. The ledger must not be open (`Locked` otherwise); a journal damaged
    /// in its middle, or one with no base, refuses and changes nothing.
    pub fn repair(config: &SledConfig) -> Result<crate::store::IndexRebuild> {
        if !config.path.join(JOURNAL_DIR).is_dir() {
            return Err(LedgerError::Unavailable(format!(
                "there is no ledger at {} (no journal folder)",
                config.path.display()
            )));
        }
        rebuild::rebuild(config, "a repair was asked for")
    }
}

/// What reads sled opened as, with its checks passed.
struct Index {
    db: sled::Db,
    tree: sled::Tree,
    journal: journal::Journal,
    replayed_groups: u64,
    checkpoint_at_open: u64,
    stats: Option<Stats>,
    last_fact: Option<Fact>,
    balances: Balances,
}

/// Opens sled and replays the journal into it. An error that says sled's files cannot be
/// trusted (sled refuses them or panics on them, or they disagree with the journal) comes
/// back as `Err((e, true))`: the index can be rebuilt from the journal; any other (the
/// journal damaged in its middle, the folder locked, a failing disk) as `Err((e, false))`.
fn open_index(
    config: &SledConfig,
    shown: &str,
    released: &mut LockReleased,
) -> std::result::Result<Index, (LedgerError, bool)> {
    // sled 0.34 panics on some damage (a torn write of its log between two checkpoints):
    // that is a damaged index like any other, not a reason for the worker to die.
    let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let db = sled_config(config).open()?;
        let tree = db.open_tree("ledger")?;
        Ok::<_, sled::Error>((db, tree))
    }));
    let (db, tree) = match opened {
        Ok(Ok(pair)) => pair,
        Ok(Err(e)) => return Err(heal(open_err(shown, e))),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            return Err((
                LedgerError::Corrupt {
                    path: shown.to_owned(),
                    detail: format!("sled panicked while opening: {what}"),
                },
                true,
            ));
        }
    };
    released.data_file = Some(config.path.join("db"));
    // An index with nothing in it beside a journal with a base is an index lost (its files
    // removed, or a backup of the journal alone).
    let dir = config.path.join(JOURNAL_DIR);
    recover::lost_index(&OsFs, &dir, &tree, shown)?;
    let mut options = config.journal.clone();
    if !config.fsync {
        options.sync = journal::SyncMode::Never;
    }
    let mut tree = tree;
    let recover::Replayed {
        journal,
        groups,
        checkpoint: checkpoint_at_open,
        ..
    } = recover::replay(OsFs, &dir, options, &mut tree, shown)?;
    let replayed_groups = groups.len() as u64;
    drop(groups);
    // sled writes its `conf` when it creates the folder's files and never syncs it (nor the
    // folder): without it, sled refuses the folder after a power loss, and an open would
    // then rebuild the index for nothing.
    if config.fsync {
        std::fs::File::open(config.path.join("conf"))
            .and_then(|f| f.sync_all())
            .map_err(|e| {
                (
                    LedgerError::Unavailable(format!("syncing sled's conf: {e}")),
                    false,
                )
            })?;
        sync_dir(&config.path).map_err(|e| (e, false))?;
    }
    if replayed_groups > 0 {
        // The last stop was not clean: sled's unsynced writes may have reached its files in
        // part or out of order, and sled reads most of its pages only when asked for them.
        // Every record is read once (about a second a million facts) so that damage is met
        // here, where a rebuild heals it, and not by a reader later.
        read_every_record(&tree, shown)?;
    }
    let recover::Checked {
        stats,
        last_fact,
        balances,
    } = recover::check(&tree, shown).map_err(heal)?;
    if stats.is_some() {
        statements::complete(&db, &tree, shown).map_err(heal)?;
    }
    Ok(Index {
        balances,
        db,
        tree,
        journal,
        replayed_groups,
        checkpoint_at_open,
        stats,
        last_fact,
    })
}

/// Reads every record of the index, so that sled checks each page it holds: its error,
/// or its panic, says the index is damaged.
fn read_every_record(
    tree: &sled::Tree,
    shown: &str,
) -> std::result::Result<(), (LedgerError, bool)> {
    let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for item in tree.iter() {
            item?;
        }
        Ok::<_, sled::Error>(())
    }));
    match read {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(heal(open_err(shown, e))),
        Err(_) => Err((
            LedgerError::Corrupt {
                path: shown.to_owned(),
                detail: "sled panicked while reading its records".into(),
            },
            true,
        )),
    }
}

fn open_err_l(path: &str, e: LedgerError) -> LedgerError {
    match e {
        LedgerError::Unavailable(m) => LedgerError::Unavailable(format!("opening {path}: {m}")),
        other => other,
    }
}
