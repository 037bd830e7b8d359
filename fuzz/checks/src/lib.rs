//! The property checks of the fuzz targets (`fuzz/fuzz_targets/*.rs`), kept in a crate of
//! their own so the same bodies run under libFuzzer and, over the committed seed corpora,
//! in the ordinary test suite on stable (`tests/corpus.rs`). Each check takes arbitrary
//! bytes, must never panic on any of them, and panics (with the property's name) when a
//! decoder breaks one of its promises. A test tool: nothing in the product depends on it.

use http::HeaderValue;
use inbox_worker::wire::{CommandKind, Message, body_of, kind_of, parse_body, parse_message};
use ledger::json;
use ledger::{Account, ClientId, Command, Currency, Fact, FactBody, Key, MessageId, Outcome};
use serde_json::{Map, Value};

/// A fuzz target's check: returns on any input its decoder handles correctly, panics
/// otherwise.
pub type Check = fn(&[u8]);

/// Every fuzz target: its name (the file `fuzz/fuzz_targets/<name>.rs` and the corpus
/// directory `fuzz/corpus/<name>/`) and its check.
pub const TARGETS: [(&str, Check); 4] = [
    ("http_body", http_body),
    ("key_parse", key_parse),
    ("inbox_message", inbox_message),
    ("fact_decode", fact_decode),
];

/// The sequence number `fact_decode` decodes every record under.
pub const FACT_SEQ: u64 = 42;

/// Refusals end up in HTTP answers, logs and the quarantine, so they are written by us,
/// never echoed from the input. serde_json quotes what it saw in backticks or double
/// quotes; our own messages use neither, are ASCII and are short. The one exception is
/// an unknown field named by its name (`` unknown field `acount` ``): at most 64 bytes of
/// visible ASCII with no backtick, and only at the start, where the refusal puts it; the
/// rest must still quote nothing.
fn assert_not_echoed(detail: &str) {
    let rest = match detail.strip_prefix("unknown field `") {
        Some(named) => match named.split_once('`') {
            Some((name, rest)) => {
                assert!(
                    name.len() <= 64 && name.bytes().all(|b| b == b' ' || b.is_ascii_graphic()),
                    "an unknown field's name repeated unbounded: {detail:?}"
                );
                rest
            }
            None => detail,
        },
        None => detail,
    };
    assert!(
        detail.is_ascii() && !rest.contains('`') && !rest.contains('"') && detail.len() <= 400,
        "a refusal must not quote the input: {detail:?}"
    );
}

fn to_json(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).expect("a serde_json::Value always serialises")
}

/// The inbox line carrying `command`, rendered as a producer would write it.
pub fn message_line(
    message_id: &str,
    key: &str,
    client: Option<&str>,
    command: &Command,
) -> Vec<u8> {
    let mut cmd = match body_of(command) {
        Value::Object(map) => map,
        other => panic!("body_of must render an object, not {other}"),
    };
    cmd.insert("type".into(), Value::from(command.name()));
    let mut line = Map::new();
    line.insert("message_id".into(), Value::from(message_id));
    line.insert("key".into(), Value::from(key));
    if let Some(c) = client {
        line.insert("client".into(), Value::from(c));
    }
    line.insert("command".into(), Value::Object(cmd));
    to_json(&Value::Object(line))
}

// ---- 1. HTTP bodies -----------------------------------------------------------------------

/// `wire::parse_body` for each endpoint over the same bytes. Properties: deposit and
/// withdrawal bodies have one shape (both parse to the same fields or both fail alike); no
/// body is both a movement and a refund; only a JSON object is ever accepted; a parsed
/// command re-rendered by `body_of` parses back to itself, with the same canonical bytes
/// and fingerprint, and its rendering is a fixed point; the same command sent through the
/// inbox decodes to the same command; refusals never quote the input.
pub fn http_body(data: &[u8]) {
    let deposit = parse_body(CommandKind::Deposit, data);
    let withdraw = parse_body(CommandKind::Withdraw, data);
    let refund = parse_body(CommandKind::Refund, data);
    match (&deposit, &withdraw) {
        (
            Ok(Command::Deposit {
                account: a1,
                amount: m1,
                currency: c1,
            }),
            Ok(Command::Withdraw {
                account: a2,
                amount: m2,
                currency: c2,
            }),
        ) => assert!(
            a1 == a2 && m1 == m2 && c1 == c2,
            "deposit and withdrawal read one body differently"
        ),
        (Err(d), Err(w)) => assert_eq!(d, w, "deposit and withdrawal refuse one body differently"),
        (d, w) => panic!("deposit and withdrawal disagree on one body: {d:?} / {w:?}"),
    }
    assert!(
        !(deposit.is_ok() && refund.is_ok()),
        "one body parsed both as a movement and as a refund"
    );
    for (kind, parsed) in [
        (CommandKind::Deposit, deposit),
        (CommandKind::Withdraw, withdraw),
        (CommandKind::Refund, refund),
    ] {
        match parsed {
            Ok(command) => body_round_trip(kind, data, &command),
            Err(e) => assert_not_echoed(&e.detail),
        }
    }
}

