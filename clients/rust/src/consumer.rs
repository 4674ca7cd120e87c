//! [`Subscription`]: a consumer of one namespace's fired timers.
//!
//! A reader task holds a `Subscribe` stream on one node and, when the stream fails or ends (the
//! node stopped, leadership moved), opens it again on the next node after a backoff, for as
//! long as the subscription lives. Delivery is at-least-once: a delivery whose ack was not
//! applied comes again (after the namespace's ack timeout, with a higher `attempt`), and a
//! resubscription can repeat one. Acks are queued and sent together by an acker task, as
//! `AckBatch` calls every few milliseconds (retried: acks are idempotent); [`Subscription::
//! flush`] waits until every ack queued so far has its answer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::client::Client;
use crate::pb::{self, timers_client::TimersClient};
use crate::retry::{transient, Retry};
use crate::Result;

/// How a subscription reads and acks.
#[derive(Debug, Clone)]
pub struct SubscriptionOptions {
    /// A name for the server's logs and metrics.
    pub consumer: String,
    /// Unacked deliveries the stream may hold (0: the server's default).
    pub max_in_flight: u32,
    /// How long an ack may wait for others to share its AckBatch call.
    pub ack_linger: Duration,
    /// Most acks in one AckBatch call.
    pub ack_batch: usize,
}

impl Default for SubscriptionOptions {
    fn default() -> Self {
        SubscriptionOptions {
            consumer: "timerdb-client".into(),
            max_in_flight: 0,
            ack_linger: Duration::from_millis(10),
            ack_batch: 1000,
        }
    }
}

/// What the acks sent since the last flush came to.
#[derive(Debug, Default, Clone)]
pub struct AckOutcome {
    /// Acks the server applied (the timer is ACKED).
    pub acked: u64,
    /// Acks it refused, with why: (id, attempt, status). A refused ack is usually a delivery
    /// that had already been handed out again (its lease ran out), to be acked again.
    pub refused: Vec<(String, u32, tonic::Status)>,
}

enum AckCmd {
    Ack(pb::AckRequest),
    Flush(Flush),
}

type Flush = oneshot::Sender<AckOutcome>;

/// A live subscription (ends when dropped).
pub struct Subscription {
    deliveries: mpsc::Receiver<Result<pb::Delivery>>,
    acks: mpsc::UnboundedSender<AckCmd>,
    namespace: String,
    resubscribed: Arc<AtomicU64>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.tasks.iter().for_each(JoinHandle::abort);
    }
}

impl Client {
    /// Subscribes to `namespace`'s fired timers (see [`Subscription`]).
    pub fn subscribe(&self, namespace: &str, options: SubscriptionOptions) -> Subscription {
        let (tx, deliveries) = mpsc::channel(1024);
        let (acks, ack_rx) = mpsc::unbounded_channel();
        let resubscribed = Arc::new(AtomicU64::new(0));
        let reader = read(
            self.clone(),
            pb::SubscribeRequest {
                namespace: namespace.to_string(),
                consumer: options.consumer.clone(),
                max_in_flight: options.max_in_flight,
            },
            tx,
            resubscribed.clone(),
        );
        let acker = ack_loop(self.clone(), ack_rx, options);
        Subscription {
            deliveries,
            acks,
            namespace: namespace.to_string(),
            resubscribed,
            tasks: vec![tokio::spawn(reader), tokio::spawn(acker)],
        }
    }
}

impl Subscription {
    /// The next delivery; an error is final (the subscription was refused: a wrong namespace,
    /// no permission, a namespace that pushes). `None` once it ended.
    pub async fn next(&mut self) -> Option<Result<pb::Delivery>> {
        self.deliveries.recv().await
    }

    /// Queues the ack of `delivery` (sent with others shortly; see [`Subscription::flush`]).
    pub fn ack(&self, delivery: &pb::Delivery) {
        let id = delivery
            .timer
            .as_ref()
            .map(|t| t.id.clone())
            .unwrap_or_default();
        let _ = self.acks.send(AckCmd::Ack(pb::AckRequest {
            namespace: self.namespace.clone(),
            id,
            attempt: delivery.attempt,
            // Sent in AckBatch calls, which always answer once applied.
            ..Default::default()
        }));
    }

