//! No input makes the server panic or answer 5xx. One worker serves the whole
//! property; every generated request (random method, path, key bytes, headers, body and
//! framing) must get an answer below 500 on a connection that stays usable, and at the
//! end the worker is healthy, stops cleanly and `verify` passes.
//!
//! `PROPTEST_CASES` sets the number of requests (10,000 by default).

use std::collections::BTreeMap;

use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::Value;

use crate::raw::{RawClient, request};
use crate::support::{Worker, run, scratch};

#[derive(Debug, Clone)]
enum Framing {
    /// `Content-Length` of the body, keep-alive.
    Normal,
    /// A `Content-Length` that is not the body's (shorter or longer), then the client
    /// closes its half: on a fresh connection.
    WrongLength(usize),
    /// `Transfer-Encoding: chunked`, one chunk.
    Chunked,
}

#[derive(Debug, Clone)]
struct Req {
    method: String,
    path: String,
    keys: Vec<Vec<u8>>,
    content_type: Option<Vec<u8>>,
    authorization: Option<Vec<u8>>,
    body: Vec<u8>,
    framing: Framing,
}

/// Header value bytes: anything but CR and LF (which would end the header).
fn header_bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), 0..max).prop_map(|mut v| {
        v.retain(|b| *b != b'\r' && *b != b'\n');
        v
    })
}

fn method() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => Just("POST".to_owned()),
        3 => Just("GET".to_owned()),
        2 => select(vec!["PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE"])
            .prop_map(str::to_owned),
        1 => "[A-Za-z]{1,10}",
    ]
}

fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        select(vec![
            "alice", "bob", "@world", "@payouts", "nobody", "k1", "w1", "default"
        ])
        .prop_map(str::to_owned),
        "[a-zA-Z0-9_.:@~-]{0,70}",
        "(%[0-9A-Fa-f]{2}){1,6}",
    ]
}

fn path() -> impl Strategy<Value = String> {
    let q = "[a-z0-9=&%_-]{0,30}";
    prop_oneof![
        6 => select(vec!["/v1/deposits", "/v1/withdrawals", "/v1/refunds"])
            .prop_map(str::to_owned),
        1 => select(vec![
            "/v1/accounts", "/v1/keys", "/v1/facts", "/healthz", "/metrics",
            "/v1/live/snapshot", "/v1/live/keys", "/v1/live/quarantine", "/", "/v1", "/v1/",
        ])
        .prop_map(str::to_owned),
        1 => (select(vec!["/v1/accounts/", "/v1/keys/"]), segment())
            .prop_map(|(p, s)| format!("{p}{s}")),
        1 => (segment(), segment()).prop_map(|(a, b)| format!("/v1/live/keys/{a}/{b}")),
        1 => (select(vec!["/v1/facts?", "/v1/keys?", "/v1/live/keys?", "/v1/live/quarantine?", "/v1/accounts?"]), q)
            .prop_map(|(p, q)| format!("{p}{q}")),
        1 => ("(after|limit|status)", "-?[0-9]{0,25}|[a-z]{0,8}")
            .prop_map(|(k, v)| format!("/v1/facts?{k}={v}&limit={v}")),
        1 => "/[a-zA-Z0-9%/._?=&~-]{0,60}",
    ]
    // The feed's event stream never ends; it has its own tests.
    .prop_filter("the event stream", |p| !p.starts_with("/v1/live/stream"))
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        6 => "[a-zA-Z0-9_.:-]{1,40}".prop_map(String::into_bytes),
        1 => Just(Vec::new()),
        1 => "[!-~]{250,260}".prop_map(String::into_bytes),
        2 => header_bytes(300),
    ]
}

fn keys() -> impl Strategy<Value = Vec<Vec<u8>>> {
    prop_oneof![
        8 => key().prop_map(|k| vec![k]),
        1 => Just(Vec::new()),
        1 => vec(key(), 2..4),
    ]
}

fn field() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => select(vec!["account", "amount", "currency", "withdrawal"]).prop_map(str::to_owned),
        1 => "[a-zA-Z_]{0,12}",
    ]
}

fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (1u64..2000).prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        select(vec![
            "alice", "bob", "RUB", "USD", "rub", "@world", "w1", "k1", ""
        ])
        .prop_map(Value::from),
        ".{0,80}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Value::Array),
            btree_map(field(), inner, 0..6).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A number as text, of any size and shape.
