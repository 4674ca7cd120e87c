//! What applying a command answers: a [`Response`] to the proposer, or a [`Rejection`] that
//! every replica makes alike (apply is deterministic, so a rejection is part of the log's
//! meaning, not a node's opinion). A ScheduleBatch's answer ([`BatchAnswer`]) shares the
//! entry's command instead of copying the timers it created.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{Command, Granted};
use crate::namespace::Namespace;
use crate::recurring::RecurringView;
use crate::timer::{Timer, TimerKey, TimerState};

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

/// What applying a command produced; returned to the proposer. Never stored nor sent to a
/// peer (a follower forwards the client's request, not an answer); still, new variants go at
/// the end, as `Command`'s do.
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
    /// A change of a recurring timer (schedule, upsert, pause, cancel): the series after it;
    /// `created` for a schedule.
    Recurring {
        recurring: Box<RecurringView>,
        created: bool,
    },
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
