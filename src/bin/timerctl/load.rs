//! `timerctl load`: many concurrent Schedule calls, then (with --wait) the lateness of their fires.

use std::time::{Duration, Instant};

use anyhow::bail;

use crate::Ch as Channel;
use timerdb::api::pb::{self, timers_client::TimersClient};

use crate::{now_ms, status_err};

pub async fn load(
    timers: TimersClient<Channel>,
    namespace: String,
    count: usize,
    concurrency: usize,
    delay: Duration,
    spread: Duration,
    wait: bool,
) -> anyhow::Result<()> {
    let base = now_ms() + delay.as_millis() as i64;
    let spread_ms = spread.as_millis() as i64;
    let run = now_ms();
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency.max(1) {
        let (mut c, next, ns) = (timers.clone(), next.clone(), namespace.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= count {
                    return Ok::<_, tonic::Status>(());
                }
                let offset = if count > 1 {
                    spread_ms * i as i64 / (count as i64 - 1)
                } else {
                    0
                };
                let req = pb::ScheduleRequest {
                    namespace: ns.clone(),
                    id: format!("load-{run}-{i}"),
                    when: Some(pb::schedule_request::When::FireAtMs(base + offset)),
                    payload: Vec::new(),
                    ..Default::default()
                };
                c.schedule(req).await?;
            }
        }));
    }
    for t in tasks {
        t.await?.map_err(status_err)?;
    }
    let secs = started.elapsed().as_secs_f64();
    if !crate::output::json() {
        println!(
            "scheduled {count} timers in {secs:.2} s: {:.0} schedules/s ({concurrency} in flight)",
            count as f64 / secs
        );
    }
    let mut summary = serde_json::json!({
        "scheduled": count,
        "seconds": secs,
        "schedules_per_second": count as f64 / secs,
        "concurrency": concurrency,
    });
    if wait {
        let lateness = report_lateness(
            timers,
            &namespace,
            &format!("load-{run}-"),
            count,
            base + spread_ms,
        )
        .await?;
        summary["lateness_ms"] = lateness;
    }
    if crate::output::json() {
        crate::output::doc(summary);
    }
    Ok(())
}

/// Waits until every timer of this load run fired, then prints lateness percentiles.
async fn report_lateness(
    mut timers: TimersClient<Channel>,
    namespace: &str,
    prefix: &str,
    count: usize,
    last_fire_ms: i64,
) -> anyhow::Result<serde_json::Value> {
    let deadline = Instant::now()
        + Duration::from_millis((last_fire_ms - now_ms()).max(0) as u64)
        + Duration::from_secs(60);
    loop {
        let mut lateness = Vec::with_capacity(count);
        let mut token = String::new();
        loop {
            let req = pb::ListRequest {
                namespace: namespace.into(),
                state: pb::TimerState::Fired as i32,
                limit: 10_000,
                page_token: token,
                ..Default::default()
            };
            let page = timers.list(req).await.map_err(status_err)?.into_inner();
            lateness.extend(
                page.timers
                    .iter()
                    .filter(|t| t.id.starts_with(prefix))
                    .map(|t| t.fired_at_ms - t.fire_at_ms),
            );
            token = page.next_page_token;
            if token.is_empty() {
                break;
            }
        }
        if lateness.len() >= count {
            lateness.sort_unstable();
            let p = |q: f64| lateness[((lateness.len() - 1) as f64 * q) as usize];
            let (min, max) = (lateness[0], lateness[lateness.len() - 1]);
            if !crate::output::json() {
                println!(
                    "all {count} fired; lateness (fired_at - fire_at, ms): min {min} p50 {} p99 {} max {max}",
                    p(0.5),
                    p(0.99),
                );
            }
            if min < 0 {
                bail!("a timer fired early");
            }
            return Ok(serde_json::json!({"min": min, "p50": p(0.5), "p99": p(0.99), "max": max}));
        }
        if Instant::now() > deadline {
            bail!("only {} of {count} timers fired in time", lateness.len());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
