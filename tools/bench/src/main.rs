//! `timerdb-bench`: measures a timerdb cluster. By default it starts three release `timerd`
//! processes of its own (a fresh cluster for every measurement, peers dialling each other
//! directly), so the workloads that kill and restart nodes can run; `--connect` points the
//! others at an existing cluster.
//!
//! Every configuration runs `--runs` times, and the runs are taken side by side (run 1 of every
//! configuration, then run 2 of every one, …) so that a noisy neighbour spreads over all of them
//! instead of spoiling one. Figures are reported as the median of the runs beside the runs.
//!
//! Workloads: `schedule`, `batch`, `fire`, `burst`, `failover`, `pending`, and `keys` (storage
//! writes over a timer's whole life) and `naive` (a one-at-a-time consumer) in `life`; `push`;
//! `recur` (N active recurring timers: disk, memory, fire rate); `scale` (the CPU one timer
//! costs the leader and a follower, under per-node CPU quotas: what sharding can buy).

mod consume;
mod fire;
mod life;
mod pending;
mod progress;
mod push;
mod recurring;
mod report;
mod scale;
mod scene;
mod target;
mod write;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, ValueEnum};

use report::{Machine, Results};
use target::Target;

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum Workload {
    Schedule,
    Batch,
    Fire,
    Burst,
    Failover,
    Pending,
    Keys,
    Naive,
    Push,
    Recur,
    Scale,
}

#[derive(Parser, Debug)]
#[command(name = "timerdb-bench", about = "Benchmarks a timerdb cluster")]
struct Args {
    /// Workloads to run, in this order (default: all but pending).
    #[arg(value_enum)]
    workloads: Vec<Workload>,
    /// Runs of every configuration; figures are their medians.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Measured window of the schedule and batch workloads, and the fire and failover streams.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    window: Duration,
    /// Closed-loop warm-up before each measured window.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// Concurrent Schedule calls, one configuration each.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64,200")]
    in_flight: Vec<usize>,
    /// ScheduleBatch sizes, one configuration each.
    #[arg(long, value_delimiter = ',', default_value = "100,1000,10000")]
    batch_sizes: Vec<usize>,
    /// Concurrent ScheduleBatch calls (also used by loaders).
    #[arg(long, default_value_t = 4)]
    batch_in_flight: usize,
    /// Fire rates (timers due per second), one configuration each.
    #[arg(long, value_delimiter = ',', default_value = "1000,20000,100000")]
    fire_rates: Vec<u64>,
    /// Push rates (timers due per second, pushed to a local HTTP receiver), one configuration
    /// each; compare with `fire` at the same rates (Subscribe).
    #[arg(long, value_delimiter = ',', default_value = "1000,20000")]
    push_rates: Vec<u64>,
    /// How far ahead of its fire time the fire producer schedules each timer.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    lead: Duration,
    /// Consumers (Subscribe streams) in the fire and burst workloads.
    #[arg(long, default_value_t = 2)]
    consumers: usize,
    /// Timers due in the same millisecond in the burst workload.
    #[arg(long, default_value_t = 1_000_000)]
    burst: u64,
    /// Timers due per second while the failover workload kills the leader.
    #[arg(long, default_value_t = 2_000)]
    failover_rate: u64,
    /// Timers of the keys workload (storage writes over a timer's whole life).
    #[arg(long, default_value_t = 100_000)]
    keys_timers: u64,
    /// Timers due per second for the naive consumer, one configuration each.
    #[arg(long, value_delimiter = ',', default_value = "500,5000")]
    naive_rates: Vec<u64>,
    /// How the fire, burst, failover and keys consumers ack: on the stream (Consume; needs a
    /// build that has it) or with AckBatch calls.
    #[arg(long, value_enum, default_value = "stream")]
    consumer_ack: consume::AckWith,
    /// How the naive consumer acks each delivery.
    #[arg(long, value_enum, default_value = "unary")]
    naive_ack: life::AckMode,
    /// Naive consumers (each its own connection and Subscribe stream, sharing the timers).
    #[arg(long, default_value_t = 2)]
    naive_consumers: usize,
    /// Recurring timers the recur workload creates (one configuration each).
    #[arg(long, value_delimiter = ',', default_value = "100000")]
    recur_recurring: Vec<u64>,
    /// The period of every series of the recur workload (N / period occurrences per second).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    recur_period: Duration,
    /// CPU quota of every timerd in the scale workload, in millicores (1000 = one core; 0 =
    /// no quota), one configuration each. Needs root and cgroup v1's cpu controller.
    #[arg(long, value_delimiter = ',', default_value = "0,250")]
    scale_quotas: Vec<u64>,
    /// Timers loaded by the pending workload.
    #[arg(long, default_value_t = 10_000_000)]
    pending: u64,
    /// Payload bytes per timer.
    #[arg(long, default_value_t = 32)]
    payload_bytes: usize,
    /// Timers per ScheduleBatch when loading (burst, failover, pending).
    #[arg(long, default_value_t = 10_000)]
    load_batch: usize,
    /// Write the results as JSON here too.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Use an existing cluster (client addresses) instead of starting one; failover and pending
    /// need the local cluster.
    #[arg(long, value_delimiter = ',')]
    connect: Vec<String>,
    /// The timerd binary (default: next to this binary).
    #[arg(long)]
    timerd: Option<PathBuf>,
    /// Compare with this older timerd: every configuration of every run is measured with it
    /// and with `--timerd`, one after the other, and the table shows both side by side. Its
    /// consumers ack with AckBatch and unary Ack (builds before Consume have nothing else).
    #[arg(long)]
    compare: Option<PathBuf>,
    /// Where local clusters keep their data dirs and logs (default: a temporary dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Measure the cost of security: every configuration of every run on a plain cluster and
    /// on one with client TLS + mTLS, peer mTLS and auth on (certificates in DIR, made by
    /// `scripts/certs.sh DIR --client chaos-client`), side by side.
    #[arg(long, value_name = "DIR")]
    secure: Option<PathBuf>,
}

