//! Prometheus metrics: every metric's name, the HTTP exporter, and the sampler of gauges.
//!
//! Three sources, each where the fact is known:
//! - **Events** (timers scheduled, fired, delivered, redelivered, acked; fire lateness) are
//!   counted by the state machine as it applies them ([`Events`], recorded per entry once its
//!   batch is written). Every replica applies the same entries,
//!   so every node reports the same totals and any node's `rate()` is the cluster's. Lateness
//!   is measured on the replicated clock (the Fire entry's time minus the timer's due time), so
//!   it is exact and deterministic, not a guess from a wall clock.
//! - **gRPC** requests, by method and status, with latency: [`crate::api::stack::observe`], a tower
//!   layer on the server.
//! - **Gauges** (Raft term, leader, commit/applied index, apply lag, log size, snapshots,
//!   PENDING timers per namespace) are sampled once a second by `sample::sample_loop` from openraft's
//!   metrics and the store.
//!
//! Nothing is recorded until [`serve`] installs the exporter (`timerd --metrics-listen`); the
//! `metrics` macros are no-ops before that, so in-process test clusters pay nothing.
//! docs/operations.md lists every metric; docs/grafana-dashboard.json charts them.

use std::net::SocketAddr;
use std::time::Duration;

use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

use crate::{Error, Result};

const LATENESS: &str = "timerdb_fire_lateness_seconds";
const GRPC_SECONDS: &str = "timerdb_grpc_request_duration_seconds";
const PUSH_SECONDS: &str = "timerdb_push_latency_seconds";
/// Grants cut short (or not made) by a namespace's limit, by `namespace` and `limit`
/// (`rate`, `concurrency`).
pub const DISPATCH_THROTTLED: &str = "timerdb_dispatch_throttled_total";
/// Writes openraft refused because the leader's quorum lease had lapsed, tried again
/// (`cluster::propose::client_write`): a count that climbs shows followers answering late, or
/// resting groups woken (`cluster::rest`: one or two each).
pub const LEASE_RETRIES: &str = "timerdb_raft_lease_retries_total";
/// Data groups this node leads that rest (`cluster::rest`): no heartbeats, tickers parked.
pub const GROUPS_RESTING: &str = "timerdb_groups_resting";
/// Data groups this node follows and holds for their resting leader (election timer parked).
pub const GROUPS_HELD: &str = "timerdb_groups_held";

/// Serves `/metrics` over HTTP at `addr`; call once per process, inside the runtime.
pub fn serve(addr: SocketAddr) -> Result<()> {
    let fail =
        |e: &dyn std::fmt::Display| Error::InvalidArgument(format!("metrics on {addr}: {e}"));
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(
            Matcher::Full(LATENESS.into()),
            &[
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
            ],
        )
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full(GRPC_SECONDS.into()),
                &[
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0,
                ],
            )
        })
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full(PUSH_SECONDS.into()),
                &[
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                    30.0,
                ],
            )
        })
        .map_err(|e| fail(&e))?
        .install()
        .map_err(|e| fail(&e))
}

/// What one applied entry did, counted while it is applied and recorded once it is written:
/// one registry lookup per metric per entry, not per timer (a Fire entry fires thousands),
/// and nothing is counted for an entry whose write failed.
#[derive(Debug, Default)]
pub struct Events {
    scheduled: u64,
    /// Lateness of each timer fired, in ms on the replicated clock.
    fired_late_ms: Vec<i64>,
    delivered: u64,
    redelivered: u64,
    acked: u64,
    keys_written: u64,
    /// Timers found too late to fire: (namespace, misfire action).
    expired: Vec<(String, &'static str)>,
}

impl Events {
    /// A timer was scheduled (a new PENDING timer).
    pub fn scheduled(&mut self) {
        self.scheduled += 1;
    }

    /// A timer fired `late_ms` after its due time.
    pub fn fired(&mut self, late_ms: i64) {
        self.fired_late_ms.push(late_ms);
    }

