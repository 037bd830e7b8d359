//! Rows read with `COPY (query) TO STDOUT (FORMAT binary)`, for `verify`'s long reads.
//!
//! A query's rows each arrive as a `DataRow` that the driver turns into a `Row` (an
//! allocation for its column ranges, a type check per column read). Over a whole log
//! that was a fifth of verify's CPU on the client. COPY sends the same columns in the
//! binary format (the types' send functions, as the extended query protocol does) as a
//! stream of bytes; here a row is a slice of that stream (`Bytes`, counted, not copied)
//! and its fields are found by their lengths, read in place.
//!
//! The format (PostgreSQL's documentation, "COPY", binary format): an 11-byte signature,
//! a 32-bit flags word, a 32-bit header extension length and the extension; then per row
//! a 16-bit field count and per field a 32-bit length (-1 for NULL) and its bytes; then a
//! field count of -1. Every number is big-endian. The server sends a row per CopyData
//! message, but nothing here relies on where the messages split.

use bytes::Bytes;

use crate::store::LedgerError;

type Result<T> = std::result::Result<T, LedgerError>;

/// The binary format's signature.
const SIGNATURE: &[u8; 11] = b"PGCOPY\n\xff\r\n\0";

/// The most columns a row of verify's reads has (`VERIFY_LOG`).
pub const MAX_FIELDS: usize = 10;

/// One row: its bytes, and where each field's bytes are in them (`None` for NULL).
pub struct CopyRow {
    data: Bytes,
    fields: [Option<(u32, u32)>; MAX_FIELDS],
    len: u8,
}

fn bad(what: String) -> LedgerError {
    LedgerError::Unavailable(format!("unexpected COPY data: {what}"))
}

impl CopyRow {
    /// The number of fields.
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Whether the row has no fields.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Field `i`'s bytes, `None` for NULL.
    pub fn raw(&self, i: usize) -> Result<Option<&[u8]>> {
        if i >= self.len() {
            return Err(bad(format!("no column {i} in a row of {}", self.len)));
        }
        Ok(self.fields[i].map(|(at, n)| &self.data[at as usize..(at + n) as usize]))
    }

    fn not_null(&self, i: usize) -> Result<&[u8]> {
        self.raw(i)?
            .ok_or_else(|| bad(format!("column {i} is NULL")))
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
    pub fn opt_text(&self, i: usize) -> Result<Option<&str>> {
        self.raw(i)?
            .map(|b| std::str::from_utf8(b).map_err(|e| bad(format!("column {i}: {e}"))))
            .transpose()
    }

    /// A `text` field.
    pub fn text(&self, i: usize) -> Result<&str> {
        self.opt_text(i)?
            .ok_or_else(|| bad(format!("column {i} is NULL")))
    }

    /// A `bytea` field that may be NULL.
    pub fn opt_bytes(&self, i: usize) -> Result<Option<&[u8]>> {
        self.raw(i)
    }

    /// A `bytea` field.
    pub fn bytes(&self, i: usize) -> Result<&[u8]> {
        self.not_null(i)
    }
}

/// Splits a binary COPY stream into rows, chunk by chunk as the driver hands them over.
#[derive(Default)]
pub struct CopyReader {
    header: bool,
    done: bool,
    /// The start of a row (or of the header) that a chunk ended inside of.
    carry: Vec<u8>,
}

/// What the bytes from an offset hold.
enum Next {
    Row(CopyRow, usize),
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
    /// Takes the next chunk of the stream, appending the rows it completes to `out`.
    pub fn push(&mut self, chunk: Bytes, out: &mut Vec<CopyRow>) -> Result<()> {
        let data = if self.carry.is_empty() {
            chunk
        } else {
            self.carry.extend_from_slice(&chunk);
            Bytes::from(std::mem::take(&mut self.carry))
        };
        let mut at = 0;
        if !self.header {
            match header_end(&data)? {
                Some(end) => {
                    at = end;
                    self.header = true;
                }
                None => {
                    self.carry = data.to_vec();
                    return Ok(());
                }
            }
        }
        while at < data.len() {
            if self.done {
                return Err(bad("bytes after the end of the rows".into()));
            }
            match next(&data, at)? {
                Next::Row(row, end) => {
                    out.push(row);
                    at = end;
                }
                Next::End(end) => {
                    self.done = true;
                    at = end;
                }
                Next::Short => {
                    self.carry = data[at..].to_vec();
                    break;
                }
            }
        }
        Ok(())
    }

    /// Checks the stream ended where its rows did.
    pub fn finish(&self) -> Result<()> {
        if self.done && self.carry.is_empty() {
            Ok(())
        } else {
            Err(bad("the stream ended inside a row".into()))
        }
    }
}

/// Where the rows start, once the header is whole.
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
fn next(data: &Bytes, at: usize) -> Result<Next> {
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
    let mut fields = [None; MAX_FIELDS];
    let mut p = at + 2;
    for field in fields.iter_mut().take(n) {
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
        // Offsets within the row's own slice; a CopyData message is far below 4 GiB.
        let (start, size) = (u32::try_from(p - at), u32::try_from(len));
        let (Ok(start), Ok(size)) = (start, size) else {
            return Err(bad("a row beyond 4 GiB".into()));
        };
        *field = Some((start, size));
        p += len;
    }
    let row = CopyRow {
        data: data.slice(at..p),
        fields,
        // n ≤ MAX_FIELDS, checked above.
        len: u8::try_from(n).unwrap_or(u8::MAX),
    };
    Ok(Next::Row(row, p))
}

/// The statement that streams `sql`'s rows in the binary format.
pub fn copy_sql(sql: &str) -> String {
    format!("COPY ({sql}) TO STDOUT (FORMAT binary)")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

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

    fn read(chunks: impl IntoIterator<Item = Vec<u8>>) -> Result<Vec<CopyRow>> {
        let mut r = CopyReader::default();
        let mut out = Vec::new();
        for c in chunks {
            r.push(Bytes::from(c), &mut out)?;
        }
        r.finish()?;
        Ok(out)
    }

    fn check(out: &[CopyRow]) {
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
        let out = read([stream(&rows(), 0)]).unwrap();
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
