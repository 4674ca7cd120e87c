//! The apply target's programs: bytes read as commands a leader proposes and the steps that
//! disturb a replica (`Step`), kept in the domain leaders propose from — each entry carries its
//! leader's clock, which a newly elected leader's may set back; plain Schedules in the form
//! nodes propose (the first form now and then, as older logs hold), with client retries of
//! the last request; the create modes, conditions, recurring timers, deliveries and acks.
//! `seed_programs` are the corpus's first inputs: every op, then a day of fires.

use timerdb::auth::{AccessChange, Key, Role};
use timerdb::command::{Command, Cond, Grant, Mode, Options, RecurringChange, Shift};
use timerdb::namespace::{Misfire, MisfireAction, Policy};
use timerdb::recurring::{self, occurrence_id, Overlap, Recurrence, RecurringSpec, RuleSpec};
use timerdb::timer::{TimerKey, TimerSpec, TimerState, When};

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
                // The old entry (its paused flag as proposed), today's (the paused flag kept
                // as it is when the entry applies), and a data group's copy (applied if newer
                // than the copy it has).
                if lateness % 3 == 2 {
                    Command::Policy {
                        name,
                        version: u64::from(b.next() % 8),
                        policy: Policy {
                            paused: b.next() % 2 == 0,
                            max_attempts: 1 + u32::from(b.next() % 4),
                            ..Policy::default()
                        },
                        push: None,
                        misfire,
                    }
                } else if lateness % 2 == 0 {
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