/// What every workload reads.
#[derive(Clone)]
pub struct Opts {
    pub window: Duration,
    pub warmup: Duration,
    pub batch_in_flight: usize,
    pub lead: Duration,
    pub consumers: usize,
    pub payload_bytes: usize,
    pub load_batch: usize,
    pub naive_ack: life::AckMode,
    pub naive_consumers: usize,
    pub consumer_ack: consume::AckWith,
    pub recur_period: Duration,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    if let Err(e) = go(args).await {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

async fn go(mut args: Args) -> anyhow::Result<()> {
    if args.workloads.is_empty() {
        args.workloads = vec![
            Workload::Schedule,
            Workload::Batch,
            Workload::Fire,
            Workload::Burst,
            Workload::Failover,
            Workload::Keys,
            Workload::Naive,
        ];
    }
    let opts = Opts {
        window: args.window,
        warmup: args.warmup,
        batch_in_flight: args.batch_in_flight,
        lead: args.lead,
        consumers: args.consumers.max(1),
        payload_bytes: args.payload_bytes,
        load_batch: args.load_batch,
        naive_ack: args.naive_ack,
        naive_consumers: args.naive_consumers,
        consumer_ack: args.consumer_ack,
        recur_period: args.recur_period,
    };
    let timerd = timerdb_harness::process::timerd_path(args.timerd.as_deref())?;
    // The builds measured, in the order each run takes them: (label, timerd, options).
    let mut builds = vec![(String::new(), timerd.clone(), opts.clone(), None)];
    anyhow::ensure!(
        args.compare.is_none() || args.secure.is_none(),
        "--compare and --secure each make a side-by-side table: use one"
    );
    if let Some(dir) = &args.secure {
        let secure = timerdb_harness::secure::Secure::new(dir)?;
        builds = vec![
            ("plain".to_string(), timerd.clone(), opts.clone(), None),
            (
                "secure".to_string(),
                timerd.clone(),
                opts.clone(),
                Some(secure),
            ),
        ];
    }
    if let Some(old) = &args.compare {
        let old_opts = Opts {
            consumer_ack: consume::AckWith::Batch,
            naive_ack: life::AckMode::Unary,
            naive_consumers: 2,
            ..opts.clone()
        };
        builds = vec![
            ("old".to_string(), old.clone(), old_opts, None),
            ("new".to_string(), timerd.clone(), opts.clone(), None),
        ];
    }
    let base = args.dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("timerdb-bench-{}", std::process::id()))
    });
    let machine = Machine::probe(args.runs);
    println!(
        "timerdb-bench: {} cpus, {} GiB, {}; {} runs of each configuration",
        machine.cpus, machine.memory_gib, machine.cpu_model, args.runs
    );
    let mut results = Results::default();
    let mut n = 0;
    for run in 1..=args.runs {
        println!("run {run} of {}", args.runs);
        for (w, param) in configurations(&args) {
            for (label, timerd, opts, secure) in &builds {
                n += 1;
                let mut target = if args.connect.is_empty() {
                    anyhow::ensure!(timerd.exists(), "no timerd at {}", timerd.display());
                    let dir = base.join(format!("m{n}"));
                    // A cluster's data names its peers' addresses: one left by an earlier
                    // run would wait for peers on ports nobody listens on (no quorum).
                    anyhow::ensure!(
                        !dir.exists(),
                        "{} holds data of an earlier run: give --dir an empty directory",
                        dir.display()
                    );
                    Target::start(&dir, timerd, secure.clone()).await?
                } else {
                    Target::connect(&args.connect).await?
                };
                measure(&mut target, opts, label, w, param, &mut results)
                    .await
                    .with_context(|| format!("{w:?} {param} {label} (run {run})"))?;
                drop(target);
                if args.dir.is_none() {
                    let _ = std::fs::remove_dir_all(base.join(format!("m{n}")));
                }
            }
        }
    }
    if args.compare.is_some() {
        println!("\n{}", results.compare_table("old", "new"));
    } else if args.secure.is_some() {
        println!("\n{}", results.compare_table("plain", "secure"));
    } else {
        println!("\n{}", results.table());
    }
    if let Some(path) = &args.json {
        results.write_json(path, &machine)?;
        println!("results written to {}", path.display());
    }
    if args.dir.is_none() {
        let _ = std::fs::remove_dir_all(&base);
    }
    Ok(())
}

