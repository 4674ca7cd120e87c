//! Each rule of the checker on a small hand-made history: a clean one passes, and each broken
//! guarantee is reported under its own kind.

use super::*;
use crate::workload::{AckPath, Seen};

const T: i64 = 1_800_000_000_000;

fn timer(id: &str, state: pb::TimerState, fire_index: u64) -> pb::Timer {
    pb::Timer {
        namespace: "chaos".into(),
        id: id.into(),
        fire_at_ms: T,
        payload: id.as_bytes().to_vec(),
        state: state as i32,
        fired_at_ms: if fire_index > 0 { T + 2 } else { 0 },
        fire_index,
        finished_at_ms: if state == pb::TimerState::Acked {
            T + 50
        } else {
            0
        },
        attempts: u32::from(fire_index > 0),
        ..Default::default()
    }
}

fn op(kind: Kind, id: &str, outcome: Outcome) -> Op {
    Op {
        kind,
        ids: vec![id.into()],
        fire_at: if matches!(kind, Kind::Schedule) {
            vec![T]
        } else {
            vec![]
        },
        node: 1,
        invoke_ms: T - 1000,
        complete_ms: T - 990,
        outcome,
    }
}

fn seen(id: &str, fire_index: u64, received_ms: i64) -> Seen {
    Seen {
        id: id.into(),
        attempt: 1,
        fire_index,
        fire_at_ms: T,
        received_ms,
        path: AckPath::Unary,
    }
}

/// "a" fired, delivered and acked; "c" cancelled: all consistent.
fn clean() -> (History, BTreeMap<String, pb::Timer>) {
    let mut h = History::default();
    h.ops.push(op(Kind::Schedule, "a", Outcome::Ok(vec![])));
    h.ops.push(op(Kind::Schedule, "c", Outcome::Ok(vec![])));
    h.ops.push(op(Kind::Cancel, "c", Outcome::Ok(vec![])));
    h.deliveries.push(seen("a", 7, T + 10));
    let acked = timer("a", pb::TimerState::Acked, 7);
    h.acks
        .push(("a".into(), 1, Outcome::Ok(vec![acked.clone()])));
    let mut timers = BTreeMap::new();
    timers.insert("a".to_string(), acked);
    timers.insert("c".to_string(), timer("c", pb::TimerState::Cancelled, 0));
    (h, timers)
}

const SAME: [(u64, u64, u64); 3] = [(1, 9, 42), (2, 9, 42), (3, 9, 42)];
/// When the hand-made histories' cluster was healed (before everything in them).
const HEALED: i64 = T - 60_000;

fn kinds(f: &Findings) -> Vec<&'static str> {
    f.violations.iter().map(|v| v.kind).collect()
}

#[test]
fn a_clean_history_passes() {
    let (h, timers) = clean();
    let f = check(&h, &timers, &SAME, &[], HEALED);
    assert!(f.violations.is_empty(), "{:?}", f.violations);
}

#[test]
fn each_broken_guarantee_is_reported() {
    type Break = fn(&mut History, &mut BTreeMap<String, pb::Timer>);
    let cases: [(&str, Break); 9] = [
        ("lost acknowledged schedule", |_, t| {
            t.remove("c");
        }),
        ("fire after acknowledged cancel", |h, t| {
            t.insert("c".into(), timer("c", pb::TimerState::Acked, 9));
            h.deliveries.push(seen("c", 9, T + 5));
        }),
        ("cancelled and delivered", |h, _| {
            h.deliveries.push(seen("c", 3, T + 5))
        }),
        ("two fire transitions", |h, _| {
            h.deliveries.push(seen("a", 8, T + 900))
        }),
        ("early", |h, _| h.deliveries.push(seen("a", 7, T - 100))),
        ("phantom timer", |_, t| {
            t.insert("z".into(), timer("z", pb::TimerState::Acked, 4));
        }),
        ("acked more than once", |h, _| {
            let mut other = timer("a", pb::TimerState::Acked, 7);
            other.finished_at_ms += 1;
            h.acks.push(("a".into(), 1, Outcome::Ok(vec![other])));
        }),
        ("never delivered", |h, _| h.deliveries.clear()),
        ("refused schedule took effect", |h, t| {
            let refused = Outcome::Failed(tonic::Code::ResourceExhausted, "busy".into());
            h.ops.push(op(Kind::Schedule, "r", refused));
            t.insert("r".into(), timer("r", pb::TimerState::Pending, 0));
        }),
    ];
    for (kind, break_it) in cases {
        let (mut h, mut timers) = clean();
        break_it(&mut h, &mut timers);
        let f = check(&h, &timers, &SAME, &[], HEALED);
        assert!(kinds(&f).contains(&kind), "{kind}: got {:?}", f.violations);
    }
}

