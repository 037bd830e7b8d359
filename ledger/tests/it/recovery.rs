//! Opening a damaged ledger: a tampered projection, a missing log tail, a torn data file.
//! The index (sled's files) disagreeing with the journal is rebuilt from the journal, the
//! damaged files kept aside; with no log of record to rebuild from, the ledger refuses to
//! start with a clear error naming what disagrees, and deletes nothing; for a tail torn by
//! a crash, it opens to a consistent earlier state.

use std::path::Path;

use ledger::testing::{assert_nothing_removed, listing, wait_until_released};
use ledger::*;

use crate::support::{self, rub, submit_blocking, withdraw};

/// Submits a deposit (or a withdrawal) of `amount` RUB on alice's account under `key`
/// for the default client, and expects an answer.
fn submit(l: &SledStore, key: &str, deposit: bool, amount: u64) {
    let command = if deposit {
        support::deposit("alice", amount, rub())
    } else {
        withdraw("alice", amount, rub())
    };
    submit_blocking(l, key, command);
}

fn fill(path: &Path, n: u64) {
    let (l, _) = SledStore::open(SledConfig::new(path)).unwrap();
    submit(&l, "d", true, 1_000_000);
    for i in 0..n {
        submit(&l, &format!("w{i}"), false, 1);
    }
    l.blocking().shutdown();
}

/// Tampers with the ledger's tree directly, as a disk or an operator could.
fn tamper(path: &Path, f: impl FnOnce(&sled::Tree)) {
    let db = sled::open(path).unwrap();
    let tree = db.open_tree("ledger").unwrap();
    f(&tree);
    db.flush().unwrap();
    drop((tree, db));
    // sled's I/O threads hold the folder's lock a moment after the last handle drops.
    wait_until_released(path);
}

fn refuses(path: &Path, expect: &str) {
    let before = listing(path);
    let err = SledStore::open(SledConfig::new(path)).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, LedgerError::Corrupt { .. }), "{text}");
    assert!(text.contains(expect), "{text}");
    assert!(text.contains("Nothing was changed or deleted"), "{text}");
    assert_nothing_removed(&before, &listing(path));
}

/// Each way the index can disagree with itself or the journal: the open rebuilds it from
/// the journal (every fact back, alice's balance what the commands left, verify clean) and
/// keeps the damaged files aside. The same damage on a ledger whose journal has no base
/// (one last opened by a build that deleted old segments) refuses, changing nothing.
#[test]
fn a_damaged_index_is_rebuilt_from_the_journal_or_refused_without_a_base() {
    type Tamper = fn(&sled::Tree);
    let cases: [(&str, u64, Tamper, &str); 4] = [
        (
            "a tampered balance",
            10,
            |t| {
                let mut k = b"aalice\0".to_vec();
                k.extend_from_slice(b"RUB");
                t.insert(k, 5i128.to_be_bytes().to_vec()).unwrap();
            },
            "balances in RUB sum to",
        ),
        (
            "a missing log tail",
            10,
            |t| {
                let mut k = vec![b'f'];
                k.extend_from_slice(&11u64.to_be_bytes());
                assert!(t.remove(k).unwrap().is_some());
            },
            "the log ends at seq 10 but the balances and key records were written at seq 11",
        ),
        (
            "a fact without its key",
            3,
            |t| {
                assert!(t.remove(b"kdefault\0w2").unwrap().is_some());
            },
            "has no key record",
        ),
        (
            "an undecodable fact",
            3,
            |t| {
                let mut k = vec![b'f'];
                k.extend_from_slice(&4u64.to_be_bytes());
                t.insert(k, vec![9, 9, 9]).unwrap();
            },
            "undecodable fact",
        ),
    ];
    for (what, n, damage, expect) in cases {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l");
        fill(&path, n);
        tamper(&path, damage);
        let (l, report) = SledStore::open(SledConfig::new(&path)).unwrap();
        let rebuilt = report
            .rebuilt
            .clone()
            .unwrap_or_else(|| panic!("{what}: not rebuilt"));
        assert!(rebuilt.reason.contains(expect), "{what}: {rebuilt}");
        assert_eq!(rebuilt.facts, n + 1, "{what}: {rebuilt}");
        let aside = Path::new(rebuilt.aside.as_deref().unwrap());
        assert!(
            aside.join("db").is_file(),
            "{what}: the damaged files are kept"
        );
        assert!(
            report.to_string().contains("the index was rebuilt"),
            "{report}"
        );
        assert_eq!(l.blocking().stats().last_seq, n + 1, "{what}");
        let alice = l
            .blocking()
            .account(&Account::parse("alice").unwrap())
            .unwrap();
        assert_eq!(
            alice[&Currency::parse("RUB").unwrap()],
            1_000_000 - i128::from(n),
            "{what}"
        );
        let verify = l.blocking().verify().unwrap();
        assert!(verify.ok(), "{what}: {verify}");
        l.blocking().shutdown();
        drop(l);
        // Reopened, the rebuilt index is simply the index.
        let (l, report) = SledStore::open(SledConfig::new(&path)).unwrap();
        assert!(report.rebuilt.is_none(), "{what}: {report}");
        l.blocking().shutdown();

        // Without a base, nothing can be rebuilt: refused as before.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l");
        fill(&path, n);
        for (_, base, _) in ledger::store::sled::journal::list_bases(&path.join("journal")).unwrap()
        {
            std::fs::remove_file(base).unwrap();
        }
        tamper(&path, damage);
        refuses(&path, expect);
    }
}

