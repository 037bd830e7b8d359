//! The command line's side of the HTTP API. `submit`: one intent, one key, repeated in
//! every retry; transport failures, 5xx and 409 are retried with exponential back-off and
//! full jitter; the answer is classified into the exit codes of docs/cli.md. The reads
//! (`balance`, `statement`, `key`, `accounts`) are retried the same way, reading being
//! safe to repeat.

use std::time::Duration;

use ledger::{Command, Currency, Key};
use rand::Rng as _;
use serde_json::Value;

use crate::text::{count, describe_command, money, rejection_advice};
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

/// The worker's address as `--server` gives it, checked before anything is sent:
/// `http://HOST[:PORT]`, a trailing `/` allowed. Without this a typo (no scheme, a path)
/// would be tried and retried as if the worker were down, and end in "may or may not have
/// been applied" for a request that never left. The error says what is expected.
pub fn check_server(server: &str) -> Result<(), String> {
    const EXPECTED: &str = "expected the worker's address as http://HOST:PORT, such as \
        http://127.0.0.1:7420";
    let Some((scheme, rest)) = server.split_once("://") else {
        return Err(format!(
            "{server} has no scheme; {EXPECTED} (write http://{server} for a worker there)"
        ));
    };
    if scheme.eq_ignore_ascii_case("https") {
        return Err(format!(
            "{EXPECTED}: the worker and this command speak plain HTTP (put a TLS proxy in \
             front of the worker for other hosts, and point --server at its plain side)"
        ));
    }
    if !scheme.eq_ignore_ascii_case("http") {
        return Err(format!("the scheme is {scheme}, not http; {EXPECTED}"));
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    if !tail.is_empty() && tail != "/" {
        return Err(format!(
            "{server} has a path or query ({tail}); {EXPECTED}, with nothing after the \
             port: the command adds the API's paths (/v1/...) itself"
        ));
    }
    if authority.contains('@') {
        return Err(format!(
            "{EXPECTED}, without user or password: the client's secret goes in --token"
        ));
    }
    let (host, port) = match authority.rsplit_once(':') {
        // An IPv6 address's own colons are inside its brackets.
        Some((host, port)) if !port.contains(']') => (host, Some(port)),
        _ => (authority, None),
    };
    if host.is_empty() {
        return Err(format!("{server} names no host; {EXPECTED}"));
    }
    if let Some(port) = port
        && !port.parse::<u16>().is_ok_and(|p| p > 0)
    {
        return Err(format!(
            "the port must be a number from 1 to 65535; {EXPECTED}"
        ));
    }
    ureq::http::Uri::try_from(format!("http://{authority}/"))
        .map(|_| ())
        .map_err(|_| format!("{authority} is not a host name or address; {EXPECTED}"))
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

/// Why the last attempt got no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoAnswer {
    /// Nothing accepted the connection: no worker at that address (or not yet).
    NoWorker(String),
    /// Connected, but the answer never came (lost, or the worker stopped mid-request):
    /// the command may or may not have been applied.
    Lost(String),
}

impl NoAnswer {
    fn of(e: &ureq::Error) -> NoAnswer {
        use std::io::ErrorKind;
        let nobody = match e {
            ureq::Error::ConnectionFailed => Some("connection failed".to_owned()),
            ureq::Error::HostNotFound => Some("host not found".to_owned()),
            ureq::Error::Io(io)
                if matches!(
                    io.kind(),
                    ErrorKind::ConnectionRefused | ErrorKind::AddrNotAvailable
                ) =>
            {
                Some(io.kind().to_string())
            }
            ureq::Error::Timeout(ureq::Timeout::Resolve | ureq::Timeout::Connect) => {
                Some("no answer to connecting".to_owned())
            }
            _ => None,
        };
        match nobody {
            Some(why) => NoAnswer::NoWorker(why),
            None => NoAnswer::Lost(e.to_string()),
        }
    }
}

#[derive(Debug)]
pub struct Submitted {
    pub verdict: Verdict,
    pub answer: Option<Answer>,
    pub attempts: u32,
    /// Why the last attempt failed without an answer.
    pub no_answer: Option<NoAnswer>,
    /// The worker's address, for the advice when none answered.
    pub server: String,
}

enum Step<T> {
    Done(T),
    Retry,
}

fn classify(a: &Answer) -> Step<Verdict> {
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

/// How one exchange with retries ended: the step's value, or the retries ran out.
struct Exchange<T> {
    done: Option<T>,
    last: Option<Answer>,
    attempts: u32,
    no_answer: Option<NoAnswer>,
}

/// Sends `request` until `decide` is done with an answer or the retries run out. Every
/// attempt without an answer is retried: the request may or may not have reached the
/// server, and only a retry (with the same key, for a command) can tell, safely. `log`
/// hears of each retry, `retrying` saying what the retry is.
fn exchange<T>(
    options: &SubmitOptions,
    request: &mut dyn FnMut(&ureq::Agent) -> Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    decide: &dyn Fn(&Answer) -> Step<T>,
    retrying: &str,
    log: &mut dyn FnMut(&str),
) -> Exchange<T> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(options.timeout))
        .build()
        .into();
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let (last, no_answer, why) = match request(&agent) {
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
                if let Step::Done(done) = decide(&answer) {
                    return Exchange {
                        done: Some(done),
                        last: Some(answer),
                        attempts: attempt,
                        no_answer: None,
                    };
                }
                let why = format!(
                    "HTTP {status}{}",
                    answer.code().map(|c| format!(" {c}")).unwrap_or_default()
                );
                (Some(answer), None, why)
            }
            Err(e) => (None, Some(NoAnswer::of(&e)), format!("no answer ({e})")),
        };
        if attempt > options.retries {
            return Exchange {
                done: None,
                last,
                attempts: attempt,
                no_answer,
            };
        }
        let delay = backoff(options, attempt, last.as_ref().and_then(|a| a.retry_after));
        log(&format!(
            "attempt {attempt}: {why}; {retrying} in {} ms",
            delay.as_millis()
        ));
        std::thread::sleep(delay);
    }
}

