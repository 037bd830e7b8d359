//! Domain types: parsed and validated values only. Every constructor checks its input, so
//! a value of these types that exists is valid, and code further in never re-checks.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The largest amount one command may move, in minor units (10^15).
pub const AMOUNT_MAX: u64 = 1_000_000_000_000_000;
/// The longest idempotency key, in bytes.
pub const KEY_LEN_MAX: usize = 255;
/// The longest account or client name, in bytes.
pub const NAME_LEN_MAX: usize = 64;

/// Why a value given from outside was refused. The message never quotes the input back,
/// because it may end up in an HTTP answer and a log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidInput {
    #[error("the idempotency key must be 1 to 255 bytes of visible ASCII (0x21..=0x7E)")]
    Key,
    #[error(
        "an account is 1 to 64 bytes of letters, digits, '_', '-', '.', ':' and must not start with '@'"
    )]
    Account,
    #[error("a client name is 1 to 64 bytes of letters, digits, '_', '-', '.'")]
    Client,
    #[error("the amount must be a whole number of minor units from 1 to 10^15")]
    Amount,
    #[error("the currency must be three capital letters (ISO 4217)")]
    Currency,
}

fn visible_ascii(s: &str) -> bool {
    s.bytes().all(|b| (0x21..=0x7E).contains(&b))
}

fn name_chars(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'))
}

/// The client who sends commands; keys are scoped by it.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ClientId(String);

impl ClientId {
    pub fn parse(s: &str) -> Result<Self, InvalidInput> {
        if s.is_empty() || s.len() > NAME_LEN_MAX || !name_chars(s) || s.contains(':') {
            return Err(InvalidInput::Client);
        }
        Ok(Self(s.to_owned()))
    }
    /// The client served when no tokens are configured.
    pub fn default_client() -> Self {
        Self("default".to_owned())
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// An idempotency key: 1 to 255 bytes of visible ASCII, chosen by the client.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Key(String);

impl Key {
    pub fn parse(s: &str) -> Result<Self, InvalidInput> {
        if s.is_empty() || s.len() > KEY_LEN_MAX || !visible_ascii(s) {
            return Err(InvalidInput::Key);
        }
        Ok(Self(s.to_owned()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A broker message's id, as the inbox deduplicates it: the same rules as a key.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct MessageId(String);

impl MessageId {
    pub fn parse(s: &str) -> Result<Self, InvalidInput> {
        Key::parse(s).map(|k| Self(k.0))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// An account name. Names starting with `@` are system accounts, which clients cannot name.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Account(String);

impl Account {
    /// Money coming into the ledger is taken from here.
    pub const WORLD: &'static str = "@world";
    /// Money going out of the ledger lands here.
    pub const PAYOUTS: &'static str = "@payouts";

    /// Parses a user account; system accounts are refused.
    pub fn parse(s: &str) -> Result<Self, InvalidInput> {
        if s.is_empty() || s.len() > NAME_LEN_MAX || !name_chars(s) {
            return Err(InvalidInput::Account);
        }
        Ok(Self(s.to_owned()))
    }
    pub fn world() -> Self {
        Self(Self::WORLD.to_owned())
    }
    pub fn payouts() -> Self {
        Self(Self::PAYOUTS.to_owned())
    }
    pub fn is_system(&self) -> bool {
        self.0.starts_with('@')
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// Parses any ledger-wide account name: system ones and a tenant's (`shop/alice`)
    /// included. For reading stored data and the operator's reads, never for commands or
    /// a tenant's reads, whose names are taken relative to the tenant
    /// ([`crate::tenant`]).
    pub fn parse_any(s: &str) -> Result<Self, InvalidInput> {
        match s {
            Self::WORLD => Ok(Self::world()),
            Self::PAYOUTS => Ok(Self::payouts()),
            _ => match s.split_once(crate::tenant::SEPARATOR) {
                Some((tenant, name)) => {
                    let tenant = ClientId::parse(tenant).map_err(|_| InvalidInput::Account)?;
                    let name = Self::parse(name)?;
                    crate::tenant::owned_name(&tenant, &name).ok_or(InvalidInput::Account)
                }
                None => Self::parse(s),
            },
        }
    }

    /// An account name the ledger built itself, from parts already checked.
    pub(crate) fn from_checked(s: String) -> Self {
        Self(s)
    }
}

/// An ISO 4217 alphabetic code.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Currency([u8; 3]);

impl Currency {
    pub fn parse(s: &str) -> Result<Self, InvalidInput> {
        let b = s.as_bytes();
        if b.len() != 3 || !b.iter().all(u8::is_ascii_uppercase) {
            return Err(InvalidInput::Currency);
        }
        Ok(Self([b[0], b[1], b[2]]))
    }
    pub fn as_str(&self) -> &str {
        // Only ASCII capitals are ever stored, so this cannot fail.
        std::str::from_utf8(&self.0).unwrap_or("???")
    }
}

/// A positive amount of minor units, at most [`AMOUNT_MAX`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "u64", into = "u64")]
pub struct Amount(u64);

impl Amount {
    pub fn new(units: u64) -> Result<Self, InvalidInput> {
        if units == 0 || units > AMOUNT_MAX {
            return Err(InvalidInput::Amount);
        }
        Ok(Self(units))
    }
    pub fn units(self) -> u64 {
        self.0
    }
}

macro_rules! string_newtype_impls {
    ($($t:ty => $parse:path),*) => {$(
        impl TryFrom<String> for $t {
            type Error = InvalidInput;
            fn try_from(s: String) -> Result<Self, InvalidInput> {
                $parse(&s)
            }
        }
        impl From<$t> for String {
            fn from(v: $t) -> String {
                v.as_str().to_owned()
            }
        }
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:?}", self.as_str())
            }
        }
    )*};
}
string_newtype_impls!(ClientId => ClientId::parse, Key => Key::parse, MessageId => MessageId::parse, Account => Account::parse_any, Currency => Currency::parse);

impl TryFrom<u64> for Amount {
    type Error = InvalidInput;
    fn try_from(v: u64) -> Result<Self, InvalidInput> {
        Amount::new(v)
    }
}
impl From<Amount> for u64 {
    fn from(a: Amount) -> u64 {
        a.0
    }
}
impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
impl fmt::Debug for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A request to move money. Refunds name the withdrawal they compensate by its key, in the
/// same client's scope, and take their currency and account from it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Command {
    Deposit {
        account: Account,
        amount: Amount,
        currency: Currency,
    },
    Withdraw {
        account: Account,
        amount: Amount,
        currency: Currency,
    },
    Refund {
        withdrawal: Key,
        amount: Amount,
    },
}

impl Command {
    /// The command's name as it appears in receipts, the CLI and the dashboard.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Deposit { .. } => "deposit",
            Command::Withdraw { .. } => "withdraw",
            Command::Refund { .. } => "refund",
        }
    }

    pub fn amount(&self) -> Amount {
        match self {
            Command::Deposit { amount, .. }
            | Command::Withdraw { amount, .. }
            | Command::Refund { amount, .. } => *amount,
        }
    }

    /// A canonical byte form: equal commands and only equal commands give equal bytes,
    /// whatever the JSON they were parsed from looked like.
    pub fn canonical_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        self.parts().write(&mut |b| out.extend_from_slice(b));
        out
    }

    fn parts(&self) -> CommandParts<'_> {
        match self {
            Command::Deposit {
                account,
                amount,
                currency,
            } => CommandParts::movement(b"deposit", account, *amount, *currency),
            Command::Withdraw {
                account,
                amount,
                currency,
            } => CommandParts::movement(b"withdraw", account, *amount, *currency),
            Command::Refund { withdrawal, amount } => CommandParts::refund(withdrawal, *amount),
        }
    }

    /// A 128-bit SHA-256 prefix of the canonical form: what a key remembers of its
    /// command, to tell a retry from a reuse of the key for another command.
    pub fn fingerprint(&self) -> Fingerprint {
        self.parts().fingerprint()
    }
}

/// A command's canonical form as borrowed fields, so that a fact's fingerprint is hashed
/// from the fact without building its command (a verify does it for every fact).
#[derive(Clone, Copy)]
pub(crate) struct CommandParts<'a> {
    kind: &'static [u8],
    name: &'a str,
    amount: Amount,
    currency: Option<Currency>,
}

