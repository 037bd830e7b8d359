//! Money as people read it. The ledger, its HTTP API and its inbox count in integer minor
//! units (cents, kopecks, fils); a person reads and types major units. A currency's
//! exponent (how many minor digits a major unit has) comes from the ISO 4217 table:
//! `1000` RUB minor units are `10.00 RUB`, `500` JPY are `500 JPY`, `1000` KWD are
//! `1.000 KWD`. A code the table does not know, or one with no minor unit (gold, `XAU`),
//! is shown as it is counted, with no decimal point: a guess would misstate the amount.
//!
//! No floating point anywhere: formatting splits the integer, parsing builds it digit by
//! digit and refuses what it cannot represent exactly.

use std::fmt;

/// Digits after the decimal point in `code`'s major unit; 0 where ISO 4217 has none or
/// does not know the code.
pub fn exponent(code: &str) -> u32 {
    iso_currency::Currency::from_code(code)
        .and_then(|c| c.exponent())
        .map_or(0, u32::from)
}

/// Whether `code` is an alphabetic code of the ISO 4217 table (`USD`, `XAU`), as the CLI
/// and the worker check a currency before anything is sent or recorded: a typo such as
/// `USS` would otherwise fix an account to a currency that does not exist.
pub fn is_iso_code(code: &str) -> bool {
    iso_currency::Currency::from_code(code).is_some()
}

/// `minor` in major units with digit grouping, without the code: `-1,234,567.89`.
pub fn format_number(minor: i128, code: &str) -> String {
    let exp = exponent(code) as usize;
    let digits = minor.unsigned_abs().to_string();
    // At least one digit before the point: 5 kopecks are 0.05.
    let digits = format!("{digits:0>width$}", width = exp + 1);
    let (whole, fraction) = digits.split_at(digits.len() - exp);
    let mut out = String::with_capacity(digits.len() + digits.len() / 3 + 2);
    if minor < 0 {
        out.push('-');
    }
    for (i, c) in whole.chars().enumerate() {
        if i > 0 && (whole.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if exp > 0 {
        out.push('.');
        out.push_str(fraction);
    }
    out
}

/// `minor` in major units with the code: `1,000.00 RUB`.
pub fn format(minor: i128, code: &str) -> String {
    format!("{} {code}", format_number(minor, code))
}

/// Why a typed amount was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    Empty,
    /// Not a decimal number: letters, spaces, a `+`, two points, an exponent.
    NotANumber,
    /// Commas that do not group the whole part by threes, as the output writes it
    /// (`1,000.00`): `1,00`, `1,0000`, `,5`, a comma after the point.
    MisplacedComma,
    /// A minus sign: commands move a positive amount, their kind says which way.
    Negative,
    /// More digits after the point than the currency has.
    TooPrecise {
        code: String,
        decimals: u32,
    },
    /// Zero or less: commands move a positive amount.
    NotPositive,
    /// More than the ledger can hold in minor units.
    TooLarge,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::Empty => write!(f, "the amount is empty"),
            ParseError::NotANumber => write!(
                f,
                "the amount must be a decimal number of major units, such as 12.50 or 1,000.00"
            ),
            ParseError::MisplacedComma => write!(
                f,
                "a comma groups the digits before the point by threes, as in 1,000.00 or \
                 1,000,000; write the amount as 1000.00 or 1,000.00"
            ),
            ParseError::Negative => write!(
                f,
                "the amount must be more than zero: give it without a sign"
            ),
            ParseError::TooPrecise { code, decimals: 0 } => {
                write!(f, "{code} has no minor unit: give a whole number")
            }
            ParseError::TooPrecise { code, decimals } => {
                write!(f, "{code} has {decimals} decimal places at most")
            }
            ParseError::NotPositive => write!(f, "the amount must be more than zero"),
            ParseError::TooLarge => write!(f, "the amount is too large"),
        }
    }
}

impl std::error::Error for ParseError {}

