//! JSON shapes shared by the HTTP API, the CLI, the inbox and the dashboard. Field order
//! is fixed (serde_json's map is sorted), so a replay renders byte-identical bodies.
//!
//! The PostgreSQL store keeps each answer as this JSON ([`outcome_jsonb`] is its text as
//! the server prints it), so these shapes are part of what is stored, not only of what is
//! shown: a rejection's answer carries its problem type (`urn:idem:problem:CODE`), its
//! title and its status with it, and a replay reads them back byte for byte. That is why
//! they live in the core beside the facts they render, and why the HTTP-only parts of a
//! problem (the worker's own refusals) do not.

use serde_json::{Map, Value, json};

use crate::domain::{ClientId, Command, Key, MessageId, RejectionDetail, Timestamp};
use crate::fact::{Fact, FactBody, Outcome};

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
    /// A time, as RFC 3339 text.
    Time(Timestamp),
    /// A rejection's problem type: its code after `urn:idem:problem:`.
    Problem(&'static str),
}

impl Field<'_> {
    fn value(self) -> Value {
        match self {
            Field::Str(s) => json!(s),
            Field::Text(s) => Value::String(s),
            Field::Unsigned(n) => json!(n),
            Field::Wide(v) => wide_unsigned(v),
            Field::Time(t) => Value::String(t.to_rfc3339()),
            Field::Problem(code) => Value::String(format!("{PROBLEM}{code}")),
        }
    }
}

const PROBLEM: &str = "urn:idem:problem:";

/// The command's own fields, as the client sent them.
pub fn command_field_list<'a>(command: &'a Command, add: &mut impl FnMut(&'static str, Field<'a>)) {
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

/// A decoded inbox message in the inbox's JSON form (`message_id`, `key`, `client`,
/// `command` with its `type`), its accounts in its tenant's own names: what the
/// quarantine keeps of a message the store refuses for its id, which the store sees
/// only decoded.
pub fn inbox_message(
    message_id: &MessageId,
    client: &ClientId,
    key: &Key,
    command: &Command,
) -> String {
    let mut fields = Map::new();
    command_fields(&command.seen_by(client), &mut fields);
    // A message names its command by `type`, where a receipt says `command`.
    fields.remove("command");
    fields.insert("type".into(), json!(command.name()));
    json!({
        "message_id": message_id.as_str(),
        "key": key.as_str(),
        "client": client.as_str(),
        "command": fields,
    })
    .to_string()
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
            add("created_at", Field::Time(r.created_at));
            add("outcome", Field::Str("applied"));
        }
        Outcome::Rejected(r) => {
            command_field_list(&r.command, add);
            add("key", Field::Str(r.key.as_str()));
            add("seq", Field::Unsigned(r.seq));
            add("created_at", Field::Time(r.created_at));
            add("outcome", Field::Str("rejected"));
            add("type", Field::Problem(r.rejection.code()));
            add("title", Field::Str(r.rejection.title()));
            add("status", Field::Unsigned(422));
            add("code", Field::Str(r.rejection.code()));
            if let Some(detail) = r.detail {
                rejection_detail(&r.command, detail, add);
            }
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
    // Each field with its place in jsonb's order, so that sorting and finding a field
    // set twice compare integers: the length, then the first seven bytes, then (for
    // names that share them) the whole name.
    let mut fields: Vec<(u64, &'static str, Field<'_>)> = Vec::with_capacity(16);
    outcome_fields(outcome, &mut |name, field| {
        let order = jsonb_order(name);
        match fields
            .iter_mut()
            .find(|(o, n, _)| *o == order && *n == name)
        {
            Some(slot) => slot.2 = field,
            None => fields.push((order, name, field)),
        }
    });
    fields.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
    out.push('{');
    for (i, (_, name, field)) in fields.iter().enumerate() {
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
            Field::Time(t) => {
                // RFC 3339 text needs no escape; the fallback for a time beyond it
                // (`@…ms`) neither.
                out.push('"');
                t.write_rfc3339(out);
                out.push('"');
            }
            Field::Problem(code) => {
                out.push('"');
                out.push_str(PROBLEM);
                jsonb_unquoted(code, out);
                out.push('"');
            }
        }
    }
    out.push('}');
}

