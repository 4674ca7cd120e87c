//! Storage format 6 (groups and hash slots, `crate::keys`): a format-5 directory written by
//! the previous build is rewritten when it opens and reads as it did; a crash part-way through
//! the rewrite starts it again; a format-5 snapshot installs; and the Fire entry moves each
//! hash slot's cursor over its own rows, in slot order across hash slots.
//!
//! `fixtures/format5` is a data directory a format-5 build (main at 50aaefb) wrote by applying
//! [`fixture_commands`] through this same harness, and `expected.txt` is what [`observe`] read
//! of it there. Rewritten by this build, it must read the same, and so must a format-6 replica
//! that applied the same commands from the start.

use std::path::Path;

use rocksdb::IteratorMode;

use super::*;
use crate::keys::{self, Space};

const G0: Space = Space::of(crate::keys::GROUP_ZERO);
use crate::storage::migrate::{V5_CFS, V5_FORMAT, V5_META};
use crate::storage::Store;
use crate::wheel::Slot;

/// What the format-5 build applied to write the fixture.
fn fixture_commands() -> Vec<Command> {
    let mut cmds = workload();
    // An open lease at the end: a deadline, rows in flight.
    cmds.push(fire(T0 + 40 + 40_000, 1000));
    cmds.push(schedule("late1", T0 + 100_000));
    cmds.push(schedule("late2", T0 + 100_001));
    cmds.push(fire(T0 + 100_005, 1000));
    cmds.push(Command::Deliver {
        now_ms: T0 + 100_006,
        grants: vec![crate::command::Grant {
            namespace: "ns".into(),
            room: 1,
            push: false,
        }],
    });
    cmds.push(schedule("future", T0 + 500_000));
    cmds
}

const OBSERVED_AT: i64 = T0 + 100_007;
const EXPECTED: &str = include_str!("fixtures/format5/expected.txt");

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        match e.file_type().unwrap().is_dir() {
            true => copy_dir(&e.path(), &dest),
            false => drop(std::fs::copy(e.path(), dest).unwrap()),
        }
    }
}

fn fixture() -> TempDir {
    fixture_at("format5")
}

/// A copy of the data directory `fixtures/<name>` (opening one writes to it).
pub(super) fn fixture_at(name: &str) -> TempDir {
    let dir = TempDir::new().unwrap();
    let from = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/storage/tests/fixtures")
        .join(name);
    copy_dir(&from.join("db"), &dir.path().join("db"));
    copy_dir(&from.join("raft-log"), &dir.path().join("raft-log"));
    dir
}

/// Asserts two observations are the same, naming the first line that differs (they are long).
pub(super) fn same_text(got: &str, want: &str) {
    for (i, (g, w)) in got.lines().zip(want.lines()).enumerate() {
        assert_eq!(g, w, "line {} differs", i + 1);
    }
    assert_eq!(got.lines().count(), want.lines().count(), "line counts");
}

/// A state machine that applied `cmds` from the start (this build's format).
async fn fresh(cmds: Vec<Command>) -> (TempDir, StateMachine) {
    let dir = TempDir::new().unwrap();
    let (_, mut sm) = open(&dir);
    let entries: Vec<_> = (cmds.into_iter().enumerate())
        .map(|(i, c)| entry(i as u64 + 1, c))
        .collect();
    sm.apply_entries(entries).await.unwrap();
    (dir, sm)
}

fn rows_of(db: &rocksdb::DB, family: &str) -> usize {
    db.iterator_cf(cf(db, family), IteratorMode::Start).count()
}

fn stored_format(db: &rocksdb::DB) -> (u32, u32) {
    let new = db.get_cf(cf(db, CF_META), meta::FORMAT).unwrap().unwrap();
    let old = db.get_cf(cf(db, V5_META), V5_FORMAT).unwrap().unwrap();
    (decode(&new).unwrap(), decode(&old).unwrap())
}

