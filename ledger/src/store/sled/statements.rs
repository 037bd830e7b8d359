//! Account statements on sled: runs of an account's movements under its user account
//! (`records::statement_key`), written by the committer in the group of their facts, so an
//! account's movements are read in order without reading the rest of the log.
//!
//! A record's key holds the first seq of its run, its value the others as the increases
//! from one to the next: an empty value is a run of one. The committer extends an
//! account's last run while it is short (see [`Tail`]) and starts a new one otherwise, so
//! an account with many movements costs sled one record per [`RUN_SEQS`] of them, not one
//! each: sled splits its leaves at 17 records, and every record is read back one by one
//! by each verify. The runs of an account never overlap: a run is extended only with a
//! seq above its last, and a new one starts above every earlier one.

use crate::domain::Account;
use crate::fact::{DecodeError, Fact};
use crate::projection::statement_line;
use crate::store::LedgerError;

use super::error::{Result, open_err};
use super::journal::{put_varint, take_varint};
use super::records::{
    STATEMENTS_READY_KEY, io_err, split_statement, statement_key, statement_prefix,
};
use super::shared::Shared;

/// The most movements one record holds. A run is rewritten whole at each movement it
/// takes (once per group, at most), so a longer run costs sled more bytes per write.
pub(super) const RUN_SEQS: usize = 32;
/// The most bytes a run's value takes: 96 holds 32 increases of up to 2^14.
pub(super) const RUN_BYTES: usize = 96;
/// The first byte of a run of more than one seq; an empty value is a run of one.
const RUN_TAG: u8 = 1;

/// The seqs of a statement record whose key holds `first`, in order.
pub(super) fn run_seqs(first: u64, value: &[u8]) -> std::result::Result<Vec<u64>, String> {
    let mut seqs = vec![first];
    let Some((&tag, mut rest)) = value.split_first() else {
        return Ok(seqs);
    };
    if tag != RUN_TAG {
        return Err(format!("a statement record of unknown kind {tag}"));
    }
    if rest.is_empty() {
        return Err("a statement run with no increase".into());
    }
    let mut last = first;
    while !rest.is_empty() {
        let step = take_varint(&mut rest)?;
        if step == 0 {
            return Err("a statement run that does not increase".into());
        }
        last = last
            .checked_add(step)
            .ok_or_else(|| "a statement run past the last seq".to_string())?;
        seqs.push(last);
    }
    Ok(seqs)
}

/// An account's last statement run, as the committer extends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Tail {
    first: u64,
    last: u64,
    len: usize,
    value: Vec<u8>,
}

impl Tail {
    /// A new run holding `seq` alone.
    pub(super) fn start(seq: u64) -> Self {
        Self {
            first: seq,
            last: seq,
            len: 1,
            value: Vec::new(),
        }
    }

    /// Adds `seq` to the run; false if the run is full (or `seq` is not above its last),
    /// and the caller starts a new one.
    pub(super) fn push(&mut self, seq: u64) -> bool {
        if self.len >= RUN_SEQS || self.value.len() + 10 > RUN_BYTES || seq <= self.last {
            return false;
        }
        if self.value.is_empty() {
            self.value.push(RUN_TAG);
        }
        put_varint(&mut self.value, seq - self.last);
        self.last = seq;
        self.len += 1;
        true
    }

    /// The run's record: its key under `account`, and its value.
    pub(super) fn record(&self, account: &Account) -> (Vec<u8>, Vec<u8>) {
        (statement_key(account, self.first), self.value.clone())
    }

    /// Heap bytes the run's value takes.
    pub(super) fn heap(&self) -> usize {
        self.value.capacity()
    }
}

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
            // A run of one each: this runs once per ledger, and reads as any run does.
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

