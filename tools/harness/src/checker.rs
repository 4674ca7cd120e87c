//! The checker: after the faults healed and the cluster went quiet, compares the history with
//! the final state and with the replicas' digests, and lists every broken guarantee.
//!
//! Each rule names the guarantee it checks (the `kind` of a violation). Unknown outcomes are
//! allowed to have happened or not, but never both: an unknown cancel may leave the timer
//! CANCELLED or fired, not CANCELLED *and* delivered.

use std::collections::{BTreeMap, HashMap, HashSet};

use timerdb::api::pb;

use crate::workload::{History, Kind, Op, Outcome};

#[derive(Debug, Clone)]
pub struct Violation {
    pub kind: &'static str,
    pub detail: String,
}

/// A window in which a node's clock was skewed (client-clock ms), for early-by-skew.
#[derive(Debug, Clone, Copy)]
pub struct SkewWindow {
    pub from_ms: i64,
    pub to_ms: i64,
}

/// What the checker found besides violations.
#[derive(Debug, Default)]
pub struct Findings {
    pub violations: Vec<Violation>,
    pub timers_checked: usize,
    pub early_by_skew: usize,
    pub unknown_resolved_done: usize,
    pub unknown_resolved_not_done: usize,
    /// Timers of the push namespace, requests its receiver got, and those it failed on purpose
    /// (500, too slow).
    pub push_timers: usize,
    pub push_requests: usize,
    pub push_failed: usize,
    /// Occurrences of recurring timers checked, and those the series counted as missed or
    /// skipped by their policies (`recurring.rs`).
    pub occurrences: usize,
    pub occurrences_missed: usize,
    pub occurrences_skipped: usize,
}

impl Findings {
    pub fn violate(&mut self, kind: &'static str, detail: String) {
        self.violations.push(Violation { kind, detail });
    }
}

fn state(t: &pb::Timer) -> pb::TimerState {
    pb::TimerState::try_from(t.state).unwrap_or(pb::TimerState::Unspecified)
}

/// Checks the history against the final state (`timers`, by id) and the per-node digests
/// ((node, applied index, digest)).
pub fn check(
    h: &History,
    timers: &BTreeMap<String, pb::Timer>,
    digests: &[(u64, u64, u64)],
    skews: &[SkewWindow],
    healed_ms: i64,
) -> Findings {
    let mut f = Findings {
        timers_checked: timers.len(),
        ..Findings::default()
    };
    converged(&mut f, digests);
    let ops_by_id = index_ops(h);
    no_phantoms(&mut f, timers, &ops_by_id);
    for op in &h.ops {
        check_op(&mut f, op, timers, skews);
    }
    fires(&mut f, timers, h, skews);
    acks(&mut f, timers, h);
    stream_acks(&mut f, h, healed_ms);
    refusals_did_nothing(&mut f, timers, h);
    shifts(&mut f, timers, h);
    f
}

/// A refusal means the call did nothing (guarantee 5): a timer whose every cancel was refused
/// is not CANCELLED (a conditional cancel applied, then repeated and refused, was both).
fn refusals_did_nothing(f: &mut Findings, timers: &BTreeMap<String, pb::Timer>, h: &History) {
    let mut cancels: HashMap<&str, Vec<&Op>> = HashMap::new();
    for op in &h.ops {
        if matches!(op.kind, Kind::Cancel | Kind::CancelIf) {
            cancels.entry(op.ids[0].as_str()).or_default().push(op);
        }
    }
    for (id, ops) in cancels {
        let refused = |o: &&Op| matches!(o.outcome, Outcome::Failed(..));
        let cancelled = timers
            .get(id)
            .is_some_and(|t| state(t) == pb::TimerState::Cancelled);
        if cancelled && ops.iter().all(refused) {
            f.violate(
                "refused cancel took effect",
                format!("{id} is CANCELLED, yet every cancel of it was refused: {ops:?}"),
            );
        }
    }
}

