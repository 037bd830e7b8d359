//! The index as the decider and the log reader see it: ordered byte records, read by key
//! and by range. In the store it is sled's tree; in the deterministic simulation it is a
//! map in memory ([`MemIndex`]) that the simulation applies groups to and cuts at crashes.
//! The decider reads through this seam only, so the simulation runs the product's decider.

use std::collections::BTreeMap;
use std::ops::Bound;

use sled::IVec;

use super::journal::{Group, Op};
use super::records::{
    GROUP_KEY, P_ACCOUNT, P_FACT, P_INBOX, P_KEY, P_QUARANTINE, P_REFUNDED, P_STATEMENT,
    STATEMENTS_READY_KEY, STATS_KEY, decode, decode_balance, seq_of, split_scoped,
};
pub use super::records::{InboxRecord, KeyRecord};
use crate::domain::{Account, ClientId, Currency, Key, MessageId};
use crate::fact::Fact;
use crate::projection::Stats;

/// One record of the index: its key and value.
pub type Record = (IVec, IVec);

/// Ordered byte records, read by key and by inclusive range.
pub trait Index {
    /// The records of a range, in key order, from either end.
    type Range<'a>: DoubleEndedIterator<Item = sled::Result<Record>>
    where
        Self: 'a;

    fn get(&self, key: &[u8]) -> sled::Result<Option<IVec>>;

    /// The records with keys in `from..=to`.
    fn records<'a>(&'a self, from: &[u8], to: &[u8]) -> Self::Range<'a>;
}

impl Index for sled::Tree {
    type Range<'a> = sled::Iter;

    fn get(&self, key: &[u8]) -> sled::Result<Option<IVec>> {
        sled::Tree::get(self, key)
    }

    fn records(&self, from: &[u8], to: &[u8]) -> sled::Iter {
        self.range(from..=to)
    }
}

/// An index in memory: what the simulation keeps as sled's tree, and what unit tests of
/// the decider read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemIndex {
    pub map: BTreeMap<Vec<u8>, IVec>,
}

impl MemIndex {
    pub fn insert(&mut self, key: &[u8], value: &[u8]) {
        self.map.insert(key.to_vec(), value.into());
    }

    pub fn remove(&mut self, key: &[u8]) {
        self.map.remove(key);
    }

    /// Applies a group's operations, as the syncer applies them to sled.
    pub fn apply(&mut self, group: &Group) {
        for op in &group.ops {
            self.apply_op(op);
        }
    }

    pub fn apply_op(&mut self, op: &Op) {
        match op {
            Op::Put { key, value } => self.insert(key, value),
            Op::Remove { key } => self.remove(key),
        }
    }
}

impl Index for MemIndex {
    type Range<'a> = Box<dyn DoubleEndedIterator<Item = sled::Result<Record>> + 'a>;

    fn get(&self, key: &[u8]) -> sled::Result<Option<IVec>> {
        Ok(self.map.get(key).cloned())
    }

    fn records<'a>(&'a self, from: &[u8], to: &[u8]) -> Self::Range<'a> {
        if from > to {
            // sled reads an inverted range as empty; a map would panic on it.
            return Box::new(std::iter::empty());
        }
        let range = (Bound::Included(from), Bound::Included(to));
        Box::new(
            self.map
                .range::<[u8], _>(range)
                .map(|(k, v)| Ok((IVec::from(k.as_slice()), v.clone()))),
        )
    }
}

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