#[tokio::test]
async fn a_format_5_directory_is_rewritten_and_reads_as_it_did() {
    let dir = fixture();
    let (_, mut sm) = open(&dir);
    let db = sm.store.db().clone();
    assert_eq!(stored_format(&db), (FORMAT, FORMAT));
    // The old families are empty but for the format (which a format-5 build reads, and refuses).
    for name in V5_CFS {
        let left = rows_of(&db, name);
        assert_eq!(left, usize::from(name == V5_META), "{name}");
    }
    let migrated = observe(&sm.store, OBSERVED_AT);
    // The rewritten state reads as format 5 read it.
    same_text(&migrated, EXPECTED);
    let (_fresh_dir, mut replica) = fresh(fixture_commands()).await;
    same_text(&observe(&replica.store, OBSERVED_AT), EXPECTED);
    // Guarantee 8: replicas at one index have one digest, however each came to format 6 (the
    // one that applied from the start still holds fire records no row needs any more).
    assert_eq!(sm.store.digest().unwrap(), replica.store.digest().unwrap());

    // Both go on alike: the lease expires, the rest fires, the timers are delivered and acked.
    let next = fixture_commands().len() as u64 + 1;
    let more = [
        fire(T0 + 1_000_000, 1000),
        Command::Deliver {
            now_ms: T0 + 1_000_001,
            grants: vec![crate::command::Grant {
                namespace: "ns".into(),
                room: 1000,
                push: false,
            }],
        },
        Command::Ack {
            now_ms: T0 + 1_000_002,
            key: TimerKey::new("ns", "future"),
            attempt: 1,
        },
        schedule("after", T0 + 1_000_010),
        fire(T0 + 1_000_020, 1000),
    ];
    let mut answers = Vec::new();
    for sm in [&mut sm, &mut replica] {
        let entries: Vec<_> = (more.iter().cloned().enumerate())
            .map(|(i, c)| entry(next + i as u64, c))
            .collect();
        answers.push(format!("{:?}", sm.apply_entries(entries).await.unwrap()));
    }
    assert_eq!(answers[0], answers[1]);
    assert_eq!(sm.store.digest().unwrap(), replica.store.digest().unwrap());
    let later = T0 + 1_000_030;
    same_text(&observe(&sm.store, later), &observe(&replica.store, later));
    let future = sm
        .store
        .get(&TimerKey::new("ns", "future"))
        .unwrap()
        .unwrap();
    assert_eq!(future.state, crate::timer::TimerState::Acked);

    // And it opens again as format 6, with nothing to rewrite.
    drop(sm);
    drop(db);
    let (_, sm) = open(&dir);
    same_text(&observe(&sm.store, later), &observe(&replica.store, later));
}

/// A crash part-way through the rewrite leaves format 5 in place and some of format 6's rows
/// written: the next start clears them and rewrites from the start.
#[tokio::test]
async fn a_rewrite_cut_short_is_done_again_from_the_start() {
    let dir = fixture();
    {
        // What a crash after the first batches leaves: rows in the new families (here ones a
        // full rewrite would never write), no format 6 anywhere.
        let mut opts = rocksdb::Options::default();
        opts.create_missing_column_families(true);
        let families = [CF_LOG, CF_RAFT_LOG, CF_RAFT, CF_LOG_MOVED]
            .into_iter()
            .chain(SM_CFS)
            .chain(V5_CFS);
        let db = rocksdb::DB::open_cf(&opts, dir.path().join("db"), families).unwrap();
        db.put_cf(cf(&db, CF_WHEEL), G0.slot_key("ns", Slot::new(1, 1)), b"x")
            .unwrap();
        db.put_cf(cf(&db, CF_META), G0.meta_key(b"junk"), b"x")
            .unwrap();
        db.put_cf(
            cf(&db, CF_FIRES),
            keys::hslot_slot_key(G0.home("ns"), Slot::new(9, 9)),
            b"x",
        )
        .unwrap();
        assert!(db.get_cf(cf(&db, CF_META), meta::FORMAT).unwrap().is_none());
    }
    let (_, sm) = open(&dir);
    same_text(&observe(&sm.store, OBSERVED_AT), EXPECTED);
    let db = sm.store.db();
    assert!(db
        .get_cf(cf(db, CF_META), G0.meta_key(b"junk"))
        .unwrap()
        .is_none());
}