/// Every shift of a shift-only timer applied once if acknowledged, never if refused, at most
/// once if its outcome is unknown: its final fire time is its scheduled one plus the
/// acknowledged shifts plus some of the unknown ones.
fn shifts(f: &mut Findings, timers: &BTreeMap<String, pb::Timer>, h: &History) {
    let mut scheduled: HashMap<&str, i64> = HashMap::new();
    let mut by_id: HashMap<&str, (i64, Vec<i64>)> = HashMap::new();
    for op in &h.ops {
        let id = op.ids.first().map(String::as_str).unwrap_or("");
        if !id.starts_with(crate::workload::SHIFTED) {
            continue;
        }
        match (op.kind, &op.outcome) {
            (Kind::Schedule, _) => {
                scheduled.insert(id, op.fire_at[0]);
            }
            (Kind::Extend, Outcome::Ok(_)) => by_id.entry(id).or_default().0 += op.fire_at[0],
            (Kind::Extend, Outcome::Unknown(..)) => {
                by_id.entry(id).or_default().1.push(op.fire_at[0])
            }
            _ => {}
        }
    }
    for (id, (sure, unknown)) in by_id {
        let (Some(base), Some(t)) = (scheduled.get(id), timers.get(id)) else {
            continue;
        };
        if state(t) == pb::TimerState::Cancelled {
            continue;
        }
        // Every sum some of the unknown shifts make (few: at most a handful per timer).
        let mut sums = std::collections::BTreeSet::from([0i64]);
        for u in unknown.iter().take(16) {
            let more: Vec<i64> = sums.iter().map(|s| s + u).collect();
            sums.extend(more);
        }
        let got = t.fire_at_ms - base - sure;
        if !sums.contains(&got) {
            f.violate(
                "shift not applied once",
                format!(
                    "{id}: scheduled at {base}, shifted by {sure} acknowledged and {unknown:?} \
                     unknown, yet due at {} (off by {got})",
                    t.fire_at_ms
                ),
            );
        }
    }
}

fn converged(f: &mut Findings, digests: &[(u64, u64, u64)]) {
    if digests.len() < 3
        || digests
            .windows(2)
            .any(|w| (w[0].1, w[0].2) != (w[1].1, w[1].2))
    {
        f.violate(
            "replicas diverge",
            format!("(node, applied index, digest): {digests:?}"),
        );
    }
}

fn index_ops(h: &History) -> HashMap<&str, Vec<&Op>> {
    let mut by_id: HashMap<&str, Vec<&Op>> = HashMap::new();
    for op in &h.ops {
        for id in &op.ids {
            by_id.entry(id.as_str()).or_default().push(op);
        }
    }
    by_id
}

/// Every timer in the final state was asked for, with that payload and one of the fire times
/// a Schedule or Reschedule named.
fn no_phantoms(
    f: &mut Findings,
    timers: &BTreeMap<String, pb::Timer>,
    by_id: &HashMap<&str, Vec<&Op>>,
) {
    for (id, t) in timers {
        // Occurrences of recurring timers: no client op names them (the server refuses such
        // ids in a Schedule); `recurring::check` holds them to their series' rule.
        if timerdb::recurring::parse_occurrence(id).is_some() {
            continue;
        }
        let ops = by_id
            .get(id.as_str())
            .map(Vec::as_slice)
            .unwrap_or_default();
        let schedules = || {
            ops.iter()
                .filter(|op| matches!(op.kind, Kind::Schedule | Kind::Batch))
        };
        let asked = schedules().any(|op| !matches!(op.outcome, Outcome::Failed(..)));
        // A refusal is a definite answer: the timer must not exist because of that call.
        if let Some(op) = schedules().find(|op| matches!(op.outcome, Outcome::Failed(..))) {
            if !asked {
                f.violate(
                    "refused schedule took effect",
                    format!("{t:?} exists, but its only schedule was refused: {op:?}"),
                );
                continue;
            }
        }
        if !asked || t.payload != id.as_bytes() {
            f.violate(
                "phantom timer",
                format!("{t:?} was never scheduled like that"),
            );
            continue;
        }
        // A shift-only timer's fire time is its schedule's plus shifts: `shifts` checks it.
        if ops.iter().any(|op| op.kind == Kind::Extend) {
            continue;
        }
        let times: HashSet<i64> = ops
            .iter()
            .filter(|op| matches!(op.kind, Kind::Schedule | Kind::Batch | Kind::Reschedule))
            .flat_map(|op| {
                let i = op.ids.iter().position(|x| x == id).unwrap_or(0);
                match op.kind {
                    Kind::Reschedule => op.fire_at.first().copied(),
                    _ => op.fire_at.get(i).copied(),
                }
            })
            .collect();
        if !times.contains(&t.fire_at_ms) {
            f.violate(
                "phantom fire time",
                format!(
                    "{id} has fire_at {} that no request named ({times:?})",
                    t.fire_at_ms
                ),
            );
        }
    }
}

