//! The fire workloads, each measured from the consumer's side (Subscribe + Ack):
//! - `fire`: a producer schedules timers due `lead` ahead at a steady rate; consumers on the
//!   leader receive and ack them. Lateness = receive time − fire_at.
//! - `burst`: N timers all due in the same millisecond: time until every one is delivered and
//!   acked.
//! - `failover`: timers due at a steady rate, preloaded; consumers on the followers; the leader
//!   is SIGKILLed mid-stream. The gap is kill → first receipt of a timer due after the kill; the
//!   timers due inside the gap show how late a failover makes them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use timerdb::api::pb;
use timerdb_client::retry::{retrying, Retry};
use tokio::sync::Semaphore;

use crate::consume::{wait_acked, Log};
use crate::report::Recorder;
use crate::scene::Scene;
use crate::target::{ms_at, now_ms, now_us, schedule_req, Target};
use crate::write::load;
use crate::Opts;

/// Timers per ScheduleBatch the fire producer sends.
const PRODUCER_BATCH: u64 = 1000;

pub async fn fire(
    target: &Target,
    opts: &Opts,
    rate: u64,
    rec: &mut Recorder<'_>,
) -> anyhow::Result<()> {
    let scene = target.scene("fire", None).await?;
    let consumers = scene.consumers(target, opts).await?;
    let Scene { leader, ns } = scene;
    let (count, late_sends) = produce(target, opts, &ns, leader, rate).await?;
    let bar = crate::progress::counted(&format!("fire {rate}/s: acks"), count);
    let all = wait_acked(&consumers, count, drain_time(count), &bar).await;
    let all = all && consumers.confirm(target, count, drain_time(count)).await;
    bar.finish_and_clear();
    let log = consumers.stop().await;
    let log = log.lock().expect("log lock");
    let (lateness, early) = log.lateness(|_| true);
    let first_due_us = log.seen.values().map(|s| s.fire_at_ms).min().unwrap_or(0) * 1000;
    let span = (log.last_ack_us() - first_due_us) as f64 / 1e6;
    rec.put("delivered+acked rate", "timers/s", log.acked as f64 / span);
    put_lateness(rec, &lateness);
    rec.put("early", "timers", early as f64);
    rec.put("not acked", "timers", (count - log.acked) as f64);
    rec.put("sent after due", "timers", late_sends as f64);
    check_log(&log, all, count)
}

/// Schedules timers for `opts.window` so that `rate` per second fall due, each `opts.lead`
/// after it is sent. Returns how many, and how many were sent after their fire time (the
/// producer fell behind; their lateness is the producer's, and is reported apart).
pub(crate) async fn produce(
    target: &Target,
    opts: &Opts,
    ns: &str,
    leader: u64,
    rate: u64,
) -> anyhow::Result<(u64, u64)> {
    let conns = target.timers(leader, 4)?;
    let total = rate * opts.window.as_secs();
    let start_ms = now_ms() + opts.lead.as_millis() as i64;
    let permits = Arc::new(Semaphore::new(16));
    let late = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let bar = crate::progress::counted(&format!("fire {rate}/s: schedule"), total);
    let mut sent = 0u64;
    let mut tasks = Vec::new();
    while sent < total {
        let due_by_now = (started.elapsed().as_secs_f64() * rate as f64) as u64;
        let upto = due_by_now.clamp(sent, total).min(sent + PRODUCER_BATCH);
        if upto == sent {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        }
        let permit = permits.clone().acquire_owned().await?;
        let due = |i: u64| start_ms + (i * 1000 / rate) as i64;
        let timers: Vec<pb::ScheduleRequest> = (sent..upto)
            .map(|i| schedule_req(ns, format!("f{i}"), due(i), opts.payload_bytes))
            .collect();
        let first_due = due(sent);
        let client = conns[(sent / PRODUCER_BATCH) as usize % conns.len()].clone();
        let late = late.clone();
        tasks.push(tokio::spawn(async move {
            let n = timers.len() as u64;
            // A stalled leader answers UNAVAILABLE for a moment (a slow fsync on the shared
            // disk); the batch is idempotent, so send it again, as the loaders do.
            let (r, _) = retrying(&Retry::default(), || {
                let mut c = client.clone();
                let req = pb::ScheduleBatchRequest {
                    timers: timers.clone(),
                };
                async move { c.schedule_batch(req).await }
            })
            .await;
            if now_ms() > first_due {
                late.fetch_add(n, Ordering::Relaxed);
            }
            drop(permit);
            r.map(|_| ())
        }));
        sent = upto;
        bar.set_position(sent);
    }
    for t in tasks {
        t.await?
            .map_err(|s| anyhow::anyhow!("the producer's schedule failed: {s}"))?;
    }
    bar.finish_and_clear();
    Ok((total, late.load(Ordering::Relaxed)))
}

