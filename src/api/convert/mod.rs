//! Validation and conversion between protobuf messages and domain types, and the mapping of
//! [`Error`] to gRPC status codes.
//!
//! Validation happens here, before anything is proposed, so a bad request gets a clear answer
//! and never reaches the log. Messages name the field, the limit and the value.

use tonic::{Code, Status};

use crate::api::pb;
use crate::config::{Limits, MIN_FIRE_AT_MS};
use crate::storage::{ListFilter, ListQuery};
use crate::timer::{
    AttemptRecord, Channel, KeyRef, Outcome, Phase, SpecRef, Specs, Timer, TimerKey, TimerSpec,
    TimerState, When,
};
use crate::Error;

/// The response metadata of a rate-limited call: milliseconds to wait before retrying.
pub const RETRY_AFTER_MS: &str = "retry-after-ms";
/// Longest content type a timer may carry.
pub const MAX_CONTENT_TYPE_BYTES: usize = 255;

/// The latest absolute fire time accepted: 9999-12-31T23:59:59.999Z.
pub const MAX_FIRE_AT_MS: i64 = 253_402_300_799_999;

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        let code = match &e {
            Error::InvalidArgument(_) => Code::InvalidArgument,
            Error::NotFound(_) => Code::NotFound,
            Error::AlreadyExists(_) => Code::AlreadyExists,
            Error::FailedPrecondition(_) => Code::FailedPrecondition,
            Error::ResourceExhausted(_) => Code::ResourceExhausted,
            Error::RateLimited { retry_after_ms, .. } => {
                let mut status = Status::new(Code::ResourceExhausted, e.to_string());
                if let Ok(v) = retry_after_ms.to_string().parse() {
                    status.metadata_mut().insert(RETRY_AFTER_MS, v);
                }
                return status;
            }
            // Leadership moved (or is moving): the forwarding layer may take the call to the
            // next leader — any call if it was not proposed (NotLeader), a safe one otherwise
            // (`timerdb_client::idempotent`). A leader cut off from its quorum is told apart
            // (no retry marker): the caller hears it at once and tries another node. An
            // unknown outcome is said as such.
            Error::NotLeader
            | Error::Unavailable(_)
            | Error::NoQuorum(_)
            | Error::NotYet(_)
            | Error::OutcomeUnknown(_) => {
                use crate::api::stack::headers::{
                    NOT_APPLIED_HEADER, OUTCOME_UNKNOWN_HEADER, RETRY_HEADER,
                };
                let mut status = Status::new(Code::Unavailable, e.to_string());
                let mark = |status: &mut Status, header: &'static str| {
                    let one = tonic::metadata::MetadataValue::from_static("1");
                    status.metadata_mut().insert(header, one);
                };
                match e {
                    Error::NotLeader | Error::NotYet(_) => {
                        mark(&mut status, RETRY_HEADER);
                        mark(&mut status, NOT_APPLIED_HEADER);
                    }
                    Error::Unavailable(_) => mark(&mut status, RETRY_HEADER),
                    Error::NoQuorum(_) => mark(&mut status, NOT_APPLIED_HEADER),
                    _ => mark(&mut status, OUTCOME_UNKNOWN_HEADER),
                }
                return status;
            }
            Error::Storage(_) | Error::Internal(_) => Code::Internal,
        };
        Status::new(code, e.to_string())
    }
}

fn invalid(msg: String) -> Error {
    Error::InvalidArgument(msg)
}

pub(crate) fn check_name(field: &str, value: &str, max: usize) -> Result<(), Error> {
    if value.is_empty() {
        return Err(invalid(format!("{field} must not be empty")));
    }
    if value.len() > max {
        return Err(invalid(format!(
            "{field} is {} bytes; the limit is {max}",
            value.len()
        )));
    }
    if value.chars().any(char::is_control) {
        return Err(invalid(format!(
            "{field} {value:?} contains control characters"
        )));
    }
    Ok(())
}

/// Validates a (namespace, id) pair.
pub fn key(namespace: &str, id: &str, limits: &Limits) -> Result<TimerKey, Error> {
    key_ref(namespace, id, limits).map(KeyRef::to_owned)
}

/// [`key`], borrowed (a batch copies its keys once, into its packed specs).
fn key_ref<'a>(namespace: &'a str, id: &'a str, limits: &Limits) -> Result<KeyRef<'a>, Error> {
    check_name("namespace", namespace, limits.max_namespace_bytes)?;
    check_name("id", id, limits.max_id_bytes)?;
    Ok(KeyRef { namespace, id })
}

