//! `timerdb-sim`: the deterministic simulation of a whole cluster (docs/guarantees.md,
//! "The simulator").
//!
//! Each seed runs three real nodes — openraft, the state machine on RocksDB (tmpfs), the gRPC
//! servers with forwarding, auth and transcoding layers, the leader's workers — and the chaos
//! harness's clients and consumers, in this process, on one current-thread tokio runtime whose
//! time is paused and whose scheduler is seeded (`timerdb::sim` has the seams). Faults come
//! from the seed: crashes and restarts (the data directory reopened), isolated nodes, slow
//! links, clock skew (a node restarted with an offset). After the faults heal and the cluster
//! has gone quiet, the chaos checker's rules judge the history, the final state and the
//! replicas' digests. A failing seed replays the same history: `timerdb-sim --seed N`.
//!
//!   timerdb-sim [--seeds N] [--first S] [--minutes M] [--seed S] [--jobs J] [--plant BUG]
//!   timerdb-sim --prove [--seeds N]      every planted bug, until a seed catches it

mod faults;
mod load;
mod scenario;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;

#[derive(Parser, Debug)]
#[command(
    name = "timerdb-sim",
    about = "Deterministic simulation of a timerdb cluster"
)]
struct Args {
    /// Seeds to run (from --first on).
    #[arg(long, default_value_t = 20)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 1)]
    first: u64,
    /// Run seeds until this many minutes have passed instead of a count.
    #[arg(long)]
    minutes: Option<f64>,
    /// Run this one seed, print its history, and say whether it passed.
    #[arg(long)]
    seed: Option<u64>,
    /// Threads running seeds side by side.
    #[arg(long, default_value_t = 2)]
    jobs: usize,
    /// Run every n-th seed twice and fail if the two histories differ (0: never).
    #[arg(long, default_value_t = 10)]
    twice_every: u64,
    /// Simulated seconds of load and faults per seed.
    #[arg(long, default_value_t = 12)]
    load_secs: u64,
    /// Plant a bug in the simulated cluster (the run must then fail): see `scenario::Plant`.
    #[arg(long)]
    plant: Option<String>,
    /// Plant each known bug in turn and run seeds (from --first, at most --seeds of them)
    /// until one fails: every planted bug must be caught.
    #[arg(long)]
    prove: bool,
    /// Where the data directories go (tmpfs).
    #[arg(long, default_value = "/dev/shm/timerdb-sim")]
    dir: std::path::PathBuf,
}

/// Log lines stamped with the simulated clock (ms since the seed's epoch), the time that
/// orders a simulation's events.
struct SimTime;

impl tracing_subscriber::fmt::time::FormatTime for SimTime {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        match timerdb::sim::now_ms() {
            Some(ms) => write!(w, "{:>9.3}", (ms % 1_000_000) as f64 / 1000.0),
            None => write!(w, "        -"),
        }
    }
}

fn main() {
    let args = Args::parse();
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .with_timer(SimTime)
            .with_ansi(false)
            .init();
    }
    let plant = match args
        .plant
        .as_deref()
        .map(scenario::Plant::parse)
        .transpose()
    {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let base = args.dir.join(format!("{}", std::process::id()));
    let setup = scenario::Setup {
        load: Duration::from_secs(args.load_secs),
        plant,
    };
    if let Some(seed) = args.seed {
        let out = scenario::run_seed(seed, &base, &setup, true);
        let _ = std::fs::remove_dir_all(&base);
        println!("{}", out.summary(seed));
        std::process::exit(if out.failed() { 1 } else { 0 });
    }
    if args.prove {
        prove(&args, &base);
        return;
    }
    let started = Instant::now();
    let budget = args.minutes.map(|m| Duration::from_secs_f64(m * 60.0));
    let run = Run {
        first: args.first,
        seeds: args.seeds,
        budget,
        jobs: args.jobs,
        twice_every: args.twice_every,
        until_failure: false,
    };
    let results = run.go(&base, &setup);
    let _ = std::fs::remove_dir_all(&base);
    let elapsed = started.elapsed();
    let failed: Vec<u64> = results
        .iter()
        .filter(|(_, o)| o.failed())
        .map(|(s, _)| *s)
        .collect();
    let per_minute = results.len() as f64 / elapsed.as_secs_f64() * 60.0;
    let sim_secs: f64 = results.iter().map(|(_, o)| o.simulated.as_secs_f64()).sum();
    println!(
        "timerdb-sim: {} seeds in {:.1} s ({per_minute:.0} seeds/minute, {:.0} simulated s), {} failed{}",
        results.len(),
        elapsed.as_secs_f64(),
        sim_secs,
        failed.len(),
        if failed.is_empty() {
            String::new()
        } else {
            format!(": replay with timerdb-sim --seed {:?}", failed)
        }
    );
    if setup.plant.is_some() {
        // A planted bug must be caught: the run passes only if some seed failed.
        if failed.is_empty() {
            println!("PLANTED BUG NOT CAUGHT");
            std::process::exit(1);
        }
        println!(
            "planted bug caught by {} of {} seeds",
            failed.len(),
            results.len()
        );
        return;
    }
    if !failed.is_empty() {
        std::process::exit(1);
    }
}

