//! The unary Ack, answered once the leader has queued it.
//!
//! A consumer that acks each delivery before it reads the next (the loop a new user writes)
//! spends one Ack call per timer. When that call waited for its replicated write, a consumer
//! had ~3.5 ms per timer of its 4 ms at 2 × 250 timers/s and fell behind for good at the first
//! hiccup (issue 34). So by default an Ack is judged against the leader's applied state and,
//! when it plainly acks the latest attempt of a FIRED timer, handed to the ack coalescer
//! (`cluster::acks`, the path Consume's stream acks take) and answered at once, `committed`
//! false. It applies with the coalescer's next entry, within milliseconds.
//!
//! What that answer promises is what a stream ack promises: the ack applies unless the leader
//! fails first, and an ack lost that way means the delivery comes again after its ack timeout
//! (at-least-once, which a consumer handles anyway). A planned hand-over is no failure: it lets
//! the queued acks apply before it goes (`cluster::queued`). The last attempt the namespace
//! allows is never queued, since losing that ack would not bring the delivery again but leave
//! the timer DEAD; nor is an ack on a leader that has not applied its own term's first entry.
//! (A namespace whose `max_attempts` is lowered after an ack was queued can still see that
//! ack's timer go DEAD if the leader fails first.) The state machine still decides: a queued
//! ack that finds the delivery handed out again meanwhile changes nothing, like any stale ack.
//! Whatever the applied state does not plainly allow (an unknown timer, a stale or future
//! attempt, a timer already ACKED) takes the waiting path, so every refusal and every
//! `committed` answer is the log's own, never a guess from a replica that may lag. A caller
//! that must know its ack took effect sets `wait_for_commit`.

use std::hash::{Hash, Hasher};

use super::{Leader, Node};
use crate::command::Command;
use crate::storage::ack_refusal;
use crate::timer::{Timer, TimerKey};
use crate::{Error, Result};

/// What an Ack came to.
#[derive(Debug, Clone)]
pub struct Acked {
    /// Committed: the timer after the ack. Queued: the timer as the leader held it.
    pub timer: Timer,
    /// Whether the ack has applied (else it is queued on the leader).
    pub committed: bool,
}

impl Node {
    /// Acks delivery `attempt` of `key`: FIRED → ACKED (or the ACKED timer, for a retry).
    /// Answered once queued on this leader unless `wait`, or unless the applied state does not
    /// plainly allow it; then once applied.
    pub async fn ack(&self, key: TimerKey, attempt: u32, wait: bool) -> Result<Acked> {
        if !wait {
            if let Some(timer) = self.queue_ack(&key, attempt).await? {
                return Ok(Acked {
                    timer,
                    committed: false,
                });
            }
        }
        let cmd = Command::Ack {
            now_ms: self.now_ms(),
            key: key.clone(),
            attempt,
        };
        let timer = self.settle(cmd, &key, attempt).await?;
        Ok(Acked {
            timer,
            committed: true,
        })
    }

    /// Hands the ack to the coalescer if this node leads (with a quorum) and its applied state
    /// shows `attempt` as the latest of a FIRED timer; the timer as it is, or `None` for the
    /// waiting path. Waits while the coalescer's queue is full (back-pressure on the caller).
    async fn queue_ack(&self, key: &TimerKey, attempt: u32) -> Result<Option<Timer>> {
        let view = self.leader_view();
        if self.leader() != Leader::Me || !view.leads {
            // Nothing was queued: the forwarding layer sends it to the leader.
            return Err(Error::NotLeader);
        }
        self.check_quorum()?;
        if self.hold.is_closed() {
            // Handing leadership over: a queued ack would meet the transfer and be lost (its
            // delivery would come again) — the waiting path waits at the hold and goes to the
            // next leader instead, as it did before acks were queued. (The hand-over stops
            // queuing before it closes the hold: `Acker::queue` below refuses then.)
            return Ok(None);
        }
        if !view.caught_up {
            // A leader just elected has not applied what its predecessors committed: its state
            // may show an attempt the log has already replaced or acked.
            return Ok(None);
        }
        let Some(timer) = self.store.get(key)? else {
            return Ok(None);
        };
        if ack_refusal(&timer, attempt).is_some() {
            return Ok(None);
        }
        let max_attempts = self.store.namespace(&key.namespace)?.policy.max_attempts;
        if timer.attempts.saturating_sub(timer.attempt_base) >= max_attempts {
            // The last attempt: lost, this ack would not mean a redelivery but a DEAD timer the
            // consumer was told it acked. It waits for the log (review of issue 34, HIGH 1).
            return Ok(None);
        }
        let lane = unary_lane(&key.namespace);
        if !self
            .acker
            .queue(view.term, lane, key.clone(), attempt)
            .await
        {
            // A hand-over is draining queued acks or was started in this term, or the
            // coalescer stopped (a bug, logged there): never answer an ack that was not queued.
            return Ok(None);
        }
        let now = self.leader_view();
        if !now.leads || now.term != view.term {
            // Leadership changed while the lane was full: the queued ack may never apply, so
            // it is not answered as queued; the waiting path acks again (a second ack of the
            // same attempt changes nothing) at the next leader (review, LOW 4).
            return Ok(None);
        }
        // As for a stream ack: the subscription that holds the delivery may hand out the next.
        self.dispatcher.settled(key, attempt);
        Ok(Some(timer))
    }
}

/// The coalescer's lane for a namespace's unary acks, taken in turns with every stream's and
/// every other namespace's. Stream and pusher lanes count up from 0; these have the top bit.
fn unary_lane(namespace: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    namespace.hash(&mut h);
    h.finish() | 1 << 63
}
