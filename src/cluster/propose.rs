//! The proposer: batches concurrent client commands into `Multi` log entries.
//!
//! Every log entry costs a round of append, fsync, replication and apply, whatever it holds.
//! With many clients, proposing each command as its own entry makes that round the limit (the
//! profile showed the leader waiting on fsync with its CPU half idle). So client writes queue
//! here; at most `MAX_IN_FLIGHT` proposals are outstanding, and while they are, new commands
//! accumulate and go out together as one entry (up to `MAX_BATCH`). One command alone is
//! proposed as itself. Each caller gets its own command's response: the state machine applies a
//! Multi's commands in order, each as if alone (see `storage::apply`).
//!
//! The fire driver and the dispatcher propose directly: they already batch by design.

use openraft::async_runtime::WatchReceiver as _;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Semaphore};

use super::Raft;
use crate::command::{Command, Response};
use crate::storage::Hold;
use crate::wheel::MAX_ROWS_PER_ENTRY;
use crate::Result;

/// Outstanding proposals; more would only make batches smaller.
const MAX_IN_FLIGHT: usize = 2;
/// How long a proposal may wait for openraft's answer before its slot is given back and its
/// callers told the outcome is unknown. openraft 0.9 answers a write when its entry applies or
/// is truncated, but not when a leader that stepped down installs a snapshot past the entry:
/// that answer never comes, and two such proposals held both slots for good — no client write,
/// stream ack or push outcome committed on that node again once it led (chaos, issue 33).
const ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// Most commands in one entry (keeps each entry, and each apply, bounded). An AckBatch of
/// 2,000 acks fits in one entry.
const MAX_BATCH: usize = 2048;
/// Most timers in one entry, counting a ScheduleBatch as its timers and a Redrive as the timers
/// it names: an entry must stay small enough for a follower to append quickly (see
/// `config::NodeConfig::openraft`, `cluster::network::append_ttl`). A single larger
/// ScheduleBatch still goes alone.
const MAX_WEIGHT: usize = 10_000;
/// Most bytes of payload and keys in one Multi entry, for the same reason (2,048 schedules of
/// 64 KiB would make a 128 MiB entry). A single larger command still goes alone.
const MAX_MULTI_BYTES: usize = 4 << 20;
/// Most bytes one entry may hold: what a peer accepts in one message, with room for the
/// AppendEntries around it. A command beyond it could be committed by no follower.
const MAX_ENTRY_BYTES: usize = super::MAX_PEER_MESSAGE_BYTES / 2;

type Waiter = oneshot::Sender<Result<Response>>;

/// The queue into the proposer task.
#[derive(Clone)]
pub struct Proposer {
    tx: mpsc::UnboundedSender<(Command, Waiter)>,
}

impl Proposer {
    /// Starts the proposer task for `raft`; `map_err` turns a Raft error into the caller's.
    /// Every batch passes `hold` before it is proposed.
    pub fn start(raft: Raft, hold: Hold, map_err: fn(RaftWriteError) -> crate::Error) -> Proposer {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(raft, hold, rx, map_err));
        Proposer { tx }
    }

    /// Proposes `cmd` and waits for its response (the caller bounds the wait).
    pub async fn propose(&self, cmd: Command) -> Result<Response> {
        let (tx, rx) = oneshot::channel();
        let stopped = || crate::Error::Unavailable("the node is shutting down".into());
        self.tx.send((cmd, tx)).map_err(|_| stopped())?;
        // Taken by the proposer, then dropped: it may have been proposed.
        let dropped = || {
            crate::Error::OutcomeUnknown("the node stopped; the write's outcome is unknown".into())
        };
        rx.await.map_err(|_| dropped())?
    }
}

pub type RaftWriteError = openraft::error::RaftError<
    super::TypeConfig,
    openraft::error::ClientWriteError<super::TypeConfig>,
>;