/// Every (workload, parameter) pair the arguments ask for, in order.
fn configurations(args: &Args) -> Vec<(Workload, u64)> {
    let mut out = Vec::new();
    for w in &args.workloads {
        let params: Vec<u64> = match w {
            Workload::Schedule => args.in_flight.iter().map(|n| *n as u64).collect(),
            Workload::Batch => args.batch_sizes.iter().map(|n| *n as u64).collect(),
            Workload::Fire => args.fire_rates.clone(),
            Workload::Burst => vec![args.burst],
            Workload::Failover => vec![args.failover_rate],
            Workload::Pending => vec![args.pending],
            Workload::Keys => vec![args.keys_timers],
            Workload::Naive => args.naive_rates.clone(),
            Workload::Push => args.push_rates.clone(),
            Workload::Recur => args.recur_recurring.clone(),
            Workload::Scale => args.scale_quotas.clone(),
        };
        out.extend(params.into_iter().map(|p| (*w, p)));
    }
    out
}

async fn measure(
    target: &mut Target,
    opts: &Opts,
    build: &str,
    w: Workload,
    p: u64,
    results: &mut Results,
) -> anyhow::Result<()> {
    match w {
        Workload::Schedule => {
            let mut rec = results.recorder_for(build, "schedule", format!("{p} in flight"));
            write::schedule(target, opts, p as usize, &mut rec).await
        }
        Workload::Batch => {
            let params = format!("{p} per call, {} in flight", opts.batch_in_flight);
            let mut rec = results.recorder_for(build, "batch", params);
            write::batch(target, opts, p as usize, &mut rec).await
        }
        Workload::Fire => {
            let params = format!("{p}/s for {}s", opts.window.as_secs());
            let mut rec = results.recorder_for(build, "fire", params);
            fire::fire(target, opts, p, &mut rec).await
        }
        Workload::Burst => {
            let mut rec = results.recorder_for(build, "burst", format!("{p} due at once"));
            fire::burst(target, opts, p, &mut rec).await
        }
        Workload::Failover => {
            let mut rec = results.recorder_for(build, "failover", format!("{p}/s, leader SIGKILL"));
            fire::failover(target, opts, p, &mut rec).await
        }
        Workload::Keys => {
            let mut rec = results.recorder_for(build, "keys", format!("{p} timers, whole life"));
            life::keys(target, opts, p, &mut rec).await
        }
        Workload::Naive => {
            // The ack mode is not in the parameters, so that two builds acking differently (an
            // old one has no Consume) line up; it is printed with every run.
            println!("  naive consumer acks: {:?}", opts.naive_ack);
            let params = format!("{p}/s");
            let mut rec = results.recorder_for(build, "naive", params);
            life::naive(target, opts, p, opts.naive_ack, &mut rec).await
        }
        Workload::Push => {
            let params = format!("{p}/s for {}s", opts.window.as_secs());
            let mut rec = results.recorder_for(build, "push", params);
            push::push(target, opts, p, &mut rec).await
        }
        Workload::Pending => {
            let mut rec = results.recorder_for(build, "pending", format!("{p} timers"));
            pending::pending(target, opts, p, &mut rec).await
        }
        Workload::Recur => {
            let period = opts.recur_period;
            let params = format!("{p} series every {}s", period.as_secs());
            let mut rec = results.recorder_for(build, "recur", params);
            recurring::recur(target, opts, p, period, &mut rec).await
        }
        Workload::Scale => scale::scale(target, opts, p, build, results).await,
    }
}
