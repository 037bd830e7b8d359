//! The index rebuilt from the log of record. sled is the index: every record it holds was
//! written by a journal group (or is in the journal's base), so when sled's files cannot be
//! trusted (sled refuses to open, panics while opening, or disagrees with the journal),
//! the ledger moves them aside and builds a new index from the newest base and every group
//! after it. Nothing acknowledged depends on sled's files surviving a power loss.
//!
//! A rebuild is crash-safe: a marker file, `rebuilding`, is written and synced before the
//! damaged files are moved, and removed (and its removal synced) only once the new index
//! is whole and synced. An open that finds the marker throws away the partial index and
//! rebuilds again.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::config::{SledConfig, sled_config};
use super::error::{Result, open_err};
use super::folder::{JOURNAL_DIR, flush_sled, sync_dir, wait_until_released};
use super::journal::{self, Op, OsFs};
use super::records::{GROUP_KEY, P_ACCOUNT, P_KEY, P_STATEMENT, STATS_KEY, decode, io_err};
use super::recover::{self, Piece, Plan};
use crate::projection::Stats;
use crate::store::{IndexRebuild, LedgerError};

/// Present in the ledger's folder while a rebuild is under way.
pub(super) const REBUILDING: &str = "rebuilding";
/// The folder, inside the ledger's, that damaged index files are moved into.
const ASIDE_PREFIX: &str = "damaged-";
/// Threads inserting the key records.
const KEY_WRITERS: usize = 2;
/// Key records handed to their writer at a time.
const KEYS_BATCH: usize = 4096;
/// sled's cache while it rebuilds the index.
const REBUILD_CACHE: u64 = 1 << 30;
/// A progress line every this many groups.
const PROGRESS_EVERY: u64 = 100_000;

/// Moves the index's files aside and builds a new index from the newest base and every
/// journal group after it. `reason` says why (kept in the report). Refuses, changing
/// nothing, when the log of record is incomplete or damaged in the middle.
pub(super) fn rebuild(config: &SledConfig, reason: &str) -> Result<IndexRebuild> {
    let started = Instant::now();
    let path = &config.path;
    let shown = path.display().to_string();
    let dir = path.join(JOURNAL_DIR);
    let progress = |line: String| config.progress.say(&line);
    // Read the whole journal once before anything is changed: damage in its middle
    // refuses the rebuild here, with the damaged index still in place.
    let plan = recover::plan(&OsFs, &dir, reason, &shown)?;
    let (base_group, last_group) = (plan.base_group, plan.last_group);
    progress(format!(
        "rebuilding the index of {shown} from the journal ({reason}): the base at group \
         {base_group}, then groups {} to {}",
        base_group + 1,
        last_group
    ));

    // The index must not be in use: its files are about to move.
    if let Ok(db) = fs::File::open(path.join("db")) {
        use fs2::FileExt as _;
        if db.try_lock_exclusive().is_err() {
            return Err(LedgerError::Locked { path: shown });
        }
    }
    let interrupted = path.join(REBUILDING).exists();
    let aside = if interrupted {
        // What is there is a partial index of our own making, not the damaged one (that
        // was moved aside by the rebuild that did not finish).
        remove_index_files(path)?;
        None
    } else {
        Some(move_aside(path)?)
    };
    sync_dir(path)?;
    // Written only now: a crash before it leaves the damaged files aside and no index,
    // which the next open rebuilds. The marker says why, for the open that finishes a
    // rebuild a crash interrupted.
    let why = if interrupted {
        fs::read_to_string(path.join(REBUILDING)).unwrap_or_default()
    } else {
        reason.to_owned()
    };
    fs::write(path.join(REBUILDING), why.as_bytes())
        .and_then(|()| fs::File::open(path.join(REBUILDING)))
        .and_then(|f| f.sync_all())
        .map_err(|e| LedgerError::Unavailable(format!("writing {shown}/{REBUILDING}: {e}")))?;
    sync_dir(path)?;

    // A cache that holds the index being built: the key records arrive in no order, and
    // with the serving default (64 MiB) sled would evict and read back leaves all along.
    let db = sled_config(config)
        .cache_capacity(config.cache_capacity_bytes.max(REBUILD_CACHE))
        .open()
        .map_err(|e| open_err(&shown, e))?;
    let tree = db.open_tree("ledger").map_err(|e| open_err(&shown, e))?;
    let groups = replay(&tree, &dir, &plan, &progress)?;
    let facts = match tree.get(STATS_KEY).map_err(io_err)? {
        Some(v) => {
            decode::<Stats>("stats", &v)
                .map_err(|e| LedgerError::Corrupt {
                    path: shown.clone(),
                    detail: format!("the stats record the journal holds: {e}"),
                })?
                .last_seq
        }
        None => 0,
    };
    progress("rebuilding: every group replayed; syncing the index".into());
    tree.insert(GROUP_KEY, &last_group.to_be_bytes()[..])
        .map_err(io_err)?;
    let data_file = fs::File::open(path.join("db"))
        .map_err(|e| LedgerError::Unavailable(format!("opening the data file: {e}")))?;
    flush_sled(&db, Some(&data_file))?;
    drop((tree, db));
    wait_until_released(path);
    for name in ["conf", "db"] {
        if let Ok(f) = fs::File::open(path.join(name)) {
            f.sync_all()
                .map_err(|e| LedgerError::Unavailable(format!("syncing {shown}/{name}: {e}")))?;
        }
    }
    sync_dir(path)?;
    fs::remove_file(path.join(REBUILDING))
        .map_err(|e| LedgerError::Unavailable(format!("removing {shown}/{REBUILDING}: {e}")))?;
    sync_dir(path)?;
    let rebuilt = IndexRebuild {
        reason: reason.to_owned(),
        aside: aside.map(|a| a.display().to_string()),
        base_group,
        groups,
        facts,
        ms: started.elapsed().as_millis(),
    };
    progress(format!("rebuilt: {rebuilt}"));
    Ok(rebuilt)
}