/// Key records in the middle that point at another key's fact, or remember another
/// command: verify names each key (its records are read again by name only for the few
/// that do not match their facts) and counts the fact left without a record.
#[test]
fn verify_reports_tampered_key_records_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l");
    fill(&path, 6);
    // Facts: 1 is "d", 2.. are "w0".. in order. A record is [version, seq varint, at
    // varint, 16-byte fingerprint, expired]; these seqs fit one byte.
    tamper(&path, |t| {
        let k = b"kdefault\0w1".to_vec();
        let mut v = t.get(&k).unwrap().unwrap().to_vec();
        assert_eq!(v[1], 3);
        v[1] = 4; // w1 now claims w2's fact
        t.insert(k, v).unwrap();
        let k = b"kdefault\0w4".to_vec();
        let mut v = t.get(&k).unwrap().unwrap().to_vec();
        let at = v.len() - 2;
        v[at] ^= 0xff; // w4 now remembers another command
        t.insert(k, v).unwrap();
    });
    let (l, _) = SledStore::open(SledConfig::new(&path)).unwrap();
    let report = l.blocking().verify().unwrap();
    let text = report.to_string();
    assert_eq!(report.violations.len(), 3, "{text}");
    for expect in [
        "key \"w1\" of \"default\" points at seq 4 but its fact is 3",
        "seq 6: the key's fingerprint is not its fact's command",
        "1 facts up to seq 7 have no key record",
    ] {
        assert!(text.contains(expect), "missing {expect:?} in {text}");
    }
}

/// A hole in the middle of the log and a log key of the wrong length: the facts are read
/// and decoded on a thread of their own and folded in order, and verify still names both.
#[test]
fn verify_reports_a_hole_and_a_malformed_log_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l");
    fill(&path, 6);
    tamper(&path, |t| {
        let mut k = vec![b'f'];
        k.extend_from_slice(&4u64.to_be_bytes());
        assert!(t.remove(&k).unwrap().is_some());
        // Sorts between seq 2 and seq 3.
        let mut k = vec![b'f'];
        k.extend_from_slice(&2u64.to_be_bytes());
        k.push(0);
        t.insert(k, vec![1]).unwrap();
    });
    let (l, _) = SledStore::open(SledConfig::new(&path)).unwrap();
    let report = l.blocking().verify().unwrap();
    let text = report.to_string();
    assert!(!report.ok(), "{text}");
    for expect in ["a log key of the wrong length", "expected seq 4, found 5"] {
        assert!(text.contains(expect), "missing {expect:?} in {text}");
    }
}

