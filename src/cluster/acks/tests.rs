use super::*;
use crate::cluster::{Delivery, LeaseTag};
use crate::timer::{Timer, TimerSpec, When};
use crate::wheel::Slot;
use std::time::Duration;
use tokio::time::Instant;

fn delivery(id: &str, attempt: u32, lease: Option<&LeaseTag>) -> Delivery {
    let spec = TimerSpec {
        key: TimerKey::new("ns", id),
        when: When::At(0),
        payload: vec![],
        content_type: String::new(),
    };
    Delivery {
        timer: Timer::pending(spec, 0),
        attempt,
        deadline_ms: 10_000,
        lease: lease.cloned(),
    }
}

fn tag(to: u64, count: u32) -> LeaseTag {
    LeaseTag {
        lease: LeaseRef {
            namespace: "ns".into(),
            to: Slot::new(to, 0),
        },
        count,
        deadline_ms: 10_000,
    }
}

#[test]
fn a_lease_acked_whole_is_one_item() {
    let mut s = StreamAcks::new("ns");
    let (t, now) = (tag(1, 2), Instant::now());
    s.sent(&delivery("a", 1, Some(&t)));
    s.sent(&delivery("b", 1, Some(&t)));
    s.sent(&delivery("c", 3, None));
    assert_eq!(
        s.acked("a", 1, now),
        vec![],
        "held until the lease is whole"
    );
    assert_eq!(
        s.acked("c", 3, now),
        vec![AckItem::One(TimerKey::new("ns", "c"), 3)],
        "not from a whole lease: at once"
    );
    let items = s.acked("b", 1, now);
    assert_eq!(
        items,
        vec![AckItem::Lease {
            lease: t.lease.clone(),
            deliveries: vec![(TimerKey::new("ns", "a"), 1), (TimerKey::new("ns", "b"), 1)],
        }]
    );
    assert!(s.drain().is_empty());
}

#[test]
fn held_acks_go_one_by_one_after_the_hold_or_a_nack() {
    let mut s = StreamAcks::new("ns");
    let (t, now) = (tag(1, 3), Instant::now());
    for id in ["a", "b", "c"] {
        s.sent(&delivery(id, 1, Some(&t)));
    }
    assert!(s.acked("a", 1, now).is_empty());
    assert!(s.flush_due(now + Duration::from_millis(10), 0).is_empty());
    let flushed = s.flush_due(now + HOLD, 0);
    assert_eq!(flushed, vec![AckItem::One(TimerKey::new("ns", "a"), 1)]);
    // Broken now: later acks of the lease go at once.
    assert_eq!(
        s.acked("b", 1, now),
        vec![AckItem::One(TimerKey::new("ns", "b"), 1)]
    );
    // A stale attempt is passed on as it is (the state machine refuses it).
    assert_eq!(
        s.acked("c", 7, now),
        vec![AckItem::One(TimerKey::new("ns", "c"), 7)]
    );

    let mut s = StreamAcks::new("ns");
    let t = tag(2, 2);
    s.sent(&delivery("x", 1, Some(&t)));
    s.sent(&delivery("y", 1, Some(&t)));
    assert!(s.acked("x", 1, now).is_empty());
    assert_eq!(
        s.nacked("y", 1),
        vec![AckItem::One(TimerKey::new("ns", "x"), 1)],
        "a nack releases the held acks of its lease"
    );
}
