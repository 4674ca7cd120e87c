//! The apply target: bytes read as a program of client and leader commands (schedule, batch,
//! cancel, reschedule, fire, deliver, ack, nack, redrive, namespace policy, access changes,
//! recurring timers: create with any policy, pause, resume, and cancels and acks of their
//! occurrences; the create modes, conditional cancels and reschedules, relative shifts) and of
//! disturbances of one replica, applied to three fresh state machines:
//!
//! - the *steady* one applies one entry at a time and is never disturbed: its node-local
//!   caches (the heads, the deadline floor, the access cache, the index GC's floors) carry
//!   whatever history left in them, and at the points the program says they are made as stale
//!   as their contracts allow (every head early, the floor at 0, `StateMachine::stale_caches`);
//!   after every entry its deadline floor must hold (no deadline below it);
//! - the *disturbed* one applies the same entries one at a time, rebuilding every node-local
//!   cache from its database before each (`StateMachine::reload`, what opening does), and at
//!   the points the program says it is closed and opened again or installs a snapshot the
//!   steady one builds there — what a restart or a catching-up follower does; in half the
//!   programs (and after every reopen, the other half of the time) it applies a plain Schedule
//!   by the general path, as builds before the fold do, while the steady one takes the fast
//!   path (a rolling upgrade runs both);
//! - the *grouped* one applies every entry in one call.
//!
//! The disturbed replica applies each command as a follower does, decoded from its encoding.
//! The steady and the disturbed replica must give the same answer and the same digest after
//! **every** entry (DESIGN invariant 8: a committed entry's effect is a function of the
//! replicated state and the entry only; a cache may make apply faster, never different); the
//! grouped one the same answers and digest at the end (the determinism oracle of
//! `storage::tests::apply_is_deterministic`, on programs nobody wrote by hand).
//!
//! Programs stay in the domain leaders propose from (each entry carries its leader's clock,
//! and a Fire's or a Deliver's may step back, as a newly elected leader's clock can lag), so a
//! disagreement is a real bug, not an impossible log.

use std::path::Path;
use std::sync::Arc;

use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use openraft::EntryPayload;
use timerdb::command::{Command, Response};
use timerdb::raft_types::{log_id, Entry};
use timerdb::storage::FireSignal;
use timerdb::storage::{self, decode, encode, IndexGc, StateMachine, Store};
use timerdb::wheel::Wheel;

use crate::program::{program, seed_programs, steps, Step};

/// A target's verdict on one input: a short class of what happened (new classes are kept in
/// the corpus: the only guidance a coverage-blind fuzzer has), or a broken invariant.
pub type Verdict = Result<String, String>;

fn entry(index: u64, cmd: Command) -> Entry {
    Entry {
        log_id: log_id(1, 1, index),
        payload: EntryPayload::Normal(Arc::new(cmd)),
    }
}

