//! Schedule, Fire, Cancel, Reschedule and ScheduleBatch applied: idempotence, never early,
//! bounded per entry, the cancel and reschedule rules, all or nothing.

use super::*;

#[tokio::test]
async fn schedule_is_idempotent_on_identical_content() {
    let mut s = Sm::new();
    assert!(created(&s.apply(schedule("a", T0 + 10)).await));
    let again = s.apply(schedule("a", T0 + 10)).await;
    assert!(
        matches!(again, Response::Timer { created: false, .. }),
        "{again:?}"
    );
    let other = s
        .apply(Command::LegacySchedule {
            now_ms: T0,
            spec: spec("a", T0 + 10, "x"),
        })
        .await;
    assert_eq!(
        other,
        Response::Rejected(Rejection::AlreadyExists(TimerKey::new("ns", "a")))
    );
    assert_eq!(s.store.meta().unwrap().pending, 1);
    // A relative schedule retried later (another now_ms) is still the same request.
    let rel = |now_ms| Command::LegacySchedule {
        now_ms,
        spec: TimerSpec {
            key: TimerKey::new("ns", "r"),
            when: When::After(50),
            payload: vec![],
            content_type: String::new(),
        },
    };
    assert!(created(&s.apply(rel(T0)).await));
    let r = s.apply(rel(T0 + 999)).await;
    assert!(
        matches!(&r, Response::Timer { created: false, timer } if timer.fire_at_ms == T0 + 50),
        "{r:?}"
    );
}

#[tokio::test]
async fn fires_never_early_and_records_index() {
    let mut s = Sm::new();
    s.apply(schedule("a", T0 + 10)).await;
    s.apply(schedule("b", T0 + 20)).await;
    assert_eq!(s.apply(fire(T0 + 9, 100)).await, fired(0, false));
    assert_eq!(
        s.timer("a").state,
        TimerState::Pending,
        "fired before its time"
    );
    let idx = s.next;
    assert_eq!(s.apply(fire(T0 + 10, 100)).await, fired(1, false));
    let a = s.timer("a");
    assert_eq!(
        (a.state, a.fired_at_ms, a.fire_index),
        (TimerState::Fired, T0 + 10, idx)
    );
    assert_eq!(s.timer("b").state, TimerState::Pending);
    // A lagging leader's Fire fires nothing new and does not move the cursor back.
    assert_eq!(s.apply(fire(T0 + 5, 100)).await, fired(0, false));
    assert_eq!(s.store.meta().unwrap().cursor_ms, T0 + 10);
    assert_eq!(s.timer("a").fire_index, idx, "a timer must fire once");
    s.apply(fire(T0 + 30, 100)).await;
    assert_eq!(s.timer("b").state, TimerState::Fired);
    assert_eq!(s.store.meta().unwrap().pending, 0);
    assert_eq!(
        s.store.next_due().unwrap(),
        None,
        "nothing waits for the cursor"
    );
}

/// A leader whose clock ran ahead moved the cursor past the next leader's now: that leader's
/// Fire entries pass nothing, and must still read the early heads again, or the fire driver
/// (which fires whenever a head is due) proposes empty Fire entries until its clock passes
/// the cursor. Found by the simulator (a seed whose time stood still with the log growing).
#[tokio::test]
async fn a_fire_behind_the_cursor_reads_the_early_heads_again() {
    let mut s = Sm::new();
    s.apply(schedule("a", T0 + 10)).await;
    s.apply(schedule("b", T0 + 5_000)).await;
    s.apply(fire(T0 + 2_000, 100)).await;
    assert_eq!(s.timer("a").state, TimerState::Fired);
    // Every head as early as its contract allows (at the cursor), as after a reschedule to
    // later; the driver would see a timer due at the cursor's time.
    s.store.stale_heads().unwrap();
    assert!(s.store.next_due().unwrap().unwrap() <= T0 + 2_000);
    // The next leader's clock is behind the cursor.
    assert_eq!(s.apply(fire(T0 + 1_000, 100)).await, fired(0, false));
    assert_eq!(
        s.store.next_due().unwrap(),
        Some(T0 + 5_000),
        "the heads are exact again after a Fire that passed nothing"
    );
}

#[tokio::test]
async fn fire_is_bounded_per_entry_in_key_order() {
    let mut s = Sm::new();
    for i in 0..25 {
        s.apply(schedule(&format!("t{i:02}"), T0 + (i % 3))).await;
    }
    let r1 = s.apply(fire(T0 + 100, 10)).await;
    assert_eq!(r1, fired(10, true));
    // Slot order: the 9 timers of bucket T0 (t00, t03, … t24) first, then bucket T0+1 in the
    // order they were scheduled (t01, t04, …): the 10th fire is t01 and t04 waits for the next
    // entry.
    assert_eq!(s.timer("t24").state, TimerState::Fired);
    assert_eq!(s.timer("t01").state, TimerState::Fired);
    assert_eq!(s.timer("t04").state, TimerState::Pending);
    assert_eq!(s.timer("t02").state, TimerState::Pending);
    assert_eq!(s.apply(fire(T0 + 100, 10)).await, fired(10, true));
    assert_eq!(s.apply(fire(T0 + 100, 10)).await, fired(5, false));
    assert_eq!(s.store.meta().unwrap().pending, 0);
}

