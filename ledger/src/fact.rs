//! Facts, outcomes and their persisted encoding. A fact is the ground truth of one key;
//! the outcome a client is told is derived from it, so it can always be rebuilt.

use serde::{Deserialize, Serialize};

use crate::domain::{
    Account, Amount, ClientId, Command, Currency, Fingerprint, Key, Rejection, Timestamp,
};

/// One immutable entry of the log: what happened to one (client, key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fact {
    /// Gapless, starting at 1, assigned inside the commit.
    pub seq: u64,
    /// When the ledger recorded it. Never earlier than the fact before it.
    pub at: Timestamp,
    pub client: ClientId,
    pub key: Key,
    pub body: FactBody,
}

/// What was recorded. Each variant has a stable persisted name and version
/// ([`FactBody::persisted_name`]), independent of the Rust identifier.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FactBody {
    DepositRecorded {
        account: Account,
        amount: Amount,
        currency: Currency,
        /// The account's balance after this fact.
        balance_after: u128,
    },
    WithdrawalRecorded {
        account: Account,
        amount: Amount,
        currency: Currency,
        balance_after: u128,
    },
    RefundRecorded {
        withdrawal: Key,
        account: Account,
        amount: Amount,
        currency: Currency,
        balance_after: u128,
        /// All refunds of the withdrawal so far, this one included.
        refunded_total: u64,
    },
    /// A business rejection is a fact too: it is the key's final outcome.
    CommandRejected {
        command: Command,
        rejection: Rejection,
    },
}

/// Tags of the persisted encoding. Never renumber: they are on disk.
const TAG_DEPOSIT: u8 = 1;
const TAG_WITHDRAWAL: u8 = 2;
const TAG_REFUND: u8 = 3;
const TAG_REJECTED: u8 = 4;
/// The version every fact is written with today.
pub const FACT_VERSION: u8 = 1;

impl FactBody {
    /// The stable name of the fact, as the API and the log show it.
    pub fn persisted_name(&self) -> &'static str {
        match self {
            FactBody::DepositRecorded { .. } => "DepositRecorded",
            FactBody::WithdrawalRecorded { .. } => "WithdrawalRecorded",
            FactBody::RefundRecorded { .. } => "RefundRecorded",
            FactBody::CommandRejected { .. } => "CommandRejected",
        }
    }

    fn tag(&self) -> u8 {
        match self {
            FactBody::DepositRecorded { .. } => TAG_DEPOSIT,
            FactBody::WithdrawalRecorded { .. } => TAG_WITHDRAWAL,
            FactBody::RefundRecorded { .. } => TAG_REFUND,
            FactBody::CommandRejected { .. } => TAG_REJECTED,
        }
    }

    /// The command this fact answers, rebuilt from the fact alone.
    /// The fingerprint of [`FactBody::command`], hashed from the fact's own fields.
    pub fn command_fingerprint(&self) -> Fingerprint {
        use crate::domain::CommandParts;
        match self {
            FactBody::DepositRecorded {
                account,
                amount,
                currency,
                ..
            } => CommandParts::movement(b"deposit", account, *amount, *currency).fingerprint(),
            FactBody::WithdrawalRecorded {
                account,
                amount,
                currency,
                ..
            } => CommandParts::movement(b"withdraw", account, *amount, *currency).fingerprint(),
            FactBody::RefundRecorded {
                withdrawal, amount, ..
            } => CommandParts::refund(withdrawal, *amount).fingerprint(),
            FactBody::CommandRejected { command, .. } => command.fingerprint(),
        }
    }

    pub fn command(&self) -> Command {
        match self {
            FactBody::DepositRecorded {
                account,
                amount,
                currency,
                ..
            } => Command::Deposit {
                account: account.clone(),
                amount: *amount,
                currency: *currency,
            },
            FactBody::WithdrawalRecorded {
                account,
                amount,
                currency,
                ..
            } => Command::Withdraw {
                account: account.clone(),
                amount: *amount,
                currency: *currency,
            },
            FactBody::RefundRecorded {
                withdrawal, amount, ..
            } => Command::Refund {
                withdrawal: withdrawal.clone(),
                amount: *amount,
            },
            FactBody::CommandRejected { command, .. } => command.clone(),
        }
    }
}

