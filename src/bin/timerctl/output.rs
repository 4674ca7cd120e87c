//! How timerctl prints: lines for people (`--output text`, the default) or JSON for scripts
//! (`--output json`).
//!
//! In JSON every command prints one JSON document on stdout, except `watch`, which prints one
//! per delivery, a line each. A failure prints `{"error": {"code", "message", "hint"}}` on
//! stderr instead of a sentence; the exit status is 1 either way. Times are epoch milliseconds
//! in JSON and RFC 3339 UTC in text; states are names (`PENDING`) in both.

use std::sync::OnceLock;
use std::time::{Duration, UNIX_EPOCH};

use clap::ValueEnum;
use serde_json::{json, Value};
use timerdb::api::pb;

#[derive(ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Format {
    #[default]
    Text,
    Json,
}

static FORMAT: OnceLock<Format> = OnceLock::new();

pub fn set(format: Format) {
    let _ = FORMAT.set(format);
}

pub fn json() -> bool {
    FORMAT.get() == Some(&Format::Json)
}

/// Prints one JSON document.
pub fn doc(v: Value) {
    println!("{v}");
}

/// A failed call, kept structured so that JSON output can carry its code.
#[derive(Debug)]
pub struct CallError {
    pub code: String,
    pub message: String,
    pub hint: Option<&'static str>,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)?;
        if let Some(hint) = self.hint {
            write!(f, "\nhint: {hint}")?;
        }
        Ok(())
    }
}

impl std::error::Error for CallError {}

const NO_LEADER: &str = "the cluster has no leader that could take the call: a majority of \
    voters may be down or cut off from each other. `timerctl status` shows which nodes answer; \
    the call is safe to retry once one leads";
const UNREACHABLE: &str = "is timerd running there? Point --endpoint (or TIMERDB_ENDPOINT) at \
    any node of the cluster";

const TLS_HINT: &str = "if the cluster speaks TLS, pass its CA with --ca (TIMERDB_CA), and with \
    mTLS a client certificate with --cert and --key (TIMERDB_CERT, TIMERDB_KEY)";

/// A gRPC status as an error with a hint for the codes a person can act on.
pub fn status_err(s: tonic::Status) -> anyhow::Error {
    let hint = match s.code() {
        // This client could not reach the node (the status carries the transport error as its
        // source; a status the node answered has none).
        tonic::Code::Unavailable if std::error::Error::source(&s).is_some() => Some(UNREACHABLE),
        tonic::Code::Unavailable => Some(NO_LEADER),
        tonic::Code::DeadlineExceeded => {
            Some("the node did not answer in time; it may be overloaded")
        }
        // The connection failed under the call: often a TLS handshake the node refused.
        tonic::Code::Unknown if std::error::Error::source(&s).is_some() => Some(TLS_HINT),
        // Plain text sent to a TLS port gets a TLS alert back, which HTTP/2 cannot read.
        tonic::Code::Internal if s.message().contains("h2 protocol error") => Some(TLS_HINT),
        tonic::Code::Unauthenticated => Some(
            "auth is on: pass an API key with --token (or TIMERDB_TOKEN); \
             `timerctl auth key create` makes one",
        ),
        _ => None,
    };
    let message = match std::error::Error::source(&s) {
        Some(cause) if s.code() == tonic::Code::Unknown => {
            format!("{}: {}", s.message(), causes(cause))
        }
        _ => s.message().to_string(),
    };
    CallError {
        code: format!("{:?}", s.code()),
        message,
        hint,
    }
    .into()
}

/// An error's causes, most specific last ("tcp connect error: Connection refused"): a
/// transport error's own text ("transport error") says little.
pub fn causes(e: &dyn std::error::Error) -> String {
    let mut parts = vec![e.to_string()];
    let mut next = e.source();
    while let Some(cause) = next {
        parts.push(cause.to_string());
        next = cause.source();
    }
    parts.dedup();
    if parts.len() > 1 {
        parts.remove(0);
    }
    parts.join(": ")
}

/// The endpoint could not be reached at all.
pub fn unreachable(why: &str) -> anyhow::Error {
    CallError {
        code: "Unreachable".into(),
        message: why.to_string(),
        hint: Some(UNREACHABLE),
    }
    .into()
}

