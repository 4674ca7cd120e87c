//! Create modes, conditions, relative reschedules and revisions on a real state machine: a
//! table of (the timer as it is: absent, PENDING, FIRED) × mode → outcome, the revision a
//! timer shows through its life, and the create-only rule for repeats.

use super::*;
use crate::command::{Cond, Grant, Mode, Options, Shift};

fn with(id: &str, at: i64, payload: &str, mode: Mode, cond: Cond) -> Command {
    Command::Schedule {
        now_ms: T0,
        spec: spec(id, at, payload),
        with: Options {
            mode: Some(mode),
            cond,
            misfire: None,
        },
    }
}

/// What a command answered, in a word, and the timer's (fire time, payload) after it.
fn outcome(r: &Response) -> String {
    match r {
        Response::Timer { created: true, .. } => "created".into(),
        Response::Timer { created: false, .. } => "ok".into(),
        Response::Rejected(Rejection::NotFound(_)) => "NOT_FOUND".into(),
        Response::Rejected(Rejection::AlreadyExists(_)) => "ALREADY_EXISTS".into(),
        Response::Rejected(_) => "FAILED_PRECONDITION".into(),
        other => format!("{other:?}"),
    }
}

/// Sets up "x" as `state` (absent, PENDING at T0+100 with payload "old", or FIRED).
async fn given(state: &str) -> Sm {
    let mut s = Sm::new();
    if state != "absent" {
        s.apply(Command::LegacySchedule {
            now_ms: T0,
            spec: spec("x", T0 + 100, "old"),
        })
        .await;
    }
    if state == "fired" {
        s.apply(fire(T0 + 100, 10)).await;
    }
    s
}

#[tokio::test]
async fn each_mode_against_each_state() {
    let modes = [
        ("upsert", Mode::Upsert),
        ("debounce", Mode::Debounce { max_wait_ms: 0 }),
        ("keep_earliest", Mode::KeepEarliest),
        ("keep_latest", Mode::KeepLatest),
    ];
    // (state, mode, new time) -> (answer, fire time after, payload after, revision after)
    let table: &[(&str, &str, i64, &str, i64, &str, u64)] = &[
        ("absent", "upsert", 50, "created", 50, "new", 1),
        ("absent", "debounce", 50, "created", 50, "new", 1),
        ("absent", "keep_earliest", 50, "created", 50, "new", 1),
        ("absent", "keep_latest", 50, "created", 50, "new", 1),
        ("pending", "upsert", 50, "ok", 50, "new", 2),
        ("pending", "upsert", 500, "ok", 500, "new", 2),
        ("pending", "debounce", 500, "ok", 500, "new", 2),
        ("pending", "debounce", 50, "ok", 50, "new", 2),
        ("pending", "keep_earliest", 50, "ok", 50, "new", 2),
        ("pending", "keep_earliest", 500, "ok", 100, "old", 1),
        ("pending", "keep_latest", 500, "ok", 500, "new", 2),
        ("pending", "keep_latest", 50, "ok", 100, "old", 1),
        ("fired", "upsert", 500, "FAILED_PRECONDITION", 100, "old", 2),
        (
            "fired",
            "debounce",
            500,
            "FAILED_PRECONDITION",
            100,
            "old",
            2,
        ),
        (
            "fired",
            "keep_earliest",
            50,
            "FAILED_PRECONDITION",
            100,
            "old",
            2,
        ),
        (
            "fired",
            "keep_latest",
            500,
            "FAILED_PRECONDITION",
            100,
            "old",
            2,
        ),
    ];
    for &(state, mode, at, want, fire_at, payload, revision) in table {
        let mut s = given(state).await;
        let m = modes.iter().find(|(n, _)| *n == mode).unwrap().1;
        let r = s.apply(with("x", T0 + at, "new", m, Cond::default())).await;
        let t = s.timer("x");
        let got = (
            outcome(&r),
            t.fire_at_ms - T0,
            String::from_utf8(t.payload.clone()).unwrap(),
            t.revision,
        );
        let expected = (want.to_string(), fire_at, payload.to_string(), revision);
        assert_eq!(got, expected, "{state} × {mode} at +{at}");
        if state == "fired" {
            let msg = match r {
                Response::Rejected(rej) => rej.into_error().to_string(),
                other => panic!("{other:?}"),
            };
            assert!(
                msg.contains("FIRED (revision 2)") && msg.contains(mode),
                "{msg}"
            );
        }
    }
}

