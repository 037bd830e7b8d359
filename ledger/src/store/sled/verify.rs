//! sled's online verify: the log folded while commits go on, then one short step between two
//! batches.

use std::collections::{HashMap, HashSet};

use crate::domain::{Account, ClientId, Currency, Fingerprint, Key};
use crate::fact::{Fact, FactBody};
use crate::projection::{Balances, Stats};
use crate::store::LedgerError;
use crate::store::verify::{
    COUNTERS, DERIVED, DOUBLE_ENTRY, DigestMap, GAPLESS, HashedBalances, KEY_FACT, NO_OVERDRAFT,
    ONE_EFFECT, REFUNDS, Report, SAME_ANSWER, STATEMENTS, VerifyReport, WITHDRAWALS_RESERVED,
    Withdrawals, check_after_keyed, digest, held, key_digest,
};

use super::log::{Damage, Entry, Facts};
use super::records::{
    KeyRecord, P_ACCOUNT, P_KEY, P_REFUNDED, P_STATEMENT, STATS_KEY, decode, decode_balance,
    scoped_key, split_scoped, split_statement,
};

/// At most this many facts are left for the held step (more only if commits outrun
/// eight rounds of catching up).
const CATCH_UP_HELD: u64 = 256;

/// What `verify_online` leaves for its short final step on the committer.
pub(crate) type Hold<'a> = &'a dyn Fn(
    Box<dyn FnOnce() -> Result<VerifyReport, LedgerError> + Send>,
) -> Result<VerifyReport, LedgerError>;

/// A fact as the key scan needs it: which key it belongs to and which command it
/// answered, as 64-bit digests (16 bytes a fact, so a million facts cost 16 MB).
#[derive(Clone, Copy, Default)]
struct Sig {
    key: u64,
    command: u64,
    referenced: bool,
}

/// The fold of the log up to a sequence number, built without holding commits, and
/// what its final step must look at again.
struct Online {
    r: Report,
    tree: sled::Tree,
    balances: HashedBalances,
    stats: Stats,
    withdrawals: Withdrawals,
    /// Facts up to `upto` that no key record points at. A key with two facts leaves one
    /// of them here, so only then are the facts searched for a key seen twice.
    orphans: usize,
    /// Index seq - 1, for the facts up to `upto`.
    sigs: Vec<Sig>,
    /// The facts past `upto`, folded after the scan: seq → (client, key).
    tail: HashMap<u64, (ClientId, Key)>,
    upto: u64,
    /// Key records that pointed past `upto` when scanned: their facts came meanwhile.
    late_keys: Vec<(ClientId, Key, KeyRecord)>,
    expired: u64,
    expired_before: u64,
    /// Balances and refunded totals that disagreed with the fold as of `upto`: they may
    /// have moved since, so the final step reads them again.
    suspect_accounts: Vec<(Account, Currency)>,
    suspect_refunds: Vec<(ClientId, Key)>,
    /// The statement entries the facts up to `upto` call for: how many, and the sum of
    /// their digests. An entry is never changed once written, so those up to `upto` are
    /// compared once, with no second look in the held step.
    statement_entries: u64,
    statement_digest: u64,
}

