//! `demo`: the whole story in one command, needing nothing installed or running. A ledger
//! in a temporary folder (or the one `--db` names), a real worker on a loopback port inside
//! this process, one withdrawal and its retries over HTTP, then a storm of at-least-once
//! deliveries, a summary, and `verify`.
//!
//! Every key of the story is fixed, so the story can be told again on a kept folder: each
//! command is then a retry of a done key, answered from the log, and the checks expect the
//! effects only of the keys the folder did not hold yet. The balances the story leaves are
//! the same however often it is told.

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use anyhow::Context as _;
use ledger::Store as _;
use ledger::{Account, ClientId, Command, Currency, Key, MessageId, SledStore, Submission};
use serde_json::Value;

use crate::api::ApiOptions;
use crate::server::serve;
use crate::text::count;

/// The demo's one currency, and amounts written in it.
const RUB: &str = "RUB";

fn rub(minor: impl Into<i128>) -> String {
    money::format(minor.into(), RUB)
}

/// Every key the story uses, all of the client `default`; those after `dep-bob` are the
/// storm's. The same key for another amount (`ord-1` for 999) is refused and stores
/// nothing.
fn story_keys() -> Vec<String> {
    let mut keys: Vec<String> = ["dep-alice", "req-7f3a", "req-91bc", "dep-bob"]
        .map(str::to_owned)
        .into();
    keys.extend((1..=20).map(|i| format!("ord-{i}")));
    keys.extend((0..10).map(|i| format!("click-{i}")));
    keys.push("crowd-0".to_owned());
    keys.extend((1..=15).map(|i| format!("pay-{i}")));
    keys.push("refund-ord-1".to_owned());
    keys
}

/// The keys of the story's first part, before the storm.
const FIRST_PART_KEYS: usize = 3;

/// What the client saw, over the whole demo.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    deliveries: u64,
    first: u64,
    replays: u64,
    in_flight: u64,
    reused: u64,
}

struct Reply {
    status: u16,
    replayed: bool,
    body: Value,
}

#[derive(Clone)]
struct Client {
    agent: ureq::Agent,
    base: String,
}

impl Client {
    fn post(&self, path: &str, key: &str, body: &str) -> anyhow::Result<Reply> {
        let mut r = self
            .agent
            .post(format!("{}{path}", self.base))
            .header("Idempotency-Key", key)
            .header("Content-Type", "application/json")
            .send(body)
            .context("the demo's worker did not answer")?;
        let replayed = r
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true");
        let status = r.status().as_u16();
        let text = r.body_mut().read_to_string()?;
        Ok(Reply {
            status,
            replayed,
            body: serde_json::from_str(&text).unwrap_or(Value::Null),
        })
    }

