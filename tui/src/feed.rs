//! The network thread: polls the worker's operator feed and sends what it learns as
//! [`Event::Data`]. The UI never waits on it; when the worker is away it says so once
//! per attempt and retries with a capped back-off.

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use ureq::Agent;

use crate::app::{Data, Event, KeyQuery, View, Wants};
use crate::model::{AccountsPage, FactsPage, KeyRecord, KeysPage, QuarantinePage, Snapshot};

/// The conflicts view shows at most this many of the newest quarantined messages.
const QUARANTINE_ROWS: usize = 20;

/// 4 Hz: the contract's minimum refresh rate.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);
/// Facts fetched per poll. If the log grows faster than this, the tail jumps ahead
/// rather than downloading history: the log view shows the tail, not everything.
pub const FACTS_PAGE_LIMIT: u64 = 200;
/// Accounts per page of `GET /v1/accounts` (the worker's most), and the most pages the
/// Balances view reads each poll: ten thousand accounts.
const ACCOUNTS_PAGE_LIMIT: usize = 1000;
const ACCOUNT_PAGES_MAX: usize = 10;
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// A loopback worker answers in milliseconds; waiting longer only delays "offline".
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Clone)]
pub struct FeedConfig {
    /// Base URL, e.g. `http://127.0.0.1:7420`.
    pub server: String,
    /// The admin bearer secret, when the worker has tokens.
    pub token: Option<String>,
}

/// Starts the thread. It ends when `wants` is closed or `events` has no receiver.
pub fn spawn(
    config: FeedConfig,
    events: Sender<Event>,
    wants: Receiver<Wants>,
    initial: Wants,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("feed".into())
        .spawn(move || run(config, events, wants, initial))
}

enum FetchError {
    /// No answer: connection refused, timeout, reset.
    Transport(String),
    /// An answer we cannot use: an HTTP error status or bad JSON.
    Endpoint(String),
}

struct Poller {
    agent: Agent,
    server: String,
    authorization: Option<String>,
    /// The last fact received; `None` before the first tail.
    facts_after: Option<u64>,
}

