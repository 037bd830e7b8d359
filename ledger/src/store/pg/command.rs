//! The command path on PostgreSQL: the claim of a key in this process, one transaction
//! per attempt (claim, decide, apply, commit), and the retries.

// The store's helpers (errors, conversions, claims) and what it imports.
use std::pin::Pin;

use tokio::sync::futures::OwnedNotified;

use super::*;
use crate::domain::Amount;
// Statements of the command path, prepared once per connection (deadpool's cache) so
// they can be pipelined. The first four are functions of `v3.sql`, `v2.sql` and `v5.sql`.
pub(super) const SQL_CLAIM: &str = "SELECT state, message_claimed, hash, seq, body, withdrawal_seq, \
     withdrawal, currency, balance \
     FROM idem_claim_v3($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";
pub(super) const SQL_LOCK: &str =
    "SELECT currency, balance, refunded, seq FROM idem_lock($1, $2, $3)";
pub(super) const SQL_WITHDRAWAL: &str =
    "SELECT state, withdrawal_seq, withdrawal FROM idem_withdrawal_v5($1, $2, $3, $4)";
pub(super) const SQL_APPLY: &str = "SELECT idem_apply_v3($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, \
     $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25)";
pub(super) const SQL_INBOX_SEQ: &str = "UPDATE inbox SET seq = $2 WHERE message_id = $1";
pub(super) const SQL_COUNT: &str = "INSERT INTO counters (name, shard, n) VALUES ($1, $2, $3) \
     ON CONFLICT (name, shard) DO UPDATE SET n = counters.n + EXCLUDED.n";
pub(super) const SQL_QUARANTINE: &str = "INSERT INTO quarantine (at, message_id, reason, payload) \
     VALUES ($1, $2, $3, $4) RETURNING id";
/// The SQLSTATE `idem_apply_v3` raises when a write disagrees with the decision.
pub(super) const DISAGREE: &str = "IDM01";

/// The shards no transaction of this process holds, taken and given back around each
/// command's transaction. With more transactions in flight than shards, the extra ones
/// share a shard (`None` from `take`, and the caller picks one round-robin): that only
/// makes them wait on each other, never double-counts.
pub(super) struct ShardSlots {
    free: Mutex<Vec<i16>>,
}

impl ShardSlots {
    /// All shards, handed out from `offset` on.
    pub(super) fn new(offset: u64) -> Self {
        let free = (0..SHARDS)
            .rev()
            .filter_map(|i| i16::try_from((offset + i) % SHARDS).ok())
            .collect();
        Self {
            free: Mutex::new(free),
        }
    }

    pub(super) fn take(&self) -> Option<i16> {
        self.free.lock().pop()
    }

    pub(super) fn give_back(&self, shard: i16) {
        self.free.lock().push(shard);
    }
}

/// A shard taken for one transaction; given back when dropped (also when the attempt is
/// cut short).
pub(super) struct ShardSlot<'a> {
    slots: &'a ShardSlots,
    shard: Option<i16>,
}

impl Drop for ShardSlot<'_> {
    fn drop(&mut self) {
        if let Some(shard) = self.shard {
            self.slots.give_back(shard);
        }
    }
}

/// Where this process starts among the shards: different for workers started together.
pub(super) fn rand_offset() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish()
}

/// The arguments of `idem_apply_v3`, in its order.
pub(super) struct Apply<'a> {
    seq: i64,
    at: DateTime<Utc>,
    client: &'a str,
    key: &'a str,
    kind: &'static str,
    rejection: Option<&'static str>,
    body: Vec<u8>,
    doc: serde_json::Value,
    response: serde_json::Value,
    counter: String,
    shard: i16,
    account: Option<&'a str>,
    currency: Option<&'a str>,
    delta: Option<i64>,
    account_exists: bool,
    balance_after: Option<String>,
    system: Option<&'a str>,
    system_delta: Option<i64>,
    withdrawal: Option<&'a str>,
    refund: Option<i64>,
    withdrawn: Option<i64>,
    refunded_exists: bool,
    refunded_after: Option<i64>,
    message: Option<&'a str>,
    hash: &'a [u8],
}

