//! The log in sled: facts under `f seq`. A record holds one fact, or a block of
//! consecutive facts of one group under the first one's seq.
//!
//! Why blocks: sled's costs are per record. Each insert writes a fragment to its log and
//! copies a leaf of up to 17 records; a scan pulls each leaf from the file. A group's
//! facts written as one record cost one insert instead of one per command, and a scan of
//! the log reads a few thousand leaves per million facts instead of over a hundred
//! thousand. A group of one, and every ledger written before blocks, holds plain records,
//! which read as blocks of one: the layout needs no conversion.
//!
//! A block: [`BLOCK_TAG`], [`BLOCK_VERSION`], then each fact's encoding after its length
//! (a varint). No fact encoding starts with [`BLOCK_TAG`].

use std::ops::Range;

use sled::IVec;

use super::index::{Index, Record};
use super::journal::{Group, Op, put_varint, take_varint};
use super::records::{fact_key, seq_of};
use crate::fact::{DecodeError, Fact};

pub(super) const BLOCK_TAG: u8 = 0x10;
pub(super) const BLOCK_VERSION: u8 = 1;
/// A block is closed before it would pass this many bytes. sled writes a page larger than
/// a quarter of its 512 KiB segment to a file of its own, and a leaf holds up to 17
/// records: 17 blocks of 4 KiB stay well below that.
pub(super) const BLOCK_BYTES: usize = 4096;

/// One fact's encoding inside a log record.
pub(super) struct Entry {
    pub(super) seq: u64,
    record: IVec,
    at: Range<usize>,
}

impl Entry {
    pub(super) fn bytes(&self) -> &[u8] {
        &self.record[self.at.clone()]
    }

    pub(super) fn decode(&self) -> Result<Fact, DecodeError> {
        Fact::decode(self.seq, self.bytes())
    }
}

/// A log record that cannot be read as facts. `seq` is the record's key, when it has one
/// of the right length.
#[derive(Debug)]
pub(super) struct Damage {
    pub(super) seq: Option<u64>,
    pub(super) error: DecodeError,
}

/// The ranges of a record's facts in its value.
fn split(value: &[u8]) -> Result<Vec<Range<usize>>, DecodeError> {
    if value.first() != Some(&BLOCK_TAG) {
        let whole = 0..value.len();
        return Ok(vec![whole]);
    }
    if value.get(1) != Some(&BLOCK_VERSION) {
        return Err(DecodeError::new(
            "log block",
            format!("unknown version {:?}", value.get(1)),
        ));
    }
    let mut rest = &value[2..];
    let mut out = Vec::new();
    while !rest.is_empty() {
        let len = take_varint(&mut rest).map_err(|e| DecodeError::new("log block", e))?;
        let len = usize::try_from(len)
            .ok()
            .filter(|&l| l > 0 && l <= rest.len())
            .ok_or_else(|| {
                DecodeError::new(
                    "log block",
                    format!("a fact of {len} bytes with {} left", rest.len()),
                )
            })?;
        let start = value.len() - rest.len();
        out.push(start..start + len);
        rest = &rest[len..];
    }
    if out.is_empty() {
        return Err(DecodeError::new("log block", "no facts"));
    }
    Ok(out)
}

/// The facts of one record whose key is `k`.
pub(super) fn entries(k: &[u8], record: IVec) -> Result<Vec<Entry>, Damage> {
    let Some(first) = seq_of(k) else {
        return Err(Damage {
            seq: None,
            error: DecodeError::new("log key", "length"),
        });
    };
    let ranges = split(&record).map_err(|error| Damage {
        seq: Some(first),
        error,
    })?;
    Ok(ranges
        .into_iter()
        .zip(first..)
        .map(|(at, seq)| Entry {
            seq,
            record: record.clone(),
            at,
        })
        .collect())
}

/// The facts with seq in `from..=to`, in order: each item a fact, or a record that could
/// not be read (after which reading goes on with the next record).
pub(super) struct Facts<R = sled::Iter> {
    records: R,
    from: u64,
    to: u64,
    pending: std::vec::IntoIter<Entry>,
}

