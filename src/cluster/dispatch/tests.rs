use super::*;

fn dispatcher() -> (tempfile::TempDir, Arc<Dispatcher>) {
    let dir = tempfile::TempDir::new().unwrap();
    let gc = crate::storage::IndexGc::new();
    let db = crate::storage::open_db(dir.path(), &gc).unwrap();
    let store = Store::new(db, crate::wheel::Wheel::default(), gc);
    (dir, Arc::new(Dispatcher::new(store)))
}

/// Finding 8 of issue 33: a settled ack freed the room of whichever subscription held the
/// timer, whatever the attempt. A consumer acking an old delivery (redelivered since to
/// another subscription) freed that one's room, and grants then exceeded its
/// `max_in_flight` (and the namespace's concurrency).
#[test]
fn a_stale_ack_frees_no_other_subscriptions_room() {
    let (_dir, d) = dispatcher();
    let (a, b) = (
        d.subscribe("ns", "a", 1, false),
        d.subscribe("ns", "b", 1, false),
    );
    let key = TimerKey::new("ns", "t");
    // Attempt 1 went to A and timed out (A no longer holds it); attempt 2 is at B.
    d.lock()
        .subs
        .get_mut(&b.id)
        .unwrap()
        .in_flight
        .insert(key.clone(), (2, i64::MAX));
    // How many subscriptions get a grant (the room is given back at once).
    let granted = |d: &Dispatcher| {
        let plan = d.plan(0, 1, None);
        let n = plan.grants.len();
        d.release(plan);
        n
    };
    assert_eq!(granted(&d), 1, "only A has room");
    // A's consumer acks attempt 1 late, on its stream; then by a unary Ack.
    a.settled(&key, 1);
    d.settled(&key, 1);
    assert_eq!(granted(&d), 1, "B is still full: its delivery is attempt 2");
    // B's own stream acking attempt 2 frees B.
    b.settled(&key, 2);
    assert_eq!(granted(&d), 2);
}