/// A format-5 snapshot (an older leader's) installs on a format-6 node, and a format-5 backup
/// restores: both are rewritten as a data directory is.
#[tokio::test]
async fn a_format_5_snapshot_installs_and_a_format_5_backup_restores() {
    // The fixture, opened by this build, cannot make a format-5 file; its rows can: a
    // format-5 file is the old families' rows under the format-5 magic.
    let v5 = TempDir::new().unwrap();
    let file = v5.path().join("v5.snap");
    {
        let dir = fixture();
        let mut opts = rocksdb::Options::default();
        opts.create_missing_column_families(true);
        let families = [CF_LOG, CF_RAFT_LOG, CF_RAFT, CF_LOG_MOVED]
            .into_iter()
            .chain(V5_CFS);
        let db = rocksdb::DB::open_cf(&opts, dir.path().join("db"), families).unwrap();
        let mut w = crate::storage::snapshot_file::RowWriter::create_as(&file, 5).unwrap();
        for (i, name) in V5_CFS.iter().enumerate() {
            for item in db.iterator_cf(cf(&db, name), IteratorMode::Start) {
                let (k, v) = item.unwrap();
                w.row(i as u8, &k, &v).unwrap();
            }
        }
        w.finish().unwrap();
    }
    // Installed over a replica with other timers.
    let (_dir, mut sm) = fresh(vec![schedule("other", T0 + 5)]).await;
    let meta = crate::raft_types::SnapshotMeta {
        last_log_id: Some(log_id(1, 1, fixture_commands().len() as u64)),
        last_membership: Default::default(),
    };
    let received = v5.path().join("received");
    std::fs::copy(&file, &received).unwrap();
    let data = SnapshotFile::from_std(std::fs::File::open(&received).unwrap(), received);
    sm.install_snapshot(&meta, data).await.unwrap();
    same_text(&observe(&sm.store, OBSERVED_AT), EXPECTED);
    assert!(sm
        .store
        .get(&TimerKey::new("ns", "other"))
        .unwrap()
        .is_none());

    // A backup of format 5 restores.
    let summary = crate::storage::restore::inspect(&file).unwrap();
    assert_eq!(summary.timers, 275, "{summary:?}");
    let restored = TempDir::new().unwrap();
    let node = restored.path().join("node");
    let voters = [(1, openraft::BasicNode::new("127.0.0.1:1"))].into();
    crate::storage::restore::restore(&file, &node, voters, None).unwrap();
    let (_, sm) = open_at(&node);
    let text = observe(&sm.store, OBSERVED_AT);
    // The restore rewrites the applied id and the membership; the rest reads the same.
    let strip = |t: &str| -> String {
        let kept: Vec<&str> = t.lines().filter(|l| !l.starts_with("meta ")).collect();
        kept.join("\n")
    };
    same_text(&strip(&text), &strip(EXPECTED));
}

