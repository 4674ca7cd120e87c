//! Push under chaos: a second namespace delivered by push to an HTTP receiver that lives in the
//! harness, beside the Subscribe consumers of the first.
//!
//! The receiver misbehaves on purpose: it answers 500 to some requests, is slower than the
//! namespace's request timeout on others, and for a few seconds at a time drops every
//! connection (down). A worker schedules timers into the namespace through random nodes. After
//! quiescence the checker holds the namespace to push's promises: every acknowledged schedule
//! fires and reaches the receiver at least once (never before its fire time, correctly signed,
//! with one `webhook-id` and one fire_index per timer), and every timer is ACKED once, by a 2xx
//! the receiver really answered (its attempt log holds at most one successful attempt).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use timerdb::api::pb::{self, timers_client::TimersClient};
use timerdb::namespace::sign::Secret;
use timerdb_harness::secure::Conn;
use tokio::sync::watch;

use timerdb_harness::checker::{Findings, SkewWindow};
use timerdb_harness::workload::now_ms;

pub const PUSH_NAMESPACE: &str = "chaos-push";
const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

/// One request the receiver got.
#[derive(Debug, Clone)]
pub struct Receipt {
    pub id: String,
    pub webhook_id: String,
    pub fire_index: u64,
    pub received_ms: i64,
    pub signed: bool,
    /// It answered 2xx.
    pub ok: bool,
}

/// What the push side observed.
#[derive(Debug, Default)]
pub struct PushHistory {
    pub receipts: Vec<Receipt>,
    /// Schedules answered OK: (id, fire_at_ms).
    pub scheduled: Vec<(String, i64)>,
}

pub type SharedPush = Arc<Mutex<PushHistory>>;

/// The harness's misbehaving receiver; returns its URL.
pub async fn receiver(history: SharedPush, seed: u64) -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/push", listener.local_addr()?);
    let secret = Secret::parse(SECRET)?;
    let rng = Arc::new(Mutex::new(StdRng::seed_from_u64(seed ^ 0x5eed_9005)));
    let started = now_ms();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            // Down for 3 s of every 20: connections are dropped unanswered.
            if (now_ms() - started) % 20_000 >= 17_000 {
                drop(stream);
                continue;
            }
            let (history, secret, rng) = (history.clone(), secret.clone(), rng.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    answer(req, history.clone(), secret.clone(), rng.clone())
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, svc)
                    .await;
            });
        }
    });
    Ok(url)
}

