//! The metrics endpoint, on real `timerd` processes: scraped over HTTP, parsed as Prometheus
//! text, and checked against what the test did.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tempfile::TempDir;
use timerdb::api::pb::{self, cluster_client::ClusterClient, timers_client::TimersClient};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Code;

use crate::harness::*;
use crate::process::*;

/// One sample: metric name and labels (sorted, `k="v"` joined by commas) → value.
type Samples = HashMap<(String, String), f64>;

/// GETs `/metrics` from `addr` (plain HTTP/1.0) and parses the text format.
async fn scrape(addr: &str) -> Option<Samples> {
    let mut conn = tokio::net::TcpStream::connect(addr).await.ok()?;
    let req = format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    conn.write_all(req.as_bytes()).await.ok()?;
    let mut body = String::new();
    conn.read_to_string(&mut body).await.ok()?;
    let (head, text) = body.split_once("\r\n\r\n")?;
    assert!(
        head.starts_with("HTTP/1.") && head.contains(" 200"),
        "{head}"
    );
    Some(parse(text))
}

/// Parses Prometheus text exposition lines (`name{labels} value`), skipping comments.
fn parse(text: &str) -> Samples {
    let mut out = Samples::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (series, value) = line.rsplit_once(' ').expect("sample without value");
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value: {line}"));
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => {
                let mut labels: Vec<&str> = rest.trim_end_matches('}').split(',').collect();
                labels.sort();
                (n.to_string(), labels.join(","))
            }
            None => (series.to_string(), String::new()),
        };
        assert!(
            out.insert((name, labels), value).is_none(),
            "sample twice: {line}"
        );
    }
    out
}

fn get(s: &Samples, name: &str, labels: &str) -> f64 {
    *s.get(&(name.to_string(), labels.to_string()))
        .unwrap_or_else(|| panic!("no sample {name}{{{labels}}}"))
}

