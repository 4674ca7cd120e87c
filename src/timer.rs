//! The domain: a timer, its states, and the replicated vocabulary (`Command`, `Response`).
//!
//! A `Command` is what a log entry carries; applying it is the only way state changes. Commands
//! that need the time carry it (`now_ms`, stamped by the leader from `Clock`), so apply is a pure
//! function of the log. Every command is idempotent in the sense DESIGN asks for: replaying a
//! forwarded retry cannot create a second timer or a second transition.
//!
//! A timer's life: `Pending` → `Fired` (the fire cursor passes it) → `Acked` (an ack) or `Dead`
//! (its last delivery's ack deadline passed), or `Pending` → `Cancelled`. Only `Redrive` returns
//! a timer to `Pending`, and only from `Dead`. While `Fired`, a timer cycles through delivery
//! [`Phase`]s: `Ready` (waiting for a consumer) → `InFlight` (a lease handed it to a subscriber)
//! → `Backoff` (its ack deadline passed) → `Ready` again.
//!
//! A [`Timer`] is what clients see; the state machine stores rows and derives it (see
//! `storage`): most transitions are a cursor or a lease passing the timer, not a write to it.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::namespace::{Namespace, Policy};
use crate::wheel::Slot;

mod batch;
pub use batch::{KeyRef, SpecRef, Specs};

/// Where a timer lives in a namespace; the pair is unique.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TimerKey {
    pub namespace: String,
    pub id: String,
}

impl TimerKey {
    /// Its key in the `index` family (length-prefixed namespace, then the id).
    pub fn index_key(&self) -> Vec<u8> {
        self.as_ref().index_key()
    }

    /// The key an `index` family key names; `None` if the bytes are not one.
    pub fn from_index_key(bytes: &[u8]) -> Option<TimerKey> {
        let (namespace, id) = crate::wheel::decode_timer_key(bytes)?;
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
    /// Set when this is a recurring timer (a series), not one timer: its rule, state and
    /// occurrences. Its `fire_at_ms` is then the next occurrence's.
    pub series: Option<Box<crate::series::SeriesView>>,
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
            series: None,
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

/// A request to hand a namespace's fired timers to a subscriber with room for `room` more.
/// `room` 0 hands out nothing: it only moves the delivery cursor over finished timers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub namespace: String,
    pub room: u32,
    /// For the leader's pusher (the lease's attempts are pushes), not a Subscribe stream.
    pub push: bool,
}

/// A lease as a grant made it: the fired timers of `namespace` between the slots `from`
/// (excluded) and `to` (included) that were deliverable, `count` of them, now in flight until
/// `deadline_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Granted {
    pub namespace: String,
    pub from: Slot,
    pub to: Slot,
    pub count: u32,
    pub deadline_ms: i64,
}

/// Names a lease: its namespace and the slot it ends at.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LeaseRef {
    pub namespace: String,
    pub to: Slot,
}

