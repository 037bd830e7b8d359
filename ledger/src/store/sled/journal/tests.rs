//! The journal against real files: round trips in every mode, torn tails at every byte
//! offset, every bit flipped in the last records, damage in the middle, checkpoints,
//! preallocated space, replay into a real sled tree, and (with the `failpoints` feature)
//! a child process aborted at each crash point.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tempfile::TempDir;

use super::*;

const MODES: [(SyncMode, Preallocate); 6] = [
    (SyncMode::Fdatasync, Preallocate::Zeros),
    (SyncMode::Fdatasync, Preallocate::Fallocate),
    (SyncMode::Fdatasync, Preallocate::Grow),
    (SyncMode::Dsync, Preallocate::Zeros),
    (SyncMode::Dsync, Preallocate::Fallocate),
    (SyncMode::Dsync, Preallocate::Grow),
];

fn options(segment_size: u64, sync: SyncMode, preallocate: Preallocate) -> JournalOptions {
    JournalOptions {
        segment_size,
        sync,
        preallocate,
        prepare_ahead: true,
    }
}

fn small(segment_size: u64) -> JournalOptions {
    options(segment_size, SyncMode::Fdatasync, Preallocate::Zeros)
}

fn open(dir: &Path, opts: &JournalOptions, checkpoint: u64) -> (Journal, Recovery) {
    match Journal::open(dir, opts.clone(), checkpoint) {
        Ok(opened) => opened,
        Err(e) => panic!("opening {}: {e}", dir.display()),
    }
}

fn bytes(rng: &mut StdRng, len: usize) -> Vec<u8> {
    (0..len).map(|_| rng.random::<u8>()).collect()
}

/// A group of up to `max_ops` puts and removes with values up to `max_value` bytes; its
/// seqs follow `seq`.
fn random_group(
    rng: &mut StdRng,
    number: u64,
    seq: &mut u64,
    max_ops: usize,
    max_value: usize,
) -> Group {
    let facts = rng.random_range(0..4u64);
    let mut group = Group::new(number, *seq..*seq + facts);
    *seq += facts;
    for _ in 0..rng.random_range(0..=max_ops) {
        let key_len = rng.random_range(1..40);
        let key = bytes(rng, key_len);
        if rng.random_bool(0.2) {
            group.remove(key);
        } else {
            let value_len = rng.random_range(0..=max_value);
            let value = bytes(rng, value_len);
            group.put(key, value);
        }
    }
    group
}

/// `count` groups numbered from 1 with between `min_ops` and `max_ops` operations each.
fn groups(seed: u64, count: u64, min_ops: usize, max_ops: usize, max_value: usize) -> Vec<Group> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut seq = 1;
    (1..=count)
        .map(|n| {
            let mut g = random_group(&mut rng, n, &mut seq, max_ops, max_value);
            while g.ops.len() < min_ops {
                let key = bytes(&mut rng, 8);
                g.put(key, vec![7u8; 3]);
            }
            g
        })
        .collect()
}

fn append_all(journal: &mut Journal, groups: &[Group]) {
    for g in groups {
        if let Err(e) = journal.append(g) {
            panic!("appending group {}: {e}", g.number);
        }
    }
}

/// Every segment file in `dir` with its bytes, by name (not the spare made ahead, which
/// comes and goes on its own thread).
/// A journal of `count` small groups over segments of 4 KiB, closed, with the first group
/// of each of its segments.
fn filled(seed: u64, count: u64) -> (JournalOptions, Vec<Group>, TempDir, Vec<u64>) {
    let opts = small(4096);
    let gs = groups(seed, count, 2, 8, 100);
    let dir = TempDir::new().expect("a temporary folder");
    let (mut journal, _) = open(dir.path(), &opts, 0);
    append_all(&mut journal, &gs);
    drop(journal);
    let firsts = files(dir.path())
        .keys()
        .map(|n| n.trim_end_matches(".jnl").parse().expect("a number"))
        .collect();
    (opts, gs, dir, firsts)
}

fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .expect("listing the journal")
        .map(|e| e.expect("an entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == SEGMENT_EXT))
        .map(|path| {
            let name = path
                .file_name()
                .expect("a name")
                .to_string_lossy()
                .into_owned();
            (name, std::fs::read(&path).expect("reading a segment"))
        })
        .collect()
}

fn copy_dir(from: &Path) -> TempDir {
    let to = TempDir::new().expect("a temporary folder");
    for (name, content) in files(from) {
        std::fs::write(to.path().join(name), content).expect("copying a segment");
    }
    to
}

/// Where a record lies, worked out from the segment names and the groups' encoded lengths
/// alone, without the parser under test.
#[derive(Debug, Clone)]
struct Place {
    segment: PathBuf,
    start: u64,
    end: u64,
}

fn layout(dir: &Path, groups: &[Group]) -> Vec<Place> {
    let mut firsts: Vec<u64> = files(dir)
        .keys()
        .map(|n| n.trim_end_matches(".jnl").parse().expect("a segment name"))
        .collect();
    firsts.sort_unstable();
    let mut places: Vec<Place> = Vec::new();
    for g in groups {
        let first = *firsts
            .iter()
            .rev()
            .find(|&&f| f <= g.number)
            .expect("a segment for the group");
        let start = match places.last() {
            Some(p) if g.number != first => p.end,
            _ => 0,
        };
        places.push(Place {
            segment: dir.join(segment_name(first)),
            start,
            end: start + g.record_len() as u64,
        });
    }
    places
}

fn cut_file(path: &Path, len: u64) {
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .expect("opening a segment to cut it");
    file.set_len(len).expect("cutting a segment");
}

fn flip_bit(path: &Path, bit: u64) {
    let mut content = std::fs::read(path).expect("reading a segment");
    content[usize::try_from(bit / 8).expect("an offset")] ^= 1 << (bit % 8);
    std::fs::write(path, content).expect("writing a segment");
}

fn segment_len(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.len())
}

// ---- the encoding ------------------------------------------------------------------------

#[test]
fn a_record_is_as_long_as_record_len_says_and_its_payload_decodes_back() {
    for g in groups(1, 200, 0, 60, 300) {
        let mut out = Vec::new();
        encode(&g, &mut out).expect("encoding");
        assert_eq!(out.len(), g.record_len(), "group {}", g.number);
        let Frame::Whole(header) = frame_at(&out, 0) else {
            panic!("group {} does not frame", g.number);
        };
        assert_eq!(header.group, g.number);
        assert_eq!(header.seqs, g.seqs);
        assert_eq!(decode_ops(&out[header.payload]).as_ref(), Ok(&g.ops));
    }
    // Lengths on both sides of each varint width.
    for len in [0usize, 1, 127, 128, 16_383, 16_384, 2_097_152] {
        let mut g = Group::new(1, 0..0);
        g.put(vec![1u8; 3], vec![9u8; len]);
        let mut out = Vec::new();
        encode(&g, &mut out).expect("encoding");
        assert_eq!(out.len(), g.record_len(), "a value of {len} bytes");
        assert_eq!(
            decode_ops(&out[HEADER_LEN..]).expect("decoding"),
            g.ops,
            "{len}"
        );
    }
}

#[test]
fn a_payload_that_does_not_decode_is_an_error_not_a_panic_or_a_huge_allocation() {
    let cases: &[(&[u8], &str)] = &[
        (&[], "cut short"),
        (&[0xff; 11], "over 64 bits"),
        // Ten billion operations claimed in four bytes.
        (&[0x80, 0xc8, 0xaf, 0xa0, 0x25], "cannot fit"),
        (&[1, 3, 1, 0], "unknown kind"),
        (&[1, 1, 200, 1], "a length of 200"),
        (&[1, 2, 1, b'k', 9], "left after"),
    ];
    for (payload, expected) in cases {
        match decode_ops(payload) {
            Err(e) => assert!(e.contains(expected), "{payload:?}: {e}"),
            Ok(ops) => panic!("{payload:?} decoded to {ops:?}"),
        }
    }
    let mut rng = StdRng::seed_from_u64(2);
    for _ in 0..20_000 {
        let len = rng.random_range(0..64);
        let _ = decode_ops(&bytes(&mut rng, len));
    }
}