fn when_at(fire_at_ms: i64) -> Result<When, Error> {
    if fire_at_ms < MIN_FIRE_AT_MS {
        return Err(invalid(format!(
            "fire_at_ms {fire_at_ms} is before the year 2000; fire times are Unix epoch \
             milliseconds (was a time in seconds sent?)"
        )));
    }
    if fire_at_ms > MAX_FIRE_AT_MS {
        return Err(invalid(format!(
            "fire_at_ms {fire_at_ms} is after the year 9999"
        )));
    }
    Ok(When::At(fire_at_ms))
}

fn when_after(delay_ms: i64, limits: &Limits) -> Result<When, Error> {
    if delay_ms < 0 {
        return Err(invalid(format!("delay_ms {delay_ms} is negative")));
    }
    if delay_ms > limits.max_delay_ms {
        return Err(invalid(format!(
            "delay_ms {delay_ms} exceeds the limit of {} ms",
            limits.max_delay_ms
        )));
    }
    Ok(When::After(delay_ms))
}

fn schedule_when(w: Option<pb::schedule_request::When>, limits: &Limits) -> Result<When, Error> {
    use pb::schedule_request::When as W;
    match w {
        Some(W::FireAtMs(t)) => when_at(t),
        Some(W::DelayMs(d)) => when_after(d, limits),
        None => Err(invalid("set either fire_at_ms or delay_ms".into())),
    }
}

/// Validates a reschedule's new time.
pub fn reschedule_when(
    w: Option<pb::reschedule_request::When>,
    limits: &Limits,
) -> Result<When, Error> {
    use pb::reschedule_request::When as W;
    match w {
        Some(W::FireAtMs(t)) => when_at(t),
        Some(W::DelayMs(d)) => when_after(d, limits),
        Some(W::ExtendByMs(_) | W::PullInMs(_)) | None => Err(invalid(
            "set fire_at_ms, delay_ms, extend_by_ms or pull_in_ms".into(),
        )),
    }
}

/// Validates one Schedule request.
pub fn spec(req: &pb::ScheduleRequest, limits: &Limits) -> Result<TimerSpec, Error> {
    spec_ref(req, limits).map(SpecRef::to_owned)
}

/// Validates one Schedule request, borrowing its strings and payload (a batch copies them
/// once, into its packed specs).
fn spec_ref<'a>(req: &'a pb::ScheduleRequest, limits: &Limits) -> Result<SpecRef<'a>, Error> {
    let key = key_ref(&req.namespace, &req.id, limits)?;
    if req.payload.len() > limits.max_payload_bytes {
        return Err(Error::ResourceExhausted(format!(
            "payload of {key} is {} bytes; the limit is {}",
            req.payload.len(),
            limits.max_payload_bytes
        )));
    }
    if req.recurrence.is_some() {
        return Err(invalid(format!(
            "{key} has a recurrence: recurring timers are scheduled one at a time, with Schedule"
        )));
    }
    if crate::recurring::parse_occurrence(key.id).is_some() {
        return Err(invalid(format!(
            "id {:?} ends in @<RFC 3339 time>, which names the occurrences of recurring timers; \
             choose another id",
            key.id
        )));
    }
    let when = schedule_when(req.when, limits)?;
    let ct = &req.content_type;
    if ct.len() > MAX_CONTENT_TYPE_BYTES || ct.parse::<http::HeaderValue>().is_err() {
        return Err(invalid(format!(
            "content_type of {key} must be at most {MAX_CONTENT_TYPE_BYTES} visible ASCII \
             characters (a media type such as application/json)"
        )));
    }
    Ok(SpecRef {
        key,
        when,
        payload: &req.payload,
        content_type: ct,
    })
}

/// Validates a ScheduleBatch: size, each timer, and no id twice.
pub fn specs(req: &pb::ScheduleBatchRequest, limits: &Limits) -> Result<Specs, Error> {
    if req.timers.is_empty() {
        return Err(invalid("the batch holds no timers".into()));
    }
    if req.timers.len() > limits.max_batch {
        return Err(Error::ResourceExhausted(format!(
            "the batch holds {} timers; the limit is {}",
            req.timers.len(),
            limits.max_batch
        )));
    }
    let text = req
        .timers
        .iter()
        .map(|t| t.namespace.len() + t.id.len() + t.content_type.len());
    let payloads = req.timers.iter().map(|t| t.payload.len());
    let mut out = Specs::with_capacity(req.timers.len(), text.sum(), payloads.sum());
    for (i, t) in req.timers.iter().enumerate() {
        let creates_only = matches!(
            pb::CreateMode::try_from(t.mode),
            Ok(pb::CreateMode::Unspecified | pb::CreateMode::CreateOnly)
        ) && t.if_state == 0
            && t.if_revision == 0
            && t.max_wait_ms == 0
            && t.max_lateness_ms == 0
            && t.misfire == 0;
        if !creates_only {
            return Err(invalid(format!(
                "timers[{i}]: ScheduleBatch only creates (mode CREATE_ONLY, no if_state, \
                 if_revision, max_wait_ms or per-timer misfire): send those with Schedule"
            )));
        }
        out.push(spec_ref(t, limits).map_err(|e| prefix_error(e, &format!("timers[{i}]: ")))?);
    }
    // Keys borrowed from the specs, not copied: 10,000 of them per call.
    let mut seen = std::collections::HashSet::with_capacity(out.len());
    for (i, s) in out.iter().enumerate() {
        if !seen.insert(s.key) {
            return Err(invalid(format!(
                "timers[{i}]: {} appears twice in the batch",
                s.key
            )));
        }
    }
    Ok(out)
}