    /// Takes back one `fired(late_ms)` of this entry: the row the cursor passed did not fire
    /// after all (a recurring timer's occurrence its policy dropped or held back).
    pub fn unfired(&mut self, late_ms: i64) {
        if let Some(i) = self.fired_late_ms.iter().rposition(|l| *l == late_ms) {
            self.fired_late_ms.swap_remove(i);
        }
    }

    /// `n` fired timers were handed to consumers, `again` of them after an earlier attempt
    /// went unacked.
    pub fn delivered(&mut self, n: u64, again: u64) {
        self.delivered += n;
        self.redelivered += again;
    }

    /// A timer of `namespace` was found too late to fire and handled by `action`.
    pub fn expired(&mut self, namespace: &str, action: &'static str) {
        self.expired.push((namespace.to_string(), action));
    }

    /// `n` deliveries were acknowledged.
    pub fn acked(&mut self, n: u64) {
        self.acked += n;
    }

    /// The lateness of each timer the entry fired, in ms.
    pub fn fired_lateness(&self) -> &[i64] {
        &self.fired_late_ms
    }

    /// Deliveries acknowledged by the entry.
    pub fn acked_count(&self) -> u64 {
        self.acked
    }

    /// The entry's batch wrote `n` keys (its effects and the applied index).
    pub fn keys_written(&mut self, n: u64) {
        self.keys_written += n;
    }

    /// Adds these events to the exported metrics.
    pub fn record(self) {
        let counts = [
            ("timerdb_timers_scheduled_total", self.scheduled),
            (
                "timerdb_timers_fired_total",
                self.fired_late_ms.len() as u64,
            ),
            ("timerdb_deliveries_total", self.delivered),
            ("timerdb_redeliveries_total", self.redelivered),
            ("timerdb_timers_acked_total", self.acked),
            (
                "timerdb_state_machine_keys_written_total",
                self.keys_written,
            ),
        ];
        for (name, n) in counts.into_iter().filter(|(_, n)| *n > 0) {
            counter!(name).increment(n);
        }
        for (ns, action) in self.expired {
            counter!("timerdb_timers_expired_total", "namespace" => ns, "policy" => action)
                .increment(1);
        }
        if !self.fired_late_ms.is_empty() {
            let lateness = histogram!(LATENESS);
            for ms in self.fired_late_ms {
                lateness.record(ms.max(0) as f64 / 1000.0);
            }
        }
    }
}

/// The upper bounds (ms) of the fire-lateness counts a node keeps for its Status (the web
/// console charts them); the last count holds every fired timer.
pub const FIRE_LATENESS_BOUNDS_MS: [u64; 13] =
    [1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000];

/// Timers fired and their lateness since the node started, kept whether or not the Prometheus
/// exporter runs: cumulative counts at each bound of [`FIRE_LATENESS_BOUNDS_MS`] and a sum.
#[derive(Debug, Default)]
pub struct FireStats {
    fired: std::sync::atomic::AtomicU64,
    sum_ms: std::sync::atomic::AtomicU64,
    /// Fired timers at most each bound late, and (last) all of them.
    le: [std::sync::atomic::AtomicU64; FIRE_LATENESS_BOUNDS_MS.len() + 1],
}

impl FireStats {
    pub fn add(&self, lateness_ms: &[i64]) {
        use std::sync::atomic::Ordering::Relaxed;
        if lateness_ms.is_empty() {
            return;
        }
        let mut le = [0u64; FIRE_LATENESS_BOUNDS_MS.len() + 1];
        let mut sum = 0u64;
        for ms in lateness_ms {
            let ms = (*ms).max(0) as u64;
            sum += ms;
            for (i, bound) in FIRE_LATENESS_BOUNDS_MS.iter().enumerate() {
                le[i] += u64::from(ms <= *bound);
            }
        }
        le[FIRE_LATENESS_BOUNDS_MS.len()] = lateness_ms.len() as u64;
        self.fired.fetch_add(lateness_ms.len() as u64, Relaxed);
        self.sum_ms.fetch_add(sum, Relaxed);
        for (slot, n) in self.le.iter().zip(le) {
            slot.fetch_add(n, Relaxed);
        }
    }

