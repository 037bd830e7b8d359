//! The journal over the simulated disk ([`SimFs`]): the product's own appends, segments,
//! bases and deletions, with the power cut at any call (an append's write or sync, a new
//! segment's zeros or its folder's sync, a spare's rename, a base, a deletion), then what
//! the cut left, each unsynced write lost, kept, torn or flipped, opened by the product's
//! own recovery. Thousands of seeds, each a different journal and a different cut.

use std::path::Path;

use super::simfs::SimFs;
use super::*;

const SEEDS: u64 = 2_000;

/// SplitMix64: the tests' choices and data, cheap in a debug build (a cryptographic
/// generator took most of the tests' time).
struct Rng(u64);

impl Rng {
    fn seeded(seed: u64) -> Self {
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: u64) -> u64 {
        u64::try_from((u128::from(self.next()) * u128::from(n)) >> 64).unwrap_or(0)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    fn index(&mut self, len: usize) -> usize {
        usize::try_from(self.below(len as u64)).unwrap_or(0)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn bytes(&mut self, len: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(usize::try_from(len).unwrap_or(0) + 8);
        while (out.len() as u64) < len {
            out.extend_from_slice(&self.next().to_le_bytes());
        }
        out.truncate(usize::try_from(len).unwrap_or(0));
        out
    }
}

fn dir() -> &'static Path {
    Path::new("/db/journal")
}

/// A disk holding the ledger's folder, `/db`, durably: the journal makes its own folder
/// in it and syncs `/db`, but does not sync what is above (sled made the ledger's folder).
fn disk() -> SimFs {
    let fs = SimFs::new();
    fs.create_dir_all(Path::new("/db")).expect("making /db");
    fs.sync_dir(Path::new("/")).expect("syncing /");
    fs
}

/// Small segments, so that a run of a few dozen groups crosses several; every way of
/// syncing that promises durability, every preallocation, with and without a spare.
fn random_options(rng: &mut Rng) -> JournalOptions {
    JournalOptions {
        segment_size: rng.range(4096, 12_288),
        sync: [SyncMode::Fdatasync, SyncMode::Dsync][rng.index(2)],
        preallocate: [
            Preallocate::Zeros,
            Preallocate::Fallocate,
            Preallocate::Grow,
        ][rng.index(3)],
        prepare_ahead: rng.chance(50),
    }
}

/// `count` groups numbered from 1: mostly small, now and then one larger than a segment.
fn random_groups(rng: &mut Rng, count: u64) -> Vec<Group> {
    let mut seq = 1;
    (1..=count)
        .map(|number| {
            let facts = rng.below(3);
            let mut group = Group::new(number, seq..seq + facts);
            seq += facts;
            for _ in 0..rng.below(6) {
                let len = rng.range(1, 23);
                let key = rng.bytes(len);
                if rng.chance(20) {
                    group.remove(key);
                } else {
                    let len = if rng.chance(2) {
                        rng.range(12_288, 20_000)
                    } else {
                        rng.below(300)
                    };
                    group.put(key, rng.bytes(len));
                }
            }
            group
        })
        .collect()
}

fn open(fs: &SimFs, opts: &JournalOptions, checkpoint: u64) -> (Journal<SimFs>, Recovery) {
    match Journal::open_with(fs.clone(), dir(), opts.clone(), checkpoint) {
        Ok(opened) => opened,
        Err(e) => panic!("opening the simulated journal: {e}"),
    }
}

/// Opens a fresh journal and appends `groups` until one fails (the power went); returns
/// how many appends returned.
fn append_until_off(fs: &SimFs, opts: &JournalOptions, groups: &[Group]) -> usize {
    let Ok((mut journal, recovery)) = Journal::open_with(fs.clone(), dir(), opts.clone(), 0) else {
        return 0;
    };
    assert!(recovery.groups.is_empty());
    groups
        .iter()
        .take_while(|g| journal.append(g).is_ok())
        .count()
}

/// The changing calls `work` makes on a fresh disk: each is a place to cut the power.
fn calls(work: impl FnOnce(&SimFs)) -> u64 {
    let fs = disk();
    let before = fs.ops();
    work(&fs);
    fs.ops() - before
}

/// Checks what an open recovered after a cut that came while `acked` appends had returned:
/// every one of them, in order, and at most the one in flight besides (whole, or cut).
/// Returns how many groups the journal holds.
fn check_recovered(
    recovery: &Recovery,
    checkpoint: u64,
    groups: &[Group],
    acked: usize,
    cut: bool,
    what: &str,
) -> usize {
    let held = usize::try_from(checkpoint).expect("a small checkpoint") + recovery.groups.len();
    assert!(
        held == acked || (cut && held == acked + 1),
        "{what}: {held} groups recovered, {acked} acknowledged (power cut: {cut})"
    );
    assert!(
        recovery.groups == groups[usize::try_from(checkpoint).expect("small")..held],
        "{what}: groups {:?} recovered",
        numbers(&recovery.groups)
    );
    assert_eq!(recovery.next_group, held as u64 + 1, "{what}");
    held
}

#[test]
fn every_acknowledged_group_survives_a_power_cut_at_any_call_and_the_one_in_flight_is_whole_or_cut()
{
    for seed in 0..SEEDS {
        let mut rng = Rng::seeded(seed);
        let opts = random_options(&mut rng);
        let count = rng.range(1, 25);
        let groups = random_groups(&mut rng, count);
        let what = format!("seed {seed}, {opts:?}");

        let total = calls(|fs| {
            append_until_off(fs, &opts, &groups);
        });
        let fs = disk();
        let at = rng.range(0, total);
        fs.power_off_after(at);
        let acked = append_until_off(&fs, &opts, &groups);
        assert_eq!(fs.is_off(), at < total, "{what}");
        let mut after = fs.crash(|n| rng.below(n));

        // The recovery itself cut short, half the time: what it left opens the same.
        if rng.chance(50) {
            let probe = after.fork();
            if let Err(e) = Journal::open_with(probe.clone(), dir(), opts.clone(), 0) {
                panic!("{what}: {e}");
            }
            let used = probe.ops();
            if used > 0 {
                after.power_off_after(rng.below(used));
                // It may even open: the spare it makes is optional, and its failure
                // silent.
                drop(Journal::open_with(after.clone(), dir(), opts.clone(), 0));
                assert!(after.is_off(), "{what}");
                after = after.crash(|n| rng.below(n));
            }
        }
        let (mut journal, recovery) = open(&after, &opts, 0);
        let held = check_recovered(&recovery, 0, &groups, acked, at < total, &what);
        let mut read = Vec::new();
        read_groups_with(
            &after,
            dir(),
            0,
            Some(&mut |g| {
                read.push(g);
                Ok(())
            }),
        )
        .expect("reading the groups back");
        assert!(
            read == recovery.groups,
            "{what}: read_groups differs from open"
        );

        // The journal goes on from there, and what recovery cut stays cut: the rest of the
        // groups appended and synced, then another power cut, lose nothing.
        for g in &groups[held..] {
            if let Err(e) = journal.append(g) {
                panic!("{what}: appending group {}: {e}", g.number);
            }
        }
        drop(journal);
        let again = after.crash(|n| rng.below(n));
        let (_, recovery) = open(&again, &opts, 0);
        assert!(
            recovery.groups == groups,
            "{what}: after the second cut, groups {:?} of {}",
            numbers(&recovery.groups),
            groups.len()
        );
    }
}

/// A journal of `count` groups all synced, with the power cut during the last call of the
/// last append (its sync, or its `O_DSYNC` write): that record's write is the only change
/// not durable.
fn last_write_in_flight(seed: u64, opts: &JournalOptions, count: u64) -> (SimFs, Vec<Group>) {
    let mut rng = Rng::seeded(seed);
    let groups = random_groups(&mut rng, count);
    let total = calls(|fs| {
        append_until_off(fs, opts, &groups);
    });
    let fs = disk();
    fs.power_off_after(total - 1);
    let acked = append_until_off(&fs, opts, &groups);
    assert_eq!(acked, groups.len() - 1);
    (fs, groups)
}

/// The groups' numbers, to show.
fn numbers(groups: &[Group]) -> Vec<u64> {
    groups.iter().map(|g| g.number).collect()
}

/// Answers the crash's choices in turn, checking each question.
fn script(answers: Vec<(u64, u64)>) -> impl FnMut(u64) -> u64 {
    let mut next = answers.into_iter();
    move |n| {
        let (asked, answer) = next.next().expect("no more choices were expected");
        assert_eq!(n, asked, "a choice among {n}, where {asked} was expected");
        answer
    }
}

#[test]
fn a_bit_flipped_or_a_tear_in_the_unsynced_last_record_is_cut_never_replayed() {
    let modes = [SyncMode::Fdatasync, SyncMode::Dsync]
        .into_iter()
        .flat_map(|s| {
            [
                Preallocate::Zeros,
                Preallocate::Fallocate,
                Preallocate::Grow,
            ]
            .into_iter()
            .map(move |p| (s, p))
        });
    let mut cut = 0;
    for (seed, (sync, preallocate)) in modes.enumerate() {
        let opts = JournalOptions {
            segment_size: 8192,
            sync,
            preallocate,
            prepare_ahead: seed % 2 == 0,
        };
        let (fs, groups) = last_write_in_flight(seed as u64, &opts, 12);
        let last = groups.last().expect("groups");
        let len = last.record_len() as u64;
        let whole = &groups[..groups.len() - 1];
        let first = start_of(&fs.crash(script(vec![(4, 0)])), last.number);
        let start: u64 = groups[usize::try_from(first - 1).expect("small")..groups.len() - 1]
            .iter()
            .map(|g| g.record_len() as u64)
            .sum();
        let opens_to = |answers: Vec<(u64, u64)>, expected: &[Group], what: &str| {
            let after = fs.crash(script(answers));
            let (_, recovery) = open(&after, &opts, 0);
            assert!(
                recovery.groups == expected,
                "{what}, {opts:?}: groups {:?} recovered, {} expected",
                numbers(&recovery.groups),
                expected.len()
            );
            recovery.truncated
        };
        assert!(opens_to(vec![(4, 0)], whole, "lost").is_none());
        assert!(opens_to(vec![(4, 1)], &groups, "kept").is_none());
        for bit in 0..8 * len {
            let truncated = opens_to(vec![(4, 3), (8 * len, bit)], whole, "flipped");
            let truncated = truncated.expect("the flipped record cut");
            assert_eq!(
                (truncated.segment, truncated.offset),
                (dir().join(segment_name(first)), start),
                "bit {bit}"
            );
            cut += 1;
        }
        let kept = fs.crash(script(vec![(4, 1)])).files();
        for prefix in 1..len {
            // A tear whose missing bytes were already what the write would have put there
            // (the zeros of an empty group's payload, over preallocated zeros) is no tear.
            let same = fs.crash(script(vec![(4, 2), (len, prefix)])).files() == kept;
            let truncated = opens_to(
                vec![(4, 2), (len, prefix)],
                if same { &groups } else { whole },
                &format!("torn at {prefix} of {len}"),
            );
            assert_eq!(truncated.is_some(), !same, "a prefix of {prefix} bytes");
        }
    }
    assert!(cut > 1000);
}

/// The first group of the segment that holds group `number`.
fn start_of(fs: &SimFs, number: u64) -> u64 {
    list_segments(fs, dir())
        .expect("listing")
        .iter()
        .map(|s| s.first_group)
        .filter(|&first| first <= number)
        .max()
        .expect("a segment for the group")
}

#[test]
fn damage_in_a_synced_record_followed_by_whole_ones_refuses_the_open_and_changes_nothing() {
    for seed in 0..SEEDS {
        let mut rng = Rng::seeded(seed);
        let opts = random_options(&mut rng);
        let count = rng.range(2, 25);
        let groups = random_groups(&mut rng, count);
        let fs = disk();
        assert_eq!(append_until_off(&fs, &opts, &groups), groups.len());
        let after = fs.crash(|n| rng.below(n));

        // Where the damaged record lies, from the segment names and the records' lengths.
        let number = rng.range(1, count - 1);
        let first = start_of(&after, number);
        let start: u64 = groups[usize::try_from(first - 1).expect("small")
            ..usize::try_from(number - 1).expect("small")]
            .iter()
            .map(|g| g.record_len() as u64)
            .sum();
        let len = groups[usize::try_from(number - 1).expect("small")].record_len() as u64;
        let bit = rng.below(8 * len);
        let segment = dir().join(segment_name(first));
        after
            .damage(&segment, |bytes| {
                let at = usize::try_from(start + bit / 8).expect("small");
                bytes[at] ^= 1 << (bit % 8);
            })
            .expect("damaging");

        let files = after.files();
        let what = format!("seed {seed}, group {number}, bit {bit}, {opts:?}");
        match Journal::open_with(after.clone(), dir(), opts.clone(), 0) {
            Err(JournalError::Corrupt {
                segment: s, offset, ..
            }) => {
                assert_eq!((s, offset), (segment.clone(), start), "{what}");
            }
            Err(e) => panic!("{what}: {e}"),
            Ok(_) => panic!("{what}: opened"),
        }
        assert!(
            after.files() == files,
            "{what}: the refused open changed files"
        );
        assert!(
            matches!(
                read_groups_with(&after, dir(), 0, None),
                Err(JournalError::Corrupt { .. })
            ),
            "{what}"
        );
    }
}

/// What a base at `group` holds in these tests: one record that names it.
fn base_records(group: u64) -> Vec<(Vec<u8>, Vec<u8>)> {
    vec![(b"base".to_vec(), group.to_be_bytes().to_vec())]
}

/// Appends `groups`, and after the appends `bases` marks takes a base at the group it
/// names (at or before the one just appended, as the committer's base lags its appends)
/// and deletes through it, until a call fails (the power went). Returns the appends that
/// returned and the newest base whose writing returned.
fn append_with_bases(
    fs: &SimFs,
    opts: &JournalOptions,
    groups: &[Group],
    bases: &[Option<u64>],
) -> (usize, u64) {
    let Ok((mut journal, _)) = Journal::open_with(fs.clone(), dir(), opts.clone(), 0) else {
        return (0, 0);
    };
    let (mut acked, mut based) = (0, 0);
    for (g, &base) in groups.iter().zip(bases) {
        if journal.append(g).is_err() {
            break;
        }
        acked += 1;
        if let Some(base) = base {
            let records = base_records(base);
            let mut records = records.into_iter().map(Ok);
            if write_base_with(fs, dir(), base, &mut records).is_err() {
                break;
            }
            based = base;
            if journal.drop_through(base).is_err() {
                break;
            }
        }
    }
    (acked, based)
}

#[test]
fn segments_deleted_after_a_base_then_a_power_cut_never_lose_a_group_after_it() {
    let mut dropped = 0;
    for seed in 0..SEEDS {
        let mut rng = Rng::seeded(seed);
        let mut opts = random_options(&mut rng);
        opts.segment_size = 4096;
        let count = rng.range(5, 40);
        let groups = random_groups(&mut rng, count);
        let mut last = 1;
        let bases: Vec<Option<u64>> = (1..=count)
            .map(|number| {
                rng.chance(15).then(|| {
                    last = rng.range(last, number);
                    last
                })
            })
            .collect();
        let what = format!("seed {seed}, {opts:?}");

        let total = calls(|fs| {
            append_with_bases(fs, &opts, &groups, &bases);
        });
        let fs = disk();
        let at = rng.range(0, total);
        fs.power_off_after(at);
        let (acked, based) = append_with_bases(&fs, &opts, &groups, &bases);
        let after = fs.crash(|n| rng.below(n));

        let found = list_bases_with(&after, dir()).expect("listing the bases");
        let (newest, path) = found
            .last()
            .map_or((0, None), |(g, p, _)| (*g, Some(p.clone())));
        assert!(
            newest >= based,
            "{what}: base {based} written, {newest} found"
        );
        if let Some(path) = path {
            let mut ops = Vec::new();
            read_base_with(&after, &path, newest, &mut |op| {
                ops.push(op);
                Ok(())
            })
            .map_err(|e| panic!("{what}: {e}"))
            .ok();
            let (key, value) = base_records(newest).remove(0);
            assert_eq!(ops, vec![Op::Put { key, value }], "{what}");
        }
        let first = if after.exists(dir()) {
            list_segments(&after, dir())
                .expect("listing")
                .first()
                .map_or(1, |s| s.first_group)
        } else {
            1
        };
        if first > 1 {
            dropped += 1;
        }
        let last = read_groups_with(&after, dir(), newest, None).map_err(|e| panic!("{what}: {e}"));
        let (_, recovery) = open(&after, &opts, newest);
        let held = check_recovered(&recovery, newest, &groups, acked, at < total, &what);
        assert_eq!(last.ok(), Some(held as u64), "{what}");
    }
    assert!(dropped > SEEDS / 4, "only {dropped} runs deleted a segment");
}

/// `count` groups of one put of 200 bytes each: about sixteen to a segment of 4 KiB.
fn even_groups(count: u64) -> Vec<Group> {
    (1..=count)
        .map(|number| {
            let mut group = Group::new(number, number..number + 1);
            group.put(number.to_be_bytes().to_vec(), vec![7u8; 200]);
            group
        })
        .collect()
}

fn no_spare() -> JournalOptions {
    JournalOptions {
        segment_size: 4096,
        sync: SyncMode::Fdatasync,
        preallocate: Preallocate::Zeros,
        prepare_ahead: false,
    }
}

/// The bases in the journal's folder, by group.
fn bases(fs: &SimFs) -> Vec<u64> {
    list_bases_with(fs, dir())
        .expect("listing the bases")
        .into_iter()
        .map(|(group, _, _)| group)
        .collect()
}

#[test]
fn a_checkpoint_deletes_the_older_bases_and_its_deletions_survive_a_power_cut() {
    let fs = disk();
    let opts = no_spare();
    let groups = even_groups(60);
    let (mut journal, _) = open(&fs, &opts, 0);
    for g in &groups {
        journal.append(g).expect("appending");
    }
    assert!(journal.fs().files() == fs.files(), "another file system");
    let firsts: Vec<u64> = list_segments(&fs, dir())
        .expect("listing")
        .iter()
        .map(|s| s.first_group)
        .collect();
    assert!(firsts.len() >= 3 && firsts[2] > firsts[1] + 2, "{firsts:?}");
    let base = |group: u64| {
        let mut records = base_records(group).into_iter().map(Ok);
        write_base_with(&fs, dir(), group, &mut records).expect("writing a base");
    };
    // Everything so far is durable: a power cut that keeps nothing unsynced loses nothing.
    let durable = |what: &str| {
        assert!(
            fs.crash(|_| 0).files() == fs.files(),
            "{what}: a power cut undoes part of it"
        );
    };
    durable("the appends");

    // Segments deleted, no older base: the first segment goes, for good.
    base(firsts[1]);
    assert_eq!(journal.drop_through(firsts[1]).expect("a checkpoint"), 1);
    assert_eq!(
        list_segments(&fs, dir()).expect("listing")[0].first_group,
        firsts[1]
    );
    durable("deleting a segment");

    // An older base removed, no segment deleted: only the newest base stays, for good.
    base(firsts[1] + 1);
    assert_eq!(
        journal.drop_through(firsts[1] + 1).expect("a checkpoint"),
        0
    );
    assert_eq!(bases(&fs), [firsts[1] + 1]);
    durable("removing a base");

    // Nothing to delete: not a call made.
    let before = fs.ops();
    assert_eq!(
        journal.drop_through(firsts[1] + 1).expect("a checkpoint"),
        0
    );
    assert_eq!(
        fs.ops(),
        before,
        "calls made by a checkpoint that deletes nothing"
    );

    // Two older bases go at once; the checkpoint's own stays.
    base(firsts[1] + 2);
    base(firsts[1] + 3);
    journal.drop_through(firsts[1] + 3).expect("a checkpoint");
    assert_eq!(bases(&fs), [firsts[1] + 3]);
    durable("removing two bases");
}

#[test]
fn a_spare_made_inline_is_not_made_again_while_one_is_ready() {
    let mut big = Group::new(2, 0..0);
    big.put(b"big".to_vec(), vec![1u8; 6000]);
    let mut small = Group::new(1, 0..0);
    small.put(b"small".to_vec(), b"1".to_vec());
    // The calls of an append that makes a segment of its own for a large group.
    let calls_of_big = |prepare_ahead: bool| {
        let fs = disk();
        let opts = JournalOptions {
            prepare_ahead,
            ..no_spare()
        };
        let (mut journal, _) = open(&fs, &opts, 0);
        journal.append(&small).expect("appending");
        if prepare_ahead {
            let spare = journal.spare.as_ref().expect("a spare");
            assert!(spare.ready.load(Ordering::Acquire), "no spare ready");
        }
        let before = fs.ops();
        journal.append(&big).expect("appending");
        fs.ops() - before
    };
    // With a spare ready, asking for one again makes nothing more.
    assert_eq!(calls_of_big(true), calls_of_big(false));
}
