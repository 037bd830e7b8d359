//! The wire forms of commands: parses JSON from HTTP bodies and inbox lines into the
//! ledger's validated [`Command`]. Parse, then validate: only a `Command` travels inward.
//! No error message here quotes the client's values, because they end up in HTTP answers,
//! logs and the quarantine; the one thing named is an unknown field, by its name, when the
//! name is short and printable (see [`unknown_field`]).

use ledger::{Account, Amount, Command, Currency, Key};
use serde::Deserialize;
use serde_json::Number;

/// Which command an HTTP endpoint takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandKind {
    Deposit,
    Withdraw,
    Refund,
}

impl CommandKind {
    pub fn path(self) -> &'static str {
        match self {
            CommandKind::Deposit => "/v1/deposits",
            CommandKind::Withdraw => "/v1/withdrawals",
            CommandKind::Refund => "/v1/refunds",
        }
    }

    /// The command as the refusal of its body names it: deposits and withdrawals have one
    /// shape, and one body is refused alike by both.
    fn noun(self) -> &'static str {
        match self {
            CommandKind::Deposit | CommandKind::Withdraw => "a deposit or a withdrawal",
            CommandKind::Refund => "a refund",
        }
    }

    /// The members its body has, exactly.
    fn members(self) -> &'static [&'static str] {
        match self {
            CommandKind::Deposit | CommandKind::Withdraw => &["account", "amount", "currency"],
            CommandKind::Refund => &["withdrawal", "amount"],
        }
    }

    fn fields(self) -> &'static str {
        match self {
            CommandKind::Deposit | CommandKind::Withdraw => {
                "account (string), amount (integer), currency (string)"
            }
            CommandKind::Refund => "withdrawal (string, the withdrawal's key), amount (integer)",
        }
    }
}

/// Why a request or message was refused before reaching the ledger. `detail` is written
/// here, never copied from the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub detail: String,
}

impl Invalid {
    fn new(detail: impl Into<String>) -> Self {
        Self {
            detail: detail.into(),
        }
    }
}

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.detail)
    }
}

/// Describes a serde_json error by its category and position only: its message may
/// quote the input (an unknown field's name, a string value).
fn describe(e: &serde_json::Error, shape: &str) -> Invalid {
    use serde_json::error::Category;
    let what = match e.classify() {
        Category::Syntax | Category::Eof => "the body is not well-formed JSON",
        Category::Data => "the JSON does not have the expected shape",
        Category::Io => "the body could not be read",
    };
    Invalid::new(format!(
        "{what} (line {}, column {}); expected an object with exactly: {shape}",
        e.line(),
        e.column()
    ))
}

/// The longest unknown field name a refusal repeats: a name is the client's own text, and
/// an answer, a log line or a quarantine record must stay small whatever was sent.
const NAMED_FIELD_MAX: usize = 64;

/// The first member of `object` that `allowed` does not list, as a refusal names it:
/// `` `acount` `` when the name is at most [`NAMED_FIELD_MAX`] bytes of visible ASCII
/// (spaces allowed, backticks not), else a phrase that says why it is not repeated.
/// serde's own message for an unknown field quotes the name whatever its length, so the
/// name is found here instead.
fn unknown_field(
    object: &serde_json::Map<String, serde_json::Value>,
    allowed: &[&str],
) -> Option<String> {
    let name = object.keys().find(|k| !allowed.contains(&k.as_str()))?;
    Some(
        // Visible ASCII only: no control or formatting characters (a bidi override could
        // make a log line lie), and no backtick, which would end the quote early.
        if name.len() <= NAMED_FIELD_MAX
            && name
                .bytes()
                .all(|b| b == b' ' || (b.is_ascii_graphic() && b != b'`'))
        {
            format!("unknown field `{name}`")
        } else {
            format!(
                "an unknown field (its name is not repeated: over {NAMED_FIELD_MAX} bytes, \
                 or not visible ASCII)"
            )
        },
    )
}

/// A hint for the member a client most likely meant as the idempotency key, which is a
/// header and never a member of the body.
fn key_hint(object: &serde_json::Map<String, serde_json::Value>) -> &'static str {
    let keyish = object.keys().any(|k| {
        let k: String = k
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .collect::<String>()
            .to_ascii_lowercase();
        k == "key" || k == "idempotencykey"
    });
    if keyish {
        " (the idempotency key goes in the Idempotency-Key header)"
    } else {
        ""
    }
}

