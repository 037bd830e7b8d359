//! Words for people: counts with their nouns in the right number, and the summary of a
//! verify with its money in major units. Used by every command that prints.

use ledger::VerifyReport;

/// `n` and the noun in its number: `1 attempt`, `6 attempts`.
pub fn count(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { one } else { many })
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
