//! The delivery cycle on a real state machine: leases, Ack (alone and of a whole lease), Nack,
//! ack deadlines, backoff, DEAD, Redrive and the purge after retention, each at exact
//! replicated times; and what a timer's life costs in key writes.

use super::*;
use crate::command::{Grant, Granted, LeaseRef};
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
        push: None,
    }
}

fn k(id: &str) -> TimerKey {
    TimerKey::new("ns", id)
}

fn grant(room: u32) -> Grant {
    Grant {
        namespace: "ns".into(),
        room,
        push: false,
    }
}

/// A Deliver of up to `room` timers of `ns`; the lease it made, if any.
async fn deliver(s: &mut Sm, now_ms: i64, room: u32) -> Option<Granted> {
    let r = s
        .apply(Command::Deliver {
            now_ms,
            grants: vec![grant(room)],
        })
        .await;
    let Response::Delivered(mut leases) = r else {
        panic!("{r:?}")
    };
    leases.pop().unwrap()
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

/// The ids of `ns`'s READY timers (fired, waiting for a consumer), in id order.
fn ready(s: &Sm) -> Vec<String> {
    in_phase(s, Phase::Ready)
}

fn in_phase(s: &Sm, phase: Phase) -> Vec<String> {
    all(s)
        .into_iter()
        .filter(|t| t.state == TimerState::Fired && t.phase == phase)
        .map(|t| t.key.id)
        .collect()
}

fn all(s: &Sm) -> Vec<Timer> {
    let q = ListQuery {
        namespace: "ns".into(),
        filter: ListFilter::default(),
        after: None,
        limit: 10_000,
    };
    s.store.list(&q).unwrap().timers
}

/// Rows of `ns` on the wheel, whatever their state (a moved timer must leave none behind).
fn rows(s: &Sm) -> usize {
    let prefix = crate::keys::Space::of(0).namespace_prefix("ns");
    s.store
        .db()
        .prefix_iterator_cf(cf(s.store.db(), CF_WHEEL), &prefix)
        .filter(|i| i.as_ref().unwrap().0.starts_with(&prefix))
        .count()
}

/// Proposes what the leader's purger would at `now_ms`; how many timers went.
async fn purge(s: &mut Sm, now_ms: i64) -> u64 {
    let mut purged = 0;
    for (namespace, through, _) in s
        .store
        .purgeable(now_ms, std::time::Duration::ZERO, 100_000)
        .unwrap()
    {
        let r = s
            .apply(Command::Purge {
                now_ms,
                namespace,
                through,
            })
            .await;
        let Response::Purged(n) = r else {
            panic!("{r:?}")
        };
        purged += n;
    }
    purged
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
    assert_eq!(ready(&s), ["a", "b"], "fired timers wait for a consumer");
    assert_eq!(
        s.timer("a").attempts,
        0,
        "no attempt is spent while waiting"
    );

    // A lease of one takes the first fired timer; the next grant finds what is left.
    let lease = deliver(&mut s, T0 + 20, 1).await.expect("a lease");
    assert_eq!(lease.count, 1);
    let a = s.timer("a");
    assert_eq!(
        (a.attempts, a.phase, a.wake_at_ms, a.last_delivered_at_ms),
        (1, Phase::InFlight, T0 + 20 + ACK_MS, T0 + 20)
    );
    assert_eq!(ready(&s), ["b"]);
    let Some(second) = deliver(&mut s, T0 + 21, 5).await else {
        panic!("b was ready")
    };
    assert_eq!(second.count, 1, "in flight is not handed out again");
    assert_eq!(deliver(&mut s, T0 + 22, 5).await, None, "nothing left");
    assert_eq!(in_phase(&s, Phase::InFlight), ["a", "b"]);

    // Ack: a never-made attempt is refused, the real one acks, a retry is harmless.
    assert!(refused(
        &s.apply(ack(T0 + 30, "a", 2)).await,
        "never delivered"
    ));
    let r = s.apply(ack(T0 + 30, "a", 1)).await;
    assert!(matches!(&r, Response::Timer { timer, .. } if timer.state == TimerState::Acked));
    let r = s.apply(ack(T0 + 31, "a", 1)).await;
    assert!(
        matches!(&r, Response::Timer { timer, .. } if timer.finished_at_ms == T0 + 30),
        "a retried ack changes nothing: {r:?}"
    );
    // The ack deadline passes: the acked timer stays acked, the other goes back.
    s.apply(fire(T0 + 21 + ACK_MS, 100)).await;
    assert_eq!(s.timer("a").state, TimerState::Acked);
    assert_eq!(s.timer("b").phase, Phase::Backoff, "b was not acked");

    // Retention: kept while its lease settled (at the Fire that passed its deadline) less than
    // a retention ago, then purged by range; the id is free again; unfinished timers stay.
    let settled = T0 + 21 + ACK_MS;
    assert_eq!(purge(&mut s, settled + RETENTION_MS - 1).await, 0);
    assert_eq!(s.timer("a").state, TimerState::Acked);
    assert_eq!(purge(&mut s, settled + RETENTION_MS).await, 1);
    assert!(s.store.get(&k("a")).unwrap().is_none(), "not purged");
    assert_eq!(
        s.timer("b").state,
        TimerState::Fired,
        "unfinished timers stay"
    );
    assert!(created(&s.apply(schedule("a", T0 + 99_999)).await));
    assert_eq!(s.store.meta().unwrap().stored, 2);
}

#[tokio::test]
async fn a_lease_acked_whole_acks_every_delivery_in_one_write() {
    let mut s = Sm::new();
    s.apply(policy(5)).await;
    for id in ["a", "b", "c"] {
        s.apply(schedule(id, T0)).await;
    }
    s.apply(fire(T0, 100)).await;
    let lease = deliver(&mut s, T0 + 1, 10).await.unwrap();
    assert_eq!(lease.count, 3);
    let l = LeaseRef {
        namespace: "ns".into(),
        to: lease.to,
    };
    // One of them is nacked first: it is not in flight under the lease any more.
    s.apply(nack(T0 + 2, "c", 1)).await;
    let before = s.sm.store.keys_written();
    let r = s
        .apply(Command::Acks {
            now_ms: T0 + 3,
            leases: vec![l.clone()],
            acks: vec![(k("a"), 1)],
        })
        .await;
    assert_eq!(
        r,
        Response::Acked {
            leases: vec![true],
            acks: vec![Response::Timer {
                timer: s.timer("a"),
                created: false
            }],
        }
    );
    // The lease record, its deadline, the entry's progress: not a write per timer.
    let written = s.sm.store.keys_written() - before;
    assert!(written <= 5, "{written} keys for acking a lease");
    for id in ["a", "b"] {
        let t = s.timer(id);
        assert_eq!(
            (t.state, t.attempts, t.finished_at_ms),
            (TimerState::Acked, 1, T0 + 3)
        );
    }
    assert_eq!(
        s.timer("c").phase,
        Phase::Backoff,
        "the nacked one is not acked"
    );
    // A second ack of the lease is refused (the caller then acks one by one, harmlessly).
    let r = s
        .apply(Command::Acks {
            now_ms: T0 + 4,
            leases: vec![l],
            acks: vec![(k("b"), 1)],
        })
        .await;
    assert!(matches!(&r, Response::Acked { leases, .. } if leases == &[false]));
    // Its deadline passes without moving anything; its timers are purged after retention.
    s.apply(fire(T0 + 1 + ACK_MS, 100)).await;
    assert_eq!(s.timer("b").state, TimerState::Acked);
    assert_eq!(purge(&mut s, T0 + 3 + RETENTION_MS).await, 2);
    assert_eq!(
        all(&s)
            .iter()
            .map(|t| t.key.id.as_str())
            .collect::<Vec<_>>(),
        ["c"]
    );
}

#[tokio::test]
async fn unacked_deliveries_back_off_then_go_dead_and_redrive_revives() {
    let mut s = Sm::new();
    s.apply(policy(3)).await;
    s.apply(schedule("a", T0)).await;
    s.apply(fire(T0, 100)).await;
    let first_index = s.timer("a").fire_index;
    let t1 = T0 + 5;
    deliver(&mut s, t1, 1).await.unwrap();

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
        (a.phase, a.timeouts, a.wake_at_ms, a.attempts),
        (Phase::Backoff, 1, t2 + 100, 1)
    );
    assert_eq!(
        a.fire_index, first_index,
        "the same firing, delivered again"
    );
    assert!(ready(&s).is_empty(), "redelivered before its backoff");
    s.apply(fire(t2 + 100, 100)).await;
    assert_eq!(ready(&s), ["a"]);

    // Attempt 2 is nacked: a late ack of attempt 1 is stale; backoff doubles to 200 ms.
    deliver(&mut s, t2 + 110, 1).await.unwrap();
    assert_eq!(s.timer("a").attempts, 2);
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
    deliver(&mut s, t3, 1).await.unwrap();
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
    deliver(&mut s, t4 + 1, 1).await.unwrap();
    assert_eq!(
        s.timer("a").attempts,
        4,
        "(namespace, id, attempt) never repeats"
    );
    let r = s.apply(ack(t4 + 2, "a", 4)).await;
    assert!(matches!(&r, Response::Timer { timer, .. } if timer.state == TimerState::Acked));
    assert_eq!(rows(&s), 1, "every move left no row behind");
}

