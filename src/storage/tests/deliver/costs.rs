//! What delivery costs: a timer's key writes from Schedule to purge, dead index entries
//! dropped by compaction, and the scans of the deadline family kept off the tombstones of
//! settled deadlines (the floor).

use super::*;

/// What a timer costs in key writes from Schedule to purge, per node: within the budget.
#[tokio::test]
async fn a_timers_whole_life_costs_at_most_four_key_writes() {
    const N: usize = 2000;
    for whole_lease in [false, true] {
        let mut s = Sm::new();
        s.apply(policy(5)).await;
        let before = s.sm.store.keys_written();
        let specs = (0..N).map(|i| spec(&format!("t{i}"), T0, "p")).collect();
        s.apply(Command::ScheduleBatch { now_ms: T0, specs }).await;
        let r = s
            .apply(Command::Fire {
                now_ms: T0,
                max: 100_000,
                grants: vec![grant(N as u32)],
            })
            .await;
        let Response::Fired { leases, .. } = r else {
            panic!("{r:?}")
        };
        let lease = leases[0].clone().unwrap();
        let (leases, acks) = if whole_lease {
            let l = LeaseRef {
                namespace: "ns".into(),
                to: lease.to,
            };
            (vec![l], Vec::new())
        } else {
            (
                Vec::new(),
                (0..N).map(|i| (k(&format!("t{i}")), 1)).collect(),
            )
        };
        s.apply(Command::Acks {
            now_ms: T0 + 1,
            leases,
            acks,
        })
        .await;
        s.apply(fire(T0 + ACK_MS, 100)).await;
        assert_eq!(purge(&mut s, T0 + ACK_MS + RETENTION_MS).await, N as u64);
        let per_timer = (s.sm.store.keys_written() - before) as f64 / N as f64;
        println!("whole_lease={whole_lease}: {per_timer:.3} key writes per timer");
        assert!(per_timer <= 4.0, "{per_timer} key writes per timer");
        assert_eq!(rows(&s), 0);
    }
}

/// Purged timers' index entries are dead at once and gone from disk once compacted; replicas
/// that compacted and ones that did not hold the same state (digests, snapshots), and the id
/// can be used again either way.
#[tokio::test]
async fn compaction_drops_dead_index_entries_without_changing_the_state() {
    const N: usize = 50;
    let (mut one, mut two) = (Sm::new(), Sm::new());
    for s in [&mut one, &mut two] {
        s.apply(policy(5)).await;
        let specs = (0..N).map(|i| spec(&format!("t{i}"), T0, "p")).collect();
        s.apply(Command::ScheduleBatch { now_ms: T0, specs }).await;
        s.apply(Command::Fire {
            now_ms: T0,
            max: 1000,
            grants: vec![grant(N as u32)],
        })
        .await;
        let acks = (0..N).map(|i| (k(&format!("t{i}")), 1)).collect();
        s.apply(Command::Acks {
            now_ms: T0 + 1,
            leases: Vec::new(),
            acks,
        })
        .await;
        s.apply(fire(T0 + ACK_MS, 100)).await;
    }
    // The purge is decided on one replica and applied to both, as the log would.
    let due = one
        .store
        .purgeable(
            T0 + ACK_MS + RETENTION_MS,
            std::time::Duration::ZERO,
            100_000,
        )
        .unwrap();
    for s in [&mut one, &mut two] {
        for (namespace, through, _) in due.clone() {
            let cmd = Command::Purge {
                now_ms: T0 + ACK_MS + RETENTION_MS,
                namespace,
                through,
            };
            assert_eq!(s.apply(cmd).await, Response::Purged(N as u64));
        }
    }
    let index_rows = |s: &Sm| {
        let db = s.store.db();
        db.iterator_cf(cf(db, CF_INDEX), rocksdb::IteratorMode::Start)
            .count()
    };
    assert_eq!(index_rows(&one), N, "dead entries wait for compaction");
    let db = one.store.db().clone();
    db.flush_cf(cf(&db, CF_INDEX)).unwrap();
    db.compact_range_cf(cf(&db, CF_INDEX), None::<&[u8]>, None::<&[u8]>);
    assert_eq!(index_rows(&one), 0, "compaction dropped the dead entries");
    assert_eq!(index_rows(&two), N);
    assert_eq!(one.store.digest().unwrap(), two.store.digest().unwrap());
    let (from_one, _) = replica_from_snapshot(&mut one.sm).await;
    let (from_two, _) = replica_from_snapshot(&mut two.sm).await;
    assert_eq!(
        from_one.store.digest().unwrap(),
        from_two.store.digest().unwrap()
    );
    assert_eq!(
        from_two.store.digest().unwrap(),
        two.store.digest().unwrap()
    );
    for s in [&mut one, &mut two] {
        assert!(s.store.get(&k("t7")).unwrap().is_none());
        assert!(all(s).is_empty(), "List shows no purged timer");
        assert!(
            created(&s.apply(schedule("t7", T0 + 9_999_999)).await),
            "the id is free"
        );
    }
    assert_eq!(one.store.digest().unwrap(), two.store.digest().unwrap());
    // A live entry survives compaction.
    db.flush_cf(cf(&db, CF_INDEX)).unwrap();
    db.compact_range_cf(cf(&db, CF_INDEX), None::<&[u8]>, None::<&[u8]>);
    assert_eq!(one.timer("t7").state, TimerState::Pending);
}

