//! The fuzz targets' seed corpora (`fuzz/corpus/<target>/`), run on stable without
//! libFuzzer: every file of every corpus goes through the same check as its fuzz target
//! (this crate, `idem_fuzz_checks`). The corpus files themselves are made here, by the real
//! parsers' and encoder's inputs and outputs; the test fails when a committed seed differs
//! from what this file makes. To (re)write them:
//! `IDEM_WRITE_FUZZ_SEEDS=1 cargo test -p idem-fuzz-checks --test corpus`.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use idem_fuzz_checks::{FACT_SEQ, TARGETS, message_line};
use inbox_worker::wire::body_of;
use ledger::{
    Account, Amount, ClientId, Command, Currency, Fact, FactBody, Key, Rejection, RejectionDetail,
    Timestamp,
};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    out.sort();
    out
}

#[test]
fn every_corpus_file_passes_its_targets_check() {
    let corpus = fuzz_dir().join("corpus");
    let mut dirs = BTreeSet::new();
    for entry in std::fs::read_dir(&corpus).unwrap() {
        dirs.insert(entry.unwrap().file_name().to_string_lossy().into_owned());
    }
    let targets: BTreeSet<String> = TARGETS.iter().map(|(n, _)| (*n).to_owned()).collect();
    assert_eq!(dirs, targets, "corpus directories and fuzz targets differ");
    for (name, check) in TARGETS {
        let source = fuzz_dir().join("fuzz_targets").join(format!("{name}.rs"));
        let text = std::fs::read_to_string(&source).unwrap();
        assert!(
            text.contains(&format!("idem_fuzz_checks::{name}")),
            "{} does not run idem_fuzz_checks::{name}",
            source.display()
        );
        let seeds = files(&corpus.join(name));
        assert!(!seeds.is_empty(), "fuzz/corpus/{name} is empty");
        for seed in seeds {
            let data = std::fs::read(&seed).unwrap();
            if let Err(panic) = std::panic::catch_unwind(|| check(&data)) {
                let why = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                panic!("{name}: {} fails: {why}", seed.display());
            }
        }
    }
}

