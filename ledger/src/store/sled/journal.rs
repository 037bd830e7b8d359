//! The journal: an append-only log of groups, in files of our own beside sled's, that makes
//! each group durable with one write and one sync. A group is what one commit writes: a
//! list of absolute operations on sled keys (put this value, remove this key). Replaying a
//! group applies those operations to sled again; because every value is absolute, a group
//! replayed twice leaves sled as replaying it once does.
//!
//! # On disk
//!
//! The journal is a folder of segment files, `00000000000000000001.jnl`, each named by the
//! number of the first group it holds (20 decimal digits, so names sort in group order).
//! Groups are numbered 1, 2, 3, ... with no gap, across segments. A segment holds records
//! back to back from offset 0; after the last record comes either the end of the file or
//! zeros (the preallocated rest of the segment). A record never spans two segments: one
//! that does not fit in the rest of the current segment starts the next one, and one
//! larger than a segment gets a segment of its own, sized to fit.
//!
//! One record per group, little-endian, version 1:
//!
//! ```text
//! offset size  field
//!  0      4    magic "IJnl"
//!  4      1    version (1)
//!  5      3    reserved, zero
//!  8      4    payload length in bytes (u32)
//! 12      8    group number (u64)
//! 20      8    first fact seq the group carries (u64)
//! 28      8    end of the fact seqs, exclusive (u64); equal to the first: no facts
//!              (a group that only quarantines or sweeps)
//! 36      4    CRC32C of bytes 0..36 followed by the payload
//! 40      ...  payload:
//!                varint  number of operations
//!                then each operation:
//!                  u8 1 (put)    varint key length, key, varint value length, value
//!                  u8 2 (remove) varint key length, key
//! ```
//!
//! Varints are unsigned LEB128 (7 bits a byte, low bits first, at most 10 bytes). The
//! checksum is CRC32C (Castagnoli, the `crc32c` crate).
//!
//! # Writing
//!
//! [`Journal::append`] encodes a group into one buffer, writes it at the end of the current
//! segment with one positioned write (`pwrite`), then makes it durable with one
//! `fdatasync`, or, with [`SyncMode::Dsync`], with no call at all because the segment is
//! open with `O_DSYNC` and the write itself returns only once durable. Nothing may be
//! acknowledged before `append` returns. A failed append leaves the journal refusing every
//! further append until it is reopened: after a failed write or sync, what the file holds
//! past the last good record is unknown, and a later record written after it could turn a
//! torn write into damage followed by a valid record. A group whose append failed, or was
//! cut short by a crash after its write, may still be found whole at the next open: it was
//! written, only its sync had not returned. Nobody was told of it, and it is replayed like
//! any other.
//!
//! Segments are preallocated ([`Preallocate`]): with zeros written in advance, each append
//! overwrites blocks that are already allocated and written, so its sync carries no change
//! of the file's size or block map and costs about what a bare `pwrite` + `fdatasync` of
//! the same bytes costs. A new segment is written, synced, and its folder entry synced
//! before any record goes into it. By default the next segment is made ahead, on a thread
//! of its own (`spare.making`, then `spare.ready` once whole and synced), and the append
//! that needs it only renames it into place.
//!
//! # Files
//!
//! Every file operation goes through an [`Fs`] (see [`fs`]): the journal is
//! `Journal<F: Fs = OsFs>`, where [`OsFs`] is the disk through `std::fs`, call for call,
//! and [`simfs::SimFs`] a disk in memory whose power can be cut, over which the
//! simulation and the tests run this same code, recovery included. Generic rather than
//! `dyn`, so that the append path on disk compiles to the same direct calls as it would
//! without the seam. A file system that wants no threads ([`Fs::threads`]: the simulated
//! one) gets its spare segment made inline, at the moment it is asked for, instead of on
//! the thread, so that a seeded run makes the same calls in the same order every time.
//!
//! # Recovery
//!
//! [`Journal::open`] is given the checkpoint: the last group the index (sled) holds
//! durably. It reads the segments that may hold later groups and returns those groups, in
//! order, to replay. Every record read is checked: magic, length within its segment,
//! checksum, then version and group number (each one more than the previous, the first of
//! a segment equal to its name). Where a record fails, the rest of the journal is searched
//! for a whole record of a later group:
//!
//! - none: the failed record is a torn tail, a write that never completed and so was never
//!   acknowledged. The segment is cut back to the end of the last whole record (and any
//!   later segment, which then holds no whole record, is removed), the cut is synced, and
//!   the journal opens at the last whole record. A preallocated segment cut back has no
//!   room left, so the next append starts a new one.
//! - one: the failed record was followed by valid ones, so it is damage, not an interrupted
//!   write: opening is refused with [`JournalError::Corrupt`], naming the segment and the
//!   offset, and nothing is changed.
//!
//! Zeros after the last record are the normal end. A journal that does not reach the
//! checkpoint, or whose first segment begins after it, has lost groups the index needs
//! from it: opening is refused ([`JournalError::Discontinuous`]).
//!
//! # The log of record
//!
//! The journal is kept whole: a checkpoint (sled flushed) deletes nothing, so every group
//! since the ledger's newest base stays here, and the index (sled) can always be rebuilt
//! from this folder alone. A base, `base-<group, 20 digits>.snap`, is the state the groups
//! up to its number left: every record of the index as absolute puts, in records of the
//! same format as a group's (each numbered with the base's group), written to
//! `base.making`, synced, renamed into place and its folder synced, so a base that exists
//! is whole. Replaying every group after a base onto it gives the index; so does replaying
//! from any earlier group, since every value is absolute. Once a newer base is durable,
//! [`Journal::drop_through`] deletes the segments wholly at or below it and the older
//! bases: the folder holds one base and the groups after it.

use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use crossbeam_channel::Sender;

use crate::store::LedgerError;

pub mod fs;
#[doc(hidden)]
pub mod simfs;

pub use fs::{Fs, FsFile, Open, OsFs};
use fs::{ReadAt, WriteAt};

/// The extension of segment files.
pub const SEGMENT_EXT: &str = "jnl";
const MAGIC: [u8; 4] = *b"IJnl";
const VERSION: u8 = 1;
/// The fixed part of a record, before its payload.
pub const HEADER_LEN: usize = 40;
const CRC_AT: usize = 36;
const TAG_PUT: u8 = 1;
const TAG_REMOVE: u8 = 2;
/// Zeros are written in pieces of this size when a segment is preallocated.
const ZEROS_CHUNK: usize = 1 << 20;
/// The smallest segment: a header and a little payload.
const SEGMENT_MIN: u64 = 4096;
/// The segment made ahead: written under the first name, renamed to the second once whole
/// and synced. Neither ends in `.jnl`, so a scan never reads them.
const SPARE_MAKING: &str = "spare.making";
const SPARE_READY: &str = "spare.ready";
/// A base being written; renamed to its `base-<group>.snap` name once whole and synced.
const BASE_MAKING: &str = "base.making";
const BASE_PREFIX: &str = "base-";
const BASE_EXT: &str = "snap";
/// A base's operations are written in records of about this many bytes each.
const BASE_RECORD: usize = 1 << 20;
/// A spare's zeros are written and synced a piece of this size at a time, each followed by
/// a pause as long as the piece took: an append's sync then queues behind at most one
/// piece, and the disk is idle for appends at least half the time while a spare is made.
const SPARE_PIECE: usize = 256 << 10;

