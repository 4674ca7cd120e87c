//! The hold: a gate every proposal and leader read on this node passes first, closed while the
//! node hands its leadership to another (see `membership`).
//!
//! Why it exists: while openraft 0.10 transfers leadership it refuses proposals and reads
//! (ForwardToLeader, LeadershipTransfer); and before it starts, the leader waits until the
//! target has the whole log, which new proposals would keep lengthening. So work that arrives
//! during a hand-over waits at the gate instead of failing; when it opens it goes on, and on a
//! node that no longer leads it fails with NotLeader and is retried at the new leader like any
//! request during an election. (Under openraft 0.9 the gate also kept the leader quiet until
//! its followers' leases ran out.)
//!
//! Invariant: the gate is closed only by a [`Closed`] guard, which opens it when dropped, so a
//! transfer that fails or panics never leaves the node holding its writes.

use std::sync::Arc;

use tokio::sync::watch;

/// The gate; clones share it.
#[derive(Clone)]
pub struct Hold {
    closed: Arc<watch::Sender<bool>>,
}

impl Default for Hold {
    fn default() -> Self {
        Hold {
            closed: Arc::new(watch::channel(false).0),
        }
    }
}

impl Hold {
    /// Waits while the gate is closed.
    pub async fn pass(&self) {
        if !self.is_closed() {
            return;
        }
        let mut rx = self.closed.subscribe();
        let _ = rx.wait_for(|closed| !*closed).await;
    }

    /// Closes the gate until the returned guard is dropped.
    pub fn close(&self) -> Closed {
        self.closed.send_replace(true);
        Closed(self.clone())
    }

    pub fn is_closed(&self) -> bool {
        *self.closed.borrow()
    }
}

/// Keeps the gate closed; dropping it opens the gate.
pub struct Closed(Hold);

impl Drop for Closed {
    fn drop(&mut self) {
        self.0.closed.send_replace(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn pass_waits_while_closed_and_the_guard_reopens() {
        let hold = Hold::default();
        hold.pass().await;
        let guard = hold.close();
        let waiting = tokio::spawn({
            let hold = hold.clone();
            async move { hold.pass().await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "passed a closed gate");
        drop(guard);
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("gate did not reopen")
            .unwrap();
        assert!(!hold.is_closed());
    }
}