/// How long one seed may take in wall time (a seed takes ~2 s; a busy machine, ten).
const SEED_WALL_LIMIT: Duration = Duration::from_secs(180);

/// Seeds to run, side by side.
struct Run {
    first: u64,
    seeds: u64,
    budget: Option<Duration>,
    jobs: usize,
    twice_every: u64,
    /// Stop at the first seed that fails.
    until_failure: bool,
}

impl Run {
    /// Every seed's outcome, in the order they finished.
    fn go(
        &self,
        base: &std::path::Path,
        setup: &scenario::Setup,
    ) -> Vec<(u64, scenario::SeedOutcome)> {
        let started = Instant::now();
        let next = AtomicU64::new(self.first);
        let failed = AtomicBool::new(false);
        let last = self.first + self.seeds;
        let results = std::sync::Mutex::new(Vec::new());
        // Seed → when it started, for the watchdog.
        let running = std::sync::Mutex::new(std::collections::BTreeMap::new());
        let finished = AtomicBool::new(false);
        std::thread::scope(|s| {
            // A seed whose simulated time stands still (a task that never waits: a livelock)
            // would run for ever; it fails the run instead, with its seed to replay.
            s.spawn(|| {
                while !finished.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(200));
                    let stuck = running
                        .lock()
                        .unwrap()
                        .iter()
                        .find(|(_, at): &(&u64, &Instant)| at.elapsed() > SEED_WALL_LIMIT)
                        .map(|(seed, _)| *seed);
                    if let Some(seed) = stuck {
                        println!(
                            "seed {seed}: FAILED (not finished after {SEED_WALL_LIMIT:?} of wall \
                             time: simulated time stands still, some task never waits); replay \
                             with timerdb-sim --seed {seed} (RUST_LOG=debug shows the loop)"
                        );
                        std::process::exit(1);
                    }
                }
            });
            let workers: Vec<_> = (0..self.jobs.max(1)).map(|_| s.spawn(|| loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    let over = match self.budget {
                        Some(b) => started.elapsed() >= b,
                        None => seed >= last,
                    };
                    if over || (self.until_failure && failed.load(Ordering::Relaxed)) {
                        return;
                    }
                    running.lock().unwrap().insert(seed, Instant::now());
                    let mut out = scenario::run_seed(seed, base, setup, false);
                    let twice = self.twice_every > 0 && seed.is_multiple_of(self.twice_every);
                    if twice && !out.failed() {
                        let again = scenario::run_seed(seed, base, setup, false);
                        if again.history_hash != out.history_hash {
                            out.violations.push(format!(
                                "not deterministic: the same seed gave histories {:016x} and {:016x}",
                                out.history_hash, again.history_hash
                            ));
                        }
                    }
                    running.lock().unwrap().remove(&seed);
                    if out.failed() {
                        failed.store(true, Ordering::Relaxed);
                    }
                    println!("{}", out.summary(seed));
                    results.lock().unwrap().push((seed, out));
                })).collect();
            for w in workers {
                let _ = w.join();
            }
            finished.store(true, Ordering::Relaxed);
        });
        results.into_inner().unwrap()
    }
}

/// Plants each known bug and runs seeds until one fails; exits non-zero if a bug is not caught.
/// The seeds are the same on every run (from --first), so which seed catches each bug is too.
fn prove(args: &Args, base: &std::path::Path) {
    let mut missed = Vec::new();
    for name in scenario::Plant::KNOWN {
        let setup = scenario::Setup {
            load: Duration::from_secs(args.load_secs),
            plant: Some(scenario::Plant(name)),
        };
        let run = Run {
            first: args.first,
            seeds: args.seeds,
            budget: None,
            jobs: args.jobs,
            twice_every: 0,
            until_failure: true,
        };
        let started = Instant::now();
        let results = run.go(base, &setup);
        let caught: Vec<u64> = results
            .iter()
            .filter(|(_, o)| o.failed())
            .map(|(s, _)| *s)
            .collect();
        match caught.iter().min() {
            Some(seed) => println!(
                "planted {name}: caught by seed {seed} ({} seeds run, {:.0} s)",
                results.len(),
                started.elapsed().as_secs_f64()
            ),
            None => {
                println!("planted {name}: NOT CAUGHT by {} seeds", results.len());
                missed.push(name);
            }
        }
    }
    let _ = std::fs::remove_dir_all(base);
    if !missed.is_empty() {
        println!(
            "timerdb-sim --prove: planted bugs not caught: {}",
            missed.join(", ")
        );
        std::process::exit(1);
    }
    println!("timerdb-sim --prove: every planted bug was caught");
}
