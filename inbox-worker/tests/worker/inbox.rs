//! The inbox: duplicates, redeliveries, a conflicting message_id and broken lines.

use crate::support::{Worker, run, scratch};

const FILE: &str = r#"{"message_id":"m1","key":"dep-1","command":{"type":"deposit","account":"alice","amount":1000,"currency":"RUB"}}
{"message_id":"m2","key":"req-7f3a","command":{"type":"withdraw","account":"alice","amount":300,"currency":"RUB"}}
{"message_id":"m2","key":"req-7f3a","command":{"type":"withdraw","account":"alice","amount":300,"currency":"RUB"}}
{"command":{"currency":"RUB","amount":300,"account":"alice","type":"withdraw"},"key":"req-7f3a","message_id":"m2"}
{"message_id":"m3","key":"req-7f3a","command":{"type":"withdraw","account":"alice","amount":300,"currency":"RUB"}}
this is not json
{"message_id":"m2","key":"req-7f3a","command":{"type":"withdraw","account":"alice","amount":999,"currency":"RUB"}}
{"message_id":"m4","key":"req-7f3a","command":{"type":"withdraw","account":"alice","amount":999,"currency":"RUB"}}

{"message_id":"m5","key":"ref-1","command":{"type":"refund","withdrawal":"req-7f3a","amount":100}}
{"message_id":"m5","key":"ref-1","command":{"type":"refund","withdrawal":"req-7f3a","amount":100}}
{"message_id":"m6","key":"w-2","client":"shop","command":{"type":"withdraw","account":"alice","amount":1,"currency":"RUB","memo":"zqxmemo"}}
{"message_id":"m7","key":"big","command":{"type":"withdraw","account":"alice","amount":100000,"currency":"RUB"}}
{"message_id":"m8","key":"w-3","command":{"type":"withdraw","account":"alice","amount":0,"currency":"RUB"}}
"#;

#[test]
fn inbox_file_absorbs_duplicates_and_quarantines_the_rest() {
    let (dir, db) = scratch();
    let file = dir.path().join("messages.jsonl");
    std::fs::write(&file, FILE).unwrap();
    let consume = || {
        run(&[
            "consume",
            "--db",
            db.to_str().unwrap(),
            "--from",
            file.to_str().unwrap(),
        ])
    };
    let out = consume();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    // Something was quarantined: exit 3, and every quarantine is reported.
    assert_eq!(out.status.code(), Some(3), "{text}");
    assert!(
        text.starts_with(
            "13 messages: 3 applied, 1 rejected (outcome stored), 4 duplicates absorbed, 5 quarantined"
        ),
        "{text}"
    );
    assert!(
        text.contains("line 6, message (unreadable): undecodable"),
        "{text}"
    );
    assert!(
        text.contains("line 7, message m2: message_id_reused"),
        "{text}"
    );
    assert!(
        text.contains("line 8, message m4: idempotency_key_reused"),
        "{text}"
    );
    assert!(text.contains("line 12, message m6: undecodable"), "{text}");
    assert!(text.contains("line 14, message m8: undecodable"), "{text}");
    // No value is echoed into the reasons, only into the kept payload; an unknown field
    // is named, so that the sender can fix it.
    assert!(!text.contains("zqxmemo"), "{text}");
    assert!(
        text.contains("line 12, message m6: undecodable: unknown field `memo` in command"),
        "{text}"
    );

    // A second delivery of the whole file moves nothing.
    let again = consume();
    let text2 = String::from_utf8_lossy(&again.stdout).into_owned();
    assert!(text2.contains("0 applied, 0 rejected"), "{text2}");

    // One effect per key, and HTTP retries of the same keys are replays.
    let w = Worker::start(&db, &[]);
    let http = w.http();
    assert_eq!(http.balance("alice"), 800);
    let r = http.withdraw("req-7f3a", "alice", 300);
    assert!(r.replayed);
    assert_eq!(r.json()["seq"], 2);
    assert_eq!(http.last_seq(), 4);

    // The operator reads the quarantine back over HTTP: oldest first, with the reason and
    // the payload as received, paged by id. The second run of the file quarantined its
    // five lines again (each delivery is kept), so there are ten.
    let page = http.get("/v1/live/quarantine?limit=3");
    assert_eq!(page.status, 200, "{}", page.body);
    let page = page.json();
    let rows = page["quarantined"].as_array().unwrap();
    let seen: Vec<(Option<&str>, &str)> = rows
        .iter()
        .map(|r| (r["message_id"].as_str(), r["reason"].as_str().unwrap()))
        .collect();
    assert_eq!(seen.len(), 3, "{page}");
    assert!(
        seen[0].0.is_none() && seen[0].1.starts_with("undecodable"),
        "{page}"
    );
    assert!(
        seen[1].0 == Some("m2") && seen[1].1.starts_with("message_id_reused"),
        "{page}"
    );
    assert!(
        seen[2].0 == Some("m4") && seen[2].1.starts_with("idempotency_key_reused"),
        "{page}"
    );
    assert!(
        rows[0]["payload"]
            .as_str()
            .unwrap()
            .contains("this is not json"),
        "{page}"
    );
    assert!(
        rows[2]["payload"].as_str().unwrap().contains("999"),
        "{page}"
    );
    assert_eq!(page["next"], rows[2]["id"]);
    let rest = http
        .get(&format!(
            "/v1/live/quarantine?after={}&limit=1000",
            page["next"]
        ))
        .json();
    let rest = rest["quarantined"].as_array().unwrap().clone();
    assert_eq!(rest.len(), 7, "{rest:?}");
    assert!(rest[0]["id"].as_u64() > rows[2]["id"].as_u64());
    assert_eq!(rest[0]["message_id"], "m6");
    assert_eq!(rest[2]["message_id"], serde_json::Value::Null);
    let last = http.get(&format!(
        "/v1/live/quarantine?after={}&limit=7",
        rows[2]["id"]
    ));
    assert_eq!(
        last.json()["next"],
        rest[6]["id"],
        "a full page names the next"
    );
    let end = http.get(&format!("/v1/live/quarantine?after={}", rest[6]["id"]));
    assert_eq!(
        end.json(),
        serde_json::json!({"quarantined": [], "next": null})
    );
    let bad = http.get("/v1/live/quarantine?after=-1");
    assert_eq!(
        (bad.status, bad.code()),
        (400, "invalid_request".to_owned())
    );
    // The newest first, in one answer: the second run's m8, m6, then m4.
    let newest = http.get("/v1/live/quarantine?order=newest&limit=3").json();
    let ids: Vec<&serde_json::Value> = newest["quarantined"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["message_id"])
        .collect();
    assert_eq!(ids, ["m8", "m6", "m4"], "{newest}");
    assert_eq!(newest["quarantined"][0]["id"], rest[6]["id"]);
    assert_eq!(newest["next"], serde_json::Value::Null);
    // `after` bounds the ids in either order: the newest above m6's id are m8 alone.
    let above = http
        .get(&format!(
            "/v1/live/quarantine?order=newest&limit=3&after={}",
            rest[5]["id"]
        ))
        .json();
    assert_eq!(above["quarantined"].as_array().unwrap().len(), 1, "{above}");
    assert_eq!(above["quarantined"][0]["message_id"], "m8", "{above}");
    for bad in ["order=sideways", "order=newest&after=x"] {
        let r = http.get(&format!("/v1/live/quarantine?{bad}"));
        assert_eq!(
            (r.status, r.code()),
            (400, "invalid_request".to_owned()),
            "{bad}"
        );
    }

    assert_eq!(w.term().code(), Some(0));
    let out = run(&["verify", "--db", db.to_str().unwrap()]);
    assert!(out.status.success());
}