type Result<T, E = JournalError> = std::result::Result<T, E>;

// ---- options ---------------------------------------------------------------------------

/// How an append becomes durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    /// `pwrite`, then `fdatasync`.
    Fdatasync,
    /// The segment is opened with `O_DSYNC`: the `pwrite` returns once the data is durable.
    Dsync,
    /// No sync at all: for tests and benchmarks that measure everything but the disk. A
    /// crash of the machine (not of the process) can lose acknowledged groups.
    Never,
}

/// How a new segment's space is reserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preallocate {
    /// Zeros written over the whole segment, then synced: appends overwrite written
    /// blocks, so their syncs write no file metadata.
    Zeros,
    /// `posix_fallocate`: blocks reserved but not written (ext4 marks them unwritten), so
    /// each append's sync still records that the blocks now hold data.
    Fallocate,
    /// Nothing: the file grows with each append, and each sync also writes its new size.
    Grow,
}

/// How a journal is kept.
#[derive(Debug, Clone)]
pub struct JournalOptions {
    /// The size a segment is preallocated to (at least 4096 bytes); a larger record gets a
    /// segment of its own, sized to fit.
    pub segment_size: u64,
    pub sync: SyncMode,
    pub preallocate: Preallocate,
    /// Keep the next segment made ahead, on a thread of its own, so that the append that
    /// starts a segment renames a ready file instead of writing a segment's worth of zeros
    /// (tens to hundreds of milliseconds for 64 MiB) while commits wait. Not used with
    /// [`Preallocate::Grow`], whose segments cost nothing to make. Over a file system that
    /// wants no threads ([`Fs::threads`]), the spare is made inline when asked for.
    pub prepare_ahead: bool,
}

impl Default for JournalOptions {
    fn default() -> Self {
        Self {
            segment_size: 64 * 1024 * 1024,
            sync: SyncMode::Fdatasync,
            preallocate: Preallocate::Zeros,
            prepare_ahead: true,
        }
    }
}

// ---- groups ----------------------------------------------------------------------------

/// One absolute operation on a sled key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Put { key: Vec<u8>, value: Vec<u8> },
    Remove { key: Vec<u8> },
}

/// What one commit writes: its number, the fact seqs it carries, and its operations.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Group {
    /// 1, 2, 3, ...: one more than the previous group.
    pub number: u64,
    /// The seqs of the facts in this group; empty when it carries none.
    pub seqs: Range<u64>,
    pub ops: Vec<Op>,
}

impl Group {
    pub fn new(number: u64, seqs: Range<u64>) -> Self {
        Self {
            number,
            seqs,
            ops: Vec::new(),
        }
    }

    pub fn put(&mut self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) {
        self.ops.push(Op::Put {
            key: key.into(),
            value: value.into(),
        });
    }

    pub fn remove(&mut self, key: impl Into<Vec<u8>>) {
        self.ops.push(Op::Remove { key: key.into() });
    }

    /// Applies the group's operations to sled's memory, in order, one insert (or remove)
    /// each: what committing and replaying it do. Not as one `apply_batch`: that rolls
    /// sled's I/O buffer and writes its log twice, waking sled's I/O threads each time,
    /// about as long as the journal's own sync. The journal makes the group atomic: a
    /// crash may leave sled's disk holding any part of the groups after its checkpoint,
    /// and recovery replays all of them, whose values are absolute. Readers never see a
    /// key record before its fact, because a group puts a fact before its key record.
    pub fn apply(&self, tree: &sled::Tree) -> sled::Result<()> {
        for op in &self.ops {
            match op {
                Op::Put { key, value } => {
                    tree.insert(key.as_slice(), value.as_slice())?;
                }
                Op::Remove { key } => {
                    tree.remove(key.as_slice())?;
                }
            }
        }
        Ok(())
    }

    /// The length of this group's record on disk.
    pub fn record_len(&self) -> usize {
        let ops: usize = self
            .ops
            .iter()
            .map(|op| match op {
                Op::Put { key, value } => {
                    1 + varint_len(key.len()) + key.len() + varint_len(value.len()) + value.len()
                }
                Op::Remove { key } => 1 + varint_len(key.len()) + key.len(),
            })
            .sum();
        HEADER_LEN + varint_len(self.ops.len()) + ops
    }
}

// ---- errors ----------------------------------------------------------------------------

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// A record failed its checks and a whole record of a later group follows it, or a
    /// whole record says something impossible: damage, never an interrupted write.
    #[error("journal segment {} is damaged at offset {offset}: {detail}", segment.display())]
    Corrupt {
        segment: PathBuf,
        offset: u64,
        detail: String,
    },
    /// The journal does not hold every group after the checkpoint.
    #[error("the journal in {} does not continue the index: {detail}", dir.display())]
    Discontinuous { dir: PathBuf, detail: String },
    #[error("journal: {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    /// A group given to `append` that cannot be written as it is; nothing was written.
    #[error("journal: group {number} cannot be appended: {detail}")]
    Invalid { number: u64, detail: String },
    /// An earlier append failed; the journal takes no more until reopened.
    #[error("the journal failed earlier and takes no more writes until reopened: {0}")]
    Failed(String),
}

impl From<JournalError> for LedgerError {
    fn from(e: JournalError) -> Self {
        match e {
            JournalError::Corrupt {
                ref segment,
                offset,
                ref detail,
            } => LedgerError::Corrupt {
                path: segment.display().to_string(),
                detail: format!("journal record at offset {offset}: {detail}"),
            },
            JournalError::Discontinuous { ref dir, .. } => LedgerError::Corrupt {
                path: dir.display().to_string(),
                detail: e.to_string(),
            },
            other => LedgerError::Unavailable(other.to_string()),
        }
    }
}

fn io_at(context: impl Into<String>) -> impl FnOnce(io::Error) -> JournalError {
    let context = context.into();
    move |source| JournalError::Io { context, source }
}

// ---- the journal -----------------------------------------------------------------------

/// What opening found: the groups after the checkpoint, to replay in order.
#[derive(Debug, Default)]
pub struct Recovery {
    pub groups: Vec<Group>,
    /// The number the next appended group must have.
    pub next_group: u64,
    /// Where a torn tail was cut off, if one was.
    pub truncated: Option<Truncated>,
}

