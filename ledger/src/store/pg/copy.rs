//! Rows read with `COPY (query) TO STDOUT (FORMAT binary)`, for `verify`'s long reads.
//!
//! A query's rows each arrive as a `DataRow` that the driver turns into a `Row` (an
//! allocation for its column ranges, a type check per column read). Over a whole log
//! that was a fifth of verify's CPU on the client. COPY sends the same columns in the
//! binary format (the types' send functions, as the extended query protocol does) as a
//! stream of bytes. Here each chunk of it is copied once into the buffer of a batch of
//! rows (`RowBatch`), where the rows' fields are found by their lengths and read in
//! place. The copy is what lets the driver's buffer go at once, on the thread that read
//! it: rows that kept slices of it alive were freed on other threads, and the driver,
//! finding its buffer still shared, took fresh memory for every read.
//!
//! The format (PostgreSQL's documentation, "COPY", binary format): an 11-byte signature,
//! a 32-bit flags word, a 32-bit header extension length and the extension; then per row
//! a 16-bit field count and per field a 32-bit length (-1 for NULL) and its bytes; then a
//! field count of -1. Every number is big-endian. The server sends a row per CopyData
//! message, but nothing here relies on where the messages split.

use crate::store::LedgerError;

type Result<T> = std::result::Result<T, LedgerError>;

/// The binary format's signature.
const SIGNATURE: &[u8; 11] = b"PGCOPY\n\xff\r\n\0";

/// The most columns a row of verify's reads has (`VERIFY_LOG`).
pub const MAX_FIELDS: usize = 10;

/// Where a row's fields are in its batch's bytes (`None` for NULL).
#[derive(Clone, Copy)]
struct Fields {
    at: [Option<(u32, u32)>; MAX_FIELDS],
    len: u8,
}

/// Rows of a COPY stream: their bytes in one buffer, and where each row's fields are.
#[derive(Default)]
pub struct RowBatch {
    data: Vec<u8>,
    rows: Vec<Fields>,
}

impl RowBatch {
    /// The rows in the batch.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether the batch has no rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The bytes the batch holds, rows and a row not yet whole.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Row `i`.
    pub fn row(&self, i: usize) -> CopyRow<'_> {
        CopyRow {
            data: &self.data,
            fields: &self.rows[i],
        }
    }

    /// Empties the batch, keeping its memory.
    pub fn clear(&mut self) {
        self.data.clear();
        self.rows.clear();
    }
}

/// One row, read in place in its batch.
#[derive(Clone, Copy)]
pub struct CopyRow<'a> {
    data: &'a [u8],
    fields: &'a Fields,
}

fn bad(what: String) -> LedgerError {
    LedgerError::Unavailable(format!("unexpected COPY data: {what}"))
}

impl<'a> CopyRow<'a> {
    /// The number of fields.
    pub fn len(&self) -> usize {
        usize::from(self.fields.len)
    }

    /// Whether the row has no fields.
    pub fn is_empty(&self) -> bool {
        self.fields.len == 0
    }

