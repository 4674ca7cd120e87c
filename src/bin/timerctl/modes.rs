//! The create-mode and condition flags: `schedule --mode upsert|debounce|keep-earliest|
//! keep-latest [--max-wait D]`, `--if-state S` and `--if-revision N` on schedule, cancel and
//! reschedule, and reschedule's `--extend-by D` / `--pull-in D`.

use std::time::Duration;

use clap::ValueEnum;
use timerdb::api::pb;

use crate::State;

#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum ModeArg {
    CreateOnly,
    Upsert,
    Debounce,
    KeepEarliest,
    KeepLatest,
}

/// `--misfire` of a namespace or a timer.
#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum MisfireArg {
    Fire,
    Dead,
    Skip,
}

impl MisfireArg {
    pub fn to_pb(self) -> pb::MisfireAction {
        match self {
            MisfireArg::Fire => pb::MisfireAction::Fire,
            MisfireArg::Dead => pb::MisfireAction::Dead,
            MisfireArg::Skip => pb::MisfireAction::Skip,
        }
    }
}

/// `--if-state` / `--if-revision`.
#[derive(clap::Args, Debug)]
pub struct CondArgs {
    /// Only if the timer is in this state (else FAILED_PRECONDITION naming state and revision).
    #[arg(long, value_enum)]
    if_state: Option<State>,
    /// Only if the timer is at this revision (`get` shows it).
    #[arg(long)]
    if_revision: Option<u64>,
}

impl CondArgs {
    pub fn state(&self) -> i32 {
        self.if_state.map_or(0, |s| s.to_pb() as i32)
    }

    pub fn revision(&self) -> u64 {
        self.if_revision.unwrap_or(0)
    }
}

/// `schedule`'s mode flags.
#[derive(clap::Args, Debug)]
pub struct ModeArgs {
    /// What to do if the id exists: create-only (default: the same timer again is fine,
    /// another is ALREADY_EXISTS), upsert, debounce, keep-earliest, keep-latest.
    #[arg(long, value_enum)]
    mode: Option<ModeArg>,
    /// debounce: never later than this after the first call.
    #[arg(long, value_parser = humantime::parse_duration, requires = "mode")]
    max_wait: Option<Duration>,
    #[command(flatten)]
    cond: CondArgs,
    /// A one-shot timer's own misfire action if it fires more than --max-lateness late
    /// (default: its namespace's): fire, dead, skip.
    #[arg(long = "on-misfire", value_enum, requires = "max_lateness")]
    on_misfire: Option<MisfireArg>,
}

impl ModeArgs {
    /// Fills `req`'s mode, max_wait_ms, if_state and if_revision.
    pub fn apply(&self, req: &mut pb::ScheduleRequest) {
        req.mode = match self.mode {
            None => pb::CreateMode::Unspecified,
            Some(ModeArg::CreateOnly) => pb::CreateMode::CreateOnly,
            Some(ModeArg::Upsert) => pb::CreateMode::Upsert,
            Some(ModeArg::Debounce) => pb::CreateMode::Debounce,
            Some(ModeArg::KeepEarliest) => pb::CreateMode::KeepEarliest,
            Some(ModeArg::KeepLatest) => pb::CreateMode::KeepLatest,
        } as i32;
        req.max_wait_ms = self.max_wait.map_or(0, |d| d.as_millis() as i64);
        req.if_state = self.cond.state();
        req.if_revision = self.cond.revision();
        req.misfire = self.on_misfire.map_or(0, |m| m.to_pb() as i32);
    }
}

/// `reschedule`'s relative shifts.
#[derive(clap::Args, Debug)]
pub struct ShiftArgs {
    /// Later than its current fire time by this much, e.g. 30s.
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "pull_in")]
    extend_by: Option<Duration>,
    /// Earlier than its current fire time by this much.
    #[arg(long, value_parser = humantime::parse_duration)]
    pull_in: Option<Duration>,
}

impl ShiftArgs {
    pub fn when(&self) -> Option<pb::reschedule_request::When> {
        use pb::reschedule_request::When;
        match (self.extend_by, self.pull_in) {
            (Some(d), _) => Some(When::ExtendByMs(d.as_millis() as i64)),
            (None, Some(d)) => Some(When::PullInMs(d.as_millis() as i64)),
            (None, None) => None,
        }
    }
}