/// A torn tail that opening cut off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncated {
    /// The segment cut back (removed when the cut was at its start).
    pub segment: PathBuf,
    /// Where it now ends: the end of the last whole record in it.
    pub offset: u64,
    /// Why the record there was not whole.
    pub reason: &'static str,
    /// Later segments removed, which held no whole record.
    pub segments_removed: usize,
}

/// The journal's size, for the metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JournalStats {
    pub segments: usize,
    /// The segment files' sizes, preallocated space included.
    pub bytes: u64,
    /// Groups in the journal's segments, since its first segment's first group.
    pub records: u64,
}

#[derive(Debug)]
struct Segment {
    first_group: u64,
    path: PathBuf,
    len: u64,
}

/// The segment appends go to.
#[derive(Debug)]
struct Current<T> {
    file: T,
    /// Where the next record is written.
    end: u64,
    /// Where the segment's room ends.
    capacity: u64,
}

/// An open journal; the only writer of its folder. Its files are `F`'s: the disk's by
/// default, a simulated disk's in the simulation (see [`fs`]).
#[derive(Debug)]
pub struct Journal<F: Fs = OsFs> {
    fs: F,
    dir: PathBuf,
    options: JournalOptions,
    /// In group order; the last is the one appended to, if `current` is set.
    segments: Vec<Segment>,
    current: Option<Current<F::File>>,
    next_group: u64,
    /// The encoding buffer, kept between appends.
    buf: Vec<u8>,
    failed: Option<String>,
    spare: Option<Spare<F>>,
}

impl Journal<OsFs> {
    /// Opens (or creates) the journal in `dir`. `checkpoint` is the last group the index
    /// holds durably (0: none); the groups after it come back in [`Recovery::groups`].
    /// Refuses to open on damage, and changes nothing then; cuts off a torn tail.
    pub fn open(
        dir: &Path,
        options: JournalOptions,
        checkpoint: u64,
    ) -> Result<(Journal, Recovery)> {
        Journal::open_with(OsFs, dir, options, checkpoint)
    }
}

impl<F: Fs> Journal<F> {
    /// [`Journal::open`] over the file system `fs`.
    pub fn open_with(
        fs: F,
        dir: &Path,
        options: JournalOptions,
        checkpoint: u64,
    ) -> Result<(Journal<F>, Recovery)> {
        if options.segment_size < SEGMENT_MIN {
            return Err(JournalError::Invalid {
                number: 0,
                detail: format!(
                    "segment size {} is below the least, {SEGMENT_MIN} bytes",
                    options.segment_size
                ),
            });
        }
        if !fs.exists(dir) {
            fs.create_dir_all(dir)
                .map_err(io_at(format!("creating {}", dir.display())))?;
            if let Some(parent) = dir.parent() {
                sync_dir(&fs, parent)?;
            }
        }
        let mut segments = list_segments(&fs, dir)?;
        let mut groups = Vec::new();
        let scan = scan(
            &fs,
            dir,
            &segments,
            checkpoint,
            Some(&mut |g| {
                groups.push(g);
                Ok(())
            }),
        )?;

        // Decided: from here on, only the cut of a torn tail (or of an empty last segment)
        // changes anything.
        let mut ends = scan.ends;
        let mut truncated = None;
        let mut removed_any = false;
        if let Some(tail) = &scan.torn {
            for later in segments.drain(tail.segment + 1..).rev() {
                fs.remove_file(&later.path)
                    .map_err(io_at(format!("removing {}", later.path.display())))?;
                removed_any = true;
            }
            let seg = &mut segments[tail.segment];
            truncated = Some(Truncated {
                segment: seg.path.clone(),
                offset: tail.offset,
                reason: tail.reason,
                segments_removed: scan.later_segments,
            });
            ends.truncate(tail.segment + 1);
            if tail.offset == 0 {
                fs.remove_file(&seg.path)
                    .map_err(io_at(format!("removing {}", seg.path.display())))?;
                removed_any = true;
                segments.pop();
                ends.pop();
            } else {
                let file = fs
                    .open(&seg.path, Open::WRITE)
                    .map_err(io_at(format!("opening {}", seg.path.display())))?;
                file.set_len(tail.offset)
                    .map_err(io_at(format!("cutting {}", seg.path.display())))?;
                file.sync_all()
                    .map_err(io_at(format!("syncing {}", seg.path.display())))?;
                seg.len = tail.offset;
                ends[tail.segment] = Some(tail.offset);
            }
        } else if ends.last() == Some(&Some(0)) {
            // A last segment holding no record: made for a record whose append never
            // returned. The next append makes its own, under the same name.
            if let Some(seg) = segments.pop() {
                fs.remove_file(&seg.path)
                    .map_err(io_at(format!("removing {}", seg.path.display())))?;
                removed_any = true;
            }
            ends.pop();
        }
        if removed_any {
            sync_dir(&fs, dir)?;
        }
        // A spare left by an earlier run holds only zeros; a new one is made below. Its
        // removal needs no sync: one that reappears after a crash is removed again.
        for name in [SPARE_MAKING, SPARE_READY] {
            match fs.remove_file(&dir.join(name)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    return Err(io_at(format!("removing {}", dir.join(name).display()))(e));
                }
                _ => {}
            }
        }