pub async fn burst(
    target: &Target,
    opts: &Opts,
    count: u64,
    rec: &mut Recorder<'_>,
) -> anyhow::Result<()> {
    let scene = target.scene("burst", None).await?;
    let consumers = scene.consumers(target, opts).await?;
    let ns = scene.ns;
    // Loading must end before the burst is due; allow for a slow loader.
    let lead_ms = 5_000 + (count / 50) as i64;
    let due_ms = now_ms() + lead_ms;
    let load_secs = load(
        target,
        opts,
        &ns,
        count,
        Arc::new(move |_| due_ms),
        "burst: schedule",
    )
    .await?;
    rec.put("load rate", "timers/s", count as f64 / load_secs);
    if now_ms() > due_ms {
        eprintln!("    note: loading ended after the burst was due; it overlaps the firing");
    }
    let bar = crate::progress::counted("burst: acks", count);
    let all = wait_acked(&consumers, count, drain_time(count), &bar).await;
    let all = all && consumers.confirm(target, count, drain_time(count)).await;
    bar.finish_and_clear();
    let log = consumers.stop().await;
    if !all {
        show_missing(target, &ns, &log, count).await;
    }
    let log = log.lock().expect("log lock");
    let due_us = due_ms * 1000;
    let delivered_s = (log.last_recv_us() - due_us) as f64 / 1e6;
    let acked_s = (log.last_ack_us() - due_us) as f64 / 1e6;
    rec.put("all delivered after", "s", delivered_s);
    rec.put("all acked after", "s", acked_s);
    rec.put(
        "fire+deliver+ack rate",
        "timers/s",
        log.acked as f64 / acked_s,
    );
    let (lateness, early) = log.lateness(|_| true);
    rec.put("lateness p50", "ms", ms_at(&lateness, 50.0));
    rec.put("early", "timers", early as f64);
    check_log(&log, all, count)
}

