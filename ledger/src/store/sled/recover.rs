//! The index brought back to the log of record after a stop, over any file system
//! ([`Fs`]) and any index ([`Writable`]): the steps of an open that decide what a crash
//! left, with no thread, clock or sled of their own. The sled store's open and rebuild run
//! them over the disk and sled's tree; the deterministic simulation runs the same steps
//! over its simulated disk and an index in memory, after every crash it makes.
//!
//! The steps, in the order an open takes them:
//!
//! 1. [`lost_index`]: an index with nothing in it beside a journal with a base has lost
//!    its files; it must be rebuilt, not replayed into.
//! 2. [`replay`]: the journal opened (its torn tail cut, damage followed by whole records
//!    refused) and every group after the index's checkpoint applied to the index. A
//!    journal that does not continue the checkpoint says the index is not to be trusted.
//! 3. [`check`]: the log's last fact, its key record and the stats agree, and the balances
//!    sum to zero per currency.
//!
//! When the index cannot be trusted and the log of record is complete (a base exists),
//! [`rebuild_into`] builds a new one from the newest base and every group after it; the
//! sled store's rebuild reads the same [`pieces`] and inserts them on several threads.
//! [`write_base`] / [`ensure_base`] write the base a compaction or an open needs.

use std::path::{Path, PathBuf};

use super::error::Result;
use super::index::Index;
use super::journal::{
    Fs, Group, Journal, JournalError, JournalOptions, Op, Truncated, list_bases_with,
    read_base_with, read_groups_with, write_base_with,
};
use super::log;
use super::records::{
    GROUP_KEY, KeyRecord, P_ACCOUNT, P_KEY, STATS_KEY, decode, decode_balance, scoped_key,
};
use crate::fact::Fact;
use crate::projection::{Balances, Stats};
use crate::store::LedgerError;

/// An index that recovery can write to: sled's tree, or an index in memory.
pub trait Writable: Index {
    fn put(&mut self, key: &[u8], value: &[u8]) -> sled::Result<()>;
    fn delete(&mut self, key: &[u8]) -> sled::Result<()>;

    fn apply(&mut self, op: &Op) -> sled::Result<()> {
        match op {
            Op::Put { key, value } => self.put(key, value),
            Op::Remove { key } => self.delete(key),
        }
    }
}

impl Writable for sled::Tree {
    fn put(&mut self, key: &[u8], value: &[u8]) -> sled::Result<()> {
        self.insert(key, value).map(drop)
    }

    fn delete(&mut self, key: &[u8]) -> sled::Result<()> {
        self.remove(key).map(drop)
    }
}

impl Writable for super::index::MemIndex {
    fn put(&mut self, key: &[u8], value: &[u8]) -> sled::Result<()> {
        self.insert(key, value);
        Ok(())
    }

    fn delete(&mut self, key: &[u8]) -> sled::Result<()> {
        self.remove(key);
        Ok(())
    }
}

/// An error met while recovering, and whether it says the index's own records cannot be
/// trusted (`true`: a rebuild from the log of record heals it).
pub type Failed = (LedgerError, bool);

fn corrupt(shown: &str, detail: impl Into<String>) -> LedgerError {
    LedgerError::Corrupt {
        path: shown.to_owned(),
        detail: detail.into(),
    }
}

fn read_err(shown: &str, e: sled::Error) -> Failed {
    heal(super::error::open_err(shown, e))
}

/// An error marked as one a rebuild heals when it says the index is damaged.
pub fn heal(e: LedgerError) -> Failed {
    let damaged = matches!(e, LedgerError::Corrupt { .. });
    (e, damaged)
}

/// Whether the log of record reaches back to the ledger's start: a base exists.
pub fn log_is_complete<F: Fs>(fs: &F, dir: &Path) -> Result<bool> {
    Ok(!list_bases_with(fs, dir)?.is_empty())
}

/// Refuses an index that holds nothing while the journal holds the ledger (a base): its
/// files were lost, and replaying the groups after its (absent) checkpoint would miss the
/// base's records.
pub fn lost_index<F: Fs, I: Index>(
    fs: &F,
    dir: &Path,
    index: &I,
    shown: &str,
) -> std::result::Result<(), Failed> {
    let empty = index.all().next().is_none();
    if empty && log_is_complete(fs, dir).map_err(|e| (e, false))? {
        return Err((
            corrupt(
                shown,
                "the index is empty, and the journal holds the ledger",
            ),
            true,
        ));
    }
    Ok(())
}

/// The last group the index holds durably (its checkpoint, `v.journal`; 0: none).
pub fn checkpoint<I: Index>(index: &I, shown: &str) -> std::result::Result<u64, Failed> {
    match index.get(GROUP_KEY).map_err(|e| read_err(shown, e))? {
        None => Ok(0),
        Some(v) => Ok(u64::from_be_bytes(v.as_ref().try_into().map_err(|_| {
            heal(corrupt(
                shown,
                "the journal group record has the wrong length",
            ))
        })?)),
    }
}

