//! The write workloads: `schedule` (single-timer Schedule calls, N in flight) and `batch`
//! (ScheduleBatch of B timers). Both run closed loops against the leader for a warm-up and
//! then a measured window; only calls that complete inside the window count. Timers are due an
//! hour ahead, so nothing fires while they run.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use timerdb::api::pb;
use timerdb_client::retry::{retrying, Retry};

use crate::report::Recorder;
use crate::scene::Scene;
use crate::target::{histogram, ms_at, now_ms, now_us, schedule_req, Target};
use crate::Opts;

/// How one closed-loop window went.
pub struct Window {
    pub timers: u64,
    pub errors: u64,
    pub secs: f64,
    pub latency: Histogram<u64>,
    pub first_error: Option<String>,
    /// The node the calls went to (the leader throughout, when `cpu` is measured).
    pub leader: u64,
    /// CPU seconds each node spent in the window, when asked for (`scale`).
    pub cpu: Option<Vec<(u64, f64)>>,
}

/// `schedule`: `in_flight` clients each send one Schedule after another.
pub async fn schedule(
    target: &Target,
    opts: &Opts,
    in_flight: usize,
    rec: &mut Recorder<'_>,
) -> anyhow::Result<()> {
    let w = closed_loop(
        target,
        opts,
        in_flight,
        1,
        &format!("schedule x{in_flight}"),
        None,
    )
    .await?;
    report(w, rec, "schedules/s");
    Ok(())
}

/// `batch`: a few clients each send ScheduleBatch calls of `size` timers.
pub async fn batch(
    target: &Target,
    opts: &Opts,
    size: usize,
    rec: &mut Recorder<'_>,
) -> anyhow::Result<()> {
    let label = format!("batch {size} x{}", opts.batch_in_flight);
    let w = closed_loop(target, opts, opts.batch_in_flight, size, &label, None).await?;
    report(w, rec, "timers/s");
    Ok(())
}

fn report(w: Window, rec: &mut Recorder<'_>, unit: &'static str) {
    rec.put("rate", unit, w.timers as f64 / w.secs);
    rec.put("call latency p50", "ms", ms_at(&w.latency, 50.0));
    rec.put("call latency p99", "ms", ms_at(&w.latency, 99.0));
    rec.put("errors", "calls", w.errors as f64);
    if let Some(e) = w.first_error {
        eprintln!("    first error: {e}");
    }
}

/// Runs `clients` loops of calls carrying `size` timers each (1: Schedule, more: ScheduleBatch).
/// Given the nodes' pids, it also reads the CPU each spent in the measured window, and fails
/// if the leader changed during it (the split between leader and followers would be wrong).
pub async fn closed_loop(
    target: &Target,
    opts: &Opts,
    clients: usize,
    size: usize,
    label: &str,
    cpu_of: Option<&[(u64, u32)]>,
) -> anyhow::Result<Window> {
    let Scene { leader, ns } = target.scene("bench", None).await?;
    // One connection per 16 clients: HTTP/2 multiplexes, but each connection is one task.
    let conns = target.timers(leader, clients.div_ceil(16).min(8))?;
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for c in 0..clients {
        let mut client = conns[c % conns.len()].clone();
        let (measuring, stop, done, ns) =
            (measuring.clone(), stop.clone(), done.clone(), ns.clone());
        let payload = opts.payload_bytes;
        tasks.push(tokio::spawn(async move {
            let mut w = Window {
                timers: 0,
                errors: 0,
                secs: 0.0,
                latency: histogram(),
                first_error: None,
                leader,
                cpu: None,
            };
            let due = now_ms() + 3_600_000;
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let mut reqs: Vec<pb::ScheduleRequest> = (0..size)
                    .map(|k| schedule_req(&ns, format!("c{c}-{i}-{k}"), due, payload))
                    .collect();
                i += 1;
                let start = now_us();
                let result = if size == 1 {
                    client.schedule(reqs.pop().expect("one")).await.map(|_| ())
                } else {
                    let req = pb::ScheduleBatchRequest { timers: reqs };
                    client.schedule_batch(req).await.map(|_| ())
                };
                if !measuring.load(Ordering::Relaxed) {
                    continue;
                }
                match result {
                    Ok(()) => {
                        w.timers += size as u64;
                        done.fetch_add(size as u64, Ordering::Relaxed);
                        let _ = w.latency.record((now_us() - start).max(1) as u64);
                    }
                    Err(status) => {
                        w.errors += 1;
                        w.first_error.get_or_insert_with(|| status.to_string());
                    }
                }
            }
            w
        }));
    }
    tokio::time::sleep(opts.warmup).await;
    let cpu_before = cpu_of.map(crate::scale::cpu).transpose()?;
    measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    let bar = crate::progress::timed(label, opts.window);
    while started.elapsed() < opts.window {
        tokio::time::sleep(Duration::from_millis(200)).await;
        crate::progress::tick(&bar, started, done.load(Ordering::Relaxed), "timers");
    }
    measuring.store(false, Ordering::Relaxed);
    let secs = started.elapsed().as_secs_f64();
    let cpu_after = cpu_of.map(crate::scale::cpu).transpose()?;
    stop.store(true, Ordering::Relaxed);
    bar.finish_and_clear();
    let cpu = match (cpu_before, cpu_after) {
        (Some(before), Some(after)) => {
            let now = target.leader().await;
            anyhow::ensure!(
                now == Some(leader),
                "{label}: the leader changed during the window ({leader} → {now:?})"
            );
            let spent = after
                .iter()
                .zip(&before)
                .map(|((id, a), (_, b))| (*id, a - b));
            Some(spent.collect())
        }
        _ => None,
    };
    let mut total = Window {
        timers: 0,
        errors: 0,
        secs,
        latency: histogram(),
        first_error: None,
        leader,
        cpu,
    };
    for t in tasks {
        let w = t.await?;
        total.timers += w.timers;
        total.errors += w.errors;
        total.latency.add(&w.latency)?;
        total.first_error = total.first_error.or(w.first_error);
    }
    Ok(total)
}

