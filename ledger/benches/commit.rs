//! `cargo bench -p ledger --bench commit`: criterion throughput of durable commands with
//! 1, 8 and 64 concurrent submitters, for new keys and for replays. Each iteration is one
//! command; `iter_custom` splits the iterations across the submitters and times the whole.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ledger::*;

fn withdraw(account: &Account) -> Command {
    Command::Withdraw {
        account: account.clone(),
        amount: Amount::new(1).unwrap(),
        currency: Currency::parse("RUB").unwrap(),
    }
}

fn submit_all(
    ledger: &SledStore,
    accounts: &[Account],
    submitters: u64,
    iters: u64,
    keys: &(dyn Fn(u64) -> u64 + Sync),
    prefix: &str,
) -> Duration {
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..submitters {
            let next = next.clone();
            s.spawn(move || {
                let client = ClientId::default_client();
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= iters {
                        break;
                    }
                    // Each key number always names the same account, so a replay is a replay.
                    let k = keys(n);
                    let key = Key::parse(&format!("{prefix}-{k}")).unwrap();
                    let account = &accounts[usize::try_from(k % 100).unwrap()];
                    let s = ledger
                        .blocking()
                        .submit(&client, &key, withdraw(account))
                        .unwrap();
                    assert!(s.outcome().is_some_and(Outcome::is_applied));
                }
            });
        }
    });
    started.elapsed()
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _) = SledStore::open(SledConfig::new(dir.path().join("l"))).unwrap();
    let client = ClientId::default_client();
    let accounts: Vec<Account> = (0..100)
        .map(|i| Account::parse(&format!("acct{i}")).unwrap())
        .collect();
    for (i, a) in accounts.iter().enumerate() {
        ledger
            .blocking()
            .submit(
                &client,
                &Key::parse(&format!("seed-{i}")).unwrap(),
                Command::Deposit {
                    account: a.clone(),
                    amount: Amount::new(1_000_000_000_000_000).unwrap(),
                    currency: Currency::parse("RUB").unwrap(),
                },
            )
            .unwrap();
    }
    for n in 0..10_000u64 {
        let key = Key::parse(&format!("replay-{n}")).unwrap();
        let account = &accounts[usize::try_from(n % 100).unwrap()];
        ledger
            .blocking()
            .submit(&client, &key, withdraw(account))
            .unwrap();
    }
    let fresh = AtomicU64::new(0);
    let mut group = c.benchmark_group("durable");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(4))
        .throughput(Throughput::Elements(1));
    for submitters in [1u64, 8, 64] {
        group.bench_with_input(
            BenchmarkId::new("new_key", submitters),
            &submitters,
            |b, &n| {
                b.iter_custom(|iters| {
                    let base = fresh.fetch_add(iters, Ordering::Relaxed);
                    submit_all(&ledger, &accounts, n, iters, &|i| base + i, "new")
                });
            },
        );
        group.bench_with_input(
            BenchmarkId::new("replay", submitters),
            &submitters,
            |b, &n| {
                b.iter_custom(|iters| {
                    submit_all(
                        &ledger,
                        &accounts,
                        n,
                        iters,
                        &|i| (i * 7919) % 10_000,
                        "replay",
                    )
                });
            },
        );
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