/// The refusal of a body that serde could not decode into `kind`'s fields: the unknown
/// field by name when there is one (the likeliest mistake, a typo), else [`describe`].
fn refuse_body(kind: CommandKind, body: &[u8], e: &serde_json::Error) -> Invalid {
    if e.classify() == serde_json::error::Category::Data
        && let Ok(object) = serde_json::from_slice::<serde_json::Map<_, _>>(body)
        && let Some(unknown) = unknown_field(&object, kind.members())
    {
        return Invalid::new(format!(
            "{unknown}: {} takes exactly {}{}",
            kind.noun(),
            kind.members().join(", "),
            key_hint(&object)
        ));
    }
    describe(e, kind.fields())
}

/// serde's derived structs also accept a JSON array of the fields in order
/// (`["alice",1,"RUB"]`); a command must be an object with named fields, so anything that
/// does not start as one is refused before it is decoded.
fn require_object(json: &[u8], shape: &str) -> Result<(), Invalid> {
    match json.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => Ok(()),
        _ => Err(Invalid::new(format!(
            "the body must be a JSON object with exactly: {shape}"
        ))),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MovementBody {
    account: String,
    amount: Number,
    currency: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RefundBody {
    withdrawal: String,
    amount: Number,
}

/// The amount, from the JSON the client sent. JSON has one kind of number, and `1050`,
/// `1050.0` and `1.05e3` are one whole number (JSON Schema's `integer`, which the API's
/// document uses, admits all three), so each is taken. A spelling with a fraction or an
/// exponent is read from its text, exactly: as a float, a fraction too small for a float
/// to keep (`1050.00000000000000001`) would pass for a whole number. `json` is the whole
/// document; the amount is the only number a well-formed command has in it.
fn amount(n: &Number, json: &[u8]) -> Result<Amount, Invalid> {
    let invalid = || Invalid::new(ledger::InvalidInput::Amount.to_string());
    let units = match n.as_u64() {
        Some(units) => units,
        None if n.is_f64() => {
            let mut numbers = number_tokens(json);
            match (numbers.next(), numbers.next()) {
                (Some(text), None) => exact_whole(text).ok_or_else(invalid)?,
                _ => return Err(invalid()),
            }
        }
        // Negative, or beyond u64.
        None => return Err(invalid()),
    };
    Amount::new(units).map_err(|_| invalid())
}

/// The number tokens of a JSON document, in order (those inside strings are not numbers).
fn number_tokens(json: &[u8]) -> impl Iterator<Item = &str> {
    let mut i = 0;
    let mut in_string = false;
    std::iter::from_fn(move || {
        while i < json.len() {
            let b = json[i];
            if in_string {
                match b {
                    b'\\' => i += 1,
                    b'"' => in_string = false,
                    _ => {}
                }
                i += 1;
            } else if b == b'"' {
                in_string = true;
                i += 1;
            } else if b == b'-' || b.is_ascii_digit() {
                let start = i;
                while i < json.len()
                    && matches!(json[i], b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
                {
                    i += 1;
                }
                return std::str::from_utf8(&json[start..i]).ok();
            } else {
                i += 1;
            }
        }
        None
    })
}

/// The whole number a JSON number's text denotes, exactly, if it is one that fits in a
/// u64: `2089.0` and `2.089e3` are 2089; `2089.5`, `-1` and `1e-3` are none.
fn exact_whole(text: &str) -> Option<u64> {
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(at) => (&text[..at], text[at + 1..].parse::<i64>().ok()?),
        None => (text, 0),
    };
    if mantissa.starts_with('-') {
        return None;
    }
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if int.is_empty() || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    // The value is `digits` × 10^scale.
    let digits = format!("{int}{frac}");
    let digits = digits.trim_start_matches('0');
    let scale = exponent.checked_sub(i64::try_from(frac.len()).ok()?)?;
    if digits.is_empty() {
        return Some(0);
    }
    let whole = if scale < 0 {
        let cut = usize::try_from(scale.unsigned_abs()).ok()?;
        let keep = digits.len().checked_sub(cut)?;
        if !digits[keep..].bytes().all(|b| b == b'0') {
            return None;
        }
        digits[..keep].to_owned()
    } else {
        // More than 20 digits is beyond any u64.
        let zeros = usize::try_from(scale)
            .ok()
            .filter(|z| digits.len() + z <= 20)?;
        format!("{digits}{}", "0".repeat(zeros))
    };
    if whole.is_empty() {
        return None;
    }
    whole.parse().ok()
}

fn movement(kind: CommandKind, body: MovementBody, json: &[u8]) -> Result<Command, Invalid> {
    let account = Account::parse(&body.account).map_err(|e| Invalid::new(e.to_string()))?;
    let amount = amount(&body.amount, json)?;
    let currency = Currency::parse(&body.currency).map_err(|e| Invalid::new(e.to_string()))?;
    Ok(match kind {
        CommandKind::Deposit => Command::Deposit {
            account,
            amount,
            currency,
        },
        _ => Command::Withdraw {
            account,
            amount,
            currency,
        },
    })
}

fn refund(body: RefundBody, json: &[u8]) -> Result<Command, Invalid> {
    let withdrawal = Key::parse(&body.withdrawal).map_err(|_| {
        Invalid::new(
            "withdrawal must be the withdrawal's idempotency key (1 to 255 bytes of visible ASCII)",
        )
    })?;
    Ok(Command::Refund {
        withdrawal,
        amount: amount(&body.amount, json)?,
    })
}

/// Parses an HTTP body for the given endpoint.
pub fn parse_body(kind: CommandKind, body: &[u8]) -> Result<Command, Invalid> {
    require_object(body, kind.fields())?;
    match kind {
        CommandKind::Deposit | CommandKind::Withdraw => {
            let b: MovementBody =
                serde_json::from_slice(body).map_err(|e| refuse_body(kind, body, &e))?;
            movement(kind, b, body)
        }
        CommandKind::Refund => {
            let b: RefundBody =
                serde_json::from_slice(body).map_err(|e| refuse_body(kind, body, &e))?;
            refund(b, body)
        }
    }
}

/// The HTTP body of a command, as the CLI client sends it.
pub fn body_of(command: &Command) -> serde_json::Value {
    let mut map = serde_json::Map::new();
    ledger::json::command_fields(command, &mut map);
    // The endpoint names the command; the body carries only its fields.
    map.remove("command");
    serde_json::Value::Object(map)
}

pub fn kind_of(command: &Command) -> CommandKind {
    match command {
        Command::Deposit { .. } => CommandKind::Deposit,
        Command::Withdraw { .. } => CommandKind::Withdraw,
        Command::Refund { .. } => CommandKind::Refund,
    }
}

// ---- inbox messages -------------------------------------------------------------------

/// One inbox line:
/// `{"message_id": "m-1", "key": "ord-1", "client": "shop", "command": {"type": "withdraw",
/// "account": "alice", "amount": 300, "currency": "RUB"}}`; `client` is optional.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MessageLine {
    message_id: String,
    key: String,
    #[serde(default)]
    client: Option<String>,
    command: WireCommand,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum WireCommand {
    Deposit {
        account: String,
        amount: Number,
        currency: String,
    },
    Withdraw {
        account: String,
        amount: Number,
        currency: String,
    },
    Refund {
        withdrawal: String,
        amount: Number,
    },
}

/// A decoded inbox message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub message_id: ledger::MessageId,
    pub key: Key,
    pub client: Option<ledger::ClientId>,
    pub command: Command,
}

const MESSAGE_SHAPE: &str = "message_id, key, optional client, and command \
    {type: deposit|withdraw|refund, ...}";

/// The unknown field of an inbox line, at its top or in its command, as the refusal
/// names it; none when its command's type is not one of the three (serde says that).
fn message_unknown_field(line: &serde_json::Value) -> Option<String> {
    let object = line.as_object()?;
    if let Some(unknown) = unknown_field(object, &["message_id", "key", "client", "command"]) {
        return Some(format!(
            "{unknown}: a message takes exactly {MESSAGE_SHAPE}"
        ));
    }
    let command = object.get("command")?.as_object()?;
    let kind = match command.get("type")?.as_str()? {
        "deposit" => CommandKind::Deposit,
        "withdraw" => CommandKind::Withdraw,
        "refund" => CommandKind::Refund,
        _ => return None,
    };
    let mut allowed = vec!["type"];
    allowed.extend_from_slice(kind.members());
    let unknown = unknown_field(command, &allowed)?;
    Some(format!(
        "{unknown} in command: {} takes exactly type, {}",
        kind.noun(),
        kind.members().join(", ")
    ))
}

/// Decodes one inbox line. The message id, when it can be read at all, is returned with
/// the error so the quarantine can name it.
pub fn parse_message(line: &[u8]) -> Result<Message, (Option<String>, Invalid)> {
    // The line and its command must both be objects (see `require_object`); the nested
    // command is checked on a generic parse, which also finds the id for the quarantine.
    let generic = serde_json::from_slice::<serde_json::Value>(line).ok();
    let id_of = |v: &serde_json::Value| v.get("message_id")?.as_str().map(str::to_owned);
    require_object(line, MESSAGE_SHAPE).map_err(|e| (None, e))?;
    if let Some(v) = &generic
        && v.get("command").is_some_and(|c| !c.is_object())
    {
        return Err((
            id_of(v),
            Invalid::new(format!("command must be a JSON object: {MESSAGE_SHAPE}")),
        ));
    }
    let m: MessageLine = serde_json::from_slice(line).map_err(|e| {
        // A best-effort look at the id, for the quarantine record: it is the operator's
        // own data, kept beside the payload, never sent to a client.
        let unknown = generic.as_ref().and_then(message_unknown_field);
        let invalid = match unknown {
            Some(why) if e.classify() == serde_json::error::Category::Data => Invalid::new(why),
            _ => describe(&e, MESSAGE_SHAPE),
        };
        (generic.as_ref().and_then(id_of), invalid)
    })?;
    let id = Some(m.message_id.clone());
    let fail = |i: Invalid| (id.clone(), i);
    let message_id = ledger::MessageId::parse(&m.message_id).map_err(|_| {
        fail(Invalid::new(
            "message_id must be 1 to 255 bytes of visible ASCII",
        ))
    })?;
    let key = Key::parse(&m.key).map_err(|e| fail(Invalid::new(e.to_string())))?;
    let client = match &m.client {
        None => None,
        Some(c) => Some(ledger::ClientId::parse(c).map_err(|e| fail(Invalid::new(e.to_string())))?),
    };
    let command = match m.command {
        WireCommand::Deposit {
            account,
            amount,
            currency,
        } => movement(
            CommandKind::Deposit,
            MovementBody {
                account,
                amount,
                currency,
            },
            line,
        ),
        WireCommand::Withdraw {
            account,
            amount,
            currency,
        } => movement(
            CommandKind::Withdraw,
            MovementBody {
                account,
                amount,
                currency,
            },
            line,
        ),
        WireCommand::Refund { withdrawal, amount } => {
            refund(RefundBody { withdrawal, amount }, line)
        }
    }
    .map_err(fail)?;
    Ok(Message {
        message_id,
        key,
        client,
        command,
    })
}

/// Which fields of two commands differ, by name: for conflict reports, never the values.
pub fn differs(stored: &Command, arriving: &Command) -> Vec<&'static str> {
    use Command::*;
    match (stored, arriving) {
        (
            Deposit {
                account: a1,
                amount: m1,
                currency: c1,
            },
            Deposit {
                account: a2,
                amount: m2,
                currency: c2,
            },
        )
        | (
            Withdraw {
                account: a1,
                amount: m1,
                currency: c1,
            },
            Withdraw {
                account: a2,
                amount: m2,
                currency: c2,
            },
        ) => [
            (a1 != a2, "account"),
            (m1 != m2, "amount"),
            (c1 != c2, "currency"),
        ]
        .into_iter()
        .filter_map(|(d, name)| d.then_some(name))
        .collect(),
        (
            Refund {
                withdrawal: w1,
                amount: m1,
            },
            Refund {
                withdrawal: w2,
                amount: m2,
            },
        ) => [(w1 != w2, "withdrawal"), (m1 != m2, "amount")]
            .into_iter()
            .filter_map(|(d, name)| d.then_some(name))
            .collect(),
        _ => vec!["command"],
    }
}