/// A key with two facts: the fact of w3 overwritten with a copy of w1's. Verify names the
/// key and both facts, besides the record left pointing at a fact of another key.
#[test]
fn verify_reports_a_key_with_two_facts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l");
    fill(&path, 6);
    let fact_key = |seq: u64| {
        let mut k = vec![b'f'];
        k.extend_from_slice(&seq.to_be_bytes());
        k
    };
    tamper(&path, |t| {
        let w1 = t.get(fact_key(3)).unwrap().unwrap();
        t.insert(fact_key(5), w1).unwrap();
    });
    let (l, _) = SledStore::open(SledConfig::new(&path)).unwrap();
    let report = l.blocking().verify().unwrap();
    let text = report.to_string();
    for expect in [
        "[one effect per key] key \"w1\" of client \"default\" has facts 3 and 5",
        "key \"w3\" of \"default\" is done but has no fact",
        "1 facts up to seq 7 have no key record",
    ] {
        assert!(text.contains(expect), "missing {expect:?} in {text}");
    }
}

fn statement_key(account: &str, seq: u64) -> Vec<u8> {
    let mut k = vec![b'h'];
    k.extend_from_slice(account.as_bytes());
    k.push(0);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

/// Every statement entry in the tree, as (account, seq): a record's key holds its run's
/// first seq, its value (if any) a tag byte and the increases to the next ones as varints.
fn statement_entries(t: &sled::Tree) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for item in t.scan_prefix([b'h']) {
        let (k, v) = item.unwrap();
        let nul = k.iter().position(|b| *b == 0).unwrap();
        let account = String::from_utf8(k[1..nul].to_vec()).unwrap();
        let mut seq = u64::from_be_bytes(k[nul + 1..].try_into().unwrap());
        out.push((account.clone(), seq));
        if let Some((&1, mut rest)) = v.split_first() {
            while !rest.is_empty() {
                let (mut step, mut shift) = (0u64, 0);
                loop {
                    let b = rest[0];
                    rest = &rest[1..];
                    step |= u64::from(b & 0x7f) << shift;
                    shift += 7;
                    if b & 0x80 == 0 {
                        break;
                    }
                }
                seq += step;
                out.push((account.clone(), seq));
            }
        }
    }
    out
}

/// Rewrites the statement runs as one record per entry, as a ledger that got its entries
/// at its first open has them: a layout every reader takes.
fn explode(t: &sled::Tree) {
    let entries = statement_entries(t);
    for item in t.scan_prefix([b'h']) {
        t.remove(item.unwrap().0).unwrap();
    }
    for (account, seq) in entries {
        t.insert(statement_key(&account, seq), &[][..]).unwrap();
    }
}

fn statement_seqs(l: &SledStore, account: &str) -> Vec<u64> {
    let account = Account::parse(account).unwrap();
    let facts = l.blocking().statement(&account, 0, 1000).unwrap();
    facts.iter().map(|f| f.seq).collect()
}