    /// Field `i`'s bytes, `None` for NULL.
    pub fn raw(&self, i: usize) -> Result<Option<&'a [u8]>> {
        if i >= self.len() {
            return Err(bad(format!("no column {i} in a row of {}", self.len())));
        }
        let data = self.data;
        Ok(self.fields.at[i].map(|(at, n)| &data[at as usize..(at + n) as usize]))
    }

    /// A `bigint` field that may be NULL.
    pub fn opt_i64(&self, i: usize) -> Result<Option<i64>> {
        self.raw(i)?
            .map(|b| {
                <[u8; 8]>::try_from(b)
                    .map(i64::from_be_bytes)
                    .map_err(|_| bad(format!("column {i} is {} bytes, not a bigint", b.len())))
            })
            .transpose()
    }

    /// A `bigint` field.
    pub fn i64(&self, i: usize) -> Result<i64> {
        self.opt_i64(i)?
            .ok_or_else(|| bad(format!("column {i} is NULL")))
    }

    /// A `boolean` field that may be NULL.
    pub fn opt_bool(&self, i: usize) -> Result<Option<bool>> {
        self.raw(i)?
            .map(|b| match b {
                [0] => Ok(false),
                [1] => Ok(true),
                _ => Err(bad(format!("column {i} is not a boolean"))),
            })
            .transpose()
    }

    /// A `boolean` field.
    pub fn bool(&self, i: usize) -> Result<bool> {
        self.opt_bool(i)?
            .ok_or_else(|| bad(format!("column {i} is NULL")))
    }

    /// A `text` field that may be NULL (the session's encoding is UTF-8).
    pub fn opt_text(&self, i: usize) -> Result<Option<&'a str>> {
        self.raw(i)?
            .map(|b| std::str::from_utf8(b).map_err(|e| bad(format!("column {i}: {e}"))))
            .transpose()
    }

    /// A `text` field.
    pub fn text(&self, i: usize) -> Result<&'a str> {
        self.opt_text(i)?
            .ok_or_else(|| bad(format!("column {i} is NULL")))
    }

    /// A `bytea` field that may be NULL.
    pub fn opt_bytes(&self, i: usize) -> Result<Option<&'a [u8]>> {
        self.raw(i)
    }

    /// A `bytea` field.
    pub fn bytes(&self, i: usize) -> Result<&'a [u8]> {
        self.raw(i)?
            .ok_or_else(|| bad(format!("column {i} is NULL")))
    }
}

/// Splits a binary COPY stream into rows, chunk by chunk as the driver hands them over,
/// into batches (see `carry`).
#[derive(Default)]
pub struct CopyReader {
    header: bool,
    done: bool,
    /// The first byte of the current batch's buffer not yet read as a row (or header).
    at: usize,
}

/// What the bytes from an offset hold.
enum Next {
    Row(Fields, usize),
    End(usize),
    /// More bytes are needed.
    Short,
}

