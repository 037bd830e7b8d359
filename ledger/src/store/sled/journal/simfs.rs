//! A simulated disk for the journal: files in memory whose power can be cut, so that the
//! journal's own code (appends, new segments, bases, deletions, and its recovery) runs
//! over what a crash leaves, deterministically, from a seed.
//!
//! # What is durable
//!
//! Each file holds its durable content and, in order, the writes (and length changes) made
//! to it since its last sync. [`FsFile::sync_data`] and [`FsFile::sync_all`] make them all
//! durable; a write through a file opened with `O_DSYNC` is durable once it returns.
//!
//! Names are kept per folder: a file created, renamed or removed in a folder is so for
//! everyone at once, and durably only once the folder is synced ([`Fs::sync_dir`]). A file
//! synced whose name was not is lost with its name; a file removed whose removal was not
//! synced comes back with its durable content.
//!
//! # A power cut
//!
//! [`SimFs::crash`] returns the files as a power cut now would leave them, as a new file
//! system (this one is not changed, so the same moment can be crashed many ways). It takes
//! its choices from `choose(n)`, which must return a number below `n` (it is called only
//! with `n >= 2`; a larger answer is taken as `n - 1`), in this order:
//!
//! 1. For each folder with changes not yet synced, in path order: how many of them
//!    survive, `choose(changes + 1)`: the first that many, in order, as a journaled file
//!    system keeps them. Entries whose folder is lost are lost with it.
//! 2. For each file that survives by name, in path order, each of its unsynced changes in
//!    order: a write gets `choose(4)`: 0 lost, 1 kept whole, 2 torn (`choose(len)` of its
//!    first bytes survive), 3 kept with one bit flipped (bit `choose(8 * len)` of the
//!    write); a change of length gets `choose(2)`: 0 lost, 1 kept. `O_DSYNC` writes whose
//!    call returned are kept whole, with no choice.
//!
//! The same choices give the same files: a seeded generator's `|n| rng.below(n)` makes a
//! crash reproducible.
//!
//! # A crash in the middle of a call
//!
//! [`SimFs::power_off_after`] lets a number of changing calls (writes, syncs, length
//! changes, creations, renames, removals, folder syncs) complete and cuts the power during
//! the next: that call's change reaches the files but nothing of it is made durable (not
//! even an `O_DSYNC` write), and it fails, as does every call after it. [`SimFs::ops`]
//! counts the changing calls made, so a test can run once to count them and then cut the
//! power at any of them.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};

use super::fs::{Create, Fs, FsFile, Open};

/// The largest simulated file: a write or length past it is refused, so that a bad offset
/// fails instead of allocating without bound.
const MAX_LEN: u64 = 1 << 32;

/// A simulated file system. Cloning it gives another handle on the same files; see
/// [`SimFs::fork`] for a copy and [`SimFs::crash`] for what a power cut leaves.
#[derive(Clone, Default)]
pub struct SimFs {
    state: Arc<Mutex<State>>,
}