impl<'a> CommandParts<'a> {
    pub(crate) fn movement(
        kind: &'static [u8],
        account: &'a Account,
        amount: Amount,
        currency: Currency,
    ) -> Self {
        Self {
            kind,
            name: account.as_str(),
            amount,
            currency: Some(currency),
        }
    }

    pub(crate) fn refund(withdrawal: &'a Key, amount: Amount) -> Self {
        Self {
            kind: b"refund",
            name: withdrawal.as_str(),
            amount,
            currency: None,
        }
    }

    /// Each field as its length (8 bytes, big-endian) and its bytes.
    fn write(&self, out: &mut dyn FnMut(&[u8])) {
        let mut field = |b: &[u8]| {
            out(&(b.len() as u64).to_be_bytes());
            out(b);
        };
        field(self.kind);
        field(self.name.as_bytes());
        field(&self.amount.units().to_be_bytes());
        if let Some(currency) = self.currency {
            field(currency.as_str().as_bytes());
        }
    }

    pub(crate) fn fingerprint(&self) -> Fingerprint {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        self.write(&mut |b| h.update(b));
        let mut f = [0u8; 16];
        f.copy_from_slice(&h.finalize()[..16]);
        Fingerprint(f)
    }
}

/// What a key remembers of its command.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Fingerprint(pub [u8; 16]);

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0[..4] {
            write!(f, "{b:02x}")?;
        }
        f.write_str("…")
    }
}

