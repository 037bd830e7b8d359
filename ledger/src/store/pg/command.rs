//! PgStore's command path: the claim of a key in this process, then the command joins
//! its lane's next group; the lane decides the whole group in one transaction (two round
//! trips, one commit; see `schema.sql`), and runs it again, or splits it, when the
//! transaction fails.
//!
//! The route of a command: `Store::submit` (`mod.rs`), then `submit_command` here, then
//! `join_group` (`group.rs`).

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::time::Instant;

use tokio::sync::futures::OwnedNotified;

use super::db::{Result, ms_i64};
use super::group::RETRY_AFTER;
use super::state::{Claim, Inner, PgStore};
use crate::domain::{ClientId, Command, Fingerprint, Key, MessageId};
use crate::fact::{Fact, Outcome};
use crate::store::{LATENCY_BUCKETS_US, LedgerError, Submission};

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

    pub(super) fn record_latency(&self, started: Instant) {
        let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        let mut m = self.inner.metrics.lock();
        let i = LATENCY_BUCKETS_US
            .iter()
            .position(|b| us <= *b)
            .unwrap_or(LATENCY_BUCKETS_US.len() - 1);
        m.latency_buckets[i] += 1;
        m.latency_sum_us = m.latency_sum_us.saturating_add(us);
    }
}
