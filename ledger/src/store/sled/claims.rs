//! The claims of keys in flight, with what their twins wait on, the answers cache and each
//! key's activity: in memory, in shards behind a lock each. `Shared` holds the shards, so
//! they sit below it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::domain::{ClientId, Command, Fingerprint, Key, Timestamp};
use crate::fact::Outcome;

pub(super) const SHARDS: usize = 64;
pub(super) const ACTIVITY_PER_SHARD: usize = 4096;
pub(super) const ANSWERS_PER_SHARD: usize = 1024;

#[derive(Debug, Clone)]
pub(super) struct Claim {
    pub(super) fingerprint: Fingerprint,
    pub(super) token: u64,
    pub(super) claimed_at: Timestamp,
    pub(super) command: Command,
    /// Set by the first twin that waits for this claim (see [`Released`]); most claims
    /// never meet a twin, so most cost no allocation.
    pub(super) released: Option<Arc<Released>>,
}

impl Claim {
    /// Wakes the twins waiting for this claim: it is gone (answered, failed, or taken
    /// over). Called under the shard's lock, where the claim leaves the map.
    pub(super) fn wake(&self) {
        if let Some(released) = &self.released {
            released.release();
        }
    }
}

/// What a twin waits on: an arrival that meets a live claim of its own command waits (up
/// to `SledConfig::in_flight_wait`) until the claim is released, then tries again and
/// finds the key's durable answer. The claim is released under the shard's lock after
/// the answer is remembered there and before it is given, so a woken twin reads the
/// answer from the cache. Neither the committer nor the shard's lock waits for a twin:
/// the twin waits on its own thread (blocking callers) or task (async callers).
#[derive(Debug, Default)]
pub(super) struct Released {
    done: Mutex<bool>,
    for_threads: Condvar,
    for_tasks: tokio::sync::Notify,
}

impl Released {
    fn release(&self) {
        *self.done.lock() = true;
        self.for_threads.notify_all();
        self.for_tasks.notify_waiters();
    }

    /// Waits on the calling thread until released or `wait` has passed.
    pub(super) fn wait_blocking(&self, wait: Duration) {
        let mut done = self.done.lock();
        let _ = self
            .for_threads
            .wait_while_for(&mut done, |done| !*done, wait);
    }

    /// Waits without holding a thread until released or `wait` has passed; on the
    /// calling thread when no tokio runtime is there to time the wait.
    pub(super) async fn wait(&self, wait: Duration) {
        if tokio::runtime::Handle::try_current().is_err() {
            return self.wait_blocking(wait);
        }
        let notified = self.for_tasks.notified();
        tokio::pin!(notified);
        // Registered before the flag is read, so a release in between is not missed.
        notified.as_mut().enable();
        if *self.done.lock() {
            return;
        }
        let _ = tokio::time::timeout(wait, notified).await;
    }
}

#[derive(Default)]
pub(super) struct Shard {
    pub(super) claims: HashMap<(ClientId, Key), Claim>,
    /// Durable answers of recently done keys, so most replays touch no storage. An
    /// answer never changes once durable, so this cache cannot go stale; it is bounded
    /// by being forgotten wholesale when full.
    pub(super) answers: HashMap<(ClientId, Key), (Fingerprint, Outcome)>,
    /// (replays, conflicts) per key, bounded: forgotten wholesale when full.
    pub(super) activity: HashMap<(ClientId, Key), (u32, u32)>,
}

impl Shard {
    /// Removes the claim if it is still the one with `token` (a takeover may have
    /// replaced it), and wakes its waiting twins.
    pub(super) fn unclaim(&mut self, ck: &(ClientId, Key), token: u64) {
        if self.claims.get(ck).is_some_and(|c| c.token == token)
            && let Some(claim) = self.claims.remove(ck)
        {
            claim.wake();
        }
    }

    pub(super) fn remember(
        &mut self,
        ck: &(ClientId, Key),
        fingerprint: Fingerprint,
        outcome: &Outcome,
    ) {
        if self.answers.len() >= ANSWERS_PER_SHARD {
            self.answers.clear();
        }
        self.answers
            .insert(ck.clone(), (fingerprint, outcome.clone()));
    }

    pub(super) fn note(&mut self, ck: &(ClientId, Key), replay: bool) {
        if self.activity.len() >= ACTIVITY_PER_SHARD && !self.activity.contains_key(ck) {
            self.activity.clear();
        }
        let e = self.activity.entry(ck.clone()).or_default();
        if replay {
            e.0 = e.0.saturating_add(1);
        } else {
            e.1 = e.1.saturating_add(1);
        }
    }
}
