//! Data-driven scenarios for the state machine, toyDB's way: each goldenscript in
//! `src/storage/testscripts/` is commands in (one log entry each, applied to a real state
//! machine on RocksDB) and answers and timer states out. A scenario is read top to bottom as a
//! timer's life; a change of behaviour shows as a diff of the script (regenerated with
//! `UPDATE_GOLDENFILES=1`, then read before it is committed).
//!
//! Times are written relative to the scripts' epoch `T0` (`at=2500` is 2.5 s after it) and
//! shown so (`+2500`); every timer is in namespace `ns`. The commands:
//!
//! - `namespace [misfire=fire|dead|skip] [lateness=MS]`: a SetNamespace with that misfire
//!   policy.
//! - `schedule ID at=MS [now=MS] [payload=P] [mode=upsert|keep_earliest|keep_latest]
//!   [if_state=STATE] [if_revision=N] [misfire=ACTION lateness=MS]`: one Schedule.
//! - `cancel ID [now=MS] [if_state=STATE] [if_revision=N]`, `reschedule ID (at=MS |
//!   extend=MS | pull=MS) [now=MS] [if_…]`.
//! - `fire now=MS [max=N] [grant]`: a Fire entry (`grant`: with a grant of room 100).
//! - `deliver now=MS`: a Deliver entry granting room 100. `redrive ID now=MS`.
//! - `timer ID…`: each timer's state, fire time, revision, attempts, fire index and its last
//!   attempt's outcome.

use std::error::Error as StdError;
use std::fmt::Write as _;

use super::*;
use crate::command::{Cond, Grant, Mode, Options, Shift};
use crate::namespace::{Misfire, MisfireAction, Policy};

/// Applies a script's commands to one state machine (a new one per script).
struct SmRunner {
    rt: tokio::runtime::Runtime,
    sm: Sm,
}

type Fallible<T> = Result<T, Box<dyn StdError>>;

fn at(v: &str) -> Fallible<i64> {
    Ok(T0 + v.parse::<i64>()?)
}

fn rel(ms: i64) -> String {
    match ms {
        0 => "-".into(),
        ms => format!("+{}", ms - T0),
    }
}

fn state(v: &str) -> Fallible<TimerState> {
    Ok(match v {
        "pending" => TimerState::Pending,
        "fired" => TimerState::Fired,
        "acked" => TimerState::Acked,
        "cancelled" => TimerState::Cancelled,
        "dead" => TimerState::Dead,
        "expired" => TimerState::Expired,
        other => return Err(format!("no state {other}").into()),
    })
}

fn action(v: &str) -> Fallible<MisfireAction> {
    Ok(match v {
        "fire" => MisfireAction::Fire,
        "dead" => MisfireAction::Dead,
        "skip" => MisfireAction::Skip,
        other => return Err(format!("no misfire action {other}").into()),
    })
}

fn grants() -> Vec<Grant> {
    vec![Grant {
        namespace: "ns".into(),
        room: 100,
        push: false,
    }]
}

/// One line per timer: what a reader of a scenario wants to see of it.
fn show_timer(t: &Timer) -> String {
    let mut line = format!(
        "{} {} at={} rev={} attempts={} fire_index={}",
        t.key.id,
        t.state.name(),
        rel(t.fire_at_ms),
        t.revision,
        t.attempts,
        t.fire_index
    );
    if t.wake_at_ms != 0 {
        let _ = write!(line, " wake={}", rel(t.wake_at_ms));
    }
    if let Some(last) = t.attempt_log.last() {
        let _ = write!(line, " last={:?} ({})", last.outcome, last.detail);
    }
    line
}

/// One slot per grant: `-` for none, else how many timers the lease holds.
fn show_leases(leases: &[Option<crate::command::Granted>]) -> String {
    let slots: Vec<String> = leases
        .iter()
        .map(|l| l.as_ref().map_or("-".into(), |l| l.count.to_string()))
        .collect();
    format!("[{}]", slots.join(" "))
}

fn show(r: &Response) -> String {
    match r {
        Response::Timer { timer, created } => {
            let how = if *created { "created" } else { "answered" };
            format!("{how}: {}", show_timer(timer))
        }
        Response::Rejected(why) => format!("refused: {}", why.clone().into_error()),
        Response::Fired {
            count,
            more,
            leases,
        } => {
            let more = if *more { ", more due" } else { "" };
            format!("fired {count}{more}, leases {}", show_leases(leases))
        }
        Response::Delivered(leases) => format!("leases {}", show_leases(leases)),
        Response::Redriven { timers, skipped } => {
            format!("redriven {}, skipped {}", timers.len(), skipped.len())
        }
        Response::Namespace(ns) => format!("namespace {}", ns.name),
        other => format!("{other:?}"),
    }
}

impl SmRunner {
    fn new() -> SmRunner {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        SmRunner { rt, sm: Sm::new() }
    }