impl Apply<'_> {
    pub(super) fn params(&self) -> [P<'_>; 25] {
        [
            &self.seq,
            &self.at,
            &self.client,
            &self.key,
            &self.kind,
            &self.rejection,
            &self.body,
            &self.doc,
            &self.response,
            &self.counter,
            &self.shard,
            &self.account,
            &self.currency,
            &self.delta,
            &self.account_exists,
            &self.balance_after,
            &self.system,
            &self.system_delta,
            &self.withdrawal,
            &self.refund,
            &self.withdrawn,
            &self.refunded_exists,
            &self.refunded_after,
            &self.message,
            &self.hash,
        ]
    }
}

/// A pooled connection with a transaction begun by hand, so that BEGIN rides in the
/// first round trip and COMMIT in the last (a driver transaction spends a round trip on
/// BEGIN alone). Dropped while the transaction is open (an error path, or the attempt's
/// deadline), it rolls back before the connection goes back to the pool, or closes the
/// connection, which rolls back too.
pub(super) struct OpenTx {
    conn: Option<deadpool_postgres::Object>,
    open: AtomicBool,
}

impl OpenTx {
    pub(super) fn conn(&self) -> Result<&deadpool_postgres::Object, Abort> {
        self.conn
            .as_ref()
            .ok_or_else(|| Abort::Fail(LedgerError::Unavailable("connection lost".into())))
    }

    pub(super) async fn rollback(&self) -> Result<(), Abort> {
        self.conn()?.batch_execute("ROLLBACK").await?;
        self.open.store(false, Ordering::Relaxed);
        Ok(())
    }
}

impl Drop for OpenTx {
    fn drop(&mut self) {
        if !self.open.load(Ordering::Relaxed) {
            return;
        }
        let Some(conn) = self.conn.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    if conn.batch_execute("ROLLBACK").await.is_err() {
                        drop(deadpool_postgres::Object::take(conn));
                    }
                });
            }
            Err(_) => drop(deadpool_postgres::Object::take(conn)),
        }
    }
}

/// One attempt's command, as the statements take it.
pub(super) struct Args<'a> {
    client: &'a ClientId,
    key: &'a Key,
    command: &'a Command,
    c: &'a str,
    k: &'a str,
    fp: &'a [u8],
    at: Timestamp,
    at_db: DateTime<Utc>,
    message_id: Option<&'a str>,
    message_fp: Option<Vec<u8>>,
    /// A refund's withdrawal key.
    withdrawal_key: Option<&'a str>,
    /// A deposit's or withdrawal's account, locked by the claim.
    claim_account: Option<&'a str>,
    wait_ms: i32,
    lease_ms: i32,
}

/// A fact's moves of money: the user account's leg and the system account's.
pub(super) struct Legs<'a> {
    user: Option<(&'a Account, Currency, i64)>,
    system: Option<(&'a Account, Currency, i64)>,
}

impl<'a> Legs<'a> {
    fn of(fact: &'a Fact) -> Result<Self> {
        let mut legs = Legs {
            user: None,
            system: None,
        };
        for (account, currency, delta) in projection::legs(fact) {
            let delta = i64::try_from(delta)
                .map_err(|_| LedgerError::Unavailable(format!("a change of {delta}")))?;
            if account.is_system() {
                legs.system = Some((account, currency, delta));
            } else {
                legs.user = Some((account, currency, delta));
            }
        }
        Ok(legs)
    }
}

/// What the decision reads, locked by this attempt's transaction.
pub(super) struct Locked {
    seq: i64,
    inputs: Inputs,
    account_exists: bool,
    refunded_exists: bool,
}

/// Releases this process's claim and counts the command out, however it ends.
pub(super) struct Flight<'a> {
    inner: &'a Inner,
    ck: (ClientId, Key),
    token: Option<u64>,
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        if let Some(token) = self.token {
            let mut claims = self.inner.claims.lock();
            if claims.get(&self.ck).is_some_and(|c| c.token == token)
                && let Some(released) = claims.remove(&self.ck).and_then(|c| c.released)
            {
                released.notify_waiters();
            }
        }
        if self.inner.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.inner.idle.notify_waiters();
        }
    }
}

