//! A fair queue: items from many sources (lanes: a delivery stream, a namespace's pusher)
//! taken in turns, one from each lane with items, so a source that hands in a great many
//! cannot hold back another's few.
//!
//! Used by the ack coalescer (`acks.rs`): a consumer acking a backlog of 40,000 deliveries
//! used to queue ahead of every other stream's acks (first come, first served), delaying them
//! by the time its backlog took to commit. Now each lane waits behind at most one item per
//! other lane per turn.
//!
//! Invariants: items of one lane leave in the order they came; a lane holds at most
//! `per_lane` items and all lanes together at most `total` (a pusher waits for room, which
//! stops it reading more: memory stays bounded however fast sources hand in); the consumer is
//! woken by every push and never misses one (a stored `Notify` permit).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// The queue; shared by its pushers and its one consumer.
pub struct Lanes<T> {
    state: Mutex<State<T>>,
    /// Woken when items were taken (room for pushers).
    drained: Notify,
    /// Woken when an item came (the consumer), and when the queue is dropped.
    wake: Arc<Notify>,
    per_lane: usize,
    total: usize,
}

struct State<T> {
    lanes: HashMap<u64, VecDeque<T>>,
    /// The lanes with items, in turn order.
    turns: VecDeque<u64>,
    len: usize,
    /// Its consumer is gone (`close`): pushes drop their item at once.
    closed: bool,
}

impl<T> Lanes<T> {
    /// An empty queue, and what wakes its consumer (it outlives the queue: the consumer holds
    /// it and a `Weak` of the queue, and ends once the queue is gone).
    pub fn new(per_lane: usize, total: usize) -> (Arc<Lanes<T>>, Arc<Notify>) {
        let wake = Arc::new(Notify::new());
        let lanes = Lanes {
            state: Mutex::new(State {
                lanes: HashMap::new(),
                turns: VecDeque::new(),
                len: 0,
                closed: false,
            }),
            drained: Notify::new(),
            wake: wake.clone(),
            per_lane,
            total,
        };
        (Arc::new(lanes), wake)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `item` on `lane`, waiting while the lane or the whole queue is full; false if
    /// the queue is closed (the item was dropped).
    pub async fn push(&self, lane: u64, item: T) -> bool {
        let mut item = Some(item);
        loop {
            let room = self.drained.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let mut s = self.state();
                if s.closed {
                    return false; // the item is dropped: a waiter on it learns it never went
                }
                let held = s.lanes.get(&lane).map_or(0, VecDeque::len);
                if held < self.per_lane && s.len < self.total {
                    let queue = s.lanes.entry(lane).or_default();
                    queue.push_back(item.take().expect("pushed once"));
                    if queue.len() == 1 {
                        s.turns.push_back(lane);
                    }
                    s.len += 1;
                    self.wake.notify_one();
                    return true;
                }
            }
            room.await;
        }
    }

    /// Whether any lane holds an item.
    pub fn has_items(&self) -> bool {
        self.state().len > 0
    }

    /// Takes up to `max` items in turns, one per lane per turn; stops after the first item
    /// `last` says ends the take (it is taken, and returned last).
    pub fn take(&self, max: usize, last: impl Fn(&T) -> bool) -> Vec<T> {
        let mut out = Vec::new();
        {
            let mut s = self.state();
            while out.len() < max {
                let Some(lane) = s.turns.pop_front() else {
                    break;
                };
                let queue = s.lanes.get_mut(&lane).expect("a lane in turn has items");
                let item = queue.pop_front().expect("a lane in turn has items");
                if queue.is_empty() {
                    s.lanes.remove(&lane);
                } else {
                    s.turns.push_back(lane);
                }
                s.len -= 1;
                let stop = last(&item);
                out.push(item);
                if stop {
                    break;
                }
            }
        }
        if !out.is_empty() {
            self.drained.notify_waiters();
        }
        out
    }
}

