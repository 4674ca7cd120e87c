//! One-shot misfire on a real state machine: a timer the cursor passes later than its
//! namespace's (or its own) max lateness becomes DEAD or EXPIRED instead of firing, is never
//! handed to a consumer, can be redriven (DEAD), and nothing is ever fired early.

use super::*;
use crate::command::{Grant, Options};
use crate::namespace::{Misfire, MisfireAction, Policy};
use crate::timer::Outcome;

fn policy(action: MisfireAction, max_lateness_ms: u64) -> Command {
    Command::SetNamespace {
        name: "ns".into(),
        policy: Policy::default(),
        push: None,
        misfire: Misfire {
            max_lateness_ms,
            action,
        },
    }
}

fn grant() -> Vec<Grant> {
    vec![Grant {
        namespace: "ns".into(),
        room: 100,
        push: false,
    }]
}

#[tokio::test]
async fn a_late_timer_goes_dead_and_is_never_delivered() {
    let mut s = Sm::new();
    s.apply(policy(MisfireAction::Dead, 1000)).await;
    s.apply(schedule("late", T0 + 10)).await;
    s.apply(schedule("soon", T0 + 2500)).await;
    // Never early: nothing before its time.
    assert_eq!(s.apply(fire(T0 + 9, 100)).await, fired(0, false));
    // After an "outage", 2.99 s late: DEAD, no fire index; the other is on time.
    let r = s
        .apply(Command::Fire {
            now_ms: T0 + 3000,
            max: 100,
            grants: grant(),
        })
        .await;
    let Response::Fired { count, leases, .. } = r else {
        panic!("{r:?}")
    };
    assert_eq!(count, 1, "only `soon` fired");
    assert_eq!(
        leases,
        vec![None],
        "no grant in the entry that rewrote a passed row"
    );
    let t = s.timer("late");
    assert_eq!(
        (t.state, t.fire_index, t.attempts),
        (TimerState::Dead, 0, 0)
    );
    assert_eq!(t.revision, 2, "PENDING -> DEAD");
    let log = t.attempt_log.last().unwrap();
    assert_eq!(log.outcome, Outcome::Misfired);
    assert!(
        log.detail.contains("2990 ms late; max_lateness 1000 ms"),
        "{log:?}"
    );
    assert_eq!(s.timer("soon").state, TimerState::Fired);
    // The next grant hands out `soon` only.
    s.apply(Command::Deliver {
        now_ms: T0 + 3001,
        grants: grant(),
    })
    .await;
    assert_eq!(
        s.timer("late").attempts,
        0,
        "a misfired timer is never delivered"
    );
    assert_eq!(s.timer("soon").attempts, 1);
    // Redriven, it fires (due now: not late).
    s.apply(Command::Redrive {
        now_ms: T0 + 4000,
        keys: vec![TimerKey::new("ns", "late")],
    })
    .await;
    s.apply(fire(T0 + 4001, 100)).await;
    assert_eq!(s.timer("late").state, TimerState::Fired);
}

#[tokio::test]
async fn skip_expires_and_a_timer_s_own_policy_wins() {
    let mut s = Sm::new();
    s.apply(policy(MisfireAction::Skip, 1000)).await;
    s.apply(schedule("ns-policy", T0 + 10)).await;
    // Its own: fire however late (overrides the namespace's skip).
    let own = |id: &str, action, max_lateness_ms| Command::Schedule {
        now_ms: T0,
        spec: spec(id, T0 + 10, "p"),
        with: Options {
            misfire: Some(Misfire {
                max_lateness_ms,
                action,
            }),
            ..Options::default()
        },
    };
    assert!(created(
        &s.apply(own("own-fire", MisfireAction::Fire, 0)).await
    ));
    // Its own: dead after 100 ms (stricter than the namespace).
    s.apply(own("own-dead", MisfireAction::Dead, 100)).await;
    // 500 ms late: the namespace's 1 s is not reached, its own 100 ms is.
    s.apply(fire(T0 + 510, 100)).await;
    assert_eq!(s.timer("ns-policy").state, TimerState::Fired);
    assert_eq!(s.timer("own-fire").state, TimerState::Fired);
    assert_eq!(s.timer("own-dead").state, TimerState::Dead);
    // 2 s late: the namespace's skip.
    s.apply(schedule("later", T0 + 600)).await;
    s.apply(own("own-fire-2", MisfireAction::Fire, 0)).await;
    s.apply(fire(T0 + 2700, 100)).await;
    let t = s.timer("later");
    assert_eq!((t.state, t.fire_index), (TimerState::Expired, 0));
    assert!(
        t.wake_at_ms > T0 + 2700,
        "kept for its retention, then purged"
    );
    assert_eq!(
        s.timer("own-fire-2").state,
        TimerState::Fired,
        "its own policy (fire) wins"
    );
    // A repeat of the same Schedule with its own policy answers the timer.
    let r = s.apply(own("own-dead", MisfireAction::Dead, 100)).await;
    assert!(matches!(r, Response::Timer { created: false, .. }), "{r:?}");
}

#[tokio::test]
async fn a_format_4_namespace_record_reads_with_misfire_off() {
    let c = crate::namespace::Config {
        policy: Policy {
            misfire: Misfire {
                max_lateness_ms: 5,
                action: MisfireAction::Skip,
            },
            ..Policy::default()
        },
        push: None,
    };
    let five = config_bytes(&c);
    assert_eq!(config_of(&five).unwrap(), c);
    let four = encode(&c); // what a format-4 build wrote: no misfire after it
    assert_eq!(config_of(&four).unwrap().policy.misfire, Misfire::default());
}
