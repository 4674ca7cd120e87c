//! The domain: a timer, its key, its spec and its states. What a log entry asks of them is
//! `command`'s vocabulary, a floor above.
//!
//! A timer's life: `Pending` → `Fired` (the fire cursor passes it) → `Acked` (an ack) or `Dead`
//! (its last delivery's ack deadline passed), or `Pending` → `Cancelled`. Only `Redrive` returns
//! a timer to `Pending`, and only from `Dead`. While `Fired`, a timer cycles through delivery
//! [`Phase`]s: `Ready` (waiting for a consumer) → `InFlight` (a lease handed it to a subscriber)
//! → `Backoff` (its ack deadline passed) → `Ready` again.
//!
//! A [`Timer`] is what clients see; the state machine stores rows and derives it (see
//! `storage`): most transitions are a cursor or a lease passing the timer, not a write to it.

use serde::{Deserialize, Serialize};

mod batch;
pub use batch::{KeyRef, SpecRef, Specs};

/// Where a timer lives in a namespace; the pair is unique.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TimerKey {
    pub namespace: String,
    pub id: String,
}

impl TimerKey {
    /// Its key in group `space`'s `index` and `series` families (`Space::timer_key`: the
    /// group and hash slot, then the name bytes).
    pub fn index_key(&self, space: crate::keys::Space) -> Vec<u8> {
        self.as_ref().index_key(space)
    }

    /// The key an `index` or `series` family key names; `None` if the bytes are not one.
    pub fn from_index_key(bytes: &[u8]) -> Option<TimerKey> {
        let (namespace, id) = crate::keys::decode_timer_key(bytes)?;
        Some(TimerKey { namespace, id })
    }

    /// Its name bytes (length-prefixed namespace, then the id): no group or hash slot, so
    /// stable across layouts and moves. A series' jitter hashes them; `series_due` holds them.
    pub fn name_bytes(&self) -> Vec<u8> {
        crate::keys::timer_name(&self.namespace, &self.id)
    }

    /// The key [`TimerKey::name_bytes`] wrote; `None` if the bytes are not one.
    pub fn from_name_bytes(bytes: &[u8]) -> Option<TimerKey> {
        let (namespace, id) = crate::keys::decode_timer_name(bytes)?;
        Some(TimerKey { namespace, id })
    }

    pub fn new(namespace: impl Into<String>, id: impl Into<String>) -> Self {
        TimerKey {
            namespace: namespace.into(),
            id: id.into(),
        }
    }
}

impl std::fmt::Display for TimerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_ref().fmt(f)
    }
}

/// A timer's state. Transitions are listed in the module essay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TimerState {
    Pending,
    Fired,
    Acked,
    Cancelled,
    Dead,
    /// Found too late to fire (misfire action `skip`); finished, never delivered.
    Expired,
}

impl TimerState {
    /// Upper-case name, as error messages and the CLI print it.
    pub fn name(self) -> &'static str {
        match self {
            TimerState::Pending => "PENDING",
            TimerState::Fired => "FIRED",
            TimerState::Acked => "ACKED",
            TimerState::Cancelled => "CANCELLED",
            TimerState::Dead => "DEAD",
            TimerState::Expired => "EXPIRED",
        }
    }
}

/// Where a FIRED timer is in its delivery cycle (meaningless in other states).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Phase {
    /// Fired, waiting for a subscriber with room; no attempt is spent meanwhile.
    Ready,
    /// Delivered as attempt `attempts`; `wake_at_ms` is the ack deadline.
    InFlight,
    /// The ack deadline passed (or it was nacked); `wake_at_ms` is the redelivery time.
    Backoff,
}

/// When a timer should fire, as the client said it. Kept so a retried Schedule can be
/// recognised as identical even when it was relative.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum When {
    /// Absolute Unix-epoch milliseconds; in the past means "fire now".
    At(i64),
    /// Milliseconds after the leader's clock when the entry was proposed.
    After(i64),
}

impl When {
    /// The absolute fire time, given the entry's `now_ms`.
    pub fn resolve(self, now_ms: i64) -> i64 {
        match self {
            When::At(t) => t,
            When::After(d) => now_ms.saturating_add(d),
        }
    }
}

/// A client's request to create one timer, validated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimerSpec {
    pub key: TimerKey,
    pub when: When,
    pub payload: Vec<u8>,
    /// The payload's media type, sent as a push's `content-type`; empty: the default
    /// ([`DEFAULT_CONTENT_TYPE`]).
    pub content_type: String,
}

/// The content type of a timer scheduled without one.
pub const DEFAULT_CONTENT_TYPE: &str = "application/octet-stream";

/// Longest wait a receiver's `Retry-After` can impose on a timer's next attempt (1 h): beyond
/// it the namespace's own backoff decides.
pub const MAX_RETRY_AFTER_MS: u64 = 3_600_000;
/// Attempts a timer's log keeps (the latest ones).
pub const ATTEMPT_LOG_LEN: usize = 10;
/// Bytes of an error body or message an attempt record keeps.
pub const ATTEMPT_DETAIL_BYTES: usize = 128;

/// How a delivery reached (or failed to reach) its receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Channel {
    Subscribe,
    Push,
}

/// What became of one delivery attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// A consumer acked it (Subscribe).
    Acked,
    /// A consumer nacked it (Subscribe).
    Nacked,
    /// Its ack deadline passed without an answer.
    Expired,
    /// Still in flight (derived, never stored).
    InFlight,
    /// The receiver answered with this HTTP status (2xx: acked).
    Http(u16),
    /// The receiver answered with this gRPC code (0: acked).
    Grpc(i32),
    /// The push request took longer than the namespace's timeout.
    Timeout,
    /// The receiver could not be reached (connect, TLS, a broken connection).
    Connection,
    /// Not delivered: it fired later than its misfire policy's `max_lateness_ms` allows.
    Misfired,
}