#[tokio::test]
async fn debounce_is_capped_by_max_wait_from_the_first_call() {
    let mut s = Sm::new();
    let m = Mode::Debounce { max_wait_ms: 1000 };
    let at = |now_ms: i64, delay: i64| Command::Schedule {
        now_ms,
        spec: TimerSpec {
            when: When::After(delay),
            ..spec("d", 0, "p")
        },
        with: Options {
            mode: Some(m),
            ..Options::default()
        },
    };
    assert!(created(&s.apply(at(T0, 300)).await));
    s.apply(at(T0 + 400, 300)).await;
    assert_eq!(s.timer("d").fire_at_ms, T0 + 700, "pushed later");
    s.apply(at(T0 + 900, 300)).await;
    assert_eq!(
        s.timer("d").fire_at_ms,
        T0 + 1000,
        "capped at first call + max_wait"
    );
}

#[tokio::test]
async fn conditions_name_the_state_and_revision_they_found() {
    let mut s = given("pending").await;
    let cond = |if_state, if_revision| Cond {
        if_state,
        if_revision,
    };
    let msg = |r: Response| match r {
        Response::Rejected(rej) => rej.into_error().to_string(),
        other => panic!("{other:?}"),
    };
    // Reschedule if at revision 1: applies (revision 2); again with 1: refused.
    let re = |c| Command::Reschedule {
        now_ms: T0,
        key: TimerKey::new("ns", "x"),
        shift: Shift::ExtendBy(50),
        cond: c,
    };
    assert_eq!(outcome(&s.apply(re(cond(None, Some(1)))).await), "ok");
    assert_eq!(
        s.timer("x").fire_at_ms,
        T0 + 150,
        "extended from the stored time"
    );
    let m = msg(s.apply(re(cond(None, Some(1)))).await);
    assert!(m.contains("is at revision 2 (PENDING), not 1"), "{m}");
    // Pull in, conditioned on the state.
    let pull = Command::Reschedule {
        now_ms: T0,
        key: TimerKey::new("ns", "x"),
        shift: Shift::PullIn(120),
        cond: cond(Some(TimerState::Pending), None),
    };
    assert_eq!(outcome(&s.apply(pull).await), "ok");
    assert_eq!(s.timer("x").fire_at_ms, T0 + 30);
    // Cancel if FIRED: refused naming PENDING and the revision; if PENDING at 3: done.
    let cancel = |c| Command::Cancel {
        now_ms: T0,
        key: TimerKey::new("ns", "x"),
        cond: c,
    };
    let m = msg(s.apply(cancel(cond(Some(TimerState::Fired), None))).await);
    assert!(m.contains("is PENDING (revision 3), not FIRED"), "{m}");
    let r = s
        .apply(cancel(cond(Some(TimerState::Pending), Some(3))))
        .await;
    assert_eq!(outcome(&r), "ok");
    let t = s.timer("x");
    assert_eq!((t.state, t.revision), (TimerState::Cancelled, 4));
    // Upsert conditioned on a timer that does not exist: NOT_FOUND, nothing created.
    let r = s
        .apply(with("y", T0, "p", Mode::Upsert, cond(None, Some(1))))
        .await;
    assert_eq!(outcome(&r), "NOT_FOUND");
    assert!(s.store.get(&TimerKey::new("ns", "y")).unwrap().is_none());
}

#[tokio::test]
async fn a_timer_s_revision_counts_its_changes() {
    let mut s = Sm::new();
    s.apply(Command::PutNamespace {
        name: "ns".into(),
        policy: crate::namespace::Policy {
            max_attempts: 1,
            ack_timeout_ms: 1000,
            ..Default::default()
        },
        push: None,
    })
    .await;
    s.apply(schedule("a", T0 + 10)).await;
    s.apply(schedule("b", T0 + 10)).await;
    assert_eq!(s.timer("a").revision, 1);
    s.apply(Command::LegacyReschedule {
        now_ms: T0,
        key: TimerKey::new("ns", "a"),
        when: When::At(T0 + 20),
    })
    .await;
    assert_eq!(s.timer("a").revision, 2, "rescheduled");
    s.apply(fire(T0 + 20, 10)).await;
    assert_eq!(s.timer("a").revision, 3, "fired");
    let grant = Grant {
        namespace: "ns".into(),
        room: 10,
        push: false,
    };
    s.apply(Command::Deliver {
        now_ms: T0 + 30,
        grants: vec![grant],
    })
    .await;
    assert_eq!(s.timer("a").revision, 3, "a delivery is no change of state");
    s.apply(Command::Ack {
        now_ms: T0 + 31,
        key: TimerKey::new("ns", "a"),
        attempt: 1,
    })
    .await;
    assert_eq!(s.timer("a").revision, 4, "acked");
    // b: fired (2), its only delivery expires: DEAD (3); redriven: PENDING (4), fired (5).
    s.apply(fire(T0 + 2000, 10)).await;
    assert_eq!(
        (s.timer("b").state, s.timer("b").revision),
        (TimerState::Dead, 3)
    );
    s.apply(Command::Redrive {
        now_ms: T0 + 2001,
        keys: vec![TimerKey::new("ns", "b")],
    })
    .await;
    assert_eq!(s.timer("b").revision, 4);
    s.apply(fire(T0 + 2002, 10)).await;
    assert_eq!(s.timer("b").revision, 5);
}

