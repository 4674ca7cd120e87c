//! The apply target: bytes read as a program of client and leader commands (schedule, batch,
//! cancel, reschedule, fire, deliver, ack, nack, redrive, namespace policy, access changes,
//! recurring timers: create with any policy, pause, resume, and cancels and acks of their
//! occurrences; the create modes, conditional cancels and reschedules, relative shifts) and of
//! disturbances of one replica, applied to three fresh state machines:
//!
//! - the *steady* one applies one entry at a time and is never disturbed: its node-local
//!   caches (the heads, the deadline floor, the access cache, the index GC's floors) carry
//!   whatever history left in them, and at the points the program says they are made as stale
//!   as their contracts allow (every head early, the floor at 0, `StateMachine::stale_caches`);
//!   after every entry its deadline floor must hold (no deadline below it);
//! - the *disturbed* one applies the same entries one at a time, rebuilding every node-local
//!   cache from its database before each (`StateMachine::reload`, what opening does), and at
//!   the points the program says it is closed and opened again or installs a snapshot the
//!   steady one builds there — what a restart or a catching-up follower does; and it applies
//!   a plain Schedule by the general path, as builds before the fold do (the steady one takes
//!   the fast path: a rolling upgrade runs both);
//! - the *grouped* one applies every entry in one call.
//!
//! The disturbed replica applies each command as a follower does, decoded from its encoding.
//! The steady and the disturbed replica must give the same answer and the same digest after
//! **every** entry (DESIGN invariant 8: a committed entry's effect is a function of the
//! replicated state and the entry only; a cache may make apply faster, never different); the
//! grouped one the same answers and digest at the end (the determinism oracle of
//! `storage::tests::apply_is_deterministic`, on programs nobody wrote by hand).
//!
//! Programs stay in the domain leaders propose from (each entry carries its leader's clock,
//! and a Fire's or a Deliver's may step back, as a newly elected leader's clock can lag), so a
//! disagreement is a real bug, not an impossible log.

use std::path::Path;
use std::sync::Arc;

use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use openraft::EntryPayload;
use timerdb::auth::{AccessChange, Key, Role};
use timerdb::command::{Command, Cond, Grant, Mode, Options, RecurringChange, Response, Shift};
use timerdb::namespace::{Misfire, MisfireAction, Policy};
use timerdb::raft_types::{log_id, Entry};
use timerdb::recurring::{self, occurrence_id, Overlap, Recurrence, RecurringSpec, RuleSpec};
use timerdb::storage::FireSignal;
use timerdb::storage::{self, decode, encode, IndexGc, StateMachine, Store};
use timerdb::timer::{TimerKey, TimerSpec, TimerState, When};
use timerdb::wheel::Wheel;

/// A target's verdict on one input: a short class of what happened (new classes are kept in
/// the corpus: the only guidance a coverage-blind fuzzer has), or a broken invariant.
pub type Verdict = Result<String, String>;

/// A fixed start of the replicated clock (2026-01-01).
const T0: i64 = 1_767_225_600_000;
/// Most commands one program runs.
const MAX_COMMANDS: usize = 64;
const NAMESPACES: [&str; 2] = ["orders", "billing"];

/// Reads bytes one at a time, 0 past the end.
struct Bytes<'a>(&'a [u8], usize);

impl Bytes<'_> {
    fn next(&mut self) -> u8 {
        let b = self.0.get(self.1).copied().unwrap_or(0);
        self.1 += 1;
        b
    }

    fn done(&self) -> bool {
        self.1 >= self.0.len()
    }

    fn key(&mut self) -> TimerKey {
        let ns = NAMESPACES[usize::from(self.next()) % NAMESPACES.len()];
        TimerKey::new(ns, format!("t{}", self.next() % 8))
    }
}

/// One step of a program.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // a program holds at most 64 steps
pub enum Step {
    /// Every replica applies this command as the next entry.
    Apply(Command),
    /// The disturbed replica is closed and opened again.
    Reopen,
    /// The disturbed replica installs a snapshot the steady one builds now.
    Install,
    /// The steady replica's caches become as stale as their contracts allow (every head early).
    Stale,
}