/// Persisted payloads, one per tag, so that the Rust enum can change shape without
/// changing what is on disk.
#[derive(Serialize, Deserialize)]
struct MovementV1 {
    at: i64,
    client: ClientId,
    key: Key,
    account: Account,
    amount: u64,
    currency: Currency,
    balance_after: u128,
}

#[derive(Serialize, Deserialize)]
struct RefundV1 {
    at: i64,
    client: ClientId,
    key: Key,
    withdrawal: Key,
    account: Account,
    amount: u64,
    currency: Currency,
    balance_after: u128,
    refunded_total: u64,
}

#[derive(Serialize, Deserialize)]
struct RejectedV1 {
    at: i64,
    client: ClientId,
    key: Key,
    command: Command,
    rejection: Rejection,
}

/// The same payloads borrowed, for writing: serde writes a reference as the value it
/// points to, so these encode byte for byte as the owned ones above, without copying
/// names (every commit encodes its facts, and every verified fact is encoded again).
#[derive(Serialize)]
struct MovementRef<'a> {
    at: i64,
    client: &'a ClientId,
    key: &'a Key,
    account: &'a Account,
    amount: u64,
    currency: Currency,
    balance_after: u128,
}

#[derive(Serialize)]
struct RefundRef<'a> {
    at: i64,
    client: &'a ClientId,
    key: &'a Key,
    withdrawal: &'a Key,
    account: &'a Account,
    amount: u64,
    currency: Currency,
    balance_after: u128,
    refunded_total: u64,
}

#[derive(Serialize)]
struct RejectedRef<'a> {
    at: i64,
    client: &'a ClientId,
    key: &'a Key,
    command: &'a Command,
    rejection: Rejection,
}

fn extended(mut out: Vec<u8>, head: [u8; 2]) -> Vec<u8> {
    out.extend_from_slice(&head);
    out
}

/// A stored record could not be read back: the store is corrupt or from a future version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("undecodable {what}: {reason}")]
pub struct DecodeError {
    pub what: &'static str,
    pub reason: String,
}

impl DecodeError {
    pub(crate) fn new(what: &'static str, reason: impl ToString) -> Self {
        Self {
            what,
            reason: reason.to_string(),
        }
    }
}

impl Fact {
    /// `[tag][version][postcard payload]`. The sequence number is the record's key in the
    /// store, so it is not repeated in the value.
    pub fn encode(&self) -> Vec<u8> {
        let out = Vec::with_capacity(96);
        let head = [self.body.tag(), FACT_VERSION];
        let at = self.at.millis();
        let (client, key) = (&self.client, &self.key);
        let written = match &self.body {
            FactBody::DepositRecorded {
                account,
                amount,
                currency,
                balance_after,
            }
            | FactBody::WithdrawalRecorded {
                account,
                amount,
                currency,
                balance_after,
            } => postcard::to_extend(
                &MovementRef {
                    at,
                    client,
                    key,
                    account,
                    amount: amount.units(),
                    currency: *currency,
                    balance_after: *balance_after,
                },
                extended(out, head),
            ),
            FactBody::RefundRecorded {
                withdrawal,
                account,
                amount,
                currency,
                balance_after,
                refunded_total,
            } => postcard::to_extend(
                &RefundRef {
                    at,
                    client,
                    key,
                    withdrawal,
                    account,
                    amount: amount.units(),
                    currency: *currency,
                    balance_after: *balance_after,
                    refunded_total: *refunded_total,
                },
                extended(out, head),
            ),
            FactBody::CommandRejected { command, rejection } => postcard::to_extend(
                &RejectedRef {
                    at,
                    client,
                    key,
                    command,
                    rejection: *rejection,
                },
                extended(out, head),
            ),
        };
        // Serialising plain data into a Vec cannot fail.
        written.unwrap_or_default()
    }