#[test]
fn varints_round_trip_up_to_the_largest_u64() {
    for v in [
        0,
        1,
        127,
        128,
        16_383,
        16_384,
        1 << 56,
        (1 << 63) - 1,
        1 << 63,
        u64::MAX,
    ] {
        let mut out = Vec::new();
        put_varint(&mut out, v);
        let mut input = out.as_slice();
        assert_eq!(take_varint(&mut input), Ok(v), "{v}: {out:?}");
        assert!(input.is_empty(), "{v}: bytes left");
    }
}

#[test]
fn a_count_of_operations_more_than_half_the_payload_is_refused_before_decoding() {
    // Three operations claimed in three bytes: each takes at least two.
    match decode_ops(&[3, 1, 1, b'k']) {
        Err(e) => assert!(e.contains("3 operations cannot fit in 3 bytes"), "{e}"),
        Ok(ops) => panic!("decoded to {ops:?}"),
    }
}

// ---- round trips -------------------------------------------------------------------------

#[test]
fn groups_of_every_size_come_back_in_order_byte_identical_in_every_mode() {
    let segment = 64 * 1024;
    let mut all = Vec::new();
    all.push(Group::new(1, 1..1));
    let mut one = Group::new(2, 1..2);
    one.put(b"k1".to_vec(), b"v".to_vec());
    all.push(one);
    // Thousands of operations, larger than a segment: a segment of its own.
    let mut big = Group::new(3, 2..5000);
    for i in 0u32..5000 {
        big.put(
            i.to_be_bytes().to_vec(),
            vec![u8::try_from(i % 251).expect("small"); 16],
        );
    }
    assert!(big.record_len() as u64 > segment);
    all.push(big);
    let mut removal = Group::new(4, 5000..5000);
    removal.remove(b"k1".to_vec());
    all.push(removal);
    all.extend(groups(3, 60, 0, 200, 300).into_iter().map(|mut g| {
        g.number += 4;
        g
    }));
    let (first, second) = all.split_at(40);

    for (sync, preallocate) in MODES {
        let opts = options(segment, sync, preallocate);
        let dir = TempDir::new().expect("a temporary folder");
        let (mut journal, recovery) = open(dir.path(), &opts, 0);
        assert!(recovery.groups.is_empty() && recovery.next_group == 1);
        append_all(&mut journal, first);
        drop(journal);

        let (mut journal, recovery) = open(dir.path(), &opts, 0);
        assert_eq!(recovery.groups, first, "{sync:?} {preallocate:?}");
        assert_eq!(recovery.truncated, None);
        append_all(&mut journal, second);
        let stats = journal.stats();
        drop(journal);

        let (journal, recovery) = open(dir.path(), &opts, 0);
        assert_eq!(recovery.groups, all, "{sync:?} {preallocate:?}");
        assert_eq!(recovery.truncated, None);
        assert_eq!(recovery.next_group, all.len() as u64 + 1);
        assert_eq!(journal.stats(), stats);
        assert_eq!(stats.records, all.len() as u64);
        let on_disk = files(dir.path());
        assert!(on_disk.len() >= 4, "{} segments", on_disk.len());
        assert_eq!(stats.segments, on_disk.len());
        assert_eq!(
            stats.bytes,
            on_disk.values().map(|c| c.len() as u64).sum::<u64>()
        );
        // The big group's segment is sized to fit it, and the group after it starts the
        // next one.
        let big_len = all[2].record_len();
        assert_eq!(on_disk[&segment_name(3)].len(), big_len);
        assert!(on_disk.contains_key(&segment_name(4)));
        // Preallocated segments are full size; growing ones end at their last record.
        let places = layout(dir.path(), &all);
        let first_segment = &on_disk[&segment_name(1)];
        match preallocate {
            Preallocate::Zeros | Preallocate::Fallocate => {
                assert_eq!(first_segment.len() as u64, segment);
            }
            Preallocate::Grow => assert_eq!(first_segment.len() as u64, places[1].end),
        }
    }
}

#[test]
fn appending_out_of_order_or_with_backward_seqs_is_refused_and_writes_nothing() {
    let dir = TempDir::new().expect("a temporary folder");
    let opts = small(4096);
    let (mut journal, _) = open(dir.path(), &opts, 0);
    let gs = groups(4, 3, 1, 3, 20);
    append_all(&mut journal, &gs[..1]);
    let before = files(dir.path());
    for wrong in [0, 1, 3, u64::MAX] {
        let mut g = gs[1].clone();
        g.number = wrong;
        match journal.append(&g) {
            Err(JournalError::Invalid { number, detail }) => {
                assert_eq!(number, wrong);
                assert!(detail.contains("next group is 2"), "{detail}");
            }
            other => panic!("group {wrong} appended: {other:?}"),
        }
    }
    let mut backwards = gs[1].clone();
    backwards.seqs = Range { start: 5, end: 4 };
    assert!(matches!(
        journal.append(&backwards),
        Err(JournalError::Invalid { .. })
    ));
    assert_eq!(
        files(dir.path()),
        before,
        "a refused append wrote something"
    );
    // Not failed: the right group goes in.
    append_all(&mut journal, &gs[1..]);
    drop(journal);
    assert_eq!(open(dir.path(), &opts, 0).1.groups, gs);
}

#[test]
fn options_below_the_least_segment_are_refused() {
    let dir = TempDir::new().expect("a temporary folder");
    let err = Journal::open(dir.path(), small(100), 0).expect_err("a 100-byte segment");
    assert!(err.to_string().contains("segment size 100"), "{err}");
}

// ---- torn tails ----------------------------------------------------------------------------

/// The journals the torn-tail tests cut: eight records of about 80 bytes in one segment
/// (preallocated, or growing), and the same with more records and a last one alone at the
/// start of a second segment. Small records keep the tests that reopen once per byte or bit
/// short: each reopen that cuts syncs a file. No spare is made ahead (it has tests of its
/// own), so that each of the many opens syncs only what recovery syncs.
fn torn_fixtures() -> Vec<(&'static str, JournalOptions, Vec<Group>, TempDir)> {
    let mut gs = groups(5, 8, 1, 2, 8);
    for g in &mut gs {
        for op in &mut g.ops {
            match op {
                Op::Put { key, .. } | Op::Remove { key } => key.truncate(6),
            }
        }
    }
    let mut out = Vec::new();
    for (name, preallocate) in [
        ("one preallocated segment", Preallocate::Zeros),
        ("one growing segment", Preallocate::Grow),
    ] {
        let opts = JournalOptions {
            prepare_ahead: false,
            ..options(4096, SyncMode::Fdatasync, preallocate)
        };
        let dir = TempDir::new().expect("a temporary folder");
        let (mut journal, _) = open(dir.path(), &opts, 0);
        append_all(&mut journal, &gs);
        out.push((name, opts, gs.clone(), dir));
    }
    // The same records, then more until the segment is nearly full, and a last one that
    // does not fit in what is left.
    let mut gs2 = gs[..gs.len() - 1].to_vec();
    let mut pad = 0;
    while gs2.iter().map(|g| g.record_len() as u64).sum::<u64>() < 4096 - 200 {
        // More records so the first segment is nearly full.
        let mut g = Group::new(gs2.len() as u64 + 1, 0..0);
        g.put(vec![pad; 4], vec![3u8; 100]);
        pad += 1;
        gs2.push(g);
    }
    let mut last = Group::new(gs2.len() as u64 + 1, 0..0);
    last.put(b"last".to_vec(), vec![4u8; 300]);
    gs2.push(last);
    let opts = JournalOptions {
        prepare_ahead: false,
        ..options(4096, SyncMode::Fdatasync, Preallocate::Zeros)
    };
    let dir = TempDir::new().expect("a temporary folder");
    let (mut journal, _) = open(dir.path(), &opts, 0);
    append_all(&mut journal, &gs2);
    assert_eq!(
        files(dir.path()).len(),
        2,
        "the last record starts a segment"
    );
    out.push(("the last record in a segment of its own", opts, gs2, dir));
    out
}

/// Reopens `dir` after a cut; it must hold exactly `whole` groups, and take one more.
fn opens_to(dir: &Path, opts: &JournalOptions, gs: &[Group], whole: usize, what: &str) {
    let (mut journal, recovery) = open(dir, opts, 0);
    assert_eq!(recovery.groups, &gs[..whole], "{what}");
    assert_eq!(recovery.next_group, whole as u64 + 1, "{what}");
    let mut next = Group::new(whole as u64 + 1, 0..1);
    next.put(b"after the cut".to_vec(), b"fine".to_vec());
    journal
        .append(&next)
        .unwrap_or_else(|e| panic!("{what}: append after the cut: {e}"));
    drop(journal);
    let (_, recovery) = open(dir, opts, 0);
    assert_eq!(recovery.truncated, None, "{what}: a second cut");
    assert_eq!(recovery.groups.len(), whole + 1, "{what}");
    assert_eq!(&recovery.groups[..whole], &gs[..whole], "{what}");
    assert_eq!(recovery.groups[whole], next, "{what}");
}