/// The replicated vocabulary: what one log entry asks the state machine to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Create a timer (idempotent on identical content).
    Schedule { now_ms: i64, spec: TimerSpec },
    /// Create many timers atomically: all or none.
    ScheduleBatch { now_ms: i64, specs: Specs },
    /// PENDING → CANCELLED. Cancelling a CANCELLED timer again succeeds (retries are harmless).
    Cancel { now_ms: i64, key: TimerKey },
    /// Move a PENDING timer to a new time.
    Reschedule {
        now_ms: i64,
        key: TimerKey,
        when: When,
    },
    /// Move the fire cursor over every row due at `now_ms` (whole buckets), at most `max` rows:
    /// PENDING timers it passes are fired, backed-off ones are ready again. Then expire the
    /// leases whose deadline passed, and make `grants` (Deliver fused into Fire).
    Fire {
        now_ms: i64,
        max: u32,
        grants: Vec<Grant>,
    },
    /// Hand fired timers to subscribers: each grant becomes a lease of up to `room` timers,
    /// in flight until `now_ms` + the namespace's ack timeout.
    Deliver { now_ms: i64, grants: Vec<Grant> },
    /// FIRED → ACKED, if `attempt` is the latest delivery.
    Ack {
        now_ms: i64,
        key: TimerKey,
        attempt: u32,
    },
    /// Many acks in one command: `leases` acked whole (every delivery of each was acked), then
    /// `acks` one by one, each judged as `Ack` would judge it.
    Acks {
        now_ms: i64,
        leases: Vec<LeaseRef>,
        acks: Vec<(TimerKey, u32)>,
    },
    /// Give up on delivery `attempt` now: redeliver after backoff (or DEAD at max attempts).
    Nack {
        now_ms: i64,
        key: TimerKey,
        attempt: u32,
    },
    /// The outcome of push `attempt` (`record`): `ok` acks it, otherwise it is given back as by
    /// a nack, or made DEAD at once with `dead`. The record goes into the attempt log.
    Pushed {
        now_ms: i64,
        key: TimerKey,
        attempt: u32,
        ok: bool,
        dead: bool,
        /// The receiver's `Retry-After` (gRPC: `grpc-retry-pushback-ms`), in ms from `now_ms`;
        /// 0: none. The next attempt waits at least this long (at most [`MAX_RETRY_AFTER_MS`]).
        retry_after_ms: u64,
        record: AttemptRecord,
    },
    /// Pause or resume a namespace's dispatching (its timers keep firing).
    PauseNamespace { name: String, paused: bool },
    /// DEAD → PENDING, due at `now_ms`. Keys that are not DEAD are skipped (and reported).
    Redrive { now_ms: i64, keys: Vec<TimerKey> },
    /// Set a namespace's policy (validated before proposing).
    PutNamespace {
        name: String,
        policy: Policy,
        push: Option<crate::namespace::PushTarget>,
    },
    /// Delete `namespace`'s finished timers up to the slot `through` (a lease's end), once every
    /// lease up to it settled at least the namespace's retention before `now_ms`.
    Purge {
        now_ms: i64,
        namespace: String,
        through: Slot,
    },
    /// Several client commands proposed together (one log entry, one fsync, one apply), each
    /// applied in order as if alone; never nested, never holds Fire, Deliver or Purge. (Bytes
    /// that nest it are refused while they are decoded: see [`not_nested`].)
    Multi(#[serde(deserialize_with = "not_nested")] Vec<Command>),
    /// Change the access state: put or revoke a key, switch auth on or off (`crate::auth`).
    Access(crate::auth::AccessChange),
    /// Create a recurring timer and its first occurrence (idempotent on identical content).
    ScheduleSeries {
        now_ms: i64,
        spec: crate::series::SeriesSpec,
    },
    /// Pause (remove its pending occurrence) or resume (plan the next after `now_ms`) a series.
    PauseSeries {
        now_ms: i64,
        key: TimerKey,
        paused: bool,
    },
    /// Schedule in `mode` (`None`: create-only) if `cond` holds, the timer with its own
    /// misfire policy if `misfire` is set.
    ScheduleWith {
        now_ms: i64,
        spec: TimerSpec,
        mode: Option<Mode>,
        cond: Cond,
        misfire: Option<crate::namespace::Misfire>,
    },
    /// PENDING -> CANCELLED, if `cond` holds (a series: deleted).
    CancelIf {
        now_ms: i64,
        key: TimerKey,
        cond: Cond,
    },
    /// Move a PENDING timer (to a time, or by a shift of its stored time), if `cond` holds.
    RescheduleIf {
        now_ms: i64,
        key: TimerKey,
        shift: Shift,
        cond: Cond,
    },
    /// Create a series, or replace an existing one's rule, payload and policies (keeping its
    /// counters; its next occurrence planned anew after `now_ms`), if `cond` holds.
    UpsertSeries {
        now_ms: i64,
        spec: crate::series::SeriesSpec,
        cond: Cond,
    },
    /// PutNamespace with the misfire policy (which `Policy`'s encoding leaves out).
    SetNamespace {
        name: String,
        policy: Policy,
        push: Option<crate::namespace::PushTarget>,
        misfire: crate::namespace::Misfire,
    },
    /// PutNamespace as proposed since issue 33 (SetNamespace is kept for the logs of older
    /// builds). What it keeps of the namespace is resolved when it applies, against the
    /// namespace as it is then — the paused flag always; the push secrets when `keep_secrets`
    /// and the namespace already has a target — never read by the proposer: a Pause or a
    /// rotation committed between the two would be undone. `push`'s secrets are those a
    /// target gets when it keeps none (generated on the leader, so every replica stores the
    /// same).
    ConfigureNamespace {
        name: String,
        policy: Policy,
        push: Option<crate::namespace::PushTarget>,
        misfire: crate::namespace::Misfire,
        keep_secrets: bool,
    },
    /// A series command (ScheduleSeries, UpsertSeries) with the time-zone rules its proposer
    /// computed with: the bundled tzdb's version and a fingerprint of its rules for the
    /// series' zone (0 for an interval). Every replica stores this stamp, not its own build's,
    /// so two builds write the same bytes; a replica whose rules for the zone differ stops
    /// instead of applying (docs/recurrence.md). The unstamped forms are older logs'.
    ZoneRules {
        tzdb: String,
        zone_fp: u64,
        change: SeriesChange,
    },
    /// `Fire`, naming the proposer's tzdb version: a replica of that version computes the
    /// series it fires with its own rules and stamps them on the rows (so a cluster that
    /// finished an upgrade moves its rows to the new rules instead of stopping); one of
    /// another version computes only a row stamped with that version whose rules for the zone
    /// are its own, and stops otherwise (docs/recurrence.md).
    FireWithZones {
        tzdb: String,
        now_ms: i64,
        max: u32,
        grants: Vec<Grant>,
    },
    /// Raises the cluster's committed feature level to `level` (never lowers it): proposed
    /// once every member advertised it, so later leaders propose that level's forms without
    /// having heard every member themselves (`cluster/level.rs`).
    RaiseLevel { level: u32 },
}