    pub fn decode(seq: u64, bytes: &[u8]) -> Result<Fact, DecodeError> {
        let (&tag, rest) = bytes
            .split_first()
            .ok_or_else(|| DecodeError::new("fact", "empty record"))?;
        let (&version, payload) = rest
            .split_first()
            .ok_or_else(|| DecodeError::new("fact", "no version byte"))?;
        if version != FACT_VERSION {
            return Err(DecodeError::new(
                "fact",
                format!("unknown version {version} of tag {tag} at seq {seq}"),
            ));
        }
        let err = |e: postcard::Error| DecodeError::new("fact", format!("seq {seq}: {e}"));
        let amount = |units: u64| {
            Amount::new(units).map_err(|_| DecodeError::new("fact", format!("seq {seq}: amount")))
        };
        let fact = match tag {
            TAG_DEPOSIT | TAG_WITHDRAWAL => {
                let m: MovementV1 = postcard::from_bytes(payload).map_err(err)?;
                let (account, amount, currency, balance_after) =
                    (m.account, amount(m.amount)?, m.currency, m.balance_after);
                let body = if tag == TAG_DEPOSIT {
                    FactBody::DepositRecorded {
                        account,
                        amount,
                        currency,
                        balance_after,
                    }
                } else {
                    FactBody::WithdrawalRecorded {
                        account,
                        amount,
                        currency,
                        balance_after,
                    }
                };
                Fact {
                    seq,
                    at: Timestamp(m.at),
                    client: m.client,
                    key: m.key,
                    body,
                }
            }
            TAG_REFUND => {
                let r: RefundV1 = postcard::from_bytes(payload).map_err(err)?;
                Fact {
                    seq,
                    at: Timestamp(r.at),
                    client: r.client,
                    key: r.key,
                    body: FactBody::RefundRecorded {
                        withdrawal: r.withdrawal,
                        account: r.account,
                        amount: amount(r.amount)?,
                        currency: r.currency,
                        balance_after: r.balance_after,
                        refunded_total: r.refunded_total,
                    },
                }
            }
            TAG_REJECTED => {
                let r: RejectedV1 = postcard::from_bytes(payload).map_err(err)?;
                Fact {
                    seq,
                    at: Timestamp(r.at),
                    client: r.client,
                    key: r.key,
                    body: FactBody::CommandRejected {
                        command: r.command,
                        rejection: r.rejection,
                    },
                }
            }
            other => {
                return Err(DecodeError::new(
                    "fact",
                    format!("unknown tag {other} at seq {seq}"),
                ));
            }
        };
        // postcard ignores bytes after the payload and accepts over-long varints, so a
        // record altered that way would read as a valid fact. Only the encoder's own bytes
        // are a fact; anything else is corruption to report, not to serve (found by
        // fuzzing `fact_decode`).
        if fact.encode() != bytes {
            return Err(DecodeError::new(
                "fact",
                format!(
                    "seq {seq}: not the encoding of the fact it decodes to (extra or over-long bytes)"
                ),
            ));
        }
        Ok(fact)
    }
}

/// What the ledger decided for a key, as told to the client: final, and the same on every
/// replay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Applied(Receipt),
    Rejected(RejectionReceipt),
}

/// The receipt of an applied command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    pub key: Key,
    pub command: Command,
    /// The account the money moved on; for a refund, the refunded account.
    pub account: Account,
    pub currency: Currency,
    pub seq: u64,
    /// The account's balance right after this command.
    pub balance: u128,
    pub refunded_total: Option<u64>,
    /// The time of the first execution.
    pub created_at: Timestamp,
}

