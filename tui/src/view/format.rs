//! Values as text: money in its currency, counts, ages, times, sizes, measurements,
//! and the feed's JSON.

use super::*;

/// A count of things in memory as a number to fit; no count comes near i128's end.
pub(super) fn usize_units(n: usize) -> i128 {
    i128::try_from(n).unwrap_or(i128::MAX)
}

/// A JSON value from the feed as one line of text, with client strings sanitised.
/// serde_json escapes C0 controls itself; `sanitize` removes the rest (C1, bidi).
pub fn json_text(value: &Value) -> String {
    sanitize(&serde_json::to_string(value).unwrap_or_default())
}

pub(super) fn join_clean(items: &[Clean], separator: &str) -> String {
    items
        .iter()
        .map(Clean::as_str)
        .collect::<Vec<_>>()
        .join(separator)
}

/// Amounts stay integers of minor units, as the ledger keeps them.
/// An amount of minor units in major units with its currency: `1,000.00 RUB`; with no
/// currency known, in the minor units it was sent in, said so (`100,000 minor units`),
/// so that it does not read as major units.
pub(super) fn money(amount: Option<u64>, currency: &str) -> String {
    match amount {
        Some(amount) if currency.is_empty() => {
            format!("{}{MINOR_UNITS}", money::format_number(amount.into(), ""))
        }
        Some(amount) => money::format(amount.into(), currency),
        None => String::new(),
    }
}

/// The unit of an amount whose currency the dashboard cannot know.
pub(super) const MINOR_UNITS: &str = " minor units";

/// [`money`] in `width` cells: the number shortens (never below its shortest form), the
/// currency, or `minor units`, stays.
pub(super) fn money_fit(amount: Option<u64>, currency: &str, width: u16) -> String {
    let Some(amount) = amount else {
        return String::new();
    };
    let unit = if currency.is_empty() {
        MINOR_UNITS.to_string()
    } else {
        format!(" {currency}")
    };
    let room = usize::from(width)
        .saturating_sub(cells(&unit))
        .max(shortest_money(amount.into(), currency));
    format!("{}{unit}", fit_money(amount.into(), currency, room))
}

/// The currency of each withdrawal the dashboard has seen, by (client, key): a refund's
/// fact or row may not carry it (a rejected refund names its withdrawal only), and its
/// amount is in its withdrawal's currency. Applied withdrawals in the log tail and the
/// keys page, refunds that carry their withdrawal's currency, and the open detail.
pub(super) fn withdrawal_currencies(feed: &Feed) -> BTreeMap<(&str, &str), &str> {
    let mut known = BTreeMap::new();
    for fact in &feed.facts {
        if fact.currency.is_empty() {
            continue;
        }
        let key = match &fact.withdrawal {
            Some(withdrawal) => withdrawal,
            None if fact.name.as_str() == "WithdrawalRecorded" => &fact.key,
            None => continue,
        };
        known.insert((fact.client.as_str(), key.as_str()), fact.currency.as_str());
    }
    let records = feed.keys.iter().flat_map(|page| &page.keys);
    for record in records.chain(&feed.detail) {
        if record.currency.is_empty() {
            continue;
        }
        let key = match &record.withdrawal {
            Some(withdrawal) => withdrawal,
            None if record.command.as_str() == "withdraw"
                && keys::key_result(record) == keys::KeyResult::Applied =>
            {
                &record.key
            }
            None => continue,
        };
        known.insert(
            (record.client.as_str(), key.as_str()),
            record.currency.as_str(),
        );
    }
    known
}

/// The currency of an amount: its own, else, for a refund, its withdrawal's if the
/// dashboard has seen it; empty when it cannot know.
pub(super) fn currency_of<'a>(
    known: &BTreeMap<(&str, &str), &'a str>,
    client: &Clean,
    withdrawal: Option<&Clean>,
    currency: &'a Clean,
) -> &'a str {
    if !currency.is_empty() {
        return currency.as_str();
    }
    withdrawal
        .and_then(|w| known.get(&(client.as_str(), w.as_str())).copied())
        .unwrap_or_default()
}

/// An age in at most 7 cells, the width of the age columns: past 999 days only the
/// days are left, and past 999,999 days they shorten too (`1e7d`).
pub fn format_age(ms: u64) -> String {
    let seconds = ms / 1000;
    let days = seconds / 86_400;
    match seconds {
        0 => format!("{ms}ms"),
        1..60 => format!("{seconds}.{}s", (ms % 1000) / 100),
        60..3600 => format!("{}m{:02}s", seconds / 60, seconds % 60),
        3600..86_400 => format!("{}h{:02}m", seconds / 3600, (seconds % 3600) / 60),
        _ if days < 1000 => format!("{days}d{:02}h", (seconds % 86_400) / 3600),
        _ => fit_with_unit(days.into(), "d", 7),
    }
}