        let current = match (segments.last(), ends.last()) {
            (Some(seg), Some(Some(end))) => {
                let file = open_segment(&fs, &seg.path, options.sync)?;
                let capacity = match options.preallocate {
                    Preallocate::Grow => seg.len.max(options.segment_size),
                    Preallocate::Zeros | Preallocate::Fallocate => seg.len,
                };
                Some(Current {
                    file,
                    end: *end,
                    capacity,
                })
            }
            // The last segment was not read (all its groups are at or below the
            // checkpoint, and the one after it was removed): appends start a new one.
            _ => None,
        };
        let spare = (options.prepare_ahead && options.preallocate != Preallocate::Grow)
            .then(|| Spare::start(&fs, dir, &options))
            .transpose()?;
        let journal = Journal {
            fs,
            dir: dir.to_path_buf(),
            options,
            segments,
            current,
            next_group: scan.next_group,
            buf: Vec::new(),
            failed: None,
            spare,
        };
        let recovery = Recovery {
            groups,
            next_group: scan.next_group,
            truncated,
        };
        Ok((journal, recovery))
    }

    /// Appends `group` and makes it durable: one `pwrite`, then one `fdatasync` (or none,
    /// under `O_DSYNC`). Only after this returns may anyone be told of the group.
    /// `group.number` must be [`Journal::next_group`].
    pub fn append(&mut self, group: &Group) -> Result<()> {
        if let Some(reason) = &self.failed {
            return Err(JournalError::Failed(reason.clone()));
        }
        if group.number != self.next_group {
            return Err(JournalError::Invalid {
                number: group.number,
                detail: format!("the journal's next group is {}", self.next_group),
            });
        }
        if group.seqs.start > group.seqs.end {
            return Err(JournalError::Invalid {
                number: group.number,
                detail: format!(
                    "its seqs {}..{} run backwards",
                    group.seqs.start, group.seqs.end
                ),
            });
        }
        let mut buf = std::mem::take(&mut self.buf);
        let written = encode(group, &mut buf).and_then(|()| self.write_record(&buf));
        self.buf = buf;
        match written {
            Ok(()) => {
                self.next_group += 1;
                Ok(())
            }
            Err(e @ JournalError::Invalid { .. }) => Err(e),
            Err(e) => {
                self.failed = Some(e.to_string());
                Err(e)
            }
        }
    }

    fn write_record(&mut self, record: &[u8]) -> Result<()> {
        let len = record.len() as u64;
        let fits = self
            .current
            .as_ref()
            .is_some_and(|c| c.end + len <= c.capacity);
        if !fits {
            self.start_segment(len)?;
        }
        let Some(current) = self.current.as_mut() else {
            return Err(JournalError::Failed("no segment to write to".into()));
        };
        let path = match self.segments.last() {
            Some(s) => s.path.as_path(),
            None => self.dir.as_path(),
        };
        // The error's words are formatted only on failure: this is the commit path.
        let failed = |what: &str, source| JournalError::Io {
            context: format!("{what} {}", path.display()),
            source,
        };
        crash_point!("journal.before_write");
        current
            .file
            .write_all_at(record, current.end)
            .map_err(|e| failed("writing", e))?;
        crash_point!("journal.after_write");
        if self.options.sync == SyncMode::Fdatasync {
            current
                .file
                .sync_data()
                .map_err(|e| failed("fdatasync of", e))?;
        }
        crash_point!("journal.after_sync");
        current.end += len;
        if let Some(seg) = self.segments.last_mut() {
            seg.len = seg.len.max(current.end);
        }
        Ok(())
    }

    /// Makes the segment for the next group, sized for at least `record` bytes: created,
    /// preallocated and synced, and its name synced into the folder, before any record is
    /// written to it.
    fn start_segment(&mut self, record: u64) -> Result<()> {
        let size = self.options.segment_size.max(record);
        let path = self.dir.join(segment_name(self.next_group));
        let shown = path.display().to_string();
        if size == self.options.segment_size
            && let Some(spare) = &self.spare
            && spare.ready.swap(false, Ordering::AcqRel)
        {
            let ready = self.dir.join(SPARE_READY);
            self.fs
                .rename(&ready, &path)
                .map_err(io_at(format!("renaming {} to {shown}", ready.display())))?;
            sync_dir(&self.fs, &self.dir)?;
            // Asked for only now: its first writes would otherwise join the folder's sync.
            spare.want();
            let file = open_segment(&self.fs, &path, self.options.sync)?;
            self.started(path, file, size);
            return Ok(());
        }
        if let Some(spare) = &self.spare {
            // Used up (or not made yet): the next one is made while this segment fills.
            spare.want();
        }
        let file = self
            .fs
            .open(&path, Open::CREATE_NEW)
            .map_err(io_at(format!("creating {shown}")))?;
        match self.options.preallocate {
            Preallocate::Zeros => {
                write_zeros(&file, size).map_err(io_at(format!("writing zeros over {shown}")))?
            }
            Preallocate::Fallocate => file
                .allocate(size)
                .map_err(io_at(format!("preallocating {shown}")))?,
            Preallocate::Grow => {}
        }
        if self.options.preallocate != Preallocate::Grow {
            file.sync_all().map_err(io_at(format!("syncing {shown}")))?;
        }
        sync_dir(&self.fs, &self.dir)?;
        let file = match self.options.sync {
            SyncMode::Fdatasync | SyncMode::Never => file,
            SyncMode::Dsync => open_segment(&self.fs, &path, SyncMode::Dsync)?,
        };
        self.started(path, file, size);
        Ok(())
    }

    /// Appends go to the segment at `path` from now on.
    fn started(&mut self, path: PathBuf, file: F::File, size: u64) {
        self.segments.push(Segment {
            first_group: self.next_group,
            path,
            len: if self.options.preallocate == Preallocate::Grow {
                0
            } else {
                size
            },
        });
        self.current = Some(Current {
            file,
            end: 0,
            capacity: size,
        });
    }

    /// A base of the index at `base_group` is durable: deletes the segments whose groups
    /// are all at or below it (never the one appended to) and every older base, and syncs
    /// the folder. Returns how many segments were deleted.
    pub fn drop_through(&mut self, base_group: u64) -> Result<usize> {
        if base_group >= self.next_group {
            return Err(JournalError::Invalid {
                number: base_group,
                detail: format!(
                    "a base past the journal's last group, {}",
                    self.next_group - 1
                ),
            });
        }
        // A segment is wholly at or below the base when the next one starts at or below the
        // group after it.
        let deletable = self
            .segments
            .windows(2)
            .take_while(|w| w[1].first_group <= base_group + 1)
            .count();
        crash_point!("compact.before_delete");
        let mut deleted = 0;
        let mut result = Ok(());
        for seg in &self.segments[..deletable] {
            if let Err(e) = self.fs.remove_file(&seg.path) {
                result = Err(io_at(format!("deleting {}", seg.path.display()))(e));
                break;
            }
            deleted += 1;
        }
        self.segments.drain(..deleted);
        let mut removed_base = false;
        for (group, path, _) in list_bases_with(&self.fs, &self.dir)? {
            if group < base_group && result.is_ok() {
                if let Err(e) = self.fs.remove_file(&path) {
                    result = Err(io_at(format!("deleting {}", path.display()))(e));
                }
                removed_base = true;
            }
        }
        if deleted > 0 || removed_base {
            sync_dir(&self.fs, &self.dir)?;
        }
        crash_point!("compact.after_delete");
        result.map(|()| deleted)
    }

    /// The bytes of the segments whose groups are all at or below `group`: what a base at
    /// `group` would let [`Journal::drop_through`] delete.
    pub fn bytes_through(&self, group: u64) -> u64 {
        self.segments
            .windows(2)
            .take_while(|w| w[1].first_group <= group + 1)
            .map(|w| w[0].len)
            .sum()
    }

    /// The number the next appended group must have.
    pub fn next_group(&self) -> u64 {
        self.next_group
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file system the journal's files are on.
    pub fn fs(&self) -> &F {
        &self.fs
    }

    pub fn stats(&self) -> JournalStats {
        JournalStats {
            segments: self.segments.len(),
            bytes: self.segments.iter().map(|s| s.len).sum(),
            records: self
                .segments
                .first()
                .map_or(0, |s| self.next_group - s.first_group),
        }
    }
}

impl<F: Fs> Drop for Journal<F> {
    fn drop(&mut self) {
        if let Some(spare) = self.spare.take() {
            spare.stop();
        }
    }
}

