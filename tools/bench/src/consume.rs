//! Consumers for the fire workloads: delivery streams that record when each timer arrived
//! (lateness = receive time − fire_at, on the machine's one clock) and ack every delivery,
//! either with AckBatch calls (`batch`: answered, so each ack is known to have applied) or on
//! the stream itself (`stream`: Consume; not answered, so the workload then waits until the
//! cluster has applied as many acks, read from `Cluster.Status`). A consumer whose stream
//! breaks subscribes again through the next node of its list.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;
use timerdb::api::pb::{self, timers_client::TimersClient};
use tokio::sync::{mpsc, watch, Semaphore};
use tonic::transport::Channel;

use crate::target::{histogram, now_us, Target};

/// Unacked deliveries each stream may hold (the server's maximum).
const MAX_IN_FLIGHT: u32 = 10_000;
/// Concurrent AckBatch calls per consumer, and most acks in one.
const ACKS_IN_FLIGHT: usize = 8;
const ACK_BATCH: usize = 2000;

/// What the consumers saw of one timer.
pub struct Seen {
    pub fire_at_ms: i64,
    pub first_recv_us: i64,
    pub acked_us: i64,
}

/// How the consumers ack.
#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AckWith {
    /// AckBatch calls of whatever has queued up.
    Batch,
    /// Acks on the Consume stream, several per message.
    Stream,
}

#[derive(Default)]
pub struct Log {
    pub seen: HashMap<String, Seen>,
    pub deliveries: u64,
    /// Acks answered OK (batch) or sent (stream).
    pub acked: u64,
    /// When the cluster had applied every stream ack (stream only; 0 before).
    pub confirmed_us: i64,
    pub ack_errors: u64,
    pub first_ack_error: Option<String>,
}

impl Log {
    /// Lateness (first receipt − fire time) of the timers `keep` selects, in µs, and how many
    /// of them arrived before their fire time.
    pub fn lateness(&self, keep: impl Fn(&Seen) -> bool) -> (Histogram<u64>, u64) {
        let mut h = histogram();
        let mut early = 0;
        for s in self.seen.values().filter(|s| keep(s)) {
            let late = s.first_recv_us - s.fire_at_ms * 1000;
            if late < 0 {
                early += 1;
            }
            let _ = h.record(late.max(1) as u64);
        }
        (h, early)
    }

    pub fn last_ack_us(&self) -> i64 {
        let last = self.seen.values().map(|s| s.acked_us).max().unwrap_or(0);
        last.max(self.confirmed_us)
    }

    pub fn last_recv_us(&self) -> i64 {
        self.seen
            .values()
            .map(|s| s.first_recv_us)
            .max()
            .unwrap_or(0)
    }
}

pub type Shared = Arc<Mutex<Log>>;