/// Three `timerd` processes, each serving metrics; returns them and their metrics addresses.
fn three_with_metrics(tmp: &TempDir) -> (Vec<Proc>, Vec<String>) {
    let metrics: Vec<String> = (0..3).map(|_| free_addr()).collect();
    let (mut procs, peers) = start_three(tmp);
    // Restart each with --metrics-listen (start_three gives every node the same extra flags).
    for (i, p) in procs.iter_mut().enumerate() {
        let mut child = p.child.take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        let flags = ["--metrics-listen", metrics[i].as_str()];
        p.child = Some(spawn_with(i as u64 + 1, p, &peers, &flags));
    }
    (procs, metrics)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_endpoint_is_scraped_and_parsed() {
    init_tracing();
    let tmp = TempDir::new().unwrap();
    let (procs, metrics) = three_with_metrics(&tmp);
    let l = leader(&procs).await;
    let mut client = TimersClient::new(channel(&procs[l].addr).await.unwrap());

    // Phase 1: 20 timers due at once in `test`, 5 in an hour in `later`, one NotFound.
    let now = now_ms();
    let mut timers: Vec<_> = (0..20)
        .map(|i| schedule_req(&format!("m{i}"), now))
        .collect();
    for i in 0..5 {
        let mut r = schedule_req(&format!("h{i}"), now + 3_600_000);
        r.namespace = "later".into();
        timers.push(r);
    }
    client
        .schedule_batch(pb::ScheduleBatchRequest { timers })
        .await
        .unwrap();
    let missing = pb::GetRequest {
        namespace: NS.into(),
        id: "nope".into(),
        ..Default::default()
    };
    assert_eq!(
        client.get(missing).await.unwrap_err().code(),
        Code::NotFound
    );

    // Phase 2: a consumer takes the 20 deliveries and acks them.
    let mut stream = client
        .subscribe(pb::SubscribeRequest {
            namespace: NS.into(),
            consumer: "metrics-test".into(),
            max_in_flight: 0,
        })
        .await
        .unwrap()
        .into_inner();
    for _ in 0..20 {
        let d = tokio::time::timeout(Duration::from_secs(20), stream.message())
            .await
            .expect("no delivery within 20 s")
            .unwrap()
            .unwrap();
        let t = d.timer.unwrap();
        client
            .ack(pb::AckRequest {
                namespace: t.namespace,
                id: t.id,
                attempt: d.attempt,
                ..Default::default()
            })
            .await
            .unwrap();
    }

    // Phase 3: every node's endpoint agrees with what happened (gauges are sampled each
    // second and followers apply a moment later, so wait for it, bounded).
    for (i, addr) in metrics.iter().enumerate() {
        let deadline = Instant::now() + Duration::from_secs(15);
        let s = loop {
            let s = scrape(addr).await;
            let settled = s.as_ref().is_some_and(|s| {
                s.get(&("timerdb_timers_acked_total".into(), String::new())) == Some(&20.0)
                    && s.get(&("timerdb_pending_timers".into(), "namespace=\"test\"".into()))
                        == Some(&0.0)
            });
            if settled {
                break s.unwrap();
            }
            assert!(
                Instant::now() < deadline,
                "node {} metrics never settled: {s:?}",
                i + 1
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        };
        assert_eq!(get(&s, "timerdb_timers_scheduled_total", ""), 25.0);
        assert_eq!(get(&s, "timerdb_timers_fired_total", ""), 20.0);
        assert_eq!(get(&s, "timerdb_deliveries_total", ""), 20.0);
        assert_eq!(
            get(&s, "timerdb_pending_timers", "namespace=\"later\""),
            5.0
        );
        assert_eq!(get(&s, "timerdb_fire_lateness_seconds_count", ""), 20.0);
        let within_10s = get(&s, "timerdb_fire_lateness_seconds_bucket", "le=\"10\"");
        assert_eq!(within_10s, 20.0, "a timer fired over 10 s late");
        assert!(get(&s, "timerdb_raft_term", "") >= 1.0);
        assert_eq!(get(&s, "timerdb_raft_leader_id", ""), l as f64 + 1.0);
        let is_leader = get(&s, "timerdb_raft_is_leader", "");
        assert_eq!(is_leader, if i == l { 1.0 } else { 0.0 });
        let applied = get(&s, "timerdb_raft_applied_index", "");
        assert!(applied >= 5.0 && get(&s, "timerdb_raft_commit_index", "") >= applied);
        assert!(get(&s, "timerdb_raft_apply_lag_entries", "") >= 0.0);
        assert!(get(&s, "timerdb_raft_log_entries", "") >= 5.0);
        assert!(get(&s, "timerdb_raft_log_bytes", "") > 0.0);
        assert_eq!(get(&s, "timerdb_snapshots_built_total", ""), 0.0);
        // Storage writes are counted: the metric and Status agree (nothing is written now).
        let keys = get(&s, "timerdb_state_machine_keys_written_total", "");
        let mut cluster = ClusterClient::new(channel(&procs[i].addr).await.unwrap());
        let status = cluster
            .status(pb::StatusRequest {})
            .await
            .unwrap()
            .into_inner();
        assert!(keys >= 25.0, "25 timers were created on every node: {keys}");
        assert_eq!(keys, status.state_machine_keys_written as f64);
        dashboard_names_exist(&s);
        if i == l {
            // The calls went to the leader: counted by method and status, with latency.
            let ok = "code=\"Ok\",method=\"/timerdb.v1.Timers/ScheduleBatch\"";
            assert_eq!(get(&s, "timerdb_grpc_requests_total", ok), 1.0);
            let nf = "code=\"NotFound\",method=\"/timerdb.v1.Timers/Get\"";
            assert_eq!(get(&s, "timerdb_grpc_requests_total", nf), 1.0);
            let acks = "code=\"Ok\",method=\"/timerdb.v1.Timers/Ack\"";
            assert_eq!(get(&s, "timerdb_grpc_requests_total", acks), 20.0);
            let count = "timerdb_grpc_request_duration_seconds_count";
            assert_eq!(get(&s, count, ok), 1.0);
        }
    }
}

/// Every metric docs/grafana-dashboard.json charts is one the node exports (the redelivery
/// counter appears with the first redelivery, which this test has none of).
fn dashboard_names_exist(s: &Samples) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/grafana-dashboard.json");
    let dashboard = std::fs::read_to_string(path).unwrap();
    let mut names: Vec<&str> = dashboard
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("timerdb_"))
        .collect();
    names.sort();
    names.dedup();
    assert!(names.len() >= 15, "{names:?}");
    for name in names {
        let known = s.keys().any(|(n, _)| n == name);
        // The redelivery counter appears with the first redelivery, which this test has
        // none of; the push row's metrics with the first push (`push_and_limit_metrics_*`).
        let later = name == "timerdb_redeliveries_total"
            || [
                "timerdb_push",
                "timerdb_dispatch",
                "timerdb_schedule_thr",
                "timerdb_namespace_paused",
            ]
            .iter()
            .any(|p| name.starts_with(p));
        assert!(
            known || later,
            "the dashboard charts {name}, which no node exports"
        );
    }
}

