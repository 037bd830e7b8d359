//! Facts, outcomes and their persisted encoding. A fact is the ground truth of one key;
//! the outcome a client is told is derived from it, so it can always be rebuilt. The JSON
//! bodies rendered from them are in [`crate::json`].

use serde::{Deserialize, Serialize};

use crate::domain::{
    Account, Amount, ClientId, Command, Currency, Fingerprint, Key, Rejection, RejectionDetail,
    Timestamp,
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
        /// What the client is told beyond the code; `None` for the rejections that have
        /// nothing more to tell, and for those recorded before details were kept.
        detail: Option<RejectionDetail>,
    },
}

/// Tags of the persisted encoding. Never renumber: they are on disk.
const TAG_DEPOSIT: u8 = 1;
const TAG_WITHDRAWAL: u8 = 2;
const TAG_REFUND: u8 = 3;
const TAG_REJECTED: u8 = 4;
/// The version of every kind of fact but a rejection with a detail.
pub const FACT_VERSION: u8 = 1;
/// The version of a rejection with a detail (`RejectedV2`). A rejection without one is
/// still written as version 1, so the facts recorded before details existed encode as
/// they always did and nothing on disk is rewritten.
pub const FACT_VERSION_DETAILED: u8 = 2;

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

    /// The version of the persisted payload this fact is written with.
    pub fn version(&self) -> u8 {
        match self {
            FactBody::CommandRejected {
                detail: Some(_), ..
            } => FACT_VERSION_DETAILED,
            _ => FACT_VERSION,
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

#[derive(Serialize, Deserialize)]
struct RejectedV2 {
    at: i64,
    client: ClientId,
    key: Key,
    command: Command,
    rejection: Rejection,
    detail: RejectionDetail,
}

/// The same payloads borrowed, for writing: serde writes a reference as the value it
/// points to, so these encode byte for byte as the owned ones above, without copying
/// names (every commit encodes its facts, and every decoded fact is compared with its
/// encoding).
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

#[derive(Serialize)]
struct RejectedV2Ref<'a> {
    at: i64,
    client: &'a ClientId,
    key: &'a Key,
    command: &'a Command,
    rejection: Rejection,
    detail: RejectionDetail,
}

/// A sink that compares what is written with `rest`, byte by byte, and consumes it.
struct Same<'a> {
    rest: &'a [u8],
    same: bool,
}

impl Extend<u8> for Same<'_> {
    fn extend<I: IntoIterator<Item = u8>>(&mut self, bytes: I) {
        for b in bytes {
            match self.rest.split_first() {
                Some((&first, rest)) if self.same && first == b => self.rest = rest,
                _ => self.same = false,
            }
        }
    }
}

/// A stored record could not be read back: the store is corrupt or from a future version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("undecodable {what}: {reason}")]
pub struct DecodeError {
    pub what: &'static str,
    pub reason: String,
}

impl DecodeError {
    pub fn new(what: &'static str, reason: impl ToString) -> Self {
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
        // Serialising plain data into a Vec cannot fail.
        self.encode_into(Vec::with_capacity(96)).unwrap_or_default()
    }

    /// Whether `bytes` are exactly this fact's encoding: compared as the encoder writes
    /// them, without writing them anywhere (decoding checks every record this way).
    fn encodes_as(&self, bytes: &[u8]) -> bool {
        self.encode_into(Same {
            rest: bytes,
            same: true,
        })
        .is_ok_and(|s| s.same && s.rest.is_empty())
    }