/// A ledger made before statements existed has neither the entries nor the mark that
/// they are complete: its first open writes them from the log, and the statement then
/// lists every movement (not the rejection) in order, and verify agrees.
#[test]
fn a_ledger_made_before_statements_gets_them_at_its_first_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l");
    fill(&path, 4);
    {
        let (l, _) = SledStore::open(SledConfig::new(&path)).unwrap();
        submit(&l, "too-much", false, 5_000_000);
        l.blocking().shutdown();
    }
    // What such a ledger looks like: none of the statement records.
    tamper(&path, |t| {
        assert_eq!(statement_entries(t).len(), 5);
        for item in t.scan_prefix([b'h']) {
            t.remove(item.unwrap().0).unwrap();
        }
        assert!(t.remove(b"v.statements").unwrap().is_some());
    });
    let (l, _) = SledStore::open(SledConfig::new(&path)).unwrap();
    assert_eq!(statement_seqs(&l, "alice"), vec![1, 2, 3, 4, 5]);
    let report = l.blocking().verify().unwrap();
    assert!(report.ok(), "{report}");
    l.blocking().shutdown();
    drop(l);
    // Written once: the mark is there, and a second open finds the same.
    let (l, _) = SledStore::open(SledConfig::new(&path)).unwrap();
    assert_eq!(statement_seqs(&l, "alice"), vec![1, 2, 3, 4, 5]);
}

/// A statement entry lost, one added, one filed under another account: verify names the
/// guarantee each time, and a statement never lists a fact that is not the account's.
#[test]
fn verify_reports_a_tampered_statement() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l");
    fill(&path, 4);
    // The movements of one submitter's commands share one run.
    tamper(&path, |t| {
        assert_eq!(t.scan_prefix([b'h']).count(), 1);
        assert_eq!(
            statement_entries(t),
            (1..=5)
                .map(|s| ("alice".to_string(), s))
                .collect::<Vec<_>>()
        );
    });
    type Damage = fn(&sled::Tree);
    // What verify names, and how many violations it finds.
    let cases: [(&str, usize, Damage); 5] = [
        (
            "up to seq 5: 4 statement entries, the log has 5 movements",
            1,
            |t| {
                t.remove(statement_key("alice", 3)).unwrap();
            },
        ),
        (
            "up to seq 5: 6 statement entries, the log has 5 movements",
            1,
            |t| {
                t.insert(statement_key("alice", 0), &[][..]).unwrap();
            },
        ),
        ("names another account or seq than its movement", 1, |t| {
            t.remove(statement_key("alice", 3)).unwrap();
            t.insert(statement_key("bob", 3), &[][..]).unwrap();
        }),
        // Runs: one that skips a movement and takes a seq past it, one unreadable.
        ("names another account or seq than its movement", 1, |t| {
            t.remove(statement_key("alice", 1)).unwrap();
            t.remove(statement_key("alice", 2)).unwrap();
            t.remove(statement_key("alice", 3)).unwrap();
            t.insert(statement_key("alice", 1), &[1, 1, 2][..]).unwrap();
        }),
        // The entries of an unreadable run are missing too.
        ("a statement record with an unreadable key or run", 2, |t| {
            t.remove(statement_key("alice", 1)).unwrap();
            t.remove(statement_key("alice", 2)).unwrap();
            t.insert(statement_key("alice", 1), &[1, 0][..]).unwrap();
        }),
    ];
    for (expect, violations, damage) in cases {
        let copy = tempfile::tempdir().unwrap();
        let at = copy.path().join("l");
        copy_dir(&path, &at);
        tamper(&at, |t| {
            explode(t);
            damage(t);
        });
        let (l, _) = SledStore::open(SledConfig::new(&at)).unwrap();
        let report = l.blocking().verify().unwrap();
        let text = report.to_string();
        assert_eq!(report.violations.len(), violations, "{text}");
        assert!(
            text.contains("[each account's statement holds exactly its movements]"),
            "{text}"
        );
        assert!(text.contains(expect), "missing {expect:?} in {text}");
    }
    // An entry that points at a fact of another account is refused when read, never shown.
    tamper(&path, |t| {
        t.insert(statement_key("bob", 2), &[][..]).unwrap();
    });
    let (l, _) = SledStore::open(SledConfig::new(&path)).unwrap();
    let bob = Account::parse("bob").unwrap();
    let err = l.blocking().statement(&bob, 0, 10).unwrap_err();
    assert!(matches!(err, LedgerError::Corrupt { .. }), "{err}");
    assert!(
        err.to_string().contains("not a movement of the account"),
        "{err}"
    );
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn verify_reports_a_tampered_middle_precisely() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l");
    fill(&path, 5);
    // A balance change with no fact, in the middle: opening checks only the tail and the
    // sums, so it opens; verify finds it.
    tamper(&path, |t| {
        // 5 moved from alice to @payouts without a fact; the sums still balance.
        let mut k = b"aalice\0".to_vec();
        k.extend_from_slice(b"RUB");
        t.insert(k, 999_990i128.to_be_bytes().to_vec()).unwrap();
        let mut k = b"a@payouts\0".to_vec();
        k.extend_from_slice(b"RUB");
        t.insert(k, 10i128.to_be_bytes().to_vec()).unwrap();
    });
    let (l, _) = SledStore::open(SledConfig::new(&path)).unwrap();
    let report = l.blocking().verify().unwrap();
    let text = report.to_string();
    assert_eq!(report.violations.len(), 2, "{text}");
    assert!(
        text.contains("[balances equal the fold of the log] alice RUB: stored Some(999990), the log gives 999995"),
        "{text}"
    );
    assert!(
        text.contains(
            "[balances equal the fold of the log] @payouts RUB: stored Some(10), the log gives 5"
        ),
        "{text}"
    );
}

