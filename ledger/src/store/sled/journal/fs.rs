//! The journal's seam to storage: every file operation the journal makes goes through an
//! [`Fs`], so that the same code (appends, segments, bases, and above all recovery: the
//! cut of a torn tail, the refusal of damage followed by valid records) runs over the
//! real disk ([`OsFs`]) and over a simulated one whose power can be cut
//! ([`SimFs`](super::simfs::SimFs)).
//!
//! The seam is narrow: what the journal does, and nothing more. Create or open a file,
//! write and read at a position, its length, sync its data (`fdatasync`) or all of it
//! (`fsync`), set its length, preallocate it; read a whole file, rename, remove, list a
//! folder, create one, and sync one (so that the names created, renamed or removed in it
//! stay so after a crash).
//!
//! # Why generic and not `dyn`
//!
//! [`Fs`] has an associated file type, and the journal is generic over it
//! (`Journal<F: Fs = OsFs>`), rather than holding `Box<dyn File>`s. The append path
//! (one positioned write and one sync per group) then compiles for [`OsFs`] to the same
//! direct calls on a `std::fs::File` as before the seam existed: no allocation, no vtable,
//! no lock, and `OsFs` itself is a zero-sized value. The default type parameter keeps
//! `Journal` meaning the journal on disk, so code that names it needs no change. The cost
//! is that the journal's code is compiled once per file system, which is twice: the disk's
//! and the simulator's.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

/// How a file is opened: the few combinations the journal uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Open {
    pub read: bool,
    pub write: bool,
    pub create: Create,
    /// `O_DSYNC`: a write returns only once its data is durable.
    pub dsync: bool,
}

/// Whether opening a file may create it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Create {
    /// The file must exist.
    No,
    /// The file must not exist; it is created empty (`O_CREAT | O_EXCL`).
    New,
    /// Created if missing, emptied if present (`O_CREAT | O_TRUNC`).
    Truncate,
}

impl Open {
    /// An existing file, for reading.
    pub const READ: Open = Open {
        read: true,
        write: false,
        create: Create::No,
        dsync: false,
    };
    /// An existing file, for writing only.
    pub const WRITE: Open = Open {
        read: false,
        write: true,
        create: Create::No,
        dsync: false,
    };
    /// An existing file, for reading and writing.
    pub const READ_WRITE: Open = Open {
        read: true,
        write: true,
        create: Create::No,
        dsync: false,
    };
    /// A new file, for reading and writing; fails if the name is taken.
    pub const CREATE_NEW: Open = Open {
        read: true,
        write: true,
        create: Create::New,
        dsync: false,
    };
    /// A file for writing, created or emptied (`File::create`).
    pub const TRUNCATE: Open = Open {
        read: false,
        write: true,
        create: Create::Truncate,
        dsync: false,
    };

    /// The same, with `O_DSYNC` when `dsync`.
    pub const fn dsync(self, dsync: bool) -> Open {
        Open { dsync, ..self }
    }
}

/// A file system, as the journal uses one. Paths are whole paths (the journal's folder
/// joined with a name).
pub trait Fs: Clone + std::fmt::Debug + Send + Sync + 'static {
    type File: FsFile;

    fn open(&self, path: &Path, how: Open) -> io::Result<Self::File>;
    /// A whole file's content.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// A file's length (`stat`).
    fn len(&self, path: &Path) -> io::Result<u64>;
    /// Whether anything is at `path`; an error reads as no.
    fn exists(&self, path: &Path) -> bool;
    /// Renames a file within its folder, replacing what `to` named.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// The paths of the entries of a folder, in no particular order.
    fn read_dir(&self, dir: &Path) -> io::Result<Vec<PathBuf>>;
    /// Creates a folder and the folders above it that are missing.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Syncs a folder: the names created, renamed and removed in it become durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Whether the journal may work on a thread of its own (the segment made ahead). A
    /// simulated file system says no: the spare segment is then made inline, at the
    /// moments it is asked for, so that a seeded run makes the same calls in the same order
    /// every time.
    fn threads(&self) -> bool {
        true
    }
}

/// An open file of an [`Fs`].
pub trait FsFile: std::fmt::Debug + Send + Sync + 'static {
    /// Writes all of `buf` at `offset` (`pwrite`, repeated until done).
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Reads into `buf` from `offset` (`pread`); returns how many bytes, 0 at the end.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// The file's length in bytes (`fstat`).
    fn size(&self) -> io::Result<u64>;
    /// `fdatasync`: the file's data (and the size needed to read it) becomes durable.
    fn sync_data(&self) -> io::Result<()>;
    /// `fsync`: the file's data and metadata become durable.
    fn sync_all(&self) -> io::Result<()>;
    /// Cuts or extends (with zeros) the file to `len` bytes (`ftruncate`).
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Reserves blocks for the file's first `len` bytes, extending it to `len` if shorter
    /// (`posix_fallocate`).
    fn allocate(&self, len: u64) -> io::Result<()>;
}

/// The real disk, through `std::fs`: the calls the journal made before the seam, one for
/// one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OsFs;

impl Fs for OsFs {
    type File = File;

    fn open(&self, path: &Path, how: Open) -> io::Result<File> {
        let mut options = OpenOptions::new();
        options.read(how.read).write(how.write);
        match how.create {
            Create::No => {}
            Create::New => {
                options.create_new(true);
            }
            Create::Truncate => {
                options.create(true).truncate(true);
            }
        }
        if how.dsync {
            options.custom_flags(libc::O_DSYNC);
        }
        options.open(path)
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        fs::read(path)
    }

    fn len(&self, path: &Path) -> io::Result<u64> {
        fs::metadata(path).map(|m| m.len())
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn read_dir(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        fs::read_dir(dir)?
            .map(|entry| entry.map(|e| e.path()))
            .collect()
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        fs::create_dir_all(dir)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
}

impl FsFile for File {
    #[inline]
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(self, buf, offset)
    }

    #[inline]
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        std::os::unix::fs::FileExt::read_at(self, buf, offset)
    }

    fn size(&self) -> io::Result<u64> {
        self.metadata().map(|m| m.len())
    }

    #[inline]
    fn sync_data(&self) -> io::Result<()> {
        File::sync_data(self)
    }

    fn sync_all(&self) -> io::Result<()> {
        File::sync_all(self)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        File::set_len(self, len)
    }

    fn allocate(&self, len: u64) -> io::Result<()> {
        fs2::FileExt::allocate(self, len)
    }
}

/// Writes through an [`FsFile`] from its start, one positioned write per call: what a
/// `BufWriter` wraps to write a base.
pub(super) struct WriteAt<'a, T: FsFile> {
    pub file: &'a T,
    pub at: u64,
}

impl<T: FsFile> io::Write for WriteAt<'_, T> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.write_all_at(buf, self.at)?;
        self.at += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Reads an [`FsFile`] from its start, one positioned read per call: what a `BufReader`
/// wraps to read a base.
pub(super) struct ReadAt<T: FsFile> {
    pub file: T,
    pub at: u64,
}

impl<T: FsFile> io::Read for ReadAt<T> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(buf, self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}
