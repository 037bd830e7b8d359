//! The simulated disk's own rules, each against a crash with chosen answers.

use super::*;

fn dir() -> &'static Path {
    Path::new("/d")
}

fn file() -> PathBuf {
    dir().join("f")
}

/// A folder synced, holding `f` with `durable` synced and its name synced.
fn synced(durable: &[u8]) -> (SimFs, SimFile) {
    let fs = SimFs::new();
    fs.create_dir_all(dir()).expect("a folder");
    fs.sync_dir(Path::new("/")).expect("syncing /");
    let f = fs.open(&file(), Open::CREATE_NEW).expect("creating");
    f.write_all_at(durable, 0).expect("writing");
    f.sync_data().expect("syncing");
    fs.sync_dir(dir()).expect("syncing the folder");
    (fs, f)
}

/// Answers the choices in turn, checking each question's `n`.
fn script(answers: &[(u64, u64)]) -> impl FnMut(u64) -> u64 + '_ {
    let mut next = answers.iter();
    move |n| {
        let &(asked, answer) = next.next().expect("no more choices were expected");
        assert_eq!(n, asked, "a choice among {n}, where {asked} was expected");
        answer
    }
}

fn never(_: u64) -> u64 {
    panic!("no choice was expected")
}

fn content(fs: &SimFs, path: &Path) -> Option<Vec<u8>> {
    fs.read(path).ok()
}

#[test]
fn what_was_synced_survives_with_no_choice_and_the_original_is_unchanged() {
    let (fs, _f) = synced(b"hello");
    let after = fs.crash(never);
    assert_eq!(content(&after, &file()), Some(b"hello".to_vec()));
    assert_eq!(content(&fs, &file()), Some(b"hello".to_vec()));
}

#[test]
fn an_unsynced_write_is_lost_kept_torn_or_flipped_as_chosen() {
    let (fs, f) = synced(b"0123456789");
    f.write_all_at(b"abcd", 2).expect("writing");
    let crash = |answers: &[(u64, u64)]| content(&fs.crash(script(answers)), &file());
    assert_eq!(crash(&[(4, 0)]), Some(b"0123456789".to_vec()));
    assert_eq!(crash(&[(4, 1)]), Some(b"01abcd6789".to_vec()));
    assert_eq!(crash(&[(4, 2), (4, 3)]), Some(b"01abc56789".to_vec()));
    assert_eq!(crash(&[(4, 2), (4, 0)]), Some(b"0123456789".to_vec()));
    // Bit 9 of the write: bit 1 of its second byte, b'b' ^ 2 = b'`'.
    assert_eq!(crash(&[(4, 3), (32, 9)]), Some(b"01a`cd6789".to_vec()));
    // The live file was not touched by any of it.
    assert_eq!(content(&fs, &file()), Some(b"01abcd6789".to_vec()));
}

#[test]
fn unsynced_writes_past_the_end_and_length_changes_each_get_their_own_fate() {
    let (fs, f) = synced(b"abc");
    f.set_len(1).expect("cutting");
    f.write_all_at(b"XY", 5).expect("writing");
    let crash = |answers: &[(u64, u64)]| content(&fs.crash(script(answers)), &file());
    assert_eq!(crash(&[(2, 0), (4, 0)]), Some(b"abc".to_vec()));
    assert_eq!(crash(&[(2, 1), (4, 0)]), Some(b"a".to_vec()));
    assert_eq!(crash(&[(2, 1), (4, 1)]), Some(b"a\0\0\0\0XY".to_vec()));
    assert_eq!(crash(&[(2, 0), (4, 2), (2, 1)]), Some(b"abc\0\0X".to_vec()));
    f.sync_all().expect("syncing");
    assert_eq!(
        content(&fs.crash(never), &file()),
        Some(b"a\0\0\0\0XY".to_vec())
    );
}

#[test]
fn a_dsync_write_is_durable_once_it_returns() {
    let (fs, _) = synced(b"....");
    let f = fs
        .open(&file(), Open::READ_WRITE.dsync(true))
        .expect("opening");
    f.write_all_at(b"ok", 1).expect("writing");
    assert_eq!(content(&fs.crash(never), &file()), Some(b".ok.".to_vec()));
}

