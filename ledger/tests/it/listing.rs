//! Paging through keys: a filter that matches little never makes one call scan everything,
//! and following `next` visits every key exactly once.

use std::collections::HashSet;
use std::sync::Arc;

use ledger::*;

use crate::support::*;

fn submit_many(ledger: &SledStore, keys: Vec<String>) {
    let keys = Arc::new(keys);
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let (ledger, keys) = (ledger.clone(), keys.clone());
            std::thread::spawn(move || {
                let client = ClientId::default_client();
                for (i, k) in keys.iter().enumerate().skip(t).step_by(16) {
                    let s = ledger
                        .blocking()
                        .submit(
                            &client,
                            &Key::parse(k).unwrap(),
                            deposit(&format!("acct{}", i % 50), 10, rub()),
                        )
                        .unwrap();
                    assert!(matches!(s, Submission::Executed(_)));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn filtered_pages_stop_early_and_following_next_finds_everything() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Timestamp(1_767_225_600_000));
    let mut config = SledConfig::new(dir.path().join("l")).clock(Arc::new(clock.clone()));
    // Durability is not under test here; speed is welcome.
    config.fsync = false;
    let (ledger, _) = SledStore::open(config).unwrap();
    // 100 keys that will expire; they sort after everything else ("z-").
    submit_many(&ledger, (0..100).map(|i| format!("z-{i:03}")).collect());
    clock.advance_ms(25 * 3_600_000);
    let total = u32::try_from(KEYS_SCAN_MAX).unwrap() + 5_000;
    submit_many(&ledger, (0..total).map(|i| format!("a-{i:06}")).collect());
    assert_eq!(ledger.blocking().sweep().unwrap(), 100);

    // The expired keys lie beyond one call's scan: the first page is empty but not the end.
    let first = ledger
        .blocking()
        .keys(Some(KeyStatus::Expired), None, None, 50)
        .unwrap();
    assert!(first.keys.is_empty());
    assert!(
        first.next.is_some(),
        "a capped scan must say where to go on"
    );

    let mut expired = Vec::new();
    let mut after = None;
    let mut calls = 0;
    loop {
        calls += 1;
        let page = ledger
            .blocking()
            .keys(
                Some(KeyStatus::Expired),
                None,
                after.as_ref().map(|(c, k)| (c, k)),
                50,
            )
            .unwrap();
        assert!(page.keys.iter().all(|k| k.status == KeyStatus::Expired));
        expired.extend(page.keys.iter().map(|k| k.key.as_str().to_owned()));
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
        assert!(calls < 100, "paging does not end");
    }
    let expect: Vec<String> = (0..100).map(|i| format!("z-{i:03}")).collect();
    assert_eq!(expired, expect);

    // Unfiltered, pages of 1,000 visit every key once, in order.
    let mut seen = HashSet::new();
    let mut previous: Option<String> = None;
    let mut after = None;
    loop {
        let page = ledger
            .blocking()
            .keys(None, None, after.as_ref().map(|(c, k)| (c, k)), 1_000)
            .unwrap();
        for k in &page.keys {
            let name = k.key.as_str().to_owned();
            assert!(
                previous.as_ref().is_none_or(|p| *p < name),
                "out of order at {name}"
            );
            assert!(seen.insert(name.clone()), "{name} twice");
            previous = Some(name);
        }
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    assert_eq!(seen.len(), usize::try_from(total).unwrap() + 100);
    ledger.blocking().shutdown();
}
