//! What a store keeps in memory besides its storage engine's cache: each structure that
//! grows with use, how many entries it holds, its bound and its estimated size, so that
//! `/metrics` can show where a worker's memory goes and what caps it.

use std::collections::BTreeMap;

use crate::domain::{Account, ClientId, Command, Currency, Key};
use crate::fact::Outcome;
use crate::projection::Balances;

/// One in-memory structure and its bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryUse {
    /// A short name: `answers`, `claims`, `activity`, `balances`, ...
    pub structure: &'static str,
    pub entries: u64,
    /// The most entries it keeps, or what bounds it where that is no fixed number.
    pub limit: Limit,
    /// Estimated bytes: each entry's size, the heap strings it owns (rounded up to the
    /// allocator's 16-byte granularity) and the hash table's slack.
    pub bytes: u64,
    /// What it can take at its limit, estimated at names (keys, clients, accounts) of
    /// [`NAME_BYTES`]; `None` where the limit is no number of entries.
    pub bound_bytes: Option<u64>,
}

/// The name length the bounds assume. Longer keys and names raise the caches' share in
/// proportion to their heap strings.
pub const NAME_BYTES: usize = 64;

/// What bounds a structure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// A fixed number of entries; past it the structure forgets (wholesale or oldest first).
    Entries(u64),
    /// One entry per request in flight: bounded by the connections and the inbox's prefetch.
    InFlight,
    /// One entry per (account, currency) the ledger has: it grows with accounts, not keys.
    Accounts,
    /// A cache bounded in bytes by its setting (sled's page cache). Its `bytes` is that
    /// setting: sled counts pages at their size on disk, so the memory it really takes is
    /// a multiple of it (docs/operations.md, "Memory").
    Bytes(u64),
}

impl Limit {
    pub fn label(self) -> &'static str {
        match self {
            Limit::Entries(_) => "entries",
            Limit::InFlight => "in_flight",
            Limit::Accounts => "accounts",
            Limit::Bytes(_) => "bytes",
        }
    }
}

/// A heap string's allocation: glibc and mimalloc both round small blocks up to 16 bytes.
pub fn heap_str(len: usize) -> u64 {
    if len == 0 {
        0
    } else {
        (len as u64).div_ceil(16) * 16
    }
}

/// A hash map entry of `slot` bytes: hashbrown keeps one control byte per slot and
/// leaves an eighth of its slots empty at most.
pub fn slot(slot: usize) -> u64 {
    (slot as u64 + 1) * 8 / 7
}

/// An entry of `slot` bytes owning `strings` heap strings of [`NAME_BYTES`], `n` times.
pub fn at_limit(n: u64, slot_bytes: usize, strings: u64) -> u64 {
    n * (slot(slot_bytes) + strings * heap_str(NAME_BYTES))
}

pub fn key_heap(client: &ClientId, key: &Key) -> u64 {
    heap_str(client.as_str().len()) + heap_str(key.as_str().len())
}

pub fn command_heap(command: &Command) -> u64 {
    match command {
        Command::Deposit { account, .. } | Command::Withdraw { account, .. } => {
            heap_str(account.as_str().len())
        }
        Command::Refund { withdrawal, .. } => heap_str(withdrawal.as_str().len()),
    }
}

pub fn outcome_heap(outcome: &Outcome) -> u64 {
    match outcome {
        Outcome::Applied(r) => {
            heap_str(r.key.as_str().len())
                + command_heap(&r.command)
                + heap_str(r.account.as_str().len())
        }
        Outcome::Rejected(r) => heap_str(r.key.as_str().len()) + command_heap(&r.command),
    }
}

/// An empty tally of one structure, to be counted up.
pub fn use_of(structure: &'static str, limit: Limit, bound_bytes: Option<u64>) -> MemoryUse {
    MemoryUse {
        structure,
        entries: 0,
        limit,
        bytes: 0,
        bound_bytes,
    }
}

/// The balances every store keeps in memory: one entry per (account, currency), in
/// B-trees whose nodes hold eleven entries and are about two thirds full.
pub fn balances_use(balances: &Balances) -> MemoryUse {
    balances_use_of("balances", &balances.accounts)
}

/// The memory of a map of balances by account, named `structure`.
pub fn balances_use_of<'a>(
    structure: &'static str,
    accounts: impl IntoIterator<Item = (&'a Account, &'a BTreeMap<Currency, i128>)>,
) -> MemoryUse {
    let mut entries = 0;
    let mut bytes = 0;
    for (account, by_currency) in accounts {
        entries += by_currency.len() as u64;
        bytes += (std::mem::size_of::<(Account, BTreeMap<Currency, i128>)>() as u64) * 3 / 2
            + heap_str(account.as_str().len())
            + (std::mem::size_of::<(Currency, i128)>() as u64) * 3 / 2 * by_currency.len() as u64;
    }
    MemoryUse {
        structure,
        entries,
        limit: Limit::Accounts,
        bytes,
        bound_bytes: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_round_up_to_the_allocators_blocks() {
        assert_eq!(heap_str(0), 0);
        assert_eq!(heap_str(1), 16);
        assert_eq!(heap_str(16), 16);
        assert_eq!(heap_str(17), 32);
    }

    #[test]
    fn slots_carry_their_control_byte_and_slack() {
        assert_eq!(slot(6), 8);
        assert_eq!(slot(55), 64);
    }
}
