//! Storage tests on real RocksDB in tempdirs: openraft's own storage suite, then the state
//! machine's rules (idempotent schedule, cancel/reschedule, bounded never-early fires, apply
//! determinism, restart and snapshot round trips).

use std::sync::Arc;

use openraft::storage::{RaftLogStorage, RaftSnapshotBuilder, RaftStateMachine};
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::EntryPayload;
use tempfile::TempDir;

use super::*;
use crate::command::{Command, Rejection, Response};
use crate::raft_types::{log_id, Entry, LogId, StorageError, TypeConfig, Vote};
use crate::storage::FireSignal;
use crate::timer::{Timer, TimerKey, TimerSpec, TimerState, When};
use crate::wheel::Wheel;
use crate::Error;

struct Builder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, TempDir> for Builder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachine), StorageError> {
        let dir = TempDir::new().unwrap();
        let (log, sm) = open(&dir);
        Ok((dir, log, sm))
    }
}

fn open(dir: &TempDir) -> (LogStore, StateMachine) {
    open_at(dir.path())
}

fn open_at(dir: &Path) -> (LogStore, StateMachine) {
    let gc = IndexGc::new();
    let db = open_db(dir, &gc).unwrap();
    let store = Store::new(db.clone(), Wheel::default(), gc);
    let sm = StateMachine::open(store, dir, Arc::new(FireSignal::default())).unwrap();
    (LogStore::new(db), sm)
}

