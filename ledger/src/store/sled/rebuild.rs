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

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::committer::flush_sled;
use super::journal::{self, Op};
use super::records::{GROUP_KEY, io_err};
use super::{JOURNAL_DIR, SledConfig, open_err, sled_config};
use crate::store::{IndexRebuild, LedgerError};

type Result<T, E = LedgerError> = std::result::Result<T, E>;

/// Present in the ledger's folder while a rebuild is under way.
pub(super) const REBUILDING: &str = "rebuilding";
/// The folder, inside the ledger's, that damaged index files are moved into.
const ASIDE_PREFIX: &str = "damaged-";
/// The operations replayed are gathered (the last value of each key wins) up to about this
/// many bytes before they go into sled in key order: the balances, statement runs and stats
/// that every group rewrites reach sled once per batch instead of once per group.
const BATCH_BYTES: usize = 64 << 20;
/// A progress line every this many groups.
const PROGRESS_EVERY: u64 = 100_000;

/// Creates the ledger's folder when it does not exist, and syncs its entry into the parent
/// (and so on up to the first folder that existed), so that a new ledger's folder cannot
/// vanish with a power loss after its first acknowledged command.
pub(super) fn ensure_folder(path: &Path) -> Result<()> {
    let io = |what: &str, e: std::io::Error| {
        LedgerError::Unavailable(format!("{what} {}: {e}", path.display()))
    };
    if path.is_dir() {
        return Ok(());
    }
    let mut missing = Vec::new();
    let mut at = Some(path);
    while let Some(p) = at.filter(|p| !p.as_os_str().is_empty() && !p.exists()) {
        missing.push(p.to_path_buf());
        at = p.parent();
    }
    fs::create_dir_all(path).map_err(|e| io("creating", e))?;
    for created in missing {
        let parent = match created.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        sync_dir(&parent)?;
    }
    Ok(())
}

/// Syncs a folder, so that entries created, renamed or removed in it stay so.
pub(super) fn sync_dir(dir: &Path) -> Result<()> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| LedgerError::Unavailable(format!("syncing the folder {}: {e}", dir.display())))
}

/// Whether the log of record reaches back to the ledger's start: a base exists. A ledger
/// last opened by a build that deleted its journal's old segments has none until its next
/// open writes one.
pub(super) fn log_is_complete(path: &Path) -> Result<bool> {
    Ok(!journal::list_bases(&path.join(JOURNAL_DIR))?.is_empty())
}