async fn run(
    raft: Raft,
    hold: Hold,
    mut rx: mpsc::UnboundedReceiver<(Command, Waiter)>,
    map_err: fn(RaftWriteError) -> crate::Error,
) {
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    // A command that did not fit the last batch starts the next one.
    let mut carried = None;
    loop {
        let first = match carried.take() {
            Some(c) => c,
            None => match rx.recv().await {
                Some(c) => c,
                None => return,
            },
        };
        // Refused before it is proposed: committed, it would fail apply on every replica.
        let Some(first) = refuse_oversized(first) else {
            continue;
        };
        // Wait for a slot first: commands arriving meanwhile join this batch.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (batch, rest) = take_batch(first, &mut rx);
        carried = rest;
        let (raft, hold) = (raft.clone(), hold.clone());
        tokio::spawn(async move {
            hold.pass().await;
            propose(&raft, batch, map_err).await;
            drop(slot);
        });
    }
}

/// Answers a command no entry may hold with INVALID_ARGUMENT; passes the rest on.
fn refuse_oversized((cmd, waiter): (Command, Waiter)) -> Option<(Command, Waiter)> {
    match check_bounds(&cmd) {
        Ok(()) => Some((cmd, waiter)),
        Err(e) => {
            let _ = waiter.send(Err(e));
            None
        }
    }
}

/// DESIGN 10: the bound of one entry `cmd` alone would break, as an error for its caller.
pub fn check_bounds(cmd: &Command) -> crate::Result<()> {
    let cost = cost_of(cmd);
    if cost.rows > MAX_ROWS_PER_ENTRY as usize {
        return Err(crate::Error::InvalidArgument(format!(
            "{} names {} timers; one log entry can place at most {MAX_ROWS_PER_ENTRY}",
            cmd.label(),
            cost.rows
        )));
    }
    if cost.bytes > MAX_ENTRY_BYTES {
        return Err(crate::Error::InvalidArgument(format!(
            "{} is about {} bytes; one log entry holds at most {MAX_ENTRY_BYTES}",
            cmd.label(),
            cost.bytes
        )));
    }
    Ok(())
}

/// A batch, and the command that did not fit it.
type Batch<T> = (Vec<(Command, T)>, Option<(Command, T)>);

/// The batch `first` starts: it and the commands queued behind it, up to `MAX_BATCH`
/// commands, `MAX_WEIGHT` timers and `MAX_MULTI_BYTES` (a first command larger than those goes
/// alone). A queued command that would pass a bound is handed back to start the next batch.
fn take_batch<T>(first: (Command, T), rx: &mut mpsc::UnboundedReceiver<(Command, T)>) -> Batch<T> {
    let mut cost = cost_of(&first.0);
    let mut batch = vec![first];
    while batch.len() < MAX_BATCH {
        let Ok(next) = rx.try_recv() else {
            return (batch, None);
        };
        let more = cost_of(&next.0);
        if cost.rows + more.rows > MAX_WEIGHT || cost.bytes + more.bytes > MAX_MULTI_BYTES {
            return (batch, Some(next));
        }
        cost = cost + more;
        batch.push(next);
    }
    (batch, None)
}

/// What a command may cost an entry: the timers (rows) it may place or rewrite, at most, and
/// roughly its encoded size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cost {
    pub rows: usize,
    pub bytes: usize,
}

impl std::ops::Add for Cost {
    type Output = Cost;
    fn add(self, o: Cost) -> Cost {
        Cost {
            rows: self.rows + o.rows,
            bytes: self.bytes + o.bytes,
        }
    }
}

/// Bytes a command's fixed fields take, roughly (a key, times, flags).
const COMMAND_BYTES: usize = 64;

/// The most `cmd` can cost an entry: every timer it names may be placed (a ScheduleBatch
/// places each of its timers, a Redrive moves each DEAD timer it names after the cursor, an
/// ack rewrites a row).
pub fn cost_of(cmd: &Command) -> Cost {
    let spec = |s: crate::timer::SpecRef<'_>| Cost {
        rows: 1,
        bytes: COMMAND_BYTES
            + s.key.namespace.len()
            + s.key.id.len()
            + s.payload.len()
            + s.content_type.len(),
    };
    let keys = |n: usize| Cost {
        rows: n,
        bytes: n * COMMAND_BYTES,
    };
    match cmd {
        Command::LegacySchedule { spec: s, .. } | Command::Schedule { spec: s, .. } => {
            spec(s.as_ref())
        }
        Command::ScheduleBatch { specs, .. } => specs.iter().map(spec).fold(keys(0), |a, b| a + b),
        Command::Redrive { keys: k, .. } => keys(k.len()),
        Command::Acks { leases, acks, .. } => keys(leases.len() + acks.len()),
        Command::Multi(cmds) => cmds.iter().map(cost_of).fold(keys(0), |a, b| a + b),
        _ => keys(1),
    }
}