fn prefix_error(e: Error, prefix: &str) -> Error {
    match e {
        Error::InvalidArgument(m) => Error::InvalidArgument(format!("{prefix}{m}")),
        Error::ResourceExhausted(m) => Error::ResourceExhausted(format!("{prefix}{m}")),
        other => other,
    }
}

/// Validates a List request and decodes its page token.
pub fn list_query(req: &pb::ListRequest, limits: &Limits) -> Result<ListQuery, Error> {
    check_name("namespace", &req.namespace, limits.max_namespace_bytes)?;
    let state = state_from_pb(req.state)?;
    let limit = match req.limit as usize {
        0 => limits.default_list_limit,
        n if n > limits.max_list_limit => {
            return Err(invalid(format!(
                "limit {n} exceeds the maximum page size {}",
                limits.max_list_limit
            )))
        }
        n => n,
    };
    if req.fire_to_ms != 0 && req.fire_from_ms != 0 && req.fire_to_ms <= req.fire_from_ms {
        return Err(invalid(format!(
            "fire_to_ms {} must be after fire_from_ms {}",
            req.fire_to_ms, req.fire_from_ms
        )));
    }
    let after = match req.page_token.as_str() {
        "" => None,
        token => Some(decode_token(token)?),
    };
    let filter = ListFilter {
        state,
        fire_from_ms: (req.fire_from_ms != 0).then_some(req.fire_from_ms),
        fire_to_ms: (req.fire_to_ms != 0).then_some(req.fire_to_ms),
    };
    Ok(ListQuery {
        namespace: req.namespace.clone(),
        filter,
        after,
        limit,
    })
}

/// A page token is the hex of the last id returned: opaque to clients, exact for any id.
pub fn encode_token(id: &str) -> String {
    id.bytes().map(|b| format!("{b:02x}")).collect()
}

/// Longest page token this server issues: an id of at most 256 bytes, in hex (with room).
const MAX_TOKEN_CHARS: usize = 1024;

pub(crate) fn decode_token(token: &str) -> Result<String, Error> {
    let bad = || {
        // Not echoed: a token can be anything a client sends, of any length.
        invalid("page_token is not one this server issued (pass next_page_token as it came)".into())
    };
    // Checked as bytes before slicing, so a multi-byte character cannot split a slice.
    if token.len() > MAX_TOKEN_CHARS
        || !token.len().is_multiple_of(2)
        || !token.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return Err(bad());
    }
    let bytes = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&token[i..i + 2], 16).map_err(|_| bad()))
        .collect::<Result<Vec<u8>, Error>>()?;
    String::from_utf8(bytes).map_err(|_| bad())
}

pub fn state_to_pb(s: TimerState) -> pb::TimerState {
    match s {
        TimerState::Pending => pb::TimerState::Pending,
        TimerState::Fired => pb::TimerState::Fired,
        TimerState::Acked => pb::TimerState::Acked,
        TimerState::Cancelled => pb::TimerState::Cancelled,
        TimerState::Dead => pb::TimerState::Dead,
        TimerState::Expired => pb::TimerState::Expired,
    }
}

/// `None` for UNSPECIFIED (every state).
pub fn state_from_pb(v: i32) -> Result<Option<TimerState>, Error> {
    let s = pb::TimerState::try_from(v).map_err(|_| invalid(format!("unknown state {v}")))?;
    Ok(match s {
        pb::TimerState::Unspecified => None,
        pb::TimerState::Pending => Some(TimerState::Pending),
        pb::TimerState::Fired => Some(TimerState::Fired),
        pb::TimerState::Acked => Some(TimerState::Acked),
        pb::TimerState::Cancelled => Some(TimerState::Cancelled),
        pb::TimerState::Dead => Some(TimerState::Dead),
        pb::TimerState::Expired => Some(TimerState::Expired),
    })
}

