//! The clients: workers issuing schedule, batch schedule, cancel, reschedule and get against
//! random nodes, and consumers subscribing and acking; everything they see goes to the history.
//!
//! An operation's outcome is `Ok`, `Failed` (a definite refusal: nothing happened) or `Unknown`
//! (timeout, UNAVAILABLE, a broken connection: it may or may not have happened). Every timer's
//! payload is its id, so the checker can tell a timer from a phantom.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::secure::Conn;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use timerdb::api::pb::{self, timers_client::TimersClient};
use tokio::sync::watch;
use tonic::{Code, Status};

pub const NAMESPACE: &str = "chaos";
/// How long one call may take before its outcome is recorded as unknown.
const CALL_TIMEOUT: Duration = Duration::from_secs(8);

pub fn now_ms() -> i64 {
    timerdb::clock::Clock::system().now_ms()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Schedule,
    Batch,
    Cancel,
    Reschedule,
    Get,
    /// A Cancel only if the timer is still PENDING (`if_state`): not safe to send twice, so
    /// a refusal must mean it did nothing.
    CancelIf,
    /// A Reschedule `extend_by_ms` (in `fire_at[0]`) of a shift-only timer: each applied
    /// exactly once if acknowledged, never if refused.
    Extend,
}

/// The id prefix of the timers only ever shifted (`Kind::Extend`): scheduled far ahead, never
/// cancelled or moved otherwise, so the checker can add up their shifts.
pub const SHIFTED: &str = "x";

#[derive(Debug, Clone)]
pub enum Outcome {
    Ok(Vec<pb::Timer>),
    Failed(Code, String),
    Unknown(Code, String),
}

/// One client operation: what was asked, when, through which node, and what came back.
#[derive(Debug, Clone)]
pub struct Op {
    pub kind: Kind,
    pub ids: Vec<String>,
    /// Schedule/Batch: each id's fire time; Reschedule: the new fire time.
    pub fire_at: Vec<i64>,
    pub node: u64,
    pub invoke_ms: i64,
    pub complete_ms: i64,
    pub outcome: Outcome,
}

/// One delivery as a consumer received it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub id: String,
    pub attempt: u32,
    pub fire_index: u64,
    pub fire_at_ms: i64,
    pub received_ms: i64,
    /// How the consumer that received it acks.
    pub path: AckPath,
}

/// Everything the clients observed.
#[derive(Debug, Default)]
pub struct History {
    pub ops: Vec<Op>,
    pub deliveries: Vec<Seen>,
    /// (id, attempt, outcome) of every Ack's final answer.
    pub acks: Vec<(String, u32, Outcome)>,
}

pub type Shared = Arc<Mutex<History>>;

fn outcome<T>(r: Result<T, Status>, timers: impl FnOnce(T) -> Vec<pb::Timer>) -> Outcome {
    match r {
        Ok(v) => Outcome::Ok(timers(v)),
        // A status tonic made from a transport failure (an h2 GOAWAY or reset, whatever code
        // it maps to: ENHANCE_YOUR_CALM becomes RESOURCE_EXHAUSTED) is no answer from timerdb:
        // the call may have been applied.
        Err(s) if std::error::Error::source(&s).is_some() => {
            Outcome::Unknown(s.code(), s.message().to_string())
        }
        Err(s) => match s.code() {
            Code::InvalidArgument
            | Code::NotFound
            | Code::AlreadyExists
            | Code::FailedPrecondition
            | Code::ResourceExhausted => Outcome::Failed(s.code(), s.message().to_string()),
            code => Outcome::Unknown(code, s.message().to_string()),
        },
    }
}

fn request<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(CALL_TIMEOUT);
    r
}

/// A worker's memory of the timers it scheduled: (id, fire_at), and its shift-only ones
/// (id, when first due).
struct Mine {
    ids: Vec<(String, i64)>,
    next: u64,
    shifted: Vec<(String, i64)>,
}

/// Runs one worker until `stop`.
pub async fn worker(
    w: usize,
    clients: Vec<(u64, TimersClient<Conn>)>,
    history: Shared,
    seed: u64,
    mut stop: watch::Receiver<bool>,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ (w as u64 + 1).wrapping_mul(0x9e37_79b9));
    let mut mine = Mine {
        ids: Vec::new(),
        next: 0,
        shifted: Vec::new(),
    };
    while !*stop.borrow() {
        let (node, mut client) = clients[rng.random_range(0..clients.len())].clone();
        let op = one_op(w, &mut rng, &mut mine, node, &mut client).await;
        history.lock().unwrap().ops.push(op);
        let pause = Duration::from_millis(rng.random_range(5..25));
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.changed() => {}
        }
    }
}