#[test]
fn a_torn_tail_opens_consistent_or_refuses_clearly() {
    for cut in [1u64, 100, 4096, 100_000] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l");
        fill(&path, 200);
        let db_file = path.join("db");
        let len = std::fs::metadata(&db_file).unwrap().len();
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&db_file)
            .unwrap();
        f.set_len(len.saturating_sub(cut)).unwrap();
        drop(f);
        match SledStore::open(SledConfig::new(&path)) {
            Ok((l, report)) => {
                let v = l.blocking().verify().unwrap();
                assert!(v.ok(), "cut {cut}: opened but inconsistent: {v}\n{report}");
            }
            Err(e) => {
                let text = e.to_string();
                assert!(
                    matches!(e, LedgerError::Corrupt { .. } | LedgerError::Unavailable(_)),
                    "cut {cut}: {text}"
                );
                assert!(!text.is_empty());
            }
        }
    }
}

/// The last handle's drop returns only once the folder's lock is free, so that a restart in
/// the same process never meets `Locked`. sled finishes its last buffer writes on its own
/// I/O threads after its handle is gone, and those hold the data file (with its lock) for a
/// moment longer: without the wait, some reopen in this loop meets it.
#[test]
fn the_folder_reopens_as_soon_as_the_last_handle_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger");
    let rounds: u64 = 150;
    for i in 0..rounds {
        let (l, report) = SledStore::open(SledConfig::new(&path))
            .unwrap_or_else(|e| panic!("reopen {i} after a drop: {e}"));
        assert_eq!(report.facts, i);
        submit(&l, &format!("d{i}"), true, 1);
        drop(l);
    }
    let (l, _) = SledStore::open(SledConfig::new(&path)).unwrap();
    let alice = Account::parse("alice").unwrap();
    let rub = Currency::parse("RUB").unwrap();
    let balance = l
        .blocking()
        .account(&alice)
        .and_then(|b| b.get(&rub).copied());
    assert_eq!(balance, Some(i128::from(rounds)));
}

/// A folder held by a live ledger is refused at once with `Locked`, and the failed open
/// does not wait for the lock it never held (the wait above is only for the owner's drop).
#[test]
fn a_folder_in_use_is_refused_at_once_and_stays_usable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger");
    fill(&path, 1);
    let (l, _) = SledStore::open(SledConfig::new(&path)).unwrap();
    let started = std::time::Instant::now();
    let err = SledStore::open(SledConfig::new(&path)).unwrap_err();
    assert!(matches!(err, LedgerError::Locked { .. }), "{err}");
    assert!(
        err.to_string().contains("in use by another process"),
        "{err}"
    );
    // The owner's drop would wait up to 10 s; a refused opener must not.
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    assert_eq!(l.blocking().stats().last_seq, 2);
    drop(l);
    let (again, report) = SledStore::open(SledConfig::new(&path)).unwrap();
    assert_eq!(report.facts, 2);
    drop(again);
}

