//! SledStore's submit path, a facet of it: an arrival is answered here when its key's
//! claim or the answers cache decides (a replay, a reused key, a twin in flight, waited for a
//! while), and otherwise claims its key and goes on to the committer: queued, gathered with
//! its burst (async callers), or committed on its own thread when the committer is idle
//! (blocking callers). Callers (`mod.rs`, `blocking.rs`) sit above it, the committer below.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::core::{self, Seen};
use crate::domain::{ClientId, Command, Fingerprint, Key, MessageId, Timestamp};
use crate::store::{LedgerError, Submission};

use super::claims::{Claim, Released, Shard};
use super::committer::{Queued, Reply, Request};
use super::config::duration_ms;
use super::error::Result;
use super::handle::SledStore;
use super::records::Held;
use super::shared::Shared;

/// How a submission's caller may wait.
#[derive(Debug, Clone, Copy)]
pub(super) struct Caller {
    /// Wait (up to the in-flight wait) for a twin in flight instead of answering
    /// `InProgress` at once.
    pub(super) wait: bool,
    /// The caller is a thread that may block on the journal's sync, so it may commit its
    /// command itself when the committer is idle. Never an async task: the sync would
    /// hold its runtime's thread.
    pub(super) lead: bool,
    /// The caller is an async task on a runtime: its command is gathered with the others
    /// of its burst, and the caller told to hand them over when it is the first.
    pub(super) gather: bool,
}

impl Caller {
    /// One attempt from a callback.
    const ONCE: Caller = Caller {
        wait: false,
        lead: false,
        gather: false,
    };
}

/// What an attempt left its caller to do.
pub(super) enum Attempt {
    /// Nothing: answered, or on its way to the committer.
    Done,
    /// Wait for the twin in flight, then try once more.
    Twin(Twin),
    /// Hand the gathered commands over: this one opened the gathering.
    HandOver,
}

/// An arrival that waits for its twin: what it needs to try once more.
pub(super) struct Twin {
    pub(super) released: Arc<Released>,
    pub(super) command: Command,
    pub(super) message: Option<MessageId>,
    pub(super) reply: Reply,
}

impl SledStore {
    /// Submits without waiting: `reply` is called once with the answer. One attempt: an
    /// arrival that meets a twin in flight is answered `InProgress` at once, without the
    /// bounded wait of [`Blocking::submit`] and [`Store::submit`].
    ///
    /// [`Blocking::submit`]: super::Blocking::submit
    /// [`Store::submit`]: crate::store::Store::submit
    pub fn submit_with(
        &self,
        client: &ClientId,
        key: &Key,
        command: Command,
        message: Option<MessageId>,
        reply: Reply,
    ) {
        self.attempt(client, key, command, message, reply, Caller::ONCE);
    }

    /// One attempt at a submission: answered here when the key's claim or cache decides,
    /// else claimed and sent to the committer (or, for a blocking caller that finds the
    /// committer idle, committed on its own thread; for an async caller, gathered with
    /// the others of its burst). With `caller.wait`, an arrival that would be told
    /// `InProgress` because a twin holds the key is not answered: it gets back what it
    /// needs to wait for the twin's claim and try once more.
    pub(super) fn attempt(
        &self,
        client: &ClientId,
        key: &Key,
        command: Command,
        message: Option<MessageId>,
        reply: Reply,
        caller: Caller,
    ) -> Attempt {
        let shared = &self.shared;
        if let Some(reason) = shared.failed.lock().clone() {
            reply(Err(LedgerError::Unavailable(reason)));
            return Attempt::Done;
        }
        let fingerprint = command.fingerprint();
        let now = shared.config.clock.now();
        let ck = (client.clone(), key.clone());
        let mut shard = shared.shard(&ck).lock();
        let answer = self.answer_at_once(&mut shard, &ck, fingerprint, message.is_some(), now);
        if caller.wait
            && !shared.config.in_flight_wait.is_zero()
            && matches!(answer, Some(Ok(Submission::InProgress { .. })))
            && let Some(claim) = shard.claims.get_mut(&ck)
        {
            let released = claim.released.get_or_insert_with(Default::default).clone();
            return Attempt::Twin(Twin {
                released,
                command,
                message,
                reply,
            });
        }
        match answer {
            Some(answer) => {
                count_answer(shared, &mut shard, &ck, &answer);
                drop(shard);
                reply(answer);
                Attempt::Done
            }
            None => {
                let token = shared.next_token.fetch_add(1, Ordering::Relaxed);
                let claim = Claim {
                    fingerprint,
                    token,
                    claimed_at: now,
                    command: command.clone(),
                    released: None,
                };
                // A claim whose lease ran out is taken over: its twins stop waiting.
                if let Some(old) = shard.claims.insert(ck, claim) {
                    old.wake();
                }
                drop(shard);
                let queued = Queued {
                    ck: (client.clone(), key.clone()),
                    command,
                    fingerprint,
                    token,
                    message,
                    arrived: Instant::now(),
                    reply,
                };
                self.send_command(queued, caller)
            }
        }
    }