/// An amount typed in major units (`12.50`, `12.5`, `12`, `1,000.00`) as minor units of
/// `code`, exactly: `12.50` RUB is 1250. The whole part may be grouped by threes with
/// commas, as [`format`] writes it, so that a printed amount can be typed back; commas
/// anywhere else are refused rather than guessed at (`1,5` may mean one and a half).
/// Refuses more decimals than the currency has, a sign, anything but digits, grouping
/// commas and one point, zero, and what overflows `u64`.
pub fn parse(text: &str, code: &str) -> Result<u64, ParseError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(ParseError::Empty);
    }
    if let Some(rest) = text.strip_prefix('-') {
        // Said apart from "not a number" only when the rest is one: `-x` is not a number.
        return Err(match parse(rest, code) {
            Err(ParseError::Empty) => ParseError::NotANumber,
            Err(e @ (ParseError::NotANumber | ParseError::MisplacedComma)) => e,
            _ => ParseError::Negative,
        });
    }
    let (whole, fraction) = match text.split_once('.') {
        Some((w, f)) => (w, Some(f)),
        None => (text, None),
    };
    let fraction = fraction.unwrap_or("");
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    let grouping = |s: &str| s.bytes().all(|b| b.is_ascii_digit() || b == b',');
    if !grouping(whole) || !grouping(fraction) {
        return Err(ParseError::NotANumber);
    }
    if !digits(fraction) || !grouped(whole) {
        return Err(ParseError::MisplacedComma);
    }
    let whole = whole.replace(',', "");
    if whole.is_empty() && fraction.is_empty() {
        return Err(ParseError::NotANumber);
    }
    let exp = exponent(code);
    if fraction.len() > exp as usize {
        return Err(ParseError::TooPrecise {
            code: code.to_owned(),
            decimals: exp,
        });
    }
    let mut minor: u64 = 0;
    let padded = format!("{whole}{fraction:0<width$}", width = exp as usize);
    for b in padded.bytes() {
        minor = minor
            .checked_mul(10)
            .and_then(|m| m.checked_add(u64::from(b - b'0')))
            .ok_or(ParseError::TooLarge)?;
    }
    if minor == 0 {
        return Err(ParseError::NotPositive);
    }
    Ok(minor)
}