thread_local! {
    /// How many `Multi`s the decoder on this thread is inside.
    static MULTI_DEPTH: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// A `Multi`'s commands, refused if one is a `Multi` itself: bincode has no depth limit, and
/// a peer's bytes nesting Multis a hundred thousand deep (a few hundred KB) would overflow
/// the decoding thread's stack, which kills the process.
fn not_nested<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Command>, D::Error> {
    struct Inside;
    impl Drop for Inside {
        fn drop(&mut self) {
            MULTI_DEPTH.with(|c| c.set(c.get() - 1));
        }
    }
    let depth = MULTI_DEPTH.with(|c| {
        c.set(c.get() + 1);
        c.get()
    });
    let _inside = Inside;
    if depth > 1 {
        return Err(serde::de::Error::custom("a Multi inside a Multi"));
    }
    Vec::<Command>::deserialize(d)
}

/// The series commands a `ZoneRules` carries. Not a `Command`: a command inside a command
/// could nest without end, and decoding such bytes (a peer's) would overflow the stack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SeriesChange {
    /// As `Command::ScheduleSeries`.
    Schedule {
        now_ms: i64,
        spec: crate::series::SeriesSpec,
    },
    /// As `Command::UpsertSeries`.
    Upsert {
        now_ms: i64,
        spec: crate::series::SeriesSpec,
        cond: Cond,
    },
    /// As `Command::PauseSeries` (a resume plans the next occurrence: it needs the rules).
    Pause {
        now_ms: i64,
        key: TimerKey,
        paused: bool,
    },
}

impl SeriesChange {
    /// The series the change creates or replaces (None: a pause or resume of a stored one).
    pub fn spec(&self) -> Option<&crate::series::SeriesSpec> {
        match self {
            SeriesChange::Schedule { spec, .. } | SeriesChange::Upsert { spec, .. } => Some(spec),
            SeriesChange::Pause { .. } => None,
        }
    }

    /// The series it changes.
    pub fn key(&self) -> &TimerKey {
        match self {
            SeriesChange::Schedule { spec, .. } | SeriesChange::Upsert { spec, .. } => &spec.key,
            SeriesChange::Pause { key, .. } => key,
        }
    }

    /// The plain command it stands for.
    pub fn into_command(self) -> Command {
        match self {
            SeriesChange::Schedule { now_ms, spec } => Command::ScheduleSeries { now_ms, spec },
            SeriesChange::Upsert { now_ms, spec, cond } => {
                Command::UpsertSeries { now_ms, spec, cond }
            }
            SeriesChange::Pause {
                now_ms,
                key,
                paused,
            } => Command::PauseSeries {
                now_ms,
                key,
                paused,
            },
        }
    }

    fn name(&self) -> &'static str {
        match self {
            SeriesChange::Schedule { .. } => "schedule_series",
            SeriesChange::Upsert { .. } => "upsert_series",
            SeriesChange::Pause { .. } => "pause_series",
        }
    }
}