/// `verify` while commits go on. The log is append-only and a fact never changes, so the
/// facts up to the durable sequence number `upto` are read and folded with no lock; the
/// key records, balances and refunded totals are scanned the same way and compared with
/// that fold, setting aside what may have moved since. Then `hold` runs one short step
/// between two batches of the committer: it folds the facts written meanwhile, reads
/// again what was set aside and the counters, and reports. That step reads only what
/// changed during the scan, so commits wait for milliseconds, not for the whole log.
pub(crate) fn verify_online(
    tree: &sled::Tree,
    yields: bool,
    durable: &dyn Fn() -> u64,
    deferred_runs: &dyn Fn() -> Vec<(Vec<u8>, sled::IVec)>,
    hold: Hold<'_>,
) -> Result<VerifyReport, LedgerError> {
    let upto = durable();
    // Taken after `upto`, and before sled's runs are read: see `statements::merged`.
    let runs = deferred_runs();
    let mut o = Online {
        r: Report::default(),
        tree: tree.clone(),
        balances: HashedBalances::default(),
        stats: Stats::default(),
        // Sized once for the log (see `WITHDRAWALS_RESERVED`).
        withdrawals: Withdrawals::with_capacity_and_hasher(
            usize::try_from(upto)
                .unwrap_or(usize::MAX)
                .min(WITHDRAWALS_RESERVED),
            Default::default(),
        ),
        orphans: 0,
        sigs: Vec::with_capacity(usize::try_from(upto).unwrap_or(0)),
        tail: HashMap::new(),
        upto,
        late_keys: Vec::new(),
        expired: 0,
        expired_before: 0,
        suspect_accounts: Vec::new(),
        suspect_refunds: Vec::new(),
        statement_entries: 0,
        statement_digest: 0,
    };
    o.expired_before = match tree.get(STATS_KEY).map_err(io)? {
        Some(v) => decode::<Stats>("stats", &v).map_or(0, |s| s.keys_expired),
        None => 0,
    };
    // The key records and statement entries are read on a second thread while the log is
    // folded: the scans of sled need nothing from each other until the records are
    // matched with their facts. A serving ledger folds on a thread of its own too, and
    // both yield the CPU to the committer (see `SledConfig::verify_yields`): the calling
    // thread is a runtime's blocking thread, whose priority is not verify's to change.
    let keys = std::thread::scope(|scope| {
        let reader = scope.spawn(|| {
            if yields {
                yield_cpu();
            }
            read_index(tree, upto, runs)
        });
        let folded = if yields {
            let o = &mut o;
            scope
                .spawn(move || {
                    yield_cpu();
                    o.fold_log(yields)
                })
                .join()
                .unwrap_or_else(|_| Err(LedgerError::Unavailable("verify's fold stopped".into())))
        } else {
            o.fold_log(yields)
        };
        let keys = reader.join().unwrap_or_else(|_| {
            Err(LedgerError::Unavailable(
                "verify's index reader stopped".into(),
            ))
        });
        folded.and(keys)
    })?;
    o.check_statements(&keys);
    o.match_keys(keys)?;
    o.scan_balances()?;
    o.scan_refunded()?;
    // Catch up with the facts committed during the scan, still with no lock, until few
    // are left for the held step: its length is what commits wait.
    for _ in 0..8 {
        let now = durable();
        if now.saturating_sub(o.stats.last_seq) <= CATCH_UP_HELD {
            break;
        }
        o.catch_up(Some(now))?;
    }
    // A test holds the verify here to commit and sweep between its scan and its step.
    #[cfg(feature = "failpoints")]
    fail::fail_point!("verify.scanned");
    hold(Box::new(move || o.finish()))
}

/// A key record as the scan keeps it: 32 bytes of digests, so a million cost 32 MB.
struct ScannedKey {
    key: u64,
    seq: u64,
    command: u64,
    expired: bool,
}

/// What the scans of the indexes give, read on the same thread: the key records, and the
/// statement entries (the seqs of the statement runs) up to `upto` as a count and the sum
/// of their digests.
#[derive(Default)]
struct IndexScan {
    keys: Vec<ScannedKey>,
    /// Records that point past `upto`: their facts came during the scan.
    late: Vec<(ClientId, Key, KeyRecord)>,
    problems: Vec<String>,
    statement_entries: u64,
    statement_digest: u64,
    unreadable_statements: usize,
}

/// The (client, key) name bytes of a key record's sled key, as stored.
fn name_parts(k: &[u8]) -> Option<(&[u8], &[u8])> {
    let rest = k.get(1..)?;
    let (client, key) = rest.split_at(rest.iter().position(|b| *b == 0)?);
    Some((client, &key[1..]))
}

