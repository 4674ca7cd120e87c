//! A test consumer: subscribes through one node, records every delivery, and (optionally) acks
//! each one concurrently, retrying while the cluster fails over.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use timerdb::api::pb::{self, timers_client::TimersClient};
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic::Code;

use crate::harness::TestCluster;

/// One delivery as the consumer saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub id: String,
    pub attempt: u32,
    pub fire_index: u64,
    pub at: Instant,
    /// The timer's fire time and the client clock (ms) when the delivery arrived.
    pub fire_at_ms: i64,
    pub received_ms: i64,
}

/// What the consumer's acks were answered with.
#[derive(Debug, Clone, Default)]
pub struct Acks {
    /// id → every finished_at_ms an Ack answered with (one transition ⇒ all equal).
    pub finished: HashMap<String, Vec<i64>>,
    /// Acks refused as stale (a newer attempt was out), by id.
    pub stale: HashMap<String, u32>,
    /// Any other failure (the tests require none).
    pub errors: Vec<String>,
}

pub struct Consumer {
    pub seen: Arc<Mutex<Vec<Seen>>>,
    pub acks: Arc<Mutex<Acks>>,
    task: JoinHandle<()>,
}

impl Consumer {
    /// Subscribes to `namespace` through node `via`; acks every delivery when `ack`.
    pub async fn start(
        c: &TestCluster,
        via: u64,
        namespace: &str,
        max_in_flight: u32,
        ack: bool,
    ) -> Consumer {
        let client = c.client(via).await;
        let (seen, acks) = (Arc::default(), Arc::default());
        let req = pb::SubscribeRequest {
            namespace: namespace.into(),
            consumer: format!("test-via-{via}"),
            max_in_flight,
        };
        let task = tokio::spawn(run(client, req, ack, Arc::clone(&seen), Arc::clone(&acks)));
        Consumer { seen, acks, task }
    }

    /// Consumes `namespace` through node `via`, acking every delivery on the stream itself
    /// (Consume): nothing answers those acks, so `acks` stays empty.
    pub async fn start_consume(
        c: &TestCluster,
        via: u64,
        namespace: &str,
        max_in_flight: u32,
    ) -> Consumer {
        let client = c.client(via).await;
        let (seen, acks) = (Arc::default(), Arc::default());
        let req = pb::SubscribeRequest {
            namespace: namespace.into(),
            consumer: format!("test-consume-via-{via}"),
            max_in_flight,
        };
        let task = tokio::spawn(run_consume(client, req, Arc::clone(&seen)));
        Consumer { seen, acks, task }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub fn acks(&self) -> Acks {
        self.acks.lock().unwrap().clone()
    }

    /// Closes the stream (the consumer goes away).
    pub fn stop(&self) {
        self.task.abort();
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn run(
    mut client: TimersClient<Channel>,
    req: pb::SubscribeRequest,
    ack: bool,
    seen: Arc<Mutex<Vec<Seen>>>,
    acks: Arc<Mutex<Acks>>,
) {
    loop {
        let mut stream = match client.subscribe(req.clone()).await {
            Ok(s) => s.into_inner(),
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        while let Ok(Some(d)) = stream.message().await {
            let t = d.timer.expect("a delivery carries its timer");
            note(&seen, &t, d.attempt);
            if ack {
                let (client, acks) = (client.clone(), Arc::clone(&acks));
                tokio::spawn(ack_one(client, t.namespace, t.id, d.attempt, acks));
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn note(seen: &Mutex<Vec<Seen>>, t: &pb::Timer, attempt: u32) {
    seen.lock().unwrap().push(Seen {
        id: t.id.clone(),
        attempt,
        fire_index: t.fire_index,
        at: Instant::now(),
        fire_at_ms: t.fire_at_ms,
        received_ms: crate::harness::now_ms(),
    });
}

async fn run_consume(
    mut client: TimersClient<Channel>,
    req: pb::SubscribeRequest,
    seen: Arc<Mutex<Vec<Seen>>>,
) {
    loop {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let first = pb::ConsumeRequest {
            subscribe: Some(req.clone()),
            acks: Vec::new(),
        };
        tx.send(first).unwrap();
        let outbound = tokio_stream::wrappers::UnboundedReceiverStream::new(rx);
        let mut stream = match client.consume(outbound).await {
            Ok(s) => s.into_inner(),
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        while let Ok(Some(d)) = stream.message().await {
            let t = d.timer.expect("a delivery carries its timer");
            note(&seen, &t, d.attempt);
            let ack = pb::DeliveryAck {
                id: t.id.clone(),
                attempt: d.attempt,
                nack: false,
            };
            let _ = tx.send(pb::ConsumeRequest {
                subscribe: None,
                acks: vec![ack],
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Acks one delivery, retrying through failovers; records the answer.
async fn ack_one(
    mut client: TimersClient<Channel>,
    namespace: String,
    id: String,
    attempt: u32,
    acks: Arc<Mutex<Acks>>,
) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let req = pb::AckRequest {
            namespace: namespace.clone(),
            id: id.clone(),
            attempt,
            wait_for_commit: true,
        };
        match client.ack(req).await {
            Ok(r) => {
                let t = r.into_inner().timer.unwrap();
                let mut a = acks.lock().unwrap();
                if t.state != pb::TimerState::Acked as i32 {
                    a.errors
                        .push(format!("ack answered with a non-ACKED timer {t:?}"));
                }
                a.finished.entry(id).or_default().push(t.finished_at_ms);
                return;
            }
            Err(s) if s.code() == Code::FailedPrecondition && s.message().contains("stale") => {
                *acks.lock().unwrap().stale.entry(id).or_default() += 1;
                return;
            }
            Err(s) if s.code() == Code::Unavailable && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(s) => {
                let msg = format!("ack of {id} attempt {attempt} failed: {s:?}");
                acks.lock().unwrap().errors.push(msg);
                return;
            }
        }
    }
}