#[test]
fn a_journal_cut_at_any_byte_of_its_last_two_records_opens_to_the_last_whole_one() {
    for (fixture, opts, gs, dir) in torn_fixtures() {
        let places = layout(dir.path(), &gs);
        let k = gs.len();
        for record in [k - 2, k - 1] {
            let place = &places[record];
            for at in place.start..place.end {
                let what = format!("{fixture}: cut at byte {at} of {}", place.segment.display());
                let copy = copy_dir(dir.path());
                let segment = copy.path().join(place.segment.file_name().expect("a name"));
                cut_file(&segment, at);
                // The end of the journal: later segments go with the cut.
                for later in &places[record + 1..] {
                    if later.segment != place.segment {
                        let _ = std::fs::remove_file(
                            copy.path().join(later.segment.file_name().expect("a name")),
                        );
                    }
                }
                let (_, recovery) = open(copy.path(), &opts, 0);
                // Whole records are those ending at or before the cut.
                assert_eq!(recovery.groups, &gs[..record], "{what}");
                if at == place.start {
                    assert_eq!(recovery.truncated, None, "{what}");
                } else {
                    let truncated = recovery.truncated.expect("a cut");
                    assert_eq!(truncated.segment, segment, "{what}");
                    assert_eq!(truncated.offset, place.start, "{what}");
                }
                // Cut back to the end of the last whole record (a segment cut at its start
                // holds none and is gone).
                let expected = (place.start > 0).then_some(place.start);
                if at > place.start || place.start == 0 {
                    assert_eq!(segment_len(&segment), expected, "{what}");
                }
                // Appending after the cut and reopening: at the record's first bytes and
                // then one offset in four (each costs a few syncs).
                if at < place.start + 8 || at % 4 == 0 {
                    opens_to(copy.path(), &opts, &gs, record, &what);
                }
            }
        }
    }
}

#[test]
fn a_torn_write_into_preallocated_zeros_opens_to_the_last_whole_record() {
    // A write that reached the disk in part: the record's first bytes, then the zeros that
    // were there before, and also a middle page alone.
    let (fixture, opts, gs, dir) = torn_fixtures().swap_remove(0);
    let places = layout(dir.path(), &gs);
    let k = gs.len();
    let last = &places[k - 1];
    for at in last.start..last.end {
        let what = format!("{fixture}: zeros from byte {at}");
        let copy = copy_dir(dir.path());
        let segment = copy.path().join(last.segment.file_name().expect("a name"));
        let mut content = std::fs::read(&segment).expect("reading");
        let (start, end) = (
            usize::try_from(at).expect("offset"),
            usize::try_from(last.end).expect("offset"),
        );
        content[start..end].fill(0);
        std::fs::write(&segment, &content).expect("writing");
        let (_, recovery) = open(copy.path(), &opts, 0);
        assert_eq!(recovery.groups, &gs[..k - 1], "{what}");
        if at == last.start {
            // All zeros: the normal end, nothing to cut.
            assert_eq!(recovery.truncated, None, "{what}");
            assert_eq!(segment_len(&segment), Some(4096), "{what}");
        } else {
            assert_eq!(
                recovery.truncated.map(|t| t.offset),
                Some(last.start),
                "{what}"
            );
            assert_eq!(segment_len(&segment), Some(last.start), "{what}");
        }
        opens_to(copy.path(), &opts, &gs, k - 1, &what);
    }
    // Only a middle piece of the last record arrived, zeros on both sides of it.
    let copy = copy_dir(dir.path());
    let segment = copy.path().join(last.segment.file_name().expect("a name"));
    let mut content = std::fs::read(&segment).expect("reading");
    let start = usize::try_from(last.start).expect("offset");
    let end = usize::try_from(last.end).expect("offset");
    content[start..start + 20].fill(0);
    content[end - 5..end].fill(0);
    std::fs::write(&segment, &content).expect("writing");
    let (_, recovery) = open(copy.path(), &opts, 0);
    assert_eq!(recovery.groups, &gs[..k - 1]);
    assert_eq!(recovery.truncated.map(|t| t.offset), Some(last.start));
}

#[test]
fn every_bit_flipped_in_the_last_two_records_opens_to_the_whole_ones_before_or_refuses() {
    // Every bit of the last two records, each flip opened; one in sixteen of the cut
    // journals is also appended to and reopened (a few syncs each). The growing segment
    // is left out: up to its end it is the preallocated one.
    let mut flips = 0;
    for (fixture, opts, gs, dir) in torn_fixtures()
        .into_iter()
        .filter(|f| f.1.preallocate != Preallocate::Grow)
    {
        let places = layout(dir.path(), &gs);
        let k = gs.len();
        for record in [k - 2, k - 1] {
            let place = &places[record];
            for bit in place.start * 8..place.end * 8 {
                flips += 1;
                let what = format!(
                    "{fixture}: bit {bit} (byte {}) of record {} flipped",
                    bit / 8,
                    record + 1
                );
                let copy = copy_dir(dir.path());
                let segment = copy.path().join(place.segment.file_name().expect("a name"));
                flip_bit(&segment, bit);
                let damaged = files(copy.path());
                let opened = Journal::open(copy.path(), opts.clone(), 0);
                if record == k - 1 {
                    // The last record: a torn tail, cut off.
                    let (_, recovery) = opened.unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert_eq!(recovery.groups, &gs[..record], "{what}");
                    let truncated = recovery.truncated.expect("a cut");
                    assert_eq!(
                        (truncated.segment, truncated.offset),
                        (segment.clone(), place.start),
                        "{what}"
                    );
                    if flips % 16 == 0 {
                        opens_to(copy.path(), &opts, &gs, record, &what);
                    }
                } else {
                    // A whole record follows: damage, refused, nothing changed.
                    match opened {
                        Err(JournalError::Corrupt {
                            segment: named,
                            offset,
                            detail,
                        }) => {
                            assert_eq!((&named, offset), (&segment, place.start), "{what}");
                            assert!(detail.contains("damage"), "{what}: {detail}");
                        }
                        Err(e) => panic!("{what}: {e}"),
                        Ok((_, r)) => panic!("{what}: opened to {} groups", r.groups.len()),
                    }
                    assert_eq!(files(copy.path()), damaged, "{what}: changed on refusal");
                }
            }
        }
    }
    assert!(flips > 2000, "{flips} bits flipped");
}

// ---- damage in the middle --------------------------------------------------------------------

#[test]
fn a_damaged_record_followed_by_whole_ones_is_refused_naming_its_segment_and_offset() {
    let opts = small(4096);
    let gs = groups(6, 40, 1, 6, 120);
    let dir = TempDir::new().expect("a temporary folder");
    let (mut journal, _) = open(dir.path(), &opts, 0);
    append_all(&mut journal, &gs);
    drop(journal);
    let places = layout(dir.path(), &gs);
    let segments = files(dir.path()).len();
    assert!(segments >= 3, "{segments} segments");
    // In the first segment, in a middle one, in the last one (not its last record), as a
    // bit flipped in the payload, a byte in the header, and the record zeroed out.
    let last_segment = &places[gs.len() - 1].segment;
    let in_last = places
        .iter()
        .position(|p| &p.segment == last_segment)
        .expect("a record in the last segment");
    assert!(in_last < gs.len() - 1, "the last segment holds two records");
    for record in [0, 4, gs.len() / 2, in_last] {
        let place = &places[record];
        for damage in ["payload bit", "group byte", "zeroed"] {
            let what = format!("record {} ({damage})", record + 1);
            let copy = copy_dir(dir.path());
            let segment = copy.path().join(place.segment.file_name().expect("a name"));
            let mut content = std::fs::read(&segment).expect("reading");
            let start = usize::try_from(place.start).expect("offset");
            let end = usize::try_from(place.end).expect("offset");
            match damage {
                "payload bit" => content[end - 1] ^= 0x10,
                "group byte" => content[start + 12] ^= 0x01,
                _ => content[start..end].fill(0),
            }
            std::fs::write(&segment, &content).expect("writing");
            let before = files(copy.path());
            let err = Journal::open(copy.path(), opts.clone(), 0).expect_err(&what);
            let JournalError::Corrupt {
                segment: named,
                offset,
                ..
            } = &err
            else {
                panic!("{what}: {err}");
            };
            assert_eq!((named, *offset), (&segment, place.start), "{what}");
            let message = LedgerError::from(err).to_string();
            let name = segment_name(
                place
                    .segment
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .and_then(|s| s.parse().ok())
                    .expect("a number"),
            );
            assert!(message.contains(&name), "{what}: {message}");
            assert!(
                message.contains(&format!("offset {}", place.start)),
                "{what}: {message}"
            );
            assert_eq!(files(copy.path()), before, "{what}: changed on refusal");
        }
    }
    // Damage in a segment the checkpoint skips is not read.
    let copy = copy_dir(dir.path());
    flip_bit(&copy.path().join(segment_name(1)), places[0].end * 8 - 3);
    let first_of_second = places
        .iter()
        .position(|p| p.segment != places[0].segment)
        .expect("a second segment");
    let (_, recovery) = open(copy.path(), &opts, first_of_second as u64);
    assert_eq!(recovery.groups, &gs[first_of_second..]);
}