/// Parses durations such as `500ms`, `10s`, `15m`, `24h`, `7d`.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| "a duration needs a unit: ms, s, m, h or d (e.g. 24h)".to_owned())?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| "a duration starts with a whole number (e.g. 10s)".to_owned())?;
    let ms = match unit {
        "ms" => Some(n),
        "s" => n.checked_mul(1000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        "d" => n.checked_mul(86_400_000),
        _ => return Err("the unit must be one of ms, s, m, h, d".to_owned()),
    };
    ms.map(std::time::Duration::from_millis)
        .ok_or_else(|| "the duration is too long".to_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn check(kind: CommandKind, body: &str, ok: bool) {
        let r = parse_body(kind, body.as_bytes());
        assert_eq!(r.is_ok(), ok, "{body}: {r:?}");
        if let Err(e) = r {
            // No refusal may quote the input back.
            assert!(!e.detail.contains("zzz"), "{body}: {e}");
        }
    }

    /// Any JSON spelling of a whole number is that number, read exactly from its text;
    /// anything else is refused, a fraction too small for a float included.
    #[test]
    fn amounts_are_whole_numbers_in_any_spelling() {
        let parse = |n: &str| {
            let body = format!(r#"{{"account":"alice","amount":{n},"currency":"RUB"}}"#);
            let line = format!(
                r#"{{"message_id":"m","key":"k","command":{{"type":"deposit","account":"alice","amount":{n},"currency":"RUB"}}}}"#
            );
            let http =
                parse_body(CommandKind::Deposit, body.as_bytes()).map(|c| c.amount().units());
            let inbox = parse_message(line.as_bytes()).map(|m| m.command.amount().units());
            assert_eq!(
                http.clone().ok(),
                inbox.ok(),
                "{n}: HTTP and the inbox disagree"
            );
            http.ok()
        };
        for (n, units) in [
            ("2089", 2089),
            ("2089.0", 2089),
            ("2089.000", 2089),
            ("2.089e3", 2089),
            ("2.089E+3", 2089),
            ("208900e-2", 2089),
            ("1e15", 1_000_000_000_000_000),
            ("1000000000000000.0", 1_000_000_000_000_000),
            ("0.5e1", 5),
        ] {
            assert_eq!(parse(n), Some(units), "{n}");
        }
        for n in [
            "2089.5",
            "2089.00000000000000001",
            "1000000000000000.01",
            "1e-3",
            "0.0",
            "0e5",
            "-1.0",
            "-0",
            "1e16",
            "1.5e0",
            "18446744073709551616",
            "1e400",
        ] {
            assert_eq!(parse(n), None, "{n}");
        }
        assert_eq!(exact_whole("18446744073709551615"), Some(u64::MAX));
        assert_eq!(exact_whole("1e9223372036854775807"), None);
        assert_eq!(exact_whole("1e-9223372036854775808"), None);
        // Digits inside strings are not numbers.
        let tokens: Vec<_> = number_tokens(br#"{"a":"1.5\"2","b":-2.5e3}"#).collect();
        assert_eq!(tokens, ["-2.5e3"]);
    }

    #[test]
    fn bodies() {
        use CommandKind::*;
        check(
            Withdraw,
            r#"{"account":"alice","amount":300,"currency":"RUB"}"#,
            true,
        );
        check(
            Withdraw,
            r#" { "currency" : "RUB", "amount":300 ,"account":"alice"} "#,
            true,
        );
        check(Withdraw, r#"{"account":"alice","amount":300}"#, false);
        check(
            Withdraw,
            r#"{"account":"alice","amount":300,"currency":"RUB","note":"zzz"}"#,
            false,
        );
        check(
            Withdraw,
            r#"{"account":"alice","amount":300,"currency":"RUB","account":"b"}"#,
            false,
        );
        check(
            Withdraw,
            r#"{"account":"alice","amount":0,"currency":"RUB"}"#,
            false,
        );
        check(
            Withdraw,
            r#"{"account":"alice","amount":-1,"currency":"RUB"}"#,
            false,
        );
        check(
            Withdraw,
            r#"{"account":"alice","amount":1.5,"currency":"RUB"}"#,
            false,
        );
        check(
            Withdraw,
            r#"{"account":"alice","amount":"300","currency":"RUB"}"#,
            false,
        );
        check(
            Withdraw,
            r#"{"account":"alice","amount":1000000000000001,"currency":"RUB"}"#,
            false,
        );
        check(
            Deposit,
            r#"{"account":"alice","amount":1000000000000000,"currency":"RUB"}"#,
            true,
        );
        check(
            Deposit,
            r#"{"account":"@world","amount":1,"currency":"RUB"}"#,
            false,
        );
        check(
            Deposit,
            r#"{"account":"alice","amount":1,"currency":"rub"}"#,
            false,
        );
        check(
            Deposit,
            r#"{"account":"zzz","amount":1,"currency":"zzz"}"#,
            false,
        );
        check(Deposit, r#"{"account":"zzz""#, false);
        check(Refund, r#"{"withdrawal":"req-7f3a","amount":300}"#, true);
        check(Refund, r#"{"withdrawal":"","amount":300}"#, false);
        check(Refund, r#"[]"#, false);
    }

    /// An unknown field is named, with the fields the command takes, so that a typo can be
    /// fixed from the answer; a long name, or one with control or formatting characters,
    /// is not repeated. The value is never quoted.
    #[test]
    fn an_unknown_field_is_named_when_it_can_be() {
        let detail = |kind, body: &str| parse_body(kind, body.as_bytes()).unwrap_err().detail;
        assert_eq!(
            detail(
                CommandKind::Deposit,
                r#"{"acount":"zzz","amount":1,"currency":"RUB"}"#
            ),
            "unknown field `acount`: a deposit or a withdrawal takes exactly account, amount, currency"
        );
        assert_eq!(
            detail(
                CommandKind::Refund,
                r#"{"withdrawal":"w","amount":1,"currency":"RUB"}"#
            ),
            "unknown field `currency`: a refund takes exactly withdrawal, amount"
        );
        let key = detail(
            CommandKind::Withdraw,
            r#"{"key":"zzz","account":"a","amount":1,"currency":"RUB"}"#,
        );
        assert!(
            key.starts_with("unknown field `key`: a deposit or a withdrawal takes exactly account")
                && key.ends_with("(the idempotency key goes in the Idempotency-Key header)"),
            "{key}"
        );
        let at_most = "n".repeat(NAMED_FIELD_MAX);
        let named = detail(
            CommandKind::Deposit,
            &format!(r#"{{"account":"a","amount":1,"currency":"RUB","{at_most}":1}}"#),
        );
        assert!(named.contains(&at_most), "{named}");
        for name in [
            "n".repeat(NAMED_FIELD_MAX + 1),
            r"tab\there".to_owned(),
            r"nul\u0000".to_owned(),
            r"rtl\u202eoverride".to_owned(),
        ] {
            let body = format!(r#"{{"account":"a","amount":1,"currency":"RUB","{name}":1}}"#);
            let d = detail(CommandKind::Deposit, &body);
            assert!(
                d.starts_with("an unknown field (its name is not repeated")
                    && !d.contains("nnnnn")
                    && !d.contains("here")
                    && !d.contains("override"),
                "{name}: {d}"
            );
        }
        // Other shape errors keep their position and the expected shape.
        assert!(
            detail(CommandKind::Deposit, r#"{"account":"a","amount":1}"#)
                .starts_with("the JSON does not have the expected shape (line 1, column "),
        );
        // Inbox lines name it too, at the top and in the command.
        let reason = |line: &str| parse_message(line.as_bytes()).unwrap_err().1.detail;
        assert!(
            reason(r#"{"message_id":"m","key":"k","clinet":"c","command":{"type":"refund","withdrawal":"w","amount":1}}"#)
                .starts_with("unknown field `clinet`: a message takes exactly message_id, key"),
        );
        assert_eq!(
            reason(
                r#"{"message_id":"m","key":"k","command":{"type":"refund","withdrawal":"w","amount":1,"acount":"zzz"}}"#
            ),
            "unknown field `acount` in command: a refund takes exactly type, withdrawal, amount"
        );
    }

    #[test]
    fn messages() {
        let m = parse_message(
            br#"{"message_id":"m1","key":"k1","command":{"type":"refund","withdrawal":"w","amount":5}}"#,
        )
        .unwrap();
        assert_eq!(m.command.name(), "refund");
        let (id, _) =
            parse_message(br#"{"message_id":"m2","key":"k1","command":{"type":"steal"}}"#)
                .unwrap_err();
        assert_eq!(id.as_deref(), Some("m2"));
        assert!(parse_message(b"not json").is_err());
        // Arrays of the fields in order are not commands, at either level.
        assert!(
            parse_message(
                br#"["m3","k1",{"type":"deposit","account":"a","amount":1,"currency":"RUB"}]"#
            )
            .is_err()
        );
        let (id, _) =
            parse_message(br#"{"message_id":"m4","key":"k1","command":["deposit","a",1,"RUB"]}"#)
                .unwrap_err();
        assert_eq!(id.as_deref(), Some("m4"));
        assert!(parse_body(CommandKind::Deposit, br#" ["alice",1,"RUB"]"#).is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("24h").unwrap().as_secs(), 86_400);
        assert_eq!(parse_duration("250ms").unwrap().as_millis(), 250);
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("1y").is_err());
    }
}
