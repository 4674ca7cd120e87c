//! The misfire policy of one-shot timers, applied by a Fire entry: a PENDING row the cursor
//! passed more than its policy's `max_lateness_ms` after its fire time (an outage, a long
//! failover) does not fire; it becomes DEAD (action `dead`: a dead letter that Redrive fires)
//! or EXPIRED (action `skip`: finished), with an attempt record "misfired" saying how late it
//! was, and is counted in `timerdb_timers_expired_total{namespace,policy}`.
//!
//! Lateness counts from when the row's slot came due: a timer scheduled with a time in the
//! past ("fire now") or redriven is due when it was placed, so it fires.
//!
//! Never early: the check only keeps a timer from firing, it never fires one sooner. The
//! policy is the namespace's, or the timer's own (a row that has one says so in its kind
//! byte, so the cursor decodes no other row). Occurrences of recurring timers are left to
//! their series' own misfire policy. The row is rewritten in place (behind the cursor, where
//! a grant of the same entry would read the database as it was): its namespace gets no grant
//! in this entry, as for a series' dropped occurrence.

use super::apply::Applier;
use super::row::Kind;
use crate::namespace::MisfireAction;
use crate::timer::{log_attempt, AttemptRecord, Channel, Outcome, TimerKey};
use crate::Result;

impl Applier<'_> {
    /// Handles the rows `advance_cursor` found too late; returns how many of the timers it
    /// counted as fired did not fire.
    pub(super) fn misfires(&mut self, now_ms: i64) -> Result<u32> {
        let late = std::mem::take(&mut self.late);
        let mut unfired = 0;
        for (i, slot, misfire) in late {
            // The namespaces the cursor visited (`advance_cursor`), which a late row indexes.
            let ns = self.visited[i].clone();
            let ns = &ns;
            let Some(mut row) = self.row_at(ns, slot)? else {
                continue;
            };
            if let Some((recurring, _)) = crate::recurring::parse_occurrence(&row.body.id) {
                let key = TimerKey::new(ns.clone(), recurring);
                if self.recurring_row(&key)?.is_some() {
                    continue; // its series' misfire policy decides (`recurring.rs`)
                }
            }
            let late_ms = now_ms - self.wheel.due_ms(slot.bucket);
            row.kind = match misfire.action {
                MisfireAction::Dead => Kind::Dead,
                MisfireAction::Skip => Kind::Expired,
                MisfireAction::Fire => continue,
            };
            row.body.finished_at_ms = now_ms;
            // PENDING -> DEAD or EXPIRED: one change (the cursor's fire never happened).
            row.body.ext.revision = row.body.ext.revision.max(1) + 1;
            let record = AttemptRecord {
                at_ms: now_ms,
                attempt: row.body.attempts,
                channel: Channel::Subscribe,
                outcome: Outcome::Misfired,
                latency_ms: 0,
                detail: format!(
                    "{late_ms} ms late; max_lateness {} ms",
                    misfire.max_lateness_ms
                ),
            };
            log_attempt(&mut row.body.log, record);
            let fired_late = now_ms - row.fire_at_ms;
            self.put_row(ns, slot, row);
            self.events.unfired(fired_late);
            self.events.expired(ns, misfire.action.name());
            self.rewrote_fired.push(ns.clone());
            unfired += 1;
        }
        Ok(unfired)
    }
}