async fn answer(
    req: hyper::Request<hyper::body::Incoming>,
    history: SharedPush,
    secret: Secret,
    rng: Arc<Mutex<StdRng>>,
) -> Result<hyper::Response<Full<Bytes>>, hyper::Error> {
    let received_ms = now_ms();
    let h = |n: &str| {
        req.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let (webhook_id, ts, sig) = (
        h("webhook-id"),
        h("webhook-timestamp"),
        h("webhook-signature"),
    );
    let (id, fire_index) = (h("timerdb-id"), h("timerdb-fire-index"));
    let body = req.into_body().collect().await?.to_bytes();
    let signed = ts
        .parse()
        .is_ok_and(|ts| secret.verify(&sig, &webhook_id, ts, &body));
    let roll = rng.lock().unwrap().random_range(0..100);
    let status = match roll {
        0..10 => 500,
        10..15 => {
            // Slower than the namespace's 1 s request timeout: a failed attempt.
            tokio::time::sleep(Duration::from_millis(1_500)).await;
            200
        }
        _ => 200,
    };
    history.lock().unwrap().receipts.push(Receipt {
        id,
        webhook_id,
        fire_index: fire_index.parse().unwrap_or(0),
        received_ms,
        signed,
        ok: status == 200,
    });
    Ok(hyper::Response::builder()
        .status(status)
        .body(Full::new(Bytes::new()))
        .expect("a valid response"))
}

/// The push namespace's policy: push to `url` with a 1 s timeout, quick redelivery, no DEAD.
pub fn policy(url: &str) -> pb::NamespacePolicy {
    pb::NamespacePolicy {
        ack_timeout_ms: 3_000,
        max_attempts: 1_000,
        backoff_min_ms: 200,
        backoff_max_ms: 2_000,
        retention_ms: 24 * 3600 * 1000,
        push: Some(pb::PushTarget {
            url: url.into(),
            secrets: vec![SECRET.into()],
            timeout_ms: 1_000,
            dead_on_client_error: false,
        }),
        ..Default::default()
    }
}

/// Schedules batches of timers into the push namespace through random nodes until `stop`.
pub async fn worker(
    clients: Vec<(u64, TimersClient<Conn>)>,
    history: SharedPush,
    seed: u64,
    mut stop: watch::Receiver<bool>,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x9005_7e57);
    let mut n = 0u64;
    while !*stop.borrow() {
        let (_, mut client) = clients[rng.random_range(0..clients.len())].clone();
        let base = now_ms();
        let timers: Vec<pb::ScheduleRequest> = (0..10)
            .map(|_| {
                n += 1;
                let id = format!("p{n}");
                pb::ScheduleRequest {
                    namespace: PUSH_NAMESPACE.into(),
                    payload: id.as_bytes().to_vec(),
                    id,
                    when: Some(pb::schedule_request::When::FireAtMs(
                        base + rng.random_range(0..3_000),
                    )),
                    ..Default::default()
                }
            })
            .collect();
        let asked: Vec<(String, i64)> = timers
            .iter()
            .map(|t| match t.when {
                Some(pb::schedule_request::When::FireAtMs(at)) => (t.id.clone(), at),
                _ => (t.id.clone(), 0),
            })
            .collect();
        let mut req = tonic::Request::new(pb::ScheduleBatchRequest { timers });
        req.set_timeout(Duration::from_secs(8));
        if client.schedule_batch(req).await.is_ok() {
            history.lock().unwrap().scheduled.extend(asked);
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(rng.random_range(100..300))) => {}
            _ = stop.changed() => {}
        }
    }
}

