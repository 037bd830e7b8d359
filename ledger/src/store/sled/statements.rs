//! Account statements on sled: one entry per movement under its user account
//! (`records::statement_key`), written by the committer in the batch of the fact, so an
//! account's movements are read in order without reading the rest of the log.

use crate::domain::Account;
use crate::fact::{DecodeError, Fact};
use crate::projection::statement_line;
use crate::store::LedgerError;

use super::records::{STATEMENTS_READY_KEY, io_err, split_statement, statement_key};
use super::{Result, Shared, open_err};

/// Entries written per `apply_batch` while a ledger made before statements is brought up
/// to date, so that memory stays small whatever the log's length.
const ENTRIES_PER_BATCH: usize = 10_000;

/// Makes sure every movement of the log has its statement entry: a ledger made before
/// statements existed gets them once, at its first open by this build. The entries are
/// flushed before the mark that says they are complete is written, so a crash in between
/// only makes the next open write them again (writing an entry twice changes nothing).
/// Returns how many entries were written.
pub(super) fn complete(db: &sled::Db, tree: &sled::Tree, shown: &str) -> Result<u64> {
    if tree
        .contains_key(STATEMENTS_READY_KEY)
        .map_err(|e| open_err(shown, e))?
    {
        return Ok(0);
    }
    let corrupt = |detail: String| LedgerError::Corrupt {
        path: shown.to_owned(),
        detail,
    };
    let mut written = 0u64;
    let mut batch = sled::Batch::default();
    let mut in_batch = 0usize;
    for item in super::log::Facts::new(tree, 1, u64::MAX).map_err(|e| open_err(shown, e))? {
        let entry = item
            .map_err(|e| open_err(shown, e))?
            .map_err(|d| corrupt(d.error.to_string()))?;
        let seq = entry.seq;
        let fact = entry.decode().map_err(|e| corrupt(e.to_string()))?;
        if let Some(line) = statement_line(&fact) {
            batch.insert(statement_key(line.account, seq), &[][..]);
            in_batch += 1;
            written += 1;
        }
        if in_batch == ENTRIES_PER_BATCH {
            tree.apply_batch(std::mem::take(&mut batch))
                .map_err(|e| open_err(shown, e))?;
            in_batch = 0;
        }
    }
    tree.apply_batch(batch).map_err(|e| open_err(shown, e))?;
    db.flush().map_err(|e| open_err(shown, e))?;
    tree.insert(STATEMENTS_READY_KEY, &[][..])
        .map_err(|e| open_err(shown, e))?;
    db.flush().map_err(|e| open_err(shown, e))?;
    Ok(written)
}

/// The account's movements with `seq > after` and at most `durable`, in order, at most
/// `limit`. Each entry's fact is read and must be a movement of this account: an entry
/// that points elsewhere is corruption, reported rather than shown.
pub(super) fn read(
    shared: &Shared,
    account: &Account,
    after: u64,
    durable: u64,
    limit: usize,
) -> Result<Vec<Fact>> {
    if after >= durable {
        return Ok(Vec::new());
    }
    let start = statement_key(account, after.saturating_add(1));
    let end = statement_key(account, durable);
    let mut out = Vec::new();
    for item in shared.tree.range(start..=end).take(limit) {
        let (k, _) = item.map_err(io_err)?;
        let seq = split_statement(&k)
            .map(|(_, seq)| seq)
            .ok_or_else(|| shared.corrupt(DecodeError::new("statement entry", "length")))?;
        let fact = shared.fact(seq)?.ok_or_else(|| {
            shared.corrupt(DecodeError::new(
                "statement entry",
                format!("{account}'s entry at seq {seq} has no fact"),
            ))
        })?;
        if statement_line(&fact).is_none_or(|line| line.account != account) {
            return Err(shared.corrupt(DecodeError::new(
                "statement entry",
                format!("{account}'s entry at seq {seq} is not a movement of the account"),
            )));
        }
        out.push(fact);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// An account whose name is the start of another's never reads the other's entries:
    /// the name ends with a NUL, which no name holds.
    #[test]
    fn one_account_s_range_holds_no_other_account() {
        let alice = Account::parse("alice").unwrap();
        let alice2 = Account::parse("alice2").unwrap();
        let range = statement_key(&alice, 0)..=statement_key(&alice, u64::MAX);
        assert!(!range.contains(&statement_key(&alice2, 5)));
        assert!(range.contains(&statement_key(&alice, 5)));
        let k = statement_key(&alice, 258);
        assert_eq!(split_statement(&k), Some((&b"alice"[..], 258)));
    }
}