/// Moves the index's files aside and builds a new index from the newest base and every
/// journal group after it. `reason` says why (kept in the report). Refuses, changing
/// nothing, when the log of record is incomplete or damaged in the middle.
pub(super) fn rebuild(config: &SledConfig, reason: &str) -> Result<IndexRebuild> {
    let started = Instant::now();
    let path = &config.path;
    let shown = path.display().to_string();
    let dir = path.join(JOURNAL_DIR);
    let progress = |line: String| config.progress.say(&line);
    let Some((base_group, base_path, _)) = journal::list_bases(&dir)?.pop() else {
        return Err(LedgerError::Corrupt {
            path: shown,
            detail: format!(
                "the index is damaged ({reason}), and the journal holds no base to rebuild it \
                 from: the ledger was last opened by a build that did not keep its log of \
                 record whole. Restore the folder from a backup"
            ),
        });
    };
    // Read the whole journal once before anything is changed: damage in its middle
    // refuses the rebuild here, with the damaged index still in place.
    let end = journal::read_groups(&dir, base_group, &mut |_| Ok(()))?;
    progress(format!(
        "rebuilding the index of {shown} from the journal ({reason}): the base at group \
         {base_group}, then groups {} to {}",
        base_group + 1,
        end.last_group
    ));

    // The index must not be in use: its files are about to move.
    if let Ok(db) = fs::File::open(path.join("db")) {
        use fs2::FileExt as _;
        if db.try_lock_exclusive().is_err() {
            return Err(LedgerError::Locked { path: shown });
        }
    }
    let interrupted = path.join(REBUILDING).exists();
    fs::File::create(path.join(REBUILDING))
        .and_then(|f| f.sync_all())
        .map_err(|e| LedgerError::Unavailable(format!("writing {shown}/{REBUILDING}: {e}")))?;
    sync_dir(path)?;
    let aside = if interrupted {
        // What is there is a partial index of our own making, not the damaged one (that
        // was moved aside by the rebuild that did not finish).
        remove_index_files(path)?;
        None
    } else {
        Some(move_aside(path)?)
    };
    sync_dir(path)?;

    let db = sled_config(config)
        .open()
        .map_err(|e| open_err(&shown, e))?;
    let tree = db.open_tree("ledger").map_err(|e| open_err(&shown, e))?;
    let mut batch = Batch::default();
    journal::read_base(&base_path, base_group, &mut |op| {
        batch.add(op, &tree)?;
        Ok(())
    })
    .map_err(LedgerError::from)?;
    crash_point!("rebuild.after_base");
    let mut groups = 0u64;
    let last = journal::read_groups(&dir, base_group, &mut |group| {
        for op in group.ops {
            batch.add(op, &tree)?;
        }
        groups += 1;
        if groups % PROGRESS_EVERY == 0 {
            progress(format!(
                "rebuilding: group {} of {} ({} facts)",
                group.number,
                end.last_group,
                group.seqs.end.saturating_sub(1)
            ));
        }
        Ok(())
    })?;
    batch.apply(&tree)?;
    tree.insert(GROUP_KEY, &last.last_group.to_be_bytes()[..])
        .map_err(io_err)?;
    let data_file = fs::File::open(path.join("db"))
        .map_err(|e| LedgerError::Unavailable(format!("opening the data file: {e}")))?;
    flush_sled(&db, Some(&data_file))?;
    drop((tree, db));
    super::wait_until_released(path);
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
        facts: last.last_seq.unwrap_or(0),
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

/// Operations gathered before they go into sled: the last of each key wins.
#[derive(Default)]
struct Batch {
    ops: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    bytes: usize,
}

impl Batch {
    fn add(&mut self, op: Op, tree: &sled::Tree) -> std::result::Result<(), journal::JournalError> {
        let (key, value) = match op {
            Op::Put { key, value } => (key, Some(value)),
            Op::Remove { key } => (key, None),
        };
        self.bytes += key.len() + value.as_ref().map_or(0, Vec::len) + 64;
        self.ops.insert(key, value);
        if self.bytes >= BATCH_BYTES {
            self.apply(tree).map_err(|e| journal::JournalError::Io {
                context: "rebuilding the index".into(),
                source: std::io::Error::other(e.to_string()),
            })?;
        }
        Ok(())
    }

    fn apply(&mut self, tree: &sled::Tree) -> Result<()> {
        for (key, value) in std::mem::take(&mut self.ops) {
            match value {
                Some(v) => tree.insert(key, v).map(drop),
                None => tree.remove(key).map(drop),
            }
            .map_err(io_err)?;
        }
        self.bytes = 0;
        Ok(())
    }
}

/// Writes a base of the index as it stands (every record but the checkpoint's mark) at
/// `group`: the groups up to it are all in `tree`. Called at open, with nothing else
/// writing, when the journal has no base yet; and by compaction, while groups after
/// `group` go on being applied: a record read after such a group changed it holds a later
/// value, which that group's replay writes again anyway.
pub(super) fn write_base(tree: &sled::Tree, path: &Path, group: u64) -> Result<u64> {
    let mut records = tree
        .iter()
        .filter(|r| !matches!(r, Ok((k, _)) if k.as_ref() == GROUP_KEY))
        .map(|r| {
            r.map(|(k, v)| (k.to_vec(), v.to_vec()))
                .map_err(|e| e.to_string())
        });
    Ok(journal::write_base(
        &path.join(JOURNAL_DIR),
        group,
        &mut records,
    )?)
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