/// What makes the next segment ahead of need: one spare at a time, each asked for when the
/// previous is taken (and once at open). On a thread of its own, or, when the file system
/// wants no threads ([`Fs::threads`]), inline, at the moment it is asked for.
#[derive(Debug)]
struct Spare<F: Fs> {
    /// Set once `spare.ready` is whole and synced; taken back by the append that renames it.
    ready: Arc<AtomicBool>,
    maker: Maker<F>,
}

#[derive(Debug)]
enum Maker<F: Fs> {
    Thread {
        stopping: Arc<AtomicBool>,
        wanted: Sender<()>,
        thread: Option<JoinHandle<()>>,
    },
    Inline {
        fs: F,
        dir: PathBuf,
        size: u64,
        preallocate: Preallocate,
        /// A spare failed: appends make their segments themselves from then on, as when
        /// the thread stops on a failure.
        failed: AtomicBool,
    },
}

impl<F: Fs> Spare<F> {
    fn start(fs: &F, dir: &Path, options: &JournalOptions) -> Result<Spare<F>> {
        let ready = Arc::new(AtomicBool::new(false));
        let (dir, size, preallocate) =
            (dir.to_path_buf(), options.segment_size, options.preallocate);
        if !fs.threads() {
            let spare = Spare {
                ready,
                maker: Maker::Inline {
                    fs: fs.clone(),
                    dir,
                    size,
                    preallocate,
                    failed: AtomicBool::new(false),
                },
            };
            spare.want();
            return Ok(spare);
        }
        let stopping = Arc::new(AtomicBool::new(false));
        let (wanted, asked) = crossbeam_channel::bounded::<()>(1);
        let thread = {
            let (ready, stopping, fs) = (ready.clone(), stopping.clone(), fs.clone());
            std::thread::Builder::new()
                .name("idem-journal-spare".into())
                .spawn(move || {
                    while asked.recv().is_ok() && !stopping.load(Ordering::Acquire) {
                        // One spare at a time: a second made while one is ready would
                        // replace it under the append that is about to rename it, and
                        // leave `ready` set with no file behind it.
                        if ready.load(Ordering::Acquire) {
                            continue;
                        }
                        match make_spare(&fs, &dir, size, preallocate, &stopping, true) {
                            Ok(true) => ready.store(true, Ordering::Release),
                            // Stopped, or failed: appends make their segments themselves,
                            // and a failure that matters shows there.
                            Ok(false) | Err(_) => break,
                        }
                    }
                })
                .map_err(io_at("starting the thread that makes segments ahead"))?
        };
        let spare = Spare {
            ready,
            maker: Maker::Thread {
                stopping,
                wanted,
                thread: Some(thread),
            },
        };
        spare.want();
        Ok(spare)
    }

    fn want(&self) {
        match &self.maker {
            Maker::Thread { wanted, .. } => {
                // Full: already asked for, and not yet begun.
                let _ = wanted.try_send(());
            }
            Maker::Inline {
                fs,
                dir,
                size,
                preallocate,
                failed,
            } => {
                if self.ready.load(Ordering::Acquire) || failed.load(Ordering::Acquire) {
                    return;
                }
                let never = AtomicBool::new(false);
                match make_spare(fs, dir, *size, *preallocate, &never, false) {
                    Ok(made) => self.ready.store(made, Ordering::Release),
                    Err(_) => failed.store(true, Ordering::Release),
                }
            }
        }
    }

    /// Stops the thread (within one piece of zeros) and waits for it.
    fn stop(self) {
        if let Maker::Thread {
            stopping,
            wanted,
            mut thread,
        } = self.maker
        {
            stopping.store(true, Ordering::Release);
            let _ = wanted.try_send(());
            if let Some(thread) = thread.take() {
                let _ = thread.join();
            }
        }
    }
}

/// Writes a spare segment of `size` bytes and renames it ready; `false` if stopped first.
/// With `pace`, each piece of zeros is followed by a pause as long as it took.
fn make_spare<F: Fs>(
    fs: &F,
    dir: &Path,
    size: u64,
    preallocate: Preallocate,
    stopping: &AtomicBool,
    pace: bool,
) -> io::Result<bool> {
    let making = dir.join(SPARE_MAKING);
    let file = fs.open(&making, Open::TRUNCATE)?;
    match preallocate {
        Preallocate::Fallocate => file.allocate(size)?,
        Preallocate::Zeros | Preallocate::Grow => {
            let zeros = vec![0u8; SPARE_PIECE];
            let mut at = 0u64;
            while at < size {
                if stopping.load(Ordering::Acquire) {
                    return Ok(false);
                }
                let n =
                    usize::try_from(size - at).map_or(SPARE_PIECE, |left| left.min(SPARE_PIECE));
                let started = std::time::Instant::now();
                file.write_all_at(&zeros[..n], at)?;
                file.sync_data()?;
                at += n as u64;
                if pace {
                    std::thread::sleep(started.elapsed());
                }
            }
        }
    }
    if stopping.load(Ordering::Acquire) {
        return Ok(false);
    }
    file.sync_all()?;
    fs.rename(&making, &dir.join(SPARE_READY))?;
    fs.sync_dir(dir)?;
    Ok(true)
}

/// The name of the segment whose first group is `group`.
pub fn segment_name(group: u64) -> String {
    format!("{group:020}.{SEGMENT_EXT}")
}

fn open_segment<F: Fs>(fs: &F, path: &Path, sync: SyncMode) -> Result<F::File> {
    fs.open(path, Open::READ_WRITE.dsync(sync == SyncMode::Dsync))
        .map_err(io_at(format!("opening {}", path.display())))
}