/// A latency in at most 9 cells: milliseconds below ten seconds, whole seconds above.
pub(super) fn millis(value: Option<f64>) -> String {
    match value {
        None => "–".to_string(),
        Some(ms) if ms.abs() < 10_000.0 => format!("{ms:.1} ms"),
        Some(ms) => fit_with_unit(whole(ms / 1000.0), " s", 9),
    }
}

/// A measurement with one decimal, or, past a million, a whole number fitted to 9 cells:
/// `{:.1}` of a large float writes every digit of it.
pub(super) fn decimal(value: f64) -> String {
    if value.abs() < 1e6 {
        format!("{value:.1}")
    } else {
        fit_number(whole(value), 9)
    }
}

/// The nearest integer; floats beyond i128 stop at its ends, which shows them as ±2e38.
#[allow(clippy::cast_possible_truncation)]
fn whole(value: f64) -> i128 {
    // `as` saturates, which is the point here: a display value, never money.
    value.round() as i128
}

pub fn format_bytes(bytes: u64) -> String {
    // Up to EiB, which holds u64::MAX: the value stays under 1024 and so short.
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    // A display value only; the precision lost on petabytes does not matter.
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// `HH:MM:SS` of an RFC 3339 time, in the worker's zone as sent; the text itself if it
/// does not parse.
pub(super) fn clock_time(at: &Clean) -> String {
    match DateTime::parse_from_rfc3339(at.as_str()) {
        Ok(time) => time.format("%H:%M:%S").to_string(),
        // Not a time: as much of it as fits a time's cells, marked when cut.
        Err(_) => fit_text(at.as_str(), 8),
    }
}

/// `YYYY-MM-DD HH:MM:SS` of an RFC 3339 time, in the worker's zone as sent; the text
/// itself if it does not parse.
pub(super) fn date_time(at: &Clean) -> String {
    match DateTime::parse_from_rfc3339(at.as_str()) {
        Ok(time) => time.format("%Y-%m-%d %H:%M:%S").to_string(),
        Err(_) => at.to_string(),
    }
}

/// How long before the worker's `now` a time was.
pub(super) fn ago(now: &Clean, at: &Clean) -> Option<String> {
    let now = DateTime::parse_from_rfc3339(now.as_str()).ok()?;
    let at = DateTime::parse_from_rfc3339(at.as_str()).ok()?;
    let ms = u64::try_from((now - at).num_milliseconds()).unwrap_or(0);
    Some(format!("{} ago", format_age(ms)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_durations() {
        assert_eq!(format_age(12), "12ms");
        assert_eq!(format_age(1_250), "1.2s");
        assert_eq!(format_age(65_000), "1m05s");
        assert_eq!(format_age(3_600_000 * 2 + 60_000 * 10), "2h10m");
        assert_eq!(format_age(86_400_000 + 3_600_000), "1d01h");
        assert_eq!(format_bytes(123_456), "120.6 KiB");
        assert_eq!(format_bytes(10), "10 B");
    }

    /// The age columns are 7 cells wide; an age never needs more.
    #[test]
    fn ages_fit_seven_cells() {
        let day = 86_400_000;
        assert_eq!(format_age(999 * day + 23 * 3_600_000), "999d23h");
        assert_eq!(format_age(1000 * day), "1000d");
        assert_eq!(format_age(999_999 * day), "999999d");
        assert_eq!(format_age(9_999_999 * day), "1e7d");
        assert_eq!(format_age(u64::MAX), "2.1e11d");
        for ms in [0, 999, 59_999, 3_599_999, 86_399_999, 1000 * day, u64::MAX] {
            assert!(format_age(ms).chars().count() <= 7, "{ms}");
        }
    }

    #[test]
    fn measurements_stay_short() {
        assert_eq!(millis(None), "–");
        assert_eq!(millis(Some(0.84)), "0.8 ms");
        assert_eq!(millis(Some(9_999.9)), "9999.9 ms");
        assert_eq!(millis(Some(123_456.7)), "123 s");
        assert_eq!(millis(Some(f64::MAX)), "1.7e38 s");
        assert_eq!(decimal(12.0), "12.0");
        assert_eq!(decimal(1e15), "1e15");
        assert_eq!(decimal(-1e300), "-1.701e38");
        assert_eq!(format_bytes(u64::MAX), "16.0 EiB");
    }
}