/// Reads every key record, keeping digests (names are parsed only to be reported), then
/// every statement entry, sled's and the deferred `runs`.
fn read_index(
    tree: &sled::Tree,
    upto: u64,
    runs: Vec<(Vec<u8>, sled::IVec)>,
) -> Result<IndexScan, LedgerError> {
    // One record per fact, nearly: sized once rather than doubled into twice the memory.
    let mut scan = IndexScan {
        keys: Vec::with_capacity(usize::try_from(upto).unwrap_or(0)),
        ..IndexScan::default()
    };
    for item in tree.scan_prefix([P_KEY]) {
        let (k, v) = item.map_err(io)?;
        let Some((client, key)) = name_parts(&k) else {
            scan.problems
                .push("a key record with an unreadable name".into());
            continue;
        };
        let rec = match KeyRecord::decode(&v) {
            Ok(rec) => rec,
            Err(e) => {
                scan.problems.push(e.to_string());
                continue;
            }
        };
        if rec.seq > upto {
            match split_scoped(&k) {
                Some((c, key)) => scan.late.push((c, key, rec)),
                None => scan
                    .problems
                    .push("a key record with an unreadable name".into()),
            }
            continue;
        }
        scan.keys.push(ScannedKey {
            key: digest(&[client, key]),
            seq: rec.seq,
            command: fingerprint_digest(&rec.fingerprint),
            expired: rec.expired,
        });
    }
    for item in super::statements::merged(tree.scan_prefix([P_STATEMENT]), runs) {
        let (k, v) = item.map_err(io)?;
        let Some((account, first)) = split_statement(&k) else {
            scan.unreadable_statements += 1;
            continue;
        };
        if first > upto {
            continue;
        }
        // A run may have grown past `upto` during the scan; its seqs up to it never change.
        match super::statements::run_seqs(first, &v) {
            Ok(seqs) => {
                for seq in seqs.into_iter().take_while(|s| *s <= upto) {
                    scan.statement_entries += 1;
                    scan.statement_digest = scan
                        .statement_digest
                        .wrapping_add(statement_digest(account, seq));
                }
            }
            Err(_) => scan.unreadable_statements += 1,
        }
    }
    Ok(scan)
}

/// Gives the calling thread the lowest priority (nice 19), so that on a machine with few
/// cores the committer runs first whenever both want a core. Best effort: if the call
/// fails the reader only runs at the usual priority. The thread is verify's own and ends
/// with it. No safe wrapper of the call exists in the crates we use, hence the `unsafe`.
#[allow(unsafe_code)]
fn yield_cpu() {
    // SAFETY: setpriority reads its three integer arguments and nothing else; the thread
    // id of the calling thread is always valid for it.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid.unsigned_abs(), 19);
    }
}

/// A fingerprint is already 16 bytes of SHA-256, so its two halves folded into one are a
/// digest as good as any hash of it, for nothing. Both halves count: a change to any
/// byte changes the digest (the rotation keeps two swapped halves apart too).
fn fingerprint_digest(fp: &Fingerprint) -> u64 {
    let (mut a, mut b) = ([0u8; 8], [0u8; 8]);
    a.copy_from_slice(&fp.0[..8]);
    b.copy_from_slice(&fp.0[8..]);
    u64::from_le_bytes(a) ^ u64::from_le_bytes(b).rotate_left(29)
}

fn statement_digest(account: &[u8], seq: u64) -> u64 {
    digest(&[account, &seq.to_be_bytes()])
}

fn io(e: sled::Error) -> LedgerError {
    LedgerError::Unavailable(e.to_string())
}

/// How many facts the log's reader hands the fold at a time.
const READ_BATCH: usize = 1024;

/// A fact as read from the log, with the work on it that needs no other fact done: its
/// decoding, its key's digest and, up to `upto`, its signature and its statement entry's
/// digest (the command's fingerprint is a SHA-256). The log's reader does this on a
/// thread of its own, so the fold, which must take the facts in seq order, is left only
/// the balances, the refunds and the counters.
struct Read {
    seq: u64,
    fact: Result<Fact, String>,
    key: u64,
    sig: Option<(Sig, Option<u64>)>,
}