/// Balances, stats and statement runs reach sled's tree at checkpoints and before a
/// verify's step, not with every group: after commits they are held aside (and counted in
/// memory), statements read the runs held aside, a verify has sled take them first and
/// passes, and a shutdown leaves them in sled's tree.
#[test]
fn balances_stats_and_statement_runs_reach_sled_at_checkpoints_and_before_verify() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l");
    let config = SledConfig {
        checkpoint_interval: std::time::Duration::from_secs(3600),
        checkpoint_bytes: u64::MAX,
        ..SledConfig::new(&path)
    };
    let held_aside = |l: &SledStore, structure: &str| {
        l.memory()
            .iter()
            .find(|u| u.structure == structure)
            .unwrap()
            .entries
    };
    let alice = Account::parse("alice").unwrap();
    // The seqs of alice's statement after `after`.
    let seqs = |l: &SledStore, after: u64| -> Vec<u64> {
        let statement = l.blocking().statement(&alice, after, 100).unwrap();
        statement.iter().map(|f| f.seq).collect()
    };
    let (l, _) = SledStore::open(config).unwrap();
    submit(&l, "d", true, 100);
    submit(&l, "w", false, 30);
    // alice's, @world's and @payouts' RUB; alice's one statement run, of seqs 1 and 2.
    assert_eq!(held_aside(&l, "deferred_balances"), 3);
    assert_eq!(held_aside(&l, "deferred_runs"), 1);
    // What the run held aside is reported to weigh, against the worker's bound: its
    // B-tree slot with half again for the nodes' slack, and its two heap buffers, the
    // key (`h alice NUL seq`, 15 bytes) and the value (a tag and one increase, 2 bytes),
    // each rounded up to the allocator's 16 bytes.
    let run_bytes = l
        .memory()
        .iter()
        .find(|u| u.structure == "deferred_runs")
        .unwrap()
        .bytes;
    let slot = std::mem::size_of::<(Vec<u8>, sled::IVec)>() as u64 * 3 / 2;
    assert_eq!(run_bytes, slot + 16 + 16);
    assert_eq!(seqs(&l, 0), [1, 2]);
    // sled holds no run of alice's yet: the one holding seq 2 starts below it, kept aside.
    assert_eq!(seqs(&l, 1), [2]);
    let report = l.blocking().verify().unwrap();
    assert!(report.ok(), "{report}");
    assert_eq!(held_aside(&l, "deferred_balances"), 0);
    assert_eq!(held_aside(&l, "deferred_runs"), 0);
    assert_eq!(seqs(&l, 0), [1, 2]);
    submit(&l, "w2", false, 5);
    // A withdrawal moves alice and @payouts, and extends alice's run: sled's copy of it
    // holds seqs 1 and 2, the deferred one all three.
    assert_eq!(held_aside(&l, "deferred_balances"), 2);
    assert_eq!(held_aside(&l, "deferred_runs"), 1);
    assert_eq!(seqs(&l, 0), [1, 2, 3]);
    // A page that starts inside the run finds the run's start below it, kept aside.
    assert_eq!(seqs(&l, 1), [2, 3]);
    assert_eq!(seqs(&l, 2), [3]);
    assert!(seqs(&l, 3).is_empty());
    let report = l.blocking().verify().unwrap();
    assert!(report.ok(), "{report}");
    submit(&l, "w3", false, 5);
    l.blocking().shutdown();
    drop(l);
    wait_until_released(&path);
    tamper(&path, |t| {
        let balance = t.get(b"aalice\0RUB").unwrap().unwrap();
        assert_eq!(
            i128::from_be_bytes(balance.as_ref().try_into().unwrap()),
            60
        );
        let payouts = t.get(b"a@payouts\0RUB").unwrap().unwrap();
        assert_eq!(
            i128::from_be_bytes(payouts.as_ref().try_into().unwrap()),
            40
        );
        // One run from seq 1, with the three increases to 2, 3 and 4.
        let runs: Vec<_> = t.scan_prefix(b"halice\0").map(Result::unwrap).collect();
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].0.as_ref(), b"halice\0\0\0\0\0\0\0\0\x01");
        assert_eq!(runs[0].1.as_ref(), [1, 1, 1, 1]);
    });
    let (l, report) = SledStore::open(SledConfig::new(&path)).unwrap();
    assert_eq!(report.replayed_groups, 0);
    let balances = l.blocking().account(&alice).unwrap();
    assert_eq!(balances[&Currency::parse("RUB").unwrap()], 60);
    assert_eq!(l.blocking().stats().last_seq, 4);
    assert_eq!(seqs(&l, 0), [1, 2, 3, 4]);
}

