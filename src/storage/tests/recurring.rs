//! Recurring timers on a real state machine: occurrences placed in apply, exactly once per
//! nominal time, the misfire and overlap policies at exact replicated times, pause, resume,
//! delete, and the refusals.

use super::*;
use crate::command::Grant;
use crate::recurring::{
    occurrence_id, Misfire, Overlap, Recurrence, RecurringSpec, RuleSpec, Status,
};

const SEC: i64 = 1000;

fn every(period_ms: i64) -> Recurrence {
    Recurrence::every_for_test(period_ms)
}

fn create(id: &str, recurrence: Recurrence) -> Command {
    Command::ScheduleRecurring {
        now_ms: T0,
        spec: RecurringSpec {
            key: TimerKey::new("ns", id),
            recurrence,
            payload: b"p".to_vec(),
            content_type: String::new(),
        },
    }
}

fn occ(s: &Sm, id: &str, nominal: i64) -> Option<Timer> {
    s.store
        .get(&TimerKey::new("ns", occurrence_id(id, nominal)))
        .unwrap()
}

fn recurring(s: &Sm, id: &str) -> crate::recurring::RecurringView {
    s.store
        .recurring(&TimerKey::new("ns", id), 5)
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn each_occurrence_is_placed_in_apply_and_fires_once() {
    let mut s = Sm::new();
    let r = s.apply(create("tick", every(SEC))).await;
    assert!(created(&r), "{r:?}");
    let again = s.apply(create("tick", every(SEC))).await;
    assert!(
        matches!(again, Response::Recurring { created: false, .. }),
        "{again:?}"
    );
    // Only the first occurrence exists, PENDING, named by its nominal time.
    let first = occ(&s, "tick", T0 + SEC).expect("first occurrence");
    assert_eq!(first.state, TimerState::Pending);
    assert_eq!(first.key.id, "tick@2027-01-15T08:00:01.000Z");
    assert!(
        occ(&s, "tick", T0 + 2 * SEC).is_none(),
        "only the next one exists"
    );
    assert_eq!(
        recurring(&s, "tick").upcoming_ms,
        (1..=5).map(|i| T0 + i * SEC).collect::<Vec<_>>()
    );
    // Not early.
    assert_eq!(s.apply(fire(T0 + SEC - 1, 100)).await, fired(0, false));
    for i in 1..=3 {
        let idx = s.next;
        assert_eq!(s.apply(fire(T0 + i * SEC, 100)).await, fired(1, false));
        let t = occ(&s, "tick", T0 + i * SEC).unwrap();
        assert_eq!((t.state, t.fire_index), (TimerState::Fired, idx));
        assert_eq!(
            occ(&s, "tick", T0 + (i + 1) * SEC).unwrap().state,
            TimerState::Pending
        );
    }
    // A second Fire at the same time fires nothing again.
    assert_eq!(s.apply(fire(T0 + 3 * SEC, 100)).await, fired(0, false));
    let v = recurring(&s, "tick");
    assert_eq!(
        (v.recurring.fired, v.recurring.missed, v.recurring.skipped),
        (3, 0, 0)
    );
    assert_eq!(v.recent.len(), 3);
    assert_eq!(s.store.meta().unwrap().pending, 1);
}

#[tokio::test]
async fn fire_once_after_an_outage_fires_one_catch_up() {
    let mut s = Sm::new();
    s.apply(create("t", every(SEC))).await;
    // Nothing fires for 10.5 s (no leader), then one Fire.
    assert_eq!(
        s.apply(fire(T0 + 10 * SEC + 500, 100)).await,
        fired(1, false)
    );
    assert_eq!(occ(&s, "t", T0 + SEC).unwrap().state, TimerState::Fired);
    let v = recurring(&s, "t");
    assert_eq!(v.recurring.next.unwrap().nominal_ms, T0 + 11 * SEC);
    assert_eq!(
        (v.recurring.fired, v.recurring.missed),
        (1, 9),
        "2..=10 missed"
    );
    for i in 2..=10 {
        assert!(occ(&s, "t", T0 + i * SEC).is_none());
    }
}

#[tokio::test]
async fn fire_all_fires_every_missed_occurrence_within_the_window() {
    let mut s = Sm::new();
    let mut r = every(SEC);
    r.misfire = Misfire::FireAll;
    r.catch_up_window_ms = 5_600;
    s.apply(create("t", r)).await;
    let mut now = T0 + 10 * SEC + 500;
    let mut fires = Vec::new();
    loop {
        // A caught-up occurrence is placed right after the cursor: the next Fire (a
        // millisecond later, as the leader's clock moves) passes it.
        let idx = s.next;
        now += 1;
        match s.apply(fire(now, 100)).await {
            Response::Fired { count: 0, .. } => break,
            Response::Fired { count, .. } => fires.push((idx, count)),
            other => panic!("{other:?}"),
        }
    }
    // The first (late) one, then 5..=10: those within 5.6 s of the time it fired (T0 + 10.501 s); 2..=4 were
    // missed.
    let fired_at: Vec<i64> = (1..=10)
        .filter(|i| occ(&s, "t", T0 + i * SEC).is_some())
        .collect();
    assert_eq!(fired_at, vec![1, 5, 6, 7, 8, 9, 10]);
    assert_eq!(fires.len(), 7, "one occurrence per Fire entry: {fires:?}");
    for i in [1, 5, 6, 7, 8, 9, 10] {
        assert_eq!(occ(&s, "t", T0 + i * SEC).unwrap().state, TimerState::Fired);
    }
    let v = recurring(&s, "t");
    assert_eq!((v.recurring.fired, v.recurring.missed), (7, 3));
    assert_eq!(v.recurring.next.unwrap().nominal_ms, T0 + 11 * SEC);
}

#[tokio::test]
async fn misfire_skip_drops_a_late_occurrence() {
    let mut s = Sm::new();
    let mut r = every(SEC);
    r.misfire = Misfire::Skip;
    r.max_lateness_ms = 1000;
    s.apply(create("t", r)).await;
    // 1.5 s late: dropped, never fired; the next is the first after now.
    assert_eq!(
        s.apply(fire(T0 + 2 * SEC + 500, 100)).await,
        fired(0, false)
    );
    assert!(
        occ(&s, "t", T0 + SEC).is_none(),
        "a dropped occurrence is deleted"
    );
    let v = recurring(&s, "t");
    assert_eq!((v.recurring.fired, v.recurring.missed), (0, 2));
    assert_eq!(v.recurring.next.unwrap().nominal_ms, T0 + 3 * SEC);
    // On time: fires.
    assert_eq!(
        s.apply(fire(T0 + 3 * SEC + 999, 100)).await,
        fired(1, false)
    );
    assert_eq!(
        s.store.meta().unwrap().stored,
        2,
        "the fired one and the next"
    );
}

/// Acks the occurrence at `nominal` (delivered first).
async fn deliver_and_ack(s: &mut Sm, id: &str, now: i64) {
    let grant = Grant {
        namespace: "ns".into(),
        room: 10,
        push: false,
    };
    s.apply(Command::Deliver {
        now_ms: now,
        grants: vec![grant],
    })
    .await;
    let r = s
        .apply(Command::Ack {
            now_ms: now,
            key: TimerKey::new("ns", id),
            attempt: 1,
        })
        .await;
    assert!(matches!(r, Response::Timer { .. }), "{r:?}");
}

#[tokio::test]
async fn overlap_skip_drops_occurrences_until_the_previous_is_acked() {
    let mut s = Sm::new();
    let mut r = every(SEC);
    r.overlap = Overlap::Skip;
    s.apply(create("t", r)).await;
    s.apply(fire(T0 + SEC, 100)).await;
    // The first is FIRED, not acked: the second and third are dropped.
    assert_eq!(s.apply(fire(T0 + 2 * SEC, 100)).await, fired(0, false));
    assert_eq!(s.apply(fire(T0 + 3 * SEC, 100)).await, fired(0, false));
    assert!(occ(&s, "t", T0 + 2 * SEC).is_none() && occ(&s, "t", T0 + 3 * SEC).is_none());
    assert_eq!(recurring(&s, "t").recurring.skipped, 2);
    deliver_and_ack(&mut s, &occurrence_id("t", T0 + SEC), T0 + 3 * SEC + 1).await;
    assert_eq!(s.apply(fire(T0 + 4 * SEC, 100)).await, fired(1, false));
    assert_eq!(occ(&s, "t", T0 + 4 * SEC).unwrap().state, TimerState::Fired);
}

#[tokio::test]
async fn buffer_one_holds_the_next_occurrence_until_the_previous_finishes() {
    let mut s = Sm::new();
    let mut r = every(SEC);
    r.overlap = Overlap::BufferOne;
    s.apply(create("t", r)).await;
    s.apply(fire(T0 + SEC, 100)).await;
    assert_eq!(s.apply(fire(T0 + 2 * SEC, 100)).await, fired(0, false));
    let held = occ(&s, "t", T0 + 2 * SEC).unwrap();
    assert_eq!(held.state, TimerState::Pending, "held back, not fired");
    assert!(
        occ(&s, "t", T0 + 3 * SEC).is_none(),
        "nothing planned behind it"
    );
    deliver_and_ack(&mut s, &occurrence_id("t", T0 + SEC), T0 + 2 * SEC + 10).await;
    // Re-checked a second after it was held: the previous is ACKED, so it fires.
    assert_eq!(
        s.apply(fire(T0 + 3 * SEC + 500, 100)).await,
        fired(1, false)
    );
    assert_eq!(occ(&s, "t", T0 + 2 * SEC).unwrap().state, TimerState::Fired);
    let v = recurring(&s, "t");
    assert_eq!((v.recurring.fired, v.recurring.skipped), (2, 0));
    // fire_once: the next is the first after now.
    assert_eq!(v.recurring.next.unwrap().nominal_ms, T0 + 4 * SEC);
}

#[tokio::test]
async fn pause_resume_cancel_and_refusals() {
    let mut s = Sm::new();
    s.apply(create("t", every(SEC))).await;
    s.apply(schedule("one", T0 + 10)).await;
    let pause = |key: &str, paused| Command::PauseRecurring {
        now_ms: T0 + 1500,
        key: TimerKey::new("ns", key),
        paused,
    };
    let r = s.apply(pause("one", true)).await;
    assert!(
        matches!(&r, Response::Rejected(Rejection::Refused { why, .. }) if why.contains("one-shot")),
        "{r:?}"
    );
    s.apply(pause("t", true)).await;
    assert!(
        occ(&s, "t", T0 + SEC).is_none(),
        "pausing removes the pending occurrence"
    );
    assert_eq!(recurring(&s, "t").recurring.status, Status::Paused);
    assert_eq!(
        s.apply(fire(T0 + 5 * SEC, 100)).await,
        fired(1, false),
        "only `one`"
    );
    // Resumed at T0 + 1.5 s (its entry's time): the next is after that.
    s.apply(pause("t", false)).await;
    assert_eq!(
        recurring(&s, "t").recurring.next.unwrap().nominal_ms,
        T0 + 2 * SEC
    );
    // Reschedule of the series or of an occurrence is refused, naming what to do.
    for id in ["t".to_string(), occurrence_id("t", T0 + 2 * SEC)] {
        let r = s
            .apply(Command::LegacyReschedule {
                now_ms: T0,
                key: TimerKey::new("ns", id.clone()),
                when: When::At(T0 + 99),
            })
            .await;
        assert!(
            matches!(r, Response::Rejected(Rejection::Refused { .. })),
            "{id}: {r:?}"
        );
    }
    // An id taken by a one-shot timer, or a different rule for the series: ALREADY_EXISTS.
    for r in [create("one", every(SEC)), create("t", every(2 * SEC))] {
        let answer = s.apply(r).await;
        assert!(
            matches!(answer, Response::Rejected(Rejection::AlreadyExists(_))),
            "{answer:?}"
        );
    }
    // Cancel deletes the series and its pending occurrence; a retry answers the same.
    for _ in 0..2 {
        let r = s
            .apply(Command::LegacyCancel {
                now_ms: T0 + 1600,
                key: TimerKey::new("ns", "t"),
            })
            .await;
        assert!(
            matches!(&r, Response::Recurring { recurring, .. } if recurring.timer().state == TimerState::Cancelled),
            "{r:?}"
        );
    }
    assert!(occ(&s, "t", T0 + 2 * SEC).is_none());
    assert_eq!(s.apply(fire(T0 + 60 * SEC, 100)).await, fired(0, false));
    assert_eq!(s.store.meta().unwrap().pending, 0);
}

#[tokio::test]
async fn a_cancelled_occurrence_is_skipped_and_the_recurring_timer_goes_on() {
    cancel_an_occurrence_then_fire(&[]).await;
}

/// Review of step 3 (second, HIGH 1): the cancelled occurrence's row moved to T0+10 and a Fire
/// passed it there; the next Fire passes no row at all, yet passes the occurrence's slot, and
/// the series must go on (format 5 read `series_due` over the whole range the cursor moved;
/// format 6 read it only in the hash slots whose rows it passed, and the series stopped).
#[tokio::test]
async fn a_cancelled_occurrence_passed_by_a_fire_without_rows_still_moves_the_series_on() {
    cancel_an_occurrence_then_fire(&[T0 + 500]).await;
}

/// Cancels the first occurrence of an every-second series, applies a Fire at each of `first`
/// (each passing no timer), then the Fire at the occurrence's time: skipped, the series on.
async fn cancel_an_occurrence_then_fire(first: &[i64]) {
    let mut s = Sm::new();
    s.apply(create("t", every(SEC))).await;
    let r = s
        .apply(Command::LegacyCancel {
            now_ms: T0 + 10,
            key: TimerKey::new("ns", occurrence_id("t", T0 + SEC)),
        })
        .await;
    assert!(matches!(r, Response::Timer { .. }), "{r:?}");
    for now in first {
        assert_eq!(s.apply(fire(*now, 100)).await, fired(0, false));
    }
    assert_eq!(s.apply(fire(T0 + SEC, 100)).await, fired(0, false));
    let v = recurring(&s, "t");
    assert_eq!((v.recurring.fired, v.recurring.skipped), (0, 1));
    assert_eq!(v.recurring.next.unwrap().nominal_ms, T0 + 2 * SEC);
    assert_eq!(s.apply(fire(T0 + 2 * SEC, 100)).await, fired(1, false));
}

#[tokio::test]
async fn end_and_max_count_end_the_recurring_timer() {
    let mut s = Sm::new();
    let mut r = every(SEC);
    r.max_count = 2;
    s.apply(create("count", r)).await;
    let mut r = every(SEC);
    r.end_ms = T0 + 1500;
    s.apply(create("end", r)).await;
    for i in 1..=4 {
        s.apply(fire(T0 + i * SEC, 100)).await;
    }
    let c = recurring(&s, "count");
    assert_eq!((c.recurring.fired, c.recurring.status), (2, Status::Ended));
    let e = recurring(&s, "end");
    assert_eq!((e.recurring.fired, e.recurring.status), (1, Status::Ended));
    assert!(c.upcoming_ms.is_empty() && c.recurring.next.is_none());
    assert_eq!(s.store.meta().unwrap().pending, 0);
}

/// A format-4 data directory (before recurring timers: no series families, format key 4)
/// opens: its timers read as before, it is rewritten into this format, and takes series.
/// `fixtures/format4` is what a format-5 build (main at 50aaefb) made of one: 20 schedules and
/// a Fire, then its format key set to 4 and the series families dropped, as a format-4 build
/// left it; `expected.txt` is what that build read of it before.
#[tokio::test]
async fn a_format_4_directory_is_upgraded_in_place() {
    let dir = super::format6::fixture_at("format4");
    let (_, mut sm) = open(&dir);
    let db = sm.store.db();
    let format: u32 =
        codec::decode(&db.get_cf(cf(db, CF_META), meta::FORMAT).unwrap().unwrap()).unwrap();
    assert_eq!(format, FORMAT);
    super::format6::same_text(
        &super::format6::observe(&sm.store, T0 + 11),
        include_str!("fixtures/format4/expected.txt"),
    );
    assert_eq!(
        sm.store
            .get(&TimerKey::new("ns", "old5"))
            .unwrap()
            .unwrap()
            .state,
        crate::timer::TimerState::Fired
    );
    let r = sm
        .apply_entries([entry(22, create("new", every(SEC)))])
        .await
        .unwrap();
    assert!(created(&r[0]), "{r:?}");
}

/// Finding 3 of issue 33: a one-shot Schedule (alone or in a batch) took a recurring timer's
/// id; then Get and Cancel acted on the one-shot while the series kept firing.
#[tokio::test]
async fn a_one_shot_schedule_cannot_take_a_recurring_timers_id() {
    let mut s = Sm::new();
    assert!(created(&s.apply(create("tick", every(SEC))).await));
    let key = TimerKey::new("ns", "tick");
    let taken = Response::Rejected(Rejection::AlreadyExists(key.clone()));
    assert_eq!(s.apply(schedule("tick", T0 + 10)).await, taken);
    let batch = Command::ScheduleBatch {
        now_ms: T0,
        specs: vec![spec("other", T0 + 10, "p"), spec("tick", T0 + 10, "p")].into(),
    };
    assert_eq!(s.apply(batch).await, taken);
    assert!(
        s.store
            .get(&TimerKey::new("ns", "other"))
            .unwrap()
            .is_none(),
        "a batch is all or none"
    );
    // In one entry with the series' creation too (a Multi: the series is only staged).
    let multi = Command::Multi(vec![
        create("tock", every(SEC)),
        schedule("tock", T0 + 10),
        Command::ScheduleBatch {
            now_ms: T0,
            specs: vec![spec("tock", T0 + 10, "p")].into(),
        },
    ]);
    let Response::Multi(answers) = s.apply(multi).await else {
        panic!("a Multi answer")
    };
    let tock = Response::Rejected(Rejection::AlreadyExists(TimerKey::new("ns", "tock")));
    assert_eq!(answers[1..], [tock.clone(), tock]);
    // The series still fires, and its id still names it.
    s.apply(fire(T0 + SEC, 100)).await;
    assert_eq!(occ(&s, "tick", T0 + SEC).unwrap().state, TimerState::Fired);
    assert!(s.store.recurring(&key, 1).unwrap().is_some());
    // A cancelled series' id stays taken (its tombstone answers retried cancels).
    s.apply(Command::LegacyCancel {
        now_ms: T0 + SEC,
        key: key.clone(),
    })
    .await;
    assert_eq!(s.apply(schedule("tick", T0 + 10)).await, taken);
}

/// Series commands for the shared workload (determinism, restart, snapshot), after its other
/// commands (its Fire entries come at T0 + 71 s and later).
pub(super) fn workload() -> Vec<Command> {
    let base = T0 + 80 * SEC;
    let at = |mut c: Command| {
        if let Command::ScheduleRecurring { now_ms, .. } = &mut c {
            *now_ms = base;
        }
        c
    };
    let mut skip = every(SEC);
    skip.overlap = Overlap::Skip;
    skip.jitter_ms = 400;
    let mut cron = every(SEC);
    cron.rule = RuleSpec::Cron {
        expr: "*/2 * * * * *".into(),
        zone: "Australia/Lord_Howe".into(),
    };
    cron.misfire = Misfire::FireAll;
    let mut cmds = vec![
        at(create("s-every", every(SEC))),
        at(create("s-skip", skip)),
        at(create("s-cron", cron)),
    ];
    for i in 1..=6 {
        cmds.push(fire(base + i * 1700, 1000));
        if i == 3 {
            cmds.push(Command::PauseRecurring {
                now_ms: base + i * 1700,
                key: TimerKey::new("ns", "s-every"),
                paused: true,
            });
        }
        if i == 5 {
            cmds.push(Command::PauseRecurring {
                now_ms: base + i * 1700,
                key: TimerKey::new("ns", "s-every"),
                paused: false,
            });
        }
    }
    cmds
}

mod zones;