impl Read {
    /// One item of the log; `None`: a log key of the wrong length.
    fn from_log(item: Result<Entry, Damage>, upto: u64) -> Option<Self> {
        match item {
            Ok(entry) => Some(Self::of(entry.seq, entry.bytes(), upto)),
            Err(Damage { seq, error }) => seq.map(|seq| Self {
                seq,
                fact: Err(error.to_string()),
                key: 0,
                sig: None,
            }),
        }
    }

    fn of(seq: u64, bytes: &[u8], upto: u64) -> Self {
        let fact = match Fact::decode(seq, bytes) {
            Ok(f) => f,
            Err(e) => {
                return Self {
                    seq,
                    fact: Err(e.to_string()),
                    key: 0,
                    sig: None,
                };
            }
        };
        let key = key_digest(&fact.client, &fact.key);
        let sig = (seq <= upto).then(|| {
            let sig = Sig {
                key,
                command: fingerprint_digest(&fact.body.command_fingerprint()),
                referenced: false,
            };
            let entry = crate::projection::statement_line(&fact)
                .map(|line| statement_digest(line.account.as_str().as_bytes(), seq));
            (sig, entry)
        });
        Self {
            seq,
            fact: Ok(fact),
            key,
            sig,
        }
    }
}

impl Online {
    /// Folds one fact read from the log; false if it could not be decoded.
    fn fold_read(&mut self, read: &Read) -> bool {
        let seq = read.seq;
        let expect = self.stats.last_seq + 1;
        if seq != expect {
            self.r
                .add(GAPLESS, format!("expected seq {expect}, found {seq}"));
        }
        let fact = match &read.fact {
            Ok(f) => f,
            Err(e) => {
                self.r.add(KEY_FACT, e.clone());
                self.stats.last_seq = seq;
                return false;
            }
        };
        if let Some((sig, entry)) = read.sig {
            let idx = usize::try_from(seq - 1).unwrap_or(usize::MAX);
            if self.sigs.len() <= idx {
                self.sigs.resize(idx + 1, Sig::default());
            }
            self.sigs[idx] = sig;
            if let Some(d) = entry {
                self.statement_entries += 1;
                self.statement_digest = self.statement_digest.wrapping_add(d);
            }
        }
        let after = self.balances.apply(fact);
        check_after_keyed(&mut self.r, fact, after, read.key, &mut self.withdrawals);
        self.stats.apply(fact);
        true
    }

    fn fact_at(&self, seq: u64) -> Option<Fact> {
        super::log::fact(&self.tree, seq).ok()?.ok()?
    }

    /// Folds the facts up to `upto`, read and decoded on a second thread (see [`Read`]).
    fn fold_log(&mut self, yields: bool) -> Result<(), LedgerError> {
        let (tree, upto) = (self.tree.clone(), self.upto);
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Option<Read>>>(8);
        // Folded batches go back to the reader: a fresh batch each time was a quarter of
        // a megabyte the allocator took from the kernel, zeroed, again and again.
        let (back, empties) = std::sync::mpsc::channel::<Vec<Option<Read>>>();
        std::thread::scope(|scope| {
            let reader = scope.spawn(move || -> Result<(), LedgerError> {
                if yields {
                    yield_cpu();
                }
                // The facts of a batch that comes back are dropped here, where they
                // were made: a thread frees its own allocations faster than another's.
                let fresh = || match empties.try_recv() {
                    Ok(mut used) => {
                        used.clear();
                        used
                    }
                    Err(_) => Vec::with_capacity(READ_BATCH),
                };
                let mut batch = fresh();
                for item in Facts::new(&tree, 1, upto).map_err(io)? {
                    batch.push(Read::from_log(item.map_err(io)?, upto));
                    if batch.len() == READ_BATCH {
                        let full = std::mem::replace(&mut batch, fresh());
                        if tx.send(full).is_err() {
                            return Ok(());
                        }
                    }
                }
                // The fold has stopped only if it panicked, which the caller reports.
                let _ = tx.send(batch);
                Ok(())
            });
            for batch in rx {
                for read in &batch {
                    match read {
                        Some(read) => {
                            self.fold_read(read);
                        }
                        None => self.r.add(GAPLESS, "a log key of the wrong length".into()),
                    }
                }
                // The reader is gone once it has sent its last batch.
                let _ = back.send(batch);
            }
            reader.join().unwrap_or_else(|_| {
                Err(LedgerError::Unavailable(
                    "verify's log reader stopped".into(),
                ))
            })
        })?;
        if self.stats.last_seq < self.upto {
            self.r.add(
                GAPLESS,
                format!(
                    "the log ends at seq {} below the durable {}",
                    self.stats.last_seq, self.upto
                ),
            );
        }
        Ok(())
    }