#[tokio::test]
async fn an_ack_after_the_deadline_still_completes_the_attempt() {
    let mut s = Sm::new();
    s.apply(policy(5)).await;
    s.apply(schedule("a", T0)).await;
    s.apply(fire(T0, 100)).await;
    deliver(&mut s, T0 + 1, 1).await.unwrap();
    s.apply(fire(T0 + 1 + ACK_MS, 100)).await;
    assert_eq!(s.timer("a").phase, Phase::Backoff);
    // Not redelivered yet: attempt 1 is still the latest, and its late ack is the real thing.
    let r = s.apply(ack(T0 + 2 + ACK_MS, "a", 1)).await;
    assert!(matches!(&r, Response::Timer { timer, .. } if timer.state == TimerState::Acked));
    s.apply(fire(T0 + 10 * ACK_MS, 100)).await;
    assert!(ready(&s).is_empty(), "an acked timer was made ready again");
    assert_eq!(deliver(&mut s, T0 + 10 * ACK_MS, 5).await, None);
}

#[tokio::test]
async fn cancelled_timers_are_purged_after_retention_without_a_consumer() {
    let mut s = Sm::new();
    s.apply(policy(5)).await;
    s.apply(schedule("c", T0 + 100_000)).await;
    s.apply(Command::LegacyCancel {
        now_ms: T0,
        key: k("c"),
    })
    .await;
    // The cancelled row waits where it was cancelled, not at its old fire time: the next Fire
    // passes it and lets the namespace's delivery cursor pass it too (nobody subscribes).
    assert_eq!(s.store.next_due().unwrap(), Some(T0));
    s.apply(fire(T0, 100)).await;
    assert_eq!(s.store.next_due().unwrap(), None, "nothing waits any more");
    assert_eq!(
        purge(&mut s, T0 + RETENTION_MS - 1).await,
        0,
        "kept for the retention"
    );
    assert_eq!(s.timer("c").state, TimerState::Cancelled);
    assert_eq!(purge(&mut s, T0 + RETENTION_MS).await, 1);
    assert!(s.store.get(&k("c")).unwrap().is_none());
    assert_eq!(rows(&s), 0, "the wheel is empty");
}