fn bearer(options: &SubmitOptions) -> Option<String> {
    options.token.as_ref().map(|t| format!("Bearer {t}"))
}

fn url(options: &SubmitOptions, path: &str) -> String {
    format!("{}{path}", options.server.trim_end_matches('/'))
}

/// Sends one command, retrying as a careful client does. `log` hears about each retry.
pub fn submit(
    options: &SubmitOptions,
    key: &Key,
    command: &Command,
    log: &mut dyn FnMut(&str),
) -> Submitted {
    let url = url(options, wire::kind_of(command).path());
    let body = wire::body_of(command).to_string();
    let auth = bearer(options);
    let mut request = |agent: &ureq::Agent| {
        let mut request = agent
            .post(&url)
            .header("Idempotency-Key", key.as_str())
            .header("Content-Type", "application/json");
        if let Some(a) = &auth {
            request = request.header("Authorization", a);
        }
        request.send(body.as_str())
    };
    let x = exchange(
        options,
        &mut request,
        &classify,
        "retrying with the same key",
        log,
    );
    let verdict = x.done.unwrap_or(match &x.last {
        Some(a) if a.status == 409 => Verdict::StillInFlight,
        _ => Verdict::Failed,
    });
    Submitted {
        verdict,
        answer: x.last,
        attempts: x.attempts,
        no_answer: x.no_answer,
        server: options.server.clone(),
    }
}

/// `text` as a path segment or a query value: a key is any visible ASCII, so all but the
/// unreserved characters are escaped (the worker decodes them).
pub fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            escaped.push(char::from(b));
        } else {
            escaped.push_str(&format!("%{b:02X}"));
        }
    }
    escaped
}

/// The answer to a read (`GET`), after the retries.
#[derive(Debug)]
pub struct Fetched {
    pub answer: Option<Answer>,
    pub attempts: u32,
    pub no_answer: Option<NoAnswer>,
    pub server: String,
}