impl PgStore {
    /// One submission: the key claimed in this process, then attempts of one transaction
    /// each until one answers. An arrival that meets a twin of its own command in flight
    /// here waits for the twin's claim (up to `PgConfig::in_flight_wait`, on its task, with
    /// no lock held) and tries once more, so the twin's retry gets the replay, not a 409.
    pub(super) async fn submit_command(
        &self,
        client: &ClientId,
        key: &Key,
        command: Command,
        message: Option<MessageId>,
    ) -> Result<Submission> {
        let inner = &*self.inner;
        let ck = (client.clone(), key.clone());
        inner.in_flight.fetch_add(1, Ordering::SeqCst);
        let mut flight = Flight {
            inner,
            ck: ck.clone(),
            token: None,
        };
        if inner.closed.load(Ordering::SeqCst) {
            return Err(LedgerError::Closed);
        }
        let fingerprint = command.fingerprint();
        let wait = inner.options.in_flight_wait;
        let mut may_wait = !wait.is_zero();
        while let Some((claimed, released)) = self.claim(&mut flight, fingerprint, &command) {
            let answer = self
                .answer_under_claim(&ck, claimed, fingerprint, message.is_some(), may_wait)
                .await?;
            match answer {
                Some(answer) => return Ok(answer),
                None => {
                    let _ = tokio::time::timeout(wait, released).await;
                    may_wait = false;
                }
            }
        }
        let started = Instant::now();
        let answer = self
            .attempts(client, key, &command, fingerprint, message.as_ref())
            .await;
        self.record_latency(started);
        drop(flight);
        answer
    }

    /// Claims the key in this process (`None`), or finds the live claim of a twin and
    /// returns its fingerprint with a wake-up for its release, registered before the
    /// claims' lock is let go so that no release is missed.
    fn claim(
        &self,
        flight: &mut Flight<'_>,
        fingerprint: Fingerprint,
        command: &Command,
    ) -> Option<(Fingerprint, Pin<Box<OwnedNotified>>)> {
        let inner = &*self.inner;
        let now = inner.rules.clock.now();
        let mut claims = inner.claims.lock();
        match claims.get_mut(&flight.ck) {
            Some(claim) if now < claim.since.saturating_add_ms(ms_i64(inner.rules.lease)) => {
                let released = claim.released.get_or_insert_with(Default::default).clone();
                let mut notified = Box::pin(released.notified_owned());
                notified.as_mut().enable();
                Some((claim.fingerprint, notified))
            }
            // No claim, or one past its lease: the database decides (the server has
            // ended a session that hung that long, so its claim is gone).
            _ => {
                let token = inner.next_token.fetch_add(1, Ordering::Relaxed);
                let old = claims.insert(
                    flight.ck.clone(),
                    Claim {
                        fingerprint,
                        token,
                        since: now,
                        command: command.clone(),
                        released: None,
                    },
                );
                if let Some(released) = old.and_then(|c| c.released) {
                    released.notify_waiters();
                }
                flight.token = Some(token);
                None
            }
        }
    }