    /// Writes the encoding into `out`, which may be a buffer or a comparison.
    fn encode_into<W: Extend<u8>>(&self, mut out: W) -> Result<W, postcard::Error> {
        out.extend([self.body.tag(), self.body.version()]);
        let at = self.at.millis();
        let (client, key) = (&self.client, &self.key);
        match &self.body {
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
                out,
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
                out,
            ),
            FactBody::CommandRejected {
                command,
                rejection,
                detail: None,
            } => postcard::to_extend(
                &RejectedRef {
                    at,
                    client,
                    key,
                    command,
                    rejection: *rejection,
                },
                out,
            ),
            FactBody::CommandRejected {
                command,
                rejection,
                detail: Some(detail),
            } => postcard::to_extend(
                &RejectedV2Ref {
                    at,
                    client,
                    key,
                    command,
                    rejection: *rejection,
                    detail: *detail,
                },
                out,
            ),
        }
    }

    pub fn decode(seq: u64, bytes: &[u8]) -> Result<Fact, DecodeError> {
        let (&tag, rest) = bytes
            .split_first()
            .ok_or_else(|| DecodeError::new("fact", "empty record"))?;
        let (&version, payload) = rest
            .split_first()
            .ok_or_else(|| DecodeError::new("fact", "no version byte"))?;
        let known = match tag {
            TAG_REJECTED => matches!(version, FACT_VERSION | FACT_VERSION_DETAILED),
            _ => version == FACT_VERSION,
        };
        if !known {
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
            TAG_REJECTED if version == FACT_VERSION => {
                let r: RejectedV1 = postcard::from_bytes(payload).map_err(err)?;
                Fact {
                    seq,
                    at: Timestamp(r.at),
                    client: r.client,
                    key: r.key,
                    body: FactBody::CommandRejected {
                        command: r.command,
                        rejection: r.rejection,
                        detail: None,
                    },
                }
            }
            TAG_REJECTED => {
                let r: RejectedV2 = postcard::from_bytes(payload).map_err(err)?;
                // The core pairs each detail with one rejection; a record pairing them
                // otherwise would answer a client with a figure about something else.
                if r.detail.rejection() != r.rejection {
                    return Err(DecodeError::new(
                        "fact",
                        format!("seq {seq}: a rejection's detail belongs to another rejection"),
                    ));
                }
                Fact {
                    seq,
                    at: Timestamp(r.at),
                    client: r.client,
                    key: r.key,
                    body: FactBody::CommandRejected {
                        command: r.command,
                        rejection: r.rejection,
                        detail: Some(r.detail),
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
        if !fact.encodes_as(bytes) {
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
    /// The figure the rejection was decided on, as its fact keeps it.
    pub detail: Option<RejectionDetail>,
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
            FactBody::CommandRejected {
                rejection, detail, ..
            } => Outcome::Rejected(RejectionReceipt {
                key: fact.key.clone(),
                command,
                rejection: *rejection,
                detail: *detail,
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

    /// When the command was first executed: its fact's time.
    pub fn created_at(&self) -> Timestamp {
        match self {
            Outcome::Applied(r) => r.created_at,
            Outcome::Rejected(r) => r.created_at,
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

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::domain::{Account, Amount, ClientId, Currency, Key};
    use crate::json;

    /// A deposit of one kopeck to alice: the fact the encoding's and the JSON's tests
    /// start from.
    pub(crate) fn deposit() -> Fact {
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
                detail: None,
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

    fn rejected_withdrawal(rejection: Rejection, detail: Option<RejectionDetail>) -> Fact {
        Fact {
            seq: 9,
            at: Timestamp(1_800_000_000_000),
            client: ClientId::default_client(),
            key: Key::parse("w-9").unwrap(),
            body: FactBody::CommandRejected {
                command: Command::Withdraw {
                    account: Account::parse("alice").unwrap(),
                    amount: Amount::new(700).unwrap(),
                    currency: Currency::parse("RUB").unwrap(),
                },
                rejection,
                detail,
            },
        }
    }

    /// A rejection without a detail (every one recorded before details were kept) is
    /// written as version 1, byte for byte as it always was: the bytes below are what the
    /// encoder wrote before details existed, so the facts on disk decode and encode again
    /// unchanged, and their replays keep their bodies.
    #[test]
    fn a_rejection_without_a_detail_keeps_its_version_1_bytes() {
        let fact = rejected_withdrawal(Rejection::AccountNotFound, None);
        let bytes = fact.encode();
        let before: &[u8] = &[
            4, 1, 128, 192, 226, 133, 227, 104, 7, 100, 101, 102, 97, 117, 108, 116, 3, 119, 45,
            57, 1, 5, 97, 108, 105, 99, 101, 188, 5, 3, 82, 85, 66, 0,
        ];
        assert_eq!(bytes, before);
        assert_eq!(Fact::decode(9, &bytes).unwrap(), fact);
        assert_eq!(json::fact(&fact)["version"], 1);
    }

    /// A rejection with a detail is version 2 and reads back with it; the answer carries
    /// the figure and a sentence, and the log's row the figure.
    #[test]
    fn a_rejection_with_a_detail_is_version_2_and_reads_back_whole() {
        let fact = rejected_withdrawal(
            Rejection::InsufficientFunds,
            Some(RejectionDetail::Balance(500)),
        );
        let bytes = fact.encode();
        assert_eq!(bytes[..2], [4, 2]);
        assert_eq!(Fact::decode(9, &bytes).unwrap(), fact);
        let answer = json::outcome(&Outcome::from_fact(&fact));
        assert_eq!(answer["balance"], 500);
        assert_eq!(answer["amount"], 700);
        assert_eq!(
            answer["detail"],
            "alice's balance is 500, lower than the 700 asked (minor units of RUB); \
             nothing changed"
        );
        let row = json::fact(&fact);
        assert_eq!(
            (row["version"].clone(), row["balance"].clone()),
            (2.into(), 500.into())
        );
        assert!(row.get("detail").is_none());

        let mismatch = rejected_withdrawal(
            Rejection::CurrencyMismatch,
            Some(RejectionDetail::AccountCurrency(
                Currency::parse("USD").unwrap(),
            )),
        );
        let answer = json::outcome(&Outcome::from_fact(&mismatch));
        assert_eq!(answer["account_currency"], "USD");
        assert_eq!(
            answer["detail"],
            "alice holds USD, not RUB; nothing changed"
        );
    }

    /// Each detail belongs to one rejection: a record that pairs it with another is not a
    /// fact the core decided, and is refused as corrupt rather than answered.
    #[test]
    fn a_detail_paired_with_another_rejection_is_refused() {
        let fact = rejected_withdrawal(
            Rejection::CurrencyMismatch,
            Some(RejectionDetail::Balance(500)),
        );
        let err = Fact::decode(9, &fact.encode()).unwrap_err().to_string();
        assert!(err.contains("another rejection"), "{err}");
        // And version 2 exists for rejections only.
        let mut bytes = deposit().encode();
        bytes[1] = 2;
        assert!(Fact::decode(7, &bytes).is_err());
    }

    /// A time written by hand (`write_rfc3339`, as every answer digested by a verify)
    /// reads as chrono writes it: around leap days and centuries, at the ends of the
    /// range written by hand, and beyond them, where chrono writes it.
    #[test]
    fn times_are_written_as_chrono_writes_them() {
        let mut times = vec![
            0,
            1,
            999,
            86_399_999,
            86_400_000,
            951_782_400_000,   // 2000-02-29
            4_107_542_400_000, // 2100-03-01
            253_402_300_799_999,
            253_402_300_800_000,
            -1,
            i64::MIN,
            i64::MAX,
        ];
        // Thirteen days and a bit at a time, from 1970 to 9999.
        let mut t = 0;
        while t < 253_402_300_800_000 {
            times.push(t);
            t += 13 * 86_400_000 + 3_723_456;
        }
        for t in times {
            let mut text = String::new();
            Timestamp(t).write_rfc3339(&mut text);
            assert_eq!(text, Timestamp(t).to_rfc3339(), "{t}");
        }
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
}
