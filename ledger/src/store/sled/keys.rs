//! Keys on sled: the claims of keys in flight and the answers cache (sharded), what a done
//! key holds, and the listings of keys.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::domain::{ClientId, Command, Fingerprint, Key, Timestamp};
use crate::fact::{DecodeError, Outcome};
use crate::store::{KEYS_SCAN_MAX, KeyInfo, KeyPage, KeyStatus, Submission};

use super::records::{Held, KeyRecord, P_KEY, io_err, scoped_key, split_scoped};
use super::{Blocking, Result, Shared, SledStore, duration_ms};

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

impl SledStore {
    /// Pending keys (claimed, not yet durable), oldest first.
    pub(super) fn pending_keys(&self) -> Vec<KeyInfo> {
        let mut out = Vec::new();
        for shard in &self.shared.shards {
            let shard = shard.lock();
            out.extend(
                shard
                    .claims
                    .iter()
                    .map(|(ck, claim)| self.shared.pending_info(&shard, ck, claim)),
            );
        }
        out.sort_by(|a, b| (a.since, &a.client, &a.key).cmp(&(b.since, &b.client, &b.key)));
        out
    }
}

impl Blocking<'_> {
    /// One key: pending, done or expired; `None` if never seen.
    pub fn key(&self, client: &ClientId, key: &Key) -> Result<Option<KeyInfo>> {
        let ck = (client.clone(), key.clone());
        {
            let shard = self.store.shared.shard(&ck).lock();
            if let Some(claim) = shard.claims.get(&ck) {
                return Ok(Some(self.store.shared.pending_info(&shard, &ck, claim)));
            }
        }
        match self
            .store
            .shared
            .tree
            .get(scoped_key(P_KEY, client, key.as_str()))
            .map_err(io_err)?
        {
            None => Ok(None),
            Some(bytes) => Ok(Some(self.store.shared.key_info(client, key, &bytes)?)),
        }
    }

    /// Done and expired keys in (client, key) order after `after`, filtered, at most
    /// `limit`. `KeyPage::next` says where to go on, also when a filtered scan stopped
    /// (it reads at most [`KEYS_SCAN_MAX`] records a call) before finding `limit` keys;
    /// `None` means the end. Pending keys (`status` pending) come from memory, in one page.
    pub fn keys(
        &self,
        status: Option<KeyStatus>,
        client: Option<&ClientId>,
        after: Option<(&ClientId, &Key)>,
        limit: usize,
    ) -> Result<KeyPage> {
        if status == Some(KeyStatus::Pending) {
            let keys = self
                .store
                .pending_keys()
                .into_iter()
                .filter(|k| client.is_none_or(|c| *c == k.client))
                .take(limit)
                .collect();
            return Ok(KeyPage { keys, next: None });
        }
        let prefix = match client {
            Some(c) => scoped_key(P_KEY, c, ""),
            None => vec![P_KEY],
        };
        let iter = match after {
            Some((c, k)) => {
                let mut start = scoped_key(P_KEY, c, k.as_str());
                start.push(0);
                self.store.shared.tree.range(start..)
            }
            None => self.store.shared.tree.range(prefix.clone()..),
        };
        let mut page = KeyPage {
            keys: Vec::new(),
            next: None,
        };
        let mut last = None;
        for (scanned, item) in iter.enumerate() {
            let (k, v) = item.map_err(io_err)?;
            if !k.starts_with(&prefix) {
                return Ok(page);
            }
            if page.keys.len() >= limit || scanned >= KEYS_SCAN_MAX {
                page.next = last;
                return Ok(page);
            }
            let Some((c, key)) = split_scoped(&k) else {
                return Err(self
                    .store
                    .shared
                    .corrupt(DecodeError::new("key record key", "shape")));
            };
            last = Some((c.clone(), key.clone()));
            if let Some(want) = status {
                // Only the status is needed to filter: skipped keys cost one decode.
                let rec = KeyRecord::decode(&v).map_err(|e| self.store.shared.corrupt(e))?;
                let is = if rec.expired {
                    KeyStatus::Expired
                } else {
                    KeyStatus::Done
                };
                if is != want {
                    continue;
                }
            }
            page.keys.push(self.store.shared.key_info(&c, &key, &v)?);
        }
        Ok(page)
    }
}