#[test]
fn a_whole_record_of_an_unknown_version_or_out_of_place_is_refused() {
    let opts = small(4096);
    let gs = groups(7, 3, 1, 3, 20);
    for (what, patch) in [
        ("version", 4usize),
        ("reserved", 6),
        ("group number", 12),
        ("seqs", 28),
    ] {
        let dir = TempDir::new().expect("a temporary folder");
        let (mut journal, _) = open(dir.path(), &opts, 0);
        append_all(&mut journal, &gs);
        drop(journal);
        let places = layout(dir.path(), &gs);
        let segment = dir.path().join(segment_name(1));
        // Record 2 rewritten with a valid checksum over the changed field.
        let mut content = std::fs::read(&segment).expect("reading");
        let start = usize::try_from(places[1].start).expect("offset");
        let end = usize::try_from(places[1].end).expect("offset");
        match patch {
            4 => content[start + 4] = 2,
            6 => content[start + 6] = 1,
            12 => content[start + 12] = 9,
            _ => content[start + 28..start + 36].copy_from_slice(&0u64.to_le_bytes()),
        }
        let crc = crc32c::crc32c_append(
            crc32c::crc32c(&content[start..start + CRC_AT]),
            &content[start + HEADER_LEN..end],
        );
        content[start + CRC_AT..start + HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
        std::fs::write(&segment, &content).expect("writing");
        let before = files(dir.path());
        match Journal::open(dir.path(), opts.clone(), 0) {
            Err(JournalError::Corrupt { offset, detail, .. }) => {
                assert_eq!(offset, places[1].start, "{what}: {detail}");
            }
            Err(e) => panic!("{what}: {e}"),
            Ok((_, r)) => panic!("{what}: opened to {} groups", r.groups.len()),
        }
        assert_eq!(files(dir.path()), before, "{what}");
    }
}

// ---- checkpoints -------------------------------------------------------------------------

#[test]
fn a_checkpoint_deletes_exactly_the_segments_wholly_at_or_below_it() {
    let (opts, gs, dir, firsts) = filled(8, 60);
    assert!(firsts.len() >= 5, "{} segments", firsts.len());
    let last = gs.len() as u64;
    let mut checkpoints = vec![0, 1, 2, last - 1, last];
    for &f in &firsts[1..] {
        checkpoints.extend([f - 2, f - 1, f]);
    }
    for checkpoint in checkpoints {
        let what = format!("checkpoint {checkpoint}");
        // Reading from the checkpoint, before any deletion.
        let (_, recovery) = open(dir.path(), &opts, checkpoint);
        assert_eq!(
            recovery.groups,
            &gs[usize::try_from(checkpoint).expect("small")..],
            "{what}"
        );

        let copy = copy_dir(dir.path());
        let (mut journal, _) = open(copy.path(), &opts, checkpoint);
        let before = journal.stats();
        let deleted = journal
            .drop_through(checkpoint)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        // Segment i holds groups firsts[i] .. firsts[i + 1] - 1; the last is kept.
        let kept: Vec<String> = firsts
            .iter()
            .enumerate()
            .filter(|&(i, _)| i + 1 == firsts.len() || firsts[i + 1] - 1 > checkpoint)
            .map(|(_, &f)| segment_name(f))
            .collect();
        assert_eq!(
            files(copy.path()).into_keys().collect::<Vec<_>>(),
            kept,
            "{what}"
        );
        assert_eq!(deleted, firsts.len() - kept.len(), "{what}");
        let after = journal.stats();
        assert_eq!(after.segments, kept.len(), "{what}");
        assert_eq!(before.bytes - after.bytes, 4096 * deleted as u64, "{what}");
        let first_kept: u64 = kept[0].trim_end_matches(".jnl").parse().expect("a number");
        assert_eq!(after.records, last + 1 - first_kept, "{what}");
        // The journal goes on after the checkpoint.
        let mut next = Group::new(last + 1, 0..0);
        next.put(b"next".to_vec(), b"1".to_vec());
        journal.append(&next).expect("appending after a checkpoint");
        drop(journal);
        let (_, recovery) = open(copy.path(), &opts, checkpoint);
        let mut expected = gs[usize::try_from(checkpoint).expect("small")..].to_vec();
        expected.push(next);
        assert_eq!(recovery.groups, expected, "{what}: reopened");
    }
}

#[test]
fn a_checkpoint_past_the_journal_is_refused_and_deletes_nothing() {
    let opts = small(4096);
    let gs = groups(9, 30, 2, 8, 100);
    let dir = TempDir::new().expect("a temporary folder");
    let (mut journal, _) = open(dir.path(), &opts, 0);
    append_all(&mut journal, &gs);
    let before = files(dir.path());
    let err = journal.drop_through(31).expect_err("past the end");
    assert!(err.to_string().contains("last group, 30"), "{err}");
    assert_eq!(files(dir.path()), before);
    assert_eq!(
        journal.drop_through(30).expect("at the end"),
        before.len() - 1
    );
}

#[test]
fn a_journal_that_misses_groups_the_index_needs_is_refused() {
    let (opts, gs, dir, firsts) = filled(10, 40);
    assert!(firsts.len() >= 4);
    let refused = |dir: &Path, checkpoint: u64, expected: &str| {
        let before = files(dir);
        match Journal::open(dir, opts.clone(), checkpoint) {
            Err(e @ JournalError::Discontinuous { .. }) => {
                assert!(e.to_string().contains(expected), "{e}");
            }
            Err(e) => panic!("checkpoint {checkpoint}: {e}"),
            Ok((_, r)) => panic!("checkpoint {checkpoint}: opened to {}", r.groups.len()),
        }
        assert_eq!(files(dir), before);
    };
    // A segment missing in the middle.
    let copy = copy_dir(dir.path());
    std::fs::remove_file(copy.path().join(segment_name(firsts[1]))).expect("removing");
    refused(copy.path(), 0, &format!("named for group {}", firsts[2]));
    // ...which a checkpoint past it does not need.
    let (_, recovery) = open(copy.path(), &opts, firsts[2] - 1);
    assert_eq!(
        recovery.groups,
        &gs[usize::try_from(firsts[2] - 1).expect("small")..]
    );
    // The first segments gone while the index needs them.
    let copy = copy_dir(dir.path());
    std::fs::remove_file(copy.path().join(segment_name(firsts[0]))).expect("removing");
    refused(
        copy.path(),
        0,
        &format!("groups 1 to {} are missing", firsts[1] - 1),
    );
    // The index ahead of the journal's end.
    refused(dir.path(), 45, "ends at group 40");
    // A file named like no segment.
    let copy = copy_dir(dir.path());
    std::fs::write(copy.path().join("7.jnl"), b"").expect("writing");
    refused(copy.path(), 0, "not named like a segment");
    // An empty journal starts after the checkpoint (a ledger older than its journal).
    let empty = TempDir::new().expect("a temporary folder");
    let (mut journal, recovery) = open(empty.path(), &opts, 500);
    assert_eq!((recovery.next_group, recovery.groups.len()), (501, 0));
    let mut g = Group::new(501, 0..0);
    g.put(b"k".to_vec(), b"v".to_vec());
    journal.append(&g).expect("appending");
    assert_eq!(
        files(empty.path()).into_keys().collect::<Vec<_>>(),
        [segment_name(501)]
    );
}

// ---- preallocated space ----------------------------------------------------------------------

#[test]
fn preallocated_zeros_after_the_last_record_are_the_normal_end() {
    for preallocate in [Preallocate::Zeros, Preallocate::Fallocate] {
        let opts = options(64 * 1024, SyncMode::Fdatasync, preallocate);
        let gs = groups(11, 6, 1, 5, 50);
        let dir = TempDir::new().expect("a temporary folder");
        let (mut journal, _) = open(dir.path(), &opts, 0);
        append_all(&mut journal, &gs[..3]);
        drop(journal);
        let segment = dir.path().join(segment_name(1));
        assert_eq!(segment_len(&segment), Some(64 * 1024));
        let (mut journal, recovery) = open(dir.path(), &opts, 0);
        assert_eq!(recovery.groups, &gs[..3], "{preallocate:?}");
        assert_eq!(recovery.truncated, None, "{preallocate:?}");
        // Appends go on in the same segment, into its zeros.
        append_all(&mut journal, &gs[3..]);
        drop(journal);
        assert_eq!(files(dir.path()).len(), 1, "{preallocate:?}");
        assert_eq!(segment_len(&segment), Some(64 * 1024));
        let (_, recovery) = open(dir.path(), &opts, 0);
        assert_eq!(recovery.groups, gs, "{preallocate:?}");
        assert_eq!(recovery.truncated, None, "{preallocate:?}");
    }
}

#[test]
fn a_new_segment_that_holds_no_record_yet_is_removed_and_made_again() {
    let opts = small(4096);
    let gs = groups(12, 5, 1, 5, 50);
    let dir = TempDir::new().expect("a temporary folder");
    let (mut journal, _) = open(dir.path(), &opts, 0);
    append_all(&mut journal, &gs[..4]);
    drop(journal);
    // Made for group 5 (all zeros, or not even preallocated yet), then the process died.
    for len in [4096usize, 100, 0] {
        let copy = copy_dir(dir.path());
        let empty = copy.path().join(segment_name(5));
        std::fs::write(&empty, vec![0u8; len]).expect("writing");
        let (mut journal, recovery) = open(copy.path(), &opts, 0);
        assert_eq!(recovery.groups, &gs[..4], "{len}");
        assert_eq!(recovery.truncated, None, "{len}");
        assert!(!empty.exists(), "{len}");
        append_all(&mut journal, &gs[4..]);
        drop(journal);
        assert_eq!(open(copy.path(), &opts, 0).1.groups, gs, "{len}");
    }
}

/// Waits until the journal's spare is ready (whole, synced, and flagged), and returns its
/// inode, to recognise it once renamed.
fn spare_ready(journal: &Journal) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    let spare = journal.spare.as_ref().expect("a spare thread");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !spare.ready.load(Ordering::Acquire) {
        assert!(std::time::Instant::now() < deadline, "no spare made");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    std::fs::metadata(journal.dir().join(SPARE_READY))
        .expect("the spare")
        .ino()
}

#[test]
fn the_segment_made_ahead_is_renamed_into_place_and_a_leftover_one_removed() {
    use std::os::unix::fs::MetadataExt as _;
    let inode = |path: &Path| std::fs::metadata(path).expect("a segment").ino();
    for preallocate in [Preallocate::Zeros, Preallocate::Fallocate] {
        let opts = options(8 * 1024, SyncMode::Fdatasync, preallocate);
        let dir = TempDir::new().expect("a temporary folder");
        let ready = dir.path().join(SPARE_READY);
        let (mut journal, _) = open(dir.path(), &opts, 0);
        let spare = spare_ready(&journal);
        assert_eq!(segment_len(&ready), Some(8 * 1024));
        let mut gs = vec![Group::new(1, 0..0)];
        journal.append(&gs[0]).expect("appending");
        // The first segment is the spare, renamed; the next one is made meanwhile.
        assert_eq!(inode(&dir.path().join(segment_name(1))), spare);
        let next = spare_ready(&journal);
        // A group larger than a segment gets one made for it, and asks for a spare while
        // one is ready: the ready one stays (a second would replace it under the append
        // about to rename it).
        let mut big = Group::new(2, 0..0);
        big.put(b"big".to_vec(), vec![1u8; 10_000]);
        journal.append(&big).expect("appending");
        gs.push(big);
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert_eq!(
            spare_ready(&journal),
            next,
            "{preallocate:?}: the spare was replaced"
        );
        // The group after it starts a segment: the spare.
        let mut after = Group::new(3, 0..0);
        after.put(b"after".to_vec(), vec![2u8; 100]);
        journal.append(&after).expect("appending");
        gs.push(after);
        assert_eq!(
            inode(&dir.path().join(segment_name(3))),
            next,
            "{preallocate:?}"
        );
        spare_ready(&journal);
        drop(journal);
        // A spare left half made, and one left ready: removed at open, the records intact.
        std::fs::write(dir.path().join(SPARE_MAKING), [0u8; 100]).expect("writing");
        assert!(ready.exists());
        let no_spare = JournalOptions {
            prepare_ahead: false,
            ..opts.clone()
        };
        let (_, recovery) = open(dir.path(), &no_spare, 0);
        assert_eq!(recovery.groups, gs, "{preallocate:?}");
        assert!(!ready.exists() && !dir.path().join(SPARE_MAKING).exists());
    }
}

#[test]
fn a_leftover_spare_that_cannot_be_removed_refuses_the_open() {
    let (opts, _, dir, _) = filled(19, 5);
    // Not a file: a folder with something in it, which no removal of a file takes away.
    let stuck = dir.path().join(SPARE_READY);
    if stuck.exists() {
        std::fs::remove_file(&stuck).expect("removing the spare left ready");
    }
    std::fs::create_dir(&stuck).expect("making a folder");
    std::fs::write(stuck.join("inside"), b"x").expect("writing");
    match Journal::open(dir.path(), opts, 0) {
        Err(JournalError::Io { context, .. }) => {
            assert!(context.contains(SPARE_READY), "{context}");
        }
        Err(e) => panic!("{e}"),
        Ok((_, r)) => panic!(
            "opened to {} groups over a spare it could not remove",
            r.groups.len()
        ),
    }
}

#[test]
fn a_torn_tail_says_whether_its_header_or_its_payload_was_cut_short() {
    let opts = JournalOptions {
        prepare_ahead: false,
        ..options(4096, SyncMode::Fdatasync, Preallocate::Grow)
    };
    let gs = groups(20, 3, 1, 3, 50);
    let dir = TempDir::new().expect("a temporary folder");
    let (mut journal, _) = open(dir.path(), &opts, 0);
    append_all(&mut journal, &gs);
    drop(journal);
    let last = layout(dir.path(), &gs).swap_remove(2);
    // A growing segment ends where its last record does: cut into that record's header,
    // or just after it (a whole record is longer than its header).
    for (cut, reason) in [
        (
            HEADER_LEN - 1,
            "a record header cut short by the end of the segment",
        ),
        (
            HEADER_LEN,
            "a record longer than what is left of the segment",
        ),
        (
            HEADER_LEN + 1,
            "a record longer than what is left of the segment",
        ),
    ] {
        let copy = copy_dir(dir.path());
        let segment = copy.path().join(last.segment.file_name().expect("a name"));
        cut_file(&segment, last.start + cut as u64);
        let (_, recovery) = open(copy.path(), &opts, 0);
        assert_eq!(recovery.groups, &gs[..2], "cut {cut} bytes in");
        let truncated = recovery.truncated.expect("a cut");
        assert_eq!(
            (truncated.offset, truncated.reason),
            (last.start, reason),
            "cut {cut} bytes in"
        );
    }
}

// ---- replay --------------------------------------------------------------------------------

#[test]
fn replaying_groups_into_sled_twice_leaves_what_replaying_once_does() {
    let gs = groups(13, 50, 0, 30, 60);
    // Keys from a small set, so that puts overwrite and removes hit.
    let gs: Vec<Group> = gs
        .into_iter()
        .map(|mut g| {
            for op in &mut g.ops {
                match op {
                    Op::Put { key, .. } | Op::Remove { key } => key.truncate(1),
                }
            }
            g
        })
        .collect();
    let mut model = BTreeMap::new();
    for g in &gs {
        for op in &g.ops {
            match op {
                Op::Put { key, value } => {
                    model.insert(key.clone(), value.clone());
                }
                Op::Remove { key } => {
                    model.remove(key);
                }
            }
        }
    }
    assert!(model.len() > 10 && model.len() < 256);
    let contents = |replays: usize| {
        let dir = TempDir::new().expect("a temporary folder");
        let db = sled::Config::new()
            .path(dir.path())
            .open()
            .expect("opening sled");
        let tree = db.open_tree("ledger").expect("a tree");
        for _ in 0..replays {
            for g in &gs {
                g.apply(&tree).expect("applying");
            }
        }
        tree.iter()
            .map(|kv| {
                let (k, v) = kv.expect("reading");
                (k.to_vec(), v.to_vec())
            })
            .collect::<BTreeMap<_, _>>()
    };
    assert_eq!(contents(1), model);
    assert_eq!(contents(2), model);
    // A second replay that starts partway (a crash during the first) ends the same.
    let dir = TempDir::new().expect("a temporary folder");
    let db = sled::Config::new()
        .path(dir.path())
        .open()
        .expect("opening sled");
    for g in gs.iter().take(20).chain(&gs) {
        g.apply(&db).expect("applying");
    }
    let got: BTreeMap<Vec<u8>, Vec<u8>> = db
        .iter()
        .map(|kv| {
            let (k, v) = kv.expect("reading");
            (k.to_vec(), v.to_vec())
        })
        .collect();
    assert_eq!(got, model);
}

// ---- the journal's own accounting ------------------------------------------------------------

#[test]
fn bytes_through_is_what_drop_through_then_deletes_and_next_group_follows_the_appends() {
    let (opts, gs, dir, firsts) = filled(16, 50);
    assert!(firsts.len() >= 4, "{} segments", firsts.len());
    let last = gs.len() as u64;
    let mut checkpoints = vec![0, 1, last - 1, last];
    for &f in &firsts[1..] {
        checkpoints.extend([f - 2, f - 1, f]);
    }
    let mut deleted_any = false;
    for checkpoint in checkpoints {
        let what = format!("checkpoint {checkpoint}");
        let copy = copy_dir(dir.path());
        let (mut journal, recovery) = open(copy.path(), &opts, checkpoint);
        assert_eq!(journal.next_group(), recovery.next_group, "{what}");
        assert_eq!(journal.next_group(), last + 1, "{what}");
        let before = journal.stats().bytes;
        let through = journal.bytes_through(checkpoint);
        journal
            .drop_through(checkpoint)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(through, before - journal.stats().bytes, "{what}");
        assert_eq!(journal.bytes_through(checkpoint), 0, "{what}: after");
        deleted_any |= through > 0;
    }
    assert!(deleted_any);
    // A fresh journal: the next group is 1, then one more after each append.
    let empty = TempDir::new().expect("a temporary folder");
    let (mut journal, _) = open(empty.path(), &opts, 0);
    assert_eq!(journal.next_group(), 1);
    for g in &gs[..3] {
        journal.append(g).expect("appending");
        assert_eq!(journal.next_group(), g.number + 1);
    }
}

#[test]
fn a_segment_named_for_group_zero_is_not_taken_for_one() {
    let (opts, _, dir, firsts) = filled(17, 5);
    assert_eq!(firsts, [1]);
    std::fs::write(dir.path().join(segment_name(0)), b"").expect("writing");
    match Journal::open(dir.path(), opts, 0) {
        Err(e @ JournalError::Discontinuous { .. }) => {
            assert!(e.to_string().contains("not named like a segment"), "{e}");
        }
        Err(e) => panic!("{e}"),
        Ok((_, r)) => panic!("opened to {} groups", r.groups.len()),
    }
}

#[test]
fn a_torn_tail_takes_the_later_segments_with_it_and_says_how_many() {
    let (opts, gs, dir, firsts) = filled(18, 60);
    assert!(firsts.len() >= 4, "{} segments", firsts.len());
    let places = layout(dir.path(), &gs);
    // The last record of the second segment torn, and the segments after it empty (made,
    // but none of their records reached the disk).
    let torn = usize::try_from(firsts[2] - 2).expect("small");
    let place = &places[torn];
    assert!(place.start > 0);
    let copy = copy_dir(dir.path());
    let second = copy.path().join(segment_name(firsts[1]));
    cut_file(&second, place.start + 10);
    for &f in &firsts[2..] {
        cut_file(&copy.path().join(segment_name(f)), 0);
    }
    let (_, recovery) = open(copy.path(), &opts, 0);
    assert_eq!(recovery.groups, &gs[..torn]);
    let truncated = recovery.truncated.expect("a cut");
    assert_eq!(
        (&truncated.segment, truncated.offset),
        (&second, place.start)
    );
    assert_eq!(truncated.segments_removed, firsts.len() - 2);
    assert_eq!(
        files(copy.path()).into_keys().collect::<Vec<_>>(),
        [segment_name(firsts[0]), segment_name(firsts[1])]
    );
    assert_eq!(segment_len(&second), Some(place.start));
}

#[test]
fn a_segment_whose_first_record_is_torn_goes_and_appends_resume_in_the_one_before() {
    let (fixture, opts, gs, dir) = torn_fixtures().swap_remove(2);
    let places = layout(dir.path(), &gs);
    let k = gs.len();
    let last = &places[k - 1];
    assert_eq!(last.start, 0, "{fixture}");
    // Only the start of the record's header reached its new segment.
    cut_file(&last.segment, 10);
    let (mut journal, recovery) = open(dir.path(), &opts, 0);
    assert_eq!(recovery.groups, &gs[..k - 1]);
    assert_eq!(
        recovery.truncated.map(|t| (t.segment, t.offset)),
        Some((last.segment.clone(), 0))
    );
    assert!(!last.segment.exists());
    // The segment before has room for the next group: it goes there.
    let mut next = Group::new(k as u64, 0..1);
    next.put(b"after the cut".to_vec(), b"fine".to_vec());
    assert!(places[k - 2].end + next.record_len() as u64 <= opts.segment_size);
    journal.append(&next).expect("appending");
    drop(journal);
    assert_eq!(
        files(dir.path()).into_keys().collect::<Vec<_>>(),
        [segment_name(1)]
    );
    let (_, recovery) = open(dir.path(), &opts, 0);
    assert_eq!(&recovery.groups[..k - 1], &gs[..k - 1]);
    assert_eq!(recovery.groups[k - 1], next);
}

#[test]
fn dropping_a_journal_stops_and_waits_for_the_thread_that_makes_its_spare() {
    // A spare large enough that the thread is still making it when the journal goes.
    let opts = options(64 << 20, SyncMode::Fdatasync, Preallocate::Zeros);
    let dir = TempDir::new().expect("a temporary folder");
    let (journal, _) = open(dir.path(), &opts, 0);
    let ready = Arc::clone(&journal.spare.as_ref().expect("a spare thread").ready);
    assert_eq!(
        Arc::strong_count(&ready),
        3,
        "the journal's, the thread's, this one"
    );
    drop(journal);
    // The thread's handle on the flag goes only when it ends.
    assert_eq!(
        Arc::strong_count(&ready),
        1,
        "the thread outlived its journal"
    );
}

// ---- bases and the log of record over real files ---------------------------------------------

/// `count` records of 8-byte keys and `value`-byte values.
fn index_records(count: u32, value: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
    (0..count)
        .map(|i| {
            let fill = u8::try_from(i % 251).expect("small");
            (u64::from(i).to_be_bytes().to_vec(), vec![fill; value])
        })
        .collect()
}

fn puts(records: &[(Vec<u8>, Vec<u8>)]) -> Vec<Op> {
    records
        .iter()
        .map(|(key, value)| Op::Put {
            key: key.clone(),
            value: value.clone(),
        })
        .collect()
}

fn write_real_base(dir: &Path, group: u64, records: &[(Vec<u8>, Vec<u8>)]) -> u64 {
    let mut records = records.iter().cloned().map(Ok);
    write_base(dir, group, &mut records).unwrap_or_else(|e| panic!("writing base {group}: {e}"))
}

fn read_real_base(path: &Path, group: u64) -> Result<Vec<Op>> {
    let mut ops = Vec::new();
    read_base(path, group, &mut |op| {
        ops.push(op);
        Ok(())
    })?;
    Ok(ops)
}

/// A base's records in order: (group, index, operations).
fn base_frames(bytes: &[u8]) -> Vec<(u64, u64, usize)> {
    let mut frames = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let Frame::Whole(header) = frame_at(bytes, at) else {
            panic!("no whole record at offset {at}");
        };
        let ops = decode_ops(&bytes[header.payload.clone()]).expect("decoding");
        frames.push((header.group, header.seqs.start, ops.len()));
        at = header.payload.end;
    }
    frames
}