pub struct Consumers {
    pub log: Shared,
    pub with: AckWith,
    /// Acks the cluster had applied before (most of any node), for stream acks.
    baseline: u64,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Consumers {
    /// One consumer per entry of `homes`; consumer i subscribes through `homes[i]` first.
    pub async fn start(
        target: &Target,
        ns: &str,
        homes: &[u64],
        with: AckWith,
    ) -> anyhow::Result<Consumers> {
        let baseline = applied_acks(target).await;
        let log = Shared::default();
        let (stop, rx) = watch::channel(false);
        let mut tasks = Vec::new();
        for (i, home) in homes.iter().enumerate() {
            let mut order = vec![*home];
            order.extend(target.addrs.keys().filter(|id| *id != home));
            let clients = order
                .iter()
                .map(|id| Ok(TimersClient::new(target.channel(*id)?)))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let c = Consumer {
                name: format!("bench-{i}"),
                ns: ns.to_string(),
                clients,
                log: log.clone(),
            };
            tasks.push(match with {
                AckWith::Batch => tokio::spawn(c.run(rx.clone())),
                AckWith::Stream => tokio::spawn(c.run_stream(rx.clone())),
            });
        }
        Ok(Consumers {
            log,
            with,
            baseline,
            stop,
            tasks,
        })
    }

    /// With stream acks: waits until the cluster has applied `count` acks since the consumers
    /// started and notes when; false if `within` passes first. With AckBatch: true at once
    /// (every counted ack was answered).
    pub async fn confirm(&self, target: &Target, count: u64, within: Duration) -> bool {
        if self.with == AckWith::Batch {
            return true;
        }
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if applied_acks(target).await.saturating_sub(self.baseline) >= count {
                self.log.lock().expect("log lock").confirmed_us = now_us();
                return true;
            }
            if tokio::time::Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub fn acked(&self) -> u64 {
        self.log.lock().expect("log lock").acked
    }

    pub async fn stop(self) -> Shared {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
        self.log
    }
}

struct Consumer {
    name: String,
    ns: String,
    clients: Vec<TimersClient<Channel>>,
    log: Shared,
}

impl Consumer {
    async fn run(self, mut stop: watch::Receiver<bool>) {
        let (ack_tx, ack_rx) = mpsc::unbounded_channel();
        let acker = tokio::spawn(acker(
            self.clients.clone(),
            self.ns.clone(),
            ack_rx,
            self.log.clone(),
        ));
        let mut turn = 0;
        while !*stop.borrow() {
            let mut client = self.clients[turn % self.clients.len()].clone();
            turn += 1;
            let req = pb::SubscribeRequest {
                namespace: self.ns.clone(),
                consumer: self.name.clone(),
                max_in_flight: MAX_IN_FLIGHT,
            };
            let opened = tokio::select! {
                r = client.subscribe(req) => r,
                _ = stop.changed() => break,
            };
            if let Ok(stream) = opened {
                let mut stream = stream.into_inner();
                loop {
                    let msg = tokio::select! {
                        m = stream.message() => m,
                        _ = stop.changed() => break,
                    };
                    let Ok(Some(d)) = msg else { break };
                    let t = d.timer.unwrap_or_default();
                    self.record(&t);
                    let _ = ack_tx.send((t.id, d.attempt));
                }
            }
            if !*stop.borrow() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        drop(ack_tx);
        let _ = acker.await;
    }

    /// Like `run`, with acks sent on the stream: a sender task puts every ack queued since its
    /// last message into one message, as a consumer acking as it goes would.
    async fn run_stream(self, mut stop: watch::Receiver<bool>) {
        let mut turn = 0;
        while !*stop.borrow() {
            let mut client = self.clients[turn % self.clients.len()].clone();
            turn += 1;
            let (msgs, msgs_rx) = mpsc::unbounded_channel();
            let _ = msgs.send(pb::ConsumeRequest {
                subscribe: Some(pb::SubscribeRequest {
                    namespace: self.ns.clone(),
                    consumer: self.name.clone(),
                    max_in_flight: MAX_IN_FLIGHT,
                }),
                acks: Vec::new(),
            });
            let (acks, mut acks_rx) = mpsc::unbounded_channel::<pb::DeliveryAck>();
            let sender = tokio::spawn(async move {
                while let Some(first) = acks_rx.recv().await {
                    let mut batch = vec![first];
                    while let Ok(next) = acks_rx.try_recv() {
                        batch.push(next);
                    }
                    let msg = pb::ConsumeRequest {
                        subscribe: None,
                        acks: batch,
                    };
                    if msgs.send(msg).is_err() {
                        return;
                    }
                }
            });
            let outbound = tokio_stream::wrappers::UnboundedReceiverStream::new(msgs_rx);
            let opened = tokio::select! {
                r = client.consume(outbound) => r,
                _ = stop.changed() => break,
            };
            if let Ok(stream) = opened {
                let mut stream = stream.into_inner();
                loop {
                    let msg = tokio::select! {
                        m = stream.message() => m,
                        _ = stop.changed() => break,
                    };
                    let Ok(Some(d)) = msg else { break };
                    let t = d.timer.unwrap_or_default();
                    self.record(&t);
                    let _ = acks.send(pb::DeliveryAck {
                        id: t.id.clone(),
                        attempt: d.attempt,
                        nack: false,
                    });
                    let mut log = self.log.lock().expect("log lock");
                    if let Some(s) = log.seen.get_mut(&t.id).filter(|s| s.acked_us == 0) {
                        s.acked_us = now_us();
                        log.acked += 1;
                    }
                }
            }
            drop(acks);
            let _ = sender.await;
            if !*stop.borrow() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    fn record(&self, t: &pb::Timer) {
        let now = now_us();
        let mut log = self.log.lock().expect("log lock");
        log.deliveries += 1;
        log.seen.entry(t.id.clone()).or_insert(Seen {
            fire_at_ms: t.fire_at_ms,
            first_recv_us: now,
            acked_us: 0,
        });
    }
}

/// Acks deliveries as they come, in AckBatch calls of whatever has queued up (at most
/// `ACK_BATCH`), `ACKS_IN_FLIGHT` calls at a time, through the consumer's nodes in turn (a call
/// whose outcome is unknown is retried whole: acks are idempotent).
async fn acker(
    clients: Vec<TimersClient<Channel>>,
    ns: String,
    mut rx: mpsc::UnboundedReceiver<(String, u32)>,
    log: Shared,
) {
    let permits = Arc::new(Semaphore::new(ACKS_IN_FLIGHT));
    while let Some(first) = rx.recv().await {
        let permit = permits.clone().acquire_owned().await.expect("never closed");
        let mut batch = vec![first];
        while batch.len() < ACK_BATCH {
            match rx.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let (clients, ns, log) = (clients.clone(), ns.clone(), log.clone());
        tokio::spawn(async move {
            let result = ack_batch(&clients, &ns, &batch).await;
            let now = now_us();
            let mut log = log.lock().expect("log lock");
            match result {
                Ok(results) => {
                    for ((id, _), r) in batch.iter().zip(results) {
                        if r.code != 0 {
                            log.ack_errors += 1;
                            log.first_ack_error
                                .get_or_insert(format!("{id}: {}", r.message));
                            continue;
                        }
                        let first = log.seen.get_mut(id).filter(|s| s.acked_us == 0);
                        if let Some(s) = first {
                            s.acked_us = now;
                            log.acked += 1;
                        }
                    }
                }
                Err(status) => {
                    log.ack_errors += batch.len() as u64;
                    log.first_ack_error.get_or_insert(status.to_string());
                }
            }
            drop(permit);
        });
    }
    // Wait for the acks still in flight.
    let _ = permits.acquire_many(ACKS_IN_FLIGHT as u32).await;
}

async fn ack_batch(
    clients: &[TimersClient<Channel>],
    ns: &str,
    batch: &[(String, u32)],
) -> Result<Vec<pb::AckResult>, tonic::Status> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let acks: Vec<pb::AckRequest> = batch
        .iter()
        .map(|(id, attempt)| pb::AckRequest {
            namespace: ns.into(),
            id: id.clone(),
            attempt: *attempt,
            ..Default::default()
        })
        .collect();
    let mut turn = 0;
    loop {
        let mut client = clients[turn % clients.len()].clone();
        turn += 1;
        let req = pb::AckBatchRequest { acks: acks.clone() };
        match client.ack_batch(req).await {
            Ok(r) => return Ok(r.into_inner().results),
            Err(s) if retryable(&s) && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(s) => return Err(s),
        }
    }
}

fn retryable(s: &tonic::Status) -> bool {
    matches!(
        s.code(),
        tonic::Code::Unavailable | tonic::Code::Cancelled | tonic::Code::Unknown
    )
}

/// Waits until `want` timers are acked or `within` passes; shows progress on `bar`.
pub async fn wait_acked(
    consumers: &Consumers,
    want: u64,
    within: Duration,
    bar: &indicatif::ProgressBar,
) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let acked = consumers.acked();
        bar.set_position(acked);
        if acked >= want {
            return true;
        }
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The most FIRED → ACKED transitions any node reports having applied since it started.
async fn applied_acks(target: &Target) -> u64 {
    let mut most = 0;
    for id in target.addrs.keys() {
        if let Some(s) = target.status(*id).await {
            most = most.max(s.timers_acked);
        }
    }
    most
}