/// Prints a failure the way the output format asks.
pub fn error(e: &anyhow::Error) {
    if !json() {
        eprintln!("error: {e:#}");
        return;
    }
    let v = match e.downcast_ref::<CallError>() {
        Some(c) => json!({"error": {"code": c.code, "message": c.message, "hint": c.hint}}),
        None => json!({"error": {"code": "Client", "message": format!("{e:#}")}}),
    };
    eprintln!("{v}");
}

pub fn fmt_ms(ms: i64) -> String {
    if ms <= 0 {
        return "-".into();
    }
    let t = UNIX_EPOCH + Duration::from_millis(ms as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

pub fn state_name(v: i32) -> &'static str {
    pb::TimerState::try_from(v).map_or("?", |s| s.as_str_name().trim_start_matches("TIMER_STATE_"))
}

fn phase_name(v: i32) -> Option<&'static str> {
    match pb::DeliveryPhase::try_from(v) {
        Ok(pb::DeliveryPhase::Unspecified) | Err(_) => None,
        Ok(p) => Some(p.as_str_name().trim_start_matches("DELIVERY_PHASE_")),
    }
}

pub fn timer_json(t: &pb::Timer) -> Value {
    json!({
        "namespace": t.namespace,
        "id": t.id,
        "state": state_name(t.state),
        "phase": phase_name(t.phase),
        "fire_at_ms": t.fire_at_ms,
        "fired_at_ms": t.fired_at_ms,
        "fire_index": t.fire_index,
        "attempts": t.attempts,
        "timeouts": t.timeouts,
        "nacks": t.nacks,
        "redrives": t.redrives,
        "last_delivered_at_ms": t.last_delivered_at_ms,
        "finished_at_ms": t.finished_at_ms,
        "wake_at_ms": t.wake_at_ms,
        "payload": String::from_utf8_lossy(&t.payload),
        "content_type": t.content_type,
        "revision": t.revision,
        "attempt_log": t.attempt_log.iter().map(attempt_json).collect::<Vec<_>>(),
        "series": t.series.as_ref().map(recurring_json),
    })
}

fn attempt_json(a: &pb::Attempt) -> Value {
    json!({
        "at_ms": a.at_ms,
        "attempt": a.attempt,
        "channel": a.channel,
        "outcome": a.outcome,
        "http_status": a.http_status,
        "grpc_code": a.grpc_code,
        "latency_ms": a.latency_ms,
        "detail": a.detail,
    })
}

/// Prints a timer's attempt log, a line per attempt (oldest first).
pub fn attempts(t: &pb::Timer) {
    if json() {
        let log: Vec<Value> = t.attempt_log.iter().map(attempt_json).collect();
        return doc(json!({"namespace": t.namespace, "id": t.id, "attempt_log": log}));
    }
    if t.attempt_log.is_empty() {
        println!("  no attempts yet");
    }
    for a in &t.attempt_log {
        let outcome = match a.outcome.as_str() {
            "http" => format!("HTTP {}", a.http_status),
            "grpc" => format!("gRPC code {}", a.grpc_code),
            other => other.to_string(),
        };
        let mut line = format!(
            "  #{} {} {:<9} {:<16} {} ms",
            a.attempt,
            fmt_ms(a.at_ms),
            a.channel,
            outcome,
            a.latency_ms
        );
        if !a.detail.is_empty() {
            line += &format!("  {:?}", a.detail);
        }
        println!("{line}");
    }
}

/// Prints a timer after what happened to it (`verb`, e.g. "scheduled"; empty for none).
pub fn timer(verb: &str, t: &pb::Timer) {
    if json() {
        let mut v = json!({"timer": timer_json(t)});
        if !verb.is_empty() {
            v["result"] = verb.into();
        }
        doc(v);
    } else if verb.is_empty() {
        println!("{}", timer_line(t));
    } else {
        println!("{verb} {}", timer_line(t));
    }
    if let (false, Some(s)) = (json(), &t.series) {
        for line in recurring_lines(s) {
            println!("{line}");
        }
    }
}