/// The rules for one operation's own outcome.
fn check_op(f: &mut Findings, op: &Op, timers: &BTreeMap<String, pb::Timer>, skews: &[SkewWindow]) {
    let final_state = |id: &str| timers.get(id).map(state);
    match (&op.kind, &op.outcome) {
        (Kind::Schedule | Kind::Batch, Outcome::Ok(_)) => {
            for id in &op.ids {
                if !timers.contains_key(id) {
                    let detail = format!(
                        "{id}: invoked at {} through node {}, acknowledged at {}, gone",
                        op.invoke_ms, op.node, op.complete_ms
                    );
                    f.violate("lost acknowledged schedule", detail);
                }
            }
        }
        (Kind::Schedule | Kind::Batch, Outcome::Unknown(..)) => {
            let done = op.ids.iter().filter(|id| timers.contains_key(*id)).count();
            if done != 0 && done != op.ids.len() && op.kind == Kind::Batch {
                f.violate(
                    "partial batch",
                    format!(
                        "{done} of {} timers of an unknown batch exist: {op:?}",
                        op.ids.len()
                    ),
                );
            }
            if done == 0 {
                f.unknown_resolved_not_done += 1;
            } else {
                f.unknown_resolved_done += 1;
            }
        }
        (Kind::Cancel | Kind::CancelIf, Outcome::Ok(_)) => {
            let id = &op.ids[0];
            if final_state(id) != Some(pb::TimerState::Cancelled) {
                f.violate(
                    "fire after acknowledged cancel",
                    format!(
                        "{id} was cancelled OK at {} but is {:?}",
                        op.complete_ms,
                        final_state(id)
                    ),
                );
            }
        }
        (Kind::Cancel, Outcome::Failed(tonic::Code::FailedPrecondition, msg)) => {
            // A cancel that lost the race: the timer had fired (or been cancelled) by the time
            // the refusal came back. Leader clocks may be skewed by up to 3 s in these runs.
            let id = &op.ids[0];
            let t = timers.get(id);
            let fired_later =
                t.is_some_and(|t| t.fire_index > 0 && t.fired_at_ms > op.complete_ms + 3_500);
            if t.is_none() || fired_later {
                f.violate(
                    "cancel refused before the timer fired",
                    format!("{id}: {msg} at {}, final {t:?}", op.complete_ms),
                );
            }
        }
        (Kind::Reschedule, Outcome::Ok(got)) => {
            let id = &op.ids[0];
            let wanted = op.fire_at[0];
            if got.first().is_none_or(|t| t.fire_at_ms != wanted) {
                f.violate(
                    "reschedule answer",
                    format!("{id}: asked {wanted}, got {got:?}"),
                );
            }
        }
        (Kind::Get, Outcome::Ok(got)) => {
            for t in got {
                let fired = state(t) != pb::TimerState::Pending && t.fire_index > 0;
                if fired && op.complete_ms < t.fire_at_ms {
                    let what = format!("{} read FIRED at {}: {t:?}", t.id, op.complete_ms);
                    early(f, skews, op.complete_ms, what);
                }
            }
        }
        _ => {}
    }
}