/// Checks the push namespace's final state (`timers`, by id) against what was scheduled and
/// received.
pub fn check(
    f: &mut Findings,
    h: &PushHistory,
    timers: &BTreeMap<String, pb::Timer>,
    skews: &[SkewWindow],
) {
    f.timers_checked += timers.len();
    f.push_timers += timers.len();
    f.push_requests += h.receipts.len();
    f.push_failed += h.receipts.iter().filter(|r| !r.ok).count();
    for (id, _) in &h.scheduled {
        if !timers.contains_key(id) {
            f.violate("push: lost acknowledged schedule", id.clone());
        }
    }
    let mut got: HashMap<&str, Vec<&Receipt>> = HashMap::new();
    for r in &h.receipts {
        got.entry(r.id.as_str()).or_default().push(r);
        if !r.signed {
            f.violate("push: bad signature", format!("{r:?}"));
        }
    }
    for (id, t) in timers {
        let receipts = got.get(id.as_str()).map(Vec::as_slice).unwrap_or_default();
        if t.state != pb::TimerState::Acked as i32 {
            f.violate("push: not acked", format!("{t:?}"));
        }
        if receipts.is_empty() {
            f.violate("push: never received", format!("{t:?}"));
            continue;
        }
        if !receipts.iter().any(|r| r.ok) && t.state == pb::TimerState::Acked as i32 {
            f.violate("push: acked without a 2xx", format!("{t:?}"));
        }
        let oks = t
            .attempt_log
            .iter()
            .filter(|a| {
                a.outcome == "acked" || (a.outcome == "http" && (200..300).contains(&a.http_status))
            })
            .count();
        if oks > 1 {
            f.violate("push: acked more than once", format!("{t:?}"));
        }
        for r in receipts {
            if r.webhook_id != receipts[0].webhook_id {
                f.violate("push: webhook-id changed", format!("{id}: {receipts:?}"));
            }
            if r.fire_index != t.fire_index {
                f.violate(
                    "push: two fire transitions",
                    format!(
                        "{id} received with fire_index {}, fired at {}",
                        r.fire_index, t.fire_index
                    ),
                );
            }
            if r.received_ms < t.fire_at_ms {
                let skewed = skews.iter().any(|w| {
                    r.received_ms >= w.from_ms - 1_000 && r.received_ms <= w.to_ms + 5_000
                });
                if skewed {
                    f.early_by_skew += 1;
                } else {
                    f.violate(
                        "push: received early",
                        format!(
                            "{id} at {}, {} ms early",
                            r.received_ms,
                            t.fire_at_ms - r.received_ms
                        ),
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timer(id: &str, state: pb::TimerState, oks: usize) -> pb::Timer {
        pb::Timer {
            namespace: PUSH_NAMESPACE.into(),
            id: id.into(),
            fire_at_ms: 1_000,
            fire_index: 7,
            state: state as i32,
            attempt_log: (0..oks)
                .map(|_| pb::Attempt {
                    outcome: "http".into(),
                    http_status: 200,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn receipt(id: &str, at: i64) -> Receipt {
        Receipt {
            id: id.into(),
            webhook_id: format!("w-{id}"),
            fire_index: 7,
            received_ms: at,
            signed: true,
            ok: true,
        }
    }

    fn kinds(h: &PushHistory, timers: &[pb::Timer]) -> Vec<&'static str> {
        let timers = timers.iter().map(|t| (t.id.clone(), t.clone())).collect();
        let mut f = Findings::default();
        check(&mut f, h, &timers, &[]);
        let mut k: Vec<&'static str> = f.violations.iter().map(|v| v.kind).collect();
        k.sort();
        k.dedup();
        k
    }

    #[test]
    fn a_clean_history_passes() {
        let h = PushHistory {
            receipts: vec![receipt("a", 1_000), receipt("a", 2_000)],
            scheduled: vec![("a".into(), 1_000)],
        };
        assert!(kinds(&h, &[timer("a", pb::TimerState::Acked, 1)]).is_empty());
    }

    /// Each rule catches the bug it is for (the checker's proof).
    #[test]
    fn each_rule_catches_its_bug() {
        let acked = |id| timer(id, pb::TimerState::Acked, 1);
        let cases: Vec<(PushHistory, Vec<pb::Timer>, &str)> = vec![
            (
                PushHistory {
                    scheduled: vec![("gone".into(), 1_000)],
                    ..Default::default()
                },
                vec![],
                "push: lost acknowledged schedule",
            ),
            (
                PushHistory::default(),
                vec![acked("a")],
                "push: never received",
            ),
            (
                PushHistory {
                    receipts: vec![receipt("a", 999)],
                    ..Default::default()
                },
                vec![acked("a")],
                "push: received early",
            ),
            (
                PushHistory {
                    receipts: vec![Receipt {
                        signed: false,
                        ..receipt("a", 1_000)
                    }],
                    ..Default::default()
                },
                vec![acked("a")],
                "push: bad signature",
            ),
            (
                PushHistory {
                    receipts: vec![
                        receipt("a", 1_000),
                        Receipt {
                            webhook_id: "other".into(),
                            ..receipt("a", 1_100)
                        },
                    ],
                    ..Default::default()
                },
                vec![acked("a")],
                "push: webhook-id changed",
            ),
            (
                PushHistory {
                    receipts: vec![receipt("a", 1_000)],
                    ..Default::default()
                },
                vec![timer("a", pb::TimerState::Acked, 2)],
                "push: acked more than once",
            ),
            (
                PushHistory {
                    receipts: vec![receipt("a", 1_000)],
                    ..Default::default()
                },
                vec![timer("a", pb::TimerState::Fired, 0)],
                "push: not acked",
            ),
            (
                PushHistory {
                    receipts: vec![Receipt {
                        ok: false,
                        ..receipt("a", 1_000)
                    }],
                    ..Default::default()
                },
                vec![acked("a")],
                "push: acked without a 2xx",
            ),
            (
                PushHistory {
                    receipts: vec![Receipt {
                        fire_index: 8,
                        ..receipt("a", 1_000)
                    }],
                    ..Default::default()
                },
                vec![acked("a")],
                "push: two fire transitions",
            ),
        ];
        for (h, timers, want) in cases {
            assert!(kinds(&h, &timers).contains(&want), "{want} not caught");
        }
    }
}