fn number_text() -> impl Strategy<Value = String> {
    "-?[0-9]{1,400}(\\.[0-9]{1,20})?([eE][+-]?[0-9]{1,6})?"
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    let acct = select(vec!["alice", "bob", "nobody", "@world"]);
    let cur = select(vec!["RUB", "USD", "rub", "R"]);
    prop_oneof![
        // near-valid commands, so some reach the ledger and move money
        8 => (acct.clone(), 1u64..500, cur.clone()).prop_map(|(a, n, c)| {
            format!(r#"{{"account":"{a}","amount":{n},"currency":"{c}"}}"#).into_bytes()
        }),
        2 => (select(vec!["w1", "w2", "k1", "nope"]), 1u64..300)
            .prop_map(|(w, n)| format!(r#"{{"withdrawal":"{w}","amount":{n}}}"#).into_bytes()),
        2 => (acct, number_text(), cur).prop_map(|(a, n, c)| {
            format!(r#"{{"account":"{a}","amount":{n},"currency":"{c}"}}"#).into_bytes()
        }),
        // structured but wrong
        3 => btree_map(field(), json(), 0..5).prop_map(|m: BTreeMap<String, Value>| {
            serde_json::to_vec(&m).unwrap()
        }),
        2 => json().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        // arbitrary bytes, and a valid body cut short
        3 => vec(any::<u8>(), 0..600),
        1 => (0usize..45).prop_map(|n| {
            br#"{"account":"alice","amount":1,"currency":"RUB"}"#[..n].to_vec()
        }),
        // over 64 KiB
        1 => (64 * 1024 - 8..64 * 1024 + 300usize).prop_map(|n| {
            let mut b = br#"{"account":"alice","amount":1,"pad":""#.to_vec();
            b.resize(n, b'x');
            b.extend_from_slice(br#""}"#);
            b
        }),
    ]
}

fn framing() -> impl Strategy<Value = Framing> {
    prop_oneof![
        20 => Just(Framing::Normal),
        1 => (0usize..2000).prop_map(Framing::WrongLength),
        1 => Just(Framing::Chunked),
    ]
}

fn req() -> impl Strategy<Value = Req> {
    let ct = prop_oneof![
        select(vec![
            "application/json",
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/json; charset=latin1",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        header_bytes(60),
    ];
    let auth = prop_oneof![
        select(vec![
            "Bearer x",
            "Bearer ",
            "Bearer",
            "Basic YTpi",
            "bearer secret"
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        header_bytes(80),
    ];
    (
        method(),
        path(),
        keys(),
        proptest::option::weighted(0.7, ct),
        proptest::option::weighted(0.1, auth),
        body(),
        framing(),
    )
        .prop_map(
            |(method, path, keys, content_type, authorization, body, framing)| Req {
                method,
                path,
                keys,
                content_type,
                authorization,
                body,
                framing,
            },
        )
}

fn bytes_of(r: &Req) -> Vec<u8> {
    let mut headers: Vec<(&str, &[u8])> = Vec::new();
    for k in &r.keys {
        headers.push(("Idempotency-Key", k));
    }
    if let Some(ct) = &r.content_type {
        headers.push(("Content-Type", ct));
    }
    if let Some(a) = &r.authorization {
        headers.push(("Authorization", a));
    }
    let len;
    let mut body = r.body.clone();
    match &r.framing {
        Framing::Normal => {}
        Framing::WrongLength(n) => {
            len = n.to_string();
            headers.push(("Content-Length", len.as_bytes()));
        }
        Framing::Chunked => {
            headers.push(("Transfer-Encoding", b"chunked"));
            let mut c = format!("{:x}\r\n", body.len()).into_bytes();
            c.extend_from_slice(&body);
            c.extend_from_slice(b"\r\n0\r\n\r\n");
            body = c;
            // `request` must not add a Content-Length beside the chunked encoding.
            return request_chunked(&r.method, &r.path, &headers, &body);
        }
    }
    request(&r.method, &r.path, &headers, &body)
}

fn request_chunked(method: &str, path: &str, headers: &[(&str, &[u8])], body: &[u8]) -> Vec<u8> {
    let mut out = request(method, path, headers, b"");
    // drop the empty body's "Content-Length: 0\r\n" that `request` added
    let needle = b"Content-Length: 0\r\n";
    let at = out
        .windows(needle.len())
        .rposition(|w| w == needle)
        .unwrap();
    out.drain(at..at + needle.len());
    out.extend_from_slice(body);
    out
}

#[test]
fn no_input_makes_a_5xx() {
    let cases: u32 = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let (_dir, db) = scratch();
    // Dropped (killed) on any exit; stopped with SIGTERM on success.
    let w = Worker::start(&db, &[]);
    let http = w.http();
    // Some money, so near-valid commands can succeed.
    for a in ["alice", "bob"] {
        assert_eq!(http.deposit(&format!("seed-{a}"), a, 100_000).status, 201);
    }
    assert_eq!(http.withdraw("w1", "alice", 500).status, 201);

    let client = std::cell::RefCell::new(RawClient::new(w.port));
    let counts = std::cell::RefCell::new(BTreeMap::<u16, u32>::new());
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 200,
        ..Config::default()
    });
    let started = std::time::Instant::now();
    let result = runner.run(&req(), |r| {
        let bytes = bytes_of(&r);
        let mut c = client.borrow_mut();
        c.head = r.method == "HEAD";
        let reply = match r.framing {
            Framing::WrongLength(_) => match c.send_and_close(&bytes) {
                Ok(reply) => reply,
                // The client cut the body short: the server may drop it unanswered.
                Err(_) => return Ok(()),
            },
            _ => c
                .send(&bytes)
                .map_err(|e| TestCaseError::fail(format!("no answer: {e}")))?,
        };
        *counts.borrow_mut().entry(reply.status).or_default() += 1;
        prop_assert!(
            reply.status < 500,
            "{} answered {}: {}",
            r.method,
            reply.status,
            reply.text()
        );
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    eprintln!(
        "{cases} requests in {:?}, answers by status: {:?}",
        started.elapsed(),
        counts.borrow()
    );

    let health = http.get("/healthz");
    assert_eq!(health.status, 200, "{}", health.body);
    let sums = http.get("/v1/accounts").json();
    for (cur, sum) in sums["sums"].as_object().unwrap() {
        assert_eq!(sum, 0, "{cur}: {sums}");
    }
    assert_eq!(w.term().code(), Some(0));
    let out = run(&["verify", "--db", db.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
