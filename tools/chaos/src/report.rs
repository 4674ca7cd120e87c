//! Summaries: one per run, and one over all runs (faults by kind, operations by outcome,
//! lateness percentiles in calm and fault windows, failover times, violations).

use std::collections::BTreeMap;
use std::time::Duration;

use timerdb::api::pb;

use crate::run::{RunReport, Window};
use timerdb_harness::workload::{AckPath, Kind, Outcome};

/// A timer's fire counts as "under faults" if due from a fault's start to this long after its
/// end (a restarted node, an election, a backlog of due timers).
const AFTERMATH_MS: i64 = 3_000;

/// Totals over runs.
#[derive(Default)]
pub struct Totals {
    pub runs: usize,
    pub faults: BTreeMap<&'static str, usize>,
    pub ops: BTreeMap<String, usize>,
    pub timers: usize,
    pub push_timers: usize,
    pub push_requests: usize,
    pub occurrences: usize,
    pub deliveries: usize,
    pub violations: usize,
    pub early_by_skew: usize,
    fire: [Vec<i64>; 2],
    delivery: [Vec<i64>; 2],
    failovers: Vec<Duration>,
}

fn in_fault(windows: &[Window], at_ms: i64) -> usize {
    let hit = windows
        .iter()
        .any(|w| at_ms >= w.from_ms && at_ms <= w.to_ms + AFTERMATH_MS);
    usize::from(hit)
}

fn outcome_name(o: &Outcome) -> String {
    match o {
        Outcome::Ok(_) => "ok".into(),
        Outcome::Failed(code, _) => format!("refused {code:?}"),
        Outcome::Unknown(code, _) => format!("unknown {code:?}"),
    }
}

impl Totals {
    /// Adds one run and prints its summary.
    pub fn add(&mut self, r: &RunReport) {
        let mut fire: [Vec<i64>; 2] = Default::default();
        let mut delivery: [Vec<i64>; 2] = Default::default();
        let mut first_seen: BTreeMap<&str, i64> = BTreeMap::new();
        for d in &r.history.deliveries {
            let e = first_seen.entry(d.id.as_str()).or_insert(d.received_ms);
            *e = (*e).min(d.received_ms);
        }
        for t in r.timers.values() {
            if t.fire_index == 0 || t.state == pb::TimerState::Cancelled as i32 {
                continue;
            }
            let w = in_fault(&r.windows, t.fire_at_ms);
            fire[w].push(t.fired_at_ms - t.fire_at_ms);
            if let Some(seen) = first_seen.get(t.id.as_str()) {
                delivery[w].push(seen - t.fire_at_ms);
            }
        }
        let mut ops: BTreeMap<String, usize> = BTreeMap::new();
        for op in &r.history.ops {
            let kind = match op.kind {
                Kind::Schedule => "schedule",
                Kind::Batch => "batch",
                Kind::Cancel => "cancel",
                Kind::Reschedule => "reschedule",
                Kind::Get => "get",
                Kind::CancelIf => "cancel-if-pending",
                Kind::Extend => "extend",
            };
            *ops.entry(format!("{kind} {}", outcome_name(&op.outcome)))
                .or_default() += 1;
        }
        let mut faults: BTreeMap<&'static str, usize> = BTreeMap::new();
        for w in &r.windows {
            *faults.entry(w.fault.kind()).or_default() += 1;
        }
        let failovers: Vec<Duration> = r.windows.iter().filter_map(|w| w.failover).collect();
        let plan: Vec<String> = r
            .windows
            .iter()
            .map(|w| match w.failover {
                Some(d) => format!(
                    "{}@n{} (new leader in {} ms)",
                    w.fault.kind(),
                    w.node,
                    d.as_millis()
                ),
                None => format!("{}@n{}", w.fault.kind(), w.node),
            })
            .collect();
        let redeliveries = r
            .history
            .deliveries
            .iter()
            .filter(|d| d.attempt > 1)
            .count();
        let f = &r.findings;
        println!(
            "run seed={}: {} faults {:?}; {} ops; {} timers checked; {} deliveries; \
             unknown schedules resolved done/not done {}/{}; quiet after {:.1} s; violations {}",
            r.seed,
            r.windows.len(),
            faults,
            r.history.ops.len(),
            f.timers_checked,
            r.history.deliveries.len(),
            f.unknown_resolved_done,
            f.unknown_resolved_not_done,
            r.quiesce.as_secs_f64(),
            f.violations.len()
        );
        println!(
            "  push: {} timers, {} requests to the receiver ({} answered 500 or too slowly; \
             dropped connections while it was down are not counted)",
            f.push_timers, f.push_requests, f.push_failed
        );
        println!(
            "  recurring: {} occurrences checked; missed {} (fire_once), skipped {} (overlap)",
            f.occurrences, f.occurrences_missed, f.occurrences_skipped
        );
        println!("  faults in order: {}", plan.join(", "));
        let on = |path| {
            let d = &r.history.deliveries;
            d.iter().filter(|d| d.path == path).count()
        };
        println!(
            "  redeliveries (attempt > 1): {redeliveries}; deliveries acked on their stream \
             (Consume): {}, by unary Ack answered once queued: {}",
            on(AckPath::Stream),
            on(AckPath::Queued)
        );
        let mut unknown: Vec<&str> = r
            .history
            .ops
            .iter()
            .filter_map(|op| match &op.outcome {
                Outcome::Unknown(_, msg) => Some(msg.as_str()),
                _ => None,
            })
            .collect();
        unknown.sort_unstable();
        unknown.dedup();
        // Refusals other than the workload's expected ones (a cancel of a fired timer, a get
        // of a purged one) are worth reading too.
        let mut refused: Vec<String> = r
            .history
            .ops
            .iter()
            .filter_map(|op| match &op.outcome {
                Outcome::Failed(code, msg)
                    if !matches!(
                        code,
                        tonic::Code::FailedPrecondition | tonic::Code::NotFound
                    ) =>
                {
                    Some(format!("{code:?}: {msg}"))
                }
                _ => None,
            })
            .collect();
        refused.sort_unstable();
        refused.dedup();
        for msg in refused.iter().take(3) {
            println!("  a refusal: {msg}");
        }
        for msg in unknown.iter().take(3) {
            println!("  an unknown outcome: {msg}");
        }
        for v in f.violations.iter().take(20) {
            println!("  VIOLATION {}: {}", v.kind, v.detail);
        }
        print_table(&fire, &delivery, &failovers);

        self.runs += 1;
        for (k, v) in faults {
            *self.faults.entry(k).or_default() += v;
        }
        for (k, v) in ops {
            *self.ops.entry(k).or_default() += v;
        }
        self.timers += f.timers_checked;
        self.push_timers += f.push_timers;
        self.occurrences += f.occurrences;
        self.push_requests += f.push_requests;
        self.deliveries += r.history.deliveries.len();
        self.violations += f.violations.len();
        self.early_by_skew += f.early_by_skew;
        for i in 0..2 {
            self.fire[i].extend(&fire[i]);
            self.delivery[i].extend(&delivery[i]);
        }
        self.failovers.extend(failovers);
    }