impl<T> Lanes<T> {
    /// The consumer is gone (it ended, or panicked): drops every item held and every later
    /// one, and wakes the pushers waiting for room, so none waits for a consumer that will
    /// never come (an item's own waiter sees it dropped).
    pub fn close(&self) {
        let dropped = {
            let mut s = self.state();
            s.closed = true;
            s.turns.clear();
            s.len = 0;
            std::mem::take(&mut s.lanes)
        };
        drop(dropped); // outside the lock: an item's drop may run code
        self.drained.notify_waiters();
    }
}

impl<T> Drop for Lanes<T> {
    fn drop(&mut self) {
        self.wake.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A consumer that died (a panic) left pushers waiting for room, and a barrier's waiter
    /// for an answer, for ever (review 33c, LOW 11): closed, the queue drops what it held and
    /// takes nothing more.
    #[tokio::test]
    async fn a_closed_queue_drops_its_items_and_frees_its_pushers() {
        let (q, _wake) = Lanes::new(1, 10);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        assert!(q.push(1, tx).await, "queued");
        let (tx2, rx2) = tokio::sync::oneshot::channel::<()>();
        let pusher = {
            let q = q.clone();
            tokio::spawn(async move { q.push(1, tx2).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!pusher.is_finished(), "the lane is full: it waits");
        q.close();
        let queued = tokio::time::timeout(std::time::Duration::from_secs(5), pusher)
            .await
            .expect("a pusher still waited after close")
            .unwrap();
        assert!(!queued, "a push into a closed queue said it queued");
        let (tx3, _rx3) = tokio::sync::oneshot::channel::<()>();
        assert!(
            !q.push(2, tx3).await,
            "a push into a closed queue said it queued"
        );
        assert!(rx.await.is_err(), "a held item was not dropped");
        assert!(rx2.await.is_err(), "a later item was not dropped");
        assert!(!q.has_items());
    }

    /// The review of issue 33 (finding 12's fix): one queue, first come first served, so a
    /// stream acking a backlog delayed every other stream's acks by the time it took to
    /// commit. Taken in turns, a lane's few come out in the first take.
    #[tokio::test]
    async fn a_lane_with_many_items_does_not_hold_back_another() {
        let (q, _wake) = Lanes::new(30_000, 40_000);
        for i in 0..30_000u32 {
            q.push(1, (1, i)).await;
        }
        for i in 0..10u32 {
            q.push(2, (2, i)).await;
        }
        let first = q.take(10_000, |_| false);
        assert_eq!(first.len(), 10_000);
        let theirs: Vec<u32> = first.iter().filter(|i| i.0 == 2).map(|i| i.1).collect();
        assert_eq!(
            theirs,
            (0..10).collect::<Vec<_>>(),
            "in order, all in the first take"
        );
        let mine: Vec<u32> = first.iter().filter(|i| i.0 == 1).map(|i| i.1).collect();
        assert_eq!(
            mine,
            (0..9_990).collect::<Vec<_>>(),
            "one lane's order is kept"
        );
    }

    #[tokio::test]
    async fn a_full_lane_waits_and_others_go_on() {
        let (q, wake) = Lanes::new(2, 3);
        q.push(1, 1).await;
        q.push(1, 2).await;
        let blocked = tokio::time::timeout(std::time::Duration::from_millis(50), q.push(1, 3));
        assert!(blocked.await.is_err(), "a third item for a lane of 2");
        q.push(2, 10).await;
        let full = tokio::time::timeout(std::time::Duration::from_millis(50), q.push(3, 20));
        assert!(full.await.is_err(), "a fourth item for a queue of 3");
        assert_eq!(
            q.take(10, |i| *i == 2),
            vec![1, 10, 2],
            "turns, then the stop"
        );
        q.push(1, 3).await;
        wake.notified().await; // a permit was stored by the pushes
        assert_eq!(q.take(10, |_| false), vec![3]);
    }
}