/// A business refusal. Final for its key, and replayed like a success. The order is the
/// precedence: when several apply, the first in this list is the one reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rejection {
    AccountNotFound,
    WithdrawalNotFound,
    CurrencyMismatch,
    InsufficientFunds,
    RefundExceedsWithdrawal,
}

impl Rejection {
    pub const ALL: [Rejection; 5] = [
        Rejection::AccountNotFound,
        Rejection::WithdrawalNotFound,
        Rejection::CurrencyMismatch,
        Rejection::InsufficientFunds,
        Rejection::RefundExceedsWithdrawal,
    ];
    /// The stable code clients match on.
    pub fn code(self) -> &'static str {
        match self {
            Rejection::AccountNotFound => "account_not_found",
            Rejection::WithdrawalNotFound => "withdrawal_not_found",
            Rejection::CurrencyMismatch => "currency_mismatch",
            Rejection::InsufficientFunds => "insufficient_funds",
            Rejection::RefundExceedsWithdrawal => "refund_exceeds_withdrawal",
        }
    }
    pub fn title(self) -> &'static str {
        match self {
            Rejection::AccountNotFound => "The account does not exist.",
            Rejection::WithdrawalNotFound => "No applied withdrawal has this key for this client.",
            Rejection::CurrencyMismatch => "The account holds another currency.",
            Rejection::InsufficientFunds => "The balance is lower than the amount.",
            Rejection::RefundExceedsWithdrawal => "The refunds would exceed the amount withdrawn.",
        }
    }
    /// Its place in [`Rejection::ALL`], where the stores count it.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// What a rejection tells beyond its code: the figure the client needs to act on it. It
/// is decided with the rejection, from what the decision read, and kept in the fact, so
/// every replay of the rejection repeats it byte for byte (a balance read again later
/// would have moved).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RejectionDetail {
    /// `insufficient_funds`: the account's balance when the withdrawal was decided.
    Balance(u128),
    /// `currency_mismatch`: the currency the account holds.
    AccountCurrency(Currency),
    /// `refund_exceeds_withdrawal`: how much of the withdrawal was still refundable.
    Refundable(u64),
}

impl RejectionDetail {
    /// The one rejection this detail belongs to: any other pairing is not a decision the
    /// core makes, and a stored fact holding one is corrupt.
    pub fn rejection(self) -> Rejection {
        match self {
            RejectionDetail::Balance(_) => Rejection::InsufficientFunds,
            RejectionDetail::AccountCurrency(_) => Rejection::CurrencyMismatch,
            RejectionDetail::Refundable(_) => Rejection::RefundExceedsWithdrawal,
        }
    }
}

/// Milliseconds since the Unix epoch. Time is passed into the core, never read by it.
#[derive(Default, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Timestamp(pub i64);

impl Timestamp {
    pub fn millis(self) -> i64 {
        self.0
    }
    pub fn saturating_add_ms(self, ms: i64) -> Self {
        Self(self.0.saturating_add(ms))
    }
    pub fn saturating_sub_ms(self, ms: i64) -> Self {
        Self(self.0.saturating_sub(ms))
    }
    /// RFC 3339 in UTC with milliseconds, as receipts show it.
    pub fn to_rfc3339(self) -> String {
        match chrono::DateTime::from_timestamp_millis(self.0) {
            Some(t) => t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            None => format!("@{}ms", self.0),
        }
    }

    /// [`Self::to_rfc3339`] appended to `out`, written by hand for the years 1970 to
    /// 9999 (every receipt's), through chrono otherwise: a verify renders one per fact,
    /// and chrono's formatting was a tenth of rendering an answer.
    pub fn write_rfc3339(self, out: &mut String) {
        /// The last millisecond of 9999.
        const LAST: i64 = 253_402_300_799_999;
        if !(0..=LAST).contains(&self.0) {
            out.push_str(&self.to_rfc3339());
            return;
        }
        let (days, ms_of_day) = (self.0 / 86_400_000, self.0 % 86_400_000);
        // Days since 1970-01-01 to a civil date (Hinnant's days_from_civil, inverted),
        // with eras of 400 years counted from 0000-03-01.
        let z = days + 719_468;
        let (era, doe) = (z / 146_097, z % 146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let year = yoe + era * 400 + i64::from(month <= 2);
        let (secs, ms) = (ms_of_day / 1000, ms_of_day % 1000);
        let mut b = *b"0000-00-00T00:00:00.000Z";
        let mut put = |at: usize, width: usize, mut v: i64| {
            for i in (at..at + width).rev() {
                // Each digit is 0 to 9: v is non-negative and below 10^width.
                b[i] = b'0' + u8::try_from(v % 10).unwrap_or(0);
                v /= 10;
            }
        };
        put(0, 4, year);
        put(5, 2, month);
        put(8, 2, day);
        put(11, 2, secs / 3600);
        put(14, 2, secs / 60 % 60);
        put(17, 2, secs % 60);
        put(20, 3, ms);
        // Only ASCII digits and separators.
        out.push_str(std::str::from_utf8(&b).unwrap_or_default());
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}