    pub fn print(&self) {
        println!("==== {} run(s)", self.runs);
        println!("faults injected: {:?}", self.faults);
        println!("operations: {:?}", self.ops);
        println!(
            "timers checked: {}; deliveries: {}; delivered early under clock skew (allowed): {}; violations: {}",
            self.timers, self.deliveries, self.early_by_skew, self.violations
        );
        println!(
            "of them pushed: {} timers, {} requests to the HTTP receiver",
            self.push_timers, self.push_requests
        );
        println!(
            "of them occurrences of recurring timers: {} (every one due in the run fired exactly \
             once, or was accounted missed/skipped by its policy)",
            self.occurrences
        );
        print_table(&self.fire, &self.delivery, &self.failovers);
    }
}

fn pct(v: &mut [i64]) -> String {
    if v.is_empty() {
        return format!("{:>26}", "-");
    }
    v.sort_unstable();
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    format!(
        "{:>6} {:>6} {:>6} (n={})",
        at(0.5),
        at(0.99),
        v[v.len() - 1],
        v.len()
    )
}

fn print_table(fire: &[Vec<i64>; 2], delivery: &[Vec<i64>; 2], failovers: &[Duration]) {
    let (mut fire, mut delivery) = (fire.clone(), delivery.clone());
    println!(
        "  {:<34} {:<30} {:<30}",
        "ms after fire_at: p50 p99 max", "calm", "under faults"
    );
    println!(
        "  {:<34} {:<30} {:<30}",
        "fired (leader's clock)",
        pct(&mut fire[0]),
        pct(&mut fire[1])
    );
    println!(
        "  {:<34} {:<30} {:<30}",
        "first delivery (client's clock)",
        pct(&mut delivery[0]),
        pct(&mut delivery[1])
    );
    let mut ms: Vec<i64> = failovers.iter().map(|d| d.as_millis() as i64).collect();
    println!(
        "  failover, ms to a new agreed leader: p50 p99 max {}",
        pct(&mut ms)
    );
}
