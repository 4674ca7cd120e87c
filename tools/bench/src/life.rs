//! Two workloads about a timer's whole life rather than one step of it:
//! - `keys`: what a timer costs in storage writes from Schedule to purge. N timers are loaded
//!   in a namespace with a 1 s retention, fire together, are delivered and acked, and are
//!   purged; the figure is the keys the three state machines wrote (`Cluster.Status`'s
//!   `state_machine_keys_written`) divided by N and by the number of nodes.
//! - `naive`: consumers written the simplest way (`--naive-consumers`, 2 by default, sharing
//!   the namespace): each one stream, and each delivery handled and acked before the next is
//!   read. `unary` acks with a unary Ack call and waits for it;
//!   `stream` acks on the delivery stream itself (`Consume`), without waiting. Timers fall due
//!   at a steady rate; the figures are the rate the consumer kept and how late it first saw
//!   each timer.

use std::sync::Arc;
use std::time::Duration;

use timerdb::api::pb;

use crate::report::Recorder;
use crate::scene::Scene;
use crate::target::{histogram, ms_at, now_ms, now_us, Target};
use crate::write::load;
use crate::Opts;

/// The retention the `keys` workload gives its namespace: the shortest a policy allows.
const RETENTION_MS: u64 = 1_000;
/// Its ack timeout: short, so that a model that settles deliveries at their deadline purges
/// soon after the acks (the consumers ack at once, far inside it).
const ACK_TIMEOUT_MS: u64 = 3_000;

/// Sum of every node's state-machine key count (nodes that do not answer count 0, which the
/// caller sees as a failure: it needs all three).
async fn keys_written(target: &Target) -> anyhow::Result<u64> {
    let mut sum = 0;
    for id in target.addrs.keys() {
        let s = target
            .status(*id)
            .await
            .ok_or_else(|| anyhow::anyhow!("node {id} does not answer Status"))?;
        sum += s.state_machine_keys_written;
    }
    Ok(sum)
}

pub async fn keys(
    target: &Target,
    opts: &Opts,
    count: u64,
    rec: &mut Recorder<'_>,
) -> anyhow::Result<()> {
    let policy = pb::NamespacePolicy {
        retention_ms: RETENTION_MS,
        ack_timeout_ms: ACK_TIMEOUT_MS,
        ..Default::default()
    };
    let scene = target.scene("keys", Some(policy)).await?;
    let consumers = scene.consumers(target, opts).await?;
    let Scene { leader, ns } = scene;
    let before = keys_written(target).await?;
    let due_ms = now_ms() + 3_000 + (count / 50) as i64;
    load(
        target,
        opts,
        &ns,
        count,
        Arc::new(move |_| due_ms),
        "keys: schedule",
    )
    .await?;
    let bar = crate::progress::counted("keys: acks", count);
    let all = crate::consume::wait_acked(
        &consumers,
        count,
        Duration::from_secs(60 + count / 5_000),
        &bar,
    )
    .await;
    let all = all
        && consumers
            .confirm(target, count, Duration::from_secs(60))
            .await;
    bar.finish_and_clear();
    let log = consumers.stop().await;
    anyhow::ensure!(
        all,
        "only {} of {count} timers were acked",
        log.lock().unwrap().acked
    );
    let acked_keys = keys_written(target).await? - before;
    // Purged: the namespace lists nothing any more.
    let purged = wait_none(target, leader, &ns, None, Duration::from_secs(120)).await?;
    anyhow::ensure!(purged, "the timers were not purged within 120 s");
    // Followers apply the purge a moment after the leader.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let life_keys = keys_written(target).await? - before;
    let per = |keys: u64| keys as f64 / count as f64 / target.addrs.len() as f64;
    rec.put(
        "key writes per timer per node, to ack",
        "keys",
        per(acked_keys),
    );
    rec.put(
        "key writes per timer per node, whole life",
        "keys",
        per(life_keys),
    );
    Ok(())
}

