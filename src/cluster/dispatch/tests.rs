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
        let n = plan.grants().len();
        plan.release();
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

/// Review of issue 35: a worker cancelled at an await while its plan is out for proposal
/// (leadership moved; `while_leader` drops it) left the plan's reservation behind, and its
/// subscription's room stayed smaller for its whole life — with `max_in_flight` 1, nothing
/// more was ever granted to it. A plan dropped unused now releases itself.
#[test]
fn a_plan_dropped_before_its_entry_applied_gives_its_room_back() {
    let (_dir, d) = dispatcher();
    let _sub = d.subscribe("ns", "a", 1, false);
    let plan = d.plan(0, 1, None);
    assert_eq!(plan.grants().len(), 1);
    drop(plan); // the proposing task was cancelled
    let plan = d.plan(0, 1, None);
    assert_eq!(plan.grants().len(), 1, "the room came back");
    // What a leaked reservation did: the subscription is never granted again.
    std::mem::forget(plan);
    assert_eq!(d.plan(0, 1, None).grants().len(), 0);
}

/// A leader-side time rule in paused time: with the simulator's clock installed
/// (`sim::install`: `Clock` reads tokio's time) and tokio's time paused, the dispatch pacing's
/// waits cost no real time and its arithmetic is exact, whatever the machine's speed. The
/// bucket is empty when this node begins to lead, so at 100 a second the 100th delivery goes
/// out a second after that, and not before.
#[tokio::test(start_paused = true)]
async fn pacing_holds_a_namespace_to_its_rate_in_paused_time() {
    const EPOCH: i64 = 1_800_000_000_000;
    /// Takes the simulated world off this thread however the test ends.
    struct Installed;
    impl Drop for Installed {
        fn drop(&mut self) {
            crate::sim::uninstall();
        }
    }
    crate::sim::install(EPOCH, 1);
    let installed = Installed;
    let (_dir, d) = dispatcher();
    let clock = crate::clock::Clock::system();
    let wall = std::time::Instant::now();
    d.plan(clock.now_ms(), 1, None).release(); // this node leads from now
    let mut sent_at = Vec::new();
    for _ in 0..100 {
        d.paced("ns", (100, 50), &clock).await;
        sent_at.push(clock.now_ms() - EPOCH);
    }
    drop(installed);
    assert!(
        wall.elapsed() < Duration::from_secs(1),
        "paused time: a second of pacing took {:?} of real time",
        wall.elapsed()
    );
    // Never ahead of the rate: the n-th send no earlier than n × 10 ms after leading began.
    for (n, at) in sent_at.iter().enumerate() {
        assert!(*at >= (n as i64 + 1) * 10, "send {} at {at} ms", n + 1);
    }
    assert!(sent_at[99] <= 1_010, "and not much later: {sent_at:?}");
}