fn write_zeros<T: FsFile>(file: &T, size: u64) -> io::Result<()> {
    let zeros = vec![0u8; ZEROS_CHUNK];
    let mut at = 0u64;
    while at < size {
        let n = usize::try_from(size - at).map_or(ZEROS_CHUNK, |left| left.min(ZEROS_CHUNK));
        file.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

/// Syncs a folder, so that the files created or removed in it stay so after a crash.
fn sync_dir<F: Fs>(fs: &F, dir: &Path) -> Result<()> {
    fs.sync_dir(dir)
        .map_err(io_at(format!("syncing the folder {}", dir.display())))
}

/// The segments in `dir`, in group order.
fn list_segments<F: Fs>(fs: &F, dir: &Path) -> Result<Vec<Segment>> {
    let mut segments = Vec::new();
    let entries = fs
        .read_dir(dir)
        .map_err(io_at(format!("listing {}", dir.display())))?;
    for path in entries {
        if path.extension().and_then(|e| e.to_str()) != Some(SEGMENT_EXT) {
            continue;
        }
        let first_group = path
            .file_stem()
            .and_then(|s| s.to_str())
            .filter(|s| s.len() == 20 && s.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|s| s.parse::<u64>().ok())
            .filter(|&g| g > 0)
            .ok_or_else(|| JournalError::Discontinuous {
                dir: dir.to_path_buf(),
                detail: format!(
                    "{} is not named like a segment (the number of its first group, 20 digits)",
                    path.display()
                ),
            })?;
        let len = fs
            .len(&path)
            .map_err(io_at(format!("reading {}", path.display())))?;
        segments.push(Segment {
            first_group,
            path,
            len,
        });
    }
    segments.sort_by_key(|s| s.first_group);
    Ok(segments)
}

// ---- reading the log of record ------------------------------------------------------------

/// Reads every group after `after` in `dir`, in order, and gives each to `visit`, changing
/// nothing: the rebuild's read of the log of record. With no `visit`, only checks the
/// records (see [`scan`]). Returns the last whole group (`after` when none follows it).
/// Refuses, as [`Journal::open`] does, when the journal does not continue from `after` or
/// is damaged before its end; a torn tail ends the read (the next open cuts it). A missing
/// folder holds no group.
pub fn read_groups(
    dir: &Path,
    after: u64,
    visit: Option<&mut dyn FnMut(Group) -> Result<()>>,
) -> Result<u64> {
    read_groups_with(&OsFs, dir, after, visit)
}

/// [`read_groups`] over the file system `fs`.
pub fn read_groups_with<F: Fs>(
    fs: &F,
    dir: &Path,
    after: u64,
    visit: Option<&mut dyn FnMut(Group) -> Result<()>>,
) -> Result<u64> {
    if !fs.exists(dir) {
        return Ok(after);
    }
    let segments = list_segments(fs, dir)?;
    Ok(scan(fs, dir, &segments, after, visit)?.next_group - 1)
}

/// The name of the base of the index at `group`.
pub fn base_name(group: u64) -> String {
    format!("{BASE_PREFIX}{group:020}.{BASE_EXT}")
}

/// The bases in `dir` (group, path, bytes), oldest first.
pub fn list_bases(dir: &Path) -> Result<Vec<(u64, PathBuf, u64)>> {
    list_bases_with(&OsFs, dir)
}

/// [`list_bases`] over the file system `fs`.
pub fn list_bases_with<F: Fs>(fs: &F, dir: &Path) -> Result<Vec<(u64, PathBuf, u64)>> {
    let mut bases = Vec::new();
    let entries = match fs.read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(bases),
        Err(e) => return Err(io_at(format!("listing {}", dir.display()))(e)),
    };
    for path in entries {
        let group = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix(BASE_PREFIX))
            .and_then(|n| n.strip_suffix(BASE_EXT))
            .and_then(|n| n.strip_suffix('.'))
            .filter(|n| n.len() == 20 && n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|n| n.parse::<u64>().ok());
        if let Some(group) = group {
            let len = fs
                .len(&path)
                .map_err(io_at(format!("reading {}", path.display())))?;
            bases.push((group, path, len));
        }
    }
    bases.sort_by_key(|b| b.0);
    Ok(bases)
}

/// Writes a base of the index at `group` from `records` (every record of the index, in any
/// order): to `base.making`, synced, then renamed to its name and the folder synced, so
/// that a base found under its name is whole. Returns its size in bytes. An error leaves
/// at most `base.making`, which the next base replaces.
pub fn write_base(
    dir: &Path,
    group: u64,
    records: &mut dyn Iterator<Item = std::result::Result<(Vec<u8>, Vec<u8>), String>>,
) -> Result<u64> {
    write_base_with(&OsFs, dir, group, records)
}

/// [`write_base`] over the file system `fs`.
pub fn write_base_with<F: Fs>(
    fs: &F,
    dir: &Path,
    group: u64,
    records: &mut dyn Iterator<Item = std::result::Result<(Vec<u8>, Vec<u8>), String>>,
) -> Result<u64> {
    use std::io::Write as _;
    let making = dir.join(BASE_MAKING);
    let shown = making.display().to_string();
    let file = fs
        .open(&making, Open::TRUNCATE)
        .map_err(io_at(format!("creating {shown}")))?;
    let mut out = io::BufWriter::with_capacity(BASE_RECORD + 4096, WriteAt { file: &file, at: 0 });
    let mut chunk = Group::new(group, 0..0);
    let mut chunk_len = 0usize;
    let mut written = 0u64;
    let mut buf = Vec::new();
    let mut flush_chunk =
        |chunk: &mut Group, out: &mut io::BufWriter<WriteAt<'_, F::File>>| -> Result<u64> {
            encode(chunk, &mut buf)?;
            out.write_all(&buf)
                .map_err(io_at(format!("writing {shown}")))?;
            chunk.ops.clear();
            // Each record of a base says which it is, so that a reader can tell them in order.
            chunk.seqs = chunk.seqs.start + 1..chunk.seqs.start + 1;
            Ok(buf.len() as u64)
        };
    for record in records {
        let (key, value) = record.map_err(|detail| JournalError::Io {
            context: format!("reading the index for {shown}"),
            source: io::Error::other(detail),
        })?;
        chunk_len += key.len() + value.len() + 8;
        chunk.put(key, value);
        if chunk_len >= BASE_RECORD {
            written += flush_chunk(&mut chunk, &mut out)?;
            chunk_len = 0;
        }
    }
    if !chunk.ops.is_empty() || written == 0 {
        written += flush_chunk(&mut chunk, &mut out)?;
    }
    out.into_inner()
        .map_err(|e| io_at(format!("writing {shown}"))(e.into_error()))?;
    file.sync_all().map_err(io_at(format!("syncing {shown}")))?;
    let path = dir.join(base_name(group));
    fs.rename(&making, &path)
        .map_err(io_at(format!("renaming {shown} to {}", path.display())))?;
    sync_dir(fs, dir)?;
    Ok(written)
}

/// Reads the base at `path` and gives each of its operations to `visit`, in order. The
/// base is whole by construction (renamed into place once synced), so any record that
/// fails its checks is damage: refused.
pub fn read_base(path: &Path, group: u64, visit: &mut dyn FnMut(Op) -> Result<()>) -> Result<()> {
    read_base_with(&OsFs, path, group, visit)
}