/// One line of a timer's attempt log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// The leader's clock when the outcome was known.
    pub at_ms: i64,
    pub attempt: u32,
    pub channel: Channel,
    pub outcome: Outcome,
    /// From the delivery to the outcome.
    pub latency_ms: u32,
    /// The first bytes of an error body or message; empty when there was none.
    pub detail: String,
}

impl AttemptRecord {
    /// Bounds `detail` to [`ATTEMPT_DETAIL_BYTES`] (at a character boundary).
    pub fn bounded(mut self) -> AttemptRecord {
        if self.detail.len() > ATTEMPT_DETAIL_BYTES {
            let mut end = ATTEMPT_DETAIL_BYTES;
            while !self.detail.is_char_boundary(end) {
                end -= 1;
            }
            self.detail.truncate(end);
        }
        self
    }
}

/// Appends `record` to `log`, keeping the latest [`ATTEMPT_LOG_LEN`].
pub fn log_attempt(log: &mut Vec<AttemptRecord>, record: AttemptRecord) {
    if log.len() >= ATTEMPT_LOG_LEN {
        log.drain(..=log.len() - ATTEMPT_LOG_LEN);
    }
    log.push(record.bounded());
}

/// A timer as stored in the state machine and returned to clients.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timer {
    pub key: TimerKey,
    pub fire_at_ms: i64,
    pub payload: Vec<u8>,
    pub state: TimerState,
    /// Deliveries made so far.
    pub attempts: u32,
    pub created_at_ms: i64,
    /// The leader's clock in the Fire entry that fired it; 0 before.
    pub fired_at_ms: i64,
    /// Log index of the Fire entry that fired it; 0 before. The consumers' dedup token.
    pub fire_index: u64,
    /// When it became ACKED, CANCELLED or DEAD; 0 before.
    pub finished_at_ms: i64,
    /// The `when` of the Schedule that created it, for recognising retries.
    pub scheduled_when: When,
    /// Delivery phase while FIRED.
    pub phase: Phase,
    /// When it next changes by itself: its fire time (PENDING), ack deadline (IN_FLIGHT),
    /// redelivery time (BACKOFF), or the earliest it may be purged (finished); 0 while READY.
    pub wake_at_ms: i64,
    /// `attempts` when it was last redriven: `max_attempts` counts from here, while `attempts`
    /// keeps growing so (namespace, id, attempt) never repeats.
    pub attempt_base: u32,
    /// Attempt history: the last delivery's time, explicit nacks, ack deadlines that passed,
    /// and redrives.
    pub last_delivered_at_ms: i64,
    pub nacks: u32,
    pub timeouts: u32,
    pub redrives: u32,
    /// The payload's media type; empty: [`DEFAULT_CONTENT_TYPE`].
    pub content_type: String,
    /// The latest attempts, oldest first (at most [`ATTEMPT_LOG_LEN`]).
    pub attempt_log: Vec<AttemptRecord>,
    /// 1 at creation, +1 for every change of its spec or state (reschedule, upsert, fire,
    /// ack, cancel, DEAD, redrive); redeliveries do not count. What `if_revision` compares.
    pub revision: u64,
}

impl Timer {
    /// A new PENDING timer for `spec`, created at `now_ms`; not yet placed on the wheel.
    pub fn pending(spec: TimerSpec, now_ms: i64) -> Timer {
        Timer {
            fire_at_ms: spec.when.resolve(now_ms),
            key: spec.key,
            payload: spec.payload,
            state: TimerState::Pending,
            attempts: 0,
            created_at_ms: now_ms,
            fired_at_ms: 0,
            fire_index: 0,
            finished_at_ms: 0,
            scheduled_when: spec.when,
            phase: Phase::Ready,
            wake_at_ms: spec.when.resolve(now_ms),
            attempt_base: 0,
            last_delivered_at_ms: 0,
            nacks: 0,
            timeouts: 0,
            redrives: 0,
            content_type: spec.content_type,
            attempt_log: Vec::new(),
            revision: 1,
        }
    }

    /// Whether the timer is finished (ACKED, CANCELLED or DEAD): it waits only to be purged.
    pub fn finished(&self) -> bool {
        matches!(
            self.state,
            TimerState::Acked | TimerState::Cancelled | TimerState::Dead | TimerState::Expired
        )
    }

    /// Whether `spec` asks for this timer, so that a create-only Schedule of it answers
    /// `created = false`: the same payload and content type, and either the same request
    /// (a relative one retried later resolves to another time, and is still the same) or an
    /// absolute time equal to the timer's fire time (the `fire_at_ms` a first, relative
    /// Schedule returned, sent back).
    pub fn same_request<'s>(&self, spec: impl Into<SpecRef<'s>>) -> bool {
        let spec = spec.into();
        let same_time = self.scheduled_when == spec.when
            || matches!(spec.when, When::At(t) if t == self.fire_at_ms);
        same_time && self.payload == spec.payload && self.content_type == spec.content_type
    }
}

#[cfg(test)]
mod tests {
    use super::TimerKey;

    /// A key's place in the `index` family names it again (the wheel's encoding, read back).
    #[test]
    fn a_timer_key_round_trips_through_its_index_key() {
        for key in [("a", "b"), ("", "x"), ("ns", ""), ("名前", "ид/1")] {
            let key = TimerKey::new(key.0, key.1);
            assert_eq!(
                TimerKey::from_index_key(&key.index_key(crate::keys::Space::of(5))),
                Some(key.clone())
            );
            assert_eq!(TimerKey::from_name_bytes(&key.name_bytes()), Some(key));
        }
    }
}