#[test]
fn names_are_durable_only_once_their_folder_is_synced() {
    let (fs, f) = synced(b"old");
    // A new file, synced, its name not: lost with its name, or kept.
    let new = dir().join("new");
    let g = fs.open(&new, Open::CREATE_NEW).expect("creating");
    g.write_all_at(b"data", 0).expect("writing");
    g.sync_data().expect("syncing");
    assert_eq!(content(&fs.crash(script(&[(2, 0)])), &new), None);
    assert_eq!(
        content(&fs.crash(script(&[(2, 1)])), &new),
        Some(b"data".to_vec())
    );
    fs.sync_dir(dir()).expect("syncing the folder");
    // A rename and a removal, unsynced: none, the first, or both survive, in order.
    let renamed = dir().join("renamed");
    fs.rename(&file(), &renamed).expect("renaming");
    fs.remove_file(&new).expect("removing");
    let names = |keep: u64| {
        let after = fs.crash(script(&[(3, keep)]));
        (
            content(&after, &file()),
            content(&after, &renamed),
            content(&after, &new),
        )
    };
    assert_eq!(
        names(0),
        (Some(b"old".to_vec()), None, Some(b"data".to_vec()))
    );
    assert_eq!(
        names(1),
        (None, Some(b"old".to_vec()), Some(b"data".to_vec()))
    );
    assert_eq!(names(2), (None, Some(b"old".to_vec()), None));
    drop(f);
}

#[test]
fn a_folder_whose_own_name_was_not_synced_is_lost_with_its_files() {
    let fs = SimFs::new();
    let deep = Path::new("/a/b");
    fs.create_dir_all(deep).expect("folders");
    let f = fs
        .open(&deep.join("f"), Open::CREATE_NEW)
        .expect("creating");
    f.write_all_at(b"x", 0).expect("writing");
    f.sync_all().expect("syncing");
    fs.sync_dir(deep).expect("syncing /a/b");
    // `/a` is pending in `/`, `/a/b` in `/a`.
    let lost = fs.crash(script(&[(2, 0), (2, 1)]));
    assert!(!lost.exists(deep) && content(&lost, &deep.join("f")).is_none());
    let kept = fs.crash(script(&[(2, 1), (2, 1)]));
    assert_eq!(content(&kept, &deep.join("f")), Some(b"x".to_vec()));
}

#[test]
fn the_power_goes_during_the_chosen_call_and_every_call_after_it_fails() {
    let (fs, f) = synced(b"0000");
    let before = fs.ops();
    fs.power_off_after(1);
    f.write_all_at(b"1", 0).expect("the first call completes");
    // A dsync write cut short: reached the file, not made durable.
    let d = fs.open(&file(), Open::READ_WRITE.dsync(true));
    let d = d.expect("opening is no change");
    assert!(d.write_all_at(b"2", 1).is_err());
    assert!(fs.is_off() && f.sync_data().is_err() && fs.read(&file()).is_err());
    assert_eq!(fs.ops(), before + 2);
    // Both writes are unsynced: kept whole or lost, as chosen.
    let after = fs.crash(script(&[(4, 1), (4, 0)]));
    assert_eq!(content(&after, &file()), Some(b"1000".to_vec()));
    let after = fs.crash(script(&[(4, 0), (4, 1)]));
    assert_eq!(content(&after, &file()), Some(b"0200".to_vec()));
}

#[test]
fn the_same_choices_give_the_same_files_and_a_fork_goes_its_own_way() {
    let (fs, f) = synced(&[7u8; 64]);
    for i in 0..8u8 {
        f.write_all_at(&[i; 8], u64::from(i) * 8).expect("writing");
    }
    let fork = fs.fork();
    f.sync_data().expect("syncing");
    let seeded = |fs: &SimFs, seed: u64| {
        let mut x = seed;
        let after = fs.crash(|n| {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (x >> 33) % n
        });
        content(&after, &file())
    };
    for seed in 0..50 {
        assert_eq!(seeded(&fork, seed), seeded(&fork, seed));
    }
    assert!((0..50).any(|seed| seeded(&fork, seed) != seeded(&fs, seed)));
    assert_eq!(seeded(&fs, 1), content(&fs, &file()));
}
