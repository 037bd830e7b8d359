//! A hand-written HTTP/1.1 client on a `TcpStream`: it sends any header bytes (ureq
//! refuses invalid ones), any body and any `Content-Length`, and keeps the connection
//! alive between requests.

use std::io::{self, BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct RawReply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawReply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Builds the bytes of one request. `Content-Length` is the body's unless `headers`
/// names one.
pub fn request(method: &str, path: &str, headers: &[(&str, &[u8])], body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 256);
    out.extend_from_slice(format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n").as_bytes());
    let mut has_len = false;
    for (name, value) in headers {
        has_len |= name.eq_ignore_ascii_case("content-length");
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    if !has_len {
        out.extend_from_slice(format!("Content-Length: {}\r\n", body.len()).as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    out
}

/// One keep-alive connection, reopened when the server closed it after an answer.
pub struct RawClient {
    port: u16,
    conn: Option<BufReader<TcpStream>>,
    pub timeout: Duration,
    /// The next answer has no body whatever its headers say (an answer to `HEAD`).
    pub head: bool,
}

impl RawClient {
    pub fn new(port: u16) -> RawClient {
        RawClient {
            port,
            conn: None,
            timeout: Duration::from_secs(10),
            head: false,
        }
    }

    fn connect(&self) -> io::Result<BufReader<TcpStream>> {
        let s = TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(self.timeout))?;
        s.set_write_timeout(Some(self.timeout))?;
        s.set_nodelay(true)?;
        Ok(BufReader::new(s))
    }

    /// Sends `bytes` and reads one answer. A connection the server closed after its
    /// previous answer (it said `connection: close`) is never reused, so an error here
    /// means the server dropped a request without answering.
    pub fn send(&mut self, bytes: &[u8]) -> io::Result<RawReply> {
        self.exchange(bytes, false)
    }

    /// Sends `bytes` then shuts the writing half (for truncated bodies): the server sees
    /// the end of the stream. Always on a fresh connection.
    pub fn send_and_close(&mut self, bytes: &[u8]) -> io::Result<RawReply> {
        self.conn = None;
        self.exchange(bytes, true)
    }

    fn exchange(&mut self, bytes: &[u8], half_close: bool) -> io::Result<RawReply> {
        // A kept connection the server closed while idle (allowed after, e.g., an answer
        // given before reading the whole body) fails before any answer byte: resend once
        // on a fresh connection, as any HTTP client does.
        if let Some(mut conn) = self.conn.take()
            && let Ok(reply) = self.once(&mut conn, bytes, half_close)
        {
            self.keep(conn, &reply, half_close);
            return Ok(reply);
        }
        let mut conn = self.connect()?;
        let reply = self.once(&mut conn, bytes, half_close)?;
        self.keep(conn, &reply, half_close);
        Ok(reply)
    }

    fn once(
        &self,
        conn: &mut BufReader<TcpStream>,
        bytes: &[u8],
        half_close: bool,
    ) -> io::Result<RawReply> {
        conn.get_mut().write_all(bytes)?;
        if half_close {
            conn.get_mut().shutdown(std::net::Shutdown::Write)?;
        }
        read_reply(conn, self.head)
    }

    fn keep(&mut self, conn: BufReader<TcpStream>, reply: &RawReply, half_close: bool) {
        let close = reply
            .header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"));
        if !close && !half_close {
            self.conn = Some(conn);
        }
    }
}

fn read_line(r: &mut impl BufRead) -> io::Result<String> {
    let mut line = Vec::new();
    r.read_until(b'\n', &mut line)?;
    if line.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed without an answer",
        ));
    }
    while line.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        line.pop();
    }
    Ok(String::from_utf8_lossy(&line).into_owned())
}

fn bad(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

pub fn read_reply(r: &mut impl BufRead, head: bool) -> io::Result<RawReply> {
    let status_line = read_line(r)?;
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad(format!("bad status line {status_line:?}")))?;
    let mut headers = Vec::new();
    loop {
        let line = read_line(r)?;
        if line.is_empty() {
            break;
        }
        let (n, v) = line
            .split_once(':')
            .ok_or_else(|| bad(format!("bad header {line:?}")))?;
        headers.push((n.trim().to_ascii_lowercase(), v.trim().to_owned()));
    }
    let get = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let mut body = Vec::new();
    if head {
    } else if get("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        loop {
            let size_line = read_line(r)?;
            let size = usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| bad(format!("bad chunk size {size_line:?}")))?;
            if size == 0 {
                // trailers, then the empty line
                while !read_line(r)?.is_empty() {}
                break;
            }
            let start = body.len();
            body.resize(start + size, 0);
            r.read_exact(&mut body[start..])?;
            read_line(r)?;
        }
    } else if let Some(len) = get("content-length") {
        let len: usize = len
            .parse()
            .map_err(|_| bad(format!("bad content-length {len:?}")))?;
        body.resize(len, 0);
        r.read_exact(&mut body)?;
    } else if status >= 200 && status != 204 && status != 304 {
        r.read_to_end(&mut body)?;
    }
    Ok(RawReply {
        status,
        headers,
        body,
    })
}