    /// Matches the key records read by [`read_index`] with the facts they point at; the
    /// names of the few that do not match are read again to be reported.
    fn match_keys(&mut self, scan: IndexScan) -> Result<(), LedgerError> {
        for problem in scan.problems {
            self.r.add(KEY_FACT, problem);
        }
        self.late_keys = scan.late;
        let mut failed = HashSet::new();
        for k in &scan.keys {
            if k.expired {
                self.expired += 1;
            }
            if !self.check_key(k) {
                failed.insert((k.key, k.seq));
            }
        }
        drop(scan.keys);
        if !failed.is_empty() {
            let first = self.first_seqs();
            for item in self.tree.scan_prefix([P_KEY]) {
                let (k, v) = item.map_err(io)?;
                let (Some((client, key)), Ok(rec)) = (name_parts(&k), KeyRecord::decode(&v)) else {
                    continue;
                };
                if failed.contains(&(digest(&[client, key]), rec.seq))
                    && let Some((c, key)) = split_scoped(&k)
                {
                    self.report_key(&first, &c, &key, &rec);
                }
            }
        }
        self.orphans = self.sigs.iter().filter(|s| !s.referenced).count();
        if self.orphans > 0 {
            self.r.add(
                KEY_FACT,
                format!(
                    "{} facts up to seq {} have no key record",
                    self.orphans, self.upto
                ),
            );
        }
        Ok(())
    }

    /// Key digest → the first seq with that key, for the facts up to `upto` and those
    /// folded after it. Built only when something is to be reported.
    fn first_seqs(&self) -> DigestMap<u64> {
        let mut first = DigestMap::default();
        for (seq, kd) in self.key_digests() {
            first.entry(kd).or_insert(seq);
        }
        first
    }

    /// (seq, key digest) of every folded fact, in seq order: those up to `upto` from their
    /// signatures, those after it from the tail's names.
    fn key_digests(&self) -> Vec<(u64, u64)> {
        let mut tail: Vec<_> = self
            .tail
            .iter()
            .map(|(s, (c, k))| (*s, key_digest(c, k)))
            .collect();
        tail.sort_unstable();
        (1u64..)
            .zip(self.sigs.iter().map(|s| s.key))
            .chain(tail)
            .collect()
    }

    /// Reports every key that has more than one fact. Two keys whose digests meet are
    /// told apart by reading their facts.
    fn report_duplicates(&mut self) {
        let mut first = DigestMap::<u64>::default();
        for (seq, kd) in self.key_digests() {
            let Some(&earlier) = first.get(&kd) else {
                first.insert(kd, seq);
                continue;
            };
            if let (Some(a), Some(b)) = (self.fact_at(earlier), self.fact_at(seq))
                && a.client == b.client
                && a.key == b.key
            {
                self.r.add(
                    ONE_EFFECT,
                    format!(
                        "key {:?} of client {:?} has facts {earlier} and {seq}",
                        b.key, b.client
                    ),
                );
            }
        }
    }