/// Two pinned namespaces in two hash slots, more rows due than one Fire entry takes: the
/// entries take them in slot order across the hash slots (neither starves), and each fired
/// row reads the entry that fired it from its own hash slot's fire records.
#[tokio::test]
async fn fires_take_hash_slots_in_slot_order_and_neither_starves() {
    let (a, b) = ("alpha", "beta");
    assert_ne!(G0.home(a).hslot, G0.home(b).hslot, "two hash slots");
    let in_ns = schedule_in;
    let mut cmds = Vec::new();
    for i in 0..6 {
        cmds.push(in_ns(a, &format!("a{i}"), T0 + 10 + 2 * i));
        cmds.push(in_ns(b, &format!("b{i}"), T0 + 11 + 2 * i));
    }
    let (_dir, mut sm) = fresh(cmds).await;
    let r = fire_four(&mut sm, 13, T0 + 100).await;
    assert_eq!(r[0], fired(4, true));
    let state = |sm: &StateMachine, ns: &str, id: &str| {
        let t = sm.store.get(&TimerKey::new(ns, id)).unwrap().unwrap();
        (t.state, t.fire_index)
    };
    use crate::timer::TimerState::{Fired, Pending};
    // The four earliest, two of each.
    for (ns, id) in [(a, "a0"), (b, "b0"), (a, "a1"), (b, "b1")] {
        assert_eq!(state(&sm, ns, id), (Fired, 13), "{id}");
    }
    assert_eq!(state(&sm, a, "a2").0, Pending);
    assert_eq!(state(&sm, b, "b2").0, Pending);
    let cursor = sm.store.meta().unwrap().cursor;
    assert_eq!(
        cursor.bucket,
        (T0 + 13) as u64,
        "the cursor at the last row fired"
    );
    let r = fire_four(&mut sm, 14, T0 + 100).await;
    assert_eq!(r[0], fired(4, true));
    let r = fire_four(&mut sm, 15, T0 + 100).await;
    assert_eq!(r[0], fired(4, false));
    for i in 0..6 {
        let want = 13 + i / 2;
        assert_eq!(state(&sm, a, &format!("a{i}")), (Fired, want as u64));
        assert_eq!(state(&sm, b, &format!("b{i}")), (Fired, want as u64));
    }
    // The cursor took the due time whole once the rows ran out.
    let cursor = sm.store.meta().unwrap().cursor;
    assert_eq!(cursor, Slot::end_of((T0 + 100) as u64));
    // One fire record per entry and hash slot whose rows it passed: 3 entries, 2 hash slots.
    let db = sm.store.db();
    let records: Vec<_> = db
        .iterator_cf(cf(db, CF_FIRES), IteratorMode::Start)
        .map(|item| keys::decode_hslot_slot_key(&item.unwrap().0).unwrap())
        .collect();
    assert_eq!(records.len(), 6, "{records:?}");
    for ns in [a, b] {
        let of_ns = records.iter().filter(|(h, _)| *h == G0.home(ns)).count();
        assert_eq!(of_ns, 3, "{ns}");
    }
}

async fn fire_four(sm: &mut StateMachine, index: u64, now: i64) -> Vec<Response> {
    sm.apply_entries([entry(index, fire(now, 4))])
        .await
        .unwrap()
}

/// Entries applied after the fixture's (format6.rs): a Fire that passes one namespace's rows
/// only, a timer of another namespace scheduled in the past, a Fire from a leader whose clock
/// is behind, and a cancel of that timer.
pub(super) fn extra_commands() -> Vec<Command> {
    let in_ns = |ns: &str, id: &str, at: i64| Command::Schedule {
        now_ms: T0 + 199_000,
        spec: TimerSpec {
            key: TimerKey::new(ns, id),
            when: When::At(at),
            payload: b"p".to_vec(),
            content_type: String::new(),
        },
        with: Default::default(),
    };
    vec![
        in_ns("alpha", "x", T0 + 200_000),
        fire(T0 + 200_000, 1000),
        in_ns("beta", "y", T0 + 150_000),
        fire(T0 + 199_000, 1000),
        Command::LegacyCancel {
            now_ms: T0 + 200_001,
            key: TimerKey::new("beta", "y"),
        },
        in_ns("beta", "z", T0 + 150_000),
        fire(T0 + 200_010, 1000),
    ]
}

/// Review of step 3 (HIGH): replicas rewrite their state when they restart, each at its own
/// applied index, so the rewritten state must behave exactly as format 5 did from there on:
/// a Fire passing one namespace's rows, a timer of another scheduled in the past, a Fire
/// from a leader whose clock is behind, a cancel. `after_extras.txt` is what the format-5
/// build answered and read having applied all of it; this build, rewritten at the fixture's
/// index and applying the rest, and a replica of this format from the start must match it.
#[tokio::test]
async fn a_rewritten_replica_goes_on_as_format_5_would() {
    let want = include_str!("fixtures/format5/after_extras.txt");
    let at = T0 + 200_020;
    let first = fixture_commands().len() as u64 + 1;
    let extras: Vec<_> = (extra_commands().into_iter().enumerate())
        .map(|(i, c)| entry(first + i as u64, c))
        .collect();
    assert_ne!(G0.home("alpha").hslot, G0.home("beta").hslot);
    let dir = fixture();
    let (_, mut migrated) = open(&dir);
    let r = migrated.apply_entries(extras).await.unwrap();
    let mut text = observe(&migrated.store, at);
    text.push_str(&format!("answers {:?}\n", &r[r.len() - 7..]));
    same_text(&text, want);
    let mut cmds = fixture_commands();
    cmds.extend(extra_commands());
    let (_d, replica) = fresh(cmds).await;
    same_text(
        &observe(&replica.store, at),
        &want[..want.find("answers ").unwrap()],
    );
}

