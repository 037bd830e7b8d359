//! The shards of the counted rows (`system_balances`, `counters`): how many, and which one
//! a transaction of this process takes. Held by the store's state (`ShardSlots`) and taken
//! by a group's transaction (`ShardSlot`).

use parking_lot::Mutex;

/// Rows of `system_balances` and `counters` per name; a read sums at most this many rows
/// per name. A transaction holds its shard's row lock until it commits, so two
/// transactions on one shard queue behind each other's WAL flush: each transaction of a
/// process takes a shard no other transaction of the process holds (`ShardSlots`), and
/// processes start at random places among the shards, so a few workers rarely meet.
pub(super) const SHARDS: u64 = 128;

/// The shards no transaction of this process holds, taken and given back around each
/// command's transaction. With more transactions in flight than shards, the extra ones
/// share a shard (`None` from `take`, and the caller picks one round-robin): that only
/// makes them wait on each other, never double-counts.
pub(super) struct ShardSlots {
    free: Mutex<Vec<i16>>,
}

impl ShardSlots {
    /// All shards, handed out from `offset` on.
    pub(super) fn new(offset: u64) -> Self {
        let free = (0..SHARDS)
            .rev()
            .filter_map(|i| i16::try_from((offset + i) % SHARDS).ok())
            .collect();
        Self {
            free: Mutex::new(free),
        }
    }

    pub(super) fn take(&self) -> Option<i16> {
        self.free.lock().pop()
    }

    pub(super) fn give_back(&self, shard: i16) {
        self.free.lock().push(shard);
    }
}

/// A shard taken for one transaction; given back when dropped (also when the attempt is
/// cut short).
pub(super) struct ShardSlot<'a> {
    slots: &'a ShardSlots,
    shard: Option<i16>,
}

impl<'a> ShardSlot<'a> {
    pub(super) fn take(slots: &'a ShardSlots) -> Self {
        Self {
            slots,
            shard: slots.take(),
        }
    }

    /// The shard taken, if one was free.
    pub(super) fn shard(&self) -> Option<i16> {
        self.shard
    }
}

impl Drop for ShardSlot<'_> {
    fn drop(&mut self) {
        if let Some(shard) = self.shard {
            self.slots.give_back(shard);
        }
    }
}

/// Where this process starts among the shards: different for workers started together.
pub(super) fn rand_offset() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish()
}