/// A backup of the journal alone (the log of record) is a whole ledger: the open finds the
/// index missing and builds it.
#[test]
fn a_folder_holding_only_the_journal_opens_with_every_fact() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l");
    fill(&path, 20);
    for entry in std::fs::read_dir(&path).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() != "journal" {
            let p = entry.path();
            if p.is_dir() {
                std::fs::remove_dir_all(p).unwrap();
            } else {
                std::fs::remove_file(p).unwrap();
            }
        }
    }
    let (l, report) = SledStore::open(SledConfig::new(&path)).unwrap();
    let rebuilt = report.rebuilt.clone().expect("rebuilt");
    assert!(rebuilt.reason.contains("the index is empty"), "{rebuilt}");
    assert_eq!(report.facts, 21, "{report}");
    let verify = l.blocking().verify().unwrap();
    assert!(verify.ok(), "{verify}");
}

/// A million facts (IDEM_DAMAGE_FACTS sets another count), a stop that was not clean, and
/// sled's data file overwritten in three places in its middle: the open reads every record
/// after the unclean stop, meets the damage, rebuilds the index from the journal, and
/// serves every fact with the answers it gave before, verify clean.
#[test]
fn a_large_ledger_whose_data_file_is_damaged_in_the_middle_rebuilds_and_serves_every_fact() {
    let facts: u64 = std::env::var("IDEM_DAMAGE_FACTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l");
    // What the disk keeps is another test's subject: here only sled's files are damaged.
    let mut config = SledConfig::new(&path);
    config.fsync = false;
    let (l, _) = SledStore::open(config.clone()).unwrap();
    submit(&l, "d", true, facts * 2);
    let threads = 8u64;
    let per = (facts - 1) / threads;
    std::thread::scope(|s| {
        for t in 0..threads {
            let l = l.clone();
            s.spawn(move || {
                for i in 0..per {
                    submit(&l, &format!("w{t}-{i}"), false, 1);
                }
            });
        }
    });
    l.blocking().shutdown();
    drop(l);

    // Serving again with no checkpoint, a few more commands, then the folder's files as a
    // kill -9 leaves them: sled holds nothing of these groups, the journal all of them.
    let mut serving = config.clone();
    serving.checkpoint_interval = std::time::Duration::from_secs(3600);
    serving.checkpoint_bytes = u64::MAX;
    let (l, _) = SledStore::open(serving).unwrap();
    for i in 0..100 {
        submit(&l, &format!("late-{i}"), false, 1);
    }
    let crashed = dir.path().join("crashed");
    copy_folder(&path, &crashed);
    let total = l.blocking().stats().last_seq;
    let sample: Vec<(Key, String)> = (0..threads)
        .flat_map(|t| [0, per / 2, per - 1].map(move |i| format!("w{t}-{i}")))
        .chain(["d".to_owned(), "late-99".to_owned()])
        .map(|k| {
            let key = Key::parse(&k).unwrap();
            let info = l
                .blocking()
                .key(&ClientId::default_client(), &key)
                .unwrap()
                .unwrap();
            let answer = json::outcome(info.outcome.as_ref().unwrap()).to_string();
            (key, answer)
        })
        .collect();
    l.blocking().shutdown();
    drop(l);

    let data = crashed.join("db");
    let len = std::fs::metadata(&data).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&data).unwrap();
    for at in [len / 4, len / 2, len * 3 / 4] {
        std::os::unix::fs::FileExt::write_all_at(&file, &vec![0xA5; 64 * 1024], at).unwrap();
    }
    file.sync_all().unwrap();
    drop(file);

    let (l, report) = SledStore::open(SledConfig::new(&crashed)).unwrap();
    let rebuilt = report
        .rebuilt
        .clone()
        .unwrap_or_else(|| panic!("not rebuilt: {report}"));
    assert!(rebuilt.aside.is_some(), "{rebuilt}");
    assert_eq!(report.facts, total, "{report}");
    assert_eq!(l.blocking().stats().last_seq, total);
    for (key, answer) in &sample {
        let info = l
            .blocking()
            .key(&ClientId::default_client(), key)
            .unwrap()
            .unwrap();
        let now = json::outcome(info.outcome.as_ref().unwrap()).to_string();
        assert_eq!(&now, answer, "{key:?}");
    }
    let verify = l.blocking().verify().unwrap();
    assert!(verify.ok(), "{verify}");
    assert_eq!(verify.facts, total);
    println!("{report}");
}