fn run(config: FeedConfig, events: Sender<Event>, wants: Receiver<Wants>, mut current: Wants) {
    let agent: Agent = Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(REQUEST_TIMEOUT))
        .build()
        .into();
    let mut poller = Poller {
        agent,
        server: config.server.trim_end_matches('/').to_string(),
        authorization: config.token.map(|token| format!("Bearer {token}")),
        facts_after: None,
    };
    let mut attempt: u32 = 0;
    loop {
        let started = Instant::now();
        let wait = match poller.poll(&current, &events) {
            Ok(()) => {
                attempt = 0;
                POLL_INTERVAL.saturating_sub(started.elapsed())
            }
            Err(error) => {
                attempt = attempt.saturating_add(1);
                // Start over with the tail on reconnect: the worker may have a new log.
                poller.facts_after = None;
                let data = Data::Disconnected { error, attempt };
                if events.send(Event::Data(data)).is_err() {
                    return;
                }
                backoff(attempt)
            }
        };
        match wants.recv_timeout(wait) {
            Ok(mut latest) => {
                // Only the newest wish matters; skip the ones typed in between.
                while let Ok(newer) = wants.try_recv() {
                    latest = newer;
                }
                current = latest;
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

fn backoff(attempt: u32) -> Duration {
    let factor = 1u32 << attempt.min(4);
    POLL_INTERVAL.saturating_mul(factor).min(BACKOFF_MAX)
}

impl Poller {
    /// One round. `Err` only when the worker does not answer at all; an endpoint that
    /// answers badly is reported as [`Data::Unavailable`] and the round goes on.
    fn poll(&mut self, wants: &Wants, events: &Sender<Event>) -> Result<(), String> {
        let mut send = |data: Data| events.send(Event::Data(data)).is_ok();
        let snapshot: Option<Snapshot> =
            self.endpoint("snapshot", self.get("/v1/live/snapshot", &[]), &mut send)?;
        let last_seq = snapshot.as_ref().map(|s| s.last_seq);
        if let Some(snapshot) = snapshot {
            send(Data::Snapshot(Box::new(snapshot)));
        }
        if let Some(last_seq) = last_seq {
            self.poll_facts(last_seq, &mut send)?;
        }
        if wants.view == View::Keys {
            let params = key_params(&wants.keys);
            let page: Option<KeysPage> =
                self.endpoint("keys", self.get("/v1/live/keys", &params), &mut send)?;
            if let Some(page) = page {
                send(Data::Keys {
                    query: wants.keys.clone(),
                    page,
                });
            }
            if let Some((client, key)) = &wants.detail {
                let path = format!(
                    "/v1/live/keys/{}/{}",
                    percent_encode(client),
                    percent_encode(key)
                );
                let record: Option<KeyRecord> =
                    self.endpoint("key detail", self.get(&path, &[]), &mut send)?;
                if let Some(record) = record {
                    send(Data::KeyDetail(Box::new(record)));
                }
            }
        }
        if wants.view == View::Conflicts {
            let params = [
                ("order", "newest".to_string()),
                ("limit", QUARANTINE_ROWS.to_string()),
            ];
            let page: Option<QuarantinePage> = self.endpoint(
                "quarantine",
                self.get("/v1/live/quarantine", &params),
                &mut send,
            )?;
            if let Some(page) = page {
                send(Data::Quarantine(page));
            }
        }
        if wants.view == View::Balances
            && let Some(page) = self.all_accounts(&mut send)?
        {
            send(Data::Accounts(page));
        }
        Ok(())
    }

    /// Every page of `GET /v1/accounts`, joined, up to [`ACCOUNT_PAGES_MAX`] pages: a
    /// worker pages its accounts, and a view that read only the first page would drop
    /// the rest without saying so. Past the bound, `next` stays set and the view says
    /// that more accounts exist than were read.
    fn all_accounts(
        &mut self,
        send: &mut impl FnMut(Data) -> bool,
    ) -> Result<Option<AccountsPage>, String> {
        let mut joined: Option<AccountsPage> = None;
        for _ in 0..ACCOUNT_PAGES_MAX {
            let mut params = vec![("limit", ACCOUNTS_PAGE_LIMIT.to_string())];
            if let Some(after) = joined.as_ref().and_then(|j| j.next.as_ref()) {
                params.push(("after", after.as_str().to_owned()));
            }
            let page: Option<AccountsPage> =
                self.endpoint("accounts", self.get("/v1/accounts", &params), send)?;
            let Some(page) = page else {
                return Ok(None);
            };
            let done = page.next.is_none();
            match joined.as_mut() {
                None => joined = Some(page),
                Some(j) => {
                    j.accounts.extend(page.accounts);
                    j.next = page.next;
                }
            }
            if done {
                break;
            }
        }
        Ok(joined)
    }

    fn poll_facts(
        &mut self,
        last_seq: u64,
        send: &mut impl FnMut(Data) -> bool,
    ) -> Result<(), String> {
        let tail_start = last_seq.saturating_sub(FACTS_PAGE_LIMIT);
        let (after, reset) = match self.facts_after {
            // Behind by more than a page, or the worker's log is shorter than what we
            // saw (a new database): start over at the tail.
            Some(after) if after <= last_seq && last_seq - after <= FACTS_PAGE_LIMIT * 5 => {
                (after, false)
            }
            _ => (tail_start, true),
        };
        if !reset && after == last_seq {
            return Ok(());
        }
        let params = [
            ("after", after.to_string()),
            ("limit", FACTS_PAGE_LIMIT.to_string()),
        ];
        let page: Option<FactsPage> =
            self.endpoint("facts", self.get("/v1/facts", &params), send)?;
        if let Some(page) = page {
            let newest = page.facts.iter().map(|f| f.seq).max().unwrap_or(after);
            self.facts_after = Some(newest.max(after));
            send(Data::Facts {
                facts: page.facts,
                reset,
            });
        }
        Ok(())
    }

    /// Splits a fetch result: transport errors end the round, endpoint errors are
    /// reported and skipped.
    fn endpoint<T>(
        &self,
        name: &'static str,
        result: Result<T, FetchError>,
        send: &mut impl FnMut(Data) -> bool,
    ) -> Result<Option<T>, String> {
        match result {
            Ok(value) => Ok(Some(value)),
            Err(FetchError::Transport(error)) => Err(error),
            Err(FetchError::Endpoint(error)) => {
                send(Data::Unavailable {
                    endpoint: name,
                    error,
                });
                Ok(None)
            }
        }
    }

    fn get<T: DeserializeOwned>(
        &self,
        path: &str,
        params: &[(&str, String)],
    ) -> Result<T, FetchError> {
        let mut request = self.agent.get(format!("{}{path}", self.server));
        for (name, value) in params {
            request = request.query(*name, value);
        }
        if let Some(authorization) = &self.authorization {
            request = request.header("Authorization", authorization);
        }
        let mut response = request
            .call()
            .map_err(|error| FetchError::Transport(error.to_string()))?;
        let status = response.status();
        if status.as_u16() == 401 {
            return Err(FetchError::Endpoint(
                "unauthorized: pass the admin secret with --token".into(),
            ));
        }
        if !status.is_success() {
            return Err(FetchError::Endpoint(format!("HTTP {}", status.as_u16())));
        }
        response
            .body_mut()
            .read_json()
            .map_err(|error| FetchError::Endpoint(format!("unreadable answer: {error}")))
    }
}

fn key_params(query: &KeyQuery) -> Vec<(&'static str, String)> {
    let mut params = vec![
        ("order", query.sort.order().to_string()),
        ("limit", query.limit.to_string()),
    ];
    if let Some(status) = query.status {
        params.push(("status", status.name().to_string()));
    }
    if let Some(client) = &query.client {
        params.push(("client", client.clone()));
    }
    if let Some(text) = &query.text {
        params.push(("q", text.clone()));
    }
    if let Some(after) = &query.after {
        params.push(("after", after.clone()));
    }
    params
}

/// Encodes one path segment: keys are visible ASCII and may contain `/`, `?`, `#`, `%`.
pub fn percent_encode(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_are_encoded() {
        assert_eq!(percent_encode("ord-1"), "ord-1");
        assert_eq!(percent_encode("a/b?c#d%e f"), "a%2Fb%3Fc%23d%25e%20f");
    }

    /// The worker pages keys in the order the table shows them.
    #[test]
    fn key_queries_carry_the_order() {
        let mut query = KeyQuery::parse("s:done shop");
        assert_eq!(
            key_params(&query),
            [
                ("order", "newest".to_string()),
                ("limit", "200".to_string()),
                ("status", "done".to_string()),
                ("q", "shop".to_string()),
            ]
        );
        query.sort = crate::app::KeySort::Key;
        assert_eq!(key_params(&query)[0], ("order", "key".to_string()));
    }

    #[test]
    fn backoff_is_capped() {
        assert_eq!(backoff(1), Duration::from_millis(500));
        assert_eq!(backoff(30), BACKOFF_MAX);
    }
}