/// Waits until `ns` lists no timer in `state` (`None`: in any state, i.e. all purged); false
/// if `within` passes first.
async fn wait_none(
    target: &Target,
    leader: u64,
    ns: &str,
    state: Option<pb::TimerState>,
    within: Duration,
) -> anyhow::Result<bool> {
    let mut client = target.timers(leader, 1)?.remove(0);
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        let req = pb::ListRequest {
            namespace: ns.into(),
            state: state.map_or(0, |s| s as i32),
            limit: 1,
            ..Default::default()
        };
        if let Ok(page) = client.list(req).await {
            let page = page.into_inner();
            if page.timers.is_empty() && page.next_page_token.is_empty() {
                return Ok(true);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(false)
}

/// How the naive consumer acks.
#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AckMode {
    /// A unary Ack call per delivery, awaited before the next delivery is read.
    Unary,
    /// An ack sent on the Consume stream, not awaited.
    Stream,
}

pub async fn naive(
    target: &Target,
    opts: &Opts,
    rate: u64,
    mode: AckMode,
    rec: &mut Recorder<'_>,
) -> anyhow::Result<()> {
    let Scene { leader, ns } = target.scene("naive", None).await?;
    let total = rate * opts.window.as_secs();
    let seen = Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
    // The consumers share the namespace's deliveries; each stops once `total` distinct
    // timers were seen by any of them.
    let consumers: Vec<_> = target
        .timers(leader, opts.naive_consumers.max(1))?
        .into_iter()
        .map(|client| tokio::spawn(consume(client, ns.clone(), total, mode, seen.clone())))
        .collect();
    let mut consumer = tokio::spawn(async move {
        for c in consumers {
            c.await??;
        }
        anyhow::Ok(())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (count, late_sends) = crate::fire::produce(target, opts, &ns, leader, rate).await?;
    // A consumer slower than the rate does not finish: it is measured as far as it got.
    let within = Duration::from_secs(opts.window.as_secs() * 4 + 30);
    let finished = match tokio::time::timeout(within, &mut consumer).await {
        Ok(done) => {
            done??;
            true
        }
        Err(_) => {
            consumer.abort();
            eprintln!("    note: the naive consumer had not finished after {within:?}");
            false
        }
    };
    let seen: Vec<Seen> = std::mem::take(&mut *seen.lock().unwrap())
        .into_values()
        .collect();
    if finished {
        // Stream acks are sent, not answered, and unary ones answered once queued: wait
        // until the cluster has applied them all.
        let acked = wait_none(
            target,
            leader,
            &ns,
            Some(pb::TimerState::Fired),
            Duration::from_secs(60),
        )
        .await?;
        anyhow::ensure!(acked, "not every ack was applied within 60 s");
    }
    let mut late = histogram();
    let mut early = 0;
    let (mut first_due, mut last_ack) = (i64::MAX, 0);
    for s in &seen {
        let l = s.recv_us - s.fire_at_ms * 1000;
        early += u64::from(l < 0);
        let _ = late.record(l.max(1) as u64);
        first_due = first_due.min(s.fire_at_ms * 1000);
        last_ack = last_ack.max(s.acked_us);
    }
    let span = (last_ack - first_due) as f64 / 1e6;
    rec.put("received+acked rate", "timers/s", seen.len() as f64 / span);
    rec.put("first receipt p50", "ms", ms_at(&late, 50.0));
    rec.put("first receipt p99", "ms", ms_at(&late, 99.0));
    rec.put("first receipt max", "ms", late.max() as f64 / 1000.0);
    rec.put("early", "timers", early as f64);
    rec.put("not received", "timers", (count - seen.len() as u64) as f64);
    rec.put("sent after due", "timers", late_sends as f64);
    Ok(())
}

struct Seen {
    fire_at_ms: i64,
    recv_us: i64,
    acked_us: i64,
}

/// The naive consumer: reads one delivery, acks it, reads the next, until `total` distinct
/// timers were seen. A broken stream is opened again.
async fn consume(
    mut client: pb::timers_client::TimersClient<tonic::transport::Channel>,
    ns: String,
    total: u64,
    mode: AckMode,
    seen: Arc<std::sync::Mutex<std::collections::HashMap<String, Seen>>>,
) -> anyhow::Result<()> {
    let count = || seen.lock().unwrap().len() as u64;
    while count() < total {
        let sub = pb::SubscribeRequest {
            namespace: ns.clone(),
            consumer: "naive".into(),
            max_in_flight: 0,
        };
        match mode {
            AckMode::Unary => {
                let mut stream = client.subscribe(sub).await?.into_inner();
                while let Ok(Some(d)) = stream.message().await {
                    let t = d.timer.unwrap_or_default();
                    let recv_us = now_us();
                    let ack = pb::AckRequest {
                        namespace: ns.clone(),
                        id: t.id.clone(),
                        attempt: d.attempt,
                        // As a new user writes it: the default, answered once queued.
                        ..Default::default()
                    };
                    client.ack(ack).await?;
                    note(&mut seen.lock().unwrap(), t, recv_us);
                    if count() >= total {
                        break;
                    }
                }
            }
            AckMode::Stream => {
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                let _ = tx.send(pb::ConsumeRequest {
                    subscribe: Some(sub),
                    acks: Vec::new(),
                });
                let outbound = tokio_stream::wrappers::UnboundedReceiverStream::new(rx);
                let mut stream = client.consume(outbound).await?.into_inner();
                while let Ok(Some(d)) = stream.message().await {
                    let t = d.timer.unwrap_or_default();
                    let recv_us = now_us();
                    let ack = pb::DeliveryAck {
                        id: t.id.clone(),
                        attempt: d.attempt,
                        nack: false,
                    };
                    let _ = tx.send(pb::ConsumeRequest {
                        subscribe: None,
                        acks: vec![ack],
                    });
                    note(&mut seen.lock().unwrap(), t, recv_us);
                    if count() >= total {
                        break;
                    }
                }
                // Done: end our side and read on until the server has applied every ack and
                // ends the stream (acks on a stream that is just dropped may be lost with it).
                drop(tx);
                while let Ok(Some(_)) = stream.message().await {}
            }
        }
    }
    Ok(())
}

fn note(seen: &mut std::collections::HashMap<String, Seen>, t: pb::Timer, recv_us: i64) {
    let acked_us = now_us();
    seen.entry(t.id).or_insert(Seen {
        fire_at_ms: t.fire_at_ms,
        recv_us,
        acked_us,
    });
}
