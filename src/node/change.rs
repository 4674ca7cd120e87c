//! A node's conditional and mode-dependent changes, in domain terms: each is one command in
//! the log, decided in apply (`storage/change.rs`), so callers racing on one timer are ordered.

use super::Node;
use crate::command::{Command, Cond, Mode, Response, Shift};
use crate::namespace::Misfire;
use crate::series::{SeriesSpec, SeriesView, TimerOrSeries};
use crate::timer::{Timer, TimerKey, TimerSpec};
use crate::Result;

impl Node {
    /// Schedule in `mode` (`None`: create-only) if `cond` holds, with the timer's own misfire
    /// policy if `misfire` is set; returns the timer and whether it was created.
    pub async fn schedule_with(
        &self,
        spec: TimerSpec,
        mode: Option<Mode>,
        cond: Cond,
        misfire: Option<Misfire>,
    ) -> Result<(Timer, bool)> {
        self.check_payloads([(spec.key.as_ref(), spec.payload.len())])?;
        self.check_schedule_rate(&spec.key.namespace, 1)?;
        let cmd = Command::ScheduleWith {
            now_ms: self.now_ms(),
            spec,
            mode,
            cond,
            misfire,
        };
        self.write_created(cmd).await
    }

    /// Creates a recurring timer or replaces an existing one's rule (Schedule(upsert)).
    pub async fn upsert_series(&self, spec: SeriesSpec, cond: Cond) -> Result<(SeriesView, bool)> {
        self.check_series(&spec)?;
        let cmd = self.series_entry(crate::command::SeriesChange::Upsert {
            now_ms: self.now_ms(),
            spec,
            cond,
        })?;
        self.write_series(cmd).await
    }

    /// Cancels the timer (or recurring timer) at `key` if `cond` holds.
    pub async fn cancel_if(&self, key: TimerKey, cond: Cond) -> Result<TimerOrSeries> {
        let cmd = Command::CancelIf {
            now_ms: self.now_ms(),
            key,
            cond,
        };
        self.write_found(cmd).await
    }

    pub async fn reschedule_if(&self, key: TimerKey, shift: Shift, cond: Cond) -> Result<Timer> {
        let cmd = Command::RescheduleIf {
            now_ms: self.now_ms(),
            key,
            shift,
            cond,
        };
        self.write_timer(cmd).await
    }

    pub(super) async fn write_created(&self, cmd: Command) -> Result<(Timer, bool)> {
        match self.write(cmd).await? {
            Response::Timer { timer, created } => Ok((timer, created)),
            other => Err(super::unexpected(other)),
        }
    }
}