/// Each op by how often a byte picks it: what moves time and rows (fires, schedules,
/// reschedules, misfire policies) more often than the rest, so that programs reach the states
/// where caches and the replicated state part ways (a row moved later, a timer passed late, a
/// fire between them) within seconds of fuzzing rather than minutes.
const OPS: [u8; 32] = [
    0, 0, 0, 1, 2, 3, 3, 4, 4, 4, 4, 5, 6, 7, 8, 9, 17, 17, 11, 12, 13, 14, 14, 15, 16, 10, 18, 19,
    20, 20, 20, 20,
];

/// A new plain Schedule's request: an absolute time near `now` or a delay after it, a short
/// payload, no content type, the default spelled out, or another.
fn fresh_spec(b: &mut Bytes, now: i64) -> TimerSpec {
    let key = b.key();
    let when = match b.next() % 4 {
        0 => When::After(i64::from(b.next()) * 25),
        _ => When::At(now + i64::from(b.next()) * 25 - 500),
    };
    let payload = vec![b.next(); usize::from(b.next() % 8)];
    let content_type = match b.next() % 4 {
        0 => "text/plain".to_string(),
        1 => timerdb::timer::DEFAULT_CONTENT_TYPE.to_string(),
        _ => String::new(),
    };
    TimerSpec {
        key,
        when,
        payload,
        content_type,
    }
}

/// The commands `input` describes.
pub fn program(input: &[u8]) -> Vec<Command> {
    steps(input)
        .into_iter()
        .filter_map(|s| match s {
            Step::Apply(c) => Some(c),
            _ => None,
        })
        .collect()
}