/// [`outcome_jsonb`] of the answer `fact` gives (`Outcome::from_fact`), written
/// straight from the fact for an applied command, whose receipt has one shape per
/// kind of fact: a verify renders one answer per key. A rejection's answer, whose
/// members depend on its detail, goes through the outcome.
pub fn answer_jsonb(fact: &Fact, out: &mut String) {
    let (name, account, amount, currency, balance, refund) = match &fact.body {
        FactBody::DepositRecorded {
            account,
            amount,
            currency,
            balance_after,
        } => ("deposit", account, amount, currency, balance_after, None),
        FactBody::WithdrawalRecorded {
            account,
            amount,
            currency,
            balance_after,
        } => ("withdraw", account, amount, currency, balance_after, None),
        FactBody::RefundRecorded {
            withdrawal,
            account,
            amount,
            currency,
            balance_after,
            refunded_total,
        } => (
            "refund",
            account,
            amount,
            currency,
            balance_after,
            Some((withdrawal, *refunded_total)),
        ),
        FactBody::CommandRejected { .. } => {
            return outcome_jsonb(&Outcome::from_fact(fact), out);
        }
    };
    // The receipt's members in jsonb's order: key, seq, amount, account, balance,
    // command, outcome, currency, created_at, then a refund's withdrawal and
    // refunded_total. A movement's command names the receipt's own account and
    // currency, so they appear once.
    let mut num = itoa::Buffer::new();
    out.push_str("{\"key\": ");
    jsonb_string(fact.key.as_str(), out);
    out.push_str(", \"seq\": ");
    out.push_str(num.format(fact.seq));
    out.push_str(", \"amount\": ");
    out.push_str(num.format(amount.units()));
    out.push_str(", \"account\": ");
    jsonb_string(account.as_str(), out);
    out.push_str(", \"balance\": ");
    match u64::try_from(*balance) {
        Ok(n) => out.push_str(num.format(n)),
        Err(_) => jsonb_string(num.format(*balance), out),
    }
    out.push_str(", \"command\": \"");
    out.push_str(name);
    out.push_str("\", \"outcome\": \"applied\", \"currency\": ");
    jsonb_string(currency.as_str(), out);
    out.push_str(", \"created_at\": \"");
    fact.at.write_rfc3339(out);
    out.push('"');
    if let Some((withdrawal, total)) = refund {
        out.push_str(", \"withdrawal\": ");
        jsonb_string(withdrawal.as_str(), out);
        out.push_str(", \"refunded_total\": ");
        out.push_str(num.format(total));
    }
    out.push('}');
}

/// A name's place in jsonb's order of keys (shortest first, then bytewise), up to
/// names of the same length sharing their first seven bytes.
fn jsonb_order(name: &str) -> u64 {
    let mut prefix = [0u8; 8];
    let take = name.len().min(7);
    prefix[1..=take].copy_from_slice(&name.as_bytes()[..take]);
    let len = u8::try_from(name.len()).unwrap_or(u8::MAX);
    prefix[0] = len;
    u64::from_be_bytes(prefix)
}

/// A string as jsonb prints it.
fn jsonb_string(s: &str, out: &mut String) {
    out.push('"');
    jsonb_unquoted(s, out);
    out.push('"');
}

/// A string's characters as jsonb prints them between its quotes.
fn jsonb_unquoted(s: &str, out: &mut String) {
    use std::fmt::Write as _;
    let needs_escape = |b: u8| b < 0x20 || b == b'"' || b == b'\\';
    // Escapes are rare: most strings go in one copy.
    if !s.bytes().any(needs_escape) {
        out.push_str(s);
        return;
    }
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
}