/// The journal opened and replayed into the index.
pub struct Replayed<F: Fs> {
    /// Ready for the next group.
    pub journal: Journal<F>,
    /// The groups applied to the index, in order.
    pub groups: Vec<Group>,
    /// The index's checkpoint it found.
    pub checkpoint: u64,
    /// The torn or damaged tail the journal's open cut off, if any.
    pub truncated: Option<Truncated>,
}

/// Opens the journal in `dir` and applies to `index` every group after the index's
/// checkpoint: after a crash the index may hold any part of them, or none, and groups
/// carry absolute values, so applying them again is harmless. A torn tail is cut off.
/// Damage in the journal followed by whole records refuses (`(e, false)`); a journal that
/// does not continue the checkpoint says the index is not to be trusted (`(e, true)`).
pub fn replay<F: Fs, I: Writable>(
    fs: F,
    dir: &Path,
    options: JournalOptions,
    index: &mut I,
    shown: &str,
) -> std::result::Result<Replayed<F>, Failed> {
    let held = checkpoint(index, shown)?;
    let (journal, recovery) = Journal::open_with(fs, dir, options, held).map_err(|e| {
        let index_is_wrong = matches!(e, JournalError::Discontinuous { .. });
        (LedgerError::from(e), index_is_wrong)
    })?;
    for group in &recovery.groups {
        for op in &group.ops {
            index.apply(op).map_err(|e| read_err(shown, e))?;
        }
    }
    Ok(Replayed {
        journal,
        groups: recovery.groups,
        checkpoint: held,
        truncated: recovery.truncated,
    })
}

/// What [`check`] read of a recovered index.
pub struct Checked {
    /// `None`: a new ledger.
    pub stats: Option<Stats>,
    pub last_fact: Option<Fact>,
    pub balances: Balances,
}

/// Checks a recovered index: the log's last fact, its key record and the stats agree,
/// and the balances sum to zero per currency. Any disagreement is corruption.
pub fn check<I: Index>(index: &I, shown: &str) -> Result<Checked> {
    let (stats, last_fact) = check_tail(index, shown)?;
    let balances = load_balances(index, shown)?;
    Ok(Checked {
        stats,
        last_fact,
        balances,
    })
}

/// Reads the stats record (`None`: a new ledger) and the log's last fact, and checks that
/// they agree with each other and with the fact's key record.
fn check_tail<I: Index>(index: &I, shown: &str) -> Result<(Option<Stats>, Option<Fact>)> {
    let sled_err = |e| super::error::open_err(shown, e);
    let stats: Option<Stats> = match index.get(STATS_KEY).map_err(sled_err)? {
        None => None,
        Some(v) => Some(decode("stats", &v).map_err(|e| corrupt(shown, e.to_string()))?),
    };
    let last_fact = log::last(index)
        .map_err(sled_err)?
        .map_err(|d| corrupt(shown, d.error.to_string()))?
        .map(|e| e.decode())
        .transpose()
        .map_err(|e| corrupt(shown, e.to_string()))?;
    let tail = last_fact.as_ref().map_or(0, |f| f.seq);
    let last_seq = stats.as_ref().map_or(0, |s| s.last_seq);
    if tail != last_seq {
        return Err(corrupt(
            shown,
            format!(
                "the log ends at seq {tail} but the balances and key records were written at \
                 seq {last_seq}"
            ),
        ));
    }
    if let Some(fact) = &last_fact {
        let rec = index
            .get(&scoped_key(P_KEY, &fact.client, fact.key.as_str()))
            .map_err(sled_err)?
            .ok_or_else(|| {
                corrupt(
                    shown,
                    format!("the last fact (seq {tail}) has no key record"),
                )
            })?;
        let rec = KeyRecord::decode(&rec).map_err(|e| corrupt(shown, e.to_string()))?;
        if rec.seq != fact.seq {
            return Err(corrupt(
                shown,
                format!(
                    "the last fact (seq {tail}) and its key record (seq {}) disagree",
                    rec.seq
                ),
            ));
        }
    }
    Ok((stats, last_fact))
}

/// Reads the stored balances and checks that they sum to zero per currency.
fn load_balances<I: Index>(index: &I, shown: &str) -> Result<Balances> {
    let mut balances = Balances::default();
    // The range's inclusive end is the one key `[P_ACCOUNT + 1]`, not a balance.
    for item in index.records(&[P_ACCOUNT], &[P_ACCOUNT + 1]) {
        let (k, v) = item.map_err(|e| super::error::open_err(shown, e))?;
        if k.first() != Some(&P_ACCOUNT) {
            continue;
        }
        let (account, currency, balance) =
            decode_balance(&k, &v).ok_or_else(|| corrupt(shown, "an undecodable balance"))?;
        balances
            .accounts
            .entry(account)
            .or_default()
            .insert(currency, balance);
    }
    for (currency, sum) in balances.sums() {
        if sum != 0 {
            return Err(corrupt(
                shown,
                format!("balances in {currency} sum to {sum}, not 0"),
            ));
        }
    }
    Ok(balances)
}

/// What a rebuild reads: the newest base and the groups after it.
#[derive(Debug, Clone)]
pub struct Plan {
    pub base_group: u64,
    pub base_path: PathBuf,
    /// The journal's last whole group.
    pub last_group: u64,
}