/// openraft's `client_write`, with its leader-lease refusal tried again. openraft 0.10's leader
/// refuses a write before appending it when no quorum has acknowledged it within its lease
/// (`election_timeout_max`, 300 ms; a new leader has none until its first quorum ack). A
/// follower busy in a slow fsync answers late, and 300 ms is tighter than the second this
/// layer gives a leader ([`super::QUORUM_LOST_AFTER`]): so such a refusal is tried again,
/// every few ms, until that second has passed — nothing was appended, so it is safe. Each try
/// first asks for a heartbeat: a resting group's leader (`super::rest`) sends none by itself.
pub async fn client_write(
    raft: &Raft,
    cmd: Arc<Command>,
) -> std::result::Result<openraft::raft::ClientWriteResponse<super::TypeConfig>, RaftWriteError> {
    use openraft::error::{ClientWriteError, ForwardReason, RaftError};
    let started = tokio::time::Instant::now();
    loop {
        match raft.client_write(cmd.clone()).await {
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))
                if f.reason == ForwardReason::LeaseExpired
                    && started.elapsed() < super::QUORUM_LOST_AFTER =>
            {
                metrics::counter!(crate::metrics::LEASE_RETRIES).increment(1);
                // A resting group (`super::rest`) sends no heartbeats, so its lease lapsed:
                // one heartbeat now, whose quorum answer renews it (openraft coalesces these).
                let _ = raft.trigger().heartbeat().await;
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            answer => return answer,
        }
    }
}

/// What openraft answered for `cmd`, or an unknown outcome after [`ANSWER_TIMEOUT`].
async fn write(
    raft: &Raft,
    cmd: Command,
    map_err: fn(RaftWriteError) -> crate::Error,
) -> Result<Response> {
    // Not leading now (a hand-off while the batch waited at the hold): openraft would refuse
    // it before appending, but its refusal cannot be told from a truncation after an append
    // (`node::write_error`), so say "not the leader" here, where nothing was proposed.
    if raft.metrics().borrow_watched().state != openraft::ServerState::Leader {
        return Err(crate::Error::NotLeader);
    }
    match tokio::time::timeout(ANSWER_TIMEOUT, client_write(raft, cmd.into())).await {
        Ok(r) => r.map(|r| r.data).map_err(map_err),
        Err(_) => {
            tracing::warn!(timeout = ?ANSWER_TIMEOUT, "a proposal was never answered");
            Err(crate::Error::OutcomeUnknown(format!(
                "openraft did not answer within {ANSWER_TIMEOUT:?} (a leader change may have \
                 passed the entry by); the write's outcome is unknown"
            )))
        }
    }
}

