//! `submit`: the client side done right. One intent, one key, repeated in every retry;
//! transport failures, 5xx and 409 are retried with exponential back-off and full jitter;
//! the answer is classified into the exit codes of docs/cli.md.

use std::time::Duration;

use ledger::{Command, Key};
use rand::Rng as _;
use serde_json::Value;

use crate::wire;

/// How a submission ended, with its exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// 201: applied now or replayed.
    Applied { replayed: bool },
    /// 422 with a business rejection code (stored under the key).
    Rejected,
    /// 409 on every attempt.
    StillInFlight,
    /// 422 `idempotency_key_reused`.
    KeyReused,
    /// 400 or 413: the request itself is wrong; retrying cannot help.
    Invalid,
    /// Anything else: transport failures or 5xx after the retries, 401, surprises.
    Failed,
}

impl Verdict {
    pub fn exit_code(self) -> u8 {
        match self {
            Verdict::Applied { .. } => 0,
            Verdict::Failed => 1,
            Verdict::Invalid => 2,
            Verdict::Rejected => 3,
            Verdict::StillInFlight => 4,
            Verdict::KeyReused => 5,
        }
    }
}

#[derive(Debug, Clone)]
pub struct SubmitOptions {
    pub server: String,
    pub token: Option<String>,
    /// Retries after the first attempt.
    pub retries: u32,
    pub timeout: Duration,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
}

impl Default for SubmitOptions {
    fn default() -> Self {
        Self {
            server: "http://127.0.0.1:7420".into(),
            token: None,
            retries: 5,
            timeout: Duration::from_secs(10),
            backoff_base: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
        }
    }
}

/// The last HTTP answer received.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub replayed: bool,
    pub body: String,
    pub retry_after: Option<Duration>,
}

impl Answer {
    pub fn json(&self) -> Option<Value> {
        serde_json::from_str(&self.body).ok()
    }
    fn code(&self) -> Option<String> {
        self.json()?.get("code")?.as_str().map(str::to_owned)
    }
}

#[derive(Debug)]
pub struct Submitted {
    pub verdict: Verdict,
    pub answer: Option<Answer>,
    pub attempts: u32,
    /// Why the last attempt failed without an answer.
    pub transport_error: Option<String>,
}

enum Step {
    Done(Verdict),
    Retry,
}

fn classify(a: &Answer) -> Step {
    match a.status {
        201 => Step::Done(Verdict::Applied {
            replayed: a.replayed,
        }),
        422 if a.code().as_deref() == Some("idempotency_key_reused") => {
            Step::Done(Verdict::KeyReused)
        }
        422 => Step::Done(Verdict::Rejected),
        409 | 500..=599 => Step::Retry,
        400 | 413 => Step::Done(Verdict::Invalid),
        _ => Step::Done(Verdict::Failed),
    }
}

/// The delay before retry `attempt` (1-based): exponential, capped, with full jitter so
/// that many clients failing together do not come back together.
pub fn backoff(options: &SubmitOptions, attempt: u32, retry_after: Option<Duration>) -> Duration {
    let exp = options
        .backoff_base
        .saturating_mul(1u32 << attempt.saturating_sub(1).min(16))
        .min(options.backoff_max);
    let jittered = rand::rng().random_range(exp / 2..=exp);
    // The server's Retry-After is a floor, within the same cap.
    retry_after.map_or(jittered, |r| jittered.max(r.min(options.backoff_max)))
}

/// Sends one command, retrying as a careful client does. `log` hears about each retry.
pub fn submit(
    options: &SubmitOptions,
    key: &Key,
    command: &Command,
    log: &mut dyn FnMut(&str),
) -> Submitted {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(options.timeout))
        .build()
        .into();
    let url = format!(
        "{}{}",
        options.server.trim_end_matches('/'),
        wire::kind_of(command).path()
    );
    let body = wire::body_of(command).to_string();
    let mut last: Option<Answer>;
    let mut transport_error: Option<String>;
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let mut request = agent
            .post(&url)
            .header("Idempotency-Key", key.as_str())
            .header("Content-Type", "application/json");
        if let Some(t) = &options.token {
            request = request.header("Authorization", format!("Bearer {t}"));
        }
        let why = match request.send(body.as_str()) {
            Ok(mut response) => {
                let header = |name: &str| {
                    response
                        .headers()
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned)
                };
                let replayed = header("idempotent-replayed").as_deref() == Some("true");
                let retry_after = header("retry-after")
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map(Duration::from_secs);
                let status = response.status().as_u16();
                let text = response.body_mut().read_to_string().unwrap_or_default();
                let answer = Answer {
                    status,
                    replayed,
                    body: text,
                    retry_after,
                };
                transport_error = None;
                let step = classify(&answer);
                let why = format!(
                    "HTTP {status}{}",
                    answer.code().map(|c| format!(" {c}")).unwrap_or_default()
                );
                last = Some(answer);
                match step {
                    Step::Done(verdict) => {
                        return Submitted {
                            verdict,
                            answer: last,
                            attempts: attempt,
                            transport_error,
                        };
                    }
                    Step::Retry => why,
                }
            }
            Err(e) => {
                // The request may or may not have reached the server: only a retry with
                // the same key can tell, and it is safe.
                let why = format!("no answer ({e})");
                transport_error = Some(e.to_string());
                last = None;
                why
            }
        };
        if attempt > options.retries {
            let verdict = match &last {
                Some(a) if a.status == 409 => Verdict::StillInFlight,
                _ => Verdict::Failed,
            };
            return Submitted {
                verdict,
                answer: last,
                attempts: attempt,
                transport_error,
            };
        }
        let delay = backoff(options, attempt, last.as_ref().and_then(|a| a.retry_after));
        log(&format!(
            "attempt {attempt}: {why}; retrying in {} ms with the same key",
            delay.as_millis()
        ));
        std::thread::sleep(delay);
    }
}

