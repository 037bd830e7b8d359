//! The OpenAPI document: what `/openapi.json` serves is docs/openapi.json byte for byte,
//! it names every route the router has and no other, and each of its references
//! resolves. (CI also runs Schemathesis with it against a live worker: .ci/schemathesis.sh.)

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;

use crate::support::{Worker, scratch};

fn manifest() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn document() -> (String, Value) {
    let text = std::fs::read_to_string(manifest().join("../docs/openapi.json")).unwrap();
    let doc = serde_json::from_str(&text).unwrap();
    (text, doc)
}

#[test]
fn the_served_document_is_the_file_in_docs() {
    let (_dir, db) = scratch();
    // With tokens, as a deployed worker: the document needs none.
    let w = Worker::start(&db, &["--token", "c=secret", "--admin-token", "op"]);
    let r = w.http().get("/openapi.json");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.content_type, "application/json");
    let (text, doc) = document();
    assert!(
        r.body == text,
        "the served document differs from docs/openapi.json"
    );
    assert_eq!(doc["openapi"], "3.1.0");
    let bad = w.http().get("/openapi.json?format=yaml");
    assert_eq!((bad.status, bad.code().as_str()), (400, "invalid_request"));
}

/// `(METHOD, path)` of every route the router serves, read from its source: the one list
/// the document must match, so that a route added without its description fails here.
fn routes() -> BTreeSet<(String, String)> {
    let source = std::fs::read_to_string(manifest().join("src/api/mod.rs")).unwrap();
    let mut out = BTreeSet::new();
    for line in source.lines() {
        let Some(rest) = line.trim().strip_prefix(".route(\"") else {
            continue;
        };
        let (path, handler) = rest.split_once("\", ").unwrap();
        let method = handler.split_once('(').unwrap().0.to_uppercase();
        out.insert((method, path.to_owned()));
    }
    assert!(
        out.len() > 10,
        "no routes read from src/api/mod.rs: {out:?}"
    );
    out
}

#[test]
fn the_document_describes_every_route_and_only_those() {
    let (_, doc) = document();
    let mut described = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            described.insert((method.to_uppercase(), path.clone()));
            let responses = op["responses"].as_object().unwrap();
            assert!(!responses.is_empty(), "{method} {path} has no responses");
            assert!(op["operationId"].is_string(), "{method} {path}");
        }
    }
    assert_eq!(described, routes());
}

fn resolve<'a>(doc: &'a Value, reference: &str) -> Option<&'a Value> {
    doc.pointer(reference.strip_prefix('#')?)
}

fn check_refs(doc: &Value, v: &Value, seen: &mut usize) {
    match v {
        Value::Object(map) => {
            if let Some(Value::String(r)) = map.get("$ref") {
                assert!(resolve(doc, r).is_some(), "{r} does not resolve");
                *seen += 1;
            }
            for v in map.values() {
                check_refs(doc, v, seen);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| check_refs(doc, v, seen)),
        _ => {}
    }
}

#[test]
fn every_reference_resolves_and_every_problem_code_is_described() {
    let (text, doc) = document();
    let mut seen = 0;
    check_refs(&doc, &doc, &mut seen);
    assert!(seen > 50, "{seen} references");
    // Every problem code the worker answers with appears in the document.
    let mut codes: BTreeSet<String> = BTreeSet::new();
    for file in [
        "problem.rs",
        "state.rs",
        "commands.rs",
        "reads.rs",
        "feed.rs",
        "mod.rs",
    ] {
        let source =
            std::fs::read_to_string(manifest().join("src/api").join(file)).unwrap_or_default();
        for piece in source.split('"').skip(1).step_by(2) {
            if piece.len() > 3
                && piece.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
                && piece.contains('_')
                && (piece.ends_with("_found")
                    || piece.ends_with("_request")
                    || piece.ends_with("_unsupported")
                    || piece.starts_with("idempotency_key")
                    || piece.ends_with("_progress")
                    || piece.ends_with("_large")
                    || piece.ends_with("_timeout")
                    || piece.ends_with("_allowed"))
            {
                codes.insert(piece.to_owned());
            }
        }
    }
    for code in ledger::Rejection::ALL.map(ledger::Rejection::code) {
        codes.insert(code.to_owned());
    }
    for code in ["unauthorized", "forbidden", "unavailable", "internal"] {
        codes.insert(code.to_owned());
    }
    assert!(codes.len() >= 20, "{codes:?}");
    for code in &codes {
        assert!(
            text.contains(&format!("\"{code}\"")),
            "the problem code {code} is not in docs/openapi.json"
        );
    }
}

/// The document's currencies are exactly the codes the worker accepts by default (ISO
/// 4217, as `idem-money` knows it): every three capital letters are tried both ways, so
/// neither can drift from the other.
#[test]
fn the_documents_currencies_are_the_ones_accepted() {
    let (_, doc) = document();
    let listed: BTreeSet<String> = doc["components"]["schemas"]["Currency"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_owned())
        .collect();
    let mut accepted = BTreeSet::new();
    for a in b'A'..=b'Z' {
        for b in b'A'..=b'Z' {
            for c in b'A'..=b'Z' {
                let code = String::from_utf8(vec![a, b, c]).unwrap();
                if money::is_iso_code(&code) {
                    accepted.insert(code);
                }
            }
        }
    }
    assert!(accepted.len() > 150, "{}", accepted.len());
    assert_eq!(listed, accepted);
}
