//! The unary acks a leader answered as queued (`node::ack`) and has not yet proposed and heard
//! back, counted so that a leader about to hand over can let them apply first.
//!
//! A queued ack's answer promises that it applies unless the leader fails first. A planned
//! hand-over (SIGTERM, RemoveNode of the leader, `timerctl leader`) is no failure, yet an ack
//! still in the coalescer's lanes, or in the proposer behind the closed hold, would be proposed
//! on a node that no longer leads and be lost: its delivery would come again, or its timer go
//! DEAD at the attempt limit (review of issue 34, MED 2). So the hand-over first stops queuing
//! ([`Queued::drain`]), then waits until every queued ack was proposed and answered, and only
//! then closes the hold; acks that arrive meanwhile take the waiting path, which follows the
//! leadership to the next leader.
//!
//! Each queued ack carries a [`Ticket`] inside its `AckItem`; dropping it (once its proposal
//! returned, or when the item is dropped unproposed) settles it. Entering and draining are
//! ordered like Dekker's flags (each side writes its own counter, then reads the other's, both
//! sequentially consistent): an ack either sees the drain and is not queued, or the drain sees
//! the ack and waits for it.
//!
//! A drain that does not settle within its bound fails, and the hand-over with it: handing
//! over anyway would drop what is still queued (review of issue 34's fixes, MED 1). Once a
//! hand-over has asked openraft to transfer, openraft refuses every write for the rest of that
//! leadership, even if the transfer fails or its caller gives up: so the hand-over marks the
//! term ([`Queued::hand_over_in`]) and no ack is queued in it again. The mark, not a guard
//! released later, is what keeps queuing off then, so a cancelled hand-over cannot turn it back
//! on early (LOW 2). A stop drains too, handing over or not (LOW 3).

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

#[derive(Debug, Default)]
pub struct Queued {
    /// Tickets alive: acks answered as queued and not yet settled.
    pending: AtomicU64,
    /// Drains in progress; none queues while there is one.
    draining: AtomicU64,
    /// The latest term whose leadership a hand-over was started in: none queues in it again.
    handed_over_in: AtomicU64,
    settled: Notify,
}

/// One queued ack, settled when dropped.
#[derive(Debug)]
pub struct Ticket(Arc<Queued>);

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.0.pending.fetch_sub(1, SeqCst) == 1 {
            self.0.settled.notify_waiters();
        }
    }
}

/// Queuing stays stopped while this lives.
#[derive(Debug)]
pub struct Draining(Arc<Queued>);

impl Drop for Draining {
    fn drop(&mut self) {
        self.0.draining.fetch_sub(1, SeqCst);
    }
}

impl Queued {
    /// A ticket for one more ack queued by the leader of `term`, or `None` while a drain is on
    /// or once a hand-over was started in `term`.
    pub fn enter(self: &Arc<Self>, term: u64) -> Option<Ticket> {
        self.pending.fetch_add(1, SeqCst);
        let ticket = Ticket(self.clone());
        if self.draining.load(SeqCst) > 0 || self.handed_over_in.load(SeqCst) >= term {
            return None; // the ticket drops: counted out again
        }
        Some(ticket)
    }

    /// No ack is queued in `term` any more: its leader is about to ask openraft to transfer
    /// (called while a [`Draining`] guard lives, so no ack slips in between).
    pub fn hand_over_in(&self, term: u64) {
        self.handed_over_in.fetch_max(term, SeqCst);
    }

    /// The latest term a hand-over was started in (0: none).
    pub fn handed_over_in(&self) -> u64 {
        self.handed_over_in.load(SeqCst)
    }

    /// Stops queuing and waits (at most `within`) until every queued ack has settled: the guard
    /// that keeps queuing stopped, or, if some are still unsettled after `within`, how many
    /// (queuing resumes then).
    pub async fn drain(self: &Arc<Self>, within: Duration) -> Result<Draining, u64> {
        self.draining.fetch_add(1, SeqCst);
        let draining = Draining(self.clone());
        let settled = async {
            loop {
                let notified = self.settled.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if self.pending.load(SeqCst) == 0 {
                    return;
                }
                notified.await;
            }
        };
        match tokio::time::timeout(within, settled).await {
            Ok(()) => Ok(draining),
            Err(_) => Err(self.pending()),
        }
    }

    /// Acks answered as queued and not yet settled.
    pub fn pending(&self) -> u64 {
        self.pending.load(SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_drain_waits_for_every_ticket_and_stops_new_ones() {
        let q = Arc::new(Queued::default());
        let a = q.enter(1).unwrap();
        let b = q.enter(1).unwrap();
        let q2 = q.clone();
        let drain = tokio::spawn(async move { q2.drain(Duration::from_secs(5)).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(q.enter(1).is_none(), "queued while draining");
        drop(a);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!drain.is_finished(), "drained with a ticket alive");
        drop(b);
        let draining = tokio::time::timeout(Duration::from_secs(1), drain)
            .await
            .expect("the drain still waits with every ticket settled")
            .unwrap()
            .expect("every ticket settled");
        assert!(q.enter(1).is_none(), "queued while the drain's guard lives");
        drop(draining);
        assert!(q.enter(1).is_some());
        assert_eq!(q.pending(), 0);
    }

    #[tokio::test]
    async fn a_drain_that_does_not_settle_fails_and_queuing_resumes() {
        let q = Arc::new(Queued::default());
        let _stuck = q.enter(1).unwrap();
        let started = std::time::Instant::now();
        let unsettled = q.drain(Duration::from_millis(100)).await.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(2));
        assert_eq!(unsettled, 1);
        assert!(q.enter(1).is_some(), "a failed drain left queuing off");
    }

    #[tokio::test]
    async fn a_term_handed_over_in_never_queues_again_and_a_later_one_does() {
        let q = Arc::new(Queued::default());
        let draining = q.drain(Duration::from_secs(1)).await.unwrap();
        q.hand_over_in(4);
        drop(draining); // a cancelled or failed hand-over drops its guard early
        assert!(q.enter(3).is_none() && q.enter(4).is_none());
        assert!(q.enter(5).is_some(), "the next leadership may queue");
        q.hand_over_in(2); // the mark never goes back
        assert!(q.enter(4).is_none());
    }
}
