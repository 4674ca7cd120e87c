//! The attempt log: what each kind of outcome records (a consumer's ack and nack, an ack
//! deadline that passed, a push's answer, DEAD at once), the attempt a lease holds derived
//! without a write, the log bounded to the latest ten, and every replica alike.

use super::*;
use crate::command::Grant;
use crate::namespace::Policy;
use crate::timer::{AttemptRecord, Channel, Outcome, ATTEMPT_LOG_LEN};

const ACK_MS: i64 = 1000;

fn setup_policy(max_attempts: u32) -> Command {
    Command::PutNamespace {
        name: "ns".into(),
        policy: Policy {
            ack_timeout_ms: ACK_MS as u64,
            max_attempts,
            backoff_min_ms: 10,
            backoff_max_ms: 10,
            backoff_jitter_percent: 0,
            ..Policy::default()
        },
        push: None,
    }
}

fn deliver(now_ms: i64, push: bool) -> Command {
    Command::Deliver {
        now_ms,
        grants: vec![Grant {
            namespace: "ns".into(),
            room: 10,
            push,
        }],
    }
}

fn pushed(now_ms: i64, attempt: u32, status: u16, dead: bool) -> Command {
    Command::Pushed {
        now_ms,
        key: TimerKey::new("ns", "a"),
        attempt,
        ok: (200..300).contains(&status),
        dead,
        retry_after_ms: 0,
        record: AttemptRecord {
            at_ms: now_ms,
            attempt,
            channel: Channel::Push,
            outcome: Outcome::Http(status),
            latency_ms: 7,
            detail: "x".repeat(500),
        },
    }
}

fn outcomes(t: &Timer) -> Vec<(Channel, Outcome)> {
    t.attempt_log
        .iter()
        .map(|r| (r.channel, r.outcome))
        .collect()
}

#[tokio::test]
async fn each_outcome_is_recorded_where_the_row_is_written_anyway() {
    let mut s = Sm::new();
    s.apply(setup_policy(100)).await;
    s.apply(schedule("a", T0)).await;
    s.apply(fire(T0, 100)).await;
    // Attempt 1 (Subscribe) is in flight: derived from its lease, not written.
    s.apply(deliver(T0 + 1, false)).await;
    let t = s.timer("a");
    assert_eq!(outcomes(&t), [(Channel::Subscribe, Outcome::InFlight)]);
    // Nacked by the consumer.
    let nack = Command::Nack {
        now_ms: T0 + 5,
        key: TimerKey::new("ns", "a"),
        attempt: 1,
    };
    s.apply(nack).await;
    let t = s.timer("a");
    assert_eq!(outcomes(&t), [(Channel::Subscribe, Outcome::Nacked)]);
    assert_eq!(t.attempt_log[0].latency_ms, 4);
    // Attempt 2 goes unacked past its deadline.
    s.apply(fire(T0 + 20, 100)).await;
    s.apply(deliver(T0 + 20, false)).await;
    s.apply(fire(T0 + 20 + ACK_MS, 100)).await;
    let t = s.timer("a");
    assert_eq!(
        outcomes(&t),
        [
            (Channel::Subscribe, Outcome::Nacked),
            (Channel::Subscribe, Outcome::Expired)
        ]
    );
    // Attempt 3 is a push answered 503, attempt 4 a push answered 200: ACKED.
    let t3 = T0 + 20 + ACK_MS + 20;
    s.apply(fire(t3, 100)).await;
    s.apply(deliver(t3, true)).await;
    assert_eq!(
        s.timer("a")
            .attempt_log
            .last()
            .map(|r| (r.channel, r.outcome)),
        Some((Channel::Push, Outcome::InFlight))
    );
    s.apply(pushed(t3 + 1, 3, 503, false)).await;
    s.apply(fire(t3 + 20, 100)).await;
    s.apply(deliver(t3 + 20, true)).await;
    s.apply(pushed(t3 + 21, 4, 200, false)).await;
    let t = s.timer("a");
    assert_eq!(t.state, TimerState::Acked);
    assert_eq!(
        outcomes(&t)[2..],
        [
            (Channel::Push, Outcome::Http(503)),
            (Channel::Push, Outcome::Http(200))
        ]
    );
    let detail = &t.attempt_log[2].detail;
    assert_eq!(
        detail.len(),
        crate::timer::ATTEMPT_DETAIL_BYTES,
        "detail is bounded"
    );
    // A retried outcome of the acked attempt changes nothing.
    s.apply(pushed(t3 + 30, 4, 200, false)).await;
    assert_eq!(s.timer("a"), t);
}