/// The steps `input` describes: commands and disturbances.
pub fn steps(input: &[u8]) -> Vec<Step> {
    let mut b = Bytes(input, 0);
    let mut now = T0;
    let mut out = Vec::new();
    let mut commands = 0;
    // The last plain Schedule's request, for a retry to send again.
    let mut retried: Option<TimerSpec> = None;
    while !b.done() && commands < MAX_COMMANDS {
        let op = OPS[usize::from(b.next()) % OPS.len()];
        match op {
            18 => {
                out.push(Step::Reopen);
                continue;
            }
            19 => {
                out.push(Step::Install);
                continue;
            }
            20 => {
                out.push(Step::Stale);
                continue;
            }
            _ => {}
        }
        commands += 1;
        let at = |b: &mut Bytes, now: i64| now + i64::from(b.next()) * 25 - 500;
        let cmd = match op {
            0 => {
                let spec = match &retried {
                    // A client's retry: its last request again, as it was, proposed later.
                    Some(spec) if b.next() % 3 == 0 => spec.clone(),
                    _ => fresh_spec(&mut b, now),
                };
                retried = Some(spec.clone());
                // What a node proposes since the fold; now and then the first form, which
                // older logs hold.
                if b.next() % 4 == 0 {
                    Command::LegacySchedule { now_ms: now, spec }
                } else {
                    Command::Schedule {
                        now_ms: now,
                        spec,
                        with: Options::default(),
                    }
                }
            }
            1 => {
                let n = 1 + b.next() % 4;
                let specs = (0..n)
                    .map(|_| TimerSpec {
                        key: b.key(),
                        when: When::At(at(&mut b, now)),
                        payload: Vec::new(),
                        content_type: String::new(),
                    })
                    .collect();
                Command::ScheduleBatch { now_ms: now, specs }
            }
            2 => Command::LegacyCancel {
                now_ms: now,
                key: b.key(),
            },
            3 => Command::LegacyReschedule {
                now_ms: now,
                key: b.key(),
                when: When::At(at(&mut b, now)),
            },
            4 => {
                // Most Fires move the clock on; one in sixteen comes from a leader whose clock
                // lags (up to 8 s behind the newest entry's), which apply must take as it is.
                let step = b.next();
                let fire_ms = match step {
                    240.. => now - i64::from(step - 239) * 500,
                    _ => {
                        now += i64::from(step) * 40;
                        now
                    }
                };
                let max = 1 + u32::from(b.next() % 40);
                // Today's leaders name their tzdb once every member reads the form.
                match b.next() % 2 {
                    0 => Command::FireWithZones {
                        tzdb: timerdb::recurring::tzdb_version().into(),
                        now_ms: fire_ms,
                        max,
                        grants: Vec::new(),
                    },
                    _ => Command::Fire {
                        now_ms: fire_ms,
                        max,
                        grants: Vec::new(),
                    },
                }
            }
            5 => {
                let namespace = NAMESPACES[usize::from(b.next()) % 2].into();
                let room = 1 + u32::from(b.next() % 8);
                // A Deliver carries its leader's wall clock, which no entry orders: a new
                // leader's may lag the old one's, so a lease's deadline can land below the
                // deadline floor. Half the Delivers lag, by up to 25.5 s.
                let lag = match b.next() {
                    l if l % 2 == 0 => 0,
                    l => i64::from(l) * 100,
                };
                Command::Deliver {
                    now_ms: now - lag,
                    grants: vec![Grant {
                        namespace,
                        room,
                        push: false,
                    }],
                }
            }
            6 => Command::Ack {
                now_ms: now,
                key: b.key(),
                attempt: 1 + u32::from(b.next() % 3),
            },
            7 => Command::Nack {
                now_ms: now,
                key: b.key(),
                attempt: 1 + u32::from(b.next() % 3),
            },
            8 => Command::Redrive {
                now_ms: now,
                keys: vec![b.key(), b.key()],
            },
            9 => Command::PutNamespace {
                name: NAMESPACES[usize::from(b.next()) % 2].into(),
                policy: Policy {
                    max_attempts: 1 + u32::from(b.next() % 4),
                    ack_timeout_ms: 1_000 + u64::from(b.next()) * 100,
                    // PutNamespace's encoding has no misfire policy (SetNamespace carries it):
                    // a leader that applied its own copy would keep one its followers lack.
                    misfire: Misfire {
                        max_lateness_ms: u64::from(b.next()) * 20,
                        action: MisfireAction::Dead,
                    },
                    ..Policy::default()
                },
                push: None,
            },
            17 => {
                let name = NAMESPACES[usize::from(b.next()) % 2].into();
                let lateness = b.next();
                let misfire = Misfire {
                    max_lateness_ms: u64::from(lateness) * 20,
                    action: [
                        MisfireAction::Dead,
                        MisfireAction::Skip,
                        MisfireAction::Fire,
                    ][usize::from(b.next()) % 3],
                };
                // Both the old entry (its paused flag as proposed) and today's (the paused
                // flag kept as it is when the entry applies).
                if lateness % 2 == 0 {
                    Command::SetNamespace {
                        name,
                        policy: Policy::default(),
                        push: None,
                        misfire,
                    }
                } else {
                    Command::ConfigureNamespace {
                        name,
                        policy: Policy::default(),
                        push: None,
                        misfire,
                        keep_secrets: true,
                    }
                }
            }
            11 => {
                let spec = recurring_spec(&mut b);
                // Today's proposers stamp it with their zone rules; older logs' did not.
                match commands % 2 {
                    0 => Command::with_zone_rules(RecurringChange::Schedule { now_ms: now, spec }),
                    _ => Command::ScheduleRecurring { now_ms: now, spec },
                }
            }
            12 => {
                let (key, paused) = (b.key(), b.next() % 2 == 0);
                match commands % 2 {
                    0 => Command::with_zone_rules(RecurringChange::Pause {
                        now_ms: now,
                        key,
                        paused,
                    }),
                    _ => Command::PauseRecurring {
                        now_ms: now,
                        key,
                        paused,
                    },
                }
            }
            14 => {
                let key = b.key();
                let when = When::At(at(&mut b, now));
                let mode = match b.next() % 4 {
                    0 => Mode::Upsert,
                    1 => Mode::Debounce {
                        max_wait_ms: u64::from(b.next()) * 20,
                    },
                    2 => Mode::KeepEarliest,
                    _ => Mode::KeepLatest,
                };
                Command::Schedule {
                    now_ms: now,
                    spec: TimerSpec {
                        key,
                        when,
                        payload: vec![b.next()],
                        content_type: String::new(),
                    },
                    with: Options {
                        mode: (b.next() % 5 != 0).then_some(mode),
                        cond: cond(&mut b),
                        misfire: (b.next() % 2 == 0).then(|| Misfire {
                            max_lateness_ms: 100 + u64::from(b.next()) * 10,
                            action: [
                                MisfireAction::Dead,
                                MisfireAction::Skip,
                                MisfireAction::Fire,
                            ][usize::from(b.next()) % 3],
                        }),
                    },
                }
            }
            15 => Command::Cancel {
                now_ms: now,
                key: b.key(),
                cond: cond(&mut b),
            },
            16 => {
                let key = b.key();
                let d = i64::from(b.next()) * 30;
                let shift = match b.next() % 3 {
                    0 => Shift::ExtendBy(d),
                    1 => Shift::PullIn(d),
                    _ => Shift::To(When::At(now + d)),
                };
                Command::Reschedule {
                    now_ms: now,
                    key,
                    shift,
                    cond: cond(&mut b),
                }
            }
            13 => {
                // An occurrence of an interval series (anchored at T0, whole seconds).
                let series = b.key();
                let nominal = T0 + i64::from(b.next()) * 1000;
                let key = TimerKey::new(series.namespace, occurrence_id(&series.id, nominal));
                match b.next() % 3 {
                    0 => Command::LegacyCancel { now_ms: now, key },
                    1 => Command::Ack {
                        now_ms: now,
                        key,
                        attempt: 1,
                    },
                    _ => Command::Nack {
                        now_ms: now,
                        key,
                        attempt: 1,
                    },
                }
            }
            _ => match b.next() % 4 {
                3 => Command::RaiseLevel {
                    level: u32::from(b.next() % 3),
                },
                pick => Command::Access(match pick {
                    0 => AccessChange::PutKey(Key {
                        id: format!("k{}", b.next() % 4),
                        name: "fuzz".into(),
                        secret_sha256: Some([b.next(); 32]),
                        cert_name: None,
                        roles: vec![if b.next() % 2 == 0 {
                            Role::Admin
                        } else {
                            Role::parse("read:orders*").expect("a valid role")
                        }],
                        created_ms: now,
                    }),
                    1 => AccessChange::RevokeKey(format!("k{}", b.next() % 4)),
                    _ => AccessChange::Enable(b.next() % 2 == 0),
                }),
            },
        };
        out.push(Step::Apply(cmd));
    }
    out
}