    /// A key record against the fact it points at; false if that is not its fact.
    fn check_key(&mut self, k: &ScannedKey) -> bool {
        let idx = usize::try_from(k.seq.wrapping_sub(1)).unwrap_or(usize::MAX);
        match self.sigs.get_mut(idx) {
            Some(sig) if sig.key == k.key && !sig.referenced => {
                sig.referenced = true;
                if sig.command != k.command {
                    self.r.add(
                        SAME_ANSWER,
                        format!(
                            "seq {}: the key's fingerprint is not its fact's command",
                            k.seq
                        ),
                    );
                }
                true
            }
            _ => false,
        }
    }

    fn report_key(
        &mut self,
        first: &DigestMap<u64>,
        client: &ClientId,
        key: &Key,
        rec: &KeyRecord,
    ) {
        match first.get(&key_digest(client, key)) {
            Some(seq) => self.r.add(
                KEY_FACT,
                format!(
                    "key {key:?} of {client:?} points at seq {} but its fact is {seq}",
                    rec.seq
                ),
            ),
            None => self.r.add(
                KEY_FACT,
                format!("key {key:?} of {client:?} is done but has no fact"),
            ),
        }
    }

    fn scan_balances(&mut self) -> Result<(), LedgerError> {
        let mut matched = 0usize;
        for item in self.tree.scan_prefix([P_ACCOUNT]) {
            let (k, v) = item.map_err(io)?;
            match decode_balance(&k, &v) {
                Some((a, c, b)) => {
                    if self.balances.get(&a, c) == Some(b) {
                        matched += 1;
                    } else {
                        self.suspect_accounts.push((a, c));
                    }
                }
                None => self.r.add(DERIVED, "an undecodable balance record".into()),
            }
        }
        let folded: usize = self.balances.iter().map(|(_, per)| per.len()).sum();
        if matched + self.suspect_accounts.len() < folded {
            // Some balance of the fold has no record: find which (rare, so a second scan).
            let mut stored = std::collections::HashSet::new();
            for item in self.tree.scan_prefix([P_ACCOUNT]) {
                let (k, v) = item.map_err(io)?;
                if let Some((a, c, _)) = decode_balance(&k, &v) {
                    stored.insert((a, c));
                }
            }
            for (a, per) in self.balances.iter() {
                for c in per.keys() {
                    if !stored.contains(&(a.clone(), *c)) {
                        self.suspect_accounts.push((a.clone(), *c));
                    }
                }
            }
        }
        Ok(())
    }

    /// The statement entries up to `upto` against those the fold calls for, by count and
    /// by the sum of their digests (a missing entry, an extra one, or one under another
    /// account or seq changes one or the other). Entries past `upto` came during the scan;
    /// the entries were read with the key records, on the reader's thread.
    fn check_statements(&mut self, scan: &IndexScan) {
        for _ in 0..scan.unreadable_statements {
            self.r.add(
                STATEMENTS,
                "a statement record with an unreadable key or run".into(),
            );
        }
        if scan.statement_entries != self.statement_entries {
            self.r.add(
                STATEMENTS,
                format!(
                    "up to seq {}: {} statement entries, the log has {} movements",
                    self.upto, scan.statement_entries, self.statement_entries
                ),
            );
        } else if scan.statement_digest != self.statement_digest {
            self.r.add(
                STATEMENTS,
                format!(
                    "up to seq {}: a statement entry names another account or seq than its \
                     movement",
                    self.upto
                ),
            );
        }
    }

    fn scan_refunded(&mut self) -> Result<(), LedgerError> {
        for item in self.tree.scan_prefix([P_REFUNDED]) {
            let (k, v) = item.map_err(io)?;
            let total = <[u8; 8]>::try_from(v.as_ref()).map(u64::from_be_bytes).ok();
            match split_scoped(&k) {
                Some(ck) => {
                    let folded = self.withdrawals.get(&key_digest(&ck.0, &ck.1));
                    if total.is_none() || total != folded.map(|w| w.1) {
                        self.suspect_refunds.push(ck);
                    }
                }
                None => self
                    .r
                    .add(REFUNDS, "a refunded total with an unreadable name".into()),
            }
        }
        Ok(())
    }