#[derive(Debug, Clone, Default)]
struct State {
    /// Every name as calls see it.
    live: BTreeMap<PathBuf, Node>,
    /// The names as of each folder's last sync.
    durable: BTreeMap<PathBuf, Node>,
    /// Per folder, the changes to its names since its last sync, in order.
    pending: BTreeMap<PathBuf, Vec<NameOp>>,
    inodes: BTreeMap<u64, Inode>,
    next_inode: u64,
    /// Changing calls left to complete before the power goes; `None`: it stays on.
    power: Option<u64>,
    off: bool,
    ops: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Node {
    Dir,
    File(u64),
}

#[derive(Debug, Clone)]
enum NameOp {
    Link(PathBuf, Node),
    Unlink(PathBuf),
    Rename(PathBuf, PathBuf),
}

#[derive(Debug, Clone, Default)]
struct Inode {
    durable: Vec<u8>,
    /// `durable` with `pending` applied: what reads see.
    live: Vec<u8>,
    pending: Vec<DataOp>,
}

#[derive(Debug, Clone)]
enum DataOp {
    Write {
        at: usize,
        bytes: Vec<u8>,
        /// Written with `O_DSYNC` and returned: durable whatever the crash.
        forced: bool,
    },
    SetLen(usize),
}

impl DataOp {
    fn apply(&self, content: &mut Vec<u8>) {
        match self {
            DataOp::Write { at, bytes, .. } => write_into(content, *at, bytes),
            DataOp::SetLen(len) => set_len(content, *len),
        }
    }
}

fn write_into(content: &mut Vec<u8>, at: usize, bytes: &[u8]) {
    let end = at + bytes.len();
    if content.len() < end {
        set_len(content, end);
    }
    content[at..end].copy_from_slice(bytes);
}

/// Cuts or extends `content` with zeros to `len`: by a zeroed allocation and a copy,
/// which are quick in a debug build where `resize` goes a byte at a time.
fn set_len(content: &mut Vec<u8>, len: usize) {
    if len <= content.len() {
        content.truncate(len);
    } else {
        let mut grown = vec![0u8; len];
        grown[..content.len()].copy_from_slice(content);
        *content = grown;
    }
}

fn power_off() -> io::Error {
    io::Error::other("the simulated power is off")
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: no such file or folder", path.display()),
    )
}

fn invalid(detail: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, detail)
}

/// A length or offset as an index, within [`MAX_LEN`].
fn index(v: u64) -> io::Result<usize> {
    usize::try_from(v)
        .ok()
        .filter(|_| v <= MAX_LEN)
        .ok_or_else(|| invalid(format!("{v} is past the simulated disk's largest file")))
}

fn is_root(path: &Path) -> bool {
    path.parent().is_none() || path.as_os_str().is_empty()
}

fn parent_of(path: &Path) -> &Path {
    path.parent().unwrap_or(Path::new(""))
}

fn apply_name(names: &mut BTreeMap<PathBuf, Node>, op: &NameOp) {
    match op {
        NameOp::Link(path, node) => {
            names.insert(path.clone(), *node);
        }
        NameOp::Unlink(path) => {
            names.remove(path);
        }
        NameOp::Rename(from, to) => {
            if let Some(node) = names.remove(from) {
                names.insert(to.clone(), node);
            }
        }
    }
}

impl State {
    fn check(&self) -> io::Result<()> {
        if self.off { Err(power_off()) } else { Ok(()) }
    }

    /// Counts a changing call. `true`: it completes; `false`: the power goes during it, and
    /// the caller makes its change volatile only and fails.
    fn begin(&mut self) -> io::Result<bool> {
        self.check()?;
        self.ops += 1;
        match &mut self.power {
            Some(0) => {
                self.off = true;
                Ok(false)
            }
            Some(left) => {
                *left -= 1;
                Ok(true)
            }
            None => Ok(true),
        }
    }

    fn is_dir(&self, path: &Path) -> bool {
        is_root(path) || self.live.get(path) == Some(&Node::Dir)
    }

    fn file(&self, path: &Path) -> io::Result<u64> {
        match self.live.get(path) {
            Some(Node::File(id)) => Ok(*id),
            Some(Node::Dir) => Err(io::Error::new(
                io::ErrorKind::IsADirectory,
                format!("{} is a folder", path.display()),
            )),
            None => Err(not_found(path)),
        }
    }

    fn inode(&mut self, id: u64) -> &mut Inode {
        self.inodes.entry(id).or_default()
    }

    fn name_op(&mut self, dir: &Path, op: NameOp) {
        apply_name(&mut self.live, &op);
        self.pending.entry(dir.to_path_buf()).or_default().push(op);
    }

    fn data_op(&mut self, id: u64, op: DataOp) {
        let inode = self.inode(id);
        op.apply(&mut inode.live);
        inode.pending.push(op);
    }
}