/// Whether an entry of the ledger's folder is the index's (sled's files), not the log of
/// record's or a rebuild's own.
fn is_index_file(name: &str) -> bool {
    name != JOURNAL_DIR && name != REBUILDING && !name.starts_with(ASIDE_PREFIX)
}

fn index_entries(path: &Path) -> Result<Vec<PathBuf>> {
    let entries = fs::read_dir(path)
        .map_err(|e| LedgerError::Unavailable(format!("listing {}: {e}", path.display())))?;
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry
            .map_err(|e| LedgerError::Unavailable(format!("listing {}: {e}", path.display())))?;
        if entry.file_name().to_str().is_some_and(is_index_file) {
            out.push(entry.path());
        }
    }
    Ok(out)
}

/// Moves the index's files into a new `damaged-<time>` folder beside them; returns it.
fn move_aside(path: &Path) -> Result<PathBuf> {
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%S%.3fZ");
    let aside = path.join(format!("{ASIDE_PREFIX}{stamp}"));
    let io = |what: String, e: std::io::Error| LedgerError::Unavailable(format!("{what}: {e}"));
    fs::create_dir(&aside).map_err(|e| io(format!("creating {}", aside.display()), e))?;
    for entry in index_entries(path)? {
        let Some(name) = entry.file_name() else {
            continue;
        };
        let to = aside.join(name);
        fs::rename(&entry, &to)
            .map_err(|e| io(format!("moving {} to {}", entry.display(), to.display()), e))?;
    }
    sync_dir(&aside)?;
    Ok(aside)
}

fn remove_index_files(path: &Path) -> Result<()> {
    for entry in index_entries(path)? {
        let removed = if entry.is_dir() {
            fs::remove_dir_all(&entry)
        } else {
            fs::remove_file(&entry)
        };
        removed
            .map_err(|e| LedgerError::Unavailable(format!("removing {}: {e}", entry.display())))?;
    }
    Ok(())
}