/// Counts the tombstones RocksDB walks over on this thread (a current-thread runtime applies
/// on it too), from `walked()` on.
struct Walked(rocksdb::perf::PerfContext);

fn walked() -> Walked {
    use rocksdb::perf::{set_perf_stats, PerfContext, PerfStatsLevel};
    set_perf_stats(PerfStatsLevel::EnableCount);
    let mut ctx = PerfContext::default();
    ctx.reset();
    Walked(ctx)
}

impl Walked {
    fn deletes(&self) -> u64 {
        self.0
            .metric(rocksdb::perf::PerfMetric::InternalDeleteSkippedCount)
    }
}

/// A lease's deadline is deleted when it passes (or the lease is acked whole), leaving a
/// tombstone at the head of the deadline family (keyed by time: a queue). Every Fire's expiry
/// scan and every look of the fire driver start there; walking every deadline deleted since
/// the last compaction made each cost grow with the deliveries (the raw grpcio consumer's runs got slower one after the other: 20 % of the
/// leader's CPU in `next_due`, 21 % in Fire entries). Both start at a floor below which no
/// deadline lives.
#[tokio::test]
async fn settled_deadlines_are_not_walked_again() {
    let mut s = Sm::new();
    s.apply(policy(5)).await;
    const N: i64 = 500;
    for i in 0..N {
        s.apply(schedule(&format!("t{i}"), T0 + i)).await;
    }
    for i in 0..N {
        s.apply(fire(T0 + i, 100)).await;
        let lease = deliver(&mut s, T0 + i, 1).await.expect("one ready");
        assert_eq!(lease.count, 1);
        assert!(matches!(
            s.apply(ack(T0 + i, &format!("t{i}"), 1)).await,
            Response::Timer { .. }
        ));
    }
    // Their deadlines pass: every lease closes, its deadline deleted.
    s.apply(fire(T0 + N + ACK_MS, 100)).await;
    let w = walked();
    let (next, skipped) = (s.store.next_due().unwrap(), w.deletes());
    assert_eq!(next, None, "nothing is due, no lease is open");
    assert!(
        skipped < 10,
        "the fire driver walked {skipped} settled deadlines"
    );
    // One more lease, open: the scans must still find it.
    let now = T0 + N + ACK_MS + 1;
    s.apply(schedule("last", now)).await;
    s.apply(fire(now, 100)).await;
    let lease = deliver(&mut s, now, 1).await.expect("ready");
    let w = walked();
    let (next, skipped) = (s.store.next_due().unwrap(), w.deletes());
    assert_eq!(next, Some(lease.deadline_ms));
    assert!(
        skipped < 10,
        "the fire driver walked {skipped} settled deadlines"
    );
    let w = walked();
    s.apply(fire(now + 1, 100)).await;
    let skipped = w.deletes();
    assert!(skipped < 10, "a Fire walked {skipped} settled deadlines");
    assert_eq!(s.timer("last").phase, Phase::InFlight);
    // Its deadline passes: the expiry scan finds it.
    s.apply(fire(lease.deadline_ms, 100)).await;
    assert_eq!(s.timer("last").phase, Phase::Backoff, "the lease expired");
}

/// A Fire expires at most `max` rows' worth of leases; the leases it leaves for the next one
/// are below its `now_ms`, so the floor it proves must stay at the first of them, or the next
/// Fire's scan starts past them and they never expire (`floor.rs`).
#[tokio::test]
async fn leases_a_bounded_fire_left_expire_at_the_next() {
    let mut s = Sm::new();
    s.apply(policy(5)).await;
    for id in ["a", "b", "c"] {
        s.apply(schedule(id, T0)).await;
    }
    s.apply(fire(T0, 100)).await;
    let mut deadlines = Vec::new();
    for at in [T0, T0 + 1, T0 + 2] {
        deadlines.push(deliver(&mut s, at, 1).await.expect("ready").deadline_ms);
    }
    assert_eq!(in_phase(&s, Phase::InFlight), ["a", "b", "c"]);
    // Every deadline passed; a Fire bounded to one row expires the first lease only.
    let r = s.apply(fire(deadlines[2] + 1, 1)).await;
    assert!(matches!(r, Response::Fired { more: true, .. }), "{r:?}");
    assert_eq!(in_phase(&s, Phase::InFlight), ["b", "c"]);
    s.apply(fire(deadlines[2] + 2, 100)).await;
    assert_eq!(
        in_phase(&s, Phase::InFlight),
        Vec::<String>::new(),
        "the leases the bounded Fire left expired"
    );
}

/// A deadline written below the floor (a Deliver proposed by a leader whose clock lags the
/// Fire entries before it) lowers the floor: the driver sees it due and a Fire expires it.
#[tokio::test]
async fn a_deadline_written_below_the_floor_still_expires() {
    let mut s = Sm::new();
    s.apply(policy(5)).await;
    s.apply(schedule("a", T0)).await;
    // This Fire proves no deadline lives at or before T0 + 10 s: the floor goes there.
    s.apply(fire(T0 + 10_000, 100)).await;
    let lease = deliver(&mut s, T0, 1).await.expect("ready");
    assert_eq!(lease.deadline_ms, T0 + ACK_MS, "below the floor");
    assert_eq!(s.store.next_due().unwrap(), Some(T0 + ACK_MS));
    s.apply(fire(T0 + 10_001, 100)).await;
    assert_eq!(s.timer("a").phase, Phase::Backoff, "the lease expired");
}