/// A rejection's detail as a member a program reads and an RFC 9457 `detail` a person
/// reads. Amounts stay in minor units, as everywhere in the API; the text is built
/// from the fact alone, so it is the same on every replay.
pub fn rejection_detail<'a>(
    command: &'a Command,
    detail: RejectionDetail,
    add: &mut impl FnMut(&'static str, Field<'a>),
) {
    let asked = command.amount().units();
    let text = match (detail, command) {
        (
            RejectionDetail::Balance(balance),
            Command::Withdraw {
                account, currency, ..
            },
        ) => {
            add("balance", Field::Wide(balance));
            format!(
                "{account}'s balance is {balance}, lower than the {asked} asked \
                 (minor units of {currency}); nothing changed"
            )
        }
        (
            RejectionDetail::AccountCurrency(held),
            Command::Deposit {
                account, currency, ..
            },
        )
        | (
            RejectionDetail::AccountCurrency(held),
            Command::Withdraw {
                account, currency, ..
            },
        ) => {
            add("account_currency", Field::Text(held.as_str().to_owned()));
            format!("{account} holds {held}, not {currency}; nothing changed")
        }
        (RejectionDetail::Refundable(room), Command::Refund { withdrawal, .. }) => {
            add("refundable", Field::Unsigned(room));
            format!(
                "{room} of withdrawal {withdrawal} is left to refund and {asked} was asked \
                 (minor units); nothing changed"
            )
        }
        // Decoding refuses a detail paired with another rejection, and each rejection
        // with a detail has one kind of command; anything else would be a fact the core
        // never decided, and gets no sentence rather than a wrong one.
        _ => return,
    };
    add("detail", Field::Text(text));
}

/// A fact as the log API and the dashboard show it.
pub fn fact(fact: &Fact) -> Value {
    let mut map = Map::new();
    map.insert("seq".into(), json!(fact.seq));
    map.insert("at".into(), json!(fact.at.to_rfc3339()));
    map.insert("client".into(), json!(fact.client.as_str()));
    map.insert("key".into(), json!(fact.key.as_str()));
    map.insert("type".into(), json!(fact.body.persisted_name()));
    map.insert("version".into(), json!(fact.body.version()));
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
        FactBody::CommandRejected {
            rejection, detail, ..
        } => {
            map.insert("rejection".into(), json!(rejection.code()));
            if let Some(detail) = detail {
                let command = fact.body.command();
                rejection_detail(&command, *detail, &mut |name, field| {
                    // The log shows the figure; the sentence is the answer's.
                    if name != "detail" {
                        map.insert(name.into(), field.value());
                    }
                });
            }
        }
    }
    Value::Object(map)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::domain::{Account, Amount, Currency, Rejection};
    use crate::fact::tests::deposit;
    use crate::json;

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
                    detail: None,
                },
                ..deposit()
            });
        }
        // Rejections that tell their figure: its member and the `detail` sentence.
        let withdraw = Command::Withdraw {
            account: Account::parse("a.b:c").unwrap(),
            amount: Amount::new(9).unwrap(),
            currency: rub,
        };
        for (command, detail) in [
            (
                withdraw.clone(),
                RejectionDetail::Balance(u128::from(u64::MAX) + 1),
            ),
            (
                withdraw,
                RejectionDetail::AccountCurrency(Currency::parse("USD").unwrap()),
            ),
            (
                Command::Refund {
                    withdrawal: odd.clone(),
                    amount: Amount::new(9).unwrap(),
                },
                RejectionDetail::Refundable(4),
            ),
        ] {
            facts.push(Fact {
                body: FactBody::CommandRejected {
                    command,
                    rejection: detail.rejection(),
                    detail: Some(detail),
                },
                ..deposit()
            });
        }
        for fact in &facts {
            let outcome = Outcome::from_fact(fact);
            let mut text = String::new();
            json::outcome_jsonb(&outcome, &mut text);
            let mut straight = String::new();
            json::answer_jsonb(fact, &mut straight);
            assert_eq!(straight, text, "the answer written straight from {fact:?}");
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
