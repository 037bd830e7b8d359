//! Clients that hold sockets without finishing a request — silent, half a head, half a
//! body, idle keep-alive pools, never-ending streams — and framings the worker does not
//! speak. The worker keeps answering everyone else, closes each such socket by its
//! timeout, and still stops at once on SIGTERM.
//!
//! A test binary of its own: its answers are timed (an honest client within a second),
//! and cargo runs test binaries one after another, so the other worker tests' load does
//! not share the two cores with it.

#![allow(clippy::unwrap_used)]

#[path = "worker/raw.rs"]
#[allow(dead_code)]
mod raw;
#[path = "worker/support.rs"]
#[allow(dead_code)]
mod support;

use std::io::{BufReader, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use raw::{RawClient, read_reply, request};
use support::{Worker, eventually, scratch};

const DEPOSIT: &[u8] = br#"{"account":"alice","amount":5,"currency":"RUB"}"#;

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// Half a head of a money-moving request.
fn half_head(port: u16) -> TcpStream {
    let mut s = connect(port);
    s.write_all(b"POST /v1/deposits HTTP/1.1\r\nHost: x\r\nIdempotency-Key: half-head\r\n")
        .unwrap();
    s
}

/// A whole head that promises 50 bytes of body, and 10 of them.
fn half_body(port: u16, key: &str) -> TcpStream {
    let mut s = connect(port);
    let head = format!(
        "POST /v1/deposits HTTP/1.1\r\nHost: x\r\nIdempotency-Key: {key}\r\n\
         Content-Type: application/json\r\nContent-Length: 50\r\n\r\n{{\"account\""
    );
    s.write_all(head.as_bytes()).unwrap();
    s
}

/// A keep-alive connection that has had one answer and now sits idle.
fn idle_keep_alive(port: u16) -> TcpStream {
    let s = connect(port);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut r = BufReader::new(s);
    r.get_mut()
        .write_all(&request("GET", "/healthz", &[], b""))
        .unwrap();
    let reply = read_reply(&mut r, false).unwrap();
    assert_eq!(reply.status, 200);
    r.into_inner()
}

/// Whether the server has closed the socket (reading whatever it sent before).
fn closed_by_server(s: &mut TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

/// One request on a fresh connection, with the time it took to be answered.
fn timed_request(port: u16, bytes: &[u8]) -> (u16, Duration) {
    let started = Instant::now();
    let mut c = RawClient::new(port);
    c.timeout = Duration::from_secs(5);
    let reply = c
        .send(bytes)
        .unwrap_or_else(|e| panic!("not answered after {:?}: {e}", started.elapsed()));
    (reply.status, started.elapsed())
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn metric(w: &Worker, name: &str) -> u64 {
    let text = w.http().get("/metrics").body;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

#[test]
fn idle_and_slow_sockets_do_not_lock_out_other_clients() {
    let (_dir, db) = scratch();
    let w = Worker::start(&db, &[]);
    let rss_before = rss_kib(w.pid());
    // The default settings: a cap of 1,024 connections and a 10 s header timeout.
    let header_timeout = Duration::from_secs(10);
    let mut attack = Vec::new();
    // An ordinary pool of idle keep-alive connections, then silent sockets, then slow ones.
    for _ in 0..200 {
        attack.push((Instant::now(), idle_keep_alive(w.port)));
    }
    for _ in 0..1800 {
        attack.push((Instant::now(), connect(w.port)));
    }
    for i in 0..1100 {
        let s = if i % 2 == 0 {
            half_head(w.port)
        } else {
            half_body(w.port, &format!("half-body-{i}"))
        };
        attack.push((Instant::now(), s));
    }
    // 3,100 sockets against a cap of 1,024: a client arriving now is served at once.
    let health = request("GET", "/healthz", &[], b"");
    let mut slowest = Duration::ZERO;
    for i in 0..5 {
        let (status, took) = timed_request(w.port, &health);
        assert_eq!(status, 200);
        assert!(took < Duration::from_secs(1), "/healthz took {took:?}");
        slowest = slowest.max(took);
        let key = format!("honest-{i}");
        let deposit = request(
            "POST",
            "/v1/deposits",
            &[("Idempotency-Key", key.as_bytes())],
            DEPOSIT,
        );
        let (status, took) = timed_request(w.port, &deposit);
        assert_eq!(status, 201);
        assert!(took < Duration::from_secs(1), "a deposit took {took:?}");
        slowest = slowest.max(took);
    }
    let rss = rss_kib(w.pid());
    assert!(
        rss < rss_before + 64 * 1024,
        "RSS grew from {rss_before} KiB to {rss} KiB under 3,100 sockets"
    );
    // Every attacking socket is closed: for room, or by its timeout at the latest.
    let opened_last = attack.last().unwrap().0;
    let deadline = opened_last + header_timeout + Duration::from_secs(3);
    let mut open: Vec<_> = attack.into_iter().map(|(_, s)| s).collect();
    while !open.is_empty() {
        open.retain_mut(|s| !closed_by_server(s));
        assert!(
            Instant::now() < deadline || open.is_empty(),
            "{} sockets still open {:?} after the last was opened",
            open.len(),
            opened_last.elapsed()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let evicted = metric(&w, "idem_connections_closed_total{reason=\"evicted\"}");
    let header = metric(
        &w,
        "idem_connections_closed_total{reason=\"header_timeout\"}",
    );
    let body = metric(&w, "idem_connections_closed_total{reason=\"body_timeout\"}");
    eprintln!(
        "3,100 sockets: slowest honest answer {slowest:?}; RSS {rss_before} -> {rss} KiB; \
         all closed {:?} after the last opened ({evicted} evicted, {header} by the header \
         timeout, {body} by the body timeout)",
        opened_last.elapsed()
    );
    assert!(evicted >= 3100 - 1024, "evicted {evicted}");
    assert!(header > 0, "none closed by the header timeout");
    assert!(body > 0, "no body answered by its timeout");
    // No half-sent command moved money: only the honest deposits did.
    assert_eq!(w.http().balance("alice"), 25);
    assert_eq!(w.term().code(), Some(0));
}

#[test]
fn each_phase_has_its_timeout() {
    let (_dir, db) = scratch();
    let w = Worker::start(
        &db,
        &[
            "--header-timeout",
            "1s",
            "--body-timeout",
            "1s",
            "--idle-timeout",
            "2s",
        ],
    );
    let started = Instant::now();
    let mut silent = connect(w.port);
    let mut head = half_head(w.port);
    let mut keep_alive = idle_keep_alive(w.port);
    // The body's timeout is answered: 408, the key left unused, the connection closed.
    let mut body = BufReader::new(half_body(w.port, "late-body"));
    body.get_mut()
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let reply = read_reply(&mut body, false).unwrap();
    assert_eq!(reply.status, 408, "{}", reply.text());
    assert!(reply.text().contains("body_timeout"), "{}", reply.text());
    assert_eq!(reply.header("connection"), Some("close"));
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(w.http().get("/v1/keys/late-body").status, 404);
    eventually(Duration::from_secs(3), "the silent socket closed", || {
        closed_by_server(&mut silent).then_some(())
    });
    eventually(Duration::from_secs(3), "the half head closed", || {
        closed_by_server(&mut head).then_some(())
    });
    // The keep-alive connection outlives the header timeout, then goes at its own.
    std::thread::sleep(Duration::from_millis(1500).saturating_sub(started.elapsed()));
    assert!(!closed_by_server(&mut keep_alive), "idle closed too early");
    eventually(Duration::from_secs(4), "the idle connection closed", || {
        closed_by_server(&mut keep_alive).then_some(())
    });
    assert_eq!(
        metric(&w, "idem_connections_closed_total{reason=\"idle_timeout\"}"),
        1
    );
    assert_eq!(w.http().get("/v1/keys/half-head").status, 404);
    assert_eq!(w.term().code(), Some(0));
}

#[test]
fn sigterm_stops_at_once_past_stalled_heads_bodies_and_streams() {
    let (_dir, db) = scratch();
    let w = Worker::start(&db, &[]);
    w.http().deposit("before-stop", "alice", 7);
    let mut held = vec![
        half_head(w.port),
        half_body(w.port, "stalled-body"),
        idle_keep_alive(w.port),
        connect(w.port),
    ];
    // An operator's event stream, its head read: it would never end by itself.
    let mut stream = BufReader::new(connect(w.port));
    stream
        .get_mut()
        .write_all(&request("GET", "/v1/live/stream", &[], b""))
        .unwrap();
    stream
        .get_mut()
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut head = String::new();
    while !head.ends_with("\r\n\r\n") {
        let mut b = [0u8; 1];
        stream.read_exact(&mut b).unwrap();
        head.push(char::from(b[0]));
    }
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    held.push(stream.into_inner());

    let stopping = Instant::now();
    let status = w.term();
    let took = stopping.elapsed();
    assert_eq!(status.code(), Some(0));
    // Well within the 10 s grace: nothing here held a request already read.
    assert!(took < Duration::from_secs(3), "the stop took {took:?}");
    for s in &mut held {
        assert!(closed_by_server(s), "a socket outlived the worker");
    }
    // What was acknowledged is there; what was half sent is not.
    let w = Worker::start(&db, &[]);
    assert_eq!(w.http().balance("alice"), 7);
    assert_eq!(w.http().get("/v1/keys/stalled-body").status, 404);
    let verify = w.http().get("/v1/live/snapshot");
    assert_eq!(verify.status, 200);
    assert_eq!(w.term().code(), Some(0));
}

#[test]
fn codings_the_worker_does_not_speak_are_refused_and_change_nothing() {
    let (_dir, db) = scratch();
    let w = Worker::start(&db, &[]);
    let chunked = {
        let mut b = format!("{:x}\r\n", DEPOSIT.len()).into_bytes();
        b.extend_from_slice(DEPOSIT);
        b.extend_from_slice(b"\r\n0\r\n\r\n");
        b
    };
    let send = |key: &str, headers: &[(&str, &[u8])], body: &[u8]| {
        let mut h = vec![("Idempotency-Key", key.as_bytes())];
        h.extend_from_slice(headers);
        let bytes = request("POST", "/v1/deposits", &h, body);
        RawClient::new(w.port).send(&bytes).unwrap()
    };
    let strip_length = |v: Vec<u8>| {
        // `request` always adds Content-Length; a chunked request must not carry one.
        let text = String::from_utf8(v).unwrap();
        let mut out = String::new();
        for line in text.split_inclusive("\r\n") {
            if !line.to_ascii_lowercase().starts_with("content-length:") {
                out.push_str(line);
            }
        }
        out.into_bytes()
    };
    for coding in ["gzip, chunked", "deflate,chunked", "chunked, chunked, gzip"] {
        // hyper itself refuses a framing whose last coding is not chunked (400).
        let expected = if coding.ends_with("gzip") { 400 } else { 501 };
        let key = format!("te-{}", coding.replace([',', ' '], ""));
        let bytes = strip_length(request(
            "POST",
            "/v1/deposits",
            &[
                ("Idempotency-Key", key.as_bytes()),
                ("Transfer-Encoding", coding.as_bytes()),
            ],
            &chunked,
        ));
        let reply = RawClient::new(w.port).send(&bytes).unwrap();
        assert_eq!(reply.status, expected, "{coding}: {}", reply.text());
        if expected == 501 {
            assert!(reply.text().contains("transfer_coding_unsupported"));
        }
        assert_eq!(w.http().get(&format!("/v1/keys/{key}")).status, 404);
    }
    let reply = send("ce-gzip", &[("Content-Encoding", b"gzip")], DEPOSIT);
    assert_eq!(reply.status, 415, "{}", reply.text());
    assert!(reply.text().contains("content_coding_unsupported"));
    assert_eq!(w.http().get("/v1/keys/ce-gzip").status, 404);
    assert_eq!(w.http().get("/v1/accounts/alice").status, 404);
    // What the worker does speak still works: plain chunked, identity.
    let bytes = strip_length(request(
        "POST",
        "/v1/deposits",
        &[
            ("Idempotency-Key", b"te-plain"),
            ("Transfer-Encoding", b"chunked"),
        ],
        &chunked,
    ));
    assert_eq!(RawClient::new(w.port).send(&bytes).unwrap().status, 201);
    let reply = send("ce-identity", &[("Content-Encoding", b"identity")], DEPOSIT);
    assert_eq!(reply.status, 201, "{}", reply.text());
    assert_eq!(w.http().balance("alice"), 10);
}

/// An answer given before the request's body was read (here 401: no token) says
/// `Connection: close`, and the connection ends after it: the unread body cannot be told
/// from a next request, so a client that pooled the connection would send its next
/// request into a closed socket. A request whose body was read keeps its connection.
#[test]
fn an_answer_before_the_body_is_read_closes_its_connection() {
    let (_dir, db) = scratch();
    let w = Worker::start(&db, &["--token", "shop=s3cret-shop"]);
    // The head promises a body that has not been sent when the worker answers.
    let s = connect(w.port);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut r = BufReader::new(s);
    let head = format!(
        "POST /v1/deposits HTTP/1.1\r\nHost: x\r\nIdempotency-Key: early\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        DEPOSIT.len()
    );
    r.get_mut().write_all(head.as_bytes()).unwrap();
    let reply = read_reply(&mut r, false).unwrap();
    assert_eq!(reply.status, 401, "{}", reply.text());
    assert_eq!(reply.header("connection"), Some("close"));
    let mut rest = Vec::new();
    let read = r.read_to_end(&mut rest);
    assert!(
        matches!(read, Ok(0)),
        "the connection stayed open: {read:?}"
    );

    // With the token the body is read, and the connection serves the next request.
    let auth: (&str, &[u8]) = ("Authorization", b"Bearer s3cret-shop");
    let s = connect(w.port);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut r = BufReader::new(s);
    for key in ["kept-1", "kept-2"] {
        let bytes = request(
            "POST",
            "/v1/deposits",
            &[("Idempotency-Key", key.as_bytes()), auth],
            DEPOSIT,
        );
        r.get_mut().write_all(&bytes).unwrap();
        let reply = read_reply(&mut r, false).unwrap();
        assert_eq!(reply.status, 201, "{key}: {}", reply.text());
        assert_eq!(reply.header("connection"), None, "{key}");
    }
}