    /// The answer an arrival gets without the committer, from the key's live claim or
    /// the answers cache; `None` when the committer must decide (and the arrival claims
    /// the key).
    fn answer_at_once(
        &self,
        shard: &mut Shard,
        ck: &(ClientId, Key),
        fingerprint: Fingerprint,
        message: bool,
        now: Timestamp,
    ) -> Option<Result<Submission>> {
        let shared = &self.shared;
        let live = shard.claims.get(ck).map(|claim| {
            let ends = claim
                .claimed_at
                .saturating_add_ms(duration_ms(shared.config.lease));
            (claim.fingerprint, ends)
        });
        // What the key durably holds answers a repeat of its own command (a replay) and
        // refuses another (reused). A message is never decided here: its id must reach the
        // committer, to be checked against the inbox before its key and recorded with its
        // answer.
        match live {
            // A live claim. What the key durably holds decides, not the claim: a claim of
            // another command may be an intruder on a key already done with this one (an
            // inbox message reusing the key, or a takeover), and a claim of this very
            // command may be a replay on its way through the committer (a done key whose
            // answer had left the cache), so a true retry is answered meanwhile instead of
            // being refused or told 409. Only a key that holds nothing durable yet is in
            // flight. This reads the key on the caller's thread, but only for an arrival
            // that meets a live claim (a duplicate in flight), never for a first attempt.
            Some((claimed, ends)) if now < ends => {
                let left = u64::try_from(ends.millis() - now.millis()).unwrap_or(0);
                // Retry-After is in whole seconds; the commit usually takes milliseconds.
                let in_flight = Submission::InProgress {
                    retry_after: Duration::from_millis(left.clamp(1, 1000))
                        .max(Duration::from_secs(1)),
                };
                // A message comes again instead: refusing it here for the key would report
                // a reused message id as a reused key.
                Some(if message {
                    Ok(in_flight)
                } else {
                    match shared.held(shard, ck) {
                        Err(e) => Err(e),
                        Ok(Some((stored, held))) if stored == fingerprint => match held {
                            Held::Cached(_) | Held::Logged(_) => {
                                shared.replay(shard, ck, stored, held)
                            }
                            // Done with this command but not flushed yet (a takeover while the
                            // first attempt's batch is in flight): come again.
                            _ => Ok(in_flight),
                        },
                        Ok(Some(_)) => Ok(Submission::Reused),
                        Ok(None) if claimed == fingerprint => Ok(in_flight),
                        Ok(None) => Ok(Submission::Reused),
                    }
                })
            }
            // The lease ran out: take the claim over. The committer decides whether the
            // key is done by now, so this arrival cannot cause a second effect.
            Some(_) => None,
            // No claim: the key is new or durably done (claims are released only after
            // the flush), so a cached answer may be given from here. A key not in the
            // cache goes to the committer, which reads it between its writes: read here,
            // sled's reads wait on the global lock every batch write holds, and most keys
            // that miss the cache are new.
            None if !message => match shard.answers.get(ck).cloned() {
                None => None,
                Some((stored, _)) if core::classify(Some(stored), fingerprint) == Seen::Reused => {
                    Some(Ok(Submission::Reused))
                }
                Some((_, outcome)) => Some(Ok(Submission::Replayed(outcome))),
            },
            None => None,
        }
    }

    /// Queues a claimed command for the committer; a stopped committer answers `Closed`.
    /// With `caller.lead`, a caller that may block commits it itself when the committer is
    /// idle; with `caller.gather`, an async caller's command waits with the others of its
    /// burst, and the first of them is told to hand them over ([`SledStore::hand_over`]).
    fn send_command(&self, queued: Queued, caller: Caller) -> Attempt {
        if caller.gather {
            return if self.lead.gather(queued) {
                Attempt::HandOver
            } else {
                Attempt::Done
            };
        }
        let queued = if caller.lead {
            match self.lead.try_lead(queued) {
                None => return Attempt::Done,
                Some(queued) => queued,
            }
        } else {
            queued
        };
        if let Some(Request::Command(queued)) = self.send(Request::Command(queued)) {
            self.closed(queued);
        }
        Attempt::Done
    }

    /// Answers a command the stopped committer will never take.
    fn closed(&self, queued: Queued) {
        self.shared.release(&queued.ck, queued.token);
        (queued.reply)(Err(LedgerError::Closed));
    }

    /// Hands the commands gathered from async callers to the decider as one request, once
    /// the runtime thread of the first of them has run the other tasks that were ready:
    /// a yield lets it, and tokio resumes a yielded task only when its thread has no other
    /// task to run and has polled for I/O once more. So the requests of a burst read in
    /// one wake are gathered without waiting for any time. Handed over also when this
    /// future is dropped meanwhile (its caller went away), so no command is left behind.
    pub(super) async fn hand_over(&self) {
        struct OnDrop<'a>(&'a SledStore);
        impl Drop for OnDrop<'_> {
            fn drop(&mut self) {
                let store = self.0;
                let commands = store.lead.gathered();
                if commands.is_empty() {
                    return;
                }
                if let Some(Request::Commands(unsent)) = store.send(Request::Commands(commands)) {
                    unsent.into_iter().for_each(|queued| store.closed(queued));
                }
            }
        }
        let _hand_over = OnDrop(self);
        tokio::task::yield_now().await;
    }
}

/// Counts an answer given without the committer in the observed counters and the key's
/// activity.
fn count_answer(
    shared: &Shared,
    shard: &mut Shard,
    ck: &(ClientId, Key),
    answer: &Result<Submission>,
) {
    let counter = match answer {
        Ok(Submission::Replayed(_)) => &shared.replayed,
        Ok(Submission::Reused) => &shared.conflicts_reused,
        Ok(Submission::InProgress { .. }) => &shared.conflicts_in_flight,
        _ => return,
    };
    shard.note(ck, matches!(answer, Ok(Submission::Replayed(_))));
    counter.fetch_add(1, Ordering::Relaxed);
}