fn body_round_trip(kind: CommandKind, data: &[u8], command: &Command) {
    assert_eq!(
        kind_of(command),
        kind,
        "an endpoint produced another command"
    );
    assert_eq!(
        data.iter().find(|b| !b.is_ascii_whitespace()),
        Some(&b'{'),
        "a body that is not a JSON object was accepted"
    );
    let rendered = to_json(&body_of(command));
    let again = parse_body(kind, &rendered)
        .unwrap_or_else(|e| panic!("the re-rendered body of {command:?} is refused: {e}"));
    assert_eq!(
        &again, command,
        "the re-rendered body parses to another command"
    );
    assert_eq!(again.canonical_bytes(), command.canonical_bytes());
    assert_eq!(again.fingerprint(), command.fingerprint());
    assert_eq!(
        to_json(&body_of(&again)),
        rendered,
        "body_of is not a fixed point"
    );
    let line = message_line("m-fuzz", "k-fuzz", None, command);
    let message = parse_message(&line)
        .unwrap_or_else(|(_, e)| panic!("{command:?} is refused through the inbox: {e}"));
    assert_eq!(
        &message.command, command,
        "the inbox reads the command differently from HTTP"
    );
}

// ---- 2. keys and names --------------------------------------------------------------------

fn visible_ascii(b: &[u8]) -> bool {
    b.iter().all(|c| (0x21..=0x7E).contains(c))
}

fn name_bytes(b: &[u8], colon: bool) -> bool {
    b.iter().all(|&c| {
        c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.') || (colon && c == b':')
    })
}

/// The rules of domain.rs, restated independently as the oracle.
fn key_rule(b: &[u8]) -> bool {
    (1..=ledger::domain::KEY_LEN_MAX).contains(&b.len()) && visible_ascii(b)
}

fn name_rule(b: &[u8], colon: bool) -> bool {
    (1..=ledger::domain::NAME_LEN_MAX).contains(&b.len()) && name_bytes(b, colon)
}

/// A parsed value gives back exactly its input, and survives the serde forms it is stored
/// and sent in (JSON and postcard go through the same validating `try_from`).
fn round_trips<T>(s: &str, parsed: Option<T>, as_str: fn(&T) -> &str, rule: bool, what: &str)
where
    T: serde::Serialize
        + serde::de::DeserializeOwned
        + PartialEq
        + std::fmt::Debug
        + std::fmt::Display,
{
    assert_eq!(
        parsed.is_some(),
        rule,
        "{what}::parse disagrees with its rule on {s:?}"
    );
    let via_json = serde_json::from_value::<T>(Value::from(s)).ok();
    assert_eq!(
        via_json, parsed,
        "{what} from JSON differs from {what}::parse on {s:?}"
    );
    if let Some(v) = parsed {
        assert_eq!(as_str(&v), s, "{what} does not give back its input");
        let json = serde_json::to_string(&v).expect("a string newtype serialises");
        let back: T = serde_json::from_str(&json).expect("a serialised value deserialises");
        assert_eq!(back, v, "{what} does not survive JSON");
        assert_eq!(v.to_string(), s, "{what} displays as something else");
    }
}

/// The key validator and its siblings. Properties: `Key`, `MessageId`, `ClientId`,
/// `Account` and `Currency` accept exactly what their rules say, give back their input,
/// and parse the same through serde; system accounts only through `parse_any`; and the
/// server's path for an `Idempotency-Key` header value (header bytes, then `to_str`, then
/// `Key::parse`) accepts exactly the valid keys, every one of which is a valid header.
pub fn key_parse(data: &[u8]) {
    // The header path, as `server::idempotency_key` takes one header value.
    let via_header = HeaderValue::from_bytes(data)
        .ok()
        .and_then(|h| h.to_str().ok().and_then(|t| Key::parse(t).ok()));
    assert_eq!(
        via_header.is_some(),
        key_rule(data),
        "the Idempotency-Key header path disagrees with the key rule"
    );
    if let Some(k) = &via_header {
        assert_eq!(
            k.as_str().as_bytes(),
            data,
            "the header key is not the header"
        );
    }

    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let b = s.as_bytes();
    round_trips(s, Key::parse(s).ok(), Key::as_str, key_rule(b), "Key");
    round_trips(
        s,
        MessageId::parse(s).ok(),
        MessageId::as_str,
        key_rule(b),
        "MessageId",
    );
    round_trips(
        s,
        ClientId::parse(s).ok(),
        ClientId::as_str,
        name_rule(b, false),
        "ClientId",
    );
    let currency_rule = b.len() == 3 && b.iter().all(u8::is_ascii_uppercase);
    round_trips(
        s,
        Currency::parse(s).ok(),
        Currency::as_str,
        currency_rule,
        "Currency",
    );

    // A user account: never a system one.
    let account = Account::parse(s).ok();
    assert_eq!(
        account.is_some(),
        name_rule(b, true),
        "Account::parse on {s:?}"
    );
    if let Some(a) = &account {
        assert_eq!(a.as_str(), s);
        assert!(
            !a.is_system(),
            "Account::parse let a system account through"
        );
    }
    // Stored data and queries: the user rule plus exactly the two system accounts, which
    // is also what deserialising an account accepts.
    let any = Account::parse_any(s).ok();
    let system = s == Account::WORLD || s == Account::PAYOUTS;
    round_trips(
        s,
        any.clone(),
        Account::as_str,
        system || account.is_some(),
        "Account",
    );
    if let Some(a) = any {
        assert_eq!(a.is_system(), system);
    }
}

