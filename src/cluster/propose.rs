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

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Semaphore};

use super::{Hold, Raft};
use crate::timer::{Command, Response};
use crate::Result;

/// Outstanding proposals; more would only make batches smaller.
const MAX_IN_FLIGHT: usize = 2;
/// Most commands in one entry (keeps each entry, and each apply, bounded). An AckBatch of
/// 2,000 acks fits in one entry.
const MAX_BATCH: usize = 2048;
/// Most timers in one entry, counting a ScheduleBatch as its timers: an entry must stay small
/// enough for a follower to append within one heartbeat (see `config::NodeConfig::openraft`).
/// A single larger ScheduleBatch still goes alone.
const MAX_WEIGHT: usize = 10_000;

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
        rx.await.map_err(|_| stopped())?
    }
}

pub type RaftWriteError = openraft::error::RaftError<
    super::NodeId,
    openraft::error::ClientWriteError<super::NodeId, openraft::BasicNode>,
>;

async fn run(
    raft: Raft,
    hold: Hold,
    mut rx: mpsc::UnboundedReceiver<(Command, Waiter)>,
    map_err: fn(RaftWriteError) -> crate::Error,
) {
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    while let Some(first) = rx.recv().await {
        // Wait for a slot first: commands arriving meanwhile join this batch.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut weight = weight_of(&first.0);
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH && weight < MAX_WEIGHT {
            match rx.try_recv() {
                Ok(next) => {
                    weight += weight_of(&next.0);
                    batch.push(next);
                }
                Err(_) => break,
            }
        }
        let (raft, hold) = (raft.clone(), hold.clone());
        tokio::spawn(async move {
            hold.pass().await;
            propose(&raft, batch, map_err).await;
            drop(slot);
        });
    }
}

/// How many timers a command writes, roughly what it costs to replicate and apply.
fn weight_of(cmd: &Command) -> usize {
    match cmd {
        Command::ScheduleBatch { specs, .. } => specs.len(),
        Command::Acks { leases, acks, .. } => leases.len() + acks.len(),
        _ => 1,
    }
}

async fn propose(
    raft: &Raft,
    mut batch: Vec<(Command, Waiter)>,
    map_err: fn(RaftWriteError) -> crate::Error,
) {
    if batch.len() == 1 {
        let (cmd, waiter) = batch.pop().expect("one");
        let result = raft
            .client_write(cmd.into())
            .await
            .map(|r| r.data)
            .map_err(map_err);
        let _ = waiter.send(result);
        return;
    }
    let (cmds, waiters): (Vec<Command>, Vec<Waiter>) = batch.into_iter().unzip();
    let count = cmds.len();
    match raft.client_write(Command::Multi(cmds).into()).await {
        Ok(reply) => match reply.data {
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
            let e = map_err(e);
            waiters
                .into_iter()
                .for_each(|w| drop(w.send(Err(e.clone()))));
        }
    }
}
