//! Problem details (RFC 9457) and the JSON answers every endpoint renders, plus the query
//! string checks that turn a bad parameter into a problem. Knows nothing of the app.

use std::collections::HashMap;

use axum::extract::Query;
use axum::extract::rejection::QueryRejection;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// An RFC 9457 problem with a stable `code`. `detail` is always written by the server.
#[derive(Debug)]
pub(crate) struct Problem {
    pub status: StatusCode,
    pub code: &'static str,
    pub title: &'static str,
    pub detail: Option<String>,
    pub retry_after_secs: Option<u64>,
    pub extra: Option<Box<(&'static str, Value)>>,
}

impl Problem {
    pub fn new(status: StatusCode, code: &'static str, title: &'static str) -> Self {
        Self {
            status,
            code,
            title,
            detail: None,
            retry_after_secs: None,
            extra: None,
        }
    }
    pub fn detail(mut self, d: impl Into<String>) -> Self {
        self.detail = Some(d.into());
        self
    }
    /// 401: no caller could be named; `title` says whether a token is missing or not
    /// accepted, which a client fixes differently.
    pub fn unauthorized(title: &'static str) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", title)
    }
    /// 403: the caller is known and may not do this; `detail` says what it may do.
    pub fn forbidden() -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "This token may not do this; nothing changed.",
        )
    }
    pub fn invalid(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "The request is not valid; nothing changed.",
        )
        .detail(detail)
    }
    pub fn unavailable() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "The ledger's storage is unavailable; nothing was recorded. Retry later.",
        )
    }
    pub fn not_found(code: &'static str, title: &'static str) -> Self {
        Self::new(StatusCode::NOT_FOUND, code, title)
    }
}

pub(crate) fn problem_body(p: &Problem) -> Value {
    let mut body = json!({
        "type": format!("urn:idem:problem:{}", p.code),
        "title": p.title,
        "status": p.status.as_u16(),
        "code": p.code,
    });
    if let Some(d) = &p.detail {
        body["detail"] = json!(d);
    }
    if let Some(extra) = &p.extra {
        body[extra.0] = extra.1.clone();
    }
    body
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let mut r = bytes_response(
            self.status,
            body_bytes(&problem_body(&self)),
            "application/problem+json",
        );
        if let Some(secs) = self.retry_after_secs {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.status == StatusCode::PAYLOAD_TOO_LARGE {
            // The rest of the body is never read, so the connection cannot carry another
            // request: saying so keeps a client from reusing it and failing there.
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

pub(crate) fn body_bytes(v: &Value) -> Vec<u8> {
    // serde_json's map is ordered by key, so the same value gives the same bytes.
    serde_json::to_vec(v).unwrap_or_default()
}

pub(crate) fn bytes_response(
    status: StatusCode,
    body: Vec<u8>,
    content_type: &'static str,
) -> Response {
    let mut r = (status, body).into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

pub(crate) fn json_ok(v: &Value) -> Response {
    bytes_response(StatusCode::OK, body_bytes(v), "application/json")
}

// ---- query parameters ---------------------------------------------------------------------

pub(crate) type Params = Result<Query<HashMap<String, String>>, QueryRejection>;

/// The query's parameters, each one named in `allowed`: an unknown name (a typo such as
/// `staus`) is refused rather than ignored, since ignoring it answers another question
/// than the one asked. The name is not echoed back.
pub(crate) fn params(q: Params, allowed: &[&str]) -> Result<HashMap<String, String>, Problem> {
    let p = q
        .map(|Query(m)| m)
        .map_err(|_| Problem::invalid("the query string could not be decoded"))?;
    if p.keys().any(|name| !allowed.contains(&name.as_str())) {
        return Err(Problem::invalid(if allowed.is_empty() {
            "an unknown query parameter; this endpoint takes none".to_owned()
        } else {
            format!(
                "an unknown query parameter; this endpoint takes {}",
                allowed.join(", ")
            )
        }));
    }
    Ok(p)
}

/// For an endpoint that takes no query parameter: any is refused, so that a parameter
/// the client believes in (a filter, a `dry_run`) is never silently ignored.
pub(crate) fn no_params(q: Params) -> Result<(), Problem> {
    params(q, &[]).map(|_| ())
}

/// `limit`: how many rows a page holds, from 1 to 1,000 (100 when absent).
pub(crate) fn limit_param(p: &HashMap<String, String>) -> Result<usize, Problem> {
    match p.get("limit") {
        None => Ok(100),
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=1000).contains(n))
            .ok_or_else(|| Problem::invalid("limit must be a whole number from 1 to 1000")),
    }
}

pub(crate) fn number_param(
    p: &HashMap<String, String>,
    name: &'static str,
    default: u64,
    max: u64,
) -> Result<u64, Problem> {
    match p.get(name) {
        None => Ok(default),
        Some(v) => {
            v.parse::<u64>().ok().filter(|n| *n <= max).ok_or_else(|| {
                Problem::invalid(format!("{name} must be a whole number up to {max}"))
            })
        }
    }
}