#[test]
fn a_base_is_written_in_records_of_about_a_mebibyte_and_read_back_in_order() {
    let dir = TempDir::new().expect("a temporary folder");
    // A small base: one record, as long as a group of its puts.
    let small = index_records(3, 10);
    let written = write_real_base(dir.path(), 7, &small);
    let path = dir.path().join(base_name(7));
    let mut one = Group::new(7, 0..0);
    one.ops = puts(&small);
    assert_eq!(written, one.record_len() as u64);
    assert_eq!(segment_len(&path), Some(written));
    assert_eq!(read_real_base(&path, 7).expect("reading"), one.ops);
    // An empty index: one record of no operations, read back as nothing.
    let written = write_real_base(dir.path(), 8, &[]);
    assert_eq!(written, Group::new(8, 0..0).record_len() as u64);
    let path = dir.path().join(base_name(8));
    assert_eq!(read_real_base(&path, 8).expect("reading"), []);
    // A large one: a record is closed once its keys, values and 8 bytes an operation reach
    // 1 MiB; here 1,016 bytes an operation, so 1,033 operations a record.
    let large = index_records(3000, 1000);
    let written = write_real_base(dir.path(), 9, &large);
    let path = dir.path().join(base_name(9));
    let bytes = std::fs::read(&path).expect("reading");
    assert_eq!(written, bytes.len() as u64);
    assert_eq!(
        base_frames(&bytes),
        [(9, 0, 1033), (9, 1, 1033), (9, 2, 934)]
    );
    assert_eq!(read_real_base(&path, 9).expect("reading"), puts(&large));
    // Listed oldest first with their sizes; files not named like a base are not bases.
    for name in ["base-6.snap", BASE_MAKING, "00000000000000000001.jnl"] {
        std::fs::write(dir.path().join(name), b"").expect("writing");
    }
    let listed: Vec<(u64, PathBuf, u64)> = [7, 8, 9]
        .into_iter()
        .map(|g| {
            let path = dir.path().join(base_name(g));
            let len = segment_len(&path).expect("a base");
            (g, path, len)
        })
        .collect();
    assert_eq!(list_bases(dir.path()).expect("listing"), listed);
    // No folder: no base; a folder that cannot be listed: an error, not "no base".
    assert_eq!(
        list_bases(&dir.path().join("nowhere")).expect("listing"),
        []
    );
    assert!(list_bases(&path).is_err(), "a file listed as a folder");
}

