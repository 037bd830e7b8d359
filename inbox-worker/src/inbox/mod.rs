//! The inbox: messages that carry commands (`{"message_id", "key", "client"?, "command"}`,
//! see [`wire::parse_message`]), whatever brought them. [`handle`] is the one decision for
//! a message; the transports only move bytes and act on its [`Disposition`]:
//!
//! - [`jsonl`]: `consume`, a JSON-lines file fed through a store, line by line;
//! - [`amqp`]: a RabbitMQ queue, acked, requeued or dead-lettered per disposition.
//!
//! Each message is deduplicated by its `message_id` in the same commit as its effect, and
//! by its key like any command, so a message and an HTTP retry of one key make one effect.
//! Nothing is dropped silently: a message that will never apply is quarantined (file) or
//! dead-lettered (broker) with its reason.

pub mod amqp;
pub mod jsonl;

use std::time::Duration;

use ledger::{Command, LedgerError, Outcome, Store, Submission};

pub use crate::access::InboxRules;
use crate::access::accepts_currency;

use crate::wire;

/// The reason of a message whose key holds another command.
pub const KEY_REUSED_REASON: &str =
    "idempotency_key_reused: the key already holds another command; nothing changed";

/// Why a message will never apply, as counted and as its reason starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DeadReason {
    /// Not a valid inbox message.
    Undecodable,
    /// The id was seen with another payload.
    MessageIdReused,
    /// The key holds another command.
    KeyReused,
    /// Delivered too often without an outcome (the broker's transport decides this one).
    DeliveryLimit,
    /// This inbox may not act for the tenant it names, or does not take its currency.
    NotAccepted,
}

impl DeadReason {
    pub const ALL: [DeadReason; 5] = [
        DeadReason::Undecodable,
        DeadReason::MessageIdReused,
        DeadReason::KeyReused,
        DeadReason::DeliveryLimit,
        DeadReason::NotAccepted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DeadReason::Undecodable => "undecodable",
            DeadReason::MessageIdReused => "message_id_reused",
            DeadReason::KeyReused => "idempotency_key_reused",
            DeadReason::DeliveryLimit => "delivery_limit",
            DeadReason::NotAccepted => "not_accepted",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// What became of a message, and so what its transport does with it.
#[derive(Debug)]
pub enum Disposition {
    /// Executed by this delivery, applied or rejected (a rejection is an outcome), and
    /// durable: acknowledge it.
    Executed(Outcome),
    /// Answered with the stored outcome (a redelivery, a repeat): no effect; acknowledge.
    Replayed(Outcome),
    /// The message id was seen before with another payload. The store refused it and kept
    /// it in its quarantine, in the commit that refused it: nothing more to record here.
    Quarantined { message_id: String, reason: String },
    /// It will never apply, and nothing recorded it yet: the transport keeps it with the
    /// reason in the store's quarantine (the broker also in its dead letters).
    DeadLetter {
        why: DeadReason,
        reason: String,
        message_id: Option<String>,
    },
    /// Not decided: try again later.
    RetryLater(Retry),
}

/// Why a message was not decided now.
#[derive(Debug)]
pub enum Retry {
    /// Its key is in flight in another attempt (past the store's own bounded wait).
    InProgress { retry_after: Duration },
    /// The store failed; nothing was recorded.
    Store(LedgerError),
}

impl Disposition {
    /// Whether the store decided the message: an outcome, or a refusal it made. Not a
    /// store failure, not "in progress", not a message it never saw (undecodable).
    pub fn decided_by_store(&self) -> bool {
        matches!(
            self,
            Disposition::Executed(_)
                | Disposition::Replayed(_)
                | Disposition::Quarantined { .. }
                | Disposition::DeadLetter {
                    why: DeadReason::KeyReused,
                    ..
                }
        )
    }
}

/// The one decision for a message: decodes `body`, checks it against `rules` (the tenant
/// it acts for, its currency), submits its command through the inbox (deduplicated by
/// message id and key, its accounts in its tenant's space) and says what became of it.
/// Reasons never quote the message.
pub async fn handle(store: &dyn Store, body: &[u8], rules: &InboxRules) -> Disposition {
    let message = match wire::parse_message(body) {
        Ok(m) => m,
        Err((message_id, invalid)) => {
            return Disposition::DeadLetter {
                why: DeadReason::Undecodable,
                reason: format!("undecodable: {invalid}"),
                message_id,
            };
        }
    };
    let message_id = message.message_id.as_str().to_owned();
    let not_accepted = |why: &str| Disposition::DeadLetter {
        why: DeadReason::NotAccepted,
        reason: format!(
            "{}: {why}; nothing changed",
            DeadReason::NotAccepted.as_str()
        ),
        message_id: Some(message_id.clone()),
    };
    let Some(client) = rules.tenant_of(message.client.as_ref()) else {
        return not_accepted("this queue serves another tenant");
    };
    if let Command::Deposit { currency, .. } | Command::Withdraw { currency, .. } = &message.command
        && let Err(why) = accepts_currency(&rules.currencies, *currency)
    {
        return not_accepted(&why);
    }
    // The store waits a bounded time for a twin in flight before it answers "in progress".
    let submitted = store
        .submit(
            &client,
            &message.key,
            message.command.for_tenant(&client),
            Some(message.message_id.clone()),
        )
        .await;
    match submitted {
        Ok(Submission::Executed(outcome)) => Disposition::Executed(outcome),
        Ok(Submission::Replayed(outcome)) => Disposition::Replayed(outcome),
        Ok(Submission::Quarantined { reason }) => Disposition::Quarantined {
            message_id,
            reason: if reason.starts_with(DeadReason::MessageIdReused.as_str()) {
                reason
            } else {
                format!("{}: {reason}", DeadReason::MessageIdReused.as_str())
            },
        },
        Ok(Submission::Reused) => Disposition::DeadLetter {
            why: DeadReason::KeyReused,
            reason: KEY_REUSED_REASON.to_owned(),
            message_id: Some(message_id),
        },
        Ok(Submission::InProgress { retry_after }) => {
            Disposition::RetryLater(Retry::InProgress { retry_after })
        }
        Err(error) => Disposition::RetryLater(Retry::Store(error)),
    }
}

/// The message id of `body`, when one can be read, even from a message that is not valid.
pub fn message_id_of(body: &[u8]) -> Option<String> {
    match wire::parse_message(body) {
        Ok(m) => Some(m.message_id.as_str().to_owned()),
        Err((id, _)) => id,
    }
}