impl Fetched {
    /// The exit code of a read (docs/contract.md): 0 answered, 3 no such account or key,
    /// 2 a request the worker refused as invalid, 1 anything else (no answer, 5xx after
    /// the retries, 401, 403, an endpoint the worker does not have).
    pub fn exit_code(&self) -> u8 {
        let Some(answer) = &self.answer else {
            return 1;
        };
        match (answer.status, answer.code().as_deref()) {
            (200, _) => 0,
            (404, Some("account_not_found" | "key_not_found")) => 3,
            (400, _) => 2,
            _ => 1,
        }
    }

    /// The body as JSON, on a 200.
    pub fn found(&self) -> Option<Value> {
        self.answer
            .as_ref()
            .filter(|a| a.status == 200)
            .and_then(Answer::json)
    }

    /// What went wrong, for a person, with the same advice `submit` gives.
    pub fn failure(&self) -> String {
        if let Some(answer) = &self.answer
            && answer.status == 404
            && self.exit_code() == 3
        {
            let v = answer.json().unwrap_or(Value::Null);
            return format!(
                "not found: {} - {}",
                v["code"].as_str().unwrap_or_default(),
                v["title"].as_str().unwrap_or_default()
            );
        }
        let verdict = if self.exit_code() == 2 {
            Verdict::Invalid
        } else {
            Verdict::Failed
        };
        render(
            &Submitted {
                verdict,
                answer: self.answer.clone(),
                attempts: self.attempts,
                no_answer: self.no_answer.clone(),
                server: self.server.clone(),
            },
            None,
        )
    }
}

/// `GET path_and_query` (its parts already escaped), retried on transport failures and
/// 5xx like a command: a read changes nothing, so repeating it is always safe. `log`
/// hears of each retry.
pub fn read(options: &SubmitOptions, path_and_query: &str, log: &mut dyn FnMut(&str)) -> Fetched {
    let x = get_retried(options, path_and_query, "asking again", log);
    Fetched {
        answer: x.last,
        attempts: x.attempts,
        no_answer: x.no_answer,
        server: options.server.clone(),
    }
}

/// `GET path_and_query`, with the token, retried on transport failures and 5xx; each
/// retry is told to `log` with `retrying`.
fn get_retried(
    options: &SubmitOptions,
    path_and_query: &str,
    retrying: &str,
    log: &mut dyn FnMut(&str),
) -> Exchange<()> {
    let url = url(options, path_and_query);
    let auth = bearer(options);
    let mut request = |agent: &ureq::Agent| {
        let mut request = agent.get(&url);
        if let Some(a) = &auth {
            request = request.header("Authorization", a);
        }
        request.call()
    };
    let decide = |a: &Answer| match a.status {
        500..=599 => Step::Retry,
        _ => Step::Done(()),
    };
    exchange(options, &mut request, &decide, retrying, log)
}

/// The body `submit --json` prints: the worker's, with `"replayed"` added to a stored
/// answer (a receipt or a business rejection, which carry `outcome`) from the
/// `Idempotent-Replayed` header. The worker's body is the same bytes for a first answer
/// and its replays, so without this a script could not tell them apart. Other answers
/// (400, 409, a reused key) are printed as the worker sent them.
pub fn json_output(answer: &Answer) -> String {
    match answer.json() {
        Some(Value::Object(mut map)) if map.contains_key("outcome") => {
            map.insert("replayed".into(), Value::Bool(answer.replayed));
            Value::Object(map).to_string()
        }
        _ => answer.body.clone(),
    }
}

/// What the worker knows of the withdrawal a refund names.
#[derive(Debug)]
pub enum Withdrawal {
    /// The key holds a withdrawal (applied, rejected or in flight) in this currency.
    In(Currency),
    /// The key holds another command (a deposit, a refund).
    NotAWithdrawal(String),
    /// This client has no such key.
    Unknown,
    /// No usable answer: the reason, as a failed submission, for the same advice.
    Failed(Submitted),
}