impl Command {
    /// `change` stamped with this build's time-zone rules for its series' zone.
    pub fn with_zone_rules(change: SeriesChange) -> Command {
        Command::ZoneRules {
            tzdb: crate::series::tzdb_version().to_string(),
            zone_fp: change.spec().map_or(0, |s| s.recurrence.zone_fingerprint()),
            change,
        }
    }
}

/// How a Schedule treats a timer that already has the key (create-only is `Command::Schedule`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    /// Replace a PENDING timer's fire time and payload.
    Upsert,
    /// Push a PENDING timer's fire time to the new one (payload too) on every call, but never
    /// past its creation + `max_wait_ms` (0: no cap).
    Debounce { max_wait_ms: u64 },
    /// Keep the earlier of the stored and the new fire time (with that request's payload).
    KeepEarliest,
    /// Keep the later of the two.
    KeepLatest,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Upsert => "upsert",
            Mode::Debounce { .. } => "debounce",
            Mode::KeepEarliest => "keep_earliest",
            Mode::KeepLatest => "keep_latest",
        }
    }
}

/// A condition a change holds to: the timer is in `if_state`, at `if_revision` (either unset).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cond {
    pub if_state: Option<TimerState>,
    pub if_revision: Option<u64>,
}

impl Cond {
    pub fn is_set(&self) -> bool {
        self.if_state.is_some() || self.if_revision.is_some()
    }

    /// Why `t` fails the condition (`None`: it holds); completes "timer {key} …".
    pub fn refuses(&self, state: TimerState, revision: u64) -> Option<String> {
        match (self.if_state, self.if_revision) {
            (Some(want), _) if want != state => Some(format!(
                "is {} (revision {revision}), not {}",
                state.name(),
                want.name()
            )),
            (_, Some(want)) if want != revision => Some(format!(
                "is at revision {revision} ({}), not {want}",
                state.name()
            )),
            _ => None,
        }
    }
}

/// Where a Reschedule moves a timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Shift {
    To(When),
    /// Later than its stored fire time by this many ms.
    ExtendBy(i64),
    /// Earlier than its stored fire time by this many ms (a time in the past fires at once).
    PullIn(i64),
}

impl Command {
    /// The one timer a client command names, if it names one (what its apply looks up).
    pub fn timer_key(&self) -> Option<&TimerKey> {
        match self {
            Command::Schedule { spec, .. } => Some(&spec.key),
            Command::ScheduleSeries { spec, .. } => Some(&spec.key),
            Command::ScheduleWith { spec, .. } => Some(&spec.key),
            Command::UpsertSeries { spec, .. } => Some(&spec.key),
            Command::ZoneRules { change, .. } => Some(change.key()),
            Command::Cancel { key, .. }
            | Command::CancelIf { key, .. }
            | Command::RescheduleIf { key, .. }
            | Command::PauseSeries { key, .. }
            | Command::Reschedule { key, .. }
            | Command::Ack { key, .. }
            | Command::Nack { key, .. }
            | Command::Pushed { key, .. } => Some(key),
            _ => None,
        }
    }

    /// Short name for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Schedule { .. } => "schedule",
            Command::ScheduleBatch { .. } => "schedule_batch",
            Command::Cancel { .. } => "cancel",
            Command::Reschedule { .. } => "reschedule",
            Command::Fire { .. } | Command::FireWithZones { .. } => "fire",
            Command::Deliver { .. } => "deliver",
            Command::Ack { .. } => "ack",
            Command::Acks { .. } => "acks",
            Command::Nack { .. } => "nack",
            Command::Pushed { .. } => "pushed",
            Command::PauseNamespace { .. } => "pause_namespace",
            Command::Redrive { .. } => "redrive",
            Command::PutNamespace { .. } => "put_namespace",
            Command::Purge { .. } => "purge",
            Command::Multi(_) => "multi",
            Command::Access(_) => "access",
            Command::ScheduleSeries { .. } => "schedule_series",
            Command::PauseSeries { .. } => "pause_series",
            Command::ScheduleWith { .. } => "schedule_with",
            Command::CancelIf { .. } => "cancel_if",
            Command::RescheduleIf { .. } => "reschedule_if",
            Command::UpsertSeries { .. } => "upsert_series",
            Command::SetNamespace { .. } => "set_namespace",
            Command::ConfigureNamespace { .. } => "configure_namespace",
            Command::ZoneRules { change, .. } => change.name(),
            Command::RaiseLevel { .. } => "raise_level",
        }
    }
}