async fn one_op(
    w: usize,
    rng: &mut StdRng,
    mine: &mut Mine,
    node: u64,
    client: &mut TimersClient<Conn>,
) -> Op {
    let roll = rng.random_range(0..100);
    let invoke_ms = now_ms();
    let pick = |rng: &mut StdRng, mine: &Mine| -> Option<String> {
        // Mostly timers that are still to fire (the racy, interesting ones).
        let recent = mine.ids.len().saturating_sub(200);
        let i = rng.random_range(recent..mine.ids.len().max(recent + 1));
        mine.ids.get(i).map(|(id, _)| id.clone())
    };
    let (kind, ids, fire_at, outcome) = match roll {
        0..5 if {
            // The shift-only timers still to fire (by their first fire time: shifts only
            // move them later) are the ones to shift; a fresh one replaces those gone by.
            let now = now_ms();
            mine.shifted.retain(|(_, at)| *at > now);
            mine.shifted.len() < 20
        } =>
        {
            // A shift-only timer, due a while later: only Extend touches it (a shift after it
            // fired is refused, and counts for nothing).
            mine.next += 1;
            let id = format!("{SHIFTED}{w}-{}", mine.next);
            let at = now_ms() + rng.random_range(5_000..15_000);
            mine.shifted.push((id.clone(), at));
            let r = client.schedule(request(schedule_req(&id, at))).await;
            let o = outcome(r, |r| r.into_inner().timer.into_iter().collect());
            (Kind::Schedule, vec![id], vec![at], o)
        }
        0..5 => {
            let id = mine.shifted[rng.random_range(0..mine.shifted.len())]
                .0
                .clone();
            let by = rng.random_range(1..50) * 7;
            let req = pb::RescheduleRequest {
                namespace: NAMESPACE.into(),
                id: id.clone(),
                when: Some(pb::reschedule_request::When::ExtendByMs(by)),
                ..Default::default()
            };
            let r = client.reschedule(request(req)).await;
            let o = outcome(r, |r| r.into_inner().timer.into_iter().collect());
            (Kind::Extend, vec![id], vec![by], o)
        }
        5..10 if !mine.ids.is_empty() => {
            let id = pick(rng, mine).expect("non-empty");
            let req = pb::CancelRequest {
                namespace: NAMESPACE.into(),
                id: id.clone(),
                if_state: pb::TimerState::Pending as i32,
                ..Default::default()
            };
            let r = client.cancel(request(req)).await;
            let o = outcome(r, |r| r.into_inner().timer.into_iter().collect());
            (Kind::CancelIf, vec![id], vec![], o)
        }
        5..45 => {
            let (id, at) = fresh(w, rng, mine);
            let r = client.schedule(request(schedule_req(&id, at))).await;
            let o = outcome(r, |r| r.into_inner().timer.into_iter().collect());
            (Kind::Schedule, vec![id], vec![at], o)
        }
        45..55 => {
            let n = rng.random_range(2..10);
            let batch: Vec<(String, i64)> = (0..n).map(|_| fresh(w, rng, mine)).collect();
            let timers = batch.iter().map(|(id, at)| schedule_req(id, *at)).collect();
            let r = client
                .schedule_batch(request(pb::ScheduleBatchRequest { timers }))
                .await;
            let o = outcome(r, |r| {
                r.into_inner()
                    .results
                    .into_iter()
                    .filter_map(|r| r.timer)
                    .collect()
            });
            let (ids, ats) = batch.into_iter().unzip();
            (Kind::Batch, ids, ats, o)
        }
        55..70 if !mine.ids.is_empty() => {
            let id = pick(rng, mine).expect("non-empty");
            let req = pb::CancelRequest {
                namespace: NAMESPACE.into(),
                id: id.clone(),
                ..Default::default()
            };
            let r = client.cancel(request(req)).await;
            let o = outcome(r, |r| r.into_inner().timer.into_iter().collect());
            (Kind::Cancel, vec![id], vec![], o)
        }
        70..80 if !mine.ids.is_empty() => {
            let id = pick(rng, mine).expect("non-empty");
            let at = now_ms() + rng.random_range(100..3_000);
            let req = pb::RescheduleRequest {
                namespace: NAMESPACE.into(),
                id: id.clone(),
                when: Some(pb::reschedule_request::When::FireAtMs(at)),
                ..Default::default()
            };
            let r = client.reschedule(request(req)).await;
            let o = outcome(r, |r| r.into_inner().timer.into_iter().collect());
            (Kind::Reschedule, vec![id], vec![at], o)
        }
        _ if !mine.ids.is_empty() => {
            let id = pick(rng, mine).expect("non-empty");
            let req = pb::GetRequest {
                namespace: NAMESPACE.into(),
                id: id.clone(),
                ..Default::default()
            };
            let r = client.get(request(req)).await;
            let o = outcome(r, |r| r.into_inner().timer.into_iter().collect());
            (Kind::Get, vec![id], vec![], o)
        }
        _ => {
            let (id, at) = fresh(w, rng, mine);
            let r = client.schedule(request(schedule_req(&id, at))).await;
            let o = outcome(r, |r| r.into_inner().timer.into_iter().collect());
            (Kind::Schedule, vec![id], vec![at], o)
        }
    };
    Op {
        kind,
        ids,
        fire_at,
        node,
        invoke_ms,
        complete_ms: now_ms(),
        outcome,
    }
}

