//! Model-based test: random command sequences with duplicates, clock moves, sweeps and
//! restarts, run against the real ledger (on sled, and on PostgreSQL with two stores
//! sharing one database, the steps alternating between them) and against a plain
//! in-memory reference model written independently of the core. After every step they
//! must agree and `verify` must pass.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use ledger::testing::PgTestDb;
use ledger::*;
use proptest::prelude::*;

use crate::support::{deposit, refund, withdraw};

const HOUR_MS: i64 = 3_600_000;
const RETENTION_H: i64 = 24;

#[derive(Debug, Clone)]
enum Step {
    Submit {
        client: u8,
        key: u8,
        kind: u8,
        account: u8,
        amount: u64,
        currency: u8,
        withdrawal: u8,
    },
    /// Repeat one of the earlier submissions exactly: the retry of a lost answer.
    Repeat(usize),
    Restart,
    Advance(i64),
    Sweep,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        10 => (0u8..2, 0u8..12, 0u8..3, 0u8..3, 1u64..600, 0u8..2, 0u8..12).prop_map(
            |(client, key, kind, account, amount, currency, withdrawal)| Step::Submit {
                client, key, kind, account, amount, currency, withdrawal
            }
        ),
        5 => (0usize..64).prop_map(Step::Repeat),
        1 => Just(Step::Restart),
        2 => (-3i64..14).prop_map(Step::Advance),
        2 => Just(Step::Sweep),
    ]
}

/// A rejection as the model tells it: the code, and the figure the client is told.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Refused {
    code: &'static str,
    detail: Option<String>,
}

fn refused(code: &'static str, detail: Option<String>) -> Refused {
    Refused { code, detail }
}

type Told = Result<u128, Refused>;

/// What the model says a submission answers.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    Executed(Told, u64),
    Replayed(Told, u64),
    Reused,
}

#[derive(Debug, Clone)]
struct KeyState {
    command: Command,
    result: Told,
    seq: u64,
    at: i64,
    expired: bool,
}

/// The reference: HashMaps and arithmetic, nothing shared with the ledger's core.
#[derive(Debug, Default)]
struct Model {
    keys: HashMap<(String, String), KeyState>,
    /// user account -> (currency, balance)
    users: BTreeMap<String, (String, i128)>,
    /// (system account, currency) -> balance
    system: BTreeMap<(String, String), i128>,
    /// (client, withdrawal key) -> (account, currency, amount, refunded)
    withdrawals: HashMap<(String, String), (String, String, u64, u64)>,
    /// user account -> (seq, balance after) of each movement: its statement
    statements: BTreeMap<String, Vec<(u64, u128)>>,
    seq: u64,
    last_at: i64,
}

impl Model {
    fn submit(&mut self, client: &str, key: &str, command: &Command, now: i64) -> Answer {
        let ck = (client.to_owned(), key.to_owned());
        if let Some(k) = self.keys.get(&ck) {
            return if k.command == *command {
                Answer::Replayed(k.result.clone(), k.seq)
            } else {
                Answer::Reused
            };
        }
        self.seq += 1;
        self.last_at = self.last_at.max(now);
        let result = self.decide(client, key, command);
        if let (Ok(after), Some(account)) = (&result, moved_account(command, &self.keys, client)) {
            self.statements
                .entry(account)
                .or_default()
                .push((self.seq, *after));
        }
        self.keys.insert(
            ck,
            KeyState {
                command: command.clone(),
                result: result.clone(),
                seq: self.seq,
                at: self.last_at,
                expired: false,
            },
        );
        Answer::Executed(result, self.seq)
    }

    fn sys(&mut self, name: &str, cur: &str, delta: i128) {
        *self
            .system
            .entry((name.to_owned(), cur.to_owned()))
            .or_insert(0) += delta;
    }

