//! A node's operations on recurring timers, in domain terms (docs/recurrence.md): schedule,
//! pause and resume go through the log like every change; Get and List of a series read the
//! state machine after the read barrier, like any read.

use super::Node;
use crate::command::{Cond, RecurringChange};
use crate::recurring::{RecurringSpec, RecurringView, TimerOrRecurring};
use crate::timer::TimerKey;
use crate::{Error, Result};

impl Node {
    /// Creates a recurring timer (`upsert` none: a repeat answered with created = false,
    /// another refused), or with `upsert` replaces an existing one's rule, payload and policies
    /// if its condition holds (Schedule in mode UPSERT).
    pub async fn schedule_recurring(
        &self,
        spec: RecurringSpec,
        upsert: Option<Cond>,
    ) -> Result<(RecurringView, bool)> {
        self.check_recurring(&spec)?;
        let now_ms = self.now_ms();
        let change = match upsert {
            None => RecurringChange::Schedule { now_ms, spec },
            Some(cond) => RecurringChange::Upsert { now_ms, spec, cond },
        };
        let cmd = self.recurring_entry(change)?;
        self.write_recurring(cmd).await
    }

    /// The namespace's payload limit and schedule rate, as for one timer.
    pub(super) fn check_recurring(&self, spec: &RecurringSpec) -> Result<()> {
        self.admit([(spec.key.as_ref(), spec.payload.len())])
    }

    /// Pauses (`paused`) or resumes a recurring timer.
    pub async fn pause_recurring(&self, key: TimerKey, paused: bool) -> Result<RecurringView> {
        let cmd = self.recurring_entry(crate::command::RecurringChange::Pause {
            now_ms: self.now_ms(),
            key,
            paused,
        })?;
        Ok(self.write_recurring(cmd).await?.0)
    }

    /// A timer or, when none has the key, the recurring timer there, with its next `upcoming`
    /// occurrence times (linearizable).
    pub async fn get_with(&self, key: &TimerKey, upcoming: usize) -> Result<TimerOrRecurring> {
        self.read_barrier().await?;
        if let Some(t) = self.store.get(key)? {
            return Ok(TimerOrRecurring::Timer(t));
        }
        self.store
            .recurring(key, upcoming)?
            .map(TimerOrRecurring::Recurring)
            .ok_or_else(|| Error::NotFound(format!("timer {key} not found")))
    }

    /// A page of `namespace`'s recurring timers (linearizable), and the id to continue after.
    pub async fn list_recurring(
        &self,
        namespace: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<RecurringView>, Option<String>)> {
        self.read_barrier().await?;
        self.store.list_recurring(namespace, after, limit)
    }
}