/// Puts the base's records and then every group's operations into `tree`, in order: the
/// journal is read and decoded on a thread of its own while this one inserts. The records
/// every group rewrites (balances, statement runs, the stats) are gathered, the last value
/// of each key winning, and put once at the end; every other operation goes in as read.
/// Returns how many groups were replayed.
fn replay(tree: &sled::Tree, dir: &Path, plan: &Plan, progress: &dyn Fn(String)) -> Result<u64> {
    let (base_group, last_group) = (plan.base_group, plan.last_group);
    let (tx, rx) = crossbeam_channel::bounded::<Piece>(64);
    std::thread::scope(|scope| {
        let reader = scope.spawn(move || -> Result<()> {
            recover::pieces(&OsFs, dir, plan, &mut |piece| {
                // The writer stopped on an error of its own, which it reports.
                tx.send(piece)
                    .map_err(|_| journal::JournalError::Failed("stopped".into()))
            })?;
            Ok(())
        });
        // The key records, most of the index's records, go in on threads of their own, each
        // key always to the same one (its operations stay in order), as sled takes inserts
        // from several threads at once.
        let mut key_writers = Vec::with_capacity(KEY_WRITERS);
        let mut keys_tx = Vec::with_capacity(KEY_WRITERS);
        for _ in 0..KEY_WRITERS {
            let (tx, rx) = crossbeam_channel::bounded::<Vec<Op>>(64);
            keys_tx.push(tx);
            key_writers.push(scope.spawn(move || -> Result<()> {
                for batch in rx {
                    for op in batch {
                        match op {
                            Op::Put { key, value } => tree.insert(key, value).map(drop),
                            Op::Remove { key } => tree.remove(key).map(drop),
                        }
                        .map_err(io_err)?;
                    }
                }
                Ok(())
            }));
        }
        let mut keys: Vec<Vec<Op>> = (0..KEY_WRITERS)
            .map(|_| Vec::with_capacity(KEYS_BATCH))
            .collect();
        let mut gathered: HashMap<Vec<u8>, Option<Vec<u8>>> = HashMap::new();
        let (mut groups, mut last_seq) = (0u64, 0u64);
        let mut written = Ok(());
        for piece in &rx {
            for op in piece.ops {
                let done = match op {
                    op @ (Op::Put { .. } | Op::Remove { .. })
                        if op_key(&op).first() == Some(&P_KEY) =>
                    {
                        let writer = key_writer(op_key(&op));
                        keys[writer].push(op);
                        if keys[writer].len() >= KEYS_BATCH
                            && keys_tx[writer]
                                .send(std::mem::replace(
                                    &mut keys[writer],
                                    Vec::with_capacity(KEYS_BATCH),
                                ))
                                .is_err()
                        {
                            // The key writer stopped on an error, reported at its join.
                            break;
                        }
                        Ok(())
                    }
                    Op::Put { key, value } if rewritten(&key) => {
                        gathered.insert(key, Some(value));
                        Ok(())
                    }
                    Op::Remove { key } if rewritten(&key) => {
                        gathered.insert(key, None);
                        Ok(())
                    }
                    Op::Put { key, value } => tree.insert(key, value).map(drop),
                    Op::Remove { key } => tree.remove(key).map(drop),
                };
                if let Err(e) = done {
                    written = Err(io_err(e));
                    break;
                }
            }
            if written.is_err() {
                break;
            }
            if piece.group > base_group {
                groups += 1;
                last_seq = last_seq.max(piece.seqs_end.saturating_sub(1));
                if groups % PROGRESS_EVERY == 0 {
                    progress(format!(
                        "rebuilding: group {} of {last_group} ({last_seq} facts)",
                        piece.group
                    ));
                }
            }
        }
        drop(rx);
        for (batch, tx) in keys.into_iter().zip(&keys_tx) {
            if !batch.is_empty() {
                let _ = tx.send(batch);
            }
        }
        drop(keys_tx);
        let keys_written = key_writers.into_iter().try_for_each(|w| {
            w.join()
                .unwrap_or_else(|_| Err(LedgerError::Unavailable("a key writer panicked".into())))
        });
        let read = reader.join().unwrap_or_else(|_| {
            Err(LedgerError::Unavailable(
                "the journal's reader panicked".into(),
            ))
        });
        written?;
        keys_written?;
        read?;
        crash_point!("rebuild.after_groups");
        let mut gathered: Vec<_> = gathered.into_iter().collect();
        gathered.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        for (key, value) in gathered {
            match value {
                Some(v) => tree.insert(key, v).map(drop),
                None => tree.remove(key).map(drop),
            }
            .map_err(io_err)?;
        }
        Ok(groups)
    })
}

/// Which key writer takes the operations on `key`: the same one always.
fn key_writer(key: &[u8]) -> usize {
    let h = key.iter().fold(0usize, |h, &b| {
        h.wrapping_mul(31).wrapping_add(usize::from(b))
    });
    h % KEY_WRITERS
}

fn op_key(op: &Op) -> &[u8] {
    match op {
        Op::Put { key, .. } | Op::Remove { key } => key,
    }
}

/// A record that groups rewrite again and again (see `committer::deferred_key`).
fn rewritten(key: &[u8]) -> bool {
    matches!(key.first(), Some(&(P_ACCOUNT | P_STATEMENT))) || key == STATS_KEY
}

/// Writes a base of the index as it stands at `group` (see [`recover::write_base`]).
pub(super) fn write_base(tree: &sled::Tree, path: &Path, group: u64) -> Result<u64> {
    recover::write_base(&OsFs, &path.join(JOURNAL_DIR), tree, group)
}

impl std::fmt::Display for IndexRebuild {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the index was rebuilt from the journal (the base at group {} and {} after it, \
             {} facts) in {} ms, because {}",
            self.base_group,
            crate::store::verify::count(self.groups, "group", "groups"),
            self.facts,
            self.ms,
            self.reason
        )?;
        if let Some(aside) = &self.aside {
            write!(f, "; the damaged files are kept in {aside}")?;
        }
        Ok(())
    }
}