    /// Runs the command's transaction, again after a retryable abort, within the
    /// attempt deadline each.
    async fn attempts(
        &self,
        client: &ClientId,
        key: &Key,
        command: &Command,
        fingerprint: Fingerprint,
        message: Option<&MessageId>,
    ) -> Result<Submission> {
        let deadline = self.attempt_deadline();
        let mut attempt = 0;
        loop {
            let run = self.execute(client, key, command, fingerprint, message);
            match tokio::time::timeout(deadline, run).await {
                Err(_) => {
                    return Err(LedgerError::Unavailable(format!(
                        "PostgreSQL did not answer within {deadline:?}; the command may or \
                         may not be recorded: retry with the same key"
                    )));
                }
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(Abort::InFlight)) => {
                    self.inner
                        .conflicts_in_flight
                        .fetch_add(1, Ordering::Relaxed);
                    self.note(&(client.clone(), key.clone()), false);
                    return Ok(Submission::InProgress {
                        retry_after: RETRY_AFTER,
                    });
                }
                Ok(Err(Abort::Retry(why))) => {
                    attempt += 1;
                    if attempt > RETRIES {
                        return Err(LedgerError::Unavailable(format!(
                            "gave up after {RETRIES} retries: {why}"
                        )));
                    }
                    tokio::time::sleep(Duration::from_millis(u64::from(attempt) * 2)).await;
                }
                Ok(Err(Abort::Fail(e))) => return Err(e),
            }
        }
    }

    /// An arrival that meets a live claim of this process on its key (a twin running
    /// here). What the key durably holds decides, as on sled, not the claim: the claim may
    /// be a retry of a key done long ago on its way through the database, or another
    /// command under a done key, and a true retry is then answered with its replay rather
    /// than told 409 or refused. Only a key with nothing committed is in flight: with
    /// `may_wait` that answer is not given (`None`, nothing counted), for the caller to
    /// wait for the twin. One read of the key's row, without its lock: a done row never
    /// changes its answer, and waiting on the twin's lock would turn a slow replay into a
    /// 409.
    pub(super) async fn answer_under_claim(
        &self,
        ck: &(ClientId, Key),
        claimed: Fingerprint,
        fingerprint: Fingerprint,
        message: bool,
        may_wait: bool,
    ) -> Result<Option<Submission>> {
        let inner = &*self.inner;
        let in_flight = Submission::InProgress {
            retry_after: RETRY_AFTER,
        };
        // A message comes again once the twin is done: the inbox rule checks its id before
        // the key (refusing it here for the key would report a reused message id as a
        // reused key), and it is recorded in the inbox with the key's fact, which takes a
        // transaction of its own.
        let answer = if message {
            in_flight
        } else {
            match self.done_key(ck).await? {
                Some((stored, _)) if stored != fingerprint => Submission::Reused,
                Some((_, fact)) => {
                    inner.durable_seq.fetch_max(fact.seq, Ordering::SeqCst);
                    inner.last_at.fetch_max(fact.at.millis(), Ordering::SeqCst);
                    Submission::Replayed(Outcome::from_fact(&fact))
                }
                None if claimed == fingerprint => in_flight,
                None => Submission::Reused,
            }
        };
        let counter = match &answer {
            Submission::Replayed(_) => &inner.replayed,
            Submission::Reused => &inner.conflicts_reused,
            _ if may_wait => return Ok(None),
            _ => &inner.conflicts_in_flight,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.note(ck, matches!(answer, Submission::Replayed(_)));
        Ok(Some(answer))
    }

    /// Whether this process holds a live claim on the key: a command of it is under way.
    pub(super) fn claimed_here(&self, client: &ClientId, key: &Key) -> bool {
        let now = self.inner.rules.clock.now();
        let lease = ms_i64(self.inner.rules.lease);
        self.inner
            .claims
            .lock()
            .get(&(client.clone(), key.clone()))
            .is_some_and(|claim| now < claim.since.saturating_add_ms(lease))
    }

    /// A done (or expired) key's fingerprint and fact, read as committed; `None` for a key
    /// with no row.
    pub(super) async fn done_key(
        &self,
        (client, key): &(ClientId, Key),
    ) -> Result<Option<(Fingerprint, Fact)>> {
        let Some((_, stored, fact)) = self.key_with_fact(client, key).await? else {
            return Ok(None);
        };
        let fact = fact.ok_or_else(|| {
            self.corrupt(format!(
                "key {key:?} of {client:?} is committed without its fact"
            ))
        })?;
        Ok(Some((stored, fact)))
    }

    /// One attempt: the whole command in one transaction, in two round trips (see
    /// `v3.sql`): BEGIN + `idem_claim_v3`, then `idem_apply_v3` + COMMIT. A refund takes one
    /// more, `idem_lock`, since the account it locks is read from the withdrawal's fact.
    pub(super) async fn execute(
        &self,
        client: &ClientId,
        key: &Key,
        command: &Command,
        fingerprint: Fingerprint,
        message: Option<&MessageId>,
    ) -> Result<Submission, Abort> {
        let inner = &*self.inner;
        // Taken before the transaction and held to its end (see `SHARDS`).
        let slot = ShardSlot {
            slots: &inner.shard_slots,
            shard: inner.shard_slots.take(),
        };
        let tx = OpenTx {
            conn: Some(inner.pool.get().await?),
            open: AtomicBool::new(false),
        };
        let args = self.args(client, key, command, &fingerprint, message)?;
        let row = self.claim_round_trip(&tx, &args).await?;
        let message_claimed: bool = get(&row, 1)?;
        if let Some(answer) = self
            .answer_taken(&tx, &args, &row, fingerprint, message_claimed)
            .await?
        {
            return Ok(answer);
        }
        let withdrawal = self.withdrawal_of(&tx, &args, &row).await?;
        let locked = self.lock_round_trip(&tx, &args, &row, withdrawal).await?;
        let seq_u =
            u64::try_from(locked.seq).map_err(|_| self.corrupt(format!("seq {}", locked.seq)))?;
        let fact = core::decide(client, key, command, &locked.inputs, seq_u, args.at);
        let outcome = Outcome::from_fact(&fact);
        let shard = slot.shard.unwrap_or_else(|| self.next_shard());
        let legs = Legs::of(&fact)?;
        let apply = self.apply_of(
            &args,
            &locked,
            &fact,
            &outcome,
            &legs,
            shard,
            message_claimed,
        )?;
        self.apply_round_trip(&tx, &apply).await?;
        inner.durable_seq.fetch_max(seq_u, Ordering::SeqCst);
        inner.last_at.fetch_max(args.at.millis(), Ordering::SeqCst);
        Ok(Submission::Executed(outcome))
    }

    /// The command as the statements take it.
    fn args<'a>(
        &self,
        client: &'a ClientId,
        key: &'a Key,
        command: &'a Command,
        fingerprint: &'a Fingerprint,
        message: Option<&'a MessageId>,
    ) -> Result<Args<'a>> {
        let inner = &*self.inner;
        let at = self.record_time();
        let (withdrawal_key, claim_account) = match command {
            Command::Refund { withdrawal, .. } => (Some(withdrawal.as_str()), None),
            Command::Deposit { account, .. } | Command::Withdraw { account, .. } => {
                (None, Some(account.as_str()))
            }
        };
        Ok(Args {
            client,
            key,
            command,
            c: client.as_str(),
            k: key.as_str(),
            fp: &fingerprint.0,
            at,
            at_db: db_time(at)?,
            message_id: message.map(MessageId::as_str),
            message_fp: message.map(|_| message_fingerprint(client, key, command).0.to_vec()),
            withdrawal_key,
            claim_account,
            wait_ms: ms_i32(inner.options.in_flight_wait),
            lease_ms: ms_i32(inner.rules.lease),
        })
    }

    /// Round trip 1: BEGIN, then claim the message id and the key (waiting at most the
    /// in-flight wait for a twin's claim), read what they hold if they were taken, and for
    /// a deposit or a withdrawal lock the account and take the fact's number.
    async fn claim_round_trip(&self, tx: &OpenTx, args: &Args<'_>) -> Result<Row, Abort> {
        let conn = tx.conn()?;
        let claim = conn.prepare_cached(SQL_CLAIM).await?;
        let claim_p: [P; 10] = [
            &args.c,
            &args.k,
            &args.fp,
            &args.at_db,
            &args.wait_ms,
            &args.message_id,
            &args.message_fp,
            &args.withdrawal_key,
            &args.claim_account,
            &args.lease_ms,
        ];
        tx.open.store(true, Ordering::Relaxed);
        let (begun, row) = tokio::join!(
            conn.batch_execute("BEGIN"),
            conn.query_one(&claim, &claim_p)
        );
        begun?;
        Ok(row?)
    }

    /// The answer when the claim found the message id or the key taken (a reused message
    /// id, a replay, a reuse of the key), or a twin in flight; `None` when this attempt
    /// claimed the key and goes on to decide.
    async fn answer_taken(
        &self,
        tx: &OpenTx,
        args: &Args<'_>,
        row: &Row,
        fingerprint: Fingerprint,
        message_claimed: bool,
    ) -> Result<Option<Submission>, Abort> {
        let state: &str = get(row, 0)?;
        match state {
            "claimed" => Ok(None),
            "in_flight" => Err(Abort::InFlight),
            "vanished" => Err(Abort::Retry("a claimed row vanished".into())),
            "message_reused" => self.quarantine_reused_message(tx, args).await.map(Some),
            "seen" => self
                .answer_seen(tx, args, row, fingerprint, message_claimed)
                .await
                .map(Some),
            other => Err(Abort::Fail(LedgerError::Unavailable(format!(
                "idem_claim_v3 answered {other:?}"
            )))),
        }
    }

    /// A message id delivered before with another payload: quarantined, nothing applied.
    async fn quarantine_reused_message(
        &self,
        tx: &OpenTx,
        args: &Args<'_>,
    ) -> Result<Submission, Abort> {
        // Rolled back first: this attempt may hold a new key's claim.
        tx.rollback().await?;
        let reason = "message_id_reused: this message id was delivered before with \
                      another payload";
        let payload = format!(
            "{{\"key\":{:?},\"command\":{:?}}}",
            args.key.as_str(),
            args.command.name()
        );
        let conn = tx.conn()?;
        let stmt = conn.prepare_cached(SQL_QUARANTINE).await?;
        conn.query_one(
            &stmt,
            &[&args.at_db, &args.message_id, &reason, &payload.as_str()],
        )
        .await?;
        Ok(Submission::Quarantined {
            reason: reason.into(),
        })
    }

    /// A done key: its replay, or `Reused` for another command. A new message for a done
    /// key is remembered with the key's fact, as sled does, so its redelivery is known by
    /// id too.
    async fn answer_seen(
        &self,
        tx: &OpenTx,
        args: &Args<'_>,
        row: &Row,
        fingerprint: Fingerprint,
        message_claimed: bool,
    ) -> Result<Submission, Abort> {
        let inner = &*self.inner;
        let ck = (args.client.clone(), args.key.clone());
        let (stored, existing) = self.key_fact(row, 2)?;
        if core::classify(Some(stored), fingerprint) == Seen::Reused {
            tx.rollback().await?;
            inner.conflicts_reused.fetch_add(1, Ordering::Relaxed);
            self.note(&ck, false);
            return Ok(Submission::Reused);
        }
        let fact = existing.ok_or_else(|| {
            self.corrupt(format!(
                "key {:?} of {:?} is committed without its fact",
                args.k, args.c
            ))
        })?;
        if message_claimed && let Some(m) = args.message_id {
            let conn = tx.conn()?;
            let seq = db_int(fact.seq)?;
            let stmt = conn.prepare_cached(SQL_INBOX_SEQ).await?;
            let set_p: [P; 2] = [&m, &seq];
            let (set, commit) =
                tokio::join!(conn.execute(&stmt, &set_p), conn.batch_execute("COMMIT"));
            tx.open.store(false, Ordering::Relaxed);
            one_row(set?, "the inbox record")?;
            commit?;
        } else {
            tx.rollback().await?;
        }
        inner.replayed.fetch_add(1, Ordering::Relaxed);
        self.note(&ck, true);
        inner.durable_seq.fetch_max(fact.seq, Ordering::SeqCst);
        inner.last_at.fetch_max(fact.at.millis(), Ordering::SeqCst);
        Ok(Submission::Replayed(Outcome::from_fact(&fact)))
    }

    /// For a refund, the withdrawal it names: (account, amount, currency), `None` when
    /// there is no such withdrawal.
    ///
    /// A refund whose withdrawal has no row may have overtaken it: the withdrawal may be
    /// in flight, its transaction holding the key's claim and not committed yet, or
    /// claimed in this process and not yet there. Decided now, the refund would be
    /// withdrawal_not_found for ever, so it waits for the key's lock as a twin would
    /// (at most the in-flight wait) and reads the withdrawal again (`v5.sql`); still
    /// missing while this process holds a live claim on it, or the wait ran out, the
    /// refund is told 409 with nothing stored. A refund that names its own key holds
    /// that claim itself. An extra round trip, only for a withdrawal that was not there.
    async fn withdrawal_of(
        &self,
        tx: &OpenTx,
        args: &Args<'_>,
        row: &Row,
    ) -> Result<Option<(Account, Amount, Currency)>, Abort> {
        let conn = tx.conn()?;
        let settled;
        let (withdrawal_seq, withdrawal_body): (Option<i64>, Option<&[u8]>) = match args.command {
            Command::Refund { withdrawal, .. }
                if withdrawal != args.key && get::<Option<i64>>(row, 5)?.is_none() =>
            {
                let stmt = conn.prepare_cached(SQL_WITHDRAWAL).await?;
                let w = withdrawal.as_str();
                let p: [P; 4] = [&args.c, &w, &args.wait_ms, &args.lease_ms];
                settled = conn.query_one(&stmt, &p).await?;
                let seq: Option<i64> = get(&settled, 1)?;
                if get::<&str>(&settled, 0)? == "in_flight"
                    || (seq.is_none() && self.claimed_here(args.client, withdrawal))
                {
                    return Err(Abort::InFlight);
                }
                (seq, get(&settled, 2)?)
            }
            _ => (get(row, 5)?, get(row, 6)?),
        };
        Ok(match (withdrawal_seq, withdrawal_body) {
            (Some(seq), Some(body)) => match self.decode(seq, body)?.body {
                FactBody::WithdrawalRecorded {
                    account,
                    amount,
                    currency,
                    ..
                } => Some((account, amount, currency)),
                _ => None,
            },
            _ => None,
        })
    }

    /// What the decision reads, locked: the account (and for a refund, the withdrawal's
    /// refunded total) and the fact's number. A refund locks them now (round trip 1b),
    /// since its account is named by the withdrawal's fact; the others had them locked by
    /// the claim.
    async fn lock_round_trip(
        &self,
        tx: &OpenTx,
        args: &Args<'_>,
        row: &Row,
        withdrawal: Option<(Account, Amount, Currency)>,
    ) -> Result<Locked, Abort> {
        let conn = tx.conn()?;
        let (currency, balance, seq, refunded): (Option<String>, Option<String>, i64, Option<i64>) =
            if args.withdrawal_key.is_some() {
                let lock = conn.prepare_cached(SQL_LOCK).await?;
                let account = withdrawal.as_ref().map(|w| w.0.as_str());
                let refund_of = withdrawal.as_ref().and(args.withdrawal_key);
                let locked = conn
                    .query_one(&lock, &[&account, &args.c, &refund_of])
                    .await?;
                (
                    get(&locked, 0)?,
                    get(&locked, 1)?,
                    get(&locked, 3)?,
                    get(&locked, 2)?,
                )
            } else {
                (get(row, 7)?, get(row, 8)?, get(row, 3)?, None)
            };
        let refunded_before = refunded.map_or(0, |t| u64::try_from(t).unwrap_or(0));
        let account = match (currency, balance) {
            (Some(currency), Some(balance)) => Some(AccountView {
                currency: self.currency(currency)?,
                balance: self.number(balance)?,
            }),
            _ => None,
        };
        Ok(Locked {
            seq,
            account_exists: account.is_some(),
            refunded_exists: refunded.is_some(),
            inputs: Inputs {
                account,
                withdrawal: withdrawal.map(|(account, amount, currency)| WithdrawalView {
                    account,
                    currency,
                    amount,
                    refunded: refunded_before,
                }),
            },
        })
    }

    /// The writes of a decided fact, as `idem_apply_v3` takes them.
    #[allow(clippy::too_many_arguments)] // What the writes are made of, each borrowed.
    fn apply_of<'a>(
        &self,
        args: &Args<'a>,
        locked: &Locked,
        fact: &'a Fact,
        outcome: &Outcome,
        legs: &'a Legs<'a>,
        shard: i16,
        message_claimed: bool,
    ) -> Result<Apply<'a>> {
        let (user, system) = (&legs.user, &legs.system);
        let refund = match &fact.body {
            FactBody::RefundRecorded {
                amount,
                refunded_total,
                ..
            } => Some((
                db_int(amount.units())?,
                db_int(*refunded_total)?,
                withdrawal_amount(&locked.inputs)?,
            )),
            _ => None,
        };
        Ok(Apply {
            seq: locked.seq,
            at: args.at_db,
            client: args.c,
            key: args.k,
            kind: fact.body.persisted_name(),
            rejection: match &fact.body {
                FactBody::CommandRejected { rejection, .. } => Some(rejection.code()),
                _ => None,
            },
            body: fact.encode(),
            doc: fact::json::fact(fact),
            response: fact::json::outcome(outcome),
            counter: counter_name(&fact.body),
            shard,
            account: user.as_ref().map(|u| u.0.as_str()),
            currency: user.as_ref().or(system.as_ref()).map(|l| l.1.as_str()),
            delta: user.as_ref().map(|u| u.2),
            account_exists: locked.account_exists,
            balance_after: balance_after(&fact.body).map(|b| b.to_string()),
            system: system.as_ref().map(|s| s.0.as_str()),
            system_delta: system.as_ref().map(|s| s.2),
            withdrawal: refund.as_ref().and(args.withdrawal_key),
            refund: refund.map(|r| r.0),
            withdrawn: refund.map(|r| r.2),
            refunded_exists: locked.refunded_exists,
            refunded_after: refund.map(|r| r.1),
            message: args.message_id.filter(|_| message_claimed),
            hash: args.fp,
        })
    }

    /// Round trip 2: the effect and the COMMIT. `idem_apply_v3` checks every write against
    /// the decision and raises if one disagrees, which turns the COMMIT into a rollback.
    async fn apply_round_trip(&self, tx: &OpenTx, apply: &Apply<'_>) -> Result<(), Abort> {
        let conn = tx.conn()?;
        let stmt = conn.prepare_cached(SQL_APPLY).await?;
        let apply_p = apply.params();
        let (applied, commit) =
            tokio::join!(conn.execute(&stmt, &apply_p), conn.batch_execute("COMMIT"));
        tx.open.store(false, Ordering::Relaxed);
        if let Err(e) = applied {
            if e.code().map(SqlState::code) == Some(DISAGREE) {
                return Err(self.disagree(describe(&e)));
            }
            return Err(e.into());
        }
        commit?;
        Ok(())
    }
}

/// The user balance a fact records after it, if it moved money.
pub(super) fn balance_after(body: &FactBody) -> Option<u128> {
    match body {
        FactBody::DepositRecorded { balance_after, .. }
        | FactBody::WithdrawalRecorded { balance_after, .. }
        | FactBody::RefundRecorded { balance_after, .. } => Some(*balance_after),
        FactBody::CommandRejected { .. } => None,
    }
}

/// The amount of the withdrawal a refund decision read.
pub(super) fn withdrawal_amount(inputs: &Inputs) -> Result<i64> {
    let amount = inputs.withdrawal.as_ref().map_or(0, |w| w.amount.units());
    db_int(amount)
}

pub(super) fn one_row(n: u64, what: &str) -> Result<(), Abort> {
    if n == 1 {
        Ok(())
    } else {
        Err(Abort::Fail(LedgerError::Unavailable(format!(
            "writing {what} changed {n} rows, not 1; nothing was recorded"
        ))))
    }
}