#[tokio::test]
async fn schedule_in_the_past_fires_at_next_fire() {
    let mut s = Sm::new();
    s.apply(schedule("x", T0 + 100)).await;
    s.apply(fire(T0 + 100, 10)).await; // the cursor has passed bucket T0 + 100 whole
    let r = s.apply(schedule("past", T0 - 5000)).await;
    let Response::Timer { timer, .. } = r else {
        panic!("{r:?}")
    };
    assert_eq!(
        timer.fire_at_ms,
        T0 - 5000,
        "the timer keeps the time it was given"
    );
    assert_eq!(
        s.store.next_due().unwrap(),
        Some(T0 + 101),
        "placed in the first bucket after the cursor"
    );
    s.apply(fire(T0 + 101, 10)).await;
    assert_eq!(s.timer("past").state, TimerState::Fired);
}

#[tokio::test]
async fn cancel_rules() {
    let mut s = Sm::new();
    s.apply(schedule("a", T0 + 10)).await;
    s.apply(schedule("b", T0 + 10)).await;
    let r = s
        .apply(Command::LegacyCancel {
            now_ms: T0 + 1,
            key: TimerKey::new("ns", "a"),
        })
        .await;
    assert!(
        matches!(&r, Response::Timer { timer, .. } if timer.state == TimerState::Cancelled && timer.finished_at_ms == T0 + 1)
    );
    // Retrying a successful cancel is harmless and still says cancelled.
    let again = s
        .apply(Command::LegacyCancel {
            now_ms: T0 + 2,
            key: TimerKey::new("ns", "a"),
        })
        .await;
    assert!(matches!(&again, Response::Timer { timer, .. } if timer.finished_at_ms == T0 + 1));
    s.apply(fire(T0 + 10, 10)).await;
    assert_eq!(
        s.timer("a").state,
        TimerState::Cancelled,
        "a cancelled timer fired"
    );
    let late = s
        .apply(Command::LegacyCancel {
            now_ms: T0 + 11,
            key: TimerKey::new("ns", "b"),
        })
        .await;
    assert_eq!(
        late,
        Response::Rejected(Rejection::WrongState {
            key: TimerKey::new("ns", "b"),
            state: TimerState::Fired
        })
    );
    let missing = s
        .apply(Command::LegacyCancel {
            now_ms: T0,
            key: TimerKey::new("ns", "zz"),
        })
        .await;
    assert_eq!(
        missing,
        Response::Rejected(Rejection::NotFound(TimerKey::new("ns", "zz")))
    );
    assert_eq!(s.store.meta().unwrap().pending, 0);
}

#[tokio::test]
async fn reschedule_rules() {
    let mut s = Sm::new();
    s.apply(schedule("a", T0 + 100)).await;
    s.apply(schedule("b", T0 + 100)).await;
    let key = |id: &str| TimerKey::new("ns", id);
    s.apply(Command::LegacyReschedule {
        now_ms: T0,
        key: key("a"),
        when: When::At(T0 + 10),
    })
    .await;
    s.apply(Command::LegacyReschedule {
        now_ms: T0,
        key: key("b"),
        when: When::After(500),
    })
    .await;
    assert_eq!(s.store.next_due().unwrap(), Some(T0 + 10));
    s.apply(fire(T0 + 100, 10)).await;
    assert_eq!(s.timer("a").state, TimerState::Fired, "earlier reschedule");
    assert_eq!(s.timer("b").state, TimerState::Pending, "later reschedule");
    assert_eq!(s.timer("b").fire_at_ms, T0 + 500);
    let r = s
        .apply(Command::LegacyReschedule {
            now_ms: T0,
            key: key("a"),
            when: When::At(T0),
        })
        .await;
    assert!(matches!(
        r,
        Response::Rejected(Rejection::WrongState {
            state: TimerState::Fired,
            ..
        })
    ));
    assert_eq!(s.store.meta().unwrap().pending, 1);
}

#[tokio::test]
async fn batch_is_all_or_nothing() {
    let mut s = Sm::new();
    s.apply(schedule("taken", T0)).await;
    let batch = |specs: Vec<TimerSpec>| Command::ScheduleBatch {
        now_ms: T0,
        specs: specs.into(),
    };
    let r = s
        .apply(batch(vec![
            spec("n1", T0, "p"),
            spec("taken", T0, "different"),
        ]))
        .await;
    assert!(
        matches!(r, Response::Rejected(Rejection::AlreadyExists(_))),
        "{r:?}"
    );
    assert!(
        s.store.get(&TimerKey::new("ns", "n1")).unwrap().is_none(),
        "half a batch was written"
    );
    let r = s
        .apply(batch(vec![spec("n1", T0, "p"), spec("taken", T0, "p")]))
        .await;
    let Response::Batch(answer) = r else {
        panic!("{r:?}")
    };
    let results = answer.results().unwrap();
    assert_eq!(
        results.iter().map(|(_, c)| *c).collect::<Vec<_>>(),
        vec![true, false]
    );
    assert_eq!(s.store.meta().unwrap().pending, 2);
}