fn be_i16(b: &[u8], at: usize) -> Option<i16> {
    Some(i16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn be_i32(b: &[u8], at: usize) -> Option<i32> {
    Some(i32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

impl CopyReader {
    /// Takes the next chunk of the stream into `batch`, adding the rows it completes.
    pub fn push(&mut self, chunk: &[u8], batch: &mut RowBatch) -> Result<()> {
        if chunk.is_empty() {
            return Ok(());
        }
        if self.done {
            return Err(bad("bytes after the end of the rows".into()));
        }
        batch.data.extend_from_slice(chunk);
        let data = &batch.data;
        if !self.header {
            match header_end(&data[self.at..])? {
                Some(end) => {
                    self.at += end;
                    self.header = true;
                }
                None => return Ok(()),
            }
        }
        while self.at < data.len() {
            if self.done {
                return Err(bad("bytes after the end of the rows".into()));
            }
            match next(data, self.at)? {
                Next::Row(fields, end) => {
                    batch.rows.push(fields);
                    self.at = end;
                }
                Next::End(end) => {
                    self.done = true;
                    self.at = end;
                }
                Next::Short => break,
            }
        }
        Ok(())
    }

    /// Ends `full` at its last whole row and starts `next` with the bytes after it.
    pub fn carry(&mut self, full: &mut RowBatch, next: &mut RowBatch) {
        next.data.extend_from_slice(&full.data[self.at..]);
        full.data.truncate(self.at);
        self.at = 0;
    }

    /// Checks the stream ended where its rows did (`batch` is the last one).
    pub fn finish(&self, batch: &RowBatch) -> Result<()> {
        if self.done && self.at == batch.data.len() {
            Ok(())
        } else {
            Err(bad("the stream ended inside a row".into()))
        }
    }
}

/// How long the header is, once it is whole.
fn header_end(data: &[u8]) -> Result<Option<usize>> {
    if data.len() < SIGNATURE.len() + 8 {
        return Ok(None);
    }
    if &data[..SIGNATURE.len()] != SIGNATURE {
        return Err(bad("not the binary format's signature".into()));
    }
    let flags = be_i32(data, 11).unwrap_or_default();
    // Bit 16 says OIDs are included; bits 0-15 are critical flags no reader may ignore.
    if flags & 0x0001_ffff != 0 {
        return Err(bad(format!("header flags {flags:#x}")));
    }
    let ext = usize::try_from(be_i32(data, 15).unwrap_or_default())
        .map_err(|_| bad("a negative header extension".into()))?;
    let end = 19 + ext;
    Ok((data.len() >= end).then_some(end))
}

/// The row (or the end) at `at`.
fn next(data: &[u8], at: usize) -> Result<Next> {
    let Some(count) = be_i16(data, at) else {
        return Ok(Next::Short);
    };
    if count == -1 {
        return Ok(Next::End(at + 2));
    }
    let n = usize::try_from(count).map_err(|_| bad(format!("{count} fields")))?;
    if n > MAX_FIELDS {
        return Err(bad(format!("{n} fields, more than {MAX_FIELDS}")));
    }
    let mut fields = Fields {
        at: [None; MAX_FIELDS],
        // n ≤ MAX_FIELDS, checked above.
        len: u8::try_from(n).unwrap_or(u8::MAX),
    };
    let mut p = at + 2;
    for field in fields.at.iter_mut().take(n) {
        let Some(len) = be_i32(data, p) else {
            return Ok(Next::Short);
        };
        p += 4;
        if len == -1 {
            continue;
        }
        let len = usize::try_from(len).map_err(|_| bad(format!("a field of {len} bytes")))?;
        if data.len() < p + len {
            return Ok(Next::Short);
        }
        // A batch is sent on well before 4 GiB (`BATCH_BYTES` in verify.rs).
        let (Ok(start), Ok(size)) = (u32::try_from(p), u32::try_from(len)) else {
            return Err(bad("a batch beyond 4 GiB".into()));
        };
        *field = Some((start, size));
        p += len;
    }
    Ok(Next::Row(fields, p))
}

/// The statement that streams `sql`'s rows in the binary format.
pub fn copy_sql(sql: &str) -> String {
    format!("COPY ({sql}) TO STDOUT (FORMAT binary)")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::{CopyReader, CopyRow, Result, RowBatch, SIGNATURE};

    /// A stream of `rows` in the binary format, with a header extension of `ext` bytes.
    fn stream(rows: &[Vec<Option<&[u8]>>], ext: usize) -> Vec<u8> {
        let mut s = SIGNATURE.to_vec();
        s.extend_from_slice(&0i32.to_be_bytes());
        s.extend_from_slice(&i32::try_from(ext).unwrap().to_be_bytes());
        s.extend(std::iter::repeat_n(7u8, ext));
        for row in rows {
            s.extend_from_slice(&i16::try_from(row.len()).unwrap().to_be_bytes());
            for f in row {
                match f {
                    None => s.extend_from_slice(&(-1i32).to_be_bytes()),
                    Some(b) => {
                        s.extend_from_slice(&i32::try_from(b.len()).unwrap().to_be_bytes());
                        s.extend_from_slice(b);
                    }
                }
            }
        }
        s.extend_from_slice(&(-1i16).to_be_bytes());
        s
    }

    fn rows() -> Vec<Vec<Option<&'static [u8]>>> {
        vec![
            vec![
                Some(&[0, 0, 0, 0, 0, 0, 0, 7]),
                Some(b"alice"),
                None,
                Some(&[1]),
            ],
            vec![],
            vec![
                Some(&[0, 0, 0, 0, 0, 0, 1, 0]),
                Some(b""),
                Some(b"\x00\xff"),
                Some(&[0]),
            ],
        ]
    }

    /// The rows of `chunks`, in batches of at most `per` rows, as verify's reads take them.
    fn read_in(chunks: impl IntoIterator<Item = Vec<u8>>, per: usize) -> Result<Vec<RowBatch>> {
        let mut r = CopyReader::default();
        let mut batches = vec![RowBatch::default()];
        for c in chunks {
            let batch = batches.last_mut().unwrap();
            r.push(&c, batch)?;
            if batch.len() >= per {
                let mut next = RowBatch::default();
                r.carry(batch, &mut next);
                batches.push(next);
            }
        }
        r.finish(batches.last().unwrap())?;
        Ok(batches)
    }

    fn read(chunks: impl IntoIterator<Item = Vec<u8>>) -> Result<Vec<RowBatch>> {
        read_in(chunks, usize::MAX)
    }

    fn rows_of(batches: &[RowBatch]) -> Vec<CopyRow<'_>> {
        batches
            .iter()
            .flat_map(|b| (0..b.len()).map(move |i| b.row(i)))
            .collect()
    }

    fn check(batches: &[RowBatch]) {
        let out = rows_of(batches);
        assert_eq!(out.len(), 3);
        assert_eq!(out[0].i64(0).unwrap(), 7);
        assert_eq!(out[0].text(1).unwrap(), "alice");
        assert_eq!(out[0].opt_text(2).unwrap(), None);
        assert!(out[0].bool(3).unwrap());
        assert!(out[1].is_empty());
        assert_eq!(out[2].i64(0).unwrap(), 256);
        assert_eq!(out[2].text(1).unwrap(), "");
        assert_eq!(out[2].bytes(2).unwrap(), b"\x00\xff");
        assert!(!out[2].bool(3).unwrap());
    }

    #[test]
    fn a_stream_split_anywhere_gives_the_same_rows() {
        for ext in [0, 5] {
            let s = stream(&rows(), ext);
            check(&read([s.clone()]).unwrap());
            for cut in 0..=s.len() {
                check(&read([s[..cut].to_vec(), s[cut..].to_vec()]).unwrap());
            }
            // A byte a chunk.
            check(&read(s.iter().map(|b| vec![*b])).unwrap());
            // Batches of one row, cut anywhere: a row begun in one batch ends in the next.
            for size in [1, 3, 7] {
                let batches = read_in(s.chunks(size).map(<[u8]>::to_vec), 1).unwrap();
                assert!(batches.len() >= 3);
                check(&batches);
            }
        }
    }

    #[test]
    fn a_cut_or_damaged_stream_is_refused() {
        let s = stream(&rows(), 0);
        for cut in 0..s.len() {
            assert!(read([s[..cut].to_vec()]).is_err(), "cut at {cut} was taken");
        }
        let mut bytes_after = s.clone();
        bytes_after.push(0);
        assert!(read([bytes_after]).is_err());
        let mut signature = s.clone();
        signature[0] = b'X';
        assert!(read([signature]).is_err());
        let mut critical = s.clone();
        critical[14] = 1;
        assert!(read([critical]).is_err());
        let mut negative = s;
        // The first field's length of the first row.
        negative[21..25].copy_from_slice(&(-2i32).to_be_bytes());
        assert!(read([negative]).is_err());
    }

    #[test]
    fn fields_of_the_wrong_shape_are_errors_not_values() {
        let batches = read([stream(&rows(), 0)]).unwrap();
        let out = rows_of(&batches);
        assert!(out[0].i64(1).is_err(), "5 bytes read as a bigint");
        assert!(out[0].i64(2).is_err(), "NULL read as a bigint");
        assert!(out[0].bool(0).is_err(), "8 bytes read as a boolean");
        assert!(
            out[2].text(2).is_err(),
            "bytes that are not UTF-8 read as text"
        );
        assert!(out[0].raw(4).is_err(), "a column past the row's end");
    }
}
