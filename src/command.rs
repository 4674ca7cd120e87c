//! The log's vocabulary: what one entry asks the state machine to do ([`Command`]) and what
//! applying it answers ([`Response`]), apart from the domain types they speak of (`timer`,
//! `namespace`, `series`, `auth`).
//!
//! A command is what a log entry carries; applying it is the only way state changes. Commands
//! that need the time carry it (`now_ms`, stamped by the leader from `Clock`), so apply is a
//! pure function of the log. Every command is idempotent in the sense DESIGN asks for:
//! replaying a forwarded retry cannot create a second timer or a second transition.
//!
//! The encoding is the log's and the snapshot's format (bincode, variant by index): a variant
//! is never removed or reordered, only added at the end, and each one added after the first
//! release has a feature level ([`Command::level`], [`LEVEL`]) so a leader proposes it only
//! once every member can read it (`cluster::level`). `storage/tests/forms.rs` pins the bytes of
//! every form.
//!
//! **Folded forms.** A Schedule, a Cancel and a Reschedule are each one command with optional
//! conditions ([`Command::Schedule`] with its [`Options`], [`Command::Cancel`] and
//! [`Command::Reschedule`] with a [`Cond`] that may be unset), and a node has one verb for each.
//! Their first, unconditional forms (`LegacySchedule`, `LegacyCancel`, `LegacyReschedule`,
//! variants 0, 2 and 3) stay in the enum because older logs and snapshots hold them: they are
//! read and applied exactly as the folded command with nothing set (`storage/tests/folded.rs`
//! proves it, step by step and from a data directory's log), and never proposed again.
//! The folded commands are the conditional variants of issue 32 (18, 19, 20), already of level
//! 0, so the fold needed no new storage format: every build since reads what this one writes,
//! and this one reads every older log. A new variant would have bought nothing a reader sees
//! and cost a level, a rolling-upgrade window and a format older builds refuse. (`name()` keeps
//! each form's name in the log: `schedule` is the legacy form, `schedule_with` the folded.)

use serde::{Deserialize, Serialize};

use crate::namespace::Policy;
use crate::timer::{AttemptRecord, Specs, TimerKey, TimerSpec, TimerState, When};
use crate::wheel::Slot;