#[test]
fn a_base_read_as_another_groups_damaged_or_empty_is_refused_at_its_offset() {
    let dir = TempDir::new().expect("a temporary folder");
    write_real_base(dir.path(), 9, &index_records(3000, 1000));
    let path = dir.path().join(base_name(9));
    match read_real_base(&path, 8) {
        Err(JournalError::Corrupt { offset, detail, .. }) => {
            assert_eq!(offset, 0);
            assert!(detail.contains("of base 9"), "{detail}");
        }
        other => panic!("read as base 8: {other:?}"),
    }
    // A bit flipped in the second record: named at that record's offset.
    let bytes = std::fs::read(&path).expect("reading");
    let Frame::Whole(first) = frame_at(&bytes, 0) else {
        panic!("no first record");
    };
    let second = first.payload.end;
    let mut damaged = bytes.clone();
    damaged[second + HEADER_LEN + 100] ^= 0x04;
    std::fs::write(&path, &damaged).expect("writing");
    match read_real_base(&path, 9) {
        Err(JournalError::Corrupt { offset, .. }) => assert_eq!(offset, second as u64),
        other => panic!("a damaged second record: {other:?}"),
    }
    // A base holds at least one record.
    std::fs::write(&path, b"").expect("writing");
    assert!(read_real_base(&path, 9).is_err(), "an empty base read");
}

