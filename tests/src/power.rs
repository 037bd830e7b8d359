//! A power loss under the sled store, made on its files after the process is killed: the
//! disk image a machine would hold had its power been cut at that moment. Every write the
//! store synced is there; of what it wrote since, each 4 KiB page reached the disk or did
//! not, independently (the kernel writes dirty pages back in any order), one of them only
//! in part (a torn write), and a file's unsynced change of length, creation or removal
//! happened or did not.
//!
//! The synced state of the index (sled's files) is a copy the crash child takes right
//! after each checkpoint's fdatasync (`checkpoint.synced`); the journal is synced at every
//! append, so its files stand as they are (its torn tails have tests of their own).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use rand::Rng;

/// The page a disk writes whole, or tears.
const PAGE: usize = 4096;

/// The index's files: everything in the ledger's folder but the journal, relative paths.
fn index_files(root: &Path) -> std::io::Result<BTreeSet<PathBuf>> {
    let mut out = BTreeSet::new();
    if !root.exists() {
        return Ok(out);
    }
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir)? {
            let path = entry?.path();
            let rel = path
                .strip_prefix(root)
                .map_err(std::io::Error::other)?
                .to_path_buf();
            if rel.starts_with(ledger::store::sled::JOURNAL_DIR) {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
            } else {
                out.insert(rel);
            }
        }
    }
    Ok(out)
}

/// Copies the index's files of `ledger` to `to` as they are now: written to `to`.tmp
/// first and then renamed, so that a kill in the middle leaves the previous copy whole.
pub fn copy_index(ledger: &Path, to: &Path) -> std::io::Result<()> {
    let tmp = to.with_extension("tmp");
    let old = to.with_extension("old");
    let _ = fs::remove_dir_all(&tmp);
    for rel in index_files(ledger)? {
        let dest = tmp.join(&rel);
        if let Some(parent) = dest.parent() {
            fs::create_dir_all(parent)?;
        }
        match fs::copy(ledger.join(&rel), &dest) {
            Ok(_) => {}
            // sled removed it meanwhile.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    fs::create_dir_all(&tmp)?;
    let _ = fs::remove_dir_all(&old);
    if to.exists() {
        fs::rename(to, &old)?;
    }
    fs::rename(&tmp, to)?;
    let _ = fs::remove_dir_all(&old);
    Ok(())
}

/// The copy [`copy_index`] left whole at `to`.
pub fn synced_copy(to: &Path) -> Option<PathBuf> {
    [to.to_path_buf(), to.with_extension("old")]
        .into_iter()
        .find(|p| p.is_dir())
}

/// What a cut did to the index's files.
#[derive(Debug, Default, Clone, Copy)]
pub struct Cut {
    /// Pages written since the sync, and how many of them the cut kept.
    pub pages_changed: usize,
    pub pages_kept: usize,
    /// Whether a page was torn.
    pub torn: bool,
    /// Files created or removed since the sync whose change the cut undid.
    pub files_undone: usize,
}

/// Turns the index's files of `ledger` into what a power loss could leave, given the
/// `synced` copy of them: see the module's comment.
pub fn power_cut(ledger: &Path, synced: &Path, rng: &mut impl Rng) -> std::io::Result<Cut> {
    let mut cut = Cut::default();
    let now = index_files(ledger)?;
    let then = index_files(synced)?;
    for rel in now.union(&then) {
        let (at, old) = (ledger.join(rel), synced.join(rel));
        match (now.contains(rel), then.contains(rel)) {
            (true, false) => {
                // Created since the sync: its folder entry may not have reached the disk.
                if rng.random_bool(0.5) {
                    fs::remove_file(&at)?;
                    cut.files_undone += 1;
                }
                continue;
            }
            (false, true) => {
                // Removed since the sync: the removal may not have reached the disk.
                if rng.random_bool(0.5) {
                    if let Some(parent) = at.parent() {
                        fs::create_dir_all(parent)?;
                    }
                    fs::copy(&old, &at)?;
                    cut.files_undone += 1;
                }
                continue;
            }
            _ => {}
        }
        let (new, old) = (fs::read(&at)?, fs::read(&old)?);
        if new == old {
            continue;
        }
        // An unsynced change of length may or may not have reached the disk.
        let len = if rng.random_bool(0.5) {
            new.len()
        } else {
            old.len()
        };
        let page = |bytes: &[u8], i: usize| -> Vec<u8> {
            let mut p = vec![0u8; PAGE];
            let from = (i * PAGE).min(bytes.len());
            let to = ((i + 1) * PAGE).min(bytes.len());
            p[..to - from].copy_from_slice(&bytes[from..to]);
            p
        };
        let pages = len.div_ceil(PAGE);
        let changed: Vec<usize> = (0..pages)
            .filter(|&i| page(&new, i) != page(&old, i))
            .collect();
        let torn = (!changed.is_empty()).then(|| changed[rng.random_range(0..changed.len())]);
        // Either the pages reached the disk in any order, or one large write (sled writes
        // its buffers 512 KiB at a time) reached it only up to the torn page.
        let prefix = rng.random_bool(0.3);
        let mut out = Vec::with_capacity(pages * PAGE);
        for i in 0..pages {
            let (n, o) = (page(&new, i), page(&old, i));
            if n == o {
                out.extend_from_slice(&n);
            } else if Some(i) == torn {
                // Only the first part of the page's write reached the disk.
                let k = rng.random_range(1..PAGE);
                out.extend_from_slice(&n[..k]);
                out.extend_from_slice(&o[k..]);
                cut.torn = true;
                cut.pages_changed += 1;
            } else {
                cut.pages_changed += 1;
                let kept = if prefix {
                    torn.is_some_and(|t| i < t)
                } else {
                    rng.random_bool(0.5)
                };
                if kept {
                    out.extend_from_slice(&n);
                    cut.pages_kept += 1;
                } else {
                    out.extend_from_slice(&o);
                }
            }
        }
        out.truncate(len);
        fs::write(&at, &out)?;
    }
    Ok(cut)
}