impl SimFs {
    /// An empty file system; only the root folder exists.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    /// A copy of the files as they are now, unsynced changes included, that goes its own
    /// way from here.
    pub fn fork(&self) -> SimFs {
        SimFs {
            state: Arc::new(Mutex::new(self.lock().clone())),
        }
    }

    /// Lets `ops` more changing calls complete, and cuts the power during the next one.
    pub fn power_off_after(&self, ops: u64) {
        self.lock().power = Some(ops);
    }

    /// Whether the power has been cut (every call fails).
    pub fn is_off(&self) -> bool {
        self.lock().off
    }

    /// The changing calls made so far (the one the power went during included).
    pub fn ops(&self) -> u64 {
        self.lock().ops
    }

    /// Every file by path, with its content as calls see it now.
    pub fn files(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        let st = self.lock();
        st.live
            .iter()
            .filter_map(|(path, node)| match node {
                Node::File(id) => Some((
                    path.clone(),
                    st.inodes
                        .get(id)
                        .map(|i| i.live.clone())
                        .unwrap_or_default(),
                )),
                Node::Dir => None,
            })
            .collect()
    }

    /// Changes a file's content as the disk holds it, now and after any crash: damage, not
    /// a write (nothing is pending, nothing counts as a call, and the power is not asked).
    pub fn damage(&self, path: &Path, change: impl Fn(&mut Vec<u8>)) -> io::Result<()> {
        let mut st = self.lock();
        let id = st.file(path)?;
        let inode = st.inode(id);
        change(&mut inode.durable);
        change(&mut inode.live);
        Ok(())
    }

    /// The files as a power cut now leaves them, as a new file system with its power on and
    /// nothing pending; this one is unchanged. `choose(n)` answers each choice with a
    /// number below `n`, in the order the module documentation gives.
    pub fn crash(&self, mut choose: impl FnMut(u64) -> u64) -> SimFs {
        let st = self.lock();
        let mut pick = |n: u64| if n <= 1 { 0 } else { choose(n).min(n - 1) };
        let count = |len: usize| u64::try_from(len).unwrap_or(u64::MAX);
        let at = |v: u64| usize::try_from(v).unwrap_or(0);

        let mut names = st.durable.clone();
        for ops in st.pending.values() {
            let keep = at(pick(count(ops.len()) + 1));
            for op in &ops[..keep] {
                apply_name(&mut names, op);
            }
        }
        // Paths sort by component, a folder before what it holds: one pass drops whatever
        // lost its folder.
        let mut kept: BTreeMap<PathBuf, Node> = BTreeMap::new();
        for (path, node) in names {
            let parent = parent_of(&path);
            if is_root(parent) || kept.get(parent) == Some(&Node::Dir) {
                kept.insert(path, node);
            }
        }

        let mut inodes = BTreeMap::new();
        for node in kept.values() {
            let Node::File(id) = *node else { continue };
            if inodes.contains_key(&id) {
                continue;
            }
            let Some(inode) = st.inodes.get(&id) else {
                inodes.insert(id, Inode::default());
                continue;
            };
            let mut content = inode.durable.clone();
            for op in &inode.pending {
                match op {
                    DataOp::Write {
                        bytes,
                        forced: true,
                        ..
                    } if !bytes.is_empty() => op.apply(&mut content),
                    DataOp::Write { at: off, bytes, .. } if !bytes.is_empty() => match pick(4) {
                        0 => {}
                        1 => op.apply(&mut content),
                        2 => {
                            let survive = at(pick(count(bytes.len())));
                            write_into(&mut content, *off, &bytes[..survive]);
                        }
                        _ => {
                            let bit = at(pick(count(bytes.len()) * 8));
                            let mut flipped = bytes.clone();
                            flipped[bit / 8] ^= 1 << (bit % 8);
                            write_into(&mut content, *off, &flipped);
                        }
                    },
                    DataOp::Write { .. } => {}
                    DataOp::SetLen(_) => {
                        if pick(2) == 1 {
                            op.apply(&mut content);
                        }
                    }
                }
            }
            inodes.insert(
                id,
                Inode {
                    durable: content.clone(),
                    live: content,
                    pending: Vec::new(),
                },
            );
        }
        SimFs {
            state: Arc::new(Mutex::new(State {
                live: kept.clone(),
                durable: kept,
                pending: BTreeMap::new(),
                inodes,
                next_inode: st.next_inode,
                power: None,
                off: false,
                ops: 0,
            })),
        }
    }
}