/// [`read_base`] over the file system `fs`.
pub fn read_base_with<F: Fs>(
    fs: &F,
    path: &Path,
    group: u64,
    visit: &mut dyn FnMut(Op) -> Result<()>,
) -> Result<()> {
    use std::io::Read as _;
    let file = fs
        .open(path, Open::READ)
        .map_err(io_at(format!("opening {}", path.display())))?;
    let mut input = io::BufReader::with_capacity(BASE_RECORD + 4096, ReadAt { file, at: 0 });
    let mut record = Vec::new();
    let mut at = 0u64;
    let mut index = 0u64;
    loop {
        record.resize(HEADER_LEN, 0);
        match input.read_exact(&mut record) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof && index > 0 => return Ok(()),
            Err(e) => return Err(io_at(format!("reading {}", path.display()))(e)),
        }
        let corrupt = |detail: String| JournalError::Corrupt {
            segment: path.to_path_buf(),
            offset: at,
            detail,
        };
        if record[..MAGIC.len()] != MAGIC {
            return Err(corrupt("no record header where one should begin".into()));
        }
        let payload = u32::from_le_bytes(array(&record[8..12])) as usize;
        record.resize(HEADER_LEN + payload, 0);
        input
            .read_exact(&mut record[HEADER_LEN..])
            .map_err(|e| corrupt(format!("a record cut short: {e}")))?;
        let Frame::Whole(header) = frame_at(&record, 0) else {
            return Err(corrupt("a record failing its checks".into()));
        };
        header.check().map_err(corrupt)?;
        if header.group != group || header.seqs.start != index {
            return Err(corrupt(format!(
                "record {} of base {} where record {index} of base {group} belongs",
                header.seqs.start, header.group
            )));
        }
        let ops = decode_ops(&record[header.payload.clone()])
            .map_err(|d| corrupt(format!("a whole record whose payload does not decode: {d}")))?;
        for op in ops {
            visit(op)?;
        }
        at += record.len() as u64;
        index += 1;
    }
}

// ---- scanning --------------------------------------------------------------------------

/// What the scan of the segments decided, before anything is changed.
struct Scan {
    next_group: u64,
    /// Per segment: where its records end, if it was read.
    ends: Vec<Option<u64>>,
    torn: Option<Torn>,
    /// Segments after the torn one.
    later_segments: usize,
}

struct Torn {
    segment: usize,
    offset: u64,
    reason: &'static str,
}

/// Reads the segments that may hold groups after `checkpoint` and gives each such group to
/// `visit`, in order, as it is read: a caller that must not act on a journal found damaged
/// further on reads it twice, or collects first. With no `visit`, the records are checked
/// (framing, checksum, numbering) but their operations not decoded.
fn scan<F: Fs>(
    fs: &F,
    dir: &Path,
    segments: &[Segment],
    checkpoint: u64,
    mut visit: Option<&mut dyn FnMut(Group) -> Result<()>>,
) -> Result<Scan> {
    // Segments whose groups are all at or below the checkpoint are not read.
    let first_read = segments
        .windows(2)
        .take_while(|w| w[1].first_group <= checkpoint.saturating_add(1))
        .count();
    let mut expected = segments
        .get(first_read)
        .map_or(checkpoint.saturating_add(1), |s| s.first_group);
    if expected > checkpoint.saturating_add(1) {
        return Err(JournalError::Discontinuous {
            dir: dir.to_path_buf(),
            detail: format!(
                "the index holds groups up to {checkpoint}, but the journal begins at group \
                 {expected}: groups {} to {} are missing",
                checkpoint + 1,
                expected - 1
            ),
        });
    }
    let mut ends = vec![None; segments.len()];
    let mut torn = None;
    'segments: for (i, seg) in segments.iter().enumerate().skip(first_read) {
        let bytes = fs
            .read(&seg.path)
            .map_err(io_at(format!("reading {}", seg.path.display())))?;
        if seg.first_group != expected {
            return Err(JournalError::Discontinuous {
                dir: dir.to_path_buf(),
                detail: format!(
                    "segment {} is named for group {}, but the group after the previous \
                     segment's last is {expected}",
                    seg.path.display(),
                    seg.first_group
                ),
            });
        }
        let mut at = 0usize;
        loop {
            match frame_at(&bytes, at) {
                Frame::End => break,
                Frame::Damaged(reason) => {
                    let offset = at as u64;
                    if let Some((found_seg, found_at, group)) =
                        find_later(fs, segments, i, &bytes, at + 1, expected)?
                    {
                        return Err(JournalError::Corrupt {
                            segment: seg.path.clone(),
                            offset,
                            detail: format!(
                                "{reason}, and a whole record of a later group ({group}) \
                                 follows at offset {found_at} of {}, so this is damage, not \
                                 an interrupted write",
                                found_seg.display()
                            ),
                        });
                    }
                    torn = Some(Torn {
                        segment: i,
                        offset,
                        reason,
                    });
                    ends[i] = Some(offset);
                    break 'segments;
                }
                Frame::Whole(header) => {
                    let corrupt = |detail: String| JournalError::Corrupt {
                        segment: seg.path.clone(),
                        offset: at as u64,
                        detail,
                    };
                    header.check().map_err(corrupt)?;
                    if header.group != expected {
                        return Err(corrupt(format!(
                            "the record is of group {}, where group {expected} belongs",
                            header.group
                        )));
                    }
                    if header.group > checkpoint
                        && let Some(visit) = visit.as_mut()
                    {
                        let ops = decode_ops(&bytes[header.payload.clone()]).map_err(|d| {
                            corrupt(format!("a whole record whose payload does not decode: {d}"))
                        })?;
                        visit(Group {
                            number: header.group,
                            seqs: header.seqs.clone(),
                            ops,
                        })?;
                    }
                    expected += 1;
                    at = header.payload.end;
                }
            }
        }
        ends[i] = Some(at as u64);
    }
    let last = expected - 1;
    if last < checkpoint {
        return Err(JournalError::Discontinuous {
            dir: dir.to_path_buf(),
            detail: format!(
                "the index holds groups up to {checkpoint}, but the journal ends at group {last}"
            ),
        });
    }
    let later_segments = torn
        .as_ref()
        .map_or(0, |t: &Torn| segments.len() - t.segment - 1);
    Ok(Scan {
        next_group: expected,
        ends,
        torn,
        later_segments,
    })
}

/// A whole record of group `min_group` or later after a failed one: from `from` in the
/// failed segment's `bytes`, then in every later segment. Returns where it is.
fn find_later<F: Fs>(
    fs: &F,
    segments: &[Segment],
    failed: usize,
    bytes: &[u8],
    from: usize,
    min_group: u64,
) -> Result<Option<(PathBuf, usize, u64)>> {
    if let Some((at, group)) = find_whole(bytes, from, min_group) {
        return Ok(Some((segments[failed].path.clone(), at, group)));
    }
    for seg in &segments[failed + 1..] {
        let later = fs
            .read(&seg.path)
            .map_err(io_at(format!("reading {}", seg.path.display())))?;
        if let Some((at, group)) = find_whole(&later, 0, min_group) {
            return Ok(Some((seg.path.clone(), at, group)));
        }
    }
    Ok(None)
}

/// The first whole record of group `min_group` or later at or after `from`, looked for at
/// every offset where the magic appears: a damaged record's length cannot be trusted to
/// find the next one.
fn find_whole(bytes: &[u8], from: usize, min_group: u64) -> Option<(usize, u64)> {
    let mut at = from;
    while at + MAGIC.len() <= bytes.len() {
        let next = bytes[at..].iter().position(|&b| b == MAGIC[0])?;
        at += next;
        if let Frame::Whole(header) = frame_at(bytes, at)
            && header.group >= min_group
        {
            return Some((at, header.group));
        }
        at += 1;
    }
    None
}