/// The push and limit metrics, on real `timerd` processes: a namespace pushed to a real HTTP
/// receiver through a rate limit of 2/s, another refusing schedules beyond 1/s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_and_limit_metrics_are_exported() {
    init_tracing();
    let tmp = TempDir::new().unwrap();
    let (procs, metrics) = three_with_metrics(&tmp);
    let l = leader(&procs).await;
    let ch = channel(&procs[l].addr).await.unwrap();
    let mut client = TimersClient::new(ch.clone());
    let mut ns = pb::namespaces_client::NamespacesClient::new(ch);
    let r = crate::receiver::http().await;
    let put = |name: &str, policy: pb::NamespacePolicy| pb::PutNamespaceRequest {
        name: name.into(),
        policy: Some(policy),
    };
    let push = pb::NamespacePolicy {
        max_dispatches_per_second: Some(2),
        max_burst: 1,
        push: Some(pb::PushTarget {
            url: r.url(),
            ..Default::default()
        }),
        ..Default::default()
    };
    ns.put_namespace(put("pushed", push)).await.unwrap();
    let limited = pb::NamespacePolicy {
        max_schedules_per_second: Some(1),
        max_schedule_burst: 1,
        ..Default::default()
    };
    ns.put_namespace(put("limited", limited)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_100)).await;

    let mut timers: Vec<_> = (0..4)
        .map(|i| schedule_req(&format!("p{i}"), now_ms()))
        .collect();
    for t in &mut timers {
        t.namespace = "pushed".into();
    }
    client
        .schedule_batch(pb::ScheduleBatchRequest { timers })
        .await
        .unwrap();
    let mut refused = 0;
    for i in 0..3 {
        let mut t = schedule_req(&format!("l{i}"), now_ms() + 3_600_000);
        t.namespace = "limited".into();
        if let Err(s) = client.schedule(t).await {
            assert_eq!(s.code(), Code::ResourceExhausted);
            refused += 1;
        }
    }
    assert!(
        refused >= 1,
        "three schedules at once passed a limit of 1/s"
    );

    // The leader exports the push figures once the four are received (2/s: about 2 s).
    let deadline = Instant::now() + Duration::from_secs(20);
    let s = loop {
        let s = scrape(&metrics[l]).await;
        let ok = "namespace=\"pushed\",outcome=\"ok\"";
        let done = s.as_ref().is_some_and(|s| {
            s.get(&("timerdb_push_dispatches_total".into(), ok.into())) == Some(&4.0)
        });
        if done {
            break s.unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "push metrics never settled: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(r.got().len(), 4);
    let pushed = "namespace=\"pushed\"";
    assert_eq!(get(&s, "timerdb_push_latency_seconds_count", pushed), 4.0);
    assert!(get(&s, "timerdb_push_in_flight", pushed) >= 0.0);
    let rate = "limit=\"rate\",namespace=\"pushed\"";
    assert!(get(&s, "timerdb_dispatch_throttled_total", rate) >= 1.0);
    let limited = "namespace=\"limited\"";
    assert_eq!(
        get(&s, "timerdb_schedule_throttled_total", limited),
        refused as f64
    );
    assert_eq!(get(&s, "timerdb_namespace_paused", pushed), 0.0);
    push_dashboard_names_exist(&s);
}

/// Every push metric the dashboard's push row charts is one the leader exports.
fn push_dashboard_names_exist(s: &Samples) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/grafana-dashboard.json");
    let dashboard = std::fs::read_to_string(path).unwrap();
    let mut names: Vec<&str> = dashboard
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| {
            w.starts_with("timerdb_push")
                || w.starts_with("timerdb_dispatch")
                || w.starts_with("timerdb_schedule_thr")
                || w.starts_with("timerdb_namespace_paused")
        })
        .collect();
    names.sort();
    names.dedup();
    assert!(names.len() >= 5, "{names:?}");
    for name in names {
        assert!(
            s.keys().any(|(n, _)| n == name),
            "the dashboard charts {name}, which the leader does not export"
        );
    }
}