/// Asks the worker for the withdrawal `key` (`GET /v1/keys/{key}`), for its currency: a
/// refund's amount is typed in it. Retried like a command; reading changes nothing.
pub fn withdrawal(options: &SubmitOptions, key: &Key, log: &mut dyn FnMut(&str)) -> Withdrawal {
    let path = format!("/v1/keys/{}", escape(key.as_str()));
    let retrying = format!("asking again for the withdrawal {}", key.as_str());
    let x = get_retried(options, &path, &retrying, log);
    let failed = |x: Exchange<()>| {
        Withdrawal::Failed(Submitted {
            verdict: Verdict::Failed,
            answer: x.last,
            attempts: x.attempts,
            no_answer: x.no_answer,
            server: options.server.clone(),
        })
    };
    let Some(answer) = x.last.as_ref().filter(|_| x.done.is_some()) else {
        return failed(x);
    };
    let v = answer.json().unwrap_or(Value::Null);
    match (answer.status, v["command"].as_str(), v["currency"].as_str()) {
        (200, Some("withdraw"), Some(code)) => match Currency::parse(code) {
            Ok(c) => Withdrawal::In(c),
            Err(_) => failed(x),
        },
        (200, Some(other), _) => Withdrawal::NotAWithdrawal(other.to_owned()),
        (404, ..) => Withdrawal::Unknown,
        _ => failed(x),
    }
}

/// A receipt a person can read, for every way a submission can end. Money is in major
/// units; `currency` is the refund's, which its rejection does not carry.
pub fn render(submitted: &Submitted, currency: Option<&str>) -> String {
    let Some(answer) = &submitted.answer else {
        return no_answer(submitted);
    };
    let v = answer.json().unwrap_or(Value::Null);
    let s = |k: &str| match &v[k] {
        Value::String(x) => x.clone(),
        Value::Null => String::new(),
        x => x.to_string(),
    };
    match submitted.verdict {
        Verdict::Applied { replayed } => {
            let code = s("currency");
            let mut out = format!(
                "{}: {}\n  key      {}\n  seq      {}\n  balance  {} {}\n",
                if replayed { "replayed" } else { "applied" },
                describe_command(&v, currency),
                s("key"),
                s("seq"),
                s("account"),
                money(&v["balance"], &code),
            );
            if v.get("refunded_total").is_some() {
                out.push_str(&format!(
                    "  refunded {} in total\n",
                    money(&v["refunded_total"], &code)
                ));
            }
            out.push_str(&format!("  at       {}", s("created_at")));
            if replayed {
                out.push_str(" (first execution; this answer is its replay, nothing moved again)");
            }
            out
        }
        Verdict::Rejected => {
            let code = v["currency"].as_str().or(currency).unwrap_or_default();
            // The figure the rejection was decided on, when the answer carries one: in
            // major units here, where its `detail` sentence counts minor units.
            let mut figures = String::new();
            if !v["balance"].is_null() {
                figures.push_str(&format!(
                    "  balance  {} {}\n",
                    s("account"),
                    money(&v["balance"], code)
                ));
            }
            if !v["refundable"].is_null() {
                figures.push_str(&format!(
                    "  left     {} of withdrawal {} to refund\n",
                    money(&v["refundable"], code),
                    s("withdrawal")
                ));
            }
            if let Some(held) = v["account_currency"].as_str() {
                figures.push_str(&format!("  account  {} holds {held}\n", s("account")));
            }
            format!(
                "rejected{}: {} - {}\n  {}\n{figures}  key      {}\n  seq      {}\n  \
                 at       {}\n  {}",
                if answer.replayed { " (replayed)" } else { "" },
                s("code"),
                s("title"),
                describe_command(&v, currency),
                s("key"),
                s("seq"),
                s("created_at"),
                rejection_advice(&s("key")),
            )
        }
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
            "still in flight after {}: another request with this key has not \
             finished. Retry later with the same key; it will never apply twice.",
            count(submitted.attempts, "attempt", "attempts")
        ),
        Verdict::Invalid | Verdict::Failed => {
            let mut out = format!(
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
            );
            if answer.status == 401 {
                out.push_str(
                    "\n  The worker has tokens: pass your client's secret with --token SECRET, \
                     or set IDEM_TOKEN.",
                );
            }
            out
        }
    }
}