impl fmt::Debug for SimFs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.lock();
        f.debug_struct("SimFs")
            .field("names", &st.live.len())
            .field("ops", &st.ops)
            .field("off", &st.off)
            .finish_non_exhaustive()
    }
}

impl Fs for SimFs {
    type File = SimFile;

    fn open(&self, path: &Path, how: Open) -> io::Result<SimFile> {
        let mut st = self.lock();
        st.check()?;
        let dir = parent_of(path);
        if !st.is_dir(dir) {
            return Err(not_found(dir));
        }
        let id = match (st.live.get(path).copied(), how.create) {
            (Some(_), Create::New) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} exists", path.display()),
                ));
            }
            (Some(_), Create::No) => st.file(path)?,
            (Some(_), Create::Truncate) => {
                let id = st.file(path)?;
                let whole = st.begin()?;
                st.data_op(id, DataOp::SetLen(0));
                if !whole {
                    return Err(power_off());
                }
                id
            }
            (None, Create::No) => return Err(not_found(path)),
            (None, Create::New | Create::Truncate) => {
                let whole = st.begin()?;
                st.next_inode += 1;
                let id = st.next_inode;
                st.inodes.insert(id, Inode::default());
                st.name_op(dir, NameOp::Link(path.to_path_buf(), Node::File(id)));
                if !whole {
                    return Err(power_off());
                }
                id
            }
        };
        Ok(SimFile {
            fs: self.clone(),
            id,
            path: path.to_path_buf(),
            read: how.read,
            write: how.write,
            dsync: how.dsync,
        })
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let mut st = self.lock();
        st.check()?;
        let id = st.file(path)?;
        Ok(st.inode(id).live.clone())
    }

    fn len(&self, path: &Path) -> io::Result<u64> {
        let mut st = self.lock();
        st.check()?;
        if st.is_dir(path) {
            return Ok(0);
        }
        let id = st.file(path)?;
        Ok(st.inode(id).live.len() as u64)
    }

    fn exists(&self, path: &Path) -> bool {
        let st = self.lock();
        !st.off && (is_root(path) || st.live.contains_key(path))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut st = self.lock();
        st.check()?;
        st.file(from)?;
        let dir = parent_of(from);
        if parent_of(to) != dir {
            return Err(invalid(format!(
                "{} and {} are in different folders",
                from.display(),
                to.display()
            )));
        }
        if st.live.get(to) == Some(&Node::Dir) {
            return Err(io::Error::new(
                io::ErrorKind::IsADirectory,
                format!("{} is a folder", to.display()),
            ));
        }
        let whole = st.begin()?;
        st.name_op(dir, NameOp::Rename(from.to_path_buf(), to.to_path_buf()));
        if whole { Ok(()) } else { Err(power_off()) }
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut st = self.lock();
        st.check()?;
        st.file(path)?;
        let whole = st.begin()?;
        st.name_op(parent_of(path), NameOp::Unlink(path.to_path_buf()));
        if whole { Ok(()) } else { Err(power_off()) }
    }

    fn read_dir(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        let st = self.lock();
        st.check()?;
        if !st.is_dir(dir) {
            return Err(not_found(dir));
        }
        Ok(st
            .live
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .cloned()
            .collect())
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut st = self.lock();
        st.check()?;
        let mut missing = Vec::new();
        for ancestor in dir.ancestors() {
            if is_root(ancestor) {
                break;
            }
            match st.live.get(ancestor) {
                Some(Node::Dir) => break,
                Some(Node::File(_)) => {
                    return Err(io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        format!("{} is a file", ancestor.display()),
                    ));
                }
                None => missing.push(ancestor.to_path_buf()),
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        let whole = st.begin()?;
        for path in missing.into_iter().rev() {
            let parent = parent_of(&path).to_path_buf();
            st.name_op(&parent, NameOp::Link(path, Node::Dir));
        }
        if whole { Ok(()) } else { Err(power_off()) }
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut st = self.lock();
        st.check()?;
        if !st.is_dir(dir) {
            return Err(not_found(dir));
        }
        if !st.begin()? {
            return Err(power_off());
        }
        let st = &mut *st;
        for op in st.pending.remove(dir).unwrap_or_default() {
            apply_name(&mut st.durable, &op);
        }
        Ok(())
    }

    fn threads(&self) -> bool {
        false
    }
}