fn open(dir: &Path) -> Result<StateMachine, String> {
    let gc = IndexGc::new();
    let db = storage::open_db(dir, &gc).map_err(|e| e.to_string())?;
    let store = Store::new(db, Wheel::default(), gc);
    StateMachine::open(store, dir, Arc::new(FireSignal::default())).map_err(|e| e.to_string())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Runs the program on the three state machines and compares them.
pub fn run(input: &[u8]) -> Verdict {
    let steps = steps(input);
    let cmds: Vec<Command> = steps
        .iter()
        .filter_map(|s| match s {
            Step::Apply(c) => Some(c.clone()),
            _ => None,
        })
        .collect();
    if cmds.is_empty() {
        return Ok("empty".into());
    }
    let (d1, d2, d3) = (tempdir()?, tempdir()?, tempdir()?);
    runtime().block_on(async {
        let (mut steady, mut grouped) = (open(d1.path())?, open(d3.path())?);
        // How the disturbed replica applies a plain Schedule: by the general path older builds
        // take, or by this build's fast path on caches it just rebuilt. Chosen by the input's
        // parity and switched at every reopen, so both meet the steady replica entry by entry.
        let mut general = input.iter().fold(0u8, |a, b| a ^ b) & 1 == 1;
        let mut disturbed = Some(open_disturbed(d2.path(), general)?);
        let mut answers = Vec::new();
        let mut disturbances = 0;
        for step in &steps {
            let index = answers.len() as u64 + 1;
            match step {
                Step::Apply(c) => {
                    let a = apply_one(&mut steady, index, c).await?;
                    // The deadline floor (a cache the steady replica keeps) holds.
                    (steady.store().check_deadline_floor())
                        .map_err(|e| format!("entry {index} ({}): {e}", c.name()))?;
                    let sm = disturbed.as_mut().ok_or("no disturbed replica")?;
                    // Every cache rebuilt from the database, as a restart would.
                    sm.reload().map_err(|e| format!("reloading the caches: {e}"))?;
                    // The leader applies the command it proposed; a follower (and the leader
                    // after a restart) the one decoded from the log's bytes.
                    let decoded = decode::<Command>(&encode(c))
                        .map_err(|e| format!("entry {index} does not decode: {e}"))?;
                    let b = apply_one(sm, index, &decoded).await?;
                    if a != b {
                        return Err(format!(
                            "entry {index} ({}): a disturbed replica answers otherwise:\n{a:?}\n{b:?}",
                            c.name()
                        ));
                    }
                    if digest(&steady)? != digest(sm)? {
                        return Err(format!(
                            "entry {index} ({}): a disturbed replica's state differs \
                             (digests differ after the entry)",
                            c.name()
                        ));
                    }
                    answers.push(a);
                }
                Step::Stale => steady.stale_caches(),
                Step::Reopen => {
                    drop(disturbed.take());
                    general = !general;
                    disturbed = Some(open_disturbed(d2.path(), general)?);
                    disturbances += 1;
                }
                Step::Install => {
                    let sm = disturbed.as_mut().ok_or("no disturbed replica")?;
                    install(&mut steady, sm).await?;
                    if digest(&steady)? != digest(sm)? {
                        return Err(format!(
                            "after entry {}: an installed snapshot differs from its source",
                            index - 1
                        ));
                    }
                    disturbances += 1;
                }
            }
        }
        let entries: Vec<_> = (cmds.iter().cloned().enumerate())
            .map(|(i, c)| entry(i as u64 + 1, c))
            .collect();
        let all = grouped
            .apply_entries(entries)
            .await
            .map_err(|e| format!("apply failed: {e}"))?;
        if answers != all {
            return Err(format!(
                "same log, different answers:\n{answers:?}\n{all:?}"
            ));
        }
        if digest(&steady)? != digest(&grouped)? {
            return Err("same log, different state (digests differ)".into());
        }
        let rejected = answers
            .iter()
            .filter(|r| matches!(r, Response::Rejected(_)))
            .count();
        Ok(format!(
            "{} cmds {} rejected {} disturbed",
            cmds.len().min(8),
            rejected.min(4),
            disturbances.min(2)
        ))
    })
}

/// The disturbed replica; with `general`, it applies a plain Schedule through
/// `schedule_with`, as builds before the fold do, while the steady one takes this build's fast
/// path; after every entry the two must agree (a rolling upgrade runs both).
fn open_disturbed(dir: &Path, general: bool) -> Result<StateMachine, String> {
    let mut sm = open(dir)?;
    if general {
        sm.apply_plain_schedules_generally();
    }
    Ok(sm)
}

/// Applies `cmd` as entry `index` of `sm`, alone.
async fn apply_one(sm: &mut StateMachine, index: u64, cmd: &Command) -> Result<Response, String> {
    let mut r = sm
        .apply_entries([entry(index, cmd.clone())])
        .await
        .map_err(|e| format!("apply of entry {index} ({}) failed: {e}", cmd.name()))?;
    r.pop().ok_or_else(|| "no answer".to_string())
}

/// `to` installs a snapshot `from` builds now, as a follower that fell behind would.
async fn install(from: &mut StateMachine, to: &mut StateMachine) -> Result<(), String> {
    let mut snapshot = from
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .map_err(|e| format!("building a snapshot: {e}"))?;
    use openraft_legacy::network_v1::SnapshotReceiverFactory;
    let mut file = to
        .begin_receiving_snapshot()
        .await
        .map_err(|e| format!("receiving a snapshot: {e}"))?;
    tokio::io::copy(&mut snapshot.snapshot, &mut file)
        .await
        .map_err(|e| format!("copying a snapshot: {e}"))?;
    to.install_snapshot(&snapshot.meta, file)
        .await
        .map_err(|e| format!("installing a snapshot: {e}"))
}

fn digest(sm: &StateMachine) -> Result<(u64, u64), String> {
    sm.store().digest().map_err(|e| e.to_string())
}

fn tempdir() -> Result<crate::Scratch, String> {
    crate::Scratch::new()
}

/// A real backup file (a snapshot of a state machine that ran a seed program).
pub fn seed_backup() -> Vec<Vec<u8>> {
    let Ok(dir) = tempdir() else {
        return Vec::new();
    };
    let built = runtime().block_on(async {
        let mut sm = open(dir.path()).ok()?;
        let entries: Vec<_> = (program(&seed_programs()[1]).into_iter().enumerate())
            .map(|(i, c)| entry(i as u64 + 1, c))
            .collect();
        sm.apply_entries(entries).await.ok()?;
        sm.get_snapshot_builder().await.build_snapshot().await.ok()
    });
    if built.is_none() {
        return Vec::new();
    }
    let files = std::fs::read_dir(dir.path().join("snapshot"))
        .into_iter()
        .flatten();
    files
        .flatten()
        .filter(|f| f.file_name().to_string_lossy().ends_with(".data"))
        .filter_map(|f| std::fs::read(f.path()).ok())
        .collect()
}
