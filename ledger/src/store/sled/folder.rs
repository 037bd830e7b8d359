//! The ledger's folder on disk: its entries created and synced so that they survive a power
//! loss, sled's lock on it waited for when a ledger closes, and sled's writes made durable
//! (`flush_sled`). The opening, the checkpoints and a rebuild all need these, so they sit
//! below all three.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::store::LedgerError;

use super::error::Result;
use super::records::io_err;

/// The journal's folder inside the ledger's.
pub const JOURNAL_DIR: &str = "journal";

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

/// Waits, when dropped, until sled's lock on the folder is free again. Dropping sled's
/// last handle does not quite release the folder: its last buffer writes and file
/// truncations finish on sled's own I/O threads, which hold the data file (and with it the
/// lock) a moment longer. A reopen in the same process right after the drop (a restart in
/// tests, or after a storage failure) would then meet `Locked` now and then. Declared
/// before the sled handles in `open` and after them in `Shared`, so that it drops after.
pub(super) struct LockReleased {
    /// Set once sled holds the lock: a lock held by someone else is not ours to wait for.
    pub(super) data_file: Option<PathBuf>,
}

impl Drop for LockReleased {
    fn drop(&mut self) {
        if let Some(folder) = self.data_file.as_deref().and_then(Path::parent) {
            wait_until_released(folder);
            // sled renames its snapshot into place as it closes and never syncs the folder.
            // The journal needs none of sled's files, so this is for a quicker next open
            // only: best effort.
            let _ = sync_dir(folder);
        }
    }
}

/// Waits until sled's lock on the ledger folder `path` is free, for at most 10 s. Bounded,
/// so that a stuck sled thread cannot hang the caller: a reopen after the deadline answers
/// `Locked`, which says what is wrong. Anything that drops a raw sled handle on a ledger
/// folder and reopens it in the same process (a test that tampers with the tree) needs
/// this wait too.
#[doc(hidden)]
pub fn wait_until_released(path: &Path) {
    use fs2::FileExt as _;
    let Ok(file) = File::open(path.join("db")) else {
        return;
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while file.try_lock_exclusive().is_err() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    // Closing `file` releases the lock if it was taken.
}

/// Makes everything applied to sled so far durable in sled's own files: sled's flush, then
/// an fdatasync of its data file (`None`: syncs are off). sled's flush syncs with
/// `sync_file_range`, which flushes neither the drive's write cache nor the file's size;
/// fdatasync does both (ARCHITECTURE.md, durability).
pub(super) fn flush_sled(db: &sled::Db, data_file: Option<&std::fs::File>) -> Result<()> {
    db.flush().map_err(io_err)?;
    // sled has written, nothing is synced: a power loss here leaves its files holding any
    // part of those writes (the power-loss test cuts them so).
    crash_point!("checkpoint.before_sync");
    if let Some(f) = data_file {
        f.sync_data()
            .map_err(|e| LedgerError::Unavailable(format!("fdatasync: {e}")))?;
    }
    Ok(())
}