fn copy_folder(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_folder(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// The rebuild's threads (key records on writers of their own, the records every group
/// rewrites gathered and put last) build what replaying the log of record in order
/// builds: the steps the simulation runs after its crashes.
#[test]
fn the_threaded_rebuild_builds_what_an_ordered_replay_builds() {
    let dir = tempfile::tempdir().unwrap();
    let config = SledConfig::new(dir.path());
    let (store, _) = SledStore::open(config.clone()).unwrap();
    let rub = Currency::parse("RUB").unwrap();
    for i in 0..200u64 {
        let account = Account::parse(&format!("acc-{}", i % 7)).unwrap();
        let amount = Amount::new(i + 1).unwrap();
        let command = if i % 3 == 2 {
            Command::Withdraw {
                account,
                amount: Amount::new(1).unwrap(),
                currency: rub,
            }
        } else {
            Command::Deposit {
                account,
                amount,
                currency: rub,
            }
        };
        let key = Key::parse(&format!("k{i}")).unwrap();
        store
            .blocking()
            .submit(&ClientId::default_client(), &key, command)
            .unwrap();
    }
    store.blocking().shutdown();
    drop(store);
    wait_until_released(dir.path());

    let mut replayed = ledger::store::sled::index::MemIndex::default();
    let (plan, groups) = ledger::store::sled::recover::rebuild_into(
        &ledger::store::sled::journal::OsFs,
        &dir.path().join(ledger::store::sled::JOURNAL_DIR),
        &mut replayed,
        "a test",
        "the test ledger",
    )
    .unwrap();
    assert_eq!(plan.last_group, plan.base_group + groups);
    assert!(groups > 0, "nothing after the base was replayed");

    let rebuilt = SledStore::repair(&config).unwrap();
    assert_eq!(rebuilt.groups, groups);
    let db = sled::open(dir.path()).unwrap();
    let tree = db.open_tree("ledger").unwrap();
    let records: Vec<(Vec<u8>, Vec<u8>)> = tree
        .iter()
        .map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())).unwrap())
        .collect();
    let expected: Vec<(Vec<u8>, Vec<u8>)> = replayed
        .map
        .iter()
        .map(|(k, v)| (k.clone(), v.to_vec()))
        .collect();
    assert_eq!(records.len(), expected.len());
    assert!(records == expected, "the two rebuilds differ");
}