/// Whether the whole part of an amount is plain digits, or digits grouped by threes with
/// commas as the output writes them: `1000`, `1,000`, `12,345,678`; not `1,00`, `,100`,
/// `1,,000` or `1000,000`.
fn grouped(whole: &str) -> bool {
    if !whole.contains(',') {
        return true;
    }
    let mut groups = whole.split(',');
    let first = groups.next().unwrap_or_default();
    (1..=3).contains(&first.len()) && groups.all(|g| g.len() == 3)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn exponents_come_from_iso_4217() {
        for (code, exp) in [("RUB", 2), ("USD", 2), ("JPY", 0), ("KWD", 3), ("CLF", 4)] {
            assert_eq!(exponent(code), exp, "{code}");
        }
        // No minor unit, or not in the table: counted as is.
        assert_eq!(exponent("XAU"), 0);
        assert_eq!(exponent("QQQ"), 0);
    }

    #[test]
    fn iso_codes_are_known_and_typos_are_not() {
        for code in ["USD", "RUB", "JPY", "XAU", "KWD"] {
            assert!(is_iso_code(code), "{code}");
        }
        for code in ["USS", "QQQ", "usd", "", "USDX"] {
            assert!(!is_iso_code(code), "{code}");
        }
    }

    #[test]
    fn formats_major_units_with_grouping() {
        let table: &[(i128, &str, &str)] = &[
            (100_000, "RUB", "1,000.00 RUB"),
            (1_000, "RUB", "10.00 RUB"),
            (5, "RUB", "0.05 RUB"),
            (0, "RUB", "0.00 RUB"),
            (-350_075, "RUB", "-3,500.75 RUB"),
            (500, "JPY", "500 JPY"),
            (1_234_567, "JPY", "1,234,567 JPY"),
            (1_000, "KWD", "1.000 KWD"),
            (7, "KWD", "0.007 KWD"),
            (123, "CLF", "0.0123 CLF"),
            (900_000_000, "RUB", "9,000,000.00 RUB"),
            (
                -101_000_000_000_000_000,
                "RUB",
                "-1,010,000,000,000,000.00 RUB",
            ),
            (1_000, "XAU", "1,000 XAU"),
            (
                i128::MIN,
                "RUB",
                "-1,701,411,834,604,692,317,316,873,037,158,841,057.28 RUB",
            ),
        ];
        for (minor, code, text) in table {
            assert_eq!(format(*minor, code), *text, "{minor} {code}");
        }
        assert_eq!(format_number(-100, "USD"), "-1.00");
    }

    #[test]
    fn parses_major_units_exactly() {
        let ok: &[(&str, &str, u64)] = &[
            ("12.50", "RUB", 1250),
            ("12.5", "RUB", 1250),
            ("12", "RUB", 1200),
            ("0.01", "RUB", 1),
            (".5", "RUB", 50),
            ("7.", "RUB", 700),
            (" 3 ", "RUB", 300),
            ("500", "JPY", 500),
            ("1.000", "KWD", 1000),
            ("0.001", "KWD", 1),
            ("184467440737095516.15", "USD", u64::MAX),
            // Grouped as the output writes it.
            ("1,000", "RUB", 100_000),
            ("1,000.00", "RUB", 100_000),
            ("12,345,678.9", "RUB", 1_234_567_890),
            ("999,999", "JPY", 999_999),
            ("1,234.567", "KWD", 1_234_567),
        ];
        for (text, code, minor) in ok {
            assert_eq!(parse(text, code), Ok(*minor), "{text} {code}");
        }
        let bad: &[(&str, &str, ParseError)] = &[
            ("", "RUB", ParseError::Empty),
            (
                "12.555",
                "RUB",
                ParseError::TooPrecise {
                    code: "RUB".into(),
                    decimals: 2,
                },
            ),
            (
                "1.5",
                "JPY",
                ParseError::TooPrecise {
                    code: "JPY".into(),
                    decimals: 0,
                },
            ),
            ("-5", "RUB", ParseError::Negative),
            ("-0.01", "RUB", ParseError::Negative),
            ("-1.555", "RUB", ParseError::Negative),
            ("-1,000", "RUB", ParseError::Negative),
            ("-", "RUB", ParseError::NotANumber),
            ("-x", "RUB", ParseError::NotANumber),
            ("-1,00", "RUB", ParseError::MisplacedComma),
            ("+5", "RUB", ParseError::NotANumber),
            ("1,00", "RUB", ParseError::MisplacedComma),
            ("1,5", "RUB", ParseError::MisplacedComma),
            ("1,0000", "RUB", ParseError::MisplacedComma),
            ("1000,000", "RUB", ParseError::MisplacedComma),
            ("1,,000", "RUB", ParseError::MisplacedComma),
            (",100", "RUB", ParseError::MisplacedComma),
            ("1,000,", "RUB", ParseError::MisplacedComma),
            (",", "RUB", ParseError::MisplacedComma),
            ("1.000,5", "KWD", ParseError::MisplacedComma),
            ("1 000", "RUB", ParseError::NotANumber),
            ("1e3", "RUB", ParseError::NotANumber),
            ("1.2.3", "RUB", ParseError::NotANumber),
            (".", "RUB", ParseError::NotANumber),
            ("0", "RUB", ParseError::NotPositive),
            ("0.00", "RUB", ParseError::NotPositive),
            ("184467440737095516.16", "USD", ParseError::TooLarge),
        ];
        for (text, code, err) in bad {
            assert_eq!(parse(text, code).as_ref(), Err(err), "{text} {code}");
        }
        assert_eq!(
            parse("12.555", "RUB").unwrap_err().to_string(),
            "RUB has 2 decimal places at most"
        );
        // Each refusal says how to write the amount.
        assert!(
            parse("1,00", "RUB")
                .unwrap_err()
                .to_string()
                .contains("write the amount as 1000.00 or 1,000.00")
        );
        assert!(
            parse("-5", "RUB")
                .unwrap_err()
                .to_string()
                .contains("without a sign")
        );
    }

    #[test]
    fn what_is_formatted_parses_back() {
        for minor in [1u64, 5, 99, 100, 12_345, 1_000_000_007, u64::MAX] {
            for code in ["RUB", "JPY", "KWD"] {
                // As printed, grouping commas included, and without them.
                let text = format_number(i128::from(minor), code);
                assert_eq!(parse(&text, code), Ok(minor), "{text} {code}");
                let plain = text.replace(',', "");
                assert_eq!(parse(&plain, code), Ok(minor), "{plain} {code}");
            }
        }
    }
}
