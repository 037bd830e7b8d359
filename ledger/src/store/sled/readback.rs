//! The index's records decoded into values: what the deterministic simulation compares
//! with its reference model after every step, reading the records the product wrote with
//! the product's own decoders.

use super::records::{
    GROUP_KEY, P_ACCOUNT, P_FACT, P_INBOX, P_KEY, P_QUARANTINE, P_REFUNDED, P_STATEMENT,
    STATEMENTS_READY_KEY, STATS_KEY, decode, decode_balance, seq_of, split_scoped,
};
pub use super::records::{InboxRecord, KeyRecord};
use crate::domain::{Account, ClientId, Currency, Key, MessageId};
use crate::fact::Fact;
use crate::projection::Stats;

/// One record of the index, decoded: what the simulation's checks compare with the
/// reference model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    /// A log record: one fact, or a block of consecutive ones.
    Facts(Vec<Fact>),
    Key(ClientId, Key, KeyRecord),
    Balance(Account, Currency, i128),
    /// A withdrawal's refunded total, under the withdrawal's key.
    Refunded(ClientId, Key, u64),
    Inbox(MessageId, InboxRecord),
    /// A quarantined message, by its id.
    Quarantined(u64),
    Stats(Stats),
    /// A statement run, the journal's checkpoint mark, or the statements' mark: derived
    /// records the checks do not compare.
    Derived,
}

/// Decodes one record of the index; the error names what could not be read.
pub fn decode_record(key: &[u8], value: &[u8]) -> Result<Decoded, String> {
    let bad = |what: &str| format!("the {what} record under {key:?} cannot be read");
    if key == STATS_KEY {
        return decode::<Stats>("stats", value)
            .map(Decoded::Stats)
            .map_err(|e| e.to_string());
    }
    if key == GROUP_KEY || key == STATEMENTS_READY_KEY {
        return Ok(Decoded::Derived);
    }
    match key.first() {
        Some(&P_FACT) => {
            let list = super::log::entries(key, value.into()).map_err(|d| d.error.to_string())?;
            list.iter()
                .map(|e| e.decode().map_err(|e| e.to_string()))
                .collect::<Result<Vec<_>, _>>()
                .map(Decoded::Facts)
        }
        Some(&P_KEY) => {
            let (client, k) = split_scoped(key).ok_or_else(|| bad("key"))?;
            let rec = KeyRecord::decode(value).map_err(|e| e.to_string())?;
            Ok(Decoded::Key(client, k, rec))
        }
        Some(&P_ACCOUNT) => {
            let (account, currency, b) =
                decode_balance(key, value).ok_or_else(|| bad("balance"))?;
            Ok(Decoded::Balance(account, currency, b))
        }
        Some(&P_REFUNDED) => {
            let (client, k) = split_scoped(key).ok_or_else(|| bad("refunded"))?;
            let total: [u8; 8] = value.try_into().map_err(|_| bad("refunded"))?;
            Ok(Decoded::Refunded(client, k, u64::from_be_bytes(total)))
        }
        Some(&P_INBOX) => {
            let id = std::str::from_utf8(&key[1..])
                .ok()
                .and_then(|s| MessageId::parse(s).ok())
                .ok_or_else(|| bad("inbox"))?;
            let rec = decode::<InboxRecord>("inbox record", value).map_err(|e| e.to_string())?;
            Ok(Decoded::Inbox(id, rec))
        }
        Some(&P_QUARANTINE) => seq_of(key)
            .map(Decoded::Quarantined)
            .ok_or_else(|| bad("quarantine")),
        Some(&P_STATEMENT) => Ok(Decoded::Derived),
        _ => Err(bad("unknown")),
    }
}