/// A record's header, once its length and checksum held.
struct Header {
    version: u8,
    reserved: [u8; 3],
    group: u64,
    seqs: Range<u64>,
    payload: Range<usize>,
}

impl Header {
    /// What a whole record must also satisfy. One that fails was written so (its checksum
    /// holds): by a newer build, or by a bug, and never a torn write.
    fn check(&self) -> std::result::Result<(), String> {
        if self.version != VERSION {
            return Err(format!(
                "a record of version {}, and this build reads version {VERSION}",
                self.version
            ));
        }
        if self.reserved != [0; 3] {
            return Err("a record whose reserved bytes are not zero".into());
        }
        if self.seqs.start > self.seqs.end {
            return Err(format!(
                "a record whose seqs run backwards ({}..{})",
                self.seqs.start, self.seqs.end
            ));
        }
        Ok(())
    }
}

enum Frame {
    Whole(Header),
    /// Only zeros (or nothing) from here to the end of the segment.
    End,
    Damaged(&'static str),
}

/// Whether `bytes` are all zero. Compared a page at a time with slice equality (a
/// `memcmp`), because a segment's preallocated rest is megabytes read at every open.
fn all_zeros(bytes: &[u8]) -> bool {
    const PAGE: [u8; 4096] = [0; 4096];
    bytes.chunks(PAGE.len()).all(|c| c == &PAGE[..c.len()])
}

fn frame_at(bytes: &[u8], at: usize) -> Frame {
    let rest = &bytes[at.min(bytes.len())..];
    if rest.get(..MAGIC.len()) != Some(&MAGIC[..]) {
        return if all_zeros(rest) {
            Frame::End
        } else {
            Frame::Damaged("no record header where one should begin")
        };
    }
    if rest.len() < HEADER_LEN {
        return Frame::Damaged("a record header cut short by the end of the segment");
    }
    let payload_len = u32::from_le_bytes(array(&rest[8..12])) as usize;
    let Some(end) = HEADER_LEN
        .checked_add(payload_len)
        .filter(|&end| end <= rest.len())
    else {
        return Frame::Damaged("a record longer than what is left of the segment");
    };
    let stored = u32::from_le_bytes(array(&rest[CRC_AT..HEADER_LEN]));
    let computed = crc32c::crc32c_append(crc32c::crc32c(&rest[..CRC_AT]), &rest[HEADER_LEN..end]);
    if stored != computed {
        return Frame::Damaged("a record failing its checksum");
    }
    Frame::Whole(Header {
        version: rest[4],
        reserved: array(&rest[5..8]),
        group: u64::from_le_bytes(array(&rest[12..20])),
        seqs: u64::from_le_bytes(array(&rest[20..28]))..u64::from_le_bytes(array(&rest[28..36])),
        payload: at + HEADER_LEN..at + end,
    })
}

fn array<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(bytes);
    out
}

// ---- encoding --------------------------------------------------------------------------

/// Writes `group`'s record into `out` (cleared first).
fn encode(group: &Group, out: &mut Vec<u8>) -> Result<()> {
    out.clear();
    out.reserve(group.record_len());
    out.resize(HEADER_LEN, 0);
    put_varint(out, group.ops.len() as u64);
    for op in &group.ops {
        match op {
            Op::Put { key, value } => {
                out.push(TAG_PUT);
                put_bytes(out, key);
                put_bytes(out, value);
            }
            Op::Remove { key } => {
                out.push(TAG_REMOVE);
                put_bytes(out, key);
            }
        }
    }
    let payload_len = u32::try_from(out.len() - HEADER_LEN).map_err(|_| JournalError::Invalid {
        number: group.number,
        detail: format!(
            "its payload of {} bytes is over the 4 GiB a record holds",
            out.len() - HEADER_LEN
        ),
    })?;
    out[0..4].copy_from_slice(&MAGIC);
    out[4] = VERSION;
    out[8..12].copy_from_slice(&payload_len.to_le_bytes());
    out[12..20].copy_from_slice(&group.number.to_le_bytes());
    out[20..28].copy_from_slice(&group.seqs.start.to_le_bytes());
    out[28..36].copy_from_slice(&group.seqs.end.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&out[..CRC_AT]), &out[HEADER_LEN..]);
    out[CRC_AT..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

pub(super) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v.to_le_bytes()[0] | 0x80);
        v >>= 7;
    }
    out.push(v.to_le_bytes()[0]);
}

fn varint_len(v: usize) -> usize {
    let bits = usize::BITS - (v | 1).leading_zeros();
    bits.div_ceil(7) as usize
}

/// Reads a payload; each length is checked against what is left, so no input can make it
/// allocate more than the payload's size or read past it.
fn decode_ops(mut payload: &[u8]) -> std::result::Result<Vec<Op>, String> {
    let count = take_varint(&mut payload)?;
    // Every operation takes at least two bytes, which bounds a believable count.
    let count = usize::try_from(count)
        .ok()
        .filter(|&c| c <= payload.len() / 2)
        .ok_or_else(|| format!("{count} operations cannot fit in {} bytes", payload.len()))?;
    let mut ops = Vec::with_capacity(count);
    for _ in 0..count {
        let (&tag, rest) = payload
            .split_first()
            .ok_or("the payload ends before its operations do")?;
        payload = rest;
        let key = take_bytes(&mut payload)?;
        ops.push(match tag {
            TAG_PUT => Op::Put {
                key,
                value: take_bytes(&mut payload)?,
            },
            TAG_REMOVE => Op::Remove { key },
            other => return Err(format!("an operation of unknown kind {other}")),
        });
    }
    if !payload.is_empty() {
        return Err(format!(
            "{} bytes left after the last operation",
            payload.len()
        ));
    }
    Ok(ops)
}

pub(super) fn take_varint(input: &mut &[u8]) -> std::result::Result<u64, String> {
    let mut v = 0u64;
    for (i, &b) in input.iter().enumerate().take(10) {
        let bits = u64::from(b & 0x7f);
        if i == 9 && b > 1 {
            return Err("a varint over 64 bits".into());
        }
        v |= bits << (7 * i);
        if b & 0x80 == 0 {
            *input = &input[i + 1..];
            return Ok(v);
        }
    }
    Err("a varint cut short".into())
}

fn take_bytes(input: &mut &[u8]) -> std::result::Result<Vec<u8>, String> {
    let len = take_varint(input)?;
    let len = usize::try_from(len)
        .ok()
        .filter(|&l| l <= input.len())
        .ok_or_else(|| format!("a length of {len} with {} bytes left", input.len()))?;
    let (bytes, rest) = input.split_at(len);
    *input = rest;
    Ok(bytes.to_vec())
}

#[cfg(test)]
mod sim_tests;
#[cfg(test)]
mod tests;