/// What the read side says of a state, as text: every timer (by its index), every series,
/// the counts, the namespaces and what the leader's workers would read. Written by a format-5
/// build over the fixture's state (`fixtures/format5/expected.txt`) and compared after the
/// migration. Slots and cursors are left out (their encoding is what changed).
pub(super) fn observe(store: &Store, now_ms: i64) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let mut ids = Vec::new();
    let counts = store.counts_by_namespace().unwrap();
    for (ns, _, _) in &counts {
        let mut after = None;
        loop {
            let page = store
                .list(&crate::storage::ListQuery {
                    namespace: ns.clone(),
                    filter: Default::default(),
                    limit: 100,
                    after: after.clone(),
                })
                .unwrap();
            ids.extend(page.timers.iter().map(|t| t.key.clone()));
            for t in &page.timers {
                writeln!(out, "{t:?}").unwrap();
            }
            match page.next_after {
                Some(a) => after = Some(a),
                None => break,
            }
        }
        writeln!(out, "has_ready {ns} {:?}", store.has_ready(ns).unwrap()).unwrap();
    }
    for id in ["s-cron", "s-every", "s-skip"] {
        let key = TimerKey::new("ns", id);
        if let Some(v) = store.recurring(&key, 3).unwrap() {
            // Without the slot of its next occurrence (its encoding is what changed).
            let text = format!("{v:?}");
            let text = match text.find("slot: Slot {") {
                Some(at) => {
                    let end = at + text[at..].find('}').unwrap() + 1;
                    format!("{}slot: _{}", &text[..at], &text[end..])
                }
                None => text,
            };
            writeln!(out, "series {id}: {text}").unwrap();
        }
    }
    writeln!(out, "counts {counts:?}").unwrap();
    let m = store.meta().unwrap();
    writeln!(
        out,
        "meta {:?} {:?} {} {} {}",
        m.last_applied, m.membership, m.progress.cursor_ms, m.progress.pending, m.progress.stored
    )
    .unwrap();
    writeln!(out, "namespaces {:?}", store.namespaces(None, 100).unwrap()).unwrap();
    writeln!(out, "next_due {:?}", store.next_due().unwrap()).unwrap();
    writeln!(out, "passable {:?}", store.passable().unwrap()).unwrap();
    writeln!(
        out,
        "in_flight {:?}",
        store.in_flight_before("ns", now_ms, now_ms).unwrap()
    )
    .unwrap();
    writeln!(
        out,
        "purgeable {:?}",
        store
            .purgeable(now_ms + 10_000_000, std::time::Duration::ZERO, 1000)
            .unwrap()
            .into_iter()
            .map(|(ns, _, rows)| (ns, rows))
            .collect::<Vec<_>>()
    )
    .unwrap();
    writeln!(out, "timers {}", ids.len()).unwrap();
    out
}