    fn decide(&mut self, client: &str, key: &str, command: &Command) -> Told {
        match command {
            Command::Deposit {
                account,
                amount,
                currency,
            } => {
                let (a, cur, n) = (
                    account.to_string(),
                    currency.to_string(),
                    i128::from(amount.units()),
                );
                let entry = self.users.entry(a).or_insert((cur.clone(), 0));
                if entry.0 != cur {
                    return Err(refused("currency_mismatch", Some(entry.0.clone())));
                }
                entry.1 += n;
                let after = entry.1;
                self.sys("@world", &cur, -n);
                Ok(u128::try_from(after).unwrap())
            }
            Command::Withdraw {
                account,
                amount,
                currency,
            } => {
                let (a, cur, n) = (
                    account.to_string(),
                    currency.to_string(),
                    i128::from(amount.units()),
                );
                let Some(entry) = self.users.get_mut(&a) else {
                    return Err(refused("account_not_found", None));
                };
                if entry.0 != cur {
                    return Err(refused("currency_mismatch", Some(entry.0.clone())));
                }
                if entry.1 < n {
                    return Err(refused("insufficient_funds", Some(entry.1.to_string())));
                }
                entry.1 -= n;
                let after = entry.1;
                self.sys("@payouts", &cur, n);
                self.withdrawals.insert(
                    (client.to_owned(), key.to_owned()),
                    (a, cur, amount.units(), 0),
                );
                Ok(u128::try_from(after).unwrap())
            }
            Command::Refund { withdrawal, amount } => {
                let wk = (client.to_owned(), withdrawal.to_string());
                let Some((a, cur, withdrawn, refunded)) = self.withdrawals.get_mut(&wk) else {
                    return Err(refused("withdrawal_not_found", None));
                };
                if *refunded + amount.units() > *withdrawn {
                    let room = (*withdrawn - *refunded).to_string();
                    return Err(refused("refund_exceeds_withdrawal", Some(room)));
                }
                *refunded += amount.units();
                let (a, cur) = (a.clone(), cur.clone());
                let n = i128::from(amount.units());
                let entry = self.users.get_mut(&a).unwrap();
                entry.1 += n;
                let after = entry.1;
                self.sys("@payouts", &cur, -n);
                Ok(u128::try_from(after).unwrap())
            }
        }
    }

    fn sweep(&mut self, now: i64) {
        let horizon = now - RETENTION_H * HOUR_MS;
        for k in self.keys.values_mut() {
            if k.at <= horizon {
                k.expired = true;
            }
        }
    }
}

fn command_of(kind: u8, account: u8, amount: u64, currency: u8, withdrawal: u8) -> Command {
    let account = ["alice", "bob", "carol"][usize::from(account)];
    let currency = Currency::parse(["RUB", "USD"][usize::from(currency)]).unwrap();
    match kind {
        0 => deposit(account, amount, currency),
        1 => withdraw(account, amount, currency),
        _ => refund(&format!("k{withdrawal}"), amount),
    }
}

/// The user account a command moves, once applied: a refund's is its withdrawal's.
fn moved_account(
    command: &Command,
    keys: &HashMap<(String, String), KeyState>,
    client: &str,
) -> Option<String> {
    match command {
        Command::Deposit { account, .. } | Command::Withdraw { account, .. } => {
            Some(account.to_string())
        }
        Command::Refund { withdrawal, .. } => {
            match &keys
                .get(&(client.to_owned(), withdrawal.to_string()))?
                .command
            {
                Command::Withdraw { account, .. } => Some(account.to_string()),
                _ => None,
            }
        }
    }
}

fn observed(s: &Submission) -> Answer {
    let result = |o: &Outcome| match o {
        Outcome::Applied(r) => (Ok(r.balance), r.seq),
        Outcome::Rejected(r) => {
            let detail = r.detail.map(|d| match d {
                RejectionDetail::Balance(b) => b.to_string(),
                RejectionDetail::AccountCurrency(c) => c.to_string(),
                RejectionDetail::Refundable(n) => n.to_string(),
            });
            (Err(refused(r.rejection.code(), detail)), r.seq)
        }
    };
    match s {
        Submission::Executed(o) => {
            let (r, seq) = result(o);
            Answer::Executed(r, seq)
        }
        Submission::Replayed(o) => {
            let (r, seq) = result(o);
            Answer::Replayed(r, seq)
        }
        Submission::Reused => Answer::Reused,
        other => panic!("unexpected answer without concurrency: {other:?}"),
    }
}