#[test]
fn prefix_end_is_the_next_prefix() {
    assert_eq!(prefix_end(&[0, 2, b'a', b'b']), vec![0, 2, b'a', b'c']);
    assert_eq!(prefix_end(&[0, 1, 0xff]), vec![0, 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite() {
    Suite::test_all(Builder).await.unwrap();
}

/// AppendEntries are bounded in bytes: big entries go a few at a time, a huge one alone, and
/// small ones up to the range asked for.
#[tokio::test]
async fn log_reads_for_replication_are_bounded_in_bytes() {
    use openraft::RaftLogReader;
    let dir = TempDir::new().unwrap();
    let (mut log, sm) = open(&dir);
    let payload = |bytes: usize| Command::LegacySchedule {
        now_ms: T0,
        spec: spec("x", T0, &"p".repeat(bytes)),
    };
    let sizes = [
        700_000, 700_000, 700_000, 700_000, 5_000_000, 10, 10, 10, 10, 10,
    ];
    // Written as `append` writes them (its flush callback cannot be made outside openraft).
    drop(sm);
    let entries: Vec<Entry> = sizes
        .iter()
        .enumerate()
        .map(|(i, b)| entry(i as u64 + 1, payload(*b)))
        .collect();
    log.write_stored(&entries);
    let indexes = |v: Vec<Entry>| v.iter().map(|e| e.log_id.index).collect::<Vec<_>>();
    let cap = log_store::MAX_APPEND_BYTES;
    assert!(
        (2 * 700_000..3 * 700_000).contains(&cap),
        "the test assumes a 2 MiB cap"
    );
    assert_eq!(
        indexes(log.limited_get_log_entries(1, 11).await.unwrap()),
        [1, 2]
    );
    assert_eq!(
        indexes(log.limited_get_log_entries(3, 11).await.unwrap()),
        [3, 4]
    );
    assert_eq!(
        indexes(log.limited_get_log_entries(5, 11).await.unwrap()),
        [5],
        "an entry over the cap goes alone"
    );
    assert_eq!(
        indexes(log.limited_get_log_entries(6, 9).await.unwrap()),
        [6, 7, 8],
        "small entries up to the end asked for"
    );
}

const T0: i64 = 1_800_000_000_000;

fn entry(index: u64, cmd: Command) -> Entry {
    Entry {
        log_id: log_id(1, 1, index),
        payload: EntryPayload::Normal(cmd.into()),
    }
}

fn spec(id: &str, at: i64, payload: &str) -> TimerSpec {
    TimerSpec {
        key: TimerKey::new("ns", id),
        when: When::At(at),
        payload: payload.as_bytes().to_vec(),
        content_type: String::new(),
    }
}

/// A plain create-only Schedule, as a node proposes it.
fn schedule(id: &str, at: i64) -> Command {
    Command::Schedule {
        now_ms: T0,
        spec: spec(id, at, "p"),
        with: Default::default(),
    }
}

fn fire(now_ms: i64, max: u32) -> Command {
    Command::Fire {
        now_ms,
        max,
        grants: Vec::new(),
    }
}

/// A Fire response with no leases.
fn fired(count: u32, more: bool) -> Response {
    Response::Fired {
        count,
        more,
        leases: Vec::new(),
    }
}

/// A state machine in a tempdir that applies commands at consecutive log indexes.
struct Sm {
    _dir: TempDir,
    sm: StateMachine,
    store: Store,
    next: u64,
}

impl Sm {
    fn new() -> Self {
        let dir = TempDir::new().unwrap();
        let (_, sm) = open(&dir);
        let store = sm.store.clone();
        Sm {
            _dir: dir,
            sm,
            store,
            next: 1,
        }
    }

    async fn apply(&mut self, cmd: Command) -> Response {
        self.next += 1;
        let mut r = self
            .sm
            .apply_entries([entry(self.next - 1, cmd)])
            .await
            .unwrap();
        r.pop().unwrap()
    }

    fn timer(&self, id: &str) -> Timer {
        self.store.get(&TimerKey::new("ns", id)).unwrap().unwrap()
    }
}

/// A timer or a recurring timer was created.
fn created(r: &Response) -> bool {
    matches!(
        r,
        Response::Timer { created: true, .. } | Response::Recurring { created: true, .. }
    )
}

/// A fixed mixed workload used by the determinism and snapshot tests.
fn workload() -> Vec<Command> {
    let mut cmds = Vec::new();
    for i in 0..200 {
        cmds.push(schedule(&format!("w{i}"), T0 + (i * 7) % 50));
        if i % 9 == 0 {
            cmds.push(Command::LegacyCancel {
                now_ms: T0,
                key: TimerKey::new("ns", format!("w{i}")),
            });
        }
        if i % 40 == 39 {
            cmds.push(fire(T0 + i / 10, 17));
        }
    }
    cmds.push(Command::ScheduleBatch {
        now_ms: T0,
        specs: (0..50)
            .map(|i| spec(&format!("b{i}"), T0 + i, ""))
            .collect(),
    });
    cmds.push(fire(T0 + 30, 1000));
    // Delivery: one attempt allowed, so expired deliveries go DEAD; then ack, nack, redrive.
    cmds.push(Command::PutNamespace {
        name: "ns".into(),
        policy: crate::namespace::Policy {
            max_attempts: 1,
            ..Default::default()
        },
        push: None,
    });
    let b = |i: i64| TimerKey::new("ns", format!("b{i}"));
    cmds.push(Command::Deliver {
        now_ms: T0 + 40,
        grants: vec![crate::command::Grant {
            namespace: "ns".into(),
            room: 20,
            push: false,
        }],
    });
    for i in 0..5 {
        let (now_ms, key, attempt) = (T0 + 41, b(i), 1);
        cmds.push(Command::Ack {
            now_ms,
            key,
            attempt,
        });
    }
    cmds.push(Command::Nack {
        now_ms: T0 + 42,
        key: b(6),
        attempt: 1,
    });
    cmds.push(fire(T0 + 40 + 31_000, 1000));
    // More acks, one of a lease acked whole (the second lease: its end is found by the
    // replicas alike, from the same log).
    cmds.push(Command::Acks {
        now_ms: T0 + 40 + 31_000,
        leases: Vec::new(),
        acks: vec![(b(1), 1), (b(19), 1), (b(30), 1)],
    });
    cmds.push(Command::Redrive {
        now_ms: T0 + 40 + 31_001,
        keys: (5..10).map(b).collect(),
    });
    // Several client commands in one entry, touching the same timers.
    cmds.push(Command::Multi(vec![
        schedule("m", T0 + 60_000),
        Command::LegacyReschedule {
            now_ms: T0,
            key: TimerKey::new("ns", "m"),
            when: When::At(T0 + 70_000),
        },
        Command::Ack {
            now_ms: T0 + 50,
            key: b(0),
            attempt: 1,
        },
    ]));
    // Recurring timers: occurrences placed, fired, dropped by overlap, a pause and a resume.
    cmds.extend(recurring::workload());
    // Create modes, conditions and relative shifts.
    cmds.extend(change::workload());
    // The access state: keys, the switch, a refused revoke (the last admin).
    cmds.push(Command::Access(crate::auth::AccessChange::PutKey(
        crate::auth::Key {
            id: "ad".into(),
            name: "ops".into(),
            secret_sha256: Some([7; 32]),
            cert_name: None,
            roles: vec![crate::auth::Role::Admin],
            created_ms: T0,
        },
    )));
    cmds.push(Command::Access(crate::auth::AccessChange::Enable(true)));
    cmds.push(Command::Access(crate::auth::AccessChange::RevokeKey(
        "ad".into(),
    )));
    cmds
}

/// Builds a snapshot of `sm` and installs it into a fresh replica.
/// A snapshot of `sm` as it is now.
async fn build_snapshot(sm: &mut StateMachine) -> crate::storage::Snapshot {
    sm.get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap()
}

async fn replica_from_snapshot(sm: &mut StateMachine) -> (Sm, crate::raft_types::SnapshotMeta) {
    let snap = build_snapshot(sm).await;
    let mut other = Sm::new();
    other
        .sm
        .install_snapshot(&snap.meta, snap.snapshot)
        .await
        .unwrap();
    (other, snap.meta)
}

#[tokio::test]
async fn apply_is_deterministic() {
    let cmds = workload();
    let (mut one, mut two) = (Sm::new(), Sm::new());
    let mut answers = Vec::new();
    for c in cmds.clone() {
        answers.push(one.apply(c).await);
    }
    // The same entries, applied in one call instead of one by one.
    let entries: Vec<_> = cmds
        .into_iter()
        .enumerate()
        .map(|(i, c)| entry(i as u64 + 1, c))
        .collect();
    let grouped = two.sm.apply_entries(entries).await.unwrap();
    assert_eq!(answers, grouped, "same log, different answers");
    let (d1, d2) = (one.store.digest().unwrap(), two.store.digest().unwrap());
    assert_eq!(d1, d2, "same log, different state");
    assert_eq!(one.sm.meta, two.sm.meta);
    assert_ne!(
        d1.1,
        Sm::new().store.digest().unwrap().1,
        "digest ignores content"
    );
}

/// A state machine in `dir` with the workload applied as entries 1.., and its digest.
async fn with_workload(dir: &TempDir) -> (StateMachine, (u64, u64)) {
    let (_, mut sm) = open(dir);
    let entries: Vec<_> = workload()
        .into_iter()
        .enumerate()
        .map(|(i, c)| entry(i as u64 + 1, c))
        .collect();
    sm.apply_entries(entries).await.unwrap();
    let digest = sm.store.digest().unwrap();
    (sm, digest)
}

#[tokio::test]
async fn restart_and_snapshot_reproduce_state() {
    let dir = TempDir::new().unwrap();
    let (before, meta_before) = {
        let (sm, digest) = with_workload(&dir).await;
        (digest, sm.meta.clone())
    };
    let (mut log, mut sm) = open(&dir);
    assert_eq!(sm.store.digest().unwrap(), before, "restart changed state");
    assert_eq!(sm.meta, meta_before);
    let _ = log.get_log_state().await.unwrap();

    let (mut other, snap_meta) = replica_from_snapshot(&mut sm).await;
    assert_eq!(
        other.store.digest().unwrap(),
        before,
        "snapshot install differs"
    );
    let current = other.sm.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(current.meta.last_log_id, snap_meta.last_log_id);
}

#[tokio::test]
async fn list_filters_and_pages() {
    let mut s = Sm::new();
    for i in 0..10 {
        s.apply(schedule(&format!("l{i}"), T0 + i * 10)).await;
    }
    // Another namespace whose name extends this one's must never leak into it.
    s.apply(Command::LegacySchedule {
        now_ms: T0,
        spec: TimerSpec {
            key: TimerKey::new("nsx", "l0"),
            when: When::At(T0),
            payload: vec![],
            content_type: String::new(),
        },
    })
    .await;
    s.apply(fire(T0 + 35, 100)).await; // l0..l3 fired
    let query = |state, from, to, after: Option<&str>, limit| ListQuery {
        namespace: "ns".into(),
        filter: ListFilter {
            state,
            fire_from_ms: from,
            fire_to_ms: to,
        },
        after: after.map(String::from),
        limit,
    };
    let ids = |p: &Page| {
        p.timers
            .iter()
            .map(|t| t.key.id.clone())
            .collect::<Vec<_>>()
    };

    let all = s.store.list(&query(None, None, None, None, 100)).unwrap();
    assert_eq!(all.timers.len(), 10);
    assert_eq!(all.next_after, None);
    let fired = s
        .store
        .list(&query(Some(TimerState::Fired), None, None, None, 100))
        .unwrap();
    assert_eq!(ids(&fired), ["l0", "l1", "l2", "l3"]);
    // [T0+20, T0+50): l2..l4, whatever their state.
    let range = s
        .store
        .list(&query(None, Some(T0 + 20), Some(T0 + 50), None, 100))
        .unwrap();
    assert_eq!(ids(&range), ["l2", "l3", "l4"]);

    // Pages of 3 walk every timer exactly once.
    let (mut seen, mut after) = (Vec::new(), None);
    loop {
        let page = s
            .store
            .list(&query(None, None, None, after.as_deref(), 3))
            .unwrap();
        assert!(page.timers.len() <= 3);
        seen.extend(ids(&page));
        match page.next_after {
            Some(a) => after = Some(a),
            None => break,
        }
    }
    assert_eq!(seen, (0..10).map(|i| format!("l{i}")).collect::<Vec<_>>());
}

#[test]
fn a_data_dir_keeps_its_bucket_width() {
    let dir = TempDir::new().unwrap();
    let signal = || Arc::new(FireSignal::default());
    let gc = IndexGc::new();
    let db = open_db(dir.path(), &gc).unwrap();
    let store = |w| Store::new(db.clone(), Wheel::new(w), gc.clone());
    StateMachine::open(store(1), dir.path(), signal()).unwrap();
    StateMachine::open(store(1), dir.path(), signal()).unwrap();
    let err = StateMachine::open(store(10), dir.path(), signal())
        .err()
        .expect("reopened with another bucket width");
    assert!(err.to_string().contains("bucket width 1 ms"), "{err}");
}

#[test]
fn a_data_dir_of_another_storage_format_is_refused() {
    let gc = IndexGc::new();
    // A new directory takes this build's format and opens again.
    let dir = TempDir::new().unwrap();
    drop(open_db(dir.path(), &gc).unwrap());
    drop(open_db(dir.path(), &gc).unwrap());

    // One that records another format is refused, naming both (7 is format 6 with data
    // groups, `SHARDED_FORMAT`, which this build reads).
    let db = open_db(dir.path(), &gc).unwrap();
    let other = SHARDED_FORMAT + 1;
    db.put_cf(cf(&db, CF_META), meta::FORMAT, encode(&other))
        .unwrap();
    drop(db);
    let Err(err) = open_db(dir.path(), &gc) else {
        panic!("opened a directory of another format")
    };
    let text = err.to_string();
    assert!(
        text.contains(&format!("storage format {other}"))
            && text.contains(&format!("reads storage format {FORMAT}")),
        "{text}"
    );

    // One written before formats were recorded (data, no format key) is refused too.
    let dir = TempDir::new().unwrap();
    let db = open_db(dir.path(), &gc).unwrap();
    db.delete_cf(cf(&db, CF_META), meta::FORMAT).unwrap();
    let old_meta = cf(&db, super::migrate::V5_META);
    db.delete_cf(old_meta, super::migrate::V5_FORMAT).unwrap();
    db.put_cf(cf(&db, CF_RAFT), b"vote", b"x").unwrap();
    drop(db);
    let Err(err) = open_db(dir.path(), &gc) else {
        panic!("opened a directory without a format")
    };
    assert!(
        err.to_string().contains("older than format versions"),
        "{err}"
    );
}

#[tokio::test]
async fn namespaces_are_replicated_state() {
    use crate::namespace::Policy;
    let mut s = Sm::new();
    let unconfigured = s.store.namespace("orders").unwrap();
    assert!(!unconfigured.configured);
    assert_eq!(unconfigured.policy, Policy::default());
    let before = s.store.digest().unwrap().1;

    let policy = Policy {
        max_attempts: 9,
        max_payload_bytes: 10,
        ..Policy::default()
    };
    for name in ["orders", "billing", "audit"] {
        s.apply(Command::PutNamespace {
            name: name.into(),
            policy,
            push: None,
        })
        .await;
    }
    let got = s.store.namespace("orders").unwrap();
    assert!(got.configured);
    assert_eq!(got.policy.max_attempts, 9);
    assert_ne!(
        s.store.digest().unwrap().1,
        before,
        "the digest must cover namespaces"
    );

    let names =
        |v: Vec<crate::namespace::Namespace>| v.into_iter().map(|n| n.name).collect::<Vec<_>>();
    assert_eq!(
        names(s.store.namespaces(None, 2).unwrap()),
        ["audit", "billing"]
    );
    assert_eq!(
        names(s.store.namespaces(Some("billing"), 2).unwrap()),
        ["orders"]
    );

    // A snapshot carries them to another replica.
    let (other, _) = replica_from_snapshot(&mut s.sm).await;
    assert_eq!(
        other.store.namespace("audit").unwrap().policy.max_attempts,
        9
    );
    assert_eq!(other.store.digest().unwrap(), s.store.digest().unwrap());
}

mod access;
mod attempts;
mod change;
mod deliver;
mod folded;
mod format6;
mod forms;
mod groups;
mod log_engine;
mod misfire;
mod raft_forms;
mod recurring;
mod replicas;
mod restore;
mod schedule;
mod script;
mod snapshot;