#[test]
fn read_groups_reads_the_groups_after_a_point_from_real_files() {
    let (_, gs, dir, firsts) = filled(15, 30);
    assert!(firsts.len() >= 2, "{} segments", firsts.len());
    for after in [0, 1, firsts[1], 29, 30] {
        let mut read = Vec::new();
        let last = read_groups(
            dir.path(),
            after,
            Some(&mut |g| {
                read.push(g);
                Ok(())
            }),
        )
        .unwrap_or_else(|e| panic!("after {after}: {e}"));
        assert_eq!(last, 30, "after {after}");
        assert_eq!(read, &gs[usize::try_from(after).expect("small")..]);
    }
    let nowhere = dir.path().join("nowhere");
    assert_eq!(read_groups(&nowhere, 5, None).expect("no folder"), 5);
}

// ---- crash points ----------------------------------------------------------------------------

#[cfg(feature = "failpoints")]
mod crash {
    use std::os::unix::process::ExitStatusExt as _;
    use std::process::Command;

    use super::*;

    const DIR: &str = "IDEM_JOURNAL_CRASH_DIR";
    const POINT: &str = "IDEM_JOURNAL_CRASH_POINT";

    fn opts() -> JournalOptions {
        small(4096)
    }

    fn workload() -> Vec<Group> {
        groups(14, 30, 2, 6, 100)
    }

    /// Run by the tests below in a child process: appends, then arms the point and goes on
    /// until the process aborts there.
    #[test]
    #[ignore = "a child process of the crash-point tests"]
    fn crash_child() {
        let (Ok(dir), Ok(point)) = (std::env::var(DIR), std::env::var(POINT)) else {
            return;
        };
        let gs = workload();
        let (mut journal, _) = open(Path::new(&dir), &opts(), 0);
        if point.starts_with("journal.") {
            append_all(&mut journal, &gs[..3]);
            fail::cfg(&point, "return").expect("arming the point");
            let _ = journal.append(&gs[3]);
        } else {
            append_all(&mut journal, &gs);
            fail::cfg(&point, "return").expect("arming the point");
            let _ = journal.drop_through(20);
        }
        // Still alive: the point was not passed. The parent sees a clean exit.
    }

    fn crash_at(point: &str) -> TempDir {
        let dir = TempDir::new().expect("a temporary folder");
        let name = format!(
            "{}::crash_child",
            module_path!()
                .split_once("::")
                .map_or(module_path!(), |(_, rest)| rest)
        );
        let status = Command::new(std::env::current_exe().expect("the test binary"))
            .args(["--exact", &name, "--ignored", "--test-threads=1"])
            .env(DIR, dir.path())
            .env(POINT, point)
            .output()
            .expect("running the child");
        assert_eq!(
            status.status.signal(),
            Some(libc::SIGABRT),
            "{point}: the child did not abort there: {status:?}"
        );
        dir
    }

    #[test]
    fn a_group_is_absent_before_its_write_and_whole_after_it() {
        let gs = workload();
        for (point, whole) in [
            ("journal.before_write", 3),
            ("journal.after_write", 4),
            ("journal.after_sync", 4),
        ] {
            let dir = crash_at(point);
            let (_, recovery) = open(dir.path(), &opts(), 0);
            assert_eq!(recovery.groups, &gs[..whole], "{point}");
            assert_eq!(recovery.truncated, None, "{point}");
        }
    }

    #[test]
    fn a_checkpoint_killed_before_or_after_its_deletions_reopens_from_it() {
        let gs = workload();
        // The same workload without a crash: the segments before and after checkpoint 20.
        let reference = TempDir::new().expect("a temporary folder");
        let (mut journal, _) = open(reference.path(), &opts(), 0);
        append_all(&mut journal, &gs);
        let all = files(reference.path());
        journal.drop_through(20).expect("a checkpoint");
        let kept = files(reference.path());
        assert!(kept.len() < all.len(), "checkpoint 20 deletes a segment");
        for (point, expected) in [
            ("compact.before_delete", &all),
            ("compact.after_delete", &kept),
        ] {
            let dir = crash_at(point);
            assert_eq!(&files(dir.path()), expected, "{point}");
            let (_, recovery) = open(dir.path(), &opts(), 20);
            assert_eq!(recovery.groups, &gs[20..], "{point}");
        }
    }
}