    /// Folds the facts after the last folded one, up to `until` (the end of the log if
    /// none), checking each one's key record directly and setting aside the balances and
    /// refunded totals it moves.
    fn catch_up(&mut self, until: Option<u64>) -> Result<(), LedgerError> {
        let facts = Facts::new(
            &self.tree,
            self.stats.last_seq + 1,
            until.unwrap_or(u64::MAX),
        );
        for item in facts.map_err(io)? {
            let Some(read) = Read::from_log(item.map_err(io)?, self.upto) else {
                self.r.add(GAPLESS, "a log key of the wrong length".into());
                continue;
            };
            if !self.fold_read(&read) {
                continue;
            }
            let Ok(fact) = read.fact else {
                continue;
            };
            self.check_tail_fact(&fact)?;
            for (account, currency, _) in crate::projection::legs(&fact) {
                self.suspect_accounts.push((account.clone(), currency));
            }
            if let FactBody::RefundRecorded { withdrawal, .. } = &fact.body {
                self.suspect_refunds
                    .push((fact.client.clone(), withdrawal.clone()));
            }
            self.tail.insert(fact.seq, (fact.client, fact.key));
        }
        Ok(())
    }

    /// The step between two batches: the rest of the log is folded and checked, and what
    /// was set aside is read again.
    fn finish(mut self) -> Result<VerifyReport, LedgerError> {
        self.catch_up(None)?;
        // A key with two facts leaves one without its record, up to `upto` or after it
        // (where the tail's own checks name it).
        if self.orphans > 0 || self.r.counts.contains_key(KEY_FACT) {
            self.report_duplicates();
        }
        for (client, key, rec) in std::mem::take(&mut self.late_keys) {
            if self.tail.get(&rec.seq) != Some(&(client.clone(), key.clone())) {
                self.r.add(
                    KEY_FACT,
                    format!(
                        "key {key:?} of {client:?} points at seq {}, which is not its fact",
                        rec.seq
                    ),
                );
            }
        }
        let balances = std::mem::take(&mut self.balances).into_balances();
        self.recheck_balances(&balances)?;
        self.recheck_refunds()?;
        self.check_counters()?;
        let stats = &self.stats;
        Ok(VerifyReport {
            facts: stats.last_seq,
            keys_done: stats.keys_done,
            keys_expired: stats.keys_expired,
            accounts: balances.accounts.keys().filter(|a| !a.is_system()).count(),
            currencies: balances.sums().len(),
            held: held(&balances),
            violations: self.r.finish(),
        })
    }

    /// A fact written during the scan: its key record is read directly.
    fn check_tail_fact(&mut self, fact: &Fact) -> Result<(), LedgerError> {
        let record = self
            .tree
            .get(scoped_key(P_KEY, &fact.client, fact.key.as_str()))
            .map_err(io)?
            .and_then(|bytes| KeyRecord::decode(&bytes).ok());
        match record {
            None => self
                .r
                .add(KEY_FACT, format!("seq {} has no key record", fact.seq)),
            Some(rec) => {
                if rec.expired {
                    self.expired += 1;
                }
                if rec.seq != fact.seq {
                    self.r.add(
                        KEY_FACT,
                        format!(
                            "key {:?} of {:?} points at seq {} but its fact is {}",
                            fact.key, fact.client, rec.seq, fact.seq
                        ),
                    );
                }
                if rec.fingerprint != fact.body.command_fingerprint() {
                    self.r.add(
                        SAME_ANSWER,
                        format!(
                            "seq {}: the key's fingerprint is not its fact's command",
                            fact.seq
                        ),
                    );
                }
            }
        }
        Ok(())
    }

