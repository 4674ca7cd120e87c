//! The delivery cycle on a real state machine: ready queue, Deliver, Ack, Nack, ack deadlines,
//! backoff, DEAD, Redrive and retention purge, each at exact replicated times.

use std::collections::HashSet;

use super::*;
use crate::namespace::Policy;
use crate::timer::Phase;

const ACK_MS: i64 = 1000;
const RETENTION_MS: i64 = 60_000;

/// A policy with round numbers and no jitter, so every deadline is predictable.
fn policy(max_attempts: u32) -> Command {
    Command::PutNamespace {
        name: "ns".into(),
        policy: Policy {
            ack_timeout_ms: ACK_MS as u64,
            max_attempts,
            backoff_min_ms: 100,
            backoff_max_ms: 10_000,
            backoff_multiplier_permille: 2000,
            backoff_jitter_percent: 0,
            retention_ms: RETENTION_MS as u64,
            ..Policy::default()
        },
    }
}

fn k(id: &str) -> TimerKey {
    TimerKey::new("ns", id)
}

fn deliver(now_ms: i64, ids: &[&str]) -> Command {
    Command::Deliver {
        now_ms,
        keys: ids.iter().map(|id| k(id)).collect(),
    }
}

fn ack(now_ms: i64, id: &str, attempt: u32) -> Command {
    Command::Ack {
        now_ms,
        key: k(id),
        attempt,
    }
}

fn nack(now_ms: i64, id: &str, attempt: u32) -> Command {
    Command::Nack {
        now_ms,
        key: k(id),
        attempt,
    }
}

fn ready(s: &Sm) -> Vec<String> {
    let keys = s.store.ready("ns", 100, &HashSet::new()).unwrap();
    keys.into_iter().map(|k| k.id).collect()
}

fn refused(r: &Response, words: &str) -> bool {
    matches!(r, Response::Rejected(Rejection::Refused { why, .. }) if why.contains(words))
}

#[tokio::test]
async fn deliver_ack_and_purge() {
    let mut s = Sm::new();
    s.apply(policy(5)).await;
    s.apply(schedule("a", T0 + 10)).await;
    s.apply(schedule("b", T0 + 10)).await;
    s.apply(fire(T0 + 10, 100)).await;
    assert_eq!(
        ready(&s),
        ["a", "b"],
        "fired timers wait in the ready queue"
    );
    assert_eq!(
        s.timer("a").attempts,
        0,
        "no attempt is spent while waiting"
    );

    // Deliver: a key twice in one entry, and a key not READY, are delivered at most once.
    let r = s.apply(deliver(T0 + 20, &["a", "a", "zz"])).await;
    let Response::Delivered(d) = r else {
        panic!("{r:?}")
    };
    assert!(d[0].is_some() && d[1].is_none() && d[2].is_none(), "{d:?}");
    let a = s.timer("a");
    assert_eq!(
        (a.attempts, a.phase, a.wake_at_ms),
        (1, Phase::InFlight, T0 + 20 + ACK_MS)
    );
    assert_eq!(ready(&s), ["b"]);
    let again = s.apply(deliver(T0 + 21, &["a"])).await;
    assert_eq!(
        again,
        Response::Delivered(vec![None]),
        "in flight is not READY"
    );

    // Ack: a never-made attempt is refused, the real one acks, a retry is harmless.
    assert!(refused(
        &s.apply(ack(T0 + 30, "a", 2)).await,
        "never delivered"
    ));
    assert!(refused(
        &s.apply(ack(T0 + 30, "b", 1)).await,
        "not delivered yet"
    ));
    let r = s.apply(ack(T0 + 30, "a", 1)).await;
    assert!(matches!(&r, Response::Timer { timer, .. } if timer.state == TimerState::Acked));
    let r = s.apply(ack(T0 + 31, "a", 1)).await;
    assert!(
        matches!(&r, Response::Timer { timer, .. } if timer.finished_at_ms == T0 + 30),
        "a retried ack changes nothing: {r:?}"
    );
    // The ack deadline no longer exists: passing it does nothing.
    s.apply(fire(T0 + 20 + ACK_MS, 100)).await;
    assert_eq!(s.timer("a").state, TimerState::Acked);

    // Retention: kept until finished_at + retention, then purged; the id is free again.
    s.apply(fire(T0 + 30 + RETENTION_MS - 1, 100)).await;
    assert_eq!(s.timer("a").state, TimerState::Acked);
    s.apply(fire(T0 + 30 + RETENTION_MS, 100)).await;
    assert!(s.store.get(&k("a")).unwrap().is_none(), "not purged");
    assert_eq!(
        s.timer("b").state,
        TimerState::Fired,
        "unfinished timers stay"
    );
    assert!(created(&s.apply(schedule("a", T0 + 99_999)).await));
}