async fn propose(
    raft: &Raft,
    mut batch: Vec<(Command, Waiter)>,
    map_err: fn(RaftWriteError) -> crate::Error,
) {
    if batch.len() == 1 {
        let (cmd, waiter) = batch.pop().expect("one");
        let _ = waiter.send(write(raft, cmd, map_err).await);
        return;
    }
    let (cmds, waiters): (Vec<Command>, Vec<Waiter>) = batch.into_iter().unzip();
    let count = cmds.len();
    match write(raft, Command::Multi(cmds), map_err).await {
        Ok(reply) => match reply {
            Response::Multi(responses) if responses.len() == count => {
                for (waiter, response) in waiters.into_iter().zip(responses) {
                    let _ = waiter.send(Ok(response));
                }
            }
            other => {
                let e = crate::Error::Internal(format!("unexpected Multi response {other:?}"));
                waiters
                    .into_iter()
                    .for_each(|w| drop(w.send(Err(e.clone()))));
            }
        },
        Err(e) => {
            waiters
                .into_iter()
                .for_each(|w| drop(w.send(Err(e.clone()))));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timer::{TimerKey, TimerSpec, When};

    fn queue(cmds: impl IntoIterator<Item = Command>) -> mpsc::UnboundedReceiver<(Command, ())> {
        let (tx, rx) = mpsc::unbounded_channel();
        for c in cmds {
            tx.send((c, ())).unwrap();
        }
        rx
    }

    /// Every batch `take_batch` makes of what `rx` holds, in order.
    fn batches(mut rx: mpsc::UnboundedReceiver<(Command, ())>) -> Vec<Vec<Command>> {
        let mut out = Vec::new();
        let mut carried = None;
        while let Some(first) = carried.take().or_else(|| rx.try_recv().ok()) {
            let (batch, rest) = take_batch(first, &mut rx);
            carried = rest;
            out.push(batch.into_iter().map(|(c, _)| c).collect());
        }
        out
    }

    fn redrive(chunk: usize) -> Command {
        Command::Redrive {
            now_ms: 0,
            keys: (0..1000)
                .map(|i| TimerKey::new("ns", format!("c{chunk}-{i}")))
                .collect(),
        }
    }

    /// Finding 7 of issue 33: a Redrive chunk (up to 1,000 DEAD timers moved) was weighed as
    /// one, so 2,048 of them queued together made one entry placing 2,048,000 rows, past
    /// `MAX_ROWS_PER_ENTRY`: committed, then failing apply on every replica.
    #[test]
    fn queued_redrive_chunks_never_make_an_entry_past_the_row_bound() {
        let made = batches(queue((0..MAX_BATCH).map(redrive)));
        for batch in &made {
            let placed = cost_of(&Command::Multi(batch.clone())).rows;
            assert!(
                placed <= MAX_WEIGHT,
                "an entry of {} commands may place {placed} rows (bound {MAX_WEIGHT}, \
                 apply fails past {MAX_ROWS_PER_ENTRY})",
                batch.len()
            );
        }
        assert_eq!(made.iter().map(Vec::len).sum::<usize>(), MAX_BATCH);
    }

    /// Big payloads close a Multi by bytes; a command larger than a Multi may be goes alone;
    /// nothing is lost or reordered.
    #[test]
    fn batches_are_bounded_in_bytes_and_keep_their_order() {
        let schedule = |i: usize, bytes: usize| Command::LegacySchedule {
            now_ms: 0,
            spec: TimerSpec {
                key: TimerKey::new("ns", format!("t{i}")),
                when: When::At(0),
                payload: vec![0; bytes],
                content_type: String::new(),
            },
        };
        let mut cmds: Vec<Command> = (0..200).map(|i| schedule(i, 64 * 1024)).collect();
        cmds.insert(50, schedule(9999, 6 << 20));
        let made = batches(queue(cmds.clone()));
        for batch in &made {
            let bytes = cost_of(&Command::Multi(batch.clone())).bytes;
            assert!(
                batch.len() == 1 || bytes <= MAX_MULTI_BYTES,
                "{bytes} bytes"
            );
        }
        assert_eq!(made.concat(), cmds, "every command once, in order");
        assert!(made
            .iter()
            .any(|b| b.len() == 1 && cost_of(&b[0]).bytes > MAX_MULTI_BYTES));
    }

    /// A command no entry may hold is refused before it is proposed, with a message.
    #[test]
    fn a_command_past_an_entry_bound_is_refused() {
        let huge = Command::Redrive {
            now_ms: 0,
            keys: vec![TimerKey::new("ns", "x"); MAX_ROWS_PER_ENTRY as usize + 1],
        };
        let e = check_bounds(&huge).unwrap_err();
        assert!(matches!(e, crate::Error::InvalidArgument(_)), "{e}");
        assert!(e.to_string().contains("one log entry"), "{e}");
        assert!(check_bounds(&redrive(0)).is_ok());
    }
}