    /// (fired, sum of lateness ms, cumulative counts per bound).
    pub fn read(&self) -> (u64, u64, Vec<u64>) {
        use std::sync::atomic::Ordering::Relaxed;
        let le = self.le.iter().map(|a| a.load(Relaxed)).collect();
        (self.fired.load(Relaxed), self.sum_ms.load(Relaxed), le)
    }
}

/// One gRPC call finished: `method` is the request path (`/timerdb.v1.Timers/Schedule`).
pub fn grpc(method: &str, code: tonic::Code, elapsed: Duration) {
    let (calls, seconds) = grpc_series(method, code);
    calls.increment(1);
    seconds.record(elapsed.as_secs_f64());
}

/// The series [`grpc`] records `method` and `code` in, as handles to keep: a lookup by name
/// and labels, with two strings made for it, on every call cost ~1 % of a busy leader's CPU.
/// Kept handles record only if the exporter was installed before they were made ([`serve`]:
/// timerd installs it before it serves anything).
pub fn grpc_series(method: &str, code: tonic::Code) -> (metrics::Counter, metrics::Histogram) {
    let labels = [
        ("method", method.to_string()),
        ("code", format!("{code:?}")),
    ];
    (
        counter!("timerdb_grpc_requests_total", &labels),
        histogram!(GRPC_SECONDS, &labels),
    )
}

/// One push namespace's metrics, registered once (the pusher records one per request; a
/// lookup by name and labels each time cost ~1 % of a busy leader's CPU).
#[derive(Clone)]
pub struct PushMetrics {
    namespace: String,
    ok: metrics::Counter,
    latency: metrics::Histogram,
    in_flight: metrics::Gauge,
}

impl PushMetrics {
    pub fn new(namespace: &str) -> PushMetrics {
        let ns = namespace.to_string();
        PushMetrics {
            ok: counter!("timerdb_push_dispatches_total", "namespace" => ns.clone(), "outcome" => "ok"),
            latency: histogram!(PUSH_SECONDS, "namespace" => ns.clone()),
            in_flight: gauge!("timerdb_push_in_flight", "namespace" => ns.clone()),
            namespace: ns,
        }
    }

    /// A push request ended with `outcome` (a label of `push::Answer`) after `elapsed`.
    pub fn pushed(&self, outcome: &'static str, elapsed: Duration) {
        if outcome == "ok" {
            self.ok.increment(1);
        } else {
            counter!("timerdb_push_dispatches_total", "namespace" => self.namespace.clone(), "outcome" => outcome)
                .increment(1);
        }
        self.latency.record(elapsed.as_secs_f64());
    }

    /// Push requests outstanding for the namespace on this leader.
    pub fn in_flight(&self, n: usize) {
        self.in_flight.set(n as f64);
    }
}

/// A Schedule or ScheduleBatch refused by `namespace`'s schedule rate limit.
pub fn schedule_throttled(namespace: &str) {
    counter!("timerdb_schedule_throttled_total", "namespace" => namespace.to_string()).increment(1);
}

/// A call the auth layer refused, by gRPC path and reason (`missing`, `malformed`, `unknown`,
/// `not_admin`, `no_permission`).
pub fn auth_denied(method: &str, reason: &'static str) {
    counter!("timerdb_auth_denied_total", "method" => method.to_string(), "reason" => reason)
        .increment(1);
}

/// A call this node forwarded to another node's leader (a client that routes by the slot map
/// sends few: each costs a hop).
pub fn call_forwarded() {
    counter!("timerdb_calls_forwarded_total").increment(1);
}

/// An ack or nack a delivery stream dropped: of a delivery it never sent, past its budget.
pub fn acks_dropped() {
    counter!("timerdb_stream_acks_dropped_total").increment(1);
}