#[tokio::test]
async fn unacked_deliveries_back_off_then_go_dead_and_redrive_revives() {
    let mut s = Sm::new();
    s.apply(policy(3)).await;
    s.apply(schedule("a", T0)).await;
    s.apply(fire(T0, 100)).await;
    let first_index = s.timer("a").fire_index;
    let t1 = T0 + 5;
    s.apply(deliver(t1, &["a"])).await;

    // Attempt 1 times out at exactly t1 + ack timeout, then backs off 100 ms.
    s.apply(fire(t1 + ACK_MS - 1, 100)).await;
    assert_eq!(
        s.timer("a").phase,
        Phase::InFlight,
        "deadline expired early"
    );
    let t2 = t1 + ACK_MS;
    s.apply(fire(t2, 100)).await;
    let a = s.timer("a");
    assert_eq!(
        (a.phase, a.timeouts, a.wake_at_ms),
        (Phase::Backoff, 1, t2 + 100)
    );
    assert!(ready(&s).is_empty(), "redelivered before its backoff");
    s.apply(fire(t2 + 100, 100)).await;
    assert_eq!(ready(&s), ["a"]);

    // Attempt 2 is nacked: a late ack of attempt 1 is stale; backoff doubles to 200 ms.
    s.apply(deliver(t2 + 110, &["a"])).await;
    assert!(refused(&s.apply(ack(t2 + 111, "a", 1)).await, "stale"));
    s.apply(nack(t2 + 120, "a", 2)).await;
    let a = s.timer("a");
    assert_eq!(
        (a.phase, a.nacks, a.wake_at_ms),
        (Phase::Backoff, 1, t2 + 320)
    );
    let retried = s.apply(nack(t2 + 121, "a", 2)).await;
    assert!(matches!(&retried, Response::Timer { timer, .. } if timer.nacks == 1));

    // Attempt 3 is the last: its deadline makes the timer DEAD, kept for retention.
    s.apply(fire(t2 + 320, 100)).await;
    let t3 = t2 + 400;
    s.apply(deliver(t3, &["a"])).await;
    s.apply(fire(t3 + ACK_MS, 100)).await;
    let a = s.timer("a");
    assert_eq!(
        (a.state, a.attempts, a.finished_at_ms),
        (TimerState::Dead, 3, t3 + ACK_MS)
    );
    assert!(refused(
        &s.apply(ack(t3 + ACK_MS + 1, "a", 3)).await,
        "DEAD"
    ));

    // Redrive: PENDING again, due now, fires with a new fire_index; attempts keep counting.
    let t4 = t3 + ACK_MS + 10;
    let r = s
        .apply(Command::Redrive {
            now_ms: t4,
            keys: vec![k("a"), k("a"), k("nope")],
        })
        .await;
    let Response::Redriven { timers, skipped } = r else {
        panic!("{r:?}")
    };
    assert_eq!(timers.len(), 1);
    assert_eq!(
        skipped,
        vec![(k("a"), Some(TimerState::Pending)), (k("nope"), None)]
    );
    assert_eq!(s.store.meta().unwrap().pending, 1);
    s.apply(fire(t4, 100)).await;
    let a = s.timer("a");
    assert_eq!((a.state, a.redrives), (TimerState::Fired, 1));
    assert!(a.fire_index > first_index);
    s.apply(deliver(t4 + 1, &["a"])).await;
    assert_eq!(
        s.timer("a").attempts,
        4,
        "(namespace, id, attempt) never repeats"
    );
    let r = s.apply(ack(t4 + 2, "a", 4)).await;
    assert!(matches!(&r, Response::Timer { timer, .. } if timer.state == TimerState::Acked));
}