/// An open file of a [`SimFs`].
pub struct SimFile {
    fs: SimFs,
    id: u64,
    path: PathBuf,
    read: bool,
    write: bool,
    dsync: bool,
}

impl fmt::Debug for SimFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimFile")
            .field("path", &self.path)
            .field("dsync", &self.dsync)
            .finish_non_exhaustive()
    }
}

impl SimFile {
    fn writable(&self) -> io::Result<()> {
        if self.write {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{} is not open for writing", self.path.display()),
            ))
        }
    }

    fn change(&self, op: DataOp) -> io::Result<()> {
        let mut st = self.fs.lock();
        st.check()?;
        let whole = st.begin()?;
        let op = match op {
            DataOp::Write { at, bytes, .. } => DataOp::Write {
                at,
                bytes,
                forced: self.dsync && whole,
            },
            op @ DataOp::SetLen(_) => op,
        };
        st.data_op(self.id, op);
        if whole { Ok(()) } else { Err(power_off()) }
    }

    fn sync(&self) -> io::Result<()> {
        let mut st = self.fs.lock();
        if !st.begin()? {
            return Err(power_off());
        }
        let inode = st.inode(self.id);
        for op in std::mem::take(&mut inode.pending) {
            op.apply(&mut inode.durable);
        }
        Ok(())
    }
}

impl FsFile for SimFile {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.writable()?;
        let at = index(offset)?;
        index(offset.saturating_add(buf.len() as u64))?;
        self.change(DataOp::Write {
            at,
            bytes: buf.to_vec(),
            forced: false,
        })
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        if !self.read {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{} is not open for reading", self.path.display()),
            ));
        }
        let mut st = self.fs.lock();
        st.check()?;
        let content = &st.inode(self.id).live;
        let from = usize::try_from(offset).map_or(content.len(), |o| o.min(content.len()));
        let n = buf.len().min(content.len() - from);
        buf[..n].copy_from_slice(&content[from..from + n]);
        Ok(n)
    }

    fn size(&self) -> io::Result<u64> {
        let mut st = self.fs.lock();
        st.check()?;
        Ok(st.inode(self.id).live.len() as u64)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.sync()
    }

    fn sync_all(&self) -> io::Result<()> {
        self.sync()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.writable()?;
        self.change(DataOp::SetLen(index(len)?))
    }

    fn allocate(&self, len: u64) -> io::Result<()> {
        self.writable()?;
        let len = index(len)?;
        let short = {
            let mut st = self.fs.lock();
            st.check()?;
            st.inode(self.id).live.len() < len
        };
        if short {
            self.change(DataOp::SetLen(len))
        } else {
            // Blocks reserved, nothing a crash could undo: still a call.
            let mut st = self.fs.lock();
            if st.begin()? {
                Ok(())
            } else {
                Err(power_off())
            }
        }
    }
}

#[cfg(test)]
mod tests;