    fn apply(&mut self, cmd: Command) -> String {
        let r = self.rt.block_on(self.sm.apply(cmd));
        show(&r) + "\n"
    }
}

/// The condition named by `if_state=` / `if_revision=`, taken from `args`.
fn cond(args: &mut goldenscript::ArgumentConsumer<'_>) -> Fallible<Cond> {
    Ok(Cond {
        if_state: args.take_key("if_state").map(state).transpose()?,
        if_revision: args.take_key("if_revision").map(str::parse).transpose()?,
    })
}

impl goldenscript::Runner for SmRunner {
    type Command = goldenscript::Command;

    fn run(
        &mut self,
        command: &goldenscript::Command,
        _: &goldenscript::Context,
    ) -> Fallible<String> {
        let mut args = command.consume_args();
        let now = |args: &mut goldenscript::ArgumentConsumer<'_>| -> Fallible<i64> {
            args.take_key("now").map(at).unwrap_or(Ok(T0))
        };
        let key = |id: &str| TimerKey::new("ns", id);
        let cmd = match command.name.as_str() {
            "namespace" => {
                let misfire = Misfire {
                    action: args
                        .take_key("misfire")
                        .map(action)
                        .unwrap_or(Ok(Default::default()))?,
                    max_lateness_ms: args.take_key("lateness").unwrap_or("0").parse()?,
                };
                Command::SetNamespace {
                    name: "ns".into(),
                    policy: Policy::default(),
                    push: None,
                    misfire,
                }
            }
            "schedule" => {
                let id = args.next_pos().ok_or("schedule takes an id")?;
                let at_ms = at(args.take_key("at").ok_or("schedule takes at=")?)?;
                let payload = args.take_key("payload").unwrap_or("p");
                let mode = match args.take_key("mode") {
                    None => None,
                    Some("upsert") => Some(Mode::Upsert),
                    Some("keep_earliest") => Some(Mode::KeepEarliest),
                    Some("keep_latest") => Some(Mode::KeepLatest),
                    Some(other) => return Err(format!("no mode {other}").into()),
                };
                let misfire = match args.take_key("misfire") {
                    None => None,
                    Some(a) => Some(Misfire {
                        action: action(a)?,
                        max_lateness_ms: args.take_key("lateness").ok_or("lateness=")?.parse()?,
                    }),
                };
                let with = Options {
                    mode,
                    cond: cond(&mut args)?,
                    misfire,
                };
                Command::Schedule {
                    now_ms: now(&mut args)?,
                    spec: spec(id, at_ms, payload),
                    with,
                }
            }
            "cancel" => Command::Cancel {
                key: key(args.next_pos().ok_or("cancel takes an id")?),
                cond: cond(&mut args)?,
                now_ms: now(&mut args)?,
            },
            "reschedule" => {
                let id = args.next_pos().ok_or("reschedule takes an id")?;
                let shift = match (
                    args.take_key("at"),
                    args.take_key("extend"),
                    args.take_key("pull"),
                ) {
                    (Some(v), None, None) => Shift::To(When::At(at(v)?)),
                    (None, Some(ms), None) => Shift::ExtendBy(ms.parse()?),
                    (None, None, Some(ms)) => Shift::PullIn(ms.parse()?),
                    _ => return Err("reschedule takes one of at=, extend=, pull=".into()),
                };
                Command::Reschedule {
                    key: key(id),
                    shift,
                    cond: cond(&mut args)?,
                    now_ms: now(&mut args)?,
                }
            }
            "fire" => {
                let max = args.take_key("max").unwrap_or("100").parse()?;
                let grant = args.next_pos() == Some("grant");
                Command::Fire {
                    now_ms: now(&mut args)?,
                    max,
                    grants: if grant { grants() } else { Vec::new() },
                }
            }
            "deliver" => Command::Deliver {
                now_ms: now(&mut args)?,
                grants: grants(),
            },
            "redrive" => Command::Redrive {
                keys: vec![key(args.next_pos().ok_or("redrive takes an id")?)],
                now_ms: now(&mut args)?,
            },
            "timer" => {
                let mut out = String::new();
                while let Some(id) = args.next_pos() {
                    match self.sm.store.get(&key(id))? {
                        Some(t) => writeln!(out, "{}", show_timer(&t))?,
                        None => writeln!(out, "{id} none")?,
                    }
                }
                args.reject_next()?;
                return Ok(out);
            }
            other => return Err(format!("unknown command {other}").into()),
        };
        args.reject_next()?;
        Ok(self.apply(cmd))
    }
}

/// Every script in `src/storage/testscripts/`, each on a new state machine.
#[test]
fn scripts() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/storage/testscripts");
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    paths.sort();
    assert!(!paths.is_empty(), "no scripts in {dir}");
    for path in paths {
        goldenscript::run(&mut SmRunner::new(), &path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}