pub async fn failover(
    target: &mut Target,
    opts: &Opts,
    rate: u64,
    rec: &mut Recorder<'_>,
) -> anyhow::Result<()> {
    target.procs("failover")?;
    // Deliveries the killed leader committed but never sent come again after the ack timeout;
    // a short one keeps the wait for them short (the gap is measured on first receipts).
    let policy = pb::NamespacePolicy {
        ack_timeout_ms: 3_000,
        ..Default::default()
    };
    let scene = target.scene("failover", Some(policy)).await?;
    let consumers = (scene.consumers_on(target, opts, &target.followers(scene.leader))).await?;
    let Scene { leader, ns } = scene;
    let window_ms = opts.window.as_millis() as i64;
    let count = rate * opts.window.as_secs();
    let start_ms = now_ms() + 3_000 + (count / 20) as i64;
    let due = move |i: u64| start_ms + (i * 1000 / rate) as i64;
    load(target, opts, &ns, count, Arc::new(due), "failover: preload").await?;
    // Kill the leader halfway through the window.
    let kill_at = start_ms + window_ms / 2;
    tokio::time::sleep(Duration::from_millis((kill_at - now_ms()).max(0) as u64)).await;
    let kill_us = now_us();
    target.procs("failover")?.kill(leader);
    let bar = crate::progress::counted("failover: acks", count);
    let all = wait_acked(&consumers, count, drain_time(count), &bar).await;
    let all = all && consumers.confirm(target, count, drain_time(count)).await;
    bar.finish_and_clear();
    let log = consumers.stop().await;
    target.procs("failover")?.restart(leader, 0)?;
    let checked = {
        let log = log.lock().expect("log lock");
        let resumed_us = log
            .seen
            .values()
            .filter(|s| s.fire_at_ms * 1000 >= kill_us)
            .map(|s| s.first_recv_us)
            .min()
            .unwrap_or(i64::MAX);
        rec.put(
            "gap until fires resume",
            "ms",
            (resumed_us - kill_us) as f64 / 1000.0,
        );
        let in_gap =
            |s: &crate::consume::Seen| (kill_us..=resumed_us).contains(&(s.fire_at_ms * 1000));
        let (gap, _) = log.lateness(in_gap);
        rec.put("due in gap", "timers", gap.len() as f64);
        rec.put("due-in-gap lateness p50", "ms", ms_at(&gap, 50.0));
        rec.put("due-in-gap lateness p99", "ms", ms_at(&gap, 99.0));
        rec.put("due-in-gap lateness max", "ms", gap.max() as f64 / 1000.0);
        let (all_late, all_early) = log.lateness(|_| true);
        rec.put("all lateness p99", "ms", ms_at(&all_late, 99.0));
        rec.put("early", "timers", all_early as f64);
        check_log(&log, all, count)
    };
    target.wait_leader(Duration::from_secs(30)).await?;
    checked
}

/// Prints the state of a few loaded timers (ids `t0`…) the consumers never received, so that a
/// straggler can be told from a lost one.
async fn show_missing(target: &Target, ns: &str, log: &crate::consume::Shared, count: u64) {
    let missing: Vec<String> = {
        let log = log.lock().expect("log lock");
        (0..count)
            .map(|i| format!("t{i}"))
            .filter(|id| !log.seen.contains_key(id))
            .take(5)
            .collect()
    };
    let Some(leader) = target.leader().await else {
        return;
    };
    let Ok(mut client) = target.timers(leader, 1).map(|mut c| c.remove(0)) else {
        return;
    };
    for id in missing {
        let req = pb::GetRequest {
            namespace: ns.into(),
            id: id.clone(),
            ..Default::default()
        };
        match client.get(req).await {
            Ok(r) => eprintln!("    not received: {:?}", r.into_inner().timer),
            Err(s) => eprintln!("    not received: {id}: {s}"),
        }
    }
}

fn put_lateness(rec: &mut Recorder<'_>, h: &hdrhistogram::Histogram<u64>) {
    rec.put("lateness p50", "ms", ms_at(h, 50.0));
    rec.put("lateness p99", "ms", ms_at(h, 99.0));
    rec.put("lateness p999", "ms", ms_at(h, 99.9));
    rec.put("lateness max", "ms", h.max() as f64 / 1000.0);
}

/// Fails the measurement when an ack failed: a benchmark of a system that refused work is not
/// a result. Timers not acked in time are reported (the "not acked" figure) and warned about:
/// the system was slower than the load, which is itself the finding.
fn check_log(log: &Log, all: bool, count: u64) -> anyhow::Result<()> {
    if let Some(e) = &log.first_ack_error {
        anyhow::bail!("{} acks failed, the first: {e}", log.ack_errors);
    }
    if !all {
        eprintln!(
            "    warning: only {} of {count} timers were acked in time ({} delivered)",
            log.acked,
            log.seen.len()
        );
    }
    Ok(())
}

/// How long to wait for `count` timers to be acked once the last is due: generous (a slow
/// system is measured, not cut off), yet bounded.
fn drain_time(count: u64) -> Duration {
    Duration::from_secs(30 + count / 10_000)
}