#[tokio::test]
async fn a_client_error_can_be_dead_at_once_and_the_log_keeps_the_latest_ten() {
    let mut s = Sm::new();
    s.apply(setup_policy(1000)).await;
    s.apply(schedule("a", T0)).await;
    let mut now = T0;
    for attempt in 1..=14u32 {
        s.apply(fire(now, 100)).await;
        s.apply(deliver(now, true)).await;
        s.apply(pushed(now + 1, attempt, 500, false)).await;
        now += 20;
    }
    let t = s.timer("a");
    assert_eq!(t.attempt_log.len(), ATTEMPT_LOG_LEN);
    assert_eq!(t.attempt_log[0].attempt, 5, "the oldest four went");
    assert_eq!(t.attempt_log[9].attempt, 14);
    // A 404 with dead_on_client_error: DEAD now, though 985 attempts are left.
    s.apply(fire(now, 100)).await;
    s.apply(deliver(now, true)).await;
    s.apply(pushed(now + 1, 15, 404, true)).await;
    let t = s.timer("a");
    assert_eq!(t.state, TimerState::Dead);
    assert_eq!(t.attempt_log.last().unwrap().outcome, Outcome::Http(404));
}

#[tokio::test]
async fn a_receivers_retry_after_holds_the_next_attempt_back_within_a_cap() {
    let mut s = Sm::new();
    s.apply(setup_policy(100)).await; // backoff 10 ms
    s.apply(schedule("a", T0)).await;
    s.apply(fire(T0, 100)).await;
    s.apply(deliver(T0, true)).await;
    // 429 with Retry-After: 60 s: the next attempt waits 60 s, not the 10 ms backoff.
    let with_wait = |now_ms, attempt, wait| match pushed(now_ms, attempt, 429, false) {
        Command::Pushed {
            now_ms,
            key,
            attempt,
            ok,
            dead,
            record,
            ..
        } => Command::Pushed {
            now_ms,
            key,
            attempt,
            ok,
            dead,
            retry_after_ms: wait,
            record,
        },
        _ => unreachable!(),
    };
    s.apply(with_wait(T0 + 1, 1, 60_000)).await;
    assert_eq!(s.timer("a").wake_at_ms, T0 + 1 + 60_000);
    s.apply(fire(T0 + 60_000, 100)).await;
    s.apply(deliver(T0 + 60_000, true)).await;
    assert_eq!(
        s.timer("a").attempts,
        1,
        "not delivered again before the wait"
    );
    // Delivered again once it passed; a wait shorter than the backoff changes nothing, and
    // one beyond the cap is cut to it.
    let t2 = T0 + 60_001;
    s.apply(fire(t2, 100)).await;
    s.apply(deliver(t2, true)).await;
    assert_eq!(s.timer("a").attempts, 2);
    s.apply(with_wait(t2 + 1, 2, 3)).await;
    assert_eq!(s.timer("a").wake_at_ms, t2 + 1 + 10);
    let t3 = t2 + 20;
    s.apply(fire(t3, 100)).await;
    s.apply(deliver(t3, true)).await;
    s.apply(with_wait(t3 + 1, 3, u64::MAX)).await;
    let cap = crate::timer::MAX_RETRY_AFTER_MS as i64;
    assert_eq!(s.timer("a").wake_at_ms, t3 + 1 + cap);
}
