//! `consume`: JSON-lines messages through a store's inbox, as a broker consumer would
//! feed them, each decided by [`super::handle`]. This transport reads lines and records:
//! undecodable lines, a `message_id` seen with another payload, and a key reused for
//! another command are quarantined in the store with the reason, and the run goes on.

use std::io::BufRead;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use ledger::{LedgerError, Outcome, Store};

use super::{DeadReason, Disposition, Retry};
use crate::text::count;

/// The longest line read whole; longer ones are quarantined by their first bytes.
pub const LINE_MAX_BYTES: usize = 1024 * 1024;

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Non-blank lines read.
    pub messages: u64,
    /// Commands executed by this run: applied, and rejected (a rejection is an outcome).
    pub applied: u64,
    pub rejected: u64,
    /// Redeliveries and repeats absorbed: answered with the stored outcome, no effect.
    pub duplicates: u64,
    /// Lines kept in the quarantine, with their reasons.
    pub quarantined: Vec<QuarantineNote>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuarantineNote {
    pub line: u64,
    pub message_id: Option<String>,
    pub reason: String,
    /// The quarantine record's id in the ledger, when this run wrote it. A reused
    /// `message_id` is quarantined by the ledger itself, in the commit that refused it.
    pub id: Option<u64>,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{}: {} applied, {} rejected (outcome stored), {}, {} quarantined",
            count(self.messages, "message", "messages"),
            self.applied,
            self.rejected,
            count(self.duplicates, "duplicate absorbed", "duplicates absorbed"),
            self.quarantined.len()
        )?;
        for q in &self.quarantined {
            writeln!(
                f,
                "  quarantined{}: line {}, message {}: {}",
                q.id.map(|id| format!(" #{id}")).unwrap_or_default(),
                q.line,
                q.message_id.as_deref().unwrap_or("(unreadable)"),
                q.reason
            )?;
        }
        Ok(())
    }
}

/// A failure that stopped the run; every line before `line` was handled durably, and a
/// rerun of the whole input is safe (it is deduplicated).
#[derive(Debug)]
pub struct Stopped {
    pub line: u64,
    pub summary: Summary,
    pub error: String,
}

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "stopped at line {}: {}. Lines before it are recorded; rerunning the whole \
             input is safe, duplicates are absorbed",
            self.line, self.error
        )
    }
}

impl std::error::Error for Stopped {}

/// Feeds every line of `input` through the inbox of `store`, under `rules` (the tenant
/// of messages that name none, and whether others are refused). Reads `input` blocking:
/// run it on a runtime of its own.
pub async fn consume(
    store: &dyn Store,
    input: &mut dyn BufRead,
    rules: &super::InboxRules,
    progress: &ProgressBar,
) -> Result<Summary, Stopped> {
    let mut summary = Summary::default();
    let mut line_no = 0u64;
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let read = match read_line(input, &mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => {
                return Err(Stopped {
                    line: line_no + 1,
                    summary,
                    error: format!("reading the input: {e}"),
                });
            }
        };
        line_no += 1;
        progress.inc(u64::try_from(read).unwrap_or(0));
        let line = buf.trim_ascii();
        if line.is_empty() {
            continue;
        }
        summary.messages += 1;
        if let Err(error) = one_line(store, line, line_no, rules, &mut summary).await {
            return Err(Stopped {
                line: line_no,
                summary,
                error: error.to_string(),
            });
        }
    }
    Ok(summary)
}

/// Reads one line, keeping at most [`LINE_MAX_BYTES`] of it; returns the bytes consumed.
fn read_line(input: &mut dyn BufRead, buf: &mut Vec<u8>) -> std::io::Result<usize> {
    let mut consumed = 0;
    loop {
        let available = input.fill_buf()?;
        if available.is_empty() {
            return Ok(consumed);
        }
        let (chunk, done) = match available.iter().position(|b| *b == b'\n') {
            Some(i) => (&available[..=i], true),
            None => (available, false),
        };
        let room = LINE_MAX_BYTES.saturating_sub(buf.len());
        buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
        let n = chunk.len();
        input.consume(n);
        consumed += n;
        if done {
            return Ok(consumed);
        }
    }
}

/// Decides one line, waiting while its key is in flight elsewhere (another worker, or an
/// HTTP request): that claim ends within its lease, so the line is not skipped. An error
/// stops the run.
async fn one_line(
    store: &dyn Store,
    line: &[u8],
    line_no: u64,
    rules: &super::InboxRules,
    summary: &mut Summary,
) -> Result<(), LedgerError> {
    let deadline = Instant::now() + store.rules().lease + Duration::from_secs(1);
    loop {
        match super::handle(store, line, rules).await {
            Disposition::Executed(Outcome::Applied(_)) => summary.applied += 1,
            Disposition::Executed(Outcome::Rejected(_)) => summary.rejected += 1,
            Disposition::Replayed(_) => summary.duplicates += 1,
            Disposition::Quarantined { message_id, reason } => {
                // Already kept by the store, in the same commit as the refusal.
                summary.quarantined.push(QuarantineNote {
                    line: line_no,
                    message_id: Some(message_id),
                    reason,
                    id: None,
                });
            }
            Disposition::DeadLetter {
                why,
                reason,
                message_id,
            } => {
                let reason = if why == DeadReason::Undecodable && line.len() >= LINE_MAX_BYTES {
                    "undecodable: the line is longer than 1 MiB".to_owned()
                } else {
                    reason
                };
                let id = store
                    .quarantine(message_id.clone(), reason.clone(), line.to_vec())
                    .await?;
                summary.quarantined.push(QuarantineNote {
                    line: line_no,
                    message_id,
                    reason,
                    id: Some(id),
                });
            }
            Disposition::RetryLater(Retry::Store(error)) => return Err(error),
            Disposition::RetryLater(Retry::InProgress { retry_after }) => {
                if Instant::now() >= deadline {
                    return Err(LedgerError::Unavailable(
                        "the key stayed in flight past its lease".into(),
                    ));
                }
                tokio::time::sleep(retry_after.min(Duration::from_millis(50))).await;
                continue;
            }
        }
        return Ok(());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_are_cut_not_buffered_whole() {
        let mut long = vec![b'x'; LINE_MAX_BYTES + 10];
        long.push(b'\n');
        long.extend_from_slice(b"next\n");
        let mut input = std::io::Cursor::new(long);
        let mut buf = Vec::new();
        let n = read_line(&mut input, &mut buf).unwrap();
        assert_eq!(n, LINE_MAX_BYTES + 11);
        assert_eq!(buf.len(), LINE_MAX_BYTES);
        buf.clear();
        read_line(&mut input, &mut buf).unwrap();
        assert_eq!(buf, b"next\n");
    }
}
