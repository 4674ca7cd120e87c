//! The domain: a timer, its states, and the replicated vocabulary (`Command`, `Response`).
//!
//! A `Command` is what a log entry carries; applying it is the only way state changes. Commands
//! that need the time carry it (`now_ms`, stamped by the leader from `Clock`), so apply is a pure
//! function of the log. Every command is idempotent in the sense DESIGN asks for: replaying a
//! forwarded retry cannot create a second timer or a second transition.
//!
//! A timer's life: `Pending` → `Fired` (a Fire entry) → `Acked` (an Ack entry) or `Dead` (its
//! last delivery's ack deadline passed), or `Pending` → `Cancelled`. Only `Redrive` returns a
//! timer to `Pending`, and only from `Dead`. While `Fired`, a timer cycles through delivery
//! [`Phase`]s: `Ready` (waiting for a consumer) → `InFlight` (a Deliver entry handed it to a
//! subscriber) → `Backoff` (its ack deadline passed) → `Ready` again.
//!
//! Every timer has at most one wheel entry, at `bucket`, due at `wake_at_ms`: its fire time while
//! PENDING, its ack deadline while in flight, its redelivery time in backoff, and its purge time
//! once finished. A `Ready` timer has none: it waits in the ready queue instead.

use serde::{Deserialize, Serialize};

use crate::namespace::{Namespace, Policy};

/// Where a timer lives in a namespace; the pair is unique.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TimerKey {
    pub namespace: String,
    pub id: String,
}

impl TimerKey {
    pub fn new(namespace: impl Into<String>, id: impl Into<String>) -> Self {
        TimerKey {
            namespace: namespace.into(),
            id: id.into(),
        }
    }
}

impl std::fmt::Display for TimerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.id)
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
        }
    }
}

/// Where a FIRED timer is in its delivery cycle (meaningless in other states).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Phase {
    /// Waiting in the ready queue for a subscriber with room; no attempt is spent meanwhile.
    Ready,
    /// Delivered as attempt `attempts`; the wheel entry is the ack deadline.
    InFlight,
    /// The ack deadline passed; the wheel entry is the redelivery time.
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
    /// When its wheel entry is due (fire time, ack deadline, redelivery time or purge time).
    pub wake_at_ms: i64,
    /// The wheel bucket of its wheel entry (may be later than `wake_at_ms`'s bucket when that
    /// is already behind the wheel's floor: see `wheel`).
    pub bucket: u64,
    /// `attempts` when it was last redriven: `max_attempts` counts from here, while `attempts`
    /// keeps growing so (namespace, id, attempt) never repeats.
    pub attempt_base: u32,
    /// Attempt history: the last delivery's time, explicit nacks, ack deadlines that passed,
    /// and redrives.
    pub last_delivered_at_ms: i64,
    pub nacks: u32,
    pub timeouts: u32,
    pub redrives: u32,
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
            wake_at_ms: 0,
            bucket: 0,
            attempt_base: 0,
            last_delivered_at_ms: 0,
            nacks: 0,
            timeouts: 0,
            redrives: 0,
        }
    }

    /// Whether the timer has a wheel entry (every state but FIRED-and-ready has one).
    pub fn on_wheel(&self) -> bool {
        !(self.state == TimerState::Fired && self.phase == Phase::Ready)
    }

    /// Whether the timer is finished (ACKED, CANCELLED or DEAD): it waits only to be purged.
    pub fn finished(&self) -> bool {
        matches!(
            self.state,
            TimerState::Acked | TimerState::Cancelled | TimerState::Dead
        )
    }

    /// Whether `spec` repeats the Schedule that created this timer.
    pub fn same_request(&self, spec: &TimerSpec) -> bool {
        self.scheduled_when == spec.when && self.payload == spec.payload
    }
}

