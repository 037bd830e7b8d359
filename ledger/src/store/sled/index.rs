//! The index as the decider and the log reader see it: ordered byte records, read by key
//! and by range. In the store it is sled's tree; in the deterministic simulation it is a
//! map in memory ([`MemIndex`]) that the simulation applies groups to and cuts at crashes.
//! The decider reads through this seam only, so the simulation runs the product's decider.

use std::collections::BTreeMap;
use std::ops::Bound;

use sled::IVec;

use super::journal::{Group, Op};

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

    /// Every record, in key order.
    fn all(&self) -> Self::Range<'_>;
}

impl Index for sled::Tree {
    type Range<'a> = sled::Iter;

    fn get(&self, key: &[u8]) -> sled::Result<Option<IVec>> {
        sled::Tree::get(self, key)
    }

    fn records(&self, from: &[u8], to: &[u8]) -> sled::Iter {
        self.range(from..=to)
    }

    fn all(&self) -> sled::Iter {
        self.iter()
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

    fn all(&self) -> Self::Range<'_> {
        Box::new(
            self.map
                .iter()
                .map(|(k, v)| Ok((IVec::from(k.as_slice()), v.clone()))),
        )
    }
}
