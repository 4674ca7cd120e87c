//! The `recur` workload: what N active recurring timers cost. Creates N series (one Schedule
//! each, 64 in flight), each every `period`, anchored so their occurrences are spread evenly
//! over the period (N / period occurrences due per second); then reports the disk and
//! resident memory each node holds for them (over a fresh cluster's, at rest), and, over one
//! whole period with consumers acking, how many occurrences fired and were acked per second
//! and how late (receive time − fire time). Every occurrence due in that period must arrive.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use timerdb::api::pb;
use timerdb_client::retry::{retrying, Retry};

use crate::pending::{caught_up, footprint, MIB, REST};
use crate::report::Recorder;
use crate::target::{ms_at, now_ms, Target};
use crate::Opts;

/// Schedule calls in flight while creating the series.
const CREATE_IN_FLIGHT: u64 = 64;

pub async fn recur(
    target: &mut Target,
    opts: &Opts,
    count: u64,
    period: Duration,
    rec: &mut Recorder<'_>,
) -> anyhow::Result<()> {
    target.procs("recur")?;
    let (disk0, rss0) = footprint(target, "recur")?;
    let scene = target.scene("recur", None).await?;
    let consumers = scene.consumers(target, opts).await?;
    let ns = scene.ns;
    let period_ms = period.as_millis() as i64;
    // The first occurrences 30 s after the creation starts (100,000 take ~8 s here): few or
    // none are due while creating; the measured period starts at the first of them anyway.
    let base = now_ms() + 30_000;
    let secs = create(target, &ns, count, base, period_ms, opts.payload_bytes).await?;
    rec.put("create rate", "series/s", count as f64 / secs);
    caught_up(target, None, Duration::from_secs(120)).await?;
    tokio::time::sleep(REST).await;
    let (disk, rss) = footprint(target, "recur")?;
    rec.put("disk per node (max)", "MiB", disk / MIB);
    rec.put(
        "disk per series",
        "bytes",
        (disk - disk0).max(0.0) / count as f64,
    );
    rec.put("RSS (max)", "MiB", rss / MIB);
    rec.put(
        "RSS per series",
        "bytes",
        (rss - rss0).max(0.0) / count as f64,
    );

    // One whole period of occurrences, from the first full second after the creation (and not
    // before the first occurrence: every series fires once in it).
    let from_ms = ((now_ms() / 1000 + 1) * 1000).max(base);
    let to_ms = from_ms + period_ms;
    let bar = crate::progress::counted("recur: one period of occurrences", period.as_secs());
    while now_ms() < to_ms + 3_000 {
        if now_ms() < from_ms {
            tokio::time::sleep(Duration::from_millis((from_ms - now_ms()) as u64)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        bar.set_position(((now_ms() - from_ms).max(0) / 1000) as u64);
    }
    bar.finish_and_clear();
    let log = consumers.stop().await;
    let log = log.lock().expect("log lock");
    let in_window = |fire_at: i64| (from_ms..to_ms).contains(&fire_at);
    let due = (0..count)
        .filter(|i| in_window(first_in(base, period_ms, count, *i, from_ms)))
        .count() as u64;
    let (lateness, early) = log.lateness(|s| in_window(s.fire_at_ms));
    let seen = lateness.len();
    rec.put("occurrences due in the period", "timers", due as f64);
    rec.put(
        "fired+delivered rate",
        "timers/s",
        seen as f64 / period.as_secs_f64(),
    );
    rec.put("lateness p50", "ms", ms_at(&lateness, 0.5));
    rec.put("lateness p99", "ms", ms_at(&lateness, 0.99));
    rec.put("lateness max", "ms", lateness.max() as f64 / 1000.0);
    rec.put("early", "timers", early as f64);
    rec.put(
        "due but not received",
        "timers",
        due.saturating_sub(seen) as f64,
    );
    anyhow::ensure!(
        early == 0,
        "{early} occurrences arrived before their fire time"
    );
    anyhow::ensure!(
        seen >= due,
        "{} of {due} occurrences due in the period never arrived",
        due - seen
    );
    Ok(())
}

/// The anchor of series `i`: spread evenly over one period from `base`.
fn anchor(base: i64, period_ms: i64, count: u64, i: u64) -> i64 {
    base + (i as i64 * period_ms) / count as i64
}

/// The first occurrence of series `i` at or after `from_ms`.
fn first_in(base: i64, period_ms: i64, count: u64, i: u64, from_ms: i64) -> i64 {
    let a = anchor(base, period_ms, count, i);
    if from_ms <= a {
        return a;
    }
    a + (from_ms - a + period_ms - 1) / period_ms * period_ms
}

/// Creates the series; returns the seconds it took.
async fn create(
    target: &Target,
    ns: &str,
    count: u64,
    base: i64,
    period_ms: i64,
    payload: usize,
) -> anyhow::Result<f64> {
    let leader = target.wait_leader(Duration::from_secs(10)).await?;
    let conns = target.timers(leader, 4)?;
    let next = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let bar = crate::progress::counted("recur: create series", count);
    let mut tasks = Vec::new();
    for c in 0..CREATE_IN_FLIGHT {
        let client = conns[c as usize % conns.len()].clone();
        let (next, done, ns) = (next.clone(), done.clone(), ns.to_string());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return Ok::<_, tonic::Status>(());
                }
                let req = pb::ScheduleRequest {
                    namespace: ns.clone(),
                    id: format!("s{i}"),
                    payload: vec![b'x'; payload],
                    recurrence: Some(pb::Recurrence {
                        every_ms: period_ms,
                        anchor_ms: anchor(base, period_ms, count, i),
                        ..Default::default()
                    }),
                    ..Default::default()
                };
                retrying(&Retry::default(), || {
                    let mut c = client.clone();
                    let req = req.clone();
                    async move { c.schedule(req).await }
                })
                .await
                .0?;
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let mut finished = futures::future::try_join_all(tasks);
    loop {
        tokio::select! {
            r = &mut finished => {
                for r in r? {
                    r.map_err(|s| anyhow::anyhow!("creating series failed: {s}"))?;
                }
                break;
            }
            _ = tokio::time::sleep(Duration::from_millis(200)) => {
                bar.set_position(done.load(Ordering::Relaxed));
            }
        }
    }
    bar.finish_and_clear();
    Ok(started.elapsed().as_secs_f64())
}
