//! The command path on PostgreSQL: the claim of a key in this process, then the command
//! joins its lane's next group; the lane decides the whole group in one transaction (two
//! round trips, one commit; see `v8.sql`), and runs it again, or splits it, when the
//! transaction fails.

// The store's helpers (errors, conversions, claims) and what it imports.
use std::pin::Pin;

use tokio::sync::futures::OwnedNotified;

use super::*;

// The group's two statements (the claim of `v8.sql` with its body from `v10.sql`, the
// apply of `v12.sql`; a group of one fact applied by `v12.sql`'s other function), prepared
// once per connection (deadpool's cache) so that BEGIN and COMMIT ride beside them.
pub(super) const SQL_CLAIM: &str = "SELECT r_i, r_state, r_message_claimed, r_hash, r_seq, \
     r_body, r_withdrawal_seq, r_withdrawal, r_client, r_name, r_currency, r_balance, r_total \
     FROM idem_group_claim_v8($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";
pub(super) const SQL_APPLY: &str = "SELECT idem_group_apply_v12($1, $2, $3, $4, $5, $6, $7, $8, \
     $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, \
     $27, $28, $29, $30, $31, $32, $33)";
/// The apply of a group of one fact (`v11.sql`, its response as text since `v12.sql`),
/// with the fact's values as scalars.
pub(super) const SQL_APPLY_ONE: &str = "SELECT idem_apply_one_v12($1, $2, $3, $4, $5, $6, $7, \
     $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21)";
pub(super) const SQL_COUNT: &str = "INSERT INTO counters (name, shard, n) VALUES ($1, $2, $3) \
     ON CONFLICT (name, shard) DO UPDATE SET n = counters.n + EXCLUDED.n";
pub(super) const SQL_QUARANTINE: &str = "INSERT INTO quarantine (at, message_id, reason, payload) \
     VALUES ($1, $2, $3, $4) RETURNING id";
/// The SQLSTATE `idem_group_apply_v8` raises when a write disagrees with the decision.
pub(super) const DISAGREE: &str = "IDM01";
/// What a quarantined reused message id is told, and kept with.
pub(super) const MESSAGE_REUSED: &str = "message_id_reused: this message id was delivered before with \
     another payload";

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

impl<'a> ShardSlot<'a> {
    pub(super) fn take(slots: &'a ShardSlots) -> Self {
        Self {
            slots,
            shard: slots.take(),
        }
    }

    /// The shard taken, if one was free.
    pub(super) fn shard(&self) -> Option<i16> {
        self.shard
    }
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

/// A pooled connection with a transaction begun by hand, so that BEGIN rides in the
/// first round trip and COMMIT in the last (a driver transaction spends a round trip on
/// BEGIN alone). Dropped while the transaction is open (an error path, or the attempt's
/// deadline), it rolls back before the connection goes back to the pool, or closes the
/// connection, which rolls back too.
pub(super) struct OpenTx {
    conn: Option<deadpool_postgres::Object>,
    /// Transactions begun and not yet ended: two for a moment when a lane sends the next
    /// group's BEGIN behind this group's COMMIT, before the COMMIT's answer is read.
    open: AtomicUsize,
}

impl OpenTx {
    pub(super) fn new(conn: deadpool_postgres::Object) -> Self {
        Self {
            conn: Some(conn),
            open: AtomicUsize::new(0),
        }
    }

    /// Marks the transaction begun: from the BEGIN sent with the first statement.
    pub(super) fn opened(&self) {
        self.open.fetch_add(1, Ordering::Relaxed);
    }

    /// Marks the transaction ended: its COMMIT was sent (it commits or rolls back).
    pub(super) fn closed(&self) {
        let _ = self
            .open
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(1))
            });
    }

    pub(super) fn conn(&self) -> Result<&deadpool_postgres::Object, Abort> {
        self.conn
            .as_ref()
            .ok_or_else(|| Abort::Fail(LedgerError::Unavailable("connection lost".into())))
    }

    pub(super) async fn rollback(&self) -> Result<(), Abort> {
        self.conn()?.batch_execute("ROLLBACK").await?;
        self.closed();
        Ok(())
    }
}

impl Drop for OpenTx {
    fn drop(&mut self) {
        if self.open.load(Ordering::Relaxed) == 0 {
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
    /// One submission: the key claimed in this process, then the command's group decides
    /// it (see `run_group`). An arrival that meets a twin of its own command in flight
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
            .join_group(client, key, command, fingerprint, message)
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
}