#[test]
fn committed_seeds_are_the_generated_ones() {
    let write = std::env::var_os("IDEM_WRITE_FUZZ_SEEDS").is_some();
    let mut stale = Vec::new();
    for (target, seeds) in seeds() {
        assert!(TARGETS.iter().any(|(n, _)| *n == target), "{target}");
        let dir = fuzz_dir().join("corpus").join(target);
        for (name, bytes) in seeds {
            let path = dir.join(&name);
            if write {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&path, &bytes).unwrap();
            } else if std::fs::read(&path).ok().as_deref() != Some(&bytes[..]) {
                stale.push(format!("{target}/{name}"));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "seeds missing or stale (rewrite with IDEM_WRITE_FUZZ_SEEDS=1): {stale:?}"
    );
}

// ---- the corpus files ---------------------------------------------------------------------

type Seeds = Vec<(String, Vec<u8>)>;

fn seed(out: &mut Seeds, name: &str, bytes: impl AsRef<[u8]>) {
    out.push((name.to_owned(), bytes.as_ref().to_vec()));
}

fn account(s: &str) -> Account {
    Account::parse_any(s).unwrap()
}
fn amount(n: u64) -> Amount {
    Amount::new(n).unwrap()
}
fn rub() -> Currency {
    Currency::parse("RUB").unwrap()
}
fn key(s: &str) -> Key {
    Key::parse(s).unwrap()
}

/// Every visible ASCII byte, in a key of the longest length.
fn longest_key() -> String {
    (0x21u8..=0x7E).cycle().take(255).map(char::from).collect()
}

fn commands() -> Vec<(&'static str, Command)> {
    vec![
        (
            "deposit",
            Command::Deposit {
                account: account("alice"),
                amount: amount(1000),
                currency: rub(),
            },
        ),
        (
            "withdraw",
            Command::Withdraw {
                account: account("shop:eu.main_1-x"),
                amount: amount(ledger::domain::AMOUNT_MAX),
                currency: Currency::parse("USD").unwrap(),
            },
        ),
        (
            "refund",
            Command::Refund {
                withdrawal: key(&longest_key()),
                amount: amount(1),
            },
        ),
    ]
}

fn http_body() -> Seeds {
    let mut s = Seeds::new();
    for (name, c) in commands() {
        seed(&mut s, &format!("{name}.json"), body_json(&c));
    }
    for (name, body) in [
        (
            "spaced-reordered.json",
            " { \"currency\" : \"RUB\", \"amount\":300 ,\"account\":\"alice\"} \n",
        ),
        (
            "escaped-strings.json",
            r#"{"account":"al\u0069ce","amount":5,"currency":"R\u0055B"}"#,
        ),
        (
            "refund-short.json",
            r#"{"withdrawal":"req-7f3a","amount":300}"#,
        ),
        (
            "amount-max.json",
            r#"{"account":"a","amount":1000000000000000,"currency":"EUR"}"#,
        ),
        (
            "amount-over-max.json",
            r#"{"account":"a","amount":1000000000000001,"currency":"EUR"}"#,
        ),
        (
            "amount-zero.json",
            r#"{"account":"a","amount":0,"currency":"EUR"}"#,
        ),
        (
            "amount-negative.json",
            r#"{"account":"a","amount":-1,"currency":"EUR"}"#,
        ),
        (
            "amount-float.json",
            r#"{"account":"a","amount":1.5,"currency":"EUR"}"#,
        ),
        (
            "amount-exponent.json",
            r#"{"account":"a","amount":1e3,"currency":"EUR"}"#,
        ),
        (
            "amount-string.json",
            r#"{"account":"a","amount":"300","currency":"EUR"}"#,
        ),
        (
            "amount-u64-overflow.json",
            r#"{"withdrawal":"w","amount":18446744073709551616}"#,
        ),
        (
            "unknown-field.json",
            r#"{"account":"a","amount":1,"currency":"EUR","zzz":1}"#,
        ),
        (
            "duplicate-field.json",
            r#"{"account":"a","amount":1,"currency":"EUR","account":"b"}"#,
        ),
        ("missing-field.json", r#"{"account":"a","amount":1}"#),
        ("array.json", r#" ["alice",1,"RUB"]"#),
        (
            "system-account.json",
            r#"{"account":"@world","amount":1,"currency":"RUB"}"#,
        ),
        (
            "lowercase-currency.json",
            r#"{"account":"a","amount":1,"currency":"rub"}"#,
        ),
        ("empty-key-refund.json", r#"{"withdrawal":"","amount":300}"#),
        (
            "mixed-fields.json",
            r#"{"withdrawal":"w","account":"a","amount":1,"currency":"RUB"}"#,
        ),
        ("truncated.json", r#"{"account":"zzz""#),
        ("null.json", "null"),
        ("empty.json", ""),
        (
            "nested-deep.json",
            "{\"account\":[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]}",
        ),
    ] {
        seed(&mut s, name, body);
    }
    s
}

fn body_json(c: &Command) -> Vec<u8> {
    serde_json::to_vec(&body_of(c)).unwrap()
}

fn key_parse() -> Seeds {
    let mut s = Seeds::new();
    let name64 = "a".repeat(64);
    let name65 = "a".repeat(65);
    let key256 = "k".repeat(256);
    for (name, text) in [
        ("key-short", "ord-1"),
        ("key-uuid", "3f2b8c1e-9d4a-4e7b-8c2f-1a6d5e9b0c7d"),
        ("key-longest", longest_key().as_str()),
        ("key-too-long", key256.as_str()),
        ("empty", ""),
        ("space-inside", "ord 1"),
        ("leading-space", " ord-1"),
        ("tab", "ord\t1"),
        ("del", "ord\u{7f}"),
        ("nul", "a\0b"),
        ("non-ascii", "ключ-1"),
        ("account", "alice"),
        ("account-with-colon", "shop:eu.main_1-x"),
        ("name-64", name64.as_str()),
        ("name-65", name65.as_str()),
        ("system-world", Account::WORLD),
        ("system-payouts", Account::PAYOUTS),
        ("system-other", "@bank"),
        ("client-default", ClientId::default_client().as_str()),
        ("currency", "RUB"),
        ("currency-lower", "rub"),
        ("currency-long", "RUBL"),
    ] {
        seed(&mut s, name, text);
    }
    seed(&mut s, "invalid-utf8", [b'k', 0xff, 0xfe, b'1']);
    seed(&mut s, "obs-text", [b'k', 0x80, b'1']);
    s
}

fn inbox_message() -> Seeds {
    let mut s = Seeds::new();
    for (name, c) in commands() {
        let line = message_line(&format!("m-{name}"), &format!("k-{name}"), None, &c);
        seed(&mut s, &format!("{name}.json"), line);
        let line = message_line("m-1", "ord-1", Some("shop"), &c);
        seed(&mut s, &format!("{name}-client.json"), line);
    }
    for (name, line) in [
        (
            "client-null.json",
            r#"{"message_id":"m","key":"k","client":null,"command":{"type":"refund","withdrawal":"w","amount":5}}"#,
        ),
        (
            "client-invalid.json",
            r#"{"message_id":"m","key":"k","client":"a:b","command":{"type":"refund","withdrawal":"w","amount":5}}"#,
        ),
        (
            "type-unknown.json",
            r#"{"message_id":"m2","key":"k1","command":{"type":"steal"}}"#,
        ),
        (
            "type-missing.json",
            r#"{"message_id":"m2","key":"k1","command":{"withdrawal":"w","amount":5}}"#,
        ),
        (
            "command-array.json",
            r#"{"message_id":"m4","key":"k1","command":["deposit","a",1,"RUB"]}"#,
        ),
        (
            "command-unknown-field.json",
            r#"{"message_id":"m5","key":"k","command":{"type":"deposit","account":"a","amount":1,"currency":"RUB","zzz":0}}"#,
        ),
        (
            "line-array.json",
            r#"["m3","k1",{"type":"deposit","account":"a","amount":1,"currency":"RUB"}]"#,
        ),
        (
            "line-unknown-field.json",
            r#"{"message_id":"m6","key":"k","zzz":1,"command":{"type":"refund","withdrawal":"w","amount":5}}"#,
        ),
        (
            "key-missing.json",
            r#"{"message_id":"m7","command":{"type":"refund","withdrawal":"w","amount":5}}"#,
        ),
        (
            "key-invalid.json",
            r#"{"message_id":"m8","key":"a b","command":{"type":"refund","withdrawal":"w","amount":5}}"#,
        ),
        (
            "message-id-invalid.json",
            r#"{"message_id":"","key":"k","command":{"type":"refund","withdrawal":"w","amount":5}}"#,
        ),
        (
            "message-id-number.json",
            r#"{"message_id":9,"key":"k","command":{"type":"refund","withdrawal":"w","amount":5}}"#,
        ),
        (
            "duplicate-id.json",
            r#"{"message_id":"a","message_id":"b","key":"k","command":{"type":"refund","withdrawal":"w","amount":5}}"#,
        ),
        (
            "amount-zero.json",
            r#"{"message_id":"m9","key":"k","command":{"type":"withdraw","account":"a","amount":0,"currency":"RUB"}}"#,
        ),
        ("not-json.txt", "not json"),
        ("empty.txt", ""),
    ] {
        seed(&mut s, name, line);
    }
    s
}

fn fact_decode() -> Seeds {
    let fact = |at: i64, client: &str, k: &str, body: FactBody| Fact {
        seq: FACT_SEQ,
        at: Timestamp(at),
        client: ClientId::parse(client).unwrap(),
        key: key(k),
        body,
    };
    let mut facts = vec![
        (
            "deposit",
            fact(
                1_700_000_000_000,
                "default",
                "ord-1",
                FactBody::DepositRecorded {
                    account: account("alice"),
                    amount: amount(1000),
                    currency: rub(),
                    balance_after: 1000,
                },
            ),
        ),
        (
            "withdrawal",
            fact(
                1_700_000_000_001,
                "shop",
                "ord-2",
                FactBody::WithdrawalRecorded {
                    account: account("alice"),
                    amount: amount(300),
                    currency: rub(),
                    balance_after: 700,
                },
            ),
        ),
        (
            "withdrawal-extremes",
            fact(
                i64::MIN,
                &"c".repeat(64),
                &longest_key(),
                FactBody::WithdrawalRecorded {
                    account: account(&"a".repeat(64)),
                    amount: amount(ledger::domain::AMOUNT_MAX),
                    currency: Currency::parse("ZZZ").unwrap(),
                    balance_after: u128::MAX,
                },
            ),
        ),
        (
            "refund",
            fact(
                1_700_000_000_002,
                "shop",
                "ref-1",
                FactBody::RefundRecorded {
                    withdrawal: key("ord-2"),
                    account: account("alice"),
                    amount: amount(100),
                    currency: rub(),
                    balance_after: 800,
                    refunded_total: 100,
                },
            ),
        ),
    ];
    for (i, (name, command)) in commands().into_iter().enumerate() {
        let rejection = Rejection::ALL[i % Rejection::ALL.len()];
        let body = FactBody::CommandRejected {
            command,
            rejection,
            detail: None,
        };
        let name: &'static str = match name {
            "deposit" => "rejected-deposit",
            "withdraw" => "rejected-withdraw",
            _ => "rejected-refund",
        };
        facts.push((name, fact(i64::MAX, "default", "rej", body)));
    }
    let mut s = Seeds::new();
    for (name, f) in &facts {
        seed(&mut s, name, f.encode());
    }
    // System accounts are legal in stored data (never in commands from outside).
    let stored_system = fact(
        0,
        "default",
        "sys",
        FactBody::CommandRejected {
            command: Command::Withdraw {
                account: account(Account::WORLD),
                amount: amount(5),
                currency: rub(),
            },
            rejection: Rejection::InsufficientFunds,
            detail: None,
        },
    );
    seed(&mut s, "rejected-system-account", stored_system.encode());
    // Rejections with the figure they were decided on (version 2 of the payload).
    let commands = commands();
    let detailed = [
        (
            "rejected-insufficient-funds",
            1,
            RejectionDetail::Balance(u128::MAX),
        ),
        (
            "rejected-currency-mismatch",
            0,
            RejectionDetail::AccountCurrency(Currency::parse("EUR").unwrap()),
        ),
        ("rejected-refund-exceeds", 2, RejectionDetail::Refundable(0)),
    ];
    for (name, i, detail) in detailed {
        let body = FactBody::CommandRejected {
            command: commands[i].1.clone(),
            rejection: detail.rejection(),
            detail: Some(detail),
        };
        seed(&mut s, name, fact(1, "default", "rej", body).encode());
    }

    let deposit = facts[0].1.encode();
    seed(&mut s, "empty", []);
    seed(&mut s, "tag-only", [1]);
    seed(&mut s, "header-only", [1, 1]);
    let mut future = deposit.clone();
    future[1] = 2;
    seed(&mut s, "future-version", future);
    let mut unknown = deposit.clone();
    unknown[0] = 9;
    seed(&mut s, "unknown-tag", unknown);
    let mut as_refund = deposit.clone();
    as_refund[0] = 3;
    seed(&mut s, "deposit-payload-tagged-refund", as_refund);
    seed(&mut s, "truncated", &deposit[..deposit.len() - 3]);
    let mut trailing = deposit.clone();
    trailing.push(0);
    seed(&mut s, "trailing-byte", trailing);
    // MovementV1 by hand: at 0, client "c", key "k", account "a", amount 0, "RUB", 0.
    seed(
        &mut s,
        "amount-zero",
        [
            1, 1, 0, 1, b'c', 1, b'k', 1, b'a', 0, 3, b'R', b'U', b'B', 0,
        ],
    );
    // The same with an account the rules refuse ("a b") and a lowercase currency.
    seed(
        &mut s,
        "invalid-names",
        [
            1, 1, 0, 1, b'c', 1, b'k', 3, b'a', b' ', b'b', 1, 3, b'r', b'u', b'b', 0,
        ],
    );
    s
}

fn seeds() -> Vec<(&'static str, Seeds)> {
    vec![
        ("http_body", http_body()),
        ("key_parse", key_parse()),
        ("inbox_message", inbox_message()),
        ("fact_decode", fact_decode()),
    ]
}
