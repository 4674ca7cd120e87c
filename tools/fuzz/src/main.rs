//! `timerdb-fuzz`: fuzzing on the stable toolchain (docs/security.md, "Fuzzing").
//!
//! No nightly compiler can be installed here, so not libFuzzer: a mutation loop in plain Rust.
//! For each target (`targets.rs`) it starts from the committed corpus (`fuzz/corpus/<target>/`)
//! and seeds of valid inputs, and runs mutants of them (bit flips, byte sets, insertions,
//! deletions, truncations, splices, interesting integers, fresh random bytes) for its share of
//! the time. A panic, or a broken invariant the target checks, is a finding: the input is saved
//! to `fuzz/findings/<target>/` and the run fails. An abort (an allocation the size of a
//! length prefix, say) kills the process, which fails the run too: the script reports it.
//!
//! There is no coverage instrumentation on stable, so the guidance is coarse: an input whose
//! outcome class (a short description of what the target did with it, e.g. the first words of
//! the error) was never seen is kept in the corpus (`--save`), so later mutants start from it.
//!
//!   timerdb-fuzz [--seconds N] [--target T]... [--save] [--seed S]

mod apply;
mod program;
mod targets;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Parser, Debug)]
#[command(
    name = "timerdb-fuzz",
    about = "Mutation fuzzing of timerdb's decoders and apply"
)]
struct Args {
    /// Total time, shared evenly by the targets.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Only these targets (peer, backup, convert, apply); default all.
    #[arg(long = "target")]
    targets: Vec<String>,
    /// Keep inputs with a new outcome class in the corpus directory.
    #[arg(long)]
    save: bool,
    /// Random seed (default: from the clock; printed, so a run can be repeated).
    #[arg(long)]
    seed: Option<u64>,
    /// The corpus and findings live under this directory.
    #[arg(long, default_value = "fuzz")]
    dir: PathBuf,
    /// Runs this one input (a saved finding) on the target and prints what it is and what
    /// the target said, instead of fuzzing.
    #[arg(long)]
    explain: Option<PathBuf>,
}

/// A directory of its own under the system's temp dir, removed when dropped.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new() -> Result<Scratch, String> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("timerdb-fuzz-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        Ok(Scratch(dir))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Most outcome classes one target keeps inputs for.
const MAX_CLASSES: usize = 512;

/// Integers that break length and bound checks.
const INTERESTING: [u64; 10] = [
    0,
    1,
    0x7f,
    0x80,
    0xff,
    0xfb,
    0xfd,
    u32::MAX as u64,
    1 << 40,
    u64::MAX,
];

fn mutate(rng: &mut StdRng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..rng.random_range(1..=4) {
        let len = out.len();
        match rng.random_range(0..9) {
            0 if len > 0 => {
                let i = rng.random_range(0..len);
                out[i] ^= 1 << rng.random_range(0..8);
            }
            1 if len > 0 => {
                let i = rng.random_range(0..len);
                out[i] = rng.random();
            }
            2 => {
                let i = rng.random_range(0..=len);
                let n = rng.random_range(1..16);
                let bytes: Vec<u8> = (0..n).map(|_| rng.random()).collect();
                out.splice(i..i, bytes);
            }
            3 if len > 0 => {
                let i = rng.random_range(0..len);
                let n = rng.random_range(1..=(len - i).min(32));
                out.drain(i..i + n);
            }
            4 if len > 0 => out.truncate(rng.random_range(0..len)),
            5 if !other.is_empty() => {
                let cut = rng.random_range(0..=out.len());
                let from = rng.random_range(0..other.len());
                out.truncate(cut);
                out.extend_from_slice(&other[from..]);
            }
            6 => {
                let v = INTERESTING[rng.random_range(0..INTERESTING.len())];
                let width = [1usize, 4, 8][rng.random_range(0..3)];
                let i = rng.random_range(0..=len);
                let bytes = &v.to_le_bytes()[..width];
                out.splice(i..(i + width).min(len), bytes.iter().copied());
            }
            7 if len > 1 => {
                let (a, b) = (rng.random_range(0..len), rng.random_range(0..len));
                out.swap(a, b);
            }
            _ => {
                let n = rng.random_range(0..256);
                out = (0..n).map(|_| rng.random()).collect();
            }
        }
    }
    out.truncate(1 << 16);
    out
}

fn read_corpus(dir: &Path) -> Vec<Vec<u8>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    files.sort();
    files.iter().filter_map(|p| std::fs::read(p).ok()).collect()
}