/// The replicated vocabulary: what one log entry asks the state machine to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Create a timer (idempotent on identical content).
    Schedule { now_ms: i64, spec: TimerSpec },
    /// Create many timers atomically: all or none.
    ScheduleBatch { now_ms: i64, specs: Vec<TimerSpec> },
    /// PENDING → CANCELLED. Cancelling a CANCELLED timer again succeeds (retries are harmless).
    Cancel { now_ms: i64, key: TimerKey },
    /// Move a PENDING timer to a new time.
    Reschedule {
        now_ms: i64,
        key: TimerKey,
        when: When,
    },
    /// Process every wheel entry due at `now_ms`, at most `max` of them, in key order: fire
    /// PENDING timers, expire ack deadlines, make backed-off timers ready, purge finished ones.
    Fire { now_ms: i64, max: u32 },
    /// Hand READY timers to subscribers: each becomes IN_FLIGHT with attempt + 1 and an ack
    /// deadline at `now_ms` + the namespace's ack timeout. Keys not READY any more are skipped.
    Deliver { now_ms: i64, keys: Vec<TimerKey> },
    /// FIRED → ACKED, if `attempt` is the latest delivery.
    Ack {
        now_ms: i64,
        key: TimerKey,
        attempt: u32,
    },
    /// Give up on delivery `attempt` now: redeliver after backoff (or DEAD at max attempts).
    Nack {
        now_ms: i64,
        key: TimerKey,
        attempt: u32,
    },
    /// DEAD → PENDING, due at `now_ms`. Keys that are not DEAD are skipped (and reported).
    Redrive { now_ms: i64, keys: Vec<TimerKey> },
    /// Set a namespace's policy (validated before proposing).
    PutNamespace { name: String, policy: Policy },
    /// Several client commands proposed together (one log entry, one fsync, one apply), each
    /// applied in order as if alone; never nested, never holds Fire or Deliver.
    Multi(Vec<Command>),
}

impl Command {
    /// Short name for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Schedule { .. } => "schedule",
            Command::ScheduleBatch { .. } => "schedule_batch",
            Command::Cancel { .. } => "cancel",
            Command::Reschedule { .. } => "reschedule",
            Command::Fire { .. } => "fire",
            Command::Deliver { .. } => "deliver",
            Command::Ack { .. } => "ack",
            Command::Nack { .. } => "nack",
            Command::Redrive { .. } => "redrive",
            Command::PutNamespace { .. } => "put_namespace",
            Command::Multi(_) => "multi",
        }
    }
}

/// Why a command was rejected at apply time. Deterministic: every replica rejects alike.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Rejection {
    NotFound(TimerKey),
    /// A different timer holds the key.
    AlreadyExists(TimerKey),
    /// The timer is not in a state the command accepts.
    WrongState {
        key: TimerKey,
        state: TimerState,
    },
    /// An ack or nack that does not apply to the timer as it is; `why` completes "timer {key} …".
    Refused {
        key: TimerKey,
        why: String,
    },
}

/// What applying a command produced; returned to the proposer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// Membership and blank entries.
    None,
    /// Schedule, Cancel, Reschedule: the timer after the command; `created` for Schedule.
    Timer {
        timer: Timer,
        created: bool,
    },
    /// ScheduleBatch: one (timer, created) per spec, in request order.
    Batch(Vec<(Timer, bool)>),
    /// Fire: how many wheel entries were processed, and whether due ones remain past `max`.
    Fired {
        count: u32,
        more: bool,
    },
    /// Deliver: one entry per requested key, in order; `None` if it was not READY any more.
    Delivered(Vec<Option<Timer>>),
    /// Redrive: the timers now PENDING again, and the keys skipped (with their state).
    Redriven {
        timers: Vec<Timer>,
        skipped: Vec<(TimerKey, Option<TimerState>)>,
    },
    /// PutNamespace: the namespace as stored.
    Namespace(Namespace),
    /// Multi: one response per command, in order.
    Multi(Vec<Response>),
    Rejected(Rejection),
}

impl Rejection {
    /// Converts to the error the client sees, with a message a person understands.
    pub fn into_error(self) -> crate::Error {
        use crate::Error;
        match self {
            Rejection::NotFound(k) => Error::NotFound(format!("timer {k} not found")),
            Rejection::AlreadyExists(k) => Error::AlreadyExists(format!(
                "timer {k} already exists with a different fire time or payload"
            )),
            Rejection::WrongState { key, state } => Error::FailedPrecondition(format!(
                "timer {key} is {} (only PENDING timers can be changed)",
                state.name()
            )),
            Rejection::Refused { key, why } => {
                Error::FailedPrecondition(format!("timer {key} {why}"))
            }
        }
    }
}