/// The stored answer of a rejected command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RejectionReceipt {
    pub key: Key,
    pub command: Command,
    pub rejection: Rejection,
    pub seq: u64,
    pub created_at: Timestamp,
}

impl Outcome {
    /// Rebuilds the outcome from the key's fact: the answer to a retry after the stored
    /// response has expired, and the check that stored responses are true.
    pub fn from_fact(fact: &Fact) -> Outcome {
        let command = fact.body.command();
        match &fact.body {
            FactBody::DepositRecorded {
                account,
                currency,
                balance_after,
                ..
            }
            | FactBody::WithdrawalRecorded {
                account,
                currency,
                balance_after,
                ..
            } => Outcome::Applied(Receipt {
                key: fact.key.clone(),
                command,
                account: account.clone(),
                currency: *currency,
                seq: fact.seq,
                balance: *balance_after,
                refunded_total: None,
                created_at: fact.at,
            }),
            FactBody::RefundRecorded {
                account,
                currency,
                balance_after,
                refunded_total,
                ..
            } => Outcome::Applied(Receipt {
                key: fact.key.clone(),
                command,
                account: account.clone(),
                currency: *currency,
                seq: fact.seq,
                balance: *balance_after,
                refunded_total: Some(*refunded_total),
                created_at: fact.at,
            }),
            FactBody::CommandRejected { rejection, .. } => Outcome::Rejected(RejectionReceipt {
                key: fact.key.clone(),
                command,
                rejection: *rejection,
                seq: fact.seq,
                created_at: fact.at,
            }),
        }
    }

    pub fn seq(&self) -> u64 {
        match self {
            Outcome::Applied(r) => r.seq,
            Outcome::Rejected(r) => r.seq,
        }
    }

    pub fn rejection(&self) -> Option<Rejection> {
        match self {
            Outcome::Applied(_) => None,
            Outcome::Rejected(r) => Some(r.rejection),
        }
    }

    pub fn is_applied(&self) -> bool {
        matches!(self, Outcome::Applied(_))
    }
}

/// JSON shapes shared by the HTTP API, the CLI, the inbox and the dashboard. Field order
/// is fixed (serde_json's map is sorted), so a replay renders byte-identical bodies.
pub mod json {
    use serde_json::{Map, Value, json};

    use super::{Fact, FactBody, Outcome};
    use crate::domain::Command;

    /// Balances are `u128`/`i128` inside; JSON numbers carry them while they fit in 64 bits,
    /// which every real balance does, and a decimal string beyond.
    pub fn wide(v: i128) -> Value {
        if let Ok(x) = i64::try_from(v) {
            json!(x)
        } else if let Ok(x) = u64::try_from(v) {
            json!(x)
        } else {
            json!(v.to_string())
        }
    }

    pub fn wide_unsigned(v: u128) -> Value {
        match u64::try_from(v) {
            Ok(x) => json!(x),
            Err(_) => json!(v.to_string()),
        }
    }

    /// One value of a body's field, borrowed from what it describes where it can be: a
    /// body is listed as fields once, then rendered as a JSON document or digested as
    /// PostgreSQL prints it (see [`outcome_jsonb`]), without building the document.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Field<'a> {
        Str(&'a str),
        Text(String),
        Unsigned(u64),
        /// A balance: a JSON number while it fits in 64 bits, a decimal string beyond.
        Wide(u128),
    }