#[tokio::test]
async fn create_only_takes_back_the_fire_time_it_returned() {
    let mut s = Sm::new();
    let rel = |now_ms| Command::LegacySchedule {
        now_ms,
        spec: TimerSpec {
            when: When::After(5000),
            ..spec("r", 0, "p")
        },
    };
    let first = s.apply(rel(T0)).await;
    let Response::Timer {
        timer,
        created: true,
    } = first
    else {
        panic!("{first:?}")
    };
    // The absolute time the first call returned, sent back: the same timer.
    let abs = s
        .apply(Command::LegacySchedule {
            now_ms: T0 + 7,
            spec: spec("r", timer.fire_at_ms, "p"),
        })
        .await;
    assert_eq!(outcome(&abs), "ok", "{abs:?}");
    // A relative retry later: the same request, the same timer.
    assert_eq!(outcome(&s.apply(rel(T0 + 900)).await), "ok");
    // Another time, or another payload: ALREADY_EXISTS.
    for other in [
        spec("r", timer.fire_at_ms + 1, "p"),
        spec("r", timer.fire_at_ms, "q"),
    ] {
        let r = s
            .apply(Command::LegacySchedule {
                now_ms: T0,
                spec: other,
            })
            .await;
        assert_eq!(outcome(&r), "ALREADY_EXISTS");
    }
}

/// Mode, condition and shift commands for the shared workload (determinism, restart, snapshot).
pub(super) fn workload() -> Vec<Command> {
    let k = |id: &str| TimerKey::new("ns", id);
    let none = Cond::default();
    vec![
        with("c1", T0 + 90_000, "a", Mode::Upsert, none),
        with("c1", T0 + 95_000, "b", Mode::Upsert, none),
        with(
            "c2",
            T0 + 90_000,
            "a",
            Mode::Debounce { max_wait_ms: 5000 },
            none,
        ),
        with(
            "c2",
            T0 + 99_000,
            "b",
            Mode::Debounce { max_wait_ms: 5000 },
            none,
        ),
        with("c3", T0 + 91_000, "a", Mode::KeepEarliest, none),
        with("c3", T0 + 90_500, "b", Mode::KeepLatest, none),
        Command::Reschedule {
            now_ms: T0,
            key: k("c1"),
            shift: Shift::PullIn(1000),
            cond: Cond {
                if_state: None,
                if_revision: Some(2),
            },
        },
        Command::Cancel {
            now_ms: T0,
            key: k("c3"),
            cond: Cond {
                if_state: Some(TimerState::Fired),
                if_revision: None,
            },
        },
        // Misfire: a namespace policy, a timer's own, a Fire that finds both late.
        Command::SetNamespace {
            name: "late".into(),
            policy: crate::namespace::Policy::default(),
            push: None,
            misfire: crate::namespace::Misfire {
                max_lateness_ms: 500,
                action: crate::namespace::MisfireAction::Dead,
            },
        },
        Command::LegacySchedule {
            now_ms: T0,
            spec: TimerSpec {
                key: TimerKey::new("late", "x1"),
                ..spec("x1", T0 + 100_000, "p")
            },
        },
        Command::Schedule {
            now_ms: T0,
            spec: TimerSpec {
                key: TimerKey::new("late", "x2"),
                ..spec("x2", T0 + 100_000, "p")
            },
            with: Options {
                mode: None,
                cond: none,
                misfire: Some(crate::namespace::Misfire {
                    max_lateness_ms: 10,
                    action: crate::namespace::MisfireAction::Skip,
                }),
            },
        },
        fire(T0 + 102_000, 1000),
        Command::Multi(vec![
            with("c4", T0 + 92_000, "a", Mode::Upsert, none),
            with("c4", T0 + 93_000, "b", Mode::KeepLatest, none),
            Command::Cancel {
                now_ms: T0,
                key: k("c4"),
                cond: Cond {
                    if_state: None,
                    if_revision: Some(2),
                },
            },
        ]),
    ]
}
