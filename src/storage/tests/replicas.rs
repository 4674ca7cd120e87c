//! DESIGN invariant 8 on hand-written histories: a replica that was just opened again (every
//! node-local cache rebuilt from disk) or that installed a snapshot writes, for each committed
//! entry, exactly what a replica that ran all along writes. Two state machines apply the same
//! entries; one is disturbed where the history says; digests are compared after every entry.
//! (`timerdb-fuzz apply` does the same on generated programs.)

use super::*;
use crate::command::{Grant, Shift};
use crate::namespace::{Misfire, MisfireAction, Policy};

/// Two replicas of one log: `steady` never restarts; `disturbed` restarts or installs a
/// snapshot of `steady` on demand.
struct Replicas {
    steady: Sm,
    disturbed: Option<StateMachine>,
    dir: TempDir,
}

impl Replicas {
    fn new() -> Self {
        let dir = TempDir::new().unwrap();
        let (_, sm) = open(&dir);
        Replicas {
            steady: Sm::new(),
            disturbed: Some(sm),
            dir,
        }
    }

    fn disturbed(&mut self) -> &mut StateMachine {
        self.disturbed.as_mut().expect("open")
    }

    /// Applies `cmd` on both; their answers and digests must agree after it.
    async fn apply(&mut self, cmd: Command) -> Response {
        let index = self.steady.next;
        let a = self.steady.apply(cmd.clone()).await;
        let b = self
            .disturbed()
            .apply_entries([entry(index, cmd.clone())])
            .await
            .unwrap()
            .pop()
            .unwrap();
        assert_eq!(a, b, "entry {index} ({}): answers differ", cmd.name());
        assert_eq!(
            self.steady.store.digest().unwrap(),
            self.disturbed().store().digest().unwrap(),
            "entry {index} ({}): a replica that restarted wrote something else",
            cmd.name()
        );
        a
    }

    /// The disturbed replica stops and opens again: its caches are rebuilt from disk.
    fn restart(&mut self) {
        drop(self.disturbed.take());
        let (_, sm) = open(&self.dir);
        self.disturbed = Some(sm);
    }

    /// The disturbed replica installs a snapshot the steady one builds now.
    async fn install(&mut self) {
        let mut snap = self
            .steady
            .sm
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        let to = self.disturbed();
        use openraft_legacy::network_v1::SnapshotReceiverFactory;
        let mut file = to.begin_receiving_snapshot().await.unwrap();
        tokio::io::copy(&mut snap.snapshot, &mut file)
            .await
            .unwrap();
        to.install_snapshot(&snap.meta, file).await.unwrap();
    }
}

fn misfire_policy(action: MisfireAction, max_lateness_ms: u64) -> Command {
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

fn reschedule(id: &str, at: i64, now_ms: i64) -> Command {
    Command::Reschedule {
        now_ms,
        key: TimerKey::new("ns", id),
        shift: Shift::To(When::At(at)),
        cond: Default::default(),
    }
}

/// Puts a finished row right after the delivery cursor (how, `finish` says), then leaves the
/// namespace's cached head early on the steady replica only (a Reschedule to later does not
/// raise a head), restarts or reinstalls the other, and fires past the early head: the Fire
/// entry must write the same on both (finding 1 of issue 33: it gave a pass lease on the
/// replica whose cache named the namespace, and moved its delivery cursor alone).
async fn early_head_after_a_finished_row(
    finish: impl AsyncFnOnce(&mut Replicas) -> i64,
    disturb: impl AsyncFnOnce(&mut Replicas),
) {
    let mut r = Replicas::new();
    let now = finish(&mut r).await;
    r.apply(schedule("b", now + 1_000)).await;
    r.apply(reschedule("b", now + 60_000, now + 1)).await;
    disturb(&mut r).await;
    // Past b's old time, before its new one: only the steady replica's head says "look".
    r.apply(fire(now + 2_000, 100)).await;
    // And on: the delivery cursors, purges and reused ids that follow agree too.
    r.apply(fire(now + 70_000, 100)).await;
    let d = r.steady.store.digest().unwrap();
    assert_eq!(d, r.disturbed().store().digest().unwrap());
}

/// A timer passed too late under misfire `skip`: finished (EXPIRED) in place, behind the
/// cursor, and that entry gives its namespace no grant.
async fn misfire_skip(r: &mut Replicas) -> i64 {
    r.apply(misfire_policy(MisfireAction::Skip, 10)).await;
    r.apply(schedule("a", T0 + 100)).await;
    r.apply(fire(T0 + 1_000, 100)).await;
    assert_eq!(r.steady.timer("a").state, TimerState::Expired);
    T0 + 1_000
}

/// A delivery whose deadline passed, retried, READY again, then acked late (unary Ack of
/// that attempt): ACKED in place after the delivery cursor.
async fn late_ack_of_a_ready_retry(r: &mut Replicas) -> i64 {
    r.apply(schedule("a", T0 + 100)).await;
    let grant = vec![Grant {
        namespace: "ns".into(),
        room: 1,
        push: false,
    }];
    r.apply(Command::Fire {
        now_ms: T0 + 100,
        max: 100,
        grants: grant,
    })
    .await;
    // The default ack timeout passes: retried after the backoff; then the cursor passes the
    // retry row and it is READY, after the delivery cursor.
    r.apply(fire(T0 + 100_000, 100)).await;
    r.apply(fire(T0 + 200_000, 100)).await;
    let a = r.steady.timer("a");
    assert_eq!(
        (a.state, a.phase),
        (TimerState::Fired, crate::timer::Phase::Ready)
    );
    let ack = r
        .apply(Command::Ack {
            now_ms: T0 + 200_001,
            key: TimerKey::new("ns", "a"),
            attempt: 1,
        })
        .await;
    assert!(matches!(ack, Response::Timer { .. }), "{ack:?}");
    assert_eq!(r.steady.timer("a").state, TimerState::Acked);
    T0 + 200_001
}

#[tokio::test]
async fn a_restarted_replica_fires_like_the_others_after_a_misfire() {
    early_head_after_a_finished_row(misfire_skip, async |r| r.restart()).await;
}

#[tokio::test]
async fn a_replica_that_installed_a_snapshot_fires_like_the_others_after_a_misfire() {
    early_head_after_a_finished_row(misfire_skip, async |r| r.install().await).await;
}

#[tokio::test]
async fn a_restarted_replica_fires_like_the_others_after_a_late_ack() {
    early_head_after_a_finished_row(late_ack_of_a_ready_retry, async |r| r.restart()).await;
}
