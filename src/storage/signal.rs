//! The fire wake-up: how apply tells the leader's workers that the wheel changed under them.
//!
//! Storage owns it because apply is the only writer that knows: a Schedule due earlier than
//! the time the fire driver sleeps until, or an entry that made a timer READY for delivery.
//! The workers (`cluster::driver`, `cluster::dispatch`) subscribe; nothing here reads a clock
//! or decides anything, so a replica's apply is the same whether a worker listens or not.

use std::sync::atomic::{AtomicI64, Ordering};

use tokio::sync::Notify;

/// How the state machine wakes the leader's workers. The fire driver: apply compares each newly
/// scheduled due time with the time the driver sleeps until, and notifies only when the new one
/// is earlier. The delivery dispatcher: notified whenever an entry made a timer READY.
#[derive(Debug)]
pub struct FireSignal {
    notify: Notify,
    ready: Notify,
    /// The due time the driver sleeps until; `i64::MAX` while it looks at the wheel or the
    /// wheel is empty (any schedule must wake it).
    target_ms: AtomicI64,
}

impl Default for FireSignal {
    fn default() -> Self {
        FireSignal {
            notify: Notify::new(),
            ready: Notify::new(),
            target_ms: AtomicI64::new(i64::MAX),
        }
    }
}

impl FireSignal {
    /// Called by apply: a timer now waits on the wheel due at `due_ms`.
    pub fn scheduled(&self, due_ms: i64) {
        if due_ms < self.target_ms.load(Ordering::Acquire) {
            self.notify.notify_one();
        }
    }

    /// Called by apply: a timer became READY for delivery.
    pub fn made_ready(&self) {
        self.ready.notify_one();
    }

    /// Resolves after the next `made_ready` (or at once if one came since the last wait).
    pub async fn ready_notified(&self) {
        self.ready.notified().await
    }

    /// Called by the fire driver: it now sleeps until `due_ms` (`i64::MAX`: it looks at the
    /// wheel, or the wheel is empty, so any schedule must wake it).
    pub fn set_target(&self, due_ms: i64) {
        self.target_ms.store(due_ms, Ordering::Release);
    }
}

impl FireSignal {
    /// Resolves after the next `scheduled` earlier than the target (or at once if one came
    /// since the last wait).
    pub async fn scheduled_notified(&self) {
        self.notify.notified().await
    }
}
