//! The push workload: timers due at a steady rate, delivered by the leader to an HTTP receiver
//! in this process that answers 204 at once. Lateness = receive time − fire_at, as in `fire`
//! (the same producer, so the two are side by side: push vs Subscribe at the same rate).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use timerdb::api::pb;

use crate::fire::produce;
use crate::report::Recorder;
use crate::scene::Scene;
use crate::target::{histogram, ms_at, now_us, Target};
use crate::Opts;

/// First receipt per timer id: (receive µs, fire_at ms), and how many requests in all.
#[derive(Default)]
struct Received {
    first: HashMap<String, (i64, i64)>,
    requests: u64,
}

/// A receiver that answers every request 204 at once; returns its URL.
async fn receiver(got: Arc<Mutex<Received>>) -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/bench", listener.local_addr()?);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            let got = got.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: hyper::Request<_>| {
                    let at = now_us();
                    let h = |n: &str| {
                        req.headers()
                            .get(n)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_string()
                    };
                    let (id, fire_at) = (h("timerdb-id"), h("timerdb-fire-at-ms"));
                    let mut g = got.lock().expect("receiver lock");
                    g.requests += 1;
                    g.first
                        .entry(id)
                        .or_insert((at, fire_at.parse().unwrap_or(0)));
                    drop(g);
                    let resp = hyper::Response::builder()
                        .status(204)
                        .body(Full::new(Bytes::new()));
                    async move { resp }
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

pub async fn push(
    target: &Target,
    opts: &Opts,
    rate: u64,
    rec: &mut Recorder<'_>,
) -> anyhow::Result<()> {
    let got = Arc::new(Mutex::new(Received::default()));
    let url = receiver(got.clone()).await?;
    let policy = pb::NamespacePolicy {
        push: Some(pb::PushTarget {
            url,
            ..Default::default()
        }),
        ..Default::default()
    };
    let Scene { leader, ns } = target.scene("push", Some(policy)).await?;
    // The pusher looks for new push targets every 500 ms.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let (count, late_sends) = produce(target, opts, &ns, leader, rate).await?;
    let bar = crate::progress::counted(&format!("push {rate}/s: received"), count);
    let deadline = Instant::now() + Duration::from_secs(30 + count / 10_000);
    loop {
        let n = got.lock().expect("receiver lock").first.len() as u64;
        bar.set_position(n);
        if n >= count || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bar.finish_and_clear();
    let g = got.lock().expect("receiver lock");
    let mut h = histogram();
    let mut early = 0;
    for (recv_us, fire_at_ms) in g.first.values() {
        let late = recv_us - fire_at_ms * 1000;
        early += u64::from(late < 0);
        let _ = h.record(late.max(1) as u64);
    }
    let first_due_us = g.first.values().map(|v| v.1).min().unwrap_or(0) * 1000;
    let last_us = g.first.values().map(|v| v.0).max().unwrap_or(0);
    let span = (last_us - first_due_us) as f64 / 1e6;
    rec.put("delivered rate", "timers/s", g.first.len() as f64 / span);
    rec.put("lateness p50", "ms", ms_at(&h, 50.0));
    rec.put("lateness p99", "ms", ms_at(&h, 99.0));
    rec.put("lateness p999", "ms", ms_at(&h, 99.9));
    rec.put("lateness max", "ms", h.max() as f64 / 1000.0);
    rec.put("early", "timers", early as f64);
    rec.put(
        "not received",
        "timers",
        (count - g.first.len() as u64) as f64,
    );
    rec.put("requests", "requests", g.requests as f64);
    rec.put("sent after due", "timers", late_sends as f64);
    if (g.first.len() as u64) < count {
        eprintln!(
            "    warning: only {} of {count} timers were received in time",
            g.first.len()
        );
    }
    Ok(())
}
