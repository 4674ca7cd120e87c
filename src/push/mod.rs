//! Push delivery: the leader calls each fired timer's receiver back, over HTTP (a Standard
//! Webhooks POST) or gRPC (`timerdb.v1.Receiver/Receive`). Design: docs/push.md.
//!
//! What it owns: turning a delivery into a request ([`Message`]: body, content type, the
//! signed headers), sending it ([`http`], and a [`GrpcSender`] the API layer implements, as the
//! only code that knows protobuf), judging the answer ([`Answer`]) and the leader's worker that
//! does this for every namespace with a push target ([`worker`]).
//!
//! Invariants:
//! - A push is a delivery under a lease like any other: the pusher is a dispatcher
//!   subscription, so it sends only what a committed grant leased to it, and the attempt it
//!   sends is the replicated one. Its outcome is a committed `Pushed` command (an ack, or a
//!   nack with the namespace's backoff), never a decision in memory.
//! - A request that never gets an answer (leader killed, the proposal of its outcome lost)
//!   leaves its timer in flight until the lease's deadline; then it is pushed again with
//!   attempt + 1 and the same `webhook-id`. At least once; the receiver deduplicates.
//! - Nothing here blocks the fire driver or another namespace: every request runs on its own
//!   task with the namespace's timeout, and a namespace holds at most its concurrency.

pub mod guard;
pub mod http;
pub mod pusher;
pub mod trust;
pub mod worker;

use std::time::Duration;

use crate::namespace::sign;
use crate::timer::{Outcome, Timer, DEFAULT_CONTENT_TYPE};

/// Most requests one namespace has outstanding on this leader: its lanes, each with at most
/// one connection (its `max_concurrent_dispatches` may allow fewer; the dispatcher applies
/// that one).
pub const MAX_PUSH_IN_FLIGHT: usize = 256;

/// One push request, ready for either protocol.
#[derive(Debug, Clone)]
pub struct Message {
    pub timer: Timer,
    pub attempt: u32,
    /// `webhook-id`: `tdb_<fire_index>_<hash of the key>`, the same on every attempt.
    pub id: String,
    /// `webhook-timestamp`: Unix seconds of this attempt.
    pub timestamp: i64,
    /// `webhook-signature`: one `v1,` entry per secret.
    pub signature: String,
}

/// The request headers (lower-case, as Standard Webhooks writes them), built once.
mod names {
    use ::http::HeaderName;
    pub const WEBHOOK_ID: HeaderName = HeaderName::from_static("webhook-id");
    pub const WEBHOOK_TIMESTAMP: HeaderName = HeaderName::from_static("webhook-timestamp");
    pub const WEBHOOK_SIGNATURE: HeaderName = HeaderName::from_static("webhook-signature");
    pub const NAMESPACE: HeaderName = HeaderName::from_static("timerdb-namespace");
    pub const ID: HeaderName = HeaderName::from_static("timerdb-id");
    pub const FIRE_AT_MS: HeaderName = HeaderName::from_static("timerdb-fire-at-ms");
    pub const FIRED_AT_MS: HeaderName = HeaderName::from_static("timerdb-fired-at-ms");
    pub const FIRE_INDEX: HeaderName = HeaderName::from_static("timerdb-fire-index");
    pub const ATTEMPT: HeaderName = HeaderName::from_static("timerdb-attempt");
}

impl Message {
    /// The request for delivery `attempt` of `timer`, signed with `secrets` at `now_s` (Unix
    /// seconds: the `webhook-timestamp`).
    pub fn new(timer: Timer, attempt: u32, secrets: &[sign::Secret], now_s: i64) -> Message {
        let k = &timer.key;
        let id = sign::message_id(&k.namespace, &k.id, timer.fire_index);
        let signature = sign::signature_header(secrets, &id, now_s, &timer.payload);
        Message {
            timer,
            attempt,
            id,
            timestamp: now_s,
            signature,
        }
    }

    /// The payload's media type.
    pub fn content_type(&self) -> &str {
        match self.timer.content_type.as_str() {
            "" => DEFAULT_CONTENT_TYPE,
            t => t,
        }
    }

    /// The Standard Webhooks and timerdb headers (not the content type), for an HTTP request or
    /// as gRPC metadata. Every value is visible ASCII (ids are percent-encoded).
    pub fn headers(&self) -> ::http::HeaderMap {
        use ::http::HeaderValue;
        let t = &self.timer;
        // Validated at Schedule (and made of visible ASCII here), so never refused; a value
        // that were would be left out rather than fail the push.
        let text = |s: &str| HeaderValue::from_str(s).ok();
        let mut h = ::http::HeaderMap::with_capacity(12);
        let mut put = |name, value: Option<HeaderValue>| {
            if let Some(v) = value {
                h.insert(name, v);
            }
        };
        put(names::WEBHOOK_ID, text(&self.id));
        put(names::WEBHOOK_TIMESTAMP, Some(self.timestamp.into()));
        put(names::WEBHOOK_SIGNATURE, text(&self.signature));
        put(names::NAMESPACE, text(&header_safe(&t.key.namespace)));
        put(names::ID, text(&header_safe(&t.key.id)));
        put(names::FIRE_AT_MS, Some(t.fire_at_ms.into()));
        put(names::FIRED_AT_MS, Some(t.fired_at_ms.into()));
        put(names::FIRE_INDEX, Some(t.fire_index.into()));
        put(names::ATTEMPT, Some(self.attempt.into()));
        h
    }
}