impl Shared {
    pub(super) fn shard(&self, ck: &(ClientId, Key)) -> &Mutex<Shard> {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        ck.hash(&mut h);
        let i = usize::try_from(h.finish() % SHARDS as u64).unwrap_or(0);
        &self.shards[i]
    }

    pub(super) fn release(&self, ck: &(ClientId, Key), token: u64) {
        self.shard(ck).lock().unclaim(ck, token);
    }

    /// What a done key holds, with its fingerprint; `None` for a key never done. The
    /// answer is rendered only when it is replayed.
    pub(super) fn held(
        &self,
        shard: &Shard,
        ck: &(ClientId, Key),
    ) -> Result<Option<(Fingerprint, Held)>> {
        if let Some((stored, outcome)) = shard.answers.get(ck) {
            return Ok(Some((*stored, Held::Cached(outcome.clone()))));
        }
        let Some(bytes) = self
            .tree
            .get(scoped_key(P_KEY, &ck.0, ck.1.as_str()))
            .map_err(io_err)?
        else {
            return Ok(None);
        };
        let rec = KeyRecord::decode(&bytes).map_err(|e| self.corrupt(e))?;
        let held = if rec.seq > self.durable_seq.load(Ordering::Acquire) {
            Held::Unflushed
        } else {
            Held::Logged(rec.seq)
        };
        Ok(Some((rec.fingerprint, held)))
    }

    /// The replay of a done key, remembered in the shard's answer cache.
    pub(super) fn replay(
        &self,
        shard: &mut Shard,
        ck: &(ClientId, Key),
        fingerprint: Fingerprint,
        held: Held,
    ) -> Result<Submission> {
        let outcome = match held {
            Held::Cached(outcome) => outcome,
            Held::Logged(seq) => {
                let outcome = self.stored_outcome(seq)?;
                shard.remember(ck, fingerprint, &outcome);
                outcome
            }
            // Not reachable without a claim (claims outlive the flush); not an answer yet.
            Held::Unflushed => {
                return Ok(Submission::InProgress {
                    retry_after: Duration::from_secs(1),
                });
            }
        };
        Ok(Submission::Replayed(outcome))
    }

    pub(super) fn pending_info(
        &self,
        shard: &Shard,
        ck: &(ClientId, Key),
        claim: &Claim,
    ) -> KeyInfo {
        let now = self.config.clock.now();
        let lease = duration_ms(self.config.lease);
        let (replays, conflicts) = shard.activity.get(ck).copied().unwrap_or_default();
        KeyInfo {
            client: ck.0.clone(),
            key: ck.1.clone(),
            status: KeyStatus::Pending,
            command: claim.command.clone(),
            since: claim.claimed_at,
            outcome: None,
            lease_expired: now >= claim.claimed_at.saturating_add_ms(lease),
            replays,
            conflicts,
        }
    }

    pub(super) fn key_info(&self, client: &ClientId, key: &Key, bytes: &[u8]) -> Result<KeyInfo> {
        let rec = KeyRecord::decode(bytes).map_err(|e| self.corrupt(e))?;
        let outcome = self.stored_outcome(rec.seq)?;
        let command = match &outcome {
            Outcome::Applied(r) => r.command.clone(),
            Outcome::Rejected(r) => r.command.clone(),
        };
        let (replays, conflicts) = {
            let ck = (client.clone(), key.clone());
            self.shard(&ck)
                .lock()
                .activity
                .get(&ck)
                .copied()
                .unwrap_or_default()
        };
        Ok(KeyInfo {
            client: client.clone(),
            key: key.clone(),
            status: if !rec.expired {
                KeyStatus::Done
            } else {
                KeyStatus::Expired
            },
            command,
            since: rec.at,
            outcome: Some(outcome),
            lease_expired: false,
            replays,
            conflicts,
        })
    }
}