/// Where a case's ledger lives: a sled folder, or a fresh PostgreSQL database that two
/// stores (two workers) share.
enum Backing {
    Sled(tempfile::TempDir),
    Pg(PgTestDb),
}

impl Backing {
    /// The store handles a case submits through: one on sled, two on PostgreSQL.
    async fn open(&self, clock: &ManualClock) -> Vec<Arc<dyn Store>> {
        let rules = Rules {
            retention: Duration::from_secs(u64::try_from(RETENTION_H).unwrap() * 3600),
            lease: Duration::from_secs(10),
            clock: Arc::new(clock.clone()),
        };
        match self {
            Backing::Sled(dir) => {
                let config = SledConfig::new(dir.path().join("l"))
                    .clock(rules.clock)
                    .retention(rules.retention);
                let (ledger, _) = tokio::task::spawn_blocking(move || SledStore::open(config))
                    .await
                    .unwrap()
                    .unwrap();
                vec![Arc::new(ledger)]
            }
            Backing::Pg(db) => {
                let mut stores: Vec<Arc<dyn Store>> = Vec::new();
                for _ in 0..2 {
                    let (store, _) = PgStore::open(&db.url, rules.clone(), PgConfig::default())
                        .await
                        .unwrap();
                    stores.push(Arc::new(store));
                }
                stores
            }
        }
    }
}

/// The store's seqs as the model numbers its facts (1, 2, ...): PostgreSQL's may have
/// gaps, so a seq is compared through the order facts were executed in, which must
/// increase.
#[derive(Default)]
struct Seqs {
    to_model: BTreeMap<u64, u64>,
}

impl Seqs {
    fn executed(&mut self, store: u64, model: u64) -> Result<(), TestCaseError> {
        if let Some((&last, _)) = self.to_model.last_key_value() {
            prop_assert!(store > last, "seq {} after {}", store, last);
        }
        self.to_model.insert(store, model);
        Ok(())
    }
    fn model(&self, store: u64) -> u64 {
        self.to_model.get(&store).copied().unwrap_or(u64::MAX)
    }
    fn answer(&self, a: Answer) -> Answer {
        match a {
            Answer::Executed(t, s) => Answer::Executed(t, self.model(s)),
            Answer::Replayed(t, s) => Answer::Replayed(t, self.model(s)),
            Answer::Reused => Answer::Reused,
        }
    }
}

fn run(backing: &Backing, steps: Vec<Step>) -> Result<(), TestCaseError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(run_async(backing, steps))
}

async fn run_async(backing: &Backing, steps: Vec<Step>) -> Result<(), TestCaseError> {
    let clock = ManualClock::new(Timestamp(1_767_225_600_000));
    let mut stores = backing.open(&clock).await;
    let mut model = Model::default();
    let mut seqs = Seqs::default();
    let mut sent: Vec<(String, String, Command)> = Vec::new();
    for (i, step) in steps.into_iter().enumerate() {
        let now = clock.now().millis();
        // Steps alternate between the stores sharing the ledger (two workers on
        // PostgreSQL), so each one reads what the other wrote.
        let store = stores[i % stores.len()].clone();
        match step {
            Step::Submit {
                client,
                key,
                kind,
                account,
                amount,
                currency,
                withdrawal,
            } => {
                let (c, k) = (format!("c{client}"), format!("k{key}"));
                let command = command_of(kind, account, amount, currency, withdrawal);
                let got = store
                    .submit(
                        &ClientId::parse(&c).unwrap(),
                        &Key::parse(&k).unwrap(),
                        command.clone(),
                        None,
                    )
                    .await
                    .unwrap();
                let want = model.submit(&c, &k, &command, now);
                let got = observed(&got);
                if let (Answer::Executed(_, store_seq), Answer::Executed(_, model_seq)) =
                    (&got, &want)
                {
                    seqs.executed(*store_seq, *model_seq)?;
                }
                prop_assert_eq!(seqs.answer(got), want, "{}/{} {:?}", c, k, command);
                sent.push((c, k, command));
            }
            Step::Repeat(i) => {
                if sent.is_empty() {
                    continue;
                }
                let (c, k, command) = sent[i % sent.len()].clone();
                let got = store
                    .submit(
                        &ClientId::parse(&c).unwrap(),
                        &Key::parse(&k).unwrap(),
                        command.clone(),
                        None,
                    )
                    .await
                    .unwrap();
                let want = model.submit(&c, &k, &command, now);
                // A repeat never executes: it replays, or is refused again if it was a reuse.
                prop_assert!(!matches!(want, Answer::Executed(..)));
                prop_assert_eq!(seqs.answer(observed(&got)), want);
            }
            Step::Restart => {
                // Every handle goes, so the folder's lock is released before it opens again.
                drop(store);
                for store in stores.drain(..) {
                    store.shutdown().await;
                }
                stores = backing.open(&clock).await;
                let facts = stores[0].facts(0, 100_000).await.unwrap();
                prop_assert_eq!(facts.len() as u64, model.seq);
            }
            Step::Advance(hours) => clock.advance_ms(hours * HOUR_MS),
            Step::Sweep => {
                store.sweep().await.unwrap();
                model.sweep(now);
            }
        }
        check(&*stores[i % stores.len()], &model, &seqs).await?;
    }
    for store in stores {
        store.shutdown().await;
    }
    Ok(())
}