impl Facts {
    pub(super) fn new<I: Index>(
        index: &I,
        from: u64,
        to: u64,
    ) -> sled::Result<Facts<I::Range<'_>>> {
        // The record holding `from` may be a block that starts before it.
        let start = match index.records(&fact_key(0), &fact_key(from)).next_back() {
            Some(item) => {
                let (k, _) = item?;
                seq_of(&k).unwrap_or(from)
            }
            None => from,
        };
        Ok(Facts {
            records: index.records(&fact_key(start), &fact_key(to)),
            from,
            to,
            pending: Vec::new().into_iter(),
        })
    }
}

impl<R: Iterator<Item = sled::Result<Record>>> Iterator for Facts<R> {
    type Item = sled::Result<Result<Entry, Damage>>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(e) = self.pending.next() {
                if e.seq < self.from {
                    continue;
                }
                if e.seq > self.to {
                    return None;
                }
                return Some(Ok(Ok(e)));
            }
            let (k, v) = match self.records.next()? {
                Ok(kv) => kv,
                Err(e) => return Some(Err(e)),
            };
            match entries(&k, v) {
                Ok(list) => self.pending = list.into_iter(),
                Err(d) if d.seq.is_some_and(|s| s < self.from) => continue,
                Err(d) => return Some(Ok(Err(d))),
            }
        }
    }
}

/// The fact numbered `seq`, if the log holds it.
pub(super) fn fact(index: &impl Index, seq: u64) -> sled::Result<Result<Option<Fact>, Damage>> {
    let Some(item) = index.records(&fact_key(0), &fact_key(seq)).next_back() else {
        return Ok(Ok(None));
    };
    let (k, v) = item?;
    Ok(match entries(&k, v) {
        Ok(list) => list
            .into_iter()
            .find(|e| e.seq == seq)
            .map(|e| e.decode())
            .transpose()
            .map_err(|error| Damage {
                seq: Some(seq),
                error,
            }),
        Err(d) => Err(d),
    })
}

/// The log's last fact's entry.
pub(super) fn last(index: &impl Index) -> sled::Result<Result<Option<Entry>, Damage>> {
    let Some(item) = index.records(&fact_key(0), &fact_key(u64::MAX)).next_back() else {
        return Ok(Ok(None));
    };
    let (k, v) = item?;
    Ok(entries(&k, v).map(|list| list.into_iter().last()))
}