/// `s` with every byte that is not visible ASCII (or is `%`) percent-encoded, so any namespace
/// or id fits a header value and decodes back unchanged.
pub fn header_safe(s: &str) -> std::borrow::Cow<'_, str> {
    if s.bytes().all(|b| b.is_ascii_graphic() && b != b'%') {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for b in s.bytes() {
        if b.is_ascii_graphic() && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    std::borrow::Cow::Owned(out)
}

/// What a receiver answered (or what went wrong on the way).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub outcome: Outcome,
    /// The first bytes of an error body or message.
    pub detail: String,
    /// When the receiver asked to be tried again (`Retry-After`, `grpc-retry-pushback-ms`).
    pub retry_after: Option<RetryAfter>,
}

/// A receiver's `Retry-After`: a wait, or a time (HTTP-date).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryAfter {
    Ms(u64),
    AtMs(i64),
}

impl RetryAfter {
    /// Parses an HTTP `Retry-After` value: delta-seconds or an HTTP-date (RFC 9110 10.2.3).
    pub fn parse_http(value: &str) -> Option<RetryAfter> {
        let value = value.trim();
        if let Ok(s) = value.parse::<u64>() {
            return Some(RetryAfter::Ms(s.saturating_mul(1000)));
        }
        let at = httpdate::parse_http_date(value).ok()?;
        let ms = at.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis();
        Some(RetryAfter::AtMs(ms.min(i64::MAX as u128) as i64))
    }

    /// The wait from `now_ms`, in ms (0 for a time already past).
    pub fn wait_ms(self, now_ms: i64) -> u64 {
        match self {
            RetryAfter::Ms(ms) => ms,
            RetryAfter::AtMs(at) => at.saturating_sub(now_ms).max(0) as u64,
        }
    }
}

impl Answer {
    pub fn new(outcome: Outcome, detail: impl Into<String>) -> Answer {
        Answer {
            outcome,
            detail: detail.into(),
            retry_after: None,
        }
    }

    /// Whether the receiver took the timer (2xx, gRPC OK).
    pub fn ok(&self) -> bool {
        match self.outcome {
            Outcome::Http(s) => (200..300).contains(&s),
            Outcome::Grpc(c) => c == 0,
            _ => false,
        }
    }

    /// Whether the receiver refused the request itself, so that retrying cannot help: a 4xx
    /// other than 408 (timeout) and 429 (slow down), or the gRPC codes that mean the same.
    pub fn client_error(&self) -> bool {
        match self.outcome {
            Outcome::Http(s) => (400..500).contains(&s) && s != 408 && s != 429,
            // INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED,
            // FAILED_PRECONDITION, UNIMPLEMENTED, UNAUTHENTICATED
            Outcome::Grpc(c) => matches!(c, 3 | 5 | 6 | 7 | 9 | 12 | 16),
            _ => false,
        }
    }

    /// A short label for metrics.
    pub fn label(&self) -> &'static str {
        match self.outcome {
            _ if self.ok() => "ok",
            Outcome::Http(300..=399) => "http_3xx",
            Outcome::Http(429) => "http_429",
            Outcome::Http(400..=499) => "http_4xx",
            Outcome::Http(_) => "http_5xx",
            Outcome::Grpc(_) => "grpc_error",
            Outcome::Timeout => "timeout",
            Outcome::Connection => "connection_error",
            _ => "other",
        }
    }
}

/// Sends pushes to gRPC receivers; implemented by the API layer (`api::services::receiver`), the only
/// code that knows the protobuf types.
pub trait GrpcSender: Send + Sync {
    /// Calls `Receiver/Receive` at `url` (`grpc://` or `grpcs://`) with `msg`, within `timeout`.
    fn send(
        &self,
        url: &str,
        msg: Message,
        timeout: Duration,
    ) -> futures::future::BoxFuture<'static, Answer>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_are_visible_ascii_and_reversible() {
        assert_eq!(header_safe("order-42/x"), "order-42/x");
        assert_eq!(header_safe("a b%c"), "a%20b%25c");
        assert_eq!(header_safe("café"), "caf%C3%A9");
    }

    #[test]
    fn answers_are_judged_as_the_spec_says() {
        let a = |o| Answer::new(o, "");
        assert!(a(Outcome::Http(200)).ok() && a(Outcome::Http(204)).ok());
        assert!(!a(Outcome::Http(301)).ok(), "redirects are failures");
        assert!(a(Outcome::Http(400)).client_error() && a(Outcome::Http(410)).client_error());
        for retried in [408, 429, 500, 503] {
            let x = a(Outcome::Http(retried));
            assert!(!x.ok() && !x.client_error(), "{retried}");
        }
        assert!(a(Outcome::Grpc(0)).ok());
        assert!(a(Outcome::Grpc(3)).client_error());
        assert!(
            !a(Outcome::Grpc(14)).client_error(),
            "UNAVAILABLE is retried"
        );
        assert!(!a(Outcome::Timeout).ok() && !a(Outcome::Connection).client_error());
        assert_eq!(a(Outcome::Http(503)).label(), "http_5xx");
    }

    #[test]
    fn retry_after_is_read_as_seconds_or_a_date() {
        assert_eq!(RetryAfter::parse_http("120"), Some(RetryAfter::Ms(120_000)));
        assert_eq!(RetryAfter::parse_http(" 0 "), Some(RetryAfter::Ms(0)));
        let date = RetryAfter::parse_http("Wed, 21 Oct 2015 07:28:00 GMT").unwrap();
        assert_eq!(date, RetryAfter::AtMs(1_445_412_480_000));
        assert_eq!(date.wait_ms(1_445_412_470_000), 10_000);
        assert_eq!(date.wait_ms(1_445_412_490_000), 0, "a past date: no wait");
        for bad in ["", "soon", "-5", "1.5", "Wed, 21 Oct 2015"] {
            assert_eq!(RetryAfter::parse_http(bad), None, "{bad:?}");
        }
    }
}