    impl Field<'_> {
        fn value(self) -> Value {
            match self {
                Field::Str(s) => json!(s),
                Field::Text(s) => Value::String(s),
                Field::Unsigned(n) => json!(n),
                Field::Wide(v) => wide_unsigned(v),
            }
        }
    }

    /// The command's own fields, as the client sent them.
    pub fn command_field_list<'a>(
        command: &'a Command,
        add: &mut impl FnMut(&'static str, Field<'a>),
    ) {
        add("command", Field::Str(command.name()));
        match command {
            Command::Deposit {
                account,
                amount,
                currency,
            }
            | Command::Withdraw {
                account,
                amount,
                currency,
            } => {
                add("account", Field::Str(account.as_str()));
                add("amount", Field::Unsigned(amount.units()));
                add("currency", Field::Str(currency.as_str()));
            }
            Command::Refund { withdrawal, amount } => {
                add("withdrawal", Field::Str(withdrawal.as_str()));
                add("amount", Field::Unsigned(amount.units()));
            }
        }
    }

    /// The command's own fields, as the client sent them.
    pub fn command_fields(command: &Command, map: &mut Map<String, Value>) {
        command_field_list(command, &mut |name, field| {
            map.insert(name.into(), field.value());
        });
    }

    /// The fields of the body a client gets for an outcome, in the order they are set: a
    /// field set twice keeps its last value, as in a JSON object.
    pub fn outcome_fields<'a>(outcome: &'a Outcome, add: &mut impl FnMut(&'static str, Field<'a>)) {
        match outcome {
            Outcome::Applied(r) => {
                command_field_list(&r.command, add);
                add("key", Field::Str(r.key.as_str()));
                add("account", Field::Str(r.account.as_str()));
                add("currency", Field::Str(r.currency.as_str()));
                add("seq", Field::Unsigned(r.seq));
                add("balance", Field::Wide(r.balance));
                if let Some(total) = r.refunded_total {
                    add("refunded_total", Field::Unsigned(total));
                }
                add("created_at", Field::Text(r.created_at.to_rfc3339()));
                add("outcome", Field::Str("applied"));
            }
            Outcome::Rejected(r) => {
                command_field_list(&r.command, add);
                add("key", Field::Str(r.key.as_str()));
                add("seq", Field::Unsigned(r.seq));
                add("created_at", Field::Text(r.created_at.to_rfc3339()));
                add("outcome", Field::Str("rejected"));
                add(
                    "type",
                    Field::Text(format!("urn:idem:problem:{}", r.rejection.code())),
                );
                add("title", Field::Str(r.rejection.title()));
                add("status", Field::Unsigned(422));
                add("code", Field::Str(r.rejection.code()));
            }
        }
    }

    /// The body a client gets for an outcome: a receipt for an applied command, RFC 9457
    /// problem details with a stable `code` for a rejection.
    pub fn outcome(outcome: &Outcome) -> Value {
        let mut map = Map::new();
        outcome_fields(outcome, &mut |name, field| {
            map.insert(name.into(), field.value());
        });
        Value::Object(map)
    }

    /// The outcome's body as PostgreSQL prints it once stored as jsonb, into `out`: keys
    /// shortest first and bytewise among equals (jsonb's own order), `", "` and `": "`
    /// between items, strings escaped as its `escape_json` does. A verify compares this
    /// text's digest with the one the server keeps of the stored copy.
    pub fn outcome_jsonb(outcome: &Outcome, out: &mut String) {
        let mut fields: Vec<(&'static str, Field<'_>)> = Vec::with_capacity(16);
        outcome_fields(
            outcome,
            &mut |name, field| match fields.iter_mut().find(|(n, _)| *n == name) {
                Some(slot) => slot.1 = field,
                None => fields.push((name, field)),
            },
        );
        fields.sort_unstable_by(|a, b| (a.0.len(), a.0).cmp(&(b.0.len(), b.0)));
        out.push('{');
        for (i, (name, field)) in fields.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            jsonb_string(name, out);
            out.push_str(": ");
            match field {
                Field::Str(s) => jsonb_string(s, out),
                Field::Text(s) => jsonb_string(s, out),
                Field::Unsigned(n) => out.push_str(itoa::Buffer::new().format(*n)),
                Field::Wide(v) => match u64::try_from(*v) {
                    Ok(n) => out.push_str(itoa::Buffer::new().format(n)),
                    Err(_) => jsonb_string(itoa::Buffer::new().format(*v), out),
                },
            }
        }
        out.push('}');
    }

    /// A string as jsonb prints it.
    fn jsonb_string(s: &str, out: &mut String) {
        use std::fmt::Write as _;
        out.push('"');
        // Runs of characters printed as they are go in one copy: escapes are rare.
        let mut plain = 0;
        for (i, b) in s.bytes().enumerate() {
            let escape = match b {
                b'"' => "\\\"",
                b'\\' => "\\\\",
                0x08 => "\\b",
                0x0c => "\\f",
                b'\n' => "\\n",
                b'\r' => "\\r",
                b'\t' => "\\t",
                0..0x20 => "",
                _ => continue,
            };
            // `b` is ASCII, so `i` is a character boundary.
            out.push_str(&s[plain..i]);
            plain = i + 1;
            if escape.is_empty() {
                let _ = write!(out, "\\u{b:04x}");
            } else {
                out.push_str(escape);
            }
        }
        out.push_str(&s[plain..]);
        out.push('"');
    }

    /// A fact as the log API and the dashboard show it.
    pub fn fact(fact: &Fact) -> Value {
        let mut map = Map::new();
        map.insert("seq".into(), json!(fact.seq));
        map.insert("at".into(), json!(fact.at.to_rfc3339()));
        map.insert("client".into(), json!(fact.client.as_str()));
        map.insert("key".into(), json!(fact.key.as_str()));
        map.insert("type".into(), json!(fact.body.persisted_name()));
        map.insert("version".into(), json!(super::FACT_VERSION));
        command_fields(&fact.body.command(), &mut map);
        match &fact.body {
            FactBody::DepositRecorded { balance_after, .. }
            | FactBody::WithdrawalRecorded { balance_after, .. } => {
                map.insert("balance_after".into(), wide_unsigned(*balance_after));
            }
            FactBody::RefundRecorded {
                account,
                currency,
                balance_after,
                refunded_total,
                ..
            } => {
                map.insert("account".into(), json!(account.as_str()));
                map.insert("currency".into(), json!(currency.as_str()));
                map.insert("balance_after".into(), wide_unsigned(*balance_after));
                map.insert("refunded_total".into(), json!(refunded_total));
            }
            FactBody::CommandRejected { rejection, .. } => {
                map.insert("rejection".into(), json!(rejection.code()));
            }
        }
        Value::Object(map)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::domain::{Account, Amount, ClientId, Currency, Key};

    fn deposit() -> Fact {
        Fact {
            seq: 7,
            at: Timestamp(1_800_000_000_000),
            client: ClientId::default_client(),
            key: Key::parse("d-1").unwrap(),
            body: FactBody::DepositRecorded {
                account: Account::parse("alice").unwrap(),
                amount: Amount::new(1).unwrap(),
                currency: Currency::parse("RUB").unwrap(),
                balance_after: 1,
            },
        }
    }

    /// A fact's fingerprint hashed from its fields is its command's, and both are the
    /// SHA-256 prefix of the canonical bytes: keys on disk hold these, so they must never
    /// change.
    #[test]
    fn fingerprints_agree_with_the_canonical_bytes() {
        use sha2::{Digest, Sha256};
        let rub = Currency::parse("RUB").unwrap();
        let amount = Amount::new(250).unwrap();
        let bodies = [
            deposit().body,
            FactBody::WithdrawalRecorded {
                account: Account::parse("bob").unwrap(),
                amount,
                currency: rub,
                balance_after: 0,
            },
            FactBody::RefundRecorded {
                withdrawal: Key::parse("w-1").unwrap(),
                account: Account::parse("bob").unwrap(),
                amount,
                currency: rub,
                balance_after: 250,
                refunded_total: 250,
            },
            FactBody::CommandRejected {
                command: Command::Refund {
                    withdrawal: Key::parse("w-2").unwrap(),
                    amount,
                },
                rejection: Rejection::WithdrawalNotFound,
            },
        ];
        for body in bodies {
            let command = body.command();
            let sha = Sha256::digest(command.canonical_bytes());
            assert_eq!(command.fingerprint().0, sha[..16]);
            assert_eq!(body.command_fingerprint(), command.fingerprint());
        }
        // The canonical form itself, byte for byte.
        let c = deposit().body.command();
        let mut expect = Vec::new();
        for field in [&b"deposit"[..], b"alice", &1u64.to_be_bytes(), b"RUB"] {
            expect.extend_from_slice(&(field.len() as u64).to_be_bytes());
            expect.extend_from_slice(field);
        }
        assert_eq!(c.canonical_bytes(), expect);
    }

    /// Found by fuzzing `fact_decode`: postcard accepted bytes after the payload and
    /// over-long varints, so an altered record read back as a valid fact.
    #[test]
    fn regression_decode_refuses_trailing_and_overlong_bytes() {
        let fact = deposit();
        let bytes = fact.encode();
        assert_eq!(Fact::decode(7, &bytes).unwrap(), fact);

        let mut trailing = bytes.clone();
        trailing.push(0);
        let err = Fact::decode(7, &trailing).unwrap_err().to_string();
        assert!(err.contains("not the encoding"), "{err}");

        // The amount 1 is the varint 0x01; 0x81 0x00 is the same number, over-long.
        let at = bytes.iter().rposition(|b| *b == 1).unwrap();
        let mut overlong = bytes[..at].to_vec();
        overlong.extend([0x81, 0x00]);
        overlong.extend(&bytes[at + 1..]);
        assert!(Fact::decode(7, &overlong).is_err());
    }

    /// The jsonb rendering of an outcome is the same document as its JSON body (every
    /// field, every escape), with its keys in jsonb's order: shortest first, bytewise
    /// among equals. PostgreSQL's own printing of it is pinned by the store's tests.
    #[test]
    fn the_jsonb_rendering_is_the_body_in_jsonb_order() {
        let rub = Currency::parse("RUB").unwrap();
        let odd = Key::parse(r#"w"1\x/\"#).unwrap();
        let mut facts = vec![deposit()];
        facts.push(Fact {
            key: odd.clone(),
            body: FactBody::WithdrawalRecorded {
                account: Account::parse("alice").unwrap(),
                amount: Amount::new(5).unwrap(),
                currency: rub,
                balance_after: u128::from(u64::MAX) + 7,
            },
            ..deposit()
        });
        facts.push(Fact {
            body: FactBody::RefundRecorded {
                withdrawal: odd.clone(),
                account: Account::parse("alice").unwrap(),
                amount: Amount::new(2).unwrap(),
                currency: rub,
                balance_after: 3,
                refunded_total: 2,
            },
            ..deposit()
        });
        for rejection in Rejection::ALL {
            facts.push(Fact {
                body: FactBody::CommandRejected {
                    command: Command::Refund {
                        withdrawal: odd.clone(),
                        amount: Amount::new(9).unwrap(),
                    },
                    rejection,
                },
                ..deposit()
            });
        }
        for fact in &facts {
            let outcome = Outcome::from_fact(fact);
            let mut text = String::new();
            json::outcome_jsonb(&outcome, &mut text);
            let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(parsed, json::outcome(&outcome), "{text}");
            // Keys in jsonb's order: read them back in the order printed.
            let mut parts: Vec<&str> = text.split("\": ").collect();
            parts.pop();
            let keys: Vec<&str> = parts
                .iter()
                .filter_map(|part| part.rsplit('"').next())
                .collect();
            let mut sorted = keys.clone();
            sorted.sort_by(|a, b| (a.len(), *a).cmp(&(b.len(), *b)));
            assert_eq!(keys, sorted, "{text}");
            assert!(text.contains(", \"") && !text.contains(",\""), "{text}");
        }
    }
}