/// A Multi entry applies its commands in order, each seeing the ones before it (the batch is
/// not written yet, so reads go through the staged rows).
#[tokio::test]
async fn multi_commands_see_each_other() {
    let mut s = Sm::new();
    let multi = Command::Multi(vec![
        schedule("m1", T0 + 100),
        Command::LegacyCancel {
            now_ms: T0,
            key: k("m1"),
        },
        schedule("m2", T0 + 100),
        Command::LegacyReschedule {
            now_ms: T0,
            key: k("m2"),
            when: When::At(T0 + 500),
        },
        Command::LegacyCancel {
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
    assert_eq!(rows(&s), 2, "moved rows left nothing behind");
    s.apply(fire(T0 + 499, 100)).await;
    assert_eq!(
        s.timer("m2").state,
        TimerState::Pending,
        "fired at its old time"
    );
    s.apply(fire(T0 + 500, 100)).await;
    assert_eq!(s.timer("m2").state, TimerState::Fired);
    assert_eq!(s.store.next_due().unwrap(), None);
}

/// A Multi entry over timers already stored: their index entries are read in one batch before
/// the commands run, and a command that moves a row must still be seen by the next one (the
/// staged index entry wins over the one read before the move).
#[tokio::test]
async fn multi_commands_on_stored_timers_see_the_entrys_own_moves() {
    let mut s = Sm::new();
    s.apply(schedule("e1", T0 + 100)).await;
    s.apply(schedule("e2", T0 + 100)).await;
    let multi = Command::Multi(vec![
        Command::LegacyReschedule {
            now_ms: T0,
            key: k("e2"),
            when: When::At(T0 + 700),
        },
        Command::LegacyReschedule {
            now_ms: T0,
            key: k("e2"),
            when: When::At(T0 + 900),
        },
        Command::LegacyCancel {
            now_ms: T0,
            key: k("e1"),
        },
        schedule("e1", T0 + 100),
        schedule("e3", T0 + 100),
    ]);
    let Response::Multi(rs) = s.apply(multi).await else {
        panic!("not a Multi response")
    };
    assert!(matches!(&rs[0], Response::Timer { timer, .. } if timer.fire_at_ms == T0 + 700));
    assert!(
        matches!(&rs[1], Response::Timer { timer, .. } if timer.fire_at_ms == T0 + 900),
        "the second move found the row where the first put it: {:?}",
        rs[1]
    );
    assert!(
        matches!(&rs[3], Response::Timer { timer, created: false }
            if timer.state == TimerState::Cancelled),
        "the same schedule again answers the timer as it is now, cancelled: {:?}",
        rs[3]
    );
    assert!(matches!(&rs[4], Response::Timer { created: true, .. }));
    assert_eq!(s.timer("e1").state, TimerState::Cancelled);
    assert_eq!(s.timer("e2").fire_at_ms, T0 + 900);
    assert_eq!(rows(&s), 3, "moved rows left nothing behind");
    s.apply(fire(T0 + 899, 100)).await;
    assert_eq!(s.timer("e2").state, TimerState::Pending);
    s.apply(fire(T0 + 900, 100)).await;
    assert_eq!(s.timer("e2").state, TimerState::Fired);
}

/// Fire entries with grants: the entry that fires timers hands them out, up to the room.
#[tokio::test]
async fn fire_hands_out_what_it_fires() {
    let mut s = Sm::new();
    s.apply(policy(5)).await;
    for i in 0..5 {
        s.apply(schedule(&format!("t{i}"), T0 + i)).await;
    }
    let before = s.sm.store.keys_written();
    let r = s
        .apply(Command::Fire {
            now_ms: T0 + 10,
            max: 100,
            grants: vec![grant(3), grant(10)],
        })
        .await;
    let Response::Fired {
        count: 5,
        more: false,
        leases,
    } = r
    else {
        panic!("{r:?}")
    };
    assert_eq!(
        leases
            .iter()
            .map(|l| l.as_ref().unwrap().count)
            .collect::<Vec<_>>(),
        [3, 2]
    );
    let written = s.sm.store.keys_written() - before;
    assert!(
        written <= 10,
        "firing and handing out 5 timers wrote {written} keys: per entry, not per timer"
    );
    let leased = s.store.leased(leases[0].as_ref().unwrap()).unwrap();
    let ids: Vec<_> = leased.iter().map(|t| t.key.id.as_str()).collect();
    assert_eq!(ids, ["t0", "t1", "t2"], "in fire order");
    assert!(leased
        .iter()
        .all(|t| t.attempts == 1 && t.fire_index == s.next - 1));
}

mod costs;