/// A condition: none, a state, or a small revision.
fn cond(b: &mut Bytes) -> Cond {
    let x = b.next();
    Cond {
        if_state: [None, Some(TimerState::Pending), Some(TimerState::Fired)][usize::from(x % 3)],
        if_revision: (x & 0x10 != 0).then_some(u64::from(x >> 5) + 1),
    }
}

/// A recurring timer: an interval anchored at T0 (so occurrence ids can be guessed) or a cron
/// rule in one of a few zones, with any misfire and overlap policy.
fn recurring_spec(b: &mut Bytes) -> RecurringSpec {
    const CRONS: [&str; 4] = [
        "*/2 * * * * *",
        "30 2 * * *",
        "0 9 * * MON-FRI",
        "0 0 L * *",
    ];
    const ZONES: [&str; 3] = ["UTC", "Europe/Berlin", "Australia/Lord_Howe"];
    let key = b.key();
    let rule = match b.next() % 3 {
        0 => RuleSpec::Cron {
            expr: CRONS[usize::from(b.next()) % CRONS.len()].into(),
            zone: ZONES[usize::from(b.next()) % ZONES.len()].into(),
        },
        _ => RuleSpec::Every {
            period_ms: 1000 * (1 + i64::from(b.next() % 4)),
            anchor_ms: T0,
        },
    };
    let flags = b.next();
    RecurringSpec {
        key,
        recurrence: Recurrence {
            rule,
            start_ms: 0,
            end_ms: if flags & 1 == 1 { T0 + 20_000 } else { 0 },
            max_count: u64::from(b.next() % 4),
            misfire: [
                recurring::Misfire::FireOnce,
                recurring::Misfire::FireAll,
                recurring::Misfire::Skip,
            ][usize::from(flags >> 1) % 3],
            catch_up_window_ms: 5_000,
            max_lateness_ms: 1_000,
            overlap: [Overlap::Allow, Overlap::Skip, Overlap::BufferOne]
                [usize::from(flags >> 3) % 3],
            jitter_ms: u64::from(flags >> 5) * 100,
        },
        payload: vec![flags],
        content_type: String::new(),
    }
}

