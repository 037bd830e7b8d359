//! The key listings, a facet of the blocking face (`Blocking::key`, `Blocking::keys`) and of
//! the store (its pending keys, for `Store::pending`). How a claim or a key record reads as
//! a `KeyInfo` is `Shared`'s; the claims themselves are in `claims.rs`.

use crate::domain::{ClientId, Key};
use crate::fact::DecodeError;
use crate::store::{KEYS_SCAN_MAX, KeyInfo, KeyPage, KeyStatus};

use super::blocking::Blocking;
use super::error::Result;
use super::handle::SledStore;
use super::records::{KeyRecord, P_KEY, io_err, scoped_key, split_scoped};

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