fn describe_command(v: &Value) -> String {
    let s = |k: &str| {
        v.get(k)
            .map(|x| x.to_string().trim_matches('"').to_owned())
            .unwrap_or_default()
    };
    match s("command").as_str() {
        "deposit" => format!(
            "deposit {} {} to {}",
            s("amount"),
            s("currency"),
            s("account")
        ),
        "withdraw" => format!(
            "withdraw {} {} from {}",
            s("amount"),
            s("currency"),
            s("account")
        ),
        "refund" => format!("refund {} of withdrawal {}", s("amount"), s("withdrawal")),
        other => other.to_owned(),
    }
}

/// A receipt a person can read, for every way a submission can end.
pub fn render(submitted: &Submitted) -> String {
    let Some(answer) = &submitted.answer else {
        return format!(
            "failed: no answer after {} attempts ({})",
            submitted.attempts,
            submitted
                .transport_error
                .as_deref()
                .unwrap_or("unknown error")
        );
    };
    let v = answer.json().unwrap_or(Value::Null);
    let s = |k: &str| {
        v.get(k)
            .map(|x| x.to_string().trim_matches('"').to_owned())
            .unwrap_or_default()
    };
    match submitted.verdict {
        Verdict::Applied { replayed } => {
            let mut out = format!(
                "{}: {}\n  key      {}\n  seq      {}\n  balance  {} {} {}\n",
                if replayed { "replayed" } else { "applied" },
                describe_command(&v),
                s("key"),
                s("seq"),
                s("account"),
                s("balance"),
                s("currency"),
            );
            if v.get("refunded_total").is_some() {
                out.push_str(&format!("  refunded {} in total\n", s("refunded_total")));
            }
            out.push_str(&format!("  at       {}", s("created_at")));
            if replayed {
                out.push_str(" (first execution; this answer is its replay, nothing moved again)");
            }
            out
        }
        Verdict::Rejected => format!(
            "rejected{}: {} - {}\n  {}\n  key      {}\n  seq      {}\n  at       {}\n  \
             (the rejection is final for this key; a retry gets the same answer)",
            if answer.replayed { " (replayed)" } else { "" },
            s("code"),
            s("title"),
            describe_command(&v),
            s("key"),
            s("seq"),
            s("created_at"),
        ),
        Verdict::KeyReused => format!(
            "refused: idempotency_key_reused - this key was used for another command \
             (differs: {}); nothing changed. Use a new key for a new command.",
            v.get("differs")
                .and_then(Value::as_array)
                .map(|a| a
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(", "))
                .unwrap_or_default()
        ),
        Verdict::StillInFlight => format!(
            "still in flight after {} attempts: another request with this key has not \
             finished. Retry later with the same key; it will never apply twice.",
            submitted.attempts
        ),
        Verdict::Invalid | Verdict::Failed => format!(
            "{}: HTTP {} {}{}",
            if submitted.verdict == Verdict::Invalid {
                "invalid"
            } else {
                "failed"
            },
            answer.status,
            s("code"),
            v.get("detail")
                .and_then(Value::as_str)
                .map(|d| format!(" - {d}"))
                .unwrap_or_default()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, body: &str) -> Answer {
        Answer {
            status,
            replayed: false,
            body: body.into(),
            retry_after: None,
        }
    }

    #[test]
    fn exit_codes_follow_the_contract() {
        let check = |status, body, code: u8| match classify(&answer(status, body)) {
            Step::Done(v) => assert_eq!(v.exit_code(), code, "{status} {body}"),
            Step::Retry => assert_eq!(code, 255, "{status} {body}"),
        };
        check(201, "{}", 0);
        check(422, r#"{"code":"insufficient_funds"}"#, 3);
        check(422, r#"{"code":"idempotency_key_reused"}"#, 5);
        check(400, r#"{"code":"invalid_request"}"#, 2);
        check(413, r#"{"code":"payload_too_large"}"#, 2);
        check(401, r#"{"code":"unauthorized"}"#, 1);
        check(409, "{}", 255);
        check(503, "{}", 255);
        assert_eq!(Verdict::StillInFlight.exit_code(), 4);
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let o = SubmitOptions::default();
        for attempt in 1..30 {
            let d = backoff(&o, attempt, None);
            assert!(d <= o.backoff_max);
            let exp = o
                .backoff_base
                .saturating_mul(1 << (attempt - 1).min(16))
                .min(o.backoff_max);
            assert!(d >= exp / 2);
        }
        assert!(backoff(&o, 1, Some(Duration::from_secs(1))) >= Duration::from_secs(1));
    }
}