fn entry(index: u64, cmd: Command) -> Entry {
    Entry {
        log_id: log_id(1, 1, index),
        payload: EntryPayload::Normal(Arc::new(cmd)),
    }
}

fn open(dir: &Path) -> Result<StateMachine, String> {
    let gc = IndexGc::new();
    let db = storage::open_db(dir, &gc).map_err(|e| e.to_string())?;
    let store = Store::new(db, Wheel::default(), gc);
    StateMachine::open(store, dir, Arc::new(FireSignal::default())).map_err(|e| e.to_string())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Runs the program on the three state machines and compares them.
pub fn run(input: &[u8]) -> Verdict {
    let steps = steps(input);
    let cmds: Vec<Command> = steps
        .iter()
        .filter_map(|s| match s {
            Step::Apply(c) => Some(c.clone()),
            _ => None,
        })
        .collect();
    if cmds.is_empty() {
        return Ok("empty".into());
    }
    let (d1, d2, d3) = (tempdir()?, tempdir()?, tempdir()?);
    runtime().block_on(async {
        let (mut steady, mut grouped) = (open(d1.path())?, open(d3.path())?);
        let mut disturbed = Some(open_disturbed(d2.path())?);
        let mut answers = Vec::new();
        let mut disturbances = 0;
        for step in &steps {
            let index = answers.len() as u64 + 1;
            match step {
                Step::Apply(c) => {
                    let a = apply_one(&mut steady, index, c).await?;
                    // The deadline floor (a cache the steady replica keeps) holds.
                    (steady.store().check_deadline_floor())
                        .map_err(|e| format!("entry {index} ({}): {e}", c.name()))?;
                    let sm = disturbed.as_mut().ok_or("no disturbed replica")?;
                    // Every cache rebuilt from the database, as a restart would.
                    sm.reload().map_err(|e| format!("reloading the caches: {e}"))?;
                    // The leader applies the command it proposed; a follower (and the leader
                    // after a restart) the one decoded from the log's bytes.
                    let decoded = decode::<Command>(&encode(c))
                        .map_err(|e| format!("entry {index} does not decode: {e}"))?;
                    let b = apply_one(sm, index, &decoded).await?;
                    if a != b {
                        return Err(format!(
                            "entry {index} ({}): a disturbed replica answers otherwise:\n{a:?}\n{b:?}",
                            c.name()
                        ));
                    }
                    if digest(&steady)? != digest(sm)? {
                        return Err(format!(
                            "entry {index} ({}): a disturbed replica's state differs \
                             (digests differ after the entry)",
                            c.name()
                        ));
                    }
                    answers.push(a);
                }
                Step::Stale => steady.stale_caches(),
                Step::Reopen => {
                    drop(disturbed.take());
                    disturbed = Some(open_disturbed(d2.path())?);
                    disturbances += 1;
                }
                Step::Install => {
                    let sm = disturbed.as_mut().ok_or("no disturbed replica")?;
                    install(&mut steady, sm).await?;
                    if digest(&steady)? != digest(sm)? {
                        return Err(format!(
                            "after entry {}: an installed snapshot differs from its source",
                            index - 1
                        ));
                    }
                    disturbances += 1;
                }
            }
        }
        let entries: Vec<_> = (cmds.iter().cloned().enumerate())
            .map(|(i, c)| entry(i as u64 + 1, c))
            .collect();
        let all = grouped
            .apply_entries(entries)
            .await
            .map_err(|e| format!("apply failed: {e}"))?;
        if answers != all {
            return Err(format!(
                "same log, different answers:\n{answers:?}\n{all:?}"
            ));
        }
        if digest(&steady)? != digest(&grouped)? {
            return Err("same log, different state (digests differ)".into());
        }
        let rejected = answers
            .iter()
            .filter(|r| matches!(r, Response::Rejected(_)))
            .count();
        Ok(format!(
            "{} cmds {} rejected {} disturbed",
            cmds.len().min(8),
            rejected.min(4),
            disturbances.min(2)
        ))
    })
}

/// The disturbed replica: besides its caches, it applies a plain Schedule through
/// `schedule_with`, as builds before the fold do, while the steady one takes this build's fast
/// path; after every entry the two must agree (a rolling upgrade runs both).
fn open_disturbed(dir: &Path) -> Result<StateMachine, String> {
    let mut sm = open(dir)?;
    sm.apply_plain_schedules_generally();
    Ok(sm)
}

/// Applies `cmd` as entry `index` of `sm`, alone.
async fn apply_one(sm: &mut StateMachine, index: u64, cmd: &Command) -> Result<Response, String> {
    let mut r = sm
        .apply_entries([entry(index, cmd.clone())])
        .await
        .map_err(|e| format!("apply of entry {index} ({}) failed: {e}", cmd.name()))?;
    r.pop().ok_or_else(|| "no answer".to_string())
}

/// `to` installs a snapshot `from` builds now, as a follower that fell behind would.
async fn install(from: &mut StateMachine, to: &mut StateMachine) -> Result<(), String> {
    let mut snapshot = from
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .map_err(|e| format!("building a snapshot: {e}"))?;
    use openraft_legacy::network_v1::SnapshotReceiverFactory;
    let mut file = to
        .begin_receiving_snapshot()
        .await
        .map_err(|e| format!("receiving a snapshot: {e}"))?;
    tokio::io::copy(&mut snapshot.snapshot, &mut file)
        .await
        .map_err(|e| format!("copying a snapshot: {e}"))?;
    to.install_snapshot(&snapshot.meta, file)
        .await
        .map_err(|e| format!("installing a snapshot: {e}"))
}

fn digest(sm: &StateMachine) -> Result<(u64, u64), String> {
    sm.store().digest().map_err(|e| e.to_string())
}

fn tempdir() -> Result<crate::Scratch, String> {
    crate::Scratch::new()
}

/// Seed programs: every op, then a day of fires.
pub fn seed_programs() -> Vec<Vec<u8>> {
    vec![
        vec![0, 0, 1, 4, 7, 2, 0, 1, 1, 9, 4, 50, 5, 0, 5, 6, 0, 1, 1],
        vec![
            9, 0, 0, 200, 1, 3, 0, 1, 4, 1, 2, 5, 4, 200, 9, 5, 0, 8, 7, 0, 2, 1, 4, 250, 9,
        ],
        vec![10, 0, 1, 3, 1, 10, 2, 1, 10, 1, 0, 10, 2, 0, 10, 1, 2],
        vec![
            0, 1, 5, 10, 3, 2, 3, 1, 5, 20, 2, 1, 5, 4, 100, 9, 8, 1, 5, 1, 6,
        ],
        // Recurring: an interval series under fire_all, fires, a delivery, an ack of an
        // occurrence, a pause and a resume; a cron series in Lord Howe under skip.
        vec![
            11,
            0,
            3,
            1,
            0,
            0b0000_1010,
            0,
            4,
            30,
            10,
            4,
            30,
            10,
            5,
            0,
            4,
            13,
            0,
            3,
            1,
            1,
            4,
            60,
            10,
            12,
            0,
            3,
            4,
            40,
            10,
            12,
            0,
            3,
            4,
            40,
            10,
            11,
            1,
            5,
            0,
            0,
            2,
            0b0100_0100,
            0,
            4,
            200,
            20,
            4,
            250,
            20,
        ],
    ]
}

/// A real backup file (a snapshot of a state machine that ran a seed program).
pub fn seed_backup() -> Vec<Vec<u8>> {
    let Ok(dir) = tempdir() else {
        return Vec::new();
    };
    let built = runtime().block_on(async {
        let mut sm = open(dir.path()).ok()?;
        let entries: Vec<_> = (program(&seed_programs()[1]).into_iter().enumerate())
            .map(|(i, c)| entry(i as u64 + 1, c))
            .collect();
        sm.apply_entries(entries).await.ok()?;
        sm.get_snapshot_builder().await.build_snapshot().await.ok()
    });
    if built.is_none() {
        return Vec::new();
    }
    let files = std::fs::read_dir(dir.path().join("snapshot"))
        .into_iter()
        .flatten();
    files
        .flatten()
        .filter(|f| f.file_name().to_string_lossy().ends_with(".data"))
        .filter_map(|f| std::fs::read(f.path()).ok())
        .collect()
}