/// A one-line summary for logs (openraft 0.10 prints entries with it): the command's name,
/// and how many a batch holds — never its timers, which may be thousands.
impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::ScheduleBatch { specs, .. } => write!(f, "schedule_batch({})", specs.len()),
            Command::Multi(cmds) => write!(f, "multi({})", cmds.len()),
            Command::Acks { leases, acks, .. } => {
                write!(f, "acks({} leases, {})", leases.len(), acks.len())
            }
            Command::Redrive { keys, .. } => write!(f, "redrive({})", keys.len()),
            other => f.write_str(other.name()),
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
    /// An access change that does not apply to the access state as it is.
    Access(crate::Error),
    /// A condition (`if_state`, `if_revision`) the timer fails; `why` completes "timer {key} …".
    Condition {
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
    /// ScheduleBatch: one answer per spec, in request order.
    Batch(BatchAnswer),
    /// Fire: how many timers fired, whether due rows or expired leases remain past `max`,
    /// and one lease per grant, in order (`None`: nothing to hand out).
    Fired {
        count: u32,
        more: bool,
        leases: Vec<Option<Granted>>,
    },
    /// Deliver: one lease per grant, in order (`None`: nothing to hand out).
    Delivered(Vec<Option<Granted>>),
    /// Acks: per lease, whether it was acked whole (else ack its deliveries one by one); per
    /// ack, what `Ack` would have answered.
    Acked {
        leases: Vec<bool>,
        acks: Vec<Response>,
    },
    /// Purge: how many timers were deleted (0: nothing was due, or it was not allowed yet).
    Purged(u64),
    /// Redrive: the timers now PENDING again, and the keys skipped (with their state).
    Redriven {
        timers: Vec<Timer>,
        skipped: Vec<(TimerKey, Option<TimerState>)>,
    },
    /// PutNamespace: the namespace as stored.
    Namespace(Namespace),
    /// Multi: one response per command, in order.
    Multi(Vec<Response>),
    /// Access: whether auth is on after the change, and the key put or revoked.
    Access {
        enabled: bool,
        key: Option<crate::auth::Key>,
    },
    Rejected(Rejection),
}

/// What a ScheduleBatch did with each of its specs. The timers it created are not copied into
/// the answer: every replica applies the entry and only the proposer reads the answer, so it
/// shares the entry's command (an `Arc`) and [`BatchAnswer::results`] builds the views there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchAnswer {
    /// The entry's command: the ScheduleBatch, or (`at` = its place) the Multi holding it.
    pub command: Arc<Command>,
    pub at: Option<usize>,
    /// One per spec, in request order.
    pub items: Vec<Scheduled>,
}

/// A ScheduleBatch's answer for one spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Scheduled {
    /// Created now: `Timer::pending(spec, now_ms)`.
    Created,
    /// It existed with the same request (a retry): as it is.
    Existing(Box<Timer>),
    /// The same spec earlier in the batch, at this position: the same answer, not created.
    SameAs(usize),
}