/// The failure when no attempt got an answer, with what to do about it.
fn no_answer(submitted: &Submitted) -> String {
    let attempts = count(submitted.attempts, "attempt", "attempts");
    match &submitted.no_answer {
        Some(NoAnswer::NoWorker(e)) => format!(
            "failed: no worker answers at {} ({e}; {attempts}).\n  \
             Start one with `inbox-worker serve --db ./idem-data`, or point --server (or \
             IDEM_SERVER) at yours.",
            submitted.server
        ),
        Some(NoAnswer::Lost(e)) => format!(
            "failed: no answer after {attempts} ({e}). The command may or may not have been \
             applied: retry with the same key, which applies it at most once."
        ),
        None => format!("failed: no answer after {attempts}"),
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

    fn rendered(status: u16, body: serde_json::Value, currency: Option<&str>) -> String {
        let answer = answer(status, &body.to_string());
        let verdict = match classify(&answer) {
            Step::Done(v) => v,
            Step::Retry => Verdict::StillInFlight,
        };
        render(
            &Submitted {
                verdict,
                answer: Some(answer),
                attempts: 1,
                no_answer: None,
                server: String::new(),
            },
            currency,
        )
    }

    /// Receipts speak major units, whatever the answer counts in; a rejection's figure
    /// too, and a refund's rejection, which carries no currency, in the one the CLI read.
    #[test]
    fn receipts_show_money_in_major_units() {
        let applied = rendered(
            201,
            serde_json::json!({"command": "withdraw", "account": "alice", "amount": 30_000,
                "currency": "RUB", "key": "w-1", "seq": 2, "balance": 70_000,
                "created_at": "2026-12-01T00:00:00.000Z"}),
            None,
        );
        assert!(
            applied.starts_with(
                "applied: withdraw 300.00 RUB from alice\n  key      w-1\n  seq      2\n  \
                 balance  alice 700.00 RUB\n"
            ),
            "{applied}"
        );
        let poor = rendered(
            422,
            serde_json::json!({"code": "insufficient_funds", "title": "Insufficient funds",
                "command": "withdraw", "account": "alice", "amount": 123_456_789,
                "currency": "KWD", "balance": 1_500, "key": "w-2", "seq": 3,
                "created_at": "2026-12-01T00:00:00.000Z"}),
            None,
        );
        assert!(
            poor.starts_with(
                "rejected: insufficient_funds - Insufficient funds\n  withdraw 123,456.789 KWD \
                 from alice\n  balance  alice 1.500 KWD\n  key      w-2\n"
            ),
            "{poor}"
        );
        let refund = rendered(
            422,
            serde_json::json!({"code": "refund_exceeds_withdrawal", "title": "Too much",
                "command": "refund", "withdrawal": "w-1", "amount": 500, "refundable": 200,
                "key": "r-1", "seq": 4, "created_at": "2026-12-01T00:00:00.000Z"}),
            Some("JPY"),
        );
        assert!(
            refund.contains(
                "  refund 500 JPY of withdrawal w-1\n  left     200 JPY of withdrawal w-1 \
                 to refund\n"
            ),
            "{refund}"
        );
        let other = rendered(
            422,
            serde_json::json!({"code": "currency_mismatch", "title": "Currency mismatch",
                "command": "deposit", "account": "alice", "amount": 100, "currency": "EUR",
                "account_currency": "RUB", "key": "d-2", "seq": 5,
                "created_at": "2026-12-01T00:00:00.000Z"}),
            None,
        );
        assert!(
            other.contains("  deposit 1.00 EUR to alice\n  account  alice holds RUB\n"),
            "{other}"
        );
    }
}