/// Chooses what a rebuild of the index reads, and reads the whole journal once to check
/// it, before anything is changed: no base, or damage in the journal's middle, refuses
/// here (with the damaged index still in place). `reason` says why the index is rebuilt.
pub fn plan<F: Fs>(fs: &F, dir: &Path, reason: &str, shown: &str) -> Result<Plan> {
    let Some((base_group, base_path, _)) = list_bases_with(fs, dir)?.pop() else {
        return Err(corrupt(
            shown,
            format!(
                "the index is damaged ({reason}), and the journal holds no base to rebuild it \
                 from: the ledger was last opened by a build that did not keep its log of \
                 record whole. Restore the folder from a backup"
            ),
        ));
    };
    let last_group = read_groups_with(fs, dir, base_group, None)?;
    Ok(Plan {
        base_group,
        base_path,
        last_group,
    })
}

/// A piece of what a rebuild replays: a group's (or a part of the base's) operations,
/// with the group's number and the end of its seqs (0 for the base).
pub struct Piece {
    pub group: u64,
    pub seqs_end: u64,
    pub ops: Vec<Op>,
}

/// The base's records, in pieces of this many operations.
const BASE_PIECE: usize = 4096;

/// Reads the plan's base and then every group after it, in order, as pieces.
pub fn pieces<F: Fs>(
    fs: &F,
    dir: &Path,
    plan: &Plan,
    send: &mut dyn FnMut(Piece) -> std::result::Result<(), JournalError>,
) -> std::result::Result<(), JournalError> {
    let mut base = Vec::new();
    read_base_with(fs, &plan.base_path, plan.base_group, &mut |op| {
        base.push(op);
        if base.len() >= BASE_PIECE {
            send(Piece {
                group: plan.base_group,
                seqs_end: 0,
                ops: std::mem::take(&mut base),
            })?;
        }
        Ok(())
    })?;
    send(Piece {
        group: plan.base_group,
        seqs_end: 0,
        ops: base,
    })?;
    read_groups_with(
        fs,
        dir,
        plan.base_group,
        Some(&mut |group| {
            send(Piece {
                group: group.number,
                seqs_end: group.seqs.end,
                ops: group.ops,
            })
        }),
    )?;
    Ok(())
}

/// Builds the index afresh in `index` (empty) from the log of record: the newest base,
/// then every group after it, in order, then the checkpoint at the last. Returns the plan
/// it followed and how many groups it replayed.
pub fn rebuild_into<F: Fs, I: Writable>(
    fs: &F,
    dir: &Path,
    index: &mut I,
    reason: &str,
    shown: &str,
) -> Result<(Plan, u64)> {
    let plan = plan(fs, dir, reason, shown)?;
    let mut groups = 0u64;
    let mut failed = None;
    pieces(fs, dir, &plan, &mut |piece| {
        for op in &piece.ops {
            if let Err(e) = index.apply(op) {
                failed = Some(e);
                return Err(JournalError::Failed("the index refused a write".into()));
            }
        }
        if piece.group > plan.base_group {
            groups += 1;
        }
        Ok(())
    })
    .map_err(|e| match failed.take() {
        Some(sled) => super::error::open_err(shown, sled),
        None => LedgerError::from(e),
    })?;
    mark_checkpoint(index, plan.last_group).map_err(|e| super::error::open_err(shown, e))?;
    Ok((plan, groups))
}

/// Records in the index that it holds every group up to `group` (its checkpoint): written
/// once what it holds is durable, so that recovery replays the journal from the group
/// after it.
pub fn mark_checkpoint<I: Writable>(index: &mut I, group: u64) -> sled::Result<()> {
    index.put(GROUP_KEY, &group.to_be_bytes())
}

/// Writes a base of `index` as it stands (every record but the checkpoint's mark) at
/// `group`: the groups up to it are all in the index. Returns its size in bytes. Called
/// at open, with nothing else writing, when the journal has no base yet; and by
/// compaction, while groups after `group` go on being applied: a record read after such
/// a group changed it holds a later value, which that group's replay writes again anyway.
pub fn write_base<F: Fs, I: Index>(fs: &F, dir: &Path, index: &I, group: u64) -> Result<u64> {
    let mut records = index
        .all()
        .filter(|r| !matches!(r, Ok((k, _)) if k.as_ref() == GROUP_KEY))
        .map(|r| {
            r.map(|(k, v)| (k.to_vec(), v.to_vec()))
                .map_err(|e| e.to_string())
        });
    Ok(write_base_with(fs, dir, group, &mut records)?)
}

/// The size of the newest base, writing one of `index` at `group` first if there is none
/// (a new ledger's first records; a ledger last opened by a build that deleted old
/// segments gets one of its whole index, once).
pub fn ensure_base<F: Fs, I: Index>(
    fs: &F,
    dir: &Path,
    index: &I,
    group: u64,
    before_writing: impl FnOnce(),
) -> Result<u64> {
    match list_bases_with(fs, dir)?.pop() {
        Some((_, _, bytes)) => Ok(bytes),
        None => {
            before_writing();
            write_base(fs, dir, index, group)
        }
    }
}
