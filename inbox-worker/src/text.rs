//! Words for people: counts with their nouns in the right number, money in major units,
//! the summary of a verify, and what the reads (`balance`, `statement`, `key`, `accounts`)
//! print. Used by every command that prints.

use ledger::VerifyReport;
use serde_json::Value;

/// `n` and the noun in its number: `1 attempt`, `6 attempts`.
pub fn count(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { one } else { many })
}

/// `minor` units of `currency` as a person reads them: `1,000.00 RUB`. The API's JSON
/// writes them as a number, or as a decimal string beyond 64 bits
/// (`ledger::json::wide`); with no currency known, the number as it is counted.
pub fn money(v: &Value, currency: &str) -> String {
    match minor(v) {
        Some(m) if !currency.is_empty() => money::format(m, currency),
        Some(m) => m.to_string(),
        None => "?".to_owned(),
    }
}

/// A count of minor units from the API's JSON.
fn minor(v: &Value) -> Option<i128> {
    match v {
        Value::Number(n) => n
            .as_i64()
            .map(i128::from)
            .or_else(|| n.as_u64().map(i128::from)),
        Value::String(s) => s.parse::<i128>().ok(),
        _ => None,
    }
}

/// The command an answer is about, in words: `withdraw 3.00 RUB from alice`. A refund's
/// rejection carries no currency; `currency` is the one the CLI knows.
pub fn describe_command(v: &Value, currency: Option<&str>) -> String {
    let s = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
    let code = v["currency"].as_str().or(currency).unwrap_or_default();
    let amount = money(&v["amount"], code);
    match s("command").as_str() {
        "deposit" => format!("deposit {amount} to {}", s("account")),
        "withdraw" => format!("withdraw {amount} from {}", s("account")),
        "refund" => format!("refund {amount} of withdrawal {}", s("withdrawal")),
        other => other.to_owned(),
    }
}

/// A member of the API's JSON as text: a string as it is, null as nothing.
fn field(v: &Value, k: &str) -> String {
    match &v[k] {
        Value::String(x) => x.clone(),
        Value::Null => String::new(),
        x => x.to_string(),
    }
}