/// sled's statement records and the deferred runs taken before them, each in key order,
/// as one sequence in key order. A run in both is the same run, and the deferred copy holds
/// every seq the reader may show: it was taken after the durable seq was read, so it is
/// as new as any group up to it, and sled's copy may be older.
pub(super) fn merged(
    sled: impl Iterator<Item = sled::Result<(sled::IVec, sled::IVec)>>,
    deferred: Vec<(Vec<u8>, sled::IVec)>,
) -> impl Iterator<Item = sled::Result<(sled::IVec, sled::IVec)>> {
    use std::cmp::Ordering;
    let mut sled = sled.peekable();
    let mut deferred = deferred.into_iter().peekable();
    std::iter::from_fn(move || {
        let order = match (sled.peek(), deferred.peek()) {
            (None, None) => return None,
            (Some(Err(_)), _) | (Some(Ok(_)), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some(Ok((s, _))), Some((d, _))) => s.as_ref().cmp(d.as_slice()),
        };
        if order == Ordering::Less {
            return sled.next();
        }
        if order == Ordering::Equal {
            sled.next();
        }
        deferred.next().map(|(k, v)| Ok((k.into(), v)))
    })
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
    let corrupt = |detail: String| shared.corrupt(DecodeError::new("statement entry", detail));
    let prefix = statement_prefix(account);
    let first = statement_key(account, after.saturating_add(1));
    let end = statement_key(account, durable);
    // The runs sled has not taken yet are read first (see `Shared::deferred_runs`).
    let deferred = shared.deferred_runs(prefix.clone()..=end.clone());
    // The run that holds `after + 1` may start below it: it is the account's last run
    // starting at or below that seq (runs never overlap), in sled or kept aside, then come
    // the runs after it.
    let in_sled = match shared.tree.range(prefix..=first.clone()).next_back() {
        Some(item) => Some(item.map_err(io_err)?.0.to_vec()),
        None => None,
    };
    let deferred_below = deferred.iter().rev().find(|(k, _)| *k <= first);
    let start = in_sled
        .max(deferred_below.map(|(k, _)| k.clone()))
        .unwrap_or(first);
    let deferred = deferred.into_iter().filter(|(k, _)| *k >= start).collect();
    let mut out = Vec::new();
    for item in merged(shared.tree.range(start..=end), deferred) {
        let (k, v) = item.map_err(io_err)?;
        let first = split_statement(&k)
            .map(|(_, seq)| seq)
            .ok_or_else(|| corrupt("length".into()))?;
        let seqs =
            run_seqs(first, &v).map_err(|e| corrupt(format!("{account}'s run at {first}: {e}")))?;
        for seq in seqs.into_iter().filter(|s| *s > after && *s <= durable) {
            if out.len() == limit {
                return Ok(out);
            }
            out.push(movement(shared, account, seq)?);
        }
    }
    Ok(out)
}

/// The account's last movement with a seq at most `cut` (a durable seq), or `None`
/// before its first: the run that starts at or below `cut` is the account's last such
/// run (runs never overlap), in sled or kept aside, so one run is read, whatever the
/// length of the log or of the account's statement.
pub(super) fn last_at(shared: &Shared, account: &Account, cut: u64) -> Result<Option<Fact>> {
    if cut == 0 {
        return Ok(None);
    }
    let corrupt = |detail: String| shared.corrupt(DecodeError::new("statement entry", detail));
    let prefix = statement_prefix(account);
    let end = statement_key(account, cut);
    let kept = shared.deferred_runs(prefix.clone()..=end.clone()).pop();
    let in_sled = match shared.tree.range(prefix..=end).next_back() {
        Some(item) => {
            let (k, v) = item.map_err(io_err)?;
            Some((k.to_vec(), v))
        }
        None => None,
    };
    // A run in both is the same run, and the copy kept aside is the newer.
    let run = match (in_sled, kept) {
        (None, None) => return Ok(None),
        (Some(run), None) | (None, Some(run)) => run,
        (Some(sled), Some(kept)) => {
            if kept.0 >= sled.0 {
                kept
            } else {
                sled
            }
        }
    };
    let first = split_statement(&run.0)
        .map(|(_, seq)| seq)
        .ok_or_else(|| corrupt("length".into()))?;
    let seqs =
        run_seqs(first, &run.1).map_err(|e| corrupt(format!("{account}'s run at {first}: {e}")))?;
    let Some(seq) = seqs.into_iter().rfind(|s| *s <= cut) else {
        return Ok(None);
    };
    movement(shared, account, seq).map(Some)
}

