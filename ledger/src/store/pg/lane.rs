//! A lane's queue: what a command waits in for its group (`Queued`), and what the lane is
//! (`Lane`): its queue, its count and who runs its group now. Data only, apart from the
//! group commit that runs the lanes (`group.rs`), so that the store's state can hold them
//! without importing that.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Instant;

use tokio::sync::{mpsc, oneshot};

use super::db::Result;
use crate::domain::{ClientId, Command, Fingerprint, Key, MessageId};
use crate::store::Submission;

/// A command waiting in its lane.
pub(super) struct Queued {
    pub(super) client: ClientId,
    pub(super) key: Key,
    pub(super) command: Command,
    pub(super) fingerprint: Fingerprint,
    pub(super) message: Option<MessageId>,
    pub(super) arrived: Instant,
    pub(super) reply: oneshot::Sender<Result<Submission>>,
}

/// A lane: its queue, the task that gathers groups from it, and who runs its group now.
pub(super) struct Lane {
    pub(super) tx: mpsc::UnboundedSender<Queued>,
    /// Commands sent to the queue and not yet taken by the lane's task.
    pub(super) queued: Arc<AtomicUsize>,
    /// Held by whoever runs a group of this lane, one at a time: the lane's task, or a
    /// command that found the lane idle and its queue empty, which runs alone on its own
    /// task (see `join_group`).
    pub(super) busy: Arc<tokio::sync::Mutex<()>>,
}