pub fn timer_line(t: &pb::Timer) -> String {
    let mut line = format!(
        "{}/{}  {} rev={}  fire_at={}",
        t.namespace,
        t.id,
        state_name(t.state),
        t.revision,
        fmt_ms(t.fire_at_ms)
    );
    if t.fire_index > 0 {
        line += &format!(
            "  fired_at={} (+{} ms) fire_index={}",
            fmt_ms(t.fired_at_ms),
            t.fired_at_ms - t.fire_at_ms,
            t.fire_index
        );
    }
    if let Some(phase) = phase_name(t.phase) {
        line += &format!("  {phase}");
    }
    if t.attempts > 0 || t.redrives > 0 {
        line += &format!(
            "  attempts={} (timeouts={} nacks={} redrives={}) last_delivered={}",
            t.attempts,
            t.timeouts,
            t.nacks,
            t.redrives,
            fmt_ms(t.last_delivered_at_ms)
        );
    }
    if t.finished_at_ms > 0 {
        line += &format!("  finished_at={}", fmt_ms(t.finished_at_ms));
    }
    if t.wake_at_ms > 0 && t.state != pb::TimerState::Pending as i32 {
        let what = if t.finished_at_ms > 0 {
            "purge_at"
        } else {
            "next_at"
        };
        line += &format!("  {what}={}", fmt_ms(t.wake_at_ms));
    }
    if !t.payload.is_empty() {
        line += &format!("  payload={:?}", String::from_utf8_lossy(&t.payload));
    }
    line
}

pub fn members_json(members: &[pb::Member]) -> Value {
    let list: Vec<Value> = members
        .iter()
        .map(|m| json!({"id": m.node_id, "addr": m.addr, "voter": m.voter}))
        .collect();
    json!({ "members": list })
}

// A recurring timer's series, shown under its timer.

fn rule_text(r: &pb::Recurrence) -> String {
    if r.cron.is_empty() {
        format!(
            "every {}",
            humantime::format_duration(Duration::from_millis(r.every_ms.max(0) as u64))
        )
    } else {
        format!("cron {:?} in {}", r.cron, r.time_zone)
    }
}

/// The lines that follow a recurring timer's line in text output.
pub fn recurring_lines(s: &pb::Series) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(r) = &s.recurrence {
        let misfire = pb::Misfire::try_from(r.misfire).map_or("?", |m| m.as_str_name());
        let overlap = pb::Overlap::try_from(r.overlap).map_or("?", |m| m.as_str_name());
        out.push(format!(
            "  recurring: {}  {}  {}  {}{}",
            rule_text(r),
            s.status,
            misfire.to_lowercase(),
            overlap.to_lowercase(),
            if r.jitter_ms > 0 {
                format!("  jitter {} ms", r.jitter_ms)
            } else {
                String::new()
            }
        ));
    }
    out.push(format!(
        "  fired {}  skipped {}  missed {}  next {}",
        s.fired,
        s.skipped,
        s.missed,
        s.next_ms.first().map_or("-".into(), |n| fmt_ms(*n))
    ));
    for o in &s.recent {
        out.push(format!("  {}  {}  {}", o.id, o.fate, state_name(o.state)));
    }
    out
}

/// A recurring timer's part of the JSON output.
pub fn recurring_json(s: &pb::Series) -> Value {
    let r = s.recurrence.clone().unwrap_or_default();
    json!({
        "cron": r.cron,
        "time_zone": r.time_zone,
        "every_ms": r.every_ms,
        "anchor_ms": r.anchor_ms,
        "start_ms": r.start_ms,
        "end_ms": r.end_ms,
        "max_count": r.max_count,
        "misfire": pb::Misfire::try_from(r.misfire).map_or("?", |m| m.as_str_name()),
        "overlap": pb::Overlap::try_from(r.overlap).map_or("?", |m| m.as_str_name()),
        "jitter_ms": r.jitter_ms,
        "status": s.status,
        "next_ms": s.next_ms,
        "next_id": s.next_id,
        "fired": s.fired,
        "skipped": s.skipped,
        "missed": s.missed,
        "tzdb": s.tzdb,
        "recent": s.recent.iter().map(|o| json!({
            "id": o.id, "fate": o.fate, "state": state_name(o.state)
        })).collect::<Vec<_>>(),
    })
}