/// The ledger and the model agree on every balance, statement and key count, and
/// `verify` passes.
async fn check(store: &dyn Store, model: &Model, seqs: &Seqs) -> Result<(), TestCaseError> {
    let balances = store.balances().await.unwrap();
    for (account, (cur, balance)) in &model.users {
        let got = balances.get(
            &Account::parse(account).unwrap(),
            Currency::parse(cur).unwrap(),
        );
        prop_assert_eq!(got, Some(*balance), "{} {}", account, cur);
    }
    for ((account, cur), balance) in &model.system {
        let got = balances.get(
            &Account::parse_any(account).unwrap(),
            Currency::parse(cur).unwrap(),
        );
        prop_assert_eq!(got, Some(*balance), "{} {}", account, cur);
    }
    // Each account's statement, read two lines a page, is the model's.
    for (account, want) in &model.statements {
        let account = Account::parse(account).unwrap();
        let mut got = Vec::new();
        let mut after = 0;
        loop {
            let page = store.statement(&account, after, 2).await.unwrap();
            let Some(last) = page.last() else { break };
            after = last.seq;
            for fact in &page {
                let line = ledger::projection::statement_line(fact).unwrap();
                prop_assert_eq!(line.account, &account);
                got.push((seqs.model(fact.seq), line.balance_after));
            }
        }
        prop_assert_eq!(&got, want, "{}", account);
    }
    let stats = store.stats().await.unwrap();
    let facts = stats.applied.iter().chain(&stats.rejected).sum::<u64>();
    prop_assert_eq!(facts, model.seq);
    let expired = model.keys.values().filter(|k| k.expired).count() as u64;
    prop_assert_eq!(stats.keys_expired, expired);
    prop_assert_eq!(stats.keys_done, model.keys.len() as u64 - expired);
    let report = store.verify().await.unwrap();
    prop_assert!(report.ok(), "{}", report);
    Ok(())
}

fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

proptest! {
    // 48 cases in CI; PROPTEST_CASES=5000 for a long run.
    #![proptest_config(ProptestConfig {
        cases: cases(48),
        .. ProptestConfig::default()
    })]
    #[test]
    fn ledger_agrees_with_the_model(steps in prop::collection::vec(step(), 1..60)) {
        run(&Backing::Sled(tempfile::tempdir().unwrap()), steps)?;
    }
}

proptest! {
    // Each case a fresh database shared by two stores, the steps alternating between
    // them: 16 cases in CI.
    #![proptest_config(ProptestConfig {
        cases: cases(16),
        .. ProptestConfig::default()
    })]
    #[test]
    fn postgres_with_two_workers_agrees_with_the_model(
        steps in prop::collection::vec(step(), 1..60)
    ) {
        let db = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(PgTestDb::create("model::postgres", "idem_model"));
        // Without a server: the skip is said (or fails, when services are required).
        let Some(db) = db else { return Ok(()) };
        let backing = Backing::Pg(db);
        let result = run(&backing, steps);
        if let Backing::Pg(db) = backing {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(db.drop_now());
        }
        result?;
    }
}