/// One fire transition per timer, never early, delivered at least once, never both cancelled
/// and delivered.
fn fires(
    f: &mut Findings,
    timers: &BTreeMap<String, pb::Timer>,
    h: &History,
    skews: &[SkewWindow],
) {
    let mut seen: HashMap<&str, Vec<&crate::workload::Seen>> = HashMap::new();
    for d in &h.deliveries {
        seen.entry(d.id.as_str()).or_default().push(d);
    }
    for (id, t) in timers {
        let st = state(t);
        let deliveries = seen.get(id.as_str()).map(Vec::as_slice).unwrap_or_default();
        if st == pb::TimerState::Cancelled {
            if !deliveries.is_empty() || t.fire_index != 0 {
                f.violate(
                    "cancelled and delivered",
                    format!("{t:?} delivered {}×", deliveries.len()),
                );
            }
            continue;
        }
        if st == pb::TimerState::Pending {
            f.violate(
                "never fired",
                format!("{t:?} is still PENDING after quiescence"),
            );
            continue;
        }
        if t.fired_at_ms < t.fire_at_ms {
            f.violate(
                "early",
                format!(
                    "{id}: fired_at {} < fire_at {}",
                    t.fired_at_ms, t.fire_at_ms
                ),
            );
        }
        if deliveries.is_empty() {
            f.violate("never delivered", format!("{t:?}"));
        }
        for d in deliveries {
            if d.fire_at_ms != t.fire_at_ms {
                f.violate(
                    "delivered a different timer",
                    format!(
                        "{id} delivered with fire_at {}, final {}",
                        d.fire_at_ms, t.fire_at_ms
                    ),
                );
            }
            if d.fire_index != t.fire_index {
                f.violate(
                    "two fire transitions",
                    format!(
                        "{id} delivered with fire_index {} but fired at {}",
                        d.fire_index, t.fire_index
                    ),
                );
            }
            if d.received_ms < t.fire_at_ms {
                let what = format!(
                    "{id} delivered at {}, {} ms before fire_at",
                    d.received_ms,
                    t.fire_at_ms - d.received_ms
                );
                early(f, skews, d.received_ms, what);
            }
        }
    }
}

/// Something was seen fired at `seen_ms` (client clock), before its fire time: allowed only
/// while a node's clock was skewed (its Fire entries carry its clock), counted apart then.
fn early(f: &mut Findings, skews: &[SkewWindow], seen_ms: i64, what: String) {
    // A skewed leader's fires can be seen a few seconds after its window ends (redelivery).
    let skewed = skews
        .iter()
        .any(|w| seen_ms >= w.from_ms - 1_000 && seen_ms <= w.to_ms + 5_000);
    if skewed {
        f.early_by_skew += 1;
    } else {
        f.violate("early", what);
    }
}

/// ACKED at most once: every successful Ack answer names the timer's one finished_at.
fn acks(f: &mut Findings, timers: &BTreeMap<String, pb::Timer>, h: &History) {
    for (id, attempt, o) in &h.acks {
        let Outcome::Ok(got) = o else { continue };
        let Some(t) = timers.get(id) else {
            f.violate("ack of a missing timer", format!("{id} attempt {attempt}"));
            continue;
        };
        let answered = got.first().map_or(0, |a| a.finished_at_ms);
        if state(t) != pb::TimerState::Acked || answered != t.finished_at_ms {
            f.violate(
                "acked more than once",
                format!("{id}: ack {attempt} answered finished_at {answered}, final {t:?}"),
            );
        }
    }
}

/// How long after healing (a leader agreed on) the cluster may still be settling: a stream
/// broken by the healing itself, a burst of timers due at once, a node the healing restarted
/// handing its leadership over. (5 s was too short for real processes: the 30-minute chaos
/// run of 2026-11-26 lost two stream acks 5.0 and 5.1 s after healing, at a leadership
/// handover whose ack proposals openraft never answered — at least once, they came again.)
pub const SETTLE_MS: i64 = 10_000;

/// Stream acks (and unary Acks answered once queued, which go the same way) take effect once
/// the cluster is calm: a delivery acked so after healing is not delivered again. (Before healing a stream ack may be lost with its stream or
/// its leader — at least once — and liveness only sees that the timer ends ACKED, which the
/// other consumer's unary acks could do alone: a wedged ack path would go unseen.)
fn stream_acks(f: &mut Findings, h: &History, healed_ms: i64) {
    let mut latest: HashMap<&str, u32> = HashMap::new();
    for d in &h.deliveries {
        let a = latest.entry(d.id.as_str()).or_default();
        *a = (*a).max(d.attempt);
    }
    for d in &h.deliveries {
        let judged = d.path.answered_early() && d.received_ms >= healed_ms + SETTLE_MS;
        if judged && latest[d.id.as_str()] > d.attempt {
            f.violate(
                "stream ack not applied",
                format!(
                    "{}: attempt {} received and acked ({:?}) {} ms after healing, delivered \
                     again as attempt {}",
                    d.id,
                    d.attempt,
                    d.path,
                    d.received_ms - healed_ms,
                    latest[d.id.as_str()]
                ),
            );
        }
    }
}

#[cfg(test)]
#[path = "checker_tests.rs"]
mod tests;