#[tokio::test]
async fn an_ack_after_the_deadline_still_completes_the_attempt() {
    let mut s = Sm::new();
    s.apply(policy(5)).await;
    s.apply(schedule("a", T0)).await;
    s.apply(fire(T0, 100)).await;
    s.apply(deliver(T0 + 1, &["a"])).await;
    s.apply(fire(T0 + 1 + ACK_MS, 100)).await;
    assert_eq!(s.timer("a").phase, Phase::Backoff);
    // Not redelivered yet: attempt 1 is still the latest, and its late ack is the real thing.
    let r = s.apply(ack(T0 + 2 + ACK_MS, "a", 1)).await;
    assert!(matches!(&r, Response::Timer { timer, .. } if timer.state == TimerState::Acked));
    s.apply(fire(T0 + 10 * ACK_MS, 100)).await;
    assert!(ready(&s).is_empty(), "an acked timer was made ready again");
}

#[tokio::test]
async fn cancelled_timers_are_purged_after_retention() {
    let mut s = Sm::new();
    s.apply(policy(5)).await;
    s.apply(schedule("c", T0 + 100_000)).await;
    s.apply(Command::Cancel {
        now_ms: T0,
        key: k("c"),
    })
    .await;
    s.apply(fire(T0 + RETENTION_MS - 1, 100)).await;
    assert_eq!(s.timer("c").state, TimerState::Cancelled);
    s.apply(fire(T0 + RETENTION_MS, 100)).await;
    assert!(s.store.get(&k("c")).unwrap().is_none());
    assert_eq!(s.store.next_bucket().unwrap(), None, "the wheel is empty");
}

/// A Multi entry applies its commands in order, each seeing the ones before it (the batch is
/// not written yet, so reads go through the staged timers).
#[tokio::test]
async fn multi_commands_see_each_other() {
    let mut s = Sm::new();
    let multi = Command::Multi(vec![
        schedule("m1", T0 + 100),
        Command::Cancel {
            now_ms: T0,
            key: k("m1"),
        },
        schedule("m2", T0 + 100),
        Command::Reschedule {
            now_ms: T0,
            key: k("m2"),
            when: When::At(T0 + 500),
        },
        Command::Cancel {
            now_ms: T0,
            key: k("nope"),
        },
    ]);
    let Response::Multi(rs) = s.apply(multi).await else {
        panic!("not a Multi response")
    };
    assert_eq!(rs.len(), 5);
    assert!(
        matches!(&rs[1], Response::Timer { timer, .. } if timer.state == TimerState::Cancelled)
    );
    assert!(matches!(&rs[3], Response::Timer { timer, .. } if timer.fire_at_ms == T0 + 500));
    assert_eq!(rs[4], Response::Rejected(Rejection::NotFound(k("nope"))));
    assert_eq!(s.timer("m1").state, TimerState::Cancelled);
    assert_eq!(
        s.store.meta().unwrap().pending,
        1,
        "one timer still pending"
    );
    s.apply(fire(T0 + 499, 100)).await;
    assert_eq!(
        s.timer("m2").state,
        TimerState::Pending,
        "fired at its old time"
    );
    s.apply(fire(T0 + 500, 100)).await;
    assert_eq!(s.timer("m2").state, TimerState::Fired);
    // Only m1's purge entry is left on the wheel: the old m2 entry was really removed.
    let next = s.store.next_bucket().unwrap().unwrap();
    assert_eq!(
        next as i64,
        T0 + RETENTION_MS.max(Policy::default().retention_ms as i64)
    );
}