impl BatchAnswer {
    /// Each spec's timer as the client sees it, and whether this batch created it.
    pub fn results(self) -> crate::Result<Vec<(Timer, bool)>> {
        let command = match (&*self.command, self.at) {
            (cmd, None) => cmd,
            (Command::Multi(cmds), Some(at)) => cmds.get(at).ok_or_else(|| {
                crate::Error::Internal(format!("a batch answer at {at} of {}", cmds.len()))
            })?,
            (cmd, Some(_)) => cmd,
        };
        let Command::ScheduleBatch { now_ms, specs } = command else {
            return Err(crate::Error::Internal(format!(
                "a batch answer for a {}",
                command.name()
            )));
        };
        if specs.len() != self.items.len() {
            return Err(crate::Error::Internal(format!(
                "a batch answer of {} for {} specs",
                self.items.len(),
                specs.len()
            )));
        }
        let mut out: Vec<(Timer, bool)> = Vec::with_capacity(specs.len());
        for (spec, item) in specs.iter().zip(self.items) {
            let result = match item {
                Scheduled::Created => (Timer::pending(spec.to_owned(), *now_ms), true),
                Scheduled::Existing(timer) => (*timer, false),
                Scheduled::SameAs(j) => match out.get(j) {
                    Some((timer, _)) => (timer.clone(), false),
                    None => {
                        return Err(crate::Error::Internal(format!(
                            "a batch answer refers ahead, to {j}"
                        )))
                    }
                },
            };
            out.push(result);
        }
        Ok(out)
    }
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
            Rejection::Access(e) => e,
            Rejection::Condition { key, why } => {
                Error::FailedPrecondition(format!("timer {key} {why}"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Command;
    use crate::codec::{decode, encode};

    /// Review of issue 33's change: bincode has no depth limit, so bytes nesting a command in
    /// a command a hundred thousand deep (a few hundred KB, from a peer) overflowed the
    /// decoding thread's stack and killed the process. A Multi inside a Multi is refused.
    #[test]
    fn deeply_nested_commands_are_refused_not_a_stack_overflow() {
        let empty = encode(&Command::Multi(vec![]));
        let one = encode(&Command::Multi(vec![Command::Multi(vec![])]));
        assert!(decode::<Command>(&empty).is_ok());
        let e = decode::<Command>(&one).expect_err("a Multi inside a Multi");
        assert!(e.to_string().contains("a Multi inside a Multi"), "{e}");
        let prefix = &one[..one.len() - empty.len()];
        let mut deep = prefix.repeat(100_000);
        deep.extend_from_slice(&empty);
        // On a thread with a tokio worker's stack (2 MiB), as the peer service decodes.
        let decoded = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || decode::<Command>(&deep).is_err())
            .unwrap()
            .join()
            .expect("the decoding thread died");
        assert!(decoded);
        // The depth count is back to 0: a proper Multi decodes after a refused one.
        assert!(decode::<Command>(&empty).is_ok());
    }

    /// Issue 34 part 5: a follower decodes a ScheduleBatch entry of n timers with a number of
    /// allocations that does not grow with n (it used to make three per timer: namespace, id,
    /// payload), and into the same specs.
    #[test]
    fn a_batch_decodes_without_an_allocation_per_timer() {
        let spec = |i: usize| super::TimerSpec {
            key: super::TimerKey::new("orders", format!("order-{i}")),
            when: super::When::At(1_000 + i as i64),
            payload: vec![i as u8; 32],
            content_type: if i.is_multiple_of(2) {
                String::new()
            } else {
                "text/plain".into()
            },
        };
        let mut counts = Vec::new();
        for n in [1_000, 8_000] {
            let batch = Command::ScheduleBatch {
                now_ms: 7,
                specs: (0..n).map(spec).collect::<Vec<_>>().into(),
            };
            let bytes = encode(&batch);
            let (decoded, allocations) =
                crate::alloc_count::allocations(|| decode::<Command>(&bytes).unwrap());
            assert_eq!(decoded, batch);
            counts.push(allocations);
        }
        // Growing buffers reallocate a few times more for 8 times the timers; nothing per timer.
        assert!(
            counts[0] <= 64,
            "{counts:?} allocations for 1,000 and 8,000 timers"
        );
        assert!(
            counts[1] <= counts[0] + 16,
            "{counts:?} allocations for 1,000 and 8,000 timers"
        );
    }

    /// A key's place in the `index` family names it again (the wheel's encoding, read back).
    #[test]
    fn a_timer_key_round_trips_through_its_index_key() {
        for key in [("a", "b"), ("", "x"), ("ns", ""), ("名前", "ид/1")] {
            let key = super::TimerKey::new(key.0, key.1);
            assert_eq!(super::TimerKey::from_index_key(&key.index_key()), Some(key));
        }
    }

    /// A log line names the command and counts a batch; it never lists the timers.
    #[test]
    fn a_command_displays_as_its_name_and_a_batch_as_its_size() {
        let ack = Command::Ack {
            now_ms: 1,
            key: super::TimerKey::new("ns", "id"),
            attempt: 1,
        };
        assert_eq!(ack.to_string(), "ack");
        let batch = Command::ScheduleBatch {
            now_ms: 1,
            specs: Default::default(),
        };
        assert_eq!(batch.to_string(), "schedule_batch(0)");
        assert_eq!(Command::Multi(vec![ack, batch]).to_string(), "multi(2)");
    }
}