#[test]
fn replicas_that_differ_are_reported() {
    let (h, timers) = clean();
    let f = check(
        &h,
        &timers,
        &[(1, 9, 42), (2, 9, 43), (3, 9, 42)],
        &[],
        HEALED,
    );
    assert_eq!(kinds(&f), ["replicas diverge"]);
    let f = check(&h, &timers, &SAME[..2], &[], HEALED);
    assert_eq!(
        kinds(&f),
        ["replicas diverge"],
        "a missing digest is no agreement"
    );
}

#[test]
fn early_under_clock_skew_is_counted_apart() {
    let (mut h, timers) = clean();
    h.deliveries.push(seen("a", 7, T - 100));
    let skew = SkewWindow {
        from_ms: T - 2_000,
        to_ms: T - 500,
    };
    let f = check(&h, &timers, &SAME, &[skew], HEALED);
    assert!(f.violations.is_empty(), "{:?}", f.violations);
    assert_eq!(f.early_by_skew, 1);
}

#[test]
fn unknown_outcomes_may_go_either_way() {
    let (mut h, timers) = clean();
    h.ops.push(op(
        Kind::Schedule,
        "u",
        Outcome::Unknown(tonic::Code::Unavailable, "x".into()),
    ));
    h.ops.push(op(
        Kind::Cancel,
        "a",
        Outcome::Unknown(tonic::Code::Unavailable, "x".into()),
    ));
    let f = check(&h, &timers, &SAME, &[], HEALED);
    assert!(f.violations.is_empty(), "{:?}", f.violations);
    assert_eq!(f.unknown_resolved_not_done, 1);
}

#[test]
fn a_stream_ack_after_healing_that_did_not_apply_is_reported() {
    let (mut h, timers) = clean();
    let on_stream = |attempt, received_ms| Seen {
        attempt,
        path: AckPath::Stream,
        ..seen("a", 7, received_ms)
    };
    // Before healing (and settling) a stream ack may be lost: delivered again, fine.
    h.deliveries = vec![on_stream(1, T + 10), on_stream(2, T + 3_100)];
    let during = check(&h, &timers, &SAME, &[], T + 5_000);
    assert!(kinds(&during).is_empty(), "{:?}", during.violations);
    // After: its ack must take effect.
    let f = check(&h, &timers, &SAME, &[], HEALED);
    assert_eq!(
        kinds(&f),
        vec!["stream ack not applied"],
        "{:?}",
        f.violations
    );
    // So must a unary Ack answered once queued (it went the same way).
    h.deliveries[0].path = AckPath::Queued;
    let f = check(&h, &timers, &SAME, &[], HEALED);
    assert_eq!(
        kinds(&f),
        vec!["stream ack not applied"],
        "{:?}",
        f.violations
    );
    // An ack by unary Ack answered once applied (judged by `acks`) is not this rule's.
    h.deliveries[0].path = AckPath::Unary;
    assert!(kinds(&check(&h, &timers, &SAME, &[], HEALED)).is_empty());
}