#[test]
fn inbox_reads_standard_input_and_shares_keys_with_http() {
    use std::io::Write as _;
    let (_dir, db) = scratch();
    let w = Worker::start(&db, &[]);
    w.http().deposit("dep-1", "bob", 500);
    assert_eq!(w.term().code(), Some(0));
    let mut child = std::process::Command::new(crate::support::bin())
        .args(["consume", "--db", db.to_str().unwrap(), "--from", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(
            br#"{"message_id":"x1","key":"dep-1","command":{"type":"deposit","account":"bob","amount":500,"currency":"RUB"}}
"#,
        )
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("1 message: 0 applied, 0 rejected (outcome stored), 1 duplicate absorbed,"),
        "{text}"
    );
}

#[test]
fn verify_reports_and_refuses_a_missing_ledger() {
    let (_dir, db) = scratch();
    let out = run(&["verify", "--db", db.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no ledger"));
}

/// A file of one tenant's messages: those naming no tenant act for `--client`, in its own
/// space; one naming another tenant, or a currency the worker does not take, is
/// quarantined as `not_accepted` and moves nothing.
#[test]
fn an_inbox_pinned_to_a_tenant_acts_for_it_alone() {
    let (dir, db) = scratch();
    let file = dir.path().join("shop.jsonl");
    std::fs::write(
        &file,
        r#"{"message_id":"m1","key":"d-1","command":{"type":"deposit","account":"alice","amount":1000,"currency":"RUB"}}
{"message_id":"m2","key":"w-1","client":"other","command":{"type":"withdraw","account":"alice","amount":900,"currency":"RUB"}}
{"message_id":"m3","key":"d-2","client":"shop","command":{"type":"deposit","account":"alice","amount":5,"currency":"RUB"}}
{"message_id":"m4","key":"d-3","command":{"type":"deposit","account":"bob","amount":5,"currency":"USS"}}
{"message_id":"m5","key":"d-4","command":{"type":"deposit","account":"bob","amount":5,"currency":"EUR"}}
"#,
    )
    .unwrap();
    let out = run(&[
        "consume",
        "--db",
        db.to_str().unwrap(),
        "--from",
        file.to_str().unwrap(),
        "--client",
        "shop",
        "--only-client",
        "--currencies",
        "RUB",
    ]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(3), "{text}");
    assert!(text.starts_with("5 messages: 2 applied"), "{text}");
    for (line, why) in [
        (2, "this queue serves another tenant"),
        (4, "the currency is not an ISO 4217 code"),
        (5, "this worker accepts RUB only"),
    ] {
        assert!(
            text.contains(&format!(
                "line {line}, message m{line}: not_accepted: {why}"
            )),
            "{text}"
        );
    }
    let w = Worker::start(&db, &["--token", "shop=s-shop", "--token", "other=s-other"]);
    let http = w.http();
    assert_eq!(http.with_token("s-shop").balance("alice"), 1005);
    let theirs = http.with_token("s-other").get("/v1/accounts/alice");
    assert_eq!(theirs.status, 404, "{}", theirs.body);
    assert_eq!(w.term().code(), Some(0));
}