fn name_of(input: &[u8]) -> String {
    // FNV-1a: a stable file name per content.
    let h = input.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    });
    format!("{h:016x}")
}

struct Report {
    execs: u64,
    classes: usize,
    kept: usize,
    findings: Vec<String>,
}

fn fuzz(target: &str, budget: Duration, rng: &mut StdRng, args: &Args) -> Report {
    let corpus_dir = args.dir.join("corpus").join(target);
    let mut corpus = read_corpus(&corpus_dir);
    corpus.extend(targets::seeds(target));
    if corpus.is_empty() {
        corpus.push(Vec::new());
    }
    let mut seen = HashSet::new();
    let mut report = Report {
        execs: 0,
        classes: 0,
        kept: 0,
        findings: Vec::new(),
    };
    let started = Instant::now();
    let mut i = 0usize;
    while started.elapsed() < budget {
        // The corpus itself first, then mutants.
        let input = if i < corpus.len() {
            corpus[i].clone()
        } else {
            let a = &corpus[rng.random_range(0..corpus.len())];
            let b = &corpus[rng.random_range(0..corpus.len())];
            mutate(rng, a, b)
        };
        i += 1;
        report.execs += 1;
        let verdict = std::panic::catch_unwind(|| targets::run(target, &input));
        let class = match verdict {
            Ok(Ok(class)) => class,
            Ok(Err(broken)) => {
                report
                    .findings
                    .push(save_finding(args, target, &input, &broken));
                continue;
            }
            Err(panic) => {
                let why = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "a panic".into());
                report
                    .findings
                    .push(save_finding(args, target, &input, &format!("panic: {why}")));
                continue;
            }
        };
        if std::env::var_os("TIMERDB_FUZZ_SHOW").is_some() && !seen.contains(&class) {
            eprintln!("{target}: new class {class:?}");
        }
        // Capped: an error that repeats a word of the input makes classes without end (a
        // 15-minute run kept 1.3 million inputs before the cap).
        if seen.len() < MAX_CLASSES && seen.insert(class) && i > corpus.len() {
            corpus.push(input.clone());
            report.kept += 1;
            if args.save {
                let _ = std::fs::create_dir_all(&corpus_dir);
                let _ = std::fs::write(corpus_dir.join(name_of(&input)), &input);
            }
        }
    }
    report.classes = seen.len();
    report
}

fn save_finding(args: &Args, target: &str, input: &[u8], why: &str) -> String {
    let dir = args.dir.join("findings").join(target);
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join(name_of(input));
    let _ = std::fs::write(&path, input);
    let why: String = why.chars().take(300).collect();
    format!("{target}: {why} (input saved to {})", path.display())
}

fn main() {
    let args = Args::parse();
    if let Some(path) = &args.explain {
        let target = args.targets.first().map_or("apply", String::as_str);
        let input = std::fs::read(path).unwrap_or_else(|e| {
            eprintln!("{}: {e}", path.display());
            std::process::exit(2);
        });
        if target == "apply" {
            for (i, step) in program::steps(&input).iter().enumerate() {
                println!("{i:>3} {step:?}");
            }
        }
        match targets::run(target, &input) {
            Ok(class) => println!("{target}: ok ({class})"),
            Err(broken) => {
                println!("{target}: BROKEN: {broken}");
                std::process::exit(1);
            }
        }
        return;
    }
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let chosen: Vec<String> = if args.targets.is_empty() {
        targets::TARGETS.iter().map(|t| t.to_string()).collect()
    } else {
        args.targets.clone()
    };
    for t in &chosen {
        if !targets::TARGETS.contains(&t.as_str()) {
            eprintln!("no target {t}; the targets are {:?}", targets::TARGETS);
            std::process::exit(2);
        }
    }
    // Findings are reported, not printed as they happen.
    std::panic::set_hook(Box::new(|_| {}));
    let share = Duration::from_secs(args.seconds.max(1)) / chosen.len() as u32;
    println!("timerdb-fuzz: seed {seed}, {share:?} per target");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut findings = Vec::new();
    for t in &chosen {
        let r = fuzz(t, share, &mut rng, &args);
        println!(
            "{t:>8}: {:>9} executions, {:>4} outcome classes, {:>3} inputs kept, {} findings",
            r.execs,
            r.classes,
            r.kept,
            r.findings.len()
        );
        findings.extend(r.findings);
    }
    if !findings.is_empty() {
        findings.dedup();
        for f in findings.iter().take(20) {
            println!("FINDING {f}");
        }
        std::process::exit(1);
    }
}