/// The level of this build: 1 added `ConfigureNamespace`, `ZoneRules` (with
/// `RecurringChange::Pause`), `FireWithZones` and `RaiseLevel`. They came in over several commits
/// of issue 33, none released: level 1 is the set at that resolution. From then on a
/// form, or a nested variant, added after a release takes a new level; `storage/tests/forms.rs`
/// pins the bytes of every form so a change to an older one is caught.
/// 2 added `Policy` (issue 36: policies in the data groups' logs).
pub const LEVEL: u32 = 2;

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
    /// The first form of a create-only [`Command::Schedule`]: read from older logs, applied
    /// as that, never proposed (see the module's "Folded forms").
    LegacySchedule { now_ms: i64, spec: TimerSpec },
    /// Create many timers atomically: all or none.
    ScheduleBatch { now_ms: i64, specs: Specs },
    /// The first form of an unconditional [`Command::Cancel`]: read, never proposed.
    LegacyCancel { now_ms: i64, key: TimerKey },
    /// The first form of an unconditional [`Command::Reschedule`] to a time: read, never
    /// proposed.
    LegacyReschedule {
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
    ScheduleRecurring {
        now_ms: i64,
        spec: crate::recurring::RecurringSpec,
    },
    /// Pause (remove its pending occurrence) or resume (plan the next after `now_ms`) a series.
    PauseRecurring {
        now_ms: i64,
        key: TimerKey,
        paused: bool,
    },
    /// Create a timer (idempotent on identical content), or, with a mode, change the PENDING
    /// one that has its key if `with.cond` holds; the timer with its own misfire policy if
    /// `with.misfire` is set. `Options::default()` is a plain create-only Schedule.
    Schedule {
        now_ms: i64,
        spec: TimerSpec,
        with: Options,
    },
    /// PENDING → CANCELLED, if `cond` holds (unset: always; a series: deleted). Cancelling a
    /// CANCELLED timer again succeeds (retries are harmless).
    Cancel {
        now_ms: i64,
        key: TimerKey,
        cond: Cond,
    },
    /// Move a PENDING timer (to a time, or by a shift of its stored time), if `cond` holds
    /// (unset: always).
    Reschedule {
        now_ms: i64,
        key: TimerKey,
        shift: Shift,
        cond: Cond,
    },
    /// Create a series, or replace an existing one's rule, payload and policies (keeping its
    /// counters; its next occurrence planned anew after `now_ms`), if `cond` holds.
    UpsertRecurring {
        now_ms: i64,
        spec: crate::recurring::RecurringSpec,
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
    /// A series command (ScheduleRecurring, UpsertRecurring) with the time-zone rules its proposer
    /// computed with: the bundled tzdb's version and a fingerprint of its rules for the
    /// series' zone (0 for an interval). Every replica stores this stamp, not its own build's,
    /// so two builds write the same bytes; a replica whose rules for the zone differ stops
    /// instead of applying (docs/recurrence.md). The unstamped forms are older logs'.
    ZoneRules {
        tzdb: String,
        zone_fp: u64,
        change: RecurringChange,
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
    /// A namespace's configuration as group 0 holds it at `version` (the log index of group
    /// 0's entry that last changed it), for the data group owning the namespace's timers
    /// (docs/sharding.md §2): applied only if newer than the group's copy, so a repeat or an
    /// older one changes nothing. A data group's apply reads only its own copy (DESIGN 8).
    Policy {
        name: String,
        version: u64,
        policy: Policy,
        push: Option<crate::namespace::PushTarget>,
        /// `Policy`'s encoding leaves the misfire policy out.
        misfire: crate::namespace::Misfire,
    },
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
pub enum RecurringChange {
    /// As `Command::ScheduleRecurring`.
    Schedule {
        now_ms: i64,
        spec: crate::recurring::RecurringSpec,
    },
    /// As `Command::UpsertRecurring`.
    Upsert {
        now_ms: i64,
        spec: crate::recurring::RecurringSpec,
        cond: Cond,
    },
    /// As `Command::PauseRecurring` (a resume plans the next occurrence: it needs the rules).
    Pause {
        now_ms: i64,
        key: TimerKey,
        paused: bool,
    },
}

impl RecurringChange {
    /// The series the change creates or replaces (None: a pause or resume of a stored one).
    pub fn spec(&self) -> Option<&crate::recurring::RecurringSpec> {
        match self {
            RecurringChange::Schedule { spec, .. } | RecurringChange::Upsert { spec, .. } => {
                Some(spec)
            }
            RecurringChange::Pause { .. } => None,
        }
    }

    /// The series it changes.
    pub fn key(&self) -> &TimerKey {
        match self {
            RecurringChange::Schedule { spec, .. } | RecurringChange::Upsert { spec, .. } => {
                &spec.key
            }
            RecurringChange::Pause { key, .. } => key,
        }
    }

    /// The plain command it stands for.
    pub fn into_command(self) -> Command {
        match self {
            RecurringChange::Schedule { now_ms, spec } => {
                Command::ScheduleRecurring { now_ms, spec }
            }
            RecurringChange::Upsert { now_ms, spec, cond } => {
                Command::UpsertRecurring { now_ms, spec, cond }
            }
            RecurringChange::Pause {
                now_ms,
                key,
                paused,
            } => Command::PauseRecurring {
                now_ms,
                key,
                paused,
            },
        }
    }

    fn name(&self) -> &'static str {
        match self {
            RecurringChange::Schedule { .. } => "schedule_series",
            RecurringChange::Upsert { .. } => "upsert_series",
            RecurringChange::Pause { .. } => "pause_series",
        }
    }
}

impl Command {
    /// `change` stamped with this build's time-zone rules for its series' zone.
    pub fn with_zone_rules(change: RecurringChange) -> Command {
        Command::ZoneRules {
            tzdb: crate::recurring::tzdb_version().to_string(),
            zone_fp: change.spec().map_or(0, |s| s.recurrence.zone_fingerprint()),
            change,
        }
    }
}

/// How a Schedule treats a PENDING timer that already has the key ([`Options::mode`]; none:
/// create-only).
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

/// How a [`Command::Schedule`] treats a timer that already has its key, and the new timer's
/// own misfire policy. Encoded as its three fields in a row (the bytes of the
/// `schedule_with` form since it was added).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Options {
    /// `None`: create-only (the same timer again is answered, another refused).
    pub mode: Option<Mode>,
    pub cond: Cond,
    pub misfire: Option<crate::namespace::Misfire>,
}

impl Options {
    /// A plain create-only Schedule's: no mode, no condition, the namespace's misfire policy.
    pub fn is_plain(&self) -> bool {
        self.mode.is_none() && !self.cond.is_set() && self.misfire.is_none()
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
            Command::LegacySchedule { spec, .. } => Some(&spec.key),
            Command::ScheduleRecurring { spec, .. } => Some(&spec.key),
            Command::Schedule { spec, .. } => Some(&spec.key),
            Command::UpsertRecurring { spec, .. } => Some(&spec.key),
            Command::ZoneRules { change, .. } => Some(change.key()),
            Command::LegacyCancel { key, .. }
            | Command::Cancel { key, .. }
            | Command::Reschedule { key, .. }
            | Command::PauseRecurring { key, .. }
            | Command::LegacyReschedule { key, .. }
            | Command::Ack { key, .. }
            | Command::Nack { key, .. }
            | Command::Pushed { key, .. } => Some(key),
            _ => None,
        }
    }

    /// What a person reads in a log line or a refusal: [`Command::name`], but a plain
    /// folded command says what it does (`schedule`, not `schedule_with`, which names the
    /// form that carries it).
    pub fn label(&self) -> &'static str {
        match self {
            Command::Schedule { with, .. } if with.is_plain() => "schedule",
            Command::Cancel { cond, .. } if !cond.is_set() => "cancel",
            Command::Reschedule { cond, .. } if !cond.is_set() => "reschedule",
            other => other.name(),
        }
    }

    /// The form's name: one per variant, pinned by `forms.golden` (the folded forms keep the
    /// names of the conditional forms they are, byte for byte).
    pub fn name(&self) -> &'static str {
        match self {
            Command::LegacySchedule { .. } => "schedule",
            Command::ScheduleBatch { .. } => "schedule_batch",
            Command::LegacyCancel { .. } => "cancel",
            Command::LegacyReschedule { .. } => "reschedule",
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
            Command::ScheduleRecurring { .. } => "schedule_series",
            Command::PauseRecurring { .. } => "pause_series",
            Command::Schedule { .. } => "schedule_with",
            Command::Cancel { .. } => "cancel_if",
            Command::Reschedule { .. } => "reschedule_if",
            Command::UpsertRecurring { .. } => "upsert_series",
            Command::SetNamespace { .. } => "set_namespace",
            Command::ConfigureNamespace { .. } => "configure_namespace",
            Command::ZoneRules { change, .. } => change.name(),
            Command::RaiseLevel { .. } => "raise_level",
            Command::Policy { .. } => "policy",
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
            other => f.write_str(other.label()),
        }
    }
}

