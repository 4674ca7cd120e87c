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
    /// A ticket for one more queued ack, or `None` while a drain is on.
    pub fn enter(self: &Arc<Self>) -> Option<Ticket> {
        self.pending.fetch_add(1, SeqCst);
        let ticket = Ticket(self.clone());
        if self.draining.load(SeqCst) > 0 {
            return None; // the ticket drops: counted out again
        }
        Some(ticket)
    }

    /// Stops queuing and waits (at most `within`) until every queued ack has settled.
    pub async fn drain(self: &Arc<Self>, within: Duration) -> Draining {
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
        if tokio::time::timeout(within, settled).await.is_err() {
            tracing::warn!(
                pending = self.pending(),
                "hand-over: queued acks still unsettled; handing over anyway (their timers \
                 are delivered again)"
            );
        }
        draining
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
        let a = q.enter().unwrap();
        let b = q.enter().unwrap();
        let q2 = q.clone();
        let drain = tokio::spawn(async move { q2.drain(Duration::from_secs(5)).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(q.enter().is_none(), "queued while draining");
        drop(a);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!drain.is_finished(), "drained with a ticket alive");
        drop(b);
        let draining = tokio::time::timeout(Duration::from_secs(1), drain)
            .await
            .expect("the drain still waits with every ticket settled")
            .unwrap();
        assert!(q.enter().is_none(), "queued while the drain's guard lives");
        drop(draining);
        assert!(q.enter().is_some());
        assert_eq!(q.pending(), 0);
    }

    #[tokio::test]
    async fn a_drain_gives_up_after_its_time() {
        let q = Arc::new(Queued::default());
        let _stuck = q.enter().unwrap();
        let started = std::time::Instant::now();
        let _draining = q.drain(Duration::from_millis(100)).await;
        assert!(started.elapsed() < Duration::from_secs(2));
        assert_eq!(q.pending(), 1);
    }
}
