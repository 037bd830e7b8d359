//! `cargo bench -p ledger --bench pg_verify`: how fast `verify` reads a PostgreSQL ledger,
//! on one session and on two, each beside the floor under it measured in the same run: the
//! same server streaming the same rows, read the same way, to a client that only counts
//! them.
//! IDEM_BENCH_FACTS (default 100,000) sets the ledger's size; IDEM_PG_URL the server.
//! IDEM_BENCH_PG_KEEP=1 keeps the filled database and prints its URL; IDEM_BENCH_PG_URL
//! measures an existing ledger instead of filling a new one.
// A measuring tool: lossy casts of counts and durations to print them are fine here.
#![allow(
    clippy::unwrap_used,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use futures_util::TryStreamExt as _;
use ledger::testing::PgTestDb;
use ledger::*;
use tokio_postgres::NoTls;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn rub() -> Currency {
    Currency::parse("RUB").unwrap()
}

/// Fills the ledger through the store itself, so every row is what a worker writes.
async fn fill(store: &Arc<PgStore>, facts: u64) {
    let client = ClientId::default_client();
    let accounts: Vec<Account> = (0..1000)
        .map(|i| Account::parse(&format!("acct{i}")).unwrap())
        .collect();
    for (i, a) in accounts.iter().enumerate() {
        let deposit = Command::Deposit {
            account: a.clone(),
            amount: Amount::new(1_000_000_000_000).unwrap(),
            currency: rub(),
        };
        let key = Key::parse(&format!("seed-{i}")).unwrap();
        store.submit(&client, &key, deposit, None).await.unwrap();
    }
    let accounts = Arc::new(accounts);
    let next = Arc::new(AtomicU64::new(0));
    let target = facts.saturating_sub(accounts.len() as u64);
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (store, next, accounts, client) = (
                store.clone(),
                next.clone(),
                accounts.clone(),
                client.clone(),
            );
            tokio::spawn(async move {
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= target {
                        break;
                    }
                    let withdraw = Command::Withdraw {
                        account: accounts[(n as usize) % accounts.len()].clone(),
                        amount: Amount::new(1 + n % 1000).unwrap(),
                        currency: rub(),
                    };
                    let key = Key::parse(&format!("ord-{n:08}")).unwrap();
                    store.submit(&client, &key, withdraw, None).await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

/// The worker that runs verify allocates with mimalloc; so does this bench.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Counts the rows of `sql` in `tx`, streamed as verify reads them (a binary COPY split
/// into rows), looking at nothing else.
async fn count_rows(tx: &tokio_postgres::Transaction<'_>, sql: &str) -> u64 {
    use ledger::store::pg::{CopyReader, RowBatch, copy_sql};
    let stream = tx.copy_out(&copy_sql(sql)).await.unwrap();
    let mut stream = std::pin::pin!(stream);
    let mut reader = CopyReader::default();
    let (mut batch, mut other, mut rows) = (RowBatch::default(), RowBatch::default(), 0u64);
    while let Some(chunk) = stream.try_next().await.unwrap() {
        reader.push(&chunk, &mut batch).unwrap();
        if batch.len() >= 1024 {
            reader.carry(&mut batch, &mut other);
            rows += batch.len() as u64;
            std::hint::black_box(batch.row(batch.len() - 1).len());
            batch.clear();
            std::mem::swap(&mut batch, &mut other);
        }
    }
    reader.finish(&batch).unwrap();
    rows + batch.len() as u64
}

/// A session in verify's kind of snapshot (the one `id` names, if given), with its
/// settings.
async fn session<'a>(
    client: &'a mut tokio_postgres::Client,
    id: Option<&str>,
) -> tokio_postgres::Transaction<'a> {
    let tx = client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .unwrap();
    if let Some(id) = id {
        tx.batch_execute(&format!("SET TRANSACTION SNAPSHOT '{id}'"))
            .await
            .unwrap();
    }
    tx.batch_execute("SET LOCAL search_path = idem")
        .await
        .unwrap();
    tx.batch_execute(ledger::store::pg::VERIFY_SETTINGS)
        .await
        .unwrap();
    tx
}

/// The floor: the rows verify reads, as it reads them on `sessions` sessions (one query,
/// or two in one snapshot), only counted. Returns the rows of the log and of the key rows
/// (the log's rows that carry one, on one session), and the seconds.
async fn bare_read(url: &str, sessions: usize) -> (u64, u64, f64) {
    let connect = || async {
        let (client, conn) = tokio_postgres::connect(url, NoTls).await.unwrap();
        tokio::spawn(conn);
        client
    };
    let (mut first, mut second) = (connect().await, connect().await);
    let t = Instant::now();
    let tx = session(&mut first, None).await;
    if sessions < 2 {
        let rows = count_rows(&tx, ledger::store::pg::VERIFY_LOG).await;
        let keys: i64 = tx
            .query_one("SELECT count(*) FROM idempotency_keys", &[])
            .await
            .unwrap()
            .get(0);
        tx.rollback().await.unwrap();
        return (rows, keys as u64, t.elapsed().as_secs_f64());
    }
    let id: String = tx
        .query_one("SELECT pg_export_snapshot()", &[])
        .await
        .unwrap()
        .get(0);
    let beside = session(&mut second, Some(&id)).await;
    let (facts, keys) = tokio::join!(
        count_rows(&tx, ledger::store::pg::VERIFY_FACTS),
        count_rows(&beside, ledger::store::pg::VERIFY_KEYS)
    );
    beside.rollback().await.unwrap();
    tx.rollback().await.unwrap();
    (facts, keys, t.elapsed().as_secs_f64())
}

fn rules() -> Rules {
    Rules {
        retention: std::time::Duration::from_secs(86_400),
        lease: std::time::Duration::from_secs(10),
        clock: Arc::new(SystemClock),
    }
}

/// CPU time this process has used, on all its threads: on a shared machine, what the
/// client's side costs whatever else runs.
fn cpu_secs() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given.
    #[allow(unsafe_code)]
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// Opens the ledger at `url` twice: verifying on one session and on two.
async fn stores(url: &str) -> [(usize, PgStore); 2] {
    let open = |sessions: usize| async move {
        let config = PgConfig::default().verify_sessions(sessions);
        let (store, _) = PgStore::open(url, rules(), config).await.unwrap();
        (sessions, store)
    };
    [open(1).await, open(2).await]
}

/// Three rounds; in each, a verify on one session and on two, each beside a bare read of
/// the rows it asks for, read as it reads them.
async fn measure(url: &str, facts: u64) {
    println!(
        "| run | sessions | verify s | verify facts/s | client CPU µs/fact | bare read s | \
         bare facts/s | client CPU µs/fact | ratio |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let stores = stores(url).await;
    for run in 1..=3 {
        for (sessions, store) in &stores {
            let (t, cpu) = (Instant::now(), cpu_secs());
            let report = store.verify().await.unwrap();
            let (secs, verify_cpu) = (t.elapsed().as_secs_f64(), cpu_secs() - cpu);
            assert!(report.ok(), "verify found violations: {report:?}");
            assert_eq!(report.facts, facts);
            let cpu = cpu_secs();
            let (rows, keys, bare) = bare_read(url, *sessions).await;
            let bare_cpu = cpu_secs() - cpu;
            assert_eq!((rows, keys), (facts, facts));
            let (rate, bare_rate) = (facts as f64 / secs, facts as f64 / bare);
            let per = |cpu: f64| cpu * 1e6 / facts as f64;
            println!(
                "| {run} | {sessions} | {secs:.3} | {rate:.0} | {:.2} | {bare:.3} | {bare_rate:.0} | \
                 {:.2} | {:.2} |",
                per(verify_cpu),
                per(bare_cpu),
                rate / bare_rate
            );
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` does not: then do a tiny run.
    let quick = !std::env::args().any(|a| a == "--bench");
    let facts = if quick {
        2_000
    } else {
        env("IDEM_BENCH_FACTS", 100_000)
    };
    if let Ok(url) = std::env::var("IDEM_BENCH_PG_URL") {
        let (store, _) = PgStore::open(&url, rules(), PgConfig::default())
            .await
            .unwrap();
        let facts = store.stats().await.unwrap().last_seq;
        drop(store);
        measure(&url, facts).await;
        return;
    }
    let db = PgTestDb::create("pg_verify bench", "idem_bench_verify")
        .await
        .expect("the bench needs PostgreSQL (IDEM_PG_URL)");
    {
        // Filling is not what is measured: let its commits skip the wait for the disk.
        let (c, conn) = tokio_postgres::connect(&db.url, NoTls).await.unwrap();
        tokio::spawn(conn);
        c.batch_execute(&format!(
            "ALTER DATABASE {} SET synchronous_commit = off",
            db.name
        ))
        .await
        .unwrap();
    }
    let (store, _) = PgStore::open(&db.url, rules(), PgConfig::default().pool_size(32))
        .await
        .unwrap();
    let store = Arc::new(store);
    let t = Instant::now();
    fill(&store, facts).await;
    println!(
        "filled {facts} facts through the store in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    // Settle the table (hint bits, visibility map) as a ledger that has been running has.
    {
        let (c, conn) = tokio_postgres::connect(&db.url, NoTls).await.unwrap();
        tokio::spawn(conn);
        c.batch_execute("VACUUM ANALYZE").await.unwrap();
    }
    drop(store);
    measure(&db.url, facts).await;
    if std::env::var("IDEM_BENCH_PG_KEEP").is_ok() {
        println!("kept {}", db.url);
        std::mem::forget(db);
        return;
    }
    db.drop_now().await;
}