/// A key for the next attempt of an order whose key holds a rejection: `KEY-attempt-2`,
/// or one more than the attempt `KEY` already counts. None when it would not be a key
/// (over 255 bytes): the advice then names no example.
pub fn next_attempt_key(key: &str) -> Option<String> {
    let next = match key.rsplit_once("-attempt-") {
        Some((order, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
            format!("{order}-attempt-{}", n.parse::<u64>().ok()?.checked_add(1)?)
        }
        _ => format!("{key}-attempt-2"),
    };
    (next.len() <= 255).then_some(next)
}

/// What a rejection's receipt ends with: the key is spent, and the next attempt of the
/// same order (after a top-up, say) needs a new one, since this key's answer is stored
/// and every retry with it replays the rejection.
pub fn rejection_advice(key: &str) -> String {
    let example = next_attempt_key(key)
        .map(|k| format!(", such as {k}"))
        .unwrap_or_default();
    format!(
        "(the rejection is final for this key: a retry with it gets the same answer;\n  \
         to try the order again, e.g. after a top-up, send it with a new key{example})"
    )
}

/// What `balance` prints for `GET /v1/accounts/{id}`: the account and what it holds, one
/// line per currency (only a system account holds several).
pub fn balance(v: &Value) -> String {
    let account = field(v, "account");
    let held: Vec<String> = match v["balances"].as_array() {
        Some(rows) => rows
            .iter()
            .map(|r| money(&r["balance"], r["currency"].as_str().unwrap_or_default()))
            .collect(),
        None => vec![money(
            &v["balance"],
            v["currency"].as_str().unwrap_or_default(),
        )],
    };
    let mut out = held
        .iter()
        .map(|m| format!("{account}  {m}"))
        .collect::<Vec<_>>()
        .join("\n");
    // A balance at a point of the log says which point, and which movement it is after.
    let point = match (v.get("as_of_seq"), v.get("as_of")) {
        (Some(seq), _) => format!("as of seq {seq}"),
        (None, Some(at)) => format!("as of {}", at.as_str().unwrap_or_default()),
        (None, None) => return out,
    };
    let after = match v["movement_seq"].as_u64() {
        Some(seq) => format!("after its movement at seq {seq}"),
        None => "before its first movement".to_owned(),
    };
    out.push_str(&format!("  ({point}: {after})"));
    out
}

/// A signed change in major units, its sign always written: `+12.50`, `-300.00`.
fn signed(v: &Value, currency: &str) -> String {
    match minor(v) {
        Some(m) if m > 0 => format!("+{}", money::format_number(m, currency)),
        Some(m) => money::format_number(m, currency),
        None => "?".to_owned(),
    }
}

/// Rows as a table, each column as wide as its widest cell: left-aligned text, and
/// right-aligned numbers (the columns `right` lists), two spaces apart.
fn table(rows: &[Vec<String>], right: &[usize]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    rows.iter()
        .map(|row| {
            let cells: Vec<String> = row
                .iter()
                .enumerate()
                .map(|(c, cell)| {
                    if right.contains(&c) {
                        format!("{cell:>w$}", w = widths[c])
                    } else {
                        format!("{cell:<w$}", w = widths[c])
                    }
                })
                .collect();
            cells.join("  ").trim_end().to_owned()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// What `statement` prints for one page of `GET /v1/accounts/{id}/facts`: the account's
/// balance, then its movements in the order of the log, each with its signed change and
/// the balance after it, in major units of the account's currency.
pub fn statement(v: &Value) -> String {
    let code = v["currency"].as_str().unwrap_or_default();
    let account = field(v, "account");
    let mut out = format!("{account} holds {}\n", money(&v["balance"], code));
    let facts = v["facts"].as_array().map(Vec::as_slice).unwrap_or_default();
    if facts.is_empty() {
        out.push_str("  no movements on this page");
        return out;
    }
    let mut rows = vec![
        ["seq", "at", "command", "change", "balance", "key"]
            .map(str::to_owned)
            .to_vec(),
    ];
    for f in facts {
        let mut key = field(f, "key");
        if let Some(w) = f["withdrawal"].as_str() {
            key.push_str(&format!(" (of withdrawal {w})"));
        }
        rows.push(vec![
            field(f, "seq"),
            field(f, "at"),
            field(f, "command"),
            signed(&f["change"], code),
            money::format_number(minor(&f["balance_after"]).unwrap_or_default(), code),
            key,
        ]);
    }
    out.push_str(&indent(&table(&rows, &[0, 3, 4])));
    out
}

/// Every line of `text` two spaces in.
fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("  {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// What `key` prints for `GET /v1/keys/{key}`: the key's status, its command, its
/// outcome (applied with the balance after it, or the rejection and the figure it was
/// decided on) and how long its answer is kept. `currency` is a refund's, which its
/// rejection does not carry.
pub fn key(v: &Value, currency: Option<&str>) -> String {
    let status = field(v, "status");
    let mut out = format!("key {}: {status}\n", field(v, "key"));
    let outcome = &v["outcome"];
    let code = outcome["currency"]
        .as_str()
        .or(v["currency"].as_str())
        .or(currency)
        .unwrap_or_default();
    out.push_str(&format!(
        "  command  {}\n",
        describe_command(v, Some(code).filter(|c| !c.is_empty()))
    ));
    match outcome["outcome"].as_str() {
        Some("applied") => {
            out.push_str(&format!(
                "  outcome  applied as seq {}; balance {} {} after it\n",
                field(outcome, "seq"),
                field(outcome, "account"),
                money(&outcome["balance"], code)
            ));
            if !outcome["refunded_total"].is_null() {
                out.push_str(&format!(
                    "  refunded {} of the withdrawal in total\n",
                    money(&outcome["refunded_total"], code)
                ));
            }
        }
        Some("rejected") => {
            out.push_str(&format!(
                "  outcome  rejected as seq {}: {} - {}\n",
                field(outcome, "seq"),
                field(outcome, "code"),
                field(outcome, "title")
            ));
            if !outcome["balance"].is_null() {
                out.push_str(&format!(
                    "  balance  {} {} when it was decided\n",
                    field(outcome, "account"),
                    money(&outcome["balance"], code)
                ));
            }
            if !outcome["refundable"].is_null() {
                out.push_str(&format!(
                    "  left     {} of the withdrawal to refund\n",
                    money(&outcome["refundable"], code)
                ));
            }
            if let Some(held) = outcome["account_currency"].as_str() {
                out.push_str(&format!(
                    "  account  {} holds {held}\n",
                    field(outcome, "account")
                ));
            }
            out.push_str(&format!("  {}\n", rejection_advice(&field(v, "key"))));
        }
        _ => out.push_str(&format!(
            "  outcome  none yet: an attempt holds the key{}\n",
            if v["lease_expired"].as_bool() == Some(true) {
                " (its lease ran out; the next attempt takes it over)"
            } else {
                ""
            }
        )),
    }
    out.push_str(&format!("  since    {}\n", field(v, "since")));
    if !v["expires_at"].is_null() {
        out.push_str(&format!("  kept to  {}\n", field(v, "expires_at")));
    }
    out.push_str(&format!(
        "  replays  {}, conflicts {}",
        field(v, "replays"),
        field(v, "conflicts")
    ));
    out
}

/// One page of `GET /v1/accounts` as rows of `accounts`: the account, its balance right-
/// aligned in major units, and the currency. `widths` are the widest account and balance
/// shown so far, so that the pages of `--all` line up as they grow.
pub fn accounts_page(v: &Value, widths: &mut (usize, usize)) -> String {
    let rows: Vec<(String, String, String)> = v["accounts"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|r| {
            let code = r["currency"].as_str().unwrap_or_default();
            (
                field(r, "account"),
                money::format_number(minor(&r["balance"]).unwrap_or_default(), code),
                code.to_owned(),
            )
        })
        .collect();
    for (account, balance, _) in &rows {
        widths.0 = widths.0.max(account.chars().count());
        widths.1 = widths.1.max(balance.chars().count());
    }
    rows.iter()
        .map(|(account, balance, code)| {
            format!(
                "{account:<a$}  {balance:>b$} {code}",
                a = widths.0,
                b = widths.1
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The `sums` of `GET /v1/accounts` (every account the caller may see, per currency), in
/// major units: `0.00 RUB, 0 JPY`.
pub fn sums(v: &Value) -> String {
    let sums: Vec<String> = v["sums"]
        .as_object()
        .map(|m| m.iter().map(|(code, s)| money(s, code)).collect())
        .unwrap_or_default();
    if sums.is_empty() {
        "none".to_owned()
    } else {
        sums.join(", ")
    }
}

/// What `verify` prints: the counts, the money the accounts hold (in major units), and
/// either `all guarantees hold` or each violation with the guarantee it breaks.
pub fn verify_summary(report: &VerifyReport) -> String {
    let text = report.to_string();
    if report.held.is_empty() {
        return text;
    }
    let held: Vec<String> = report
        .held
        .iter()
        .map(|(currency, minor)| money::format(*minor, currency.as_str()))
        .collect();
    let (first, rest) = text.split_once('\n').unwrap_or((text.as_str(), ""));
    format!(
        "{first}\nthe accounts hold {} in total\n{rest}",
        held.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_attempt_gets_a_new_key() {
        assert_eq!(
            next_attempt_key("ord-42").as_deref(),
            Some("ord-42-attempt-2")
        );
        assert_eq!(
            next_attempt_key("ord-42-attempt-2").as_deref(),
            Some("ord-42-attempt-3")
        );
        assert_eq!(
            next_attempt_key("ord-attempt-x").as_deref(),
            Some("ord-attempt-x-attempt-2")
        );
        assert_eq!(
            next_attempt_key(&"k".repeat(245)).map(|k| k.len()),
            Some(255)
        );
        assert_eq!(next_attempt_key(&"k".repeat(246)), None);
        assert!(rejection_advice(&"k".repeat(250)).ends_with("with a new key)"));
    }

    #[test]
    fn counts_name_one_thing_in_the_singular() {
        assert_eq!(count(0u32, "conflict", "conflicts"), "0 conflicts");
        assert_eq!(count(1u32, "conflict", "conflicts"), "1 conflict");
        assert_eq!(count(2u64, "conflict", "conflicts"), "2 conflicts");
    }

    #[test]
    fn the_verify_summary_shows_money_in_major_units() {
        let currency = |c| ledger::Currency::parse(c).unwrap();
        let mut report = VerifyReport {
            facts: 1,
            keys_done: 1,
            keys_expired: 0,
            accounts: 1,
            currencies: 2,
            held: [(currency("RUB"), 97_550), (currency("JPY"), 1_500)].into(),
            violations: Vec::new(),
        };
        assert_eq!(
            verify_summary(&report),
            "checked 1 fact, 1 key done, 0 expired, 1 account in 2 currencies\n\
             the accounts hold 1,500 JPY, 975.50 RUB in total\n\
             all guarantees hold"
        );
        report.held.clear();
        report.facts = 0;
        report.keys_done = 0;
        report.accounts = 0;
        report.currencies = 0;
        assert_eq!(
            verify_summary(&report),
            "checked 0 facts, 0 keys done, 0 expired, 0 accounts in 0 currencies\n\
             all guarantees hold"
        );
    }
}