impl From<Timer> for pb::Timer {
    fn from(t: Timer) -> pb::Timer {
        let phase = phase_to_pb(&t) as i32;
        let wake_at_ms = t.wake_at_ms;
        pb::Timer {
            namespace: t.key.namespace,
            id: t.key.id,
            fire_at_ms: t.fire_at_ms,
            payload: t.payload,
            state: state_to_pb(t.state) as i32,
            attempts: t.attempts,
            created_at_ms: t.created_at_ms,
            fired_at_ms: t.fired_at_ms,
            fire_index: t.fire_index,
            finished_at_ms: t.finished_at_ms,
            phase,
            wake_at_ms,
            last_delivered_at_ms: t.last_delivered_at_ms,
            timeouts: t.timeouts,
            nacks: t.nacks,
            redrives: t.redrives,
            content_type: t.content_type,
            attempt_log: t.attempt_log.into_iter().map(attempt_to_pb).collect(),
            series: None,
            revision: t.revision,
        }
    }
}

fn attempt_to_pb(r: AttemptRecord) -> pb::Attempt {
    let (outcome, http_status, grpc_code) = match r.outcome {
        Outcome::Acked => ("acked", 0, 0),
        Outcome::Nacked => ("nacked", 0, 0),
        Outcome::Expired => ("expired", 0, 0),
        Outcome::InFlight => ("in_flight", 0, 0),
        Outcome::Http(s) => ("http", s as u32, 0),
        Outcome::Grpc(c) => ("grpc", 0, c),
        Outcome::Timeout => ("timeout", 0, 0),
        Outcome::Connection => ("connection_error", 0, 0),
        Outcome::Misfired => ("misfired", 0, 0),
    };
    pb::Attempt {
        at_ms: r.at_ms,
        attempt: r.attempt,
        channel: match r.channel {
            Channel::Push => "push",
            Channel::Subscribe => "subscribe",
        }
        .into(),
        outcome: outcome.into(),
        http_status,
        grpc_code,
        latency_ms: r.latency_ms,
        detail: r.detail,
    }
}

fn phase_to_pb(t: &Timer) -> pb::DeliveryPhase {
    match (t.state, t.phase) {
        (TimerState::Fired, Phase::Ready) => pb::DeliveryPhase::Ready,
        (TimerState::Fired, Phase::InFlight) => pb::DeliveryPhase::InFlight,
        (TimerState::Fired, Phase::Backoff) => pb::DeliveryPhase::Backoff,
        _ => pb::DeliveryPhase::Unspecified,
    }
}

/// What a Redrive asks for.
pub enum RedriveTarget {
    One(TimerKey),
    /// Every DEAD timer of the namespace.
    All(String),
}

/// Validates a Redrive: a namespace and either an id or `all`, not both.
pub fn redrive_target(req: &pb::RedriveRequest, limits: &Limits) -> Result<RedriveTarget, Error> {
    match (req.id.is_empty(), req.all) {
        (false, false) => Ok(RedriveTarget::One(key(&req.namespace, &req.id, limits)?)),
        (true, true) => {
            check_name("namespace", &req.namespace, limits.max_namespace_bytes)?;
            Ok(RedriveTarget::All(req.namespace.clone()))
        }
        (false, true) => Err(invalid("give either an id or all = true, not both".into())),
        (true, false) => Err(invalid(
            "id must not be empty (or set all = true to redrive every DEAD timer)".into(),
        )),
    }
}

/// Validates the attempt of an Ack or Nack.
pub fn attempt(attempt: u32) -> Result<u32, Error> {
    if attempt == 0 {
        return Err(invalid(
            "attempt must be at least 1: use the attempt of the Delivery being acknowledged".into(),
        ));
    }
    Ok(attempt)
}

/// Validates an AckBatch: size, then each ack's key and attempt (a malformed ack fails the
/// whole call, so nothing of a broken batch is applied).
pub fn acks(req: &pb::AckBatchRequest, limits: &Limits) -> Result<Vec<(TimerKey, u32)>, Error> {
    if req.acks.is_empty() {
        return Err(invalid("the batch holds no acks".into()));
    }
    if req.acks.len() > limits.max_batch {
        return Err(Error::ResourceExhausted(format!(
            "the batch holds {} acks; the limit is {}",
            req.acks.len(),
            limits.max_batch
        )));
    }
    req.acks
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let at = |e: Error| invalid(format!("ack {i}: {e}"));
            Ok((
                key(&a.namespace, &a.id, limits).map_err(at)?,
                attempt(a.attempt).map_err(at)?,
            ))
        })
        .collect()
}

/// One ack's outcome in an AckBatch answer.
pub fn ack_result(r: Result<Timer, Error>) -> pb::AckResult {
    match r {
        Ok(timer) => pb::AckResult {
            timer: Some(timer.into()),
            code: 0,
            message: String::new(),
        },
        Err(e) => {
            let status = Status::from(e);
            pb::AckResult {
                timer: None,
                code: status.code() as i32,
                message: status.message().to_string(),
            }
        }
    }
}

pub mod modes;
pub mod policy;
pub mod recurring;

#[cfg(test)]
mod tests;