    /// Waits until every ack queued before it has been answered; what they came to.
    pub async fn flush(&self) -> AckOutcome {
        let (tx, rx) = oneshot::channel();
        if self.acks.send(AckCmd::Flush(tx)).is_err() {
            return AckOutcome::default();
        }
        rx.await.unwrap_or_default()
    }

    /// How many times the stream was opened again after the first.
    pub fn resubscribed(&self) -> u64 {
        self.resubscribed.load(Ordering::Relaxed)
    }
}

/// Keeps a Subscribe stream open, on one node after another.
async fn read(
    client: Client,
    req: pb::SubscribeRequest,
    tx: mpsc::Sender<Result<pb::Delivery>>,
    resubscribed: Arc<AtomicU64>,
) {
    let nodes: Vec<_> = client.nodes().map(|(a, c)| (a.to_string(), c)).collect();
    // First on the leader of the namespace's group, which serves the stream (any other node
    // relays it: one hop more).
    let start = nodes
        .iter()
        .position(|(a, _)| a == client.current_for(&req.namespace))
        .unwrap_or(0);
    let backoff = Retry::default();
    let mut failures = 0u32;
    for turn in 0.. {
        if turn > 0 {
            resubscribed.fetch_add(1, Ordering::Relaxed);
        }
        let (addr, conn) = &nodes[(start + turn) % nodes.len()];
        match TimersClient::new(conn.clone()).subscribe(req.clone()).await {
            Ok(stream) => {
                let mut stream = stream.into_inner();
                while let Some(item) = stream.next().await {
                    match item {
                        Ok(d) => {
                            failures = 0;
                            if tx.send(Ok(d)).await.is_err() {
                                return;
                            }
                        }
                        Err(s) => {
                            tracing::debug!(%addr, "subscription ended: {s}");
                            break;
                        }
                    }
                }
            }
            Err(s) if !transient(s.code()) => {
                let _ = tx.send(Err(s)).await;
                return;
            }
            Err(s) => tracing::debug!(%addr, "cannot subscribe: {s}"),
        }
        if tx.is_closed() {
            return;
        }
        failures += 1;
        tokio::time::sleep(backoff.backoff(failures.min(6))).await;
    }
}

/// Sends queued acks in AckBatch calls.
async fn ack_loop(
    client: Client,
    mut rx: mpsc::UnboundedReceiver<AckCmd>,
    options: SubscriptionOptions,
) {
    let mut outcome = AckOutcome::default();
    let mut batch: Vec<pb::AckRequest> = Vec::new();
    let mut flushes: Vec<Flush> = Vec::new();
    loop {
        // Wait for work, then linger briefly for more.
        let first = match rx.recv().await {
            Some(c) => c,
            None => return,
        };
        fn take(c: AckCmd, batch: &mut Vec<pb::AckRequest>, flushes: &mut Vec<Flush>) {
            match c {
                AckCmd::Ack(a) => batch.push(a),
                AckCmd::Flush(f) => flushes.push(f),
            }
        }
        take(first, &mut batch, &mut flushes);
        let linger = tokio::time::sleep(options.ack_linger);
        tokio::pin!(linger);
        while batch.len() < options.ack_batch && flushes.is_empty() {
            tokio::select! {
                c = rx.recv() => match c {
                    Some(c) => take(c, &mut batch, &mut flushes),
                    None => break,
                },
                _ = &mut linger => break,
            }
        }
        while !batch.is_empty() {
            let n = batch.len().min(options.ack_batch);
            let acks: Vec<_> = batch.drain(..n).collect();
            send(&client, acks, &mut outcome).await;
        }
        for f in flushes.drain(..) {
            let _ = f.send(std::mem::take(&mut outcome));
        }
    }
}

async fn send(client: &Client, acks: Vec<pb::AckRequest>, outcome: &mut AckOutcome) {
    let reply = client
        .ack_batch(pb::AckBatchRequest { acks: acks.clone() })
        .await;
    match reply {
        Ok(r) => {
            for (ack, result) in acks.into_iter().zip(r.results) {
                match result.code {
                    0 => outcome.acked += 1,
                    code => outcome.refused.push((
                        ack.id,
                        ack.attempt,
                        tonic::Status::new(code.into(), result.message),
                    )),
                }
            }
        }
        Err(s) => {
            for ack in acks {
                outcome.refused.push((ack.id, ack.attempt, s.clone()));
            }
        }
    }
}