// ---- a measurement -----------------------------------------------------------------------

/// Appends of ~4 KiB records against a bare `pwrite` + `fdatasync` loop of 4 KiB on the
/// same file system, in one run, in rounds that alternate the configurations:
/// `cargo test -p ledger --lib journal::tests::append_figures -- --ignored --nocapture`.
/// `IDEM_JOURNAL_BENCH_N` sets the appends per configuration and round (default 2000),
/// `IDEM_JOURNAL_BENCH_ROUNDS` the rounds (default 3), `IDEM_JOURNAL_BENCH_DIR` the folder
/// (default: the system's temporary folder).
#[test]
#[ignore = "a measurement, printed; run by hand"]
fn append_figures() {
    use std::time::{Duration, Instant};

    let n: usize = std::env::var("IDEM_JOURNAL_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let base = std::env::var("IDEM_JOURNAL_BENCH_DIR")
        .map_or_else(|_| std::env::temp_dir(), PathBuf::from);
    let rounds: usize = std::env::var("IDEM_JOURNAL_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    // One put whose record is exactly 4 KiB.
    let mut record = Group::new(1, 1..2);
    record.put(vec![b'k'; 8], vec![0xa5u8; 4000]);
    let Op::Put { value, .. } = &mut record.ops[0] else {
        unreachable!()
    };
    let short = 4096 - (HEADER_LEN + 1 + 1 + 1 + 8 + 2);
    value.resize(short, 0xa5);
    assert_eq!(record.record_len(), 4096);

    #[derive(Clone, Copy, PartialEq)]
    enum Run {
        Bare { dsync: bool, zeros: bool },
        Journal(SyncMode, Preallocate),
    }
    let runs = [
        (
            "bare pwrite+fdatasync, written zeros",
            Run::Bare {
                dsync: false,
                zeros: true,
            },
        ),
        (
            "bare pwrite+fdatasync, growing file",
            Run::Bare {
                dsync: false,
                zeros: false,
            },
        ),
        (
            "bare pwrite O_DSYNC, written zeros",
            Run::Bare {
                dsync: true,
                zeros: true,
            },
        ),
        (
            "journal fdatasync, zeros",
            Run::Journal(SyncMode::Fdatasync, Preallocate::Zeros),
        ),
        (
            "journal fdatasync, fallocate",
            Run::Journal(SyncMode::Fdatasync, Preallocate::Fallocate),
        ),
        (
            "journal fdatasync, grow",
            Run::Journal(SyncMode::Fdatasync, Preallocate::Grow),
        ),
        (
            "journal O_DSYNC, zeros",
            Run::Journal(SyncMode::Dsync, Preallocate::Zeros),
        ),
        (
            "journal O_DSYNC, fallocate",
            Run::Journal(SyncMode::Dsync, Preallocate::Fallocate),
        ),
        (
            "journal O_DSYNC, grow",
            Run::Journal(SyncMode::Dsync, Preallocate::Grow),
        ),
    ];
    let segment = (n as u64 + 16) * 4096;
    let mut results: Vec<Vec<(f64, Duration, Duration)>> = vec![Vec::new(); runs.len()];
    let mut segment_made: Vec<Duration> = vec![Duration::ZERO; runs.len()];
    for _ in 0..rounds {
        for (i, (_, run)) in runs.iter().enumerate() {
            let dir = TempDir::new_in(&base).expect("a temporary folder");
            let mut lat = Vec::with_capacity(n);
            let started;
            match *run {
                Run::Bare { dsync, zeros } => {
                    let path = dir.path().join("bare");
                    let file = File::create(&path).expect("creating");
                    if zeros {
                        write_zeros(&file, segment).expect("zeros");
                        file.sync_all().expect("sync");
                    }
                    drop(file);
                    let file = open_segment(
                        &OsFs,
                        &path,
                        if dsync {
                            SyncMode::Dsync
                        } else {
                            SyncMode::Fdatasync
                        },
                    )
                    .expect("opening");
                    let block = vec![0x5au8; 4096];
                    started = Instant::now();
                    for k in 0..n {
                        let t = Instant::now();
                        file.write_all_at(&block, k as u64 * 4096).expect("pwrite");
                        if !dsync {
                            file.sync_data().expect("fdatasync");
                        }
                        lat.push(t.elapsed());
                    }
                }
                Run::Journal(sync, preallocate) => {
                    // No spare made ahead here: its zeros would compete with the loop.
                    let opts = JournalOptions {
                        prepare_ahead: false,
                        ..options(segment, sync, preallocate)
                    };
                    let (mut journal, _) = open(dir.path(), &opts, 0);
                    // The first append makes the segment; timed apart.
                    let t = Instant::now();
                    journal.append(&record).expect("append");
                    segment_made[i] = segment_made[i].max(t.elapsed());
                    let mut g = record.clone();
                    started = Instant::now();
                    for k in 0..n {
                        g.number = k as u64 + 2;
                        let t = Instant::now();
                        journal.append(&g).expect("append");
                        lat.push(t.elapsed());
                    }
                }
            }
            let rate = n as f64 / started.elapsed().as_secs_f64();
            lat.sort_unstable();
            results[i].push((rate, lat[n / 2], lat[n * 99 / 100]));
        }
    }
    let median = |v: &[(f64, Duration, Duration)]| {
        let mut v = v.to_vec();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v[v.len() / 2]
    };
    let floor = median(&results[0]).0;
    println!(
        "\n{n} appends of 4096 bytes per configuration and round, {rounds} rounds alternating, \
         median round; folder {}",
        base.display()
    );
    println!(
        "| configuration | per s | p50 µs | p99 µs | × bare rate | first append (makes the segment) |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for (i, (name, run)) in runs.iter().enumerate() {
        let (rate, p50, p99) = median(&results[i]);
        let made = match run {
            Run::Journal(..) => format!("{:.1} ms", segment_made[i].as_secs_f64() * 1e3),
            Run::Bare { .. } => String::new(),
        };
        println!(
            "| {name} | {rate:.0} | {} | {} | {:.2} | {made} |",
            p50.as_micros(),
            p99.as_micros(),
            rate / floor
        );
    }
    // Starting a 64 MiB segment: made by the append itself, or renamed from the spare made
    // ahead; and appends while the next spare is being made beside them.
    println!("\nstarting a segment of 64 MiB, and 4 KiB appends while the next is made ahead:");
    println!(
        "| preallocation | made by the append | renamed from the spare | appends meanwhile | p50 µs | p99 µs |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for preallocate in [Preallocate::Zeros, Preallocate::Fallocate] {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let opts = options(64 << 20, SyncMode::Fdatasync, preallocate);
        let dir = TempDir::new_in(&base).expect("a temporary folder");
        let (mut journal, _) = open(
            dir.path(),
            &JournalOptions {
                prepare_ahead: false,
                ..opts.clone()
            },
            0,
        );
        let t = Instant::now();
        journal.append(&record).expect("append");
        let inline = t.elapsed();
        drop(journal);
        let dir = TempDir::new_in(&base).expect("a temporary folder");
        let (mut journal, _) = open(dir.path(), &opts, 0);
        spare_ready(&journal);
        let t = Instant::now();
        journal.append(&record).expect("append");
        let renamed = t.elapsed();
        let mut g = record.clone();
        let mut lat = Vec::new();
        let ready = |j: &Journal| {
            j.spare
                .as_ref()
                .is_some_and(|s| s.ready.load(Ordering::Acquire))
        };
        while !ready(&journal) || lat.len() < 100 {
            g.number = journal.next_group();
            let t = Instant::now();
            journal.append(&g).expect("append");
            lat.push(t.elapsed());
        }
        lat.sort_unstable();
        println!(
            "| {preallocate:?} | {:.1} ms | {:.2} ms | {} | {} | {} |",
            ms(inline),
            ms(renamed),
            lat.len(),
            lat[lat.len() / 2].as_micros(),
            lat[lat.len() * 99 / 100].as_micros()
        );
    }
    // Encoding and checksum alone, for scale.
    let mut buf = Vec::new();
    let t = Instant::now();
    for _ in 0..n {
        encode(&record, &mut buf).expect("encoding");
    }
    println!(
        "encoding + CRC32C of one 4 KiB record: {:.2} µs",
        t.elapsed().as_secs_f64() * 1e6 / n as f64
    );
}