/// The fact of `account`'s statement entry at `seq`, which must be a movement of the
/// account: an entry that points elsewhere is corruption, reported rather than shown.
fn movement(shared: &Shared, account: &Account, seq: u64) -> Result<Fact> {
    let corrupt = |detail: String| shared.corrupt(DecodeError::new("statement entry", detail));
    let fact = shared
        .fact(seq)?
        .ok_or_else(|| corrupt(format!("{account}'s entry at seq {seq} has no fact")))?;
    if statement_line(&fact).is_none_or(|line| line.account != account) {
        return Err(corrupt(format!(
            "{account}'s entry at seq {seq} is not a movement of the account"
        )));
    }
    Ok(fact)
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

    /// sled's records and the deferred runs come out as one sequence in key order; under a
    /// key in both, the deferred run replaces sled's; sled's errors come through.
    #[test]
    fn deferred_runs_merge_into_sled_s_in_order_and_replace_theirs() {
        let rec = |k: &str, v: &str| -> (sled::IVec, sled::IVec) {
            (k.as_bytes().into(), v.as_bytes().into())
        };
        let sled_side = vec![
            Ok(rec("b", "sled")),
            Ok(rec("d", "sled")),
            Ok(rec("f", "sled")),
        ];
        let deferred = ["a", "d", "e", "g"]
            .iter()
            .map(|k| (k.as_bytes().to_vec(), sled::IVec::from("deferred")))
            .collect();
        let got: Vec<(String, String)> = merged(sled_side.into_iter(), deferred)
            .map(|r| {
                let (k, v) = r.unwrap();
                (
                    String::from_utf8(k.to_vec()).unwrap(),
                    String::from_utf8(v.to_vec()).unwrap(),
                )
            })
            .collect();
        let want = [
            ("a", "deferred"),
            ("b", "sled"),
            ("d", "deferred"),
            ("e", "deferred"),
            ("f", "sled"),
            ("g", "deferred"),
        ];
        assert_eq!(
            got,
            want.map(|(k, v)| (k.to_string(), v.to_string())).to_vec()
        );
        let failing = vec![
            Ok(rec("a", "sled")),
            Err(sled::Error::Unsupported("gone".into())),
        ];
        let deferred = vec![(b"b".to_vec(), sled::IVec::from("deferred"))];
        let got: Vec<_> = merged(failing.into_iter(), deferred).collect();
        assert!(got[0].is_ok() && got[1].is_err(), "{got:?}");
        assert_eq!(got.len(), 3);
    }

    /// A run reads back the seqs pushed into it, and closes at its length or its bytes.
    #[test]
    fn a_run_holds_what_was_pushed_until_it_is_full() {
        let mut tail = Tail::start(7);
        assert_eq!(run_seqs(7, &tail.value).unwrap(), vec![7]);
        let mut pushed = vec![7];
        let mut seq = 7;
        while tail.push(seq + 3) {
            seq += 3;
            pushed.push(seq);
        }
        assert_eq!(pushed.len(), RUN_SEQS);
        assert_eq!(run_seqs(7, &tail.value).unwrap(), pushed);
        // Large steps fill the bytes first; a seq not above the last is refused.
        let mut tail = Tail::start(1);
        let mut n = 1;
        while tail.push(1 + n * (1 << 40)) {
            n += 1;
        }
        assert!(tail.value.len() <= RUN_BYTES && n < RUN_SEQS as u64);
        assert!(!Tail::start(5).push(5));
    }

    /// A damaged run is an error, never other seqs.
    #[test]
    fn a_damaged_run_is_refused() {
        assert!(run_seqs(1, &[2, 1]).is_err());
        assert!(run_seqs(1, &[RUN_TAG]).is_err());
        assert!(run_seqs(1, &[RUN_TAG, 0]).is_err());
        assert!(run_seqs(1, &[RUN_TAG, 0x80]).is_err());
        assert!(run_seqs(u64::MAX, &[RUN_TAG, 1]).is_err());
        assert_eq!(
            run_seqs(1, &[RUN_TAG, 1, 0x81, 0x01]).unwrap(),
            vec![1, 2, 131]
        );
    }
}