impl Command {
    /// The lowest feature level whose builds can decode this command. Every variant is named
    /// (no catch-all): a new one makes its author choose.
    pub fn level(&self) -> u32 {
        match self {
            Command::ConfigureNamespace { .. }
            | Command::ZoneRules { .. }
            | Command::FireWithZones { .. } => 1,
            // A build below `level` must not take it: it could not read what follows.
            Command::RaiseLevel { level } => (*level).max(1),
            Command::Policy { .. } => 2,
            Command::Multi(commands) => commands.iter().map(Command::level).max().unwrap_or(0),
            Command::LegacySchedule { .. }
            | Command::ScheduleBatch { .. }
            | Command::LegacyCancel { .. }
            | Command::LegacyReschedule { .. }
            | Command::Fire { .. }
            | Command::Deliver { .. }
            | Command::Ack { .. }
            | Command::Acks { .. }
            | Command::Nack { .. }
            | Command::Pushed { .. }
            | Command::PauseNamespace { .. }
            | Command::Redrive { .. }
            | Command::PutNamespace { .. }
            | Command::Purge { .. }
            | Command::Access(_)
            | Command::ScheduleRecurring { .. }
            | Command::PauseRecurring { .. }
            | Command::Schedule { .. }
            | Command::Cancel { .. }
            | Command::Reschedule { .. }
            | Command::UpsertRecurring { .. }
            | Command::SetNamespace { .. } => 0,
        }
    }
}

mod answer;
pub use answer::{BatchAnswer, Rejection, Response, Scheduled};

#[cfg(test)]
mod tests;
