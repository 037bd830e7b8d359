//! `SledStore`, the handle every caller holds: the state it shares with the committer, the
//! committer's queue and its thread; the last handle dropped closes the ledger. Its other
//! `impl`s are named facets in files of their own, above this one: `open.rs` (opening),
//! `submit.rs` (the submit path), `blocking.rs` (the blocking face), `keys.rs` (the key
//! listings); `mod.rs` implements `Store` with them.

use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::Sender;
use parking_lot::Mutex;

use crate::store::Rules;

use super::committer::{Lead, Request};
use super::config::SledConfig;
use super::shared::Shared;

/// Keeps the committer paused while alive.
#[derive(Debug)]
pub struct PauseGuard {
    _tx: Sender<()>,
}

/// A handle to an open ledger. Cheap to clone; the committer stops on [`Store::shutdown`]
/// or when the last handle is dropped.
///
/// [`Store::shutdown`]: crate::store::Store::shutdown
#[derive(Clone)]
pub struct SledStore {
    pub(super) shared: Arc<Shared>,
    pub(super) tx: Sender<Request>,
    /// The committer's state, for a blocking caller that finds it idle and leads.
    pub(super) lead: Arc<Lead>,
    pub(super) committer: Arc<Mutex<Option<JoinHandle<()>>>>,
}

impl std::fmt::Debug for SledStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledStore")
            .field("path", &self.shared.path)
            .finish()
    }
}

impl SledStore {
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    pub fn config(&self) -> &SledConfig {
        &self.shared.config
    }

    pub(crate) fn rules_ref(&self) -> &Rules {
        &self.shared.rules
    }

    /// Queues a request for the committer. If it has stopped, the request (and its reply)
    /// is dropped, which its waiter reads as `Closed`.
    pub(super) fn request(&self, request: Request) {
        let _ = self.send(request);
    }

    /// Sends to the decider, counted while queued: a leader never overtakes a request
    /// queued before it. Gives the request back when the committer has stopped.
    pub(super) fn send(&self, request: Request) -> Option<Request> {
        let n = request.count();
        self.lead.sending(n);
        let crossbeam_channel::SendError(unsent) = self.tx.send(request).err()?;
        self.lead.unsent(n);
        Some(unsent)
    }

    /// Requests waiting for the committer (commands, and a pause not yet taken up): for
    /// tests that must know what is queued behind a pause rather than sleep on it.
    #[doc(hidden)]
    pub fn queued(&self) -> usize {
        self.lead.queued()
    }

    /// Whether the committer is idle as a leader would find it: nothing queued, and
    /// neither the decider nor the syncer busy. For tests that must know the syncer thread
    /// has parked rather than sleep on it.
    #[doc(hidden)]
    pub fn committer_idle(&self) -> bool {
        self.lead.idle()
    }

    /// Stops the committer after what was submitted before, until the guard is dropped:
    /// commands submitted meanwhile stay pending. For tests of in-flight duplicates and
    /// lease takeover, and for taking a consistent copy of the folder.
    pub fn pause(&self) -> PauseGuard {
        let (tx, rx) = crossbeam_channel::bounded(0);
        let _ = self.send(Request::Pause(rx));
        PauseGuard { _tx: tx }
    }

    /// Finishes and flushes everything submitted before, then stops the committer.
    /// Later submissions answer [`LedgerError::Closed`].
    pub(super) fn close(&self) {
        let _ = self.send(Request::Shutdown);
        if let Some(handle) = self.committer.lock().take() {
            let _ = handle.join();
        }
    }
}

impl Drop for SledStore {
    /// The last handle closes the ledger deterministically, so that the folder can be
    /// reopened as soon as the drop returns.
    fn drop(&mut self) {
        if Arc::strong_count(&self.committer) == 1 {
            self.close();
        }
    }
}