/// Loads `count` timers (ids `t0`, `t1`, …) with ScheduleBatch calls of `opts.load_batch`,
/// `opts.batch_in_flight` at a time, timer i due at `due(i)`. Returns the seconds it took.
pub async fn load(
    target: &Target,
    opts: &Opts,
    ns: &str,
    count: u64,
    due: Arc<dyn Fn(u64) -> i64 + Send + Sync>,
    label: &str,
) -> anyhow::Result<f64> {
    let leader = target.wait_leader(Duration::from_secs(10)).await?;
    let conns = target.timers(leader, opts.batch_in_flight.min(4))?;
    let next = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let retries = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let bar = crate::progress::counted(label, count);
    let mut tasks = Vec::new();
    for c in 0..opts.batch_in_flight {
        let client = conns[c % conns.len()].clone();
        let (next, done, due, ns) = (next.clone(), done.clone(), due.clone(), ns.to_string());
        let retries = retries.clone();
        let (batch, payload) = (opts.load_batch as u64, opts.payload_bytes);
        tasks.push(tokio::spawn(async move {
            loop {
                let first = next.fetch_add(batch, Ordering::Relaxed);
                if first >= count {
                    return Ok::<_, tonic::Status>(());
                }
                let timers = (first..(first + batch).min(count))
                    .map(|i| schedule_req(&ns, format!("t{i}"), due(i), payload))
                    .collect::<Vec<_>>();
                let n = timers.len() as u64;
                let req = pb::ScheduleBatchRequest { timers };
                // As a client should: UNAVAILABLE (a leader change, a leader that heard from no
                // quorum for a second) means "retry", and the same batch is safe to send again.
                let (r, n_retries) = retrying(&RETRY, || {
                    let mut c = client.clone();
                    let req = req.clone();
                    async move { c.schedule_batch(req).await }
                })
                .await;
                retries.fetch_add(n_retries as u64, Ordering::Relaxed);
                r?;
                done.fetch_add(n, Ordering::Relaxed);
            }
        }));
    }
    let mut finished = futures::future::try_join_all(tasks);
    loop {
        tokio::select! {
            r = &mut finished => {
                for r in r? {
                    r.map_err(|s| anyhow::anyhow!("loading failed: {s}"))?;
                }
                break;
            }
            _ = tokio::time::sleep(Duration::from_millis(200)) => {
                bar.set_position(done.load(Ordering::Relaxed));
            }
        }
    }
    bar.finish_and_clear();
    let retries = retries.load(Ordering::Relaxed);
    if retries > 0 {
        eprintln!("{label}: {retries} batch calls answered UNAVAILABLE and were sent again");
    }
    Ok(started.elapsed().as_secs_f64())
}

/// How long a loader keeps resending a batch answered UNAVAILABLE: the client library's
/// policy, for 30 s.
const RETRY: Retry = Retry {
    attempts: 1_000,
    base: Duration::from_millis(50),
    max_backoff: Duration::from_millis(200),
    within: Duration::from_secs(30),
};