/// Puts a group's facts (consecutive seqs, in order) into `group` ahead of its other
/// operations, so that a reader of sled never finds a key record before its fact: one
/// plain record for a single fact, else blocks of at most [`BLOCK_BYTES`].
pub(super) fn put_facts(group: &mut Group, facts: Vec<(u64, Vec<u8>)>) {
    let put = |first: u64, value: Vec<u8>| Op::Put {
        key: fact_key(first).to_vec(),
        value,
    };
    let mut ops = Vec::with_capacity(group.ops.len() + facts.len().div_ceil(32));
    if facts.len() == 1 {
        ops.extend(facts.into_iter().map(|(seq, bytes)| put(seq, bytes)));
    } else {
        let mut block: Option<(u64, Vec<u8>)> = None;
        for (seq, bytes) in facts {
            // 5 bytes: the longest varint a fact's length takes.
            if let Some((first, value)) =
                block.take_if(|(_, b)| b.len() + bytes.len() + 5 > BLOCK_BYTES)
            {
                ops.push(put(first, value));
            }
            let (_, b) = block.get_or_insert_with(|| (seq, vec![BLOCK_TAG, BLOCK_VERSION]));
            put_varint(b, bytes.len() as u64);
            b.extend_from_slice(&bytes);
        }
        ops.extend(block.map(|(first, value)| put(first, value)));
    }
    ops.append(&mut group.ops);
    group.ops = ops;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::domain::{Account, Amount, ClientId, Currency, Key, Timestamp};
    use crate::fact::FactBody;
    use crate::store::sled::records::P_FACT;

    fn deposit(seq: u64, key_len: usize) -> Fact {
        Fact {
            seq,
            at: Timestamp(1_800_000_000_000 + i64::try_from(seq).unwrap()),
            client: ClientId::default_client(),
            key: Key::parse(&format!("d-{seq}-{}", "x".repeat(key_len))).unwrap(),
            body: FactBody::DepositRecorded {
                account: Account::parse("alice").unwrap(),
                amount: Amount::new(seq).unwrap(),
                currency: Currency::parse("RUB").unwrap(),
                balance_after: u128::from(seq),
            },
        }
    }

    fn tree() -> sled::Tree {
        let db = sled::Config::new().temporary(true).open().unwrap();
        db.open_tree("ledger").unwrap()
    }

    /// Writes groups of the given sizes, seqs from 1, as the committer does.
    fn write(tree: &sled::Tree, sizes: &[u64], key_len: usize) -> (Vec<Fact>, Vec<Group>) {
        let (mut facts, mut groups, mut next) = (Vec::new(), Vec::new(), 1);
        for (n, &size) in sizes.iter().enumerate() {
            let mut group = Group::new(n as u64 + 1, next..next + size);
            group.put(b"k-other".to_vec(), b"after the facts".to_vec());
            let these: Vec<Fact> = (next..next + size).map(|s| deposit(s, key_len)).collect();
            put_facts(
                &mut group,
                these.iter().map(|f| (f.seq, f.encode())).collect(),
            );
            group.apply(tree).unwrap();
            facts.extend(these);
            groups.push(group);
            next += size;
        }
        (facts, groups)
    }

    fn read(tree: &sled::Tree, from: u64, to: u64) -> Vec<Fact> {
        Facts::new(tree, from, to)
            .unwrap()
            .map(|item| item.unwrap().unwrap().decode().unwrap())
            .collect()
    }

    #[test]
    fn a_group_of_one_is_a_plain_record_and_larger_groups_are_blocks() {
        let t = tree();
        let (facts, groups) = write(&t, &[1, 3, 1], 0);
        // The plain record is the fact's own encoding, as every ledger before blocks held.
        let Op::Put { key, value } = &groups[0].ops[0] else {
            panic!("the fact first")
        };
        assert_eq!(
            (key.as_slice(), value),
            (&fact_key(1)[..], &facts[0].encode())
        );
        let Op::Put { key, value } = &groups[1].ops[0] else {
            panic!("the block first")
        };
        assert_eq!(key.as_slice(), &fact_key(2)[..]);
        assert_eq!(value[..2], [BLOCK_TAG, BLOCK_VERSION]);
        // The facts come before the group's other operations.
        assert!(matches!(&groups[1].ops[1], Op::Put { key, .. } if key == b"k-other"));
        assert_eq!(t.scan_prefix([P_FACT]).count(), 3);
        assert_eq!(read(&t, 1, u64::MAX), facts);
    }

    #[test]
    fn every_range_and_every_seq_reads_the_facts_written() {
        let t = tree();
        let (facts, _) = write(&t, &[1, 2, 5, 1, 7, 3], 0);
        let n = facts.len() as u64;
        for from in 0..=n + 1 {
            for to in from..=n + 1 {
                let want: Vec<Fact> = facts
                    .iter()
                    .filter(|f| f.seq >= from && f.seq <= to)
                    .cloned()
                    .collect();
                assert_eq!(read(&t, from, to), want, "{from}..={to}");
            }
        }
        for f in &facts {
            assert_eq!(fact(&t, f.seq).unwrap().unwrap().as_ref(), Some(f));
        }
        assert_eq!(fact(&t, n + 1).unwrap().unwrap(), None);
        assert_eq!(fact(&t, 0).unwrap().unwrap(), None);
        let last = last(&t).unwrap().unwrap().unwrap();
        assert_eq!(
            (last.seq, last.decode().unwrap()),
            (n, facts[facts.len() - 1].clone())
        );
    }

    #[test]
    fn a_large_group_is_cut_into_blocks_of_bounded_size() {
        let t = tree();
        let (facts, groups) = write(&t, &[500], 100);
        let blocks: Vec<&Op> = groups[0]
            .ops
            .iter()
            .filter(|op| matches!(op, Op::Put { key, .. } if key[0] == P_FACT))
            .collect();
        assert!(blocks.len() > 1, "{} blocks", blocks.len());
        for op in blocks {
            let Op::Put { value, .. } = op else {
                unreachable!()
            };
            assert!(value.len() <= BLOCK_BYTES, "{}", value.len());
        }
        assert_eq!(read(&t, 1, u64::MAX), facts);
        assert_eq!(read(&t, 250, 260), facts[249..260].to_vec());
    }

    #[test]
    fn a_damaged_record_is_named_and_reading_goes_on() {
        let t = tree();
        let (facts, _) = write(&t, &[3, 2], 0);
        let good = t.get(fact_key(1)).unwrap().unwrap();
        for (bad, what) in [
            (vec![BLOCK_TAG, 9, 3, 1, 2, 3], "unknown version"),
            (vec![BLOCK_TAG, BLOCK_VERSION], "no facts"),
            (
                vec![BLOCK_TAG, BLOCK_VERSION, 40, 1, 2],
                "a fact of 40 bytes",
            ),
            (vec![BLOCK_TAG, BLOCK_VERSION, 0x80], "varint cut short"),
            (vec![BLOCK_TAG, BLOCK_VERSION, 0], "a fact of 0 bytes"),
        ] {
            t.insert(fact_key(1), bad).unwrap();
            let items: Vec<_> = Facts::new(&t, 1, u64::MAX)
                .unwrap()
                .map(|i| i.unwrap())
                .collect();
            let Err(d) = &items[0] else {
                panic!("{what}: read as a fact")
            };
            assert_eq!(d.seq, Some(1));
            assert!(d.error.to_string().contains(what), "{what}: {}", d.error);
            // The next record is read whole.
            let rest: Vec<u64> = items[1..].iter().map(|i| i.as_ref().unwrap().seq).collect();
            assert_eq!(rest, [4, 5], "{what}");
            assert!(fact(&t, 2).unwrap().is_err(), "{what}");
            assert_eq!(fact(&t, 4).unwrap().unwrap().as_ref(), Some(&facts[3]));
        }
        t.insert(fact_key(1), good).unwrap();
        assert_eq!(read(&t, 1, u64::MAX), facts);
    }

    proptest::proptest! {
        /// Any bytes under a log key read as facts within the record, in order and without
        /// overlap, or as damage: never a panic, never a range outside the value.
        #[test]
        fn any_record_splits_into_ranges_inside_it_or_is_damage(
            block in proptest::prelude::any::<bool>(),
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
        ) {
            let mut value = if block { vec![BLOCK_TAG, BLOCK_VERSION] } else { Vec::new() };
            value.extend(body);
            if let Ok(ranges) = split(&value) {
                let mut end = 0;
                for r in ranges {
                    // A plain record is one fact however short; decoding it judges it.
                    proptest::prop_assert!(r.start >= end && r.start <= r.end);
                    proptest::prop_assert!(r.end <= value.len());
                    end = r.end;
                }
            }
        }

        /// Groups of any sizes, written and read back whole and from any seq.
        #[test]
        fn groups_of_any_sizes_read_back(
            sizes in proptest::collection::vec(1u64..80, 1..6),
            key_len in 0usize..60,
            from in 0u64..400,
        ) {
            let t = tree();
            let (facts, _) = write(&t, &sizes, key_len);
            proptest::prop_assert_eq!(read(&t, 1, u64::MAX), facts.clone());
            let tail: Vec<Fact> = facts.into_iter().filter(|f| f.seq >= from).collect();
            proptest::prop_assert_eq!(read(&t, from, u64::MAX), tail);
        }
    }
}