/// Review of step 3 (second, HIGH 2): leases that expire at one deadline are expired in format
/// 5's order (the namespace's length and name, then the end), not by hash slot: with `max`
/// that decides which expire in this entry, and the order of the rows they move. `x` sorts
/// before `y` by name, after it by hash slot.
#[tokio::test]
async fn leases_of_one_deadline_expire_in_name_order_whatever_their_hash_slots() {
    let (x, y) = ("x", "y");
    assert!(G0.home(y).hslot < G0.home(x).hslot, "the test's premise");
    let in_ns = |ns: &str, id: &str| Command::Schedule {
        now_ms: T0,
        spec: TimerSpec {
            key: TimerKey::new(ns, id),
            ..spec(id, T0 + 10, "p")
        },
        with: Default::default(),
    };
    let grant = |ns: &str| crate::command::Grant {
        namespace: ns.into(),
        room: 10,
        push: false,
    };
    let cmds = vec![
        in_ns(x, "t"),
        in_ns(y, "t"),
        Command::Fire {
            now_ms: T0 + 20,
            max: 100,
            grants: vec![grant(y), grant(x)],
        },
    ];
    let (_dir, mut sm) = fresh(cmds).await;
    let timeout = crate::namespace::Policy::default().ack_timeout_ms as i64;
    // Both leases' deadline has passed; one lease's rows fit in this entry.
    let r = sm
        .apply_entries([entry(4, fire(T0 + 20 + timeout, 1))])
        .await
        .unwrap();
    assert!(matches!(r[0], Response::Fired { more: true, .. }), "{r:?}");
    let timeouts = |ns: &str| {
        let t = sm.store.get(&TimerKey::new(ns, "t")).unwrap().unwrap();
        t.timeouts
    };
    assert_eq!(
        (timeouts(x), timeouts(y)),
        (1, 0),
        "x's lease first, as format 5"
    );
}

/// A Schedule of `ns/id` due at `at`, made at `T0`.
fn schedule_in(ns: &str, id: &str, at: i64) -> Command {
    Command::Schedule {
        now_ms: T0,
        spec: TimerSpec {
            key: TimerKey::new(ns, id),
            ..spec(id, at, "p")
        },
        with: Default::default(),
    }
}

/// What the format-5 build applied to write `fixtures/format5-moved`: a Fire passes rows of
/// two namespaces in two hash slots, then both rows of `ns` are nacked away from behind the
/// cursor, so `ns`'s hash slot keeps a fire record that no row needs.
fn moved_commands() -> Vec<Command> {
    let in_ns = schedule_in;
    let nack = |id: &str, now_ms: i64| Command::Nack {
        now_ms,
        key: TimerKey::new("ns", id),
        attempt: 1,
    };
    vec![
        schedule("a", T0 + 10),
        schedule("b", T0 + 20),
        in_ns("other", "x", T0 + 10),
        fire(T0 + 30, 1000),
        Command::Deliver {
            now_ms: T0 + 31,
            grants: vec![crate::command::Grant {
                namespace: "ns".into(),
                room: 2,
                push: false,
            }],
        },
        nack("a", T0 + 32),
        nack("b", T0 + 33),
        schedule("c", T0 + 1_000_000),
    ]
}

/// Guarantee 8 across the upgrade: a replica that applied every entry as format 6 and one
/// that rewrote a format-5 directory at the same index have one digest, though the first
/// still holds a fire record whose rows all moved on (the rewrite copies only the records a
/// row needs); and they keep one digest as both apply more.
#[tokio::test]
async fn replicas_that_came_to_format_6_two_ways_have_one_digest() {
    assert_ne!(G0.home("ns").hslot, G0.home("other").hslot);
    let dir = fixture_at("format5-moved");
    let (_, mut rewritten) = open(&dir);
    let (_fresh_dir, mut replica) = fresh(moved_commands()).await;
    let now = T0 + 40;
    same_text(
        &observe(&rewritten.store, now),
        &observe(&replica.store, now),
    );
    // The record the nacked rows left behind is there in one of them only.
    let records = |sm: &StateMachine| rows_of(sm.store.db(), CF_FIRES);
    assert_eq!((records(&replica), records(&rewritten)), (2, 1));
    assert_eq!(
        rewritten.store.digest().unwrap(),
        replica.store.digest().unwrap()
    );

    let next = moved_commands().len() as u64 + 1;
    let more = [fire(T0 + 100_000, 1000), schedule("d", T0 + 100_010)];
    for sm in [&mut rewritten, &mut replica] {
        let entries: Vec<_> = (more.iter().cloned().enumerate())
            .map(|(i, c)| entry(next + i as u64, c))
            .collect();
        sm.apply_entries(entries).await.unwrap();
    }
    let now = T0 + 100_020;
    same_text(
        &observe(&rewritten.store, now),
        &observe(&replica.store, now),
    );
    assert_eq!(
        rewritten.store.digest().unwrap(),
        replica.store.digest().unwrap()
    );
}