    fn recheck_balances(&mut self, balances: &Balances) -> Result<(), LedgerError> {
        let mut suspects = std::mem::take(&mut self.suspect_accounts);
        suspects.sort();
        suspects.dedup();
        for (account, currency) in suspects {
            let key = super::records::account_key(&account, currency);
            let stored = self
                .tree
                .get(&key)
                .map_err(io)?
                .and_then(|v| decode_balance(&key, &v))
                .map(|(_, _, b)| b);
            match (balances.get(&account, currency), stored) {
                (Some(b), s) if s != Some(b) => self.r.add(
                    DERIVED,
                    format!("{account} {currency}: stored {s:?}, the log gives {b}"),
                ),
                (None, Some(_)) => self.r.add(
                    DERIVED,
                    format!("{account} {currency} is stored but no fact touches it"),
                ),
                _ => {}
            }
        }
        for (account, per) in &balances.accounts {
            for (currency, b) in per {
                if !account.is_system() && *b < 0 {
                    self.r
                        .add(NO_OVERDRAFT, format!("{account} {currency} is {b}"));
                }
            }
        }
        for (currency, sum) in balances.sums() {
            if sum != 0 {
                self.r
                    .add(DOUBLE_ENTRY, format!("{currency} sums to {sum}"));
            }
        }
        Ok(())
    }

    fn recheck_refunds(&mut self) -> Result<(), LedgerError> {
        let mut suspects = std::mem::take(&mut self.suspect_refunds);
        suspects.sort();
        suspects.dedup();
        for ck in suspects {
            let total = self
                .tree
                .get(scoped_key(P_REFUNDED, &ck.0, ck.1.as_str()))
                .map_err(io)?
                .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).map(u64::from_be_bytes).ok());
            let folded = self.withdrawals.get(&key_digest(&ck.0, &ck.1)).map(|w| w.1);
            // No record is right for a withdrawal nothing has refunded.
            if total != folded && !(total.is_none() && folded.unwrap_or(0) == 0) {
                self.r.add(
                    REFUNDS,
                    format!(
                        "a stored refunded total {total:?} disagrees with the log's {folded:?}"
                    ),
                );
            }
        }
        Ok(())
    }

    fn check_counters(&mut self) -> Result<(), LedgerError> {
        let stored = match self.tree.get(STATS_KEY).map_err(io)? {
            None => {
                self.r.add(COUNTERS, "no stats record".into());
                return Ok(());
            }
            Some(v) => match decode::<Stats>("stats", &v) {
                Err(e) => {
                    self.r.add(COUNTERS, e.to_string());
                    return Ok(());
                }
                Ok(s) => s,
            },
        };
        // Sweeps ran during the key scan: the expired keys it counted lie between the
        // stored count before and after it. Expiring only moves a key from done to expired.
        if self.expired < self.expired_before || self.expired > stored.keys_expired {
            self.r.add(
                COUNTERS,
                format!(
                    "keys expired: stored {} (before the scan {}), the key records give {}",
                    stored.keys_expired, self.expired_before, self.expired
                ),
            );
        }
        // The fold counts every fact as a done key; the stored count says how many of
        // them have expired since.
        let folded = &mut self.stats;
        let expired = stored.keys_expired.min(folded.keys_done);
        folded.keys_done -= expired;
        folded.keys_expired = expired;
        let pairs = [
            ("last seq", stored.last_seq, folded.last_seq),
            ("keys done", stored.keys_done, folded.keys_done),
            ("applied", stored.applied_total(), folded.applied_total()),
            ("rejected", stored.rejected_total(), folded.rejected_total()),
        ];
        for (name, s, f) in pairs {
            if s != f {
                self.r
                    .add(COUNTERS, format!("{name}: stored {s}, the log gives {f}"));
            }
        }
        if stored.applied != folded.applied || stored.rejected != folded.rejected {
            self.r
                .add(COUNTERS, "per-kind counts differ from the log".into());
        }
        Ok(())
    }
}