/// A new id and a fire time 100 ms to 4 s ahead.
fn fresh(w: usize, rng: &mut StdRng, mine: &mut Mine) -> (String, i64) {
    mine.next += 1;
    let id = format!("w{w}-{}", mine.next);
    let at = now_ms() + rng.random_range(100..4_000);
    mine.ids.push((id.clone(), at));
    (id, at)
}

fn schedule_req(id: &str, at: i64) -> pb::ScheduleRequest {
    pb::ScheduleRequest {
        namespace: NAMESPACE.into(),
        id: id.into(),
        when: Some(pb::schedule_request::When::FireAtMs(at)),
        payload: id.as_bytes().to_vec(),
        ..Default::default()
    }
}

/// How a consumer acks: each delivery with a unary Ack of its own (through any node, after a
/// Subscribe) answered once applied (`wait_for_commit`) or once queued on the leader (the
/// default), or on the delivery stream itself (Consume). They reach the state machine through
/// different code: the proposer directly, or the ack coalescer (queued and stream acks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckPath {
    Unary,
    Queued,
    Stream,
}

impl AckPath {
    /// Whether an ack on this path may be answered before it applies (so only the redelivery
    /// check judges it, once the cluster is calm).
    pub fn answered_early(self) -> bool {
        self != AckPath::Unary
    }
}

/// Runs one consumer until `stop`: subscribes through the nodes in turn (moving on when a
/// stream breaks) and acks every delivery. Stream acks have no answer of their own; one lost
/// with a broken stream is redelivered after the ack timeout, and liveness checks that every
/// timer ends ACKED.
pub async fn consumer(
    c: usize,
    path: AckPath,
    clients: Vec<(u64, TimersClient<Conn>)>,
    history: Shared,
    mut stop: watch::Receiver<bool>,
) {
    let mut turn = c;
    while !*stop.borrow() {
        let (_, mut client) = clients[turn % clients.len()].clone();
        turn += 1;
        let sub = pb::SubscribeRequest {
            namespace: NAMESPACE.into(),
            consumer: format!("chaos-{c}"),
            max_in_flight: 200,
        };
        // Stream acks go up this channel; it lives as long as this stream.
        let (acks, upstream) = tokio::sync::mpsc::unbounded_channel::<pb::ConsumeRequest>();
        let opened = tokio::select! {
            r = async {
                match path {
                    AckPath::Unary | AckPath::Queued => client.subscribe(sub).await,
                    AckPath::Stream => {
                        let first = pb::ConsumeRequest { subscribe: Some(sub), acks: vec![] };
                        let _ = acks.send(first);
                        let up = tokio_stream::wrappers::UnboundedReceiverStream::new(upstream);
                        client.consume(up).await
                    }
                }
            } => r,
            _ = stop.changed() => return,
        };
        if let Ok(stream) = opened {
            let mut stream = stream.into_inner();
            loop {
                let msg = tokio::select! {
                    m = stream.message() => m,
                    _ = stop.changed() => return,
                };
                let Ok(Some(d)) = msg else { break };
                let t = d.timer.unwrap_or_default();
                history.lock().unwrap().deliveries.push(Seen {
                    id: t.id.clone(),
                    attempt: d.attempt,
                    fire_index: t.fire_index,
                    fire_at_ms: t.fire_at_ms,
                    received_ms: now_ms(),
                    path,
                });
                match path {
                    AckPath::Unary | AckPath::Queued => {
                        let wait = path == AckPath::Unary;
                        let (c, h) = (clients.clone(), history.clone());
                        tokio::spawn(ack(c, t.id, d.attempt, wait, h));
                    }
                    AckPath::Stream => {
                        let ack = pb::DeliveryAck {
                            id: t.id,
                            attempt: d.attempt,
                            nack: false,
                        };
                        let _ = acks.send(pb::ConsumeRequest {
                            subscribe: None,
                            acks: vec![ack],
                        });
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Acks one delivery, through any node, retrying unknown outcomes for a while. An answer that
/// says the ack applied goes into the history (the checker holds it to the timer's one
/// finished_at); one that says it was queued is judged by redelivery instead.
async fn ack(
    clients: Vec<(u64, TimersClient<Conn>)>,
    id: String,
    attempt: u32,
    wait_for_commit: bool,
    history: Shared,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut turn = attempt as usize;
    loop {
        let (_, mut client) = clients[turn % clients.len()].clone();
        turn += 1;
        let req = pb::AckRequest {
            namespace: NAMESPACE.into(),
            id: id.clone(),
            attempt,
            wait_for_commit,
        };
        let mut queued = false;
        let o = outcome(client.ack(request(req)).await, |r| {
            let r = r.into_inner();
            queued = !r.committed;
            r.timer.into_iter().collect()
        });
        if queued && matches!(o, Outcome::Ok(_)) {
            return;
        }
        let retry = matches!(o, Outcome::Unknown(..)) && tokio::time::Instant::now() < deadline;
        if !retry {
            history.lock().unwrap().acks.push((id, attempt, o));
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
