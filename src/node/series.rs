//! A node's operations on recurring timers, in domain terms (docs/recurrence.md): schedule,
//! pause and resume go through the log like every change; Get and List of a series read the
//! state machine after the read barrier, like any read.

use super::Node;
use crate::command::{Cond, SeriesChange};
use crate::series::{SeriesSpec, SeriesView, TimerOrSeries};
use crate::timer::TimerKey;
use crate::{Error, Result};

impl Node {
    /// Creates a recurring timer (`upsert` none: a repeat answered with created = false,
    /// another refused), or with `upsert` replaces an existing one's rule, payload and policies
    /// if its condition holds (Schedule in mode UPSERT).
    pub async fn schedule_series(
        &self,
        spec: SeriesSpec,
        upsert: Option<Cond>,
    ) -> Result<(SeriesView, bool)> {
        self.check_series(&spec)?;
        let now_ms = self.now_ms();
        let change = match upsert {
            None => SeriesChange::Schedule { now_ms, spec },
            Some(cond) => SeriesChange::Upsert { now_ms, spec, cond },
        };
        let cmd = self.series_entry(change)?;
        self.write_series(cmd).await
    }

    /// The namespace's payload limit and schedule rate, as for one timer.
    pub(super) fn check_series(&self, spec: &SeriesSpec) -> Result<()> {
        self.check_payloads([(spec.key.as_ref(), spec.payload.len())])?;
        self.check_schedule_rate(&spec.key.namespace, 1)
    }

    /// Pauses (`paused`) or resumes a recurring timer.
    pub async fn pause_series(&self, key: TimerKey, paused: bool) -> Result<SeriesView> {
        let cmd = self.series_entry(crate::command::SeriesChange::Pause {
            now_ms: self.now_ms(),
            key,
            paused,
        })?;
        Ok(self.write_series(cmd).await?.0)
    }

    /// A timer or, when none has the key, the recurring timer there, with its next `upcoming`
    /// occurrence times (linearizable).
    pub async fn get_with(&self, key: &TimerKey, upcoming: usize) -> Result<TimerOrSeries> {
        self.read_barrier().await?;
        if let Some(t) = self.store.get(key)? {
            return Ok(TimerOrSeries::Timer(t));
        }
        self.store
            .series(key, upcoming)?
            .map(TimerOrSeries::Series)
            .ok_or_else(|| Error::NotFound(format!("timer {key} not found")))
    }

    /// A page of `namespace`'s recurring timers (linearizable), and the id to continue after.
    pub async fn list_series(
        &self,
        namespace: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<SeriesView>, Option<String>)> {
        self.read_barrier().await?;
        self.store.list_series(namespace, after, limit)
    }
}