    fn withdraw(&self, key: &str, account: &str, amount: u64) -> anyhow::Result<Reply> {
        self.post(
            "/v1/withdrawals",
            key,
            &format!(r#"{{"account":"{account}","amount":{amount},"currency":"RUB"}}"#),
        )
    }

    fn deposit(&self, key: &str, account: &str, amount: u64) -> anyhow::Result<Reply> {
        self.post(
            "/v1/deposits",
            key,
            &format!(r#"{{"account":"{account}","amount":{amount},"currency":"RUB"}}"#),
        )
    }
}

impl Tally {
    fn count(&mut self, r: &Reply) {
        self.deliveries += 1;
        match (r.status, r.replayed) {
            (_, true) => self.replays += 1,
            (201 | 422, false) if r.body["code"] == "idempotency_key_reused" => self.reused += 1,
            (201 | 422, false) => self.first += 1,
            (409, _) => self.in_flight += 1,
            _ => {}
        }
    }
    fn add(&mut self, o: Tally) {
        self.deliveries += o.deliveries;
        self.first += o.first;
        self.replays += o.replays;
        self.in_flight += o.in_flight;
        self.reused += o.reused;
    }
}

/// Runs the demo, writing to `out`; true when every check held.
pub fn run(db: Option<&Path>, out: &mut dyn Write) -> anyhow::Result<bool> {
    let temp = tempfile::Builder::new().prefix("idem-demo-").tempdir()?;
    let path = db.map_or_else(|| temp.path().join("ledger"), Path::to_path_buf);
    let mut config = ledger::SledConfig::new(&path);
    config.cache_capacity_bytes = 16 * 1024 * 1024;
    let (ledger, _) = SledStore::open(config)
        .with_context(|| format!("opening the demo's ledger at {}", path.display()))?;
    let done = match keys_done(&ledger) {
        Ok(done) => done,
        Err(e) => {
            ledger.blocking().shutdown();
            return Err(e.context(format!(
                "{} holds other commands than the demo's: nothing was sent. Give --db an \
                 empty folder, or one an earlier demo kept",
                path.display()
            )));
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = runtime.spawn(serve(
        listener,
        std::sync::Arc::new(ledger.clone()),
        ApiOptions::default(),
        async {
            let _ = stopped.await;
        },
    ));
    let client = Client {
        agent: ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(30)))
            .build()
            .into(),
        base: format!("http://{addr}"),
    };
    let result = introduce(out, db, &addr.to_string(), done.len())
        .and_then(|()| story(&ledger, &client, &done, out));
    let _ = stop.send(());
    let _ = runtime.block_on(server);
    drop(runtime);
    let verified = ledger.blocking().verify();
    ledger.blocking().shutdown();
    let ok = result?;
    let report = verified?;
    writeln!(out, "\nverify: {}", crate::text::verify_summary(&report))?;
    if report.ok() && ok {
        writeln!(
            out,
            "\nEvery duplicate was absorbed: one effect per key, the same answer on every \
             repeat, no overdraft, and the log explains every balance."
        )?;
    }
    if let Some(db) = db {
        writeln!(
            out,
            "\nThe ledger is kept in {}: `inbox-worker serve --db {}` serves it, \
             `inbox-worker verify --db {}` checks it.",
            db.display(),
            db.display(),
            db.display()
        )?;
    }
    Ok(report.ok() && ok)
}

/// The story's keys the ledger already holds; an error naming the first fact that is not
/// the story's, since the checks could not tell its effects from the story's.
fn keys_done(ledger: &SledStore) -> anyhow::Result<HashSet<String>> {
    let story: HashSet<String> = story_keys().into_iter().collect();
    let default = ClientId::default_client();
    let mut done = HashSet::new();
    let mut after = 0;
    loop {
        let facts = ledger.blocking().facts(after, 1000)?;
        let Some(last) = facts.last() else {
            return Ok(done);
        };
        after = last.seq;
        for fact in &facts {
            let key = fact.key.as_str();
            if fact.client != default || !story.contains(key) {
                anyhow::bail!(
                    "fact {} is key {key} of client {}",
                    fact.seq,
                    fact.client.as_str()
                );
            }
            done.insert(key.to_owned());
        }
    }
}

/// Where the story is told, and whether it is told again.
fn introduce(
    out: &mut dyn Write,
    db: Option<&Path>,
    addr: &str,
    done: usize,
) -> anyhow::Result<()> {
    match db {
        None => writeln!(
            out,
            "Idem demo: a fresh ledger in a temporary folder (deleted at the end), served \
             at http://{addr} inside this process.\n"
        )?,
        Some(db) => writeln!(
            out,
            "Idem demo: the ledger in {} (kept), served at http://{addr} inside this \
             process.\n",
            db.display()
        )?,
    }
    if done > 0 {
        writeln!(
            out,
            "This ledger already holds {} of the story's {}, from an earlier demo: each is \
             sent again as a retry of a done key, answered from the log with its first \
             answer (the balance as it was then), and nothing moves again.\n",
            count(u64::try_from(done).unwrap_or(u64::MAX), "key", "keys"),
            story_keys().len()
        )?;
    }
    Ok(())
}

fn story(
    ledger: &SledStore,
    client: &Client,
    done: &HashSet<String>,
    out: &mut dyn Write,
) -> anyhow::Result<bool> {
    writeln!(
        out,
        "1. One withdrawal and its retries: alice has {}; a client withdraws {} with key \
         req-7f3a, loses the answer, and retries twice with the same key.",
        rub(100_000),
        rub(30_000)
    )?;
    let seq_start = ledger.durable_seq();
    let mut tally = Tally::default();
    one_withdrawal_retried(client, out, &mut tally)?;
    writeln!(out, "2. A storm of at-least-once deliveries:")?;
    let seq_before = ledger.durable_seq();
    tally.count(&client.deposit("dep-bob", "bob", 100_000)?);
    lost_responses(client, out, &mut tally)?;
    concurrent_duplicates(client, out, &mut tally)?;
    broker_redeliveries(ledger, client, out, &mut tally)?;
    let bug = same_key_other_body(client, out, &mut tally)?;
    retried_refund(client, out, &mut tally)?;
    let new_in_storm = story_keys()
        .iter()
        .skip(FIRST_PART_KEYS)
        .filter(|k| !done.contains(*k))
        .count();
    summary(
        ledger,
        out,
        &tally,
        (seq_start, seq_before),
        u64::try_from(new_in_storm).unwrap_or(u64::MAX),
        &bug,
    )
}

/// 1. One withdrawal, its answer lost, retried twice with the same key; then a new key.
fn one_withdrawal_retried(
    client: &Client,
    out: &mut dyn Write,
    tally: &mut Tally,
) -> anyhow::Result<()> {
    let r = client.deposit("dep-alice", "alice", 100_000)?;
    tally.count(&r);
    let note = |r: &Reply| {
        if r.replayed {
            "replay (answer from the log)"
        } else {
            "first execution"
        }
    };
    let balance = |r: &Reply| {
        r.body["balance"]
            .as_i64()
            .map_or_else(|| "?".to_owned(), rub)
    };
    for attempt in 1..=3 {
        let r = client.withdraw("req-7f3a", "alice", 30_000)?;
        tally.count(&r);
        writeln!(
            out,
            "   attempt {attempt}: {:<32} balance={}",
            note(&r),
            balance(&r)
        )?;
    }
    let r = client.withdraw("req-91bc", "alice", 20_000)?;
    tally.count(&r);
    writeln!(
        out,
        "   new key:   {:<32} balance={}",
        note(&r),
        balance(&r)
    )?;
    writeln!(
        out,
        "   Three identical requests, one withdrawal. Another key, another withdrawal.\n"
    )?;

    Ok(())
}

/// Every order is sent, its answer dropped, and retried twice.
fn lost_responses(client: &Client, out: &mut dyn Write, tally: &mut Tally) -> anyhow::Result<()> {
    let mut storm = Tally::default();
    for i in 1..=20 {
        for _ in 0..3 {
            storm.count(&client.withdraw(&format!("ord-{i}"), "bob", 100)?);
        }
    }
    writeln!(
        out,
        "   {:<22}{:<40}-> {} executed, {} replayed",
        "lost responses:", "20 orders, each sent 3 times", storm.first, storm.replays
    )?;
    tally.add(storm);

    Ok(())
}

/// Double clicks and concurrent duplicates: the same key from several threads at once.
fn concurrent_duplicates(
    client: &Client,
    out: &mut dyn Write,
    tally: &mut Tally,
) -> anyhow::Result<()> {
    let clicks = burst(client, 10, 2, "click")?;
    writeln!(
        out,
        "   {:<22}{:<40}-> {} executed, {} replayed, {} told 409 in flight",
        "double clicks:",
        "10 buttons, each clicked twice",
        clicks.first,
        clicks.replays,
        clicks.in_flight
    )?;
    tally.add(clicks);
    let crowd = burst(client, 1, 32, "crowd")?;
    writeln!(
        out,
        "   {:<22}{:<40}-> {} executed, {} replayed, {} told 409 in flight",
        "concurrent copies:",
        "1 key from 32 threads at once",
        crowd.first,
        crowd.replays,
        crowd.in_flight
    )?;
    tally.add(crowd);

    Ok(())
}

/// `copies` withdrawals of 50 from bob under each of `keys` keys, the copies of a key sent
/// from as many threads at once.
fn burst(client: &Client, keys: usize, copies: usize, prefix: &str) -> anyhow::Result<Tally> {
    let mut t = Tally::default();
    for k in 0..keys {
        let barrier = Arc::new(Barrier::new(copies));
        let handles: Vec<_> = (0..copies)
            .map(|_| {
                let (client, barrier) = (client.clone(), barrier.clone());
                let key = format!("{prefix}-{k}");
                std::thread::spawn(move || {
                    barrier.wait();
                    client.withdraw(&key, "bob", 50)
                })
            })
            .collect();
        for h in handles {
            let r = h
                .join()
                .map_err(|_| anyhow::anyhow!("a demo thread panicked"))??;
            t.count(&r);
        }
    }
    Ok(t)
}

/// A broker redelivers: every message three times, through the inbox; and the same
/// payment retried over HTTP is the same key, a replay.
fn broker_redeliveries(
    ledger: &SledStore,
    client: &Client,
    out: &mut dyn Write,
    tally: &mut Tally,
) -> anyhow::Result<()> {
    let mut inbox = Tally::default();
    let default = ClientId::default_client();
    for i in 1..=15 {
        let command = Command::Deposit {
            account: Account::parse("carol")?,
            amount: ledger::Amount::new(1000)?,
            currency: Currency::parse("RUB")?,
        };
        let (id, key) = (
            MessageId::parse(&format!("msg-{i}"))?,
            Key::parse(&format!("pay-{i}"))?,
        );
        for _ in 0..3 {
            inbox.deliveries += 1;
            match ledger
                .blocking()
                .deliver(&id, &default, &key, command.clone())?
            {
                Submission::Executed(_) => inbox.first += 1,
                Submission::Replayed(_) => inbox.replays += 1,
                _ => {}
            }
        }
    }
    // ... and the same payment retried over HTTP is the same key: a replay.
    let cross = client.deposit("pay-1", "carol", 1000)?;
    inbox.count(&cross);
    writeln!(
        out,
        "   {:<22}{:<40}-> {} executed, {} absorbed; an HTTP retry of one: {}",
        "broker redeliveries:",
        "15 messages, each delivered 3 times",
        inbox.first,
        inbox.replays - u64::from(cross.replayed),
        if cross.replayed {
            "replay"
        } else {
            "EXECUTED AGAIN"
        }
    )?;
    tally.add(inbox);

    Ok(())
}

/// A client bug: the same key for another amount. Returns the refusal.
fn same_key_other_body(
    client: &Client,
    out: &mut dyn Write,
    tally: &mut Tally,
) -> anyhow::Result<Reply> {
    let bug = client.withdraw("ord-1", "bob", 999)?;
    tally.count(&bug);
    writeln!(
        out,
        "   {:<22}{:<40}-> {} {}",
        "same key, other body:",
        format!("ord-1 for {} instead of {}", rub(999), rub(100)),
        bug.status,
        bug.body["code"].as_str().unwrap_or("?")
    )?;

    Ok(bug)
}

/// A refund is a command like the others: retried, it refunds once.
fn retried_refund(client: &Client, out: &mut dyn Write, tally: &mut Tally) -> anyhow::Result<()> {
    let mut refund = Tally::default();
    for _ in 0..3 {
        refund.count(&client.post(
            "/v1/refunds",
            "refund-ord-1",
            r#"{"withdrawal":"ord-1","amount":100}"#,
        )?);
    }
    writeln!(
        out,
        "   {:<22}{:<40}-> {} executed, {} replayed",
        "retried refund:", "refund of ord-1 sent 3 times", refund.first, refund.replays
    )?;
    tally.add(refund);

    Ok(())
}

/// The summary line and the checks of the storm; whether every check held. `seqs` are the
/// last seq before the story and before the storm; `new_in_storm` the storm's keys this
/// ledger did not hold yet, each of which must make one effect.
fn summary(
    ledger: &SledStore,
    out: &mut dyn Write,
    tally: &Tally,
    (seq_start, seq_before): (u64, u64),
    new_in_storm: u64,
    bug: &Reply,
) -> anyhow::Result<bool> {
    let mut ok = true;
    let mut check = |out: &mut dyn Write, what: &str, holds: bool| -> anyhow::Result<()> {
        writeln!(out, "  {} {what}", if holds { "ok  " } else { "FAIL" })?;
        ok &= holds;
        Ok(())
    };
    let balance = |account: &str| -> anyhow::Result<i128> {
        Ok(ledger
            .blocking()
            .account(&Account::parse(account)?)
            .and_then(|per| per.values().next().copied())
            .unwrap_or(0))
    };
    let (alice, bob, carol) = (balance("alice")?, balance("bob")?, balance("carol")?);
    let seq_end = ledger.durable_seq();
    let effects = seq_end - seq_before;
    writeln!(
        out,
        "\nSummary: {}, {}, {}, {} ({} in flight, {})",
        count(tally.deliveries, "delivery", "deliveries"),
        count(seq_end - seq_start, "effect", "effects"),
        count(tally.replays, "replay", "replays"),
        count(tally.in_flight + tally.reused, "conflict", "conflicts"),
        tally.in_flight,
        count(tally.reused, "reused key", "reused keys"),
    )?;
    // What the story leaves, however often it was told: alice 1000.00 - 300.00 - 200.00;
    // bob 1000.00 - 20 orders x 1.00 - 11 keys x 0.50 + one refund of 1.00; carol 15 x 10.00.
    for (name, is, expected) in [
        ("alice", alice, 50_000),
        ("bob", bob, 97_550),
        ("carol", carol, 15_000),
    ] {
        check(
            out,
            &format!(
                "{name}'s balance is {} (expected {})",
                rub(is),
                rub(expected)
            ),
            is == expected,
        )?;
    }
    // One effect per key the ledger did not hold yet: on a fresh ledger 1 deposit + 20
    // orders + 11 burst keys + 15 payments + 1 refund; none when the story is told again.
    check(
        out,
        &format!(
            "{} in the storm (expected {new_in_storm}: one per new key)",
            count(effects, "effect", "effects")
        ),
        effects == new_in_storm,
    )?;
    check(out, "the reused key changed nothing", bug.status == 422)?;
    Ok(ok)
}
