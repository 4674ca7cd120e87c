//! `timerdb-chaos`: drives three real `timerd` processes with client load while injecting faults
//! from a seeded plan, records a history, and checks timerdb's guarantees against it.
//!
//! A run: start the cluster (every peer link through a fault-injecting proxy, node 3 on a tmpfs),
//! run workers (schedule, batch, cancel, reschedule, get on random nodes) and two consumers
//! (subscribe + ack), inject the plan's faults (SIGKILL, SIGSTOP, partitions, delay, dropped
//! connections, clock skew, disk full), heal, wait until every timer fired and was acked, then
//! check (see `checker`). `--prove` instead runs the cluster with each deliberate bug of
//! `config::Faults` and fails unless the checker catches every one.
//!
//! Exit status: 0 when every run is clean (or, with --prove, every bug was caught), 1 otherwise.

mod plan;
mod push;
mod recurring;
mod report;
mod run;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;

use plan::Mix;
use run::RunConfig;

#[derive(Parser, Debug)]
#[command(
    name = "timerdb-chaos",
    about = "Chaos runs against a real timerdb cluster"
)]
struct Args {
    /// Seed of the first run's fault plan; run i uses seed + i.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// How many runs.
    #[arg(long, default_value_t = 1)]
    runs: u64,
    /// Keep starting runs until this many minutes have passed (instead of --runs).
    #[arg(long)]
    minutes: Option<u64>,
    /// Length of each run's fault phase (healing and checking come after).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    run_length: Duration,
    /// The timerd binary (default: next to this binary).
    #[arg(long)]
    timerd: Option<PathBuf>,
    /// Where runs keep their data dirs and node logs (default: a temporary dir, kept on failure).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Concurrent client workers.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Skip the disk-full fault (no tmpfs).
    #[arg(long)]
    no_disk: bool,
    /// Prove the checker: one run per deliberate bug, each must be caught.
    #[arg(long)]
    prove: bool,
    /// Run with TLS, client mTLS, peer mTLS and auth on, with the certificates in DIR (made by
    /// `scripts/certs.sh DIR --client chaos-client`).
    #[arg(long, value_name = "DIR")]
    secure: Option<PathBuf>,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let code = match go(args).await {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) => {
            eprintln!("error: {e:#}");
            2
        }
    };
    std::process::exit(code);
}

async fn go(args: Args) -> anyhow::Result<bool> {
    let timerd = timerdb_harness::process::timerd_path(args.timerd.as_deref())?;
    anyhow::ensure!(timerd.exists(), "no timerd at {}", timerd.display());
    let base = args.dir.clone().unwrap_or_else(|| {
        let stamp = timerdb_harness::workload::now_ms();
        std::env::temp_dir().join(format!("timerdb-chaos-{}-{stamp}", std::process::id()))
    });
    if let Some(dir) = &args.secure {
        println!(
            "secure runs: client TLS + mTLS, peer mTLS (members only), auth on with keys ({})",
            dir.display()
        );
    }
    let ok = if args.prove {
        prove(&args, &timerd, &base).await?
    } else {
        soak(&args, &timerd, &base).await?
    };
    if ok && args.dir.is_none() {
        let _ = std::fs::remove_dir_all(&base);
    } else if !ok {
        // The node logs and data dirs of a failed run stay for the post-mortem.
        println!("data dirs and node logs kept in {}", base.display());
    }
    Ok(ok)
}

fn secure(args: &Args) -> anyhow::Result<Option<timerdb_harness::secure::Secure>> {
    args.secure
        .as_deref()
        .map(timerdb_harness::secure::Secure::new)
        .transpose()
}

async fn soak(
    args: &Args,
    timerd: &std::path::Path,
    base: &std::path::Path,
) -> anyhow::Result<bool> {
    let started = Instant::now();
    let mut totals = report::Totals::default();
    for i in 0.. {
        let more = match args.minutes {
            Some(m) => started.elapsed() < Duration::from_secs(m * 60),
            None => i < args.runs,
        };
        if !more {
            break;
        }
        let cfg = RunConfig {
            seed: args.seed + i,
            length: args.run_length,
            timerd: timerd.to_path_buf(),
            dir: base.join(format!("run-{}", args.seed + i)),
            fault: String::new(),
            mix: Mix::All {
                disk: !args.no_disk,
            },
            workers: args.workers,
            tmpfs: !args.no_disk,
            secure: secure(args)?,
        };
        let report = run::run(&cfg).await?;
        totals.add(&report);
        if report.findings.violations.is_empty() && args.dir.is_none() {
            let _ = std::fs::remove_dir_all(&cfg.dir);
        }
    }
    totals.print();
    Ok(totals.violations == 0)
}

/// Each deliberate bug, the plan that exposes it, the workers it needs, and the violation that
/// must be reported. Isolation exposes ack-before-commit; many workers make sure that several
/// schedules reach the isolated leader (a worker waits out each call it sends there that is not
/// a Schedule).
const PROOFS: [(&str, Mix, usize, &str); 3] = [
    (
        "ignore-cancel",
        Mix::Calm,
        4,
        "fire after acknowledged cancel",
    ),
    ("fire-early", Mix::Calm, 4, "early"),
    (
        "ack-before-commit",
        Mix::IsolateLeader,
        16,
        "lost acknowledged schedule",
    ),
];

async fn prove(
    args: &Args,
    timerd: &std::path::Path,
    base: &std::path::Path,
) -> anyhow::Result<bool> {
    let mut all = true;
    for (i, (fault, mix, workers, expected)) in PROOFS.into_iter().enumerate() {
        let cfg = RunConfig {
            seed: args.seed + i as u64,
            length: args.run_length,
            timerd: timerd.to_path_buf(),
            dir: base.join(format!("prove-{fault}")),
            fault: fault.to_string(),
            mix,
            workers: workers.max(args.workers),
            tmpfs: false,
            secure: secure(args)?,
        };
        let report = run::run(&cfg).await?;
        report::Totals::default().add(&report);
        let v = &report.findings.violations;
        let caught = v.iter().filter(|v| v.kind == expected).count();
        println!(
            "bug {fault}: {} violation(s), {caught} of them \"{expected}\": {}",
            v.len(),
            if caught > 0 { "CAUGHT" } else { "MISSED" }
        );
        if let Some(first) = v.iter().find(|v| v.kind == expected) {
            println!("  e.g. {}", first.detail);
        }
        all &= caught > 0;
    }
    Ok(all)
}