// ---- 3. inbox messages --------------------------------------------------------------------

/// `wire::parse_message`. Properties: decoding is deterministic; an accepted line is a
/// JSON object whose `message_id` is the decoded id; the message re-rendered as a line
/// decodes to itself, with a stable fingerprint; its command re-sent as an HTTP body
/// parses to the same command; a refusal names only the id the line really carries and
/// never quotes the input.
pub fn inbox_message(data: &[u8]) {
    let decoded = parse_message(data);
    assert_eq!(
        decoded,
        parse_message(data),
        "decoding is not deterministic"
    );
    let generic = serde_json::from_slice::<Value>(data).ok();
    let line_id = generic.as_ref().and_then(|v| v.get("message_id")?.as_str());
    match decoded {
        Ok(m) => {
            assert!(
                generic.as_ref().is_some_and(Value::is_object),
                "a line that is not a JSON object was accepted"
            );
            assert_eq!(line_id, Some(m.message_id.as_str()));
            message_round_trip(&m);
        }
        Err((id, e)) => {
            assert_not_echoed(&e.detail);
            if let Some(id) = id {
                assert_eq!(
                    Some(id.as_str()),
                    line_id,
                    "the quarantine would name an id the line does not carry"
                );
            }
        }
    }
}

fn message_round_trip(m: &Message) {
    let line = message_line(
        m.message_id.as_str(),
        m.key.as_str(),
        m.client.as_ref().map(ClientId::as_str),
        &m.command,
    );
    let again = parse_message(&line)
        .unwrap_or_else(|(_, e)| panic!("the re-rendered line of {m:?} is refused: {e}"));
    assert_eq!(&again, m, "the re-rendered line decodes to another message");
    assert_eq!(again.command.fingerprint(), m.command.fingerprint());
    let body = to_json(&body_of(&m.command));
    assert_eq!(
        parse_body(kind_of(&m.command), &body).as_ref(),
        Ok(&m.command),
        "HTTP reads the inbox's command differently"
    );
}

// ---- 4. stored facts ----------------------------------------------------------------------

/// `Fact::decode`. Properties: never panics (nor does rendering its error); a decoded fact
/// has the sequence number it was read under and the record's tag and version; it encodes
/// to bytes that decode to the same fact and re-encode identically; the sequence number
/// changes nothing else; the views rebuilt from a fact (outcome, log JSON) do not panic and
/// agree with it.
pub fn fact_decode(data: &[u8]) {
    let fact = match Fact::decode(FACT_SEQ, data) {
        Ok(f) => f,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    assert_eq!(fact.seq, FACT_SEQ);
    let encoded = fact.encode();
    assert_eq!(
        encoded.get(..2),
        data.get(..2),
        "re-encoding changed the tag or version"
    );
    let again = Fact::decode(FACT_SEQ, &encoded)
        .unwrap_or_else(|e| panic!("the re-encoded {fact:?} does not decode: {e}"));
    assert_eq!(again, fact, "the fact does not survive encode then decode");
    assert_eq!(again.encode(), encoded, "encoding is not canonical");

    let other_seq = FACT_SEQ.wrapping_add(1);
    let moved = Fact::decode(other_seq, data).expect("the seq does not decide decoding");
    assert_eq!(moved.seq, other_seq);
    assert_eq!(
        Fact {
            seq: FACT_SEQ,
            ..moved
        },
        fact
    );

    let outcome = Outcome::from_fact(&fact);
    assert_eq!(outcome.seq(), FACT_SEQ);
    assert_eq!(
        outcome.rejection().is_some(),
        matches!(fact.body, FactBody::CommandRejected { .. })
    );
    let view = json::fact(&fact);
    assert_eq!(view.get("seq").and_then(Value::as_u64), Some(FACT_SEQ));
    assert_eq!(
        view.get("key").and_then(Value::as_str),
        Some(fact.key.as_str())
    );
    let _ = json::outcome(&outcome);
    let _ = fact.body.command().fingerprint();
}
