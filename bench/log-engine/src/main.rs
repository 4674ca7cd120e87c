//! The log-engine benchmark (issue 34 part 2, docs/log-engine.md "RocksDB or raft-engine").
//!
//! One process runs one configuration — an engine, a number of Raft groups, an entry size —
//! and prints one JSON line; `scripts/log-engine-bench.sh` alternates the configurations and
//! takes medians. Each group is a task (on a runtime of 2 workers, as the node's) acting as a
//! Raft leader's log: it keeps `in_flight`
//! appends outstanding, each one entry of `entry_bytes`, and on each append's durability it
//! applies the entry (a state-machine write of the same size, unsynced, into RocksDB opened
//! with the node's own options) and, every 64 appends, purges its log to the last ~8 MiB.
//!
//! - `rocksdb`: timerdb's own [`LogEngine`]. Until 2026-11-28 it was the entry written
//!   unsynced into the node's one RocksDB (the state machine's writes sharing its WAL), then
//!   one syncer thread's `SyncWAL` answering every append queued before it; the figures in
//!   docs/log-engine.md are of that build. Since then its body is raft-engine (each append
//!   written unsynced, one synced write per syncer round), so this arm measures timerdb's
//!   wrapper against the bare engine below; the arm keeps its name for the recorded results.
//! - `raft-engine`: tikv's raft-engine as the log (one log stream for all groups): a syncer
//!   thread takes every append queued since its last round into one `LogBatch` and writes it
//!   with `sync = true`; the state machine is a separate RocksDB, as a node would then have.
//!
//! Measured: appends/s, append → durable latency (p50, p99, max), fsync rounds per second,
//! bytes the process wrote to disk per byte appended (`/proc/self/io`), RSS at the end, and the
//! time to open the log again and find every group's last index (a restart).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use protobuf::well_known_types::BytesValue;
use raft_engine::{Config, Engine, LogBatch, MessageExt, ReadableSize};
use rocksdb::DB;
use timerdb::storage::{open_db, IndexGc, LogEngine};

#[derive(Clone, Copy, Debug, PartialEq, ValueEnum)]
enum Kind {
    Rocksdb,
    RaftEngine,
}

#[derive(Parser, Debug)]
struct Args {
    #[arg(long, value_enum)]
    engine: Kind,
    #[arg(long, default_value_t = 1)]
    groups: u32,
    /// Bytes of each entry (a Fire entry ~200 B; a ScheduleBatch of 10,000 timers ~1 MiB).
    #[arg(long, default_value_t = 256)]
    entry_bytes: usize,
    /// Appends each group keeps outstanding (a leader pipelines its appends).
    #[arg(long, default_value_t = 4)]
    in_flight: usize,
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// The runtime's worker threads (the node runs one per core: 2 here).
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// An empty directory for the data (removed afterwards).
    #[arg(long)]
    dir: PathBuf,
}

/// What an append's durability calls (it hands its writer the time the append was made).
type Done = Box<dyn FnOnce() + Send>;

/// What the two engines offer a group's writer.
trait Log: Send + Sync {
    /// Makes `group`'s entry `index` durable, then calls `done` (from another thread).
    fn append(&self, group: u32, index: u64, bytes: &[u8], done: Done);
    /// Drops `group`'s entries up to `upto`.
    fn purge(&self, group: u32, upto: u64);
    /// Fsync rounds so far.
    fn fsyncs(&self) -> u64;
}

struct Rocks {
    engine: Arc<LogEngine>,
}

impl Log for Rocks {
    fn append(&self, group: u32, index: u64, bytes: &[u8], done: Done) {
        self.engine.write(group, [(index, bytes)]).expect("write");
        self.engine
            .when_durable(Box::new(move |r| {
                r.expect("fsync");
                done()
            }))
            .expect("queue");
    }
    fn purge(&self, group: u32, upto: u64) {
        self.engine.purge(group, upto, b"-").expect("purge");
    }
    fn fsyncs(&self) -> u64 {
        self.engine.fsyncs()
    }
}

/// raft-engine's entries are protobuf messages: the index in the first 8 bytes of a BytesValue.
struct Raw;

impl MessageExt for Raw {
    type Entry = BytesValue;
    fn index(e: &BytesValue) -> u64 {
        u64::from_le_bytes(e.value[..8].try_into().expect("an indexed entry"))
    }
}

fn raw_entry(index: u64, bytes: &[u8]) -> BytesValue {
    let mut value = Vec::with_capacity(8 + bytes.len());
    value.extend_from_slice(&index.to_le_bytes());
    value.extend_from_slice(bytes);
    let mut e = BytesValue::new();
    e.value = value;
    e
}

struct RaftEng {
    engine: Arc<Engine>,
    queue: Mutex<Option<mpsc::Sender<(u32, BytesValue, Done)>>>,
    rounds: Arc<AtomicU64>,
    syncer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl RaftEng {
    fn open(dir: &Path) -> Arc<RaftEng> {
        let engine = Arc::new(open_raft_engine(dir));
        let (tx, rx) = mpsc::channel::<(u32, BytesValue, Done)>();
        let rounds = Arc::new(AtomicU64::new(0));
        let (e, n) = (engine.clone(), rounds.clone());
        let syncer = std::thread::spawn(move || {
            let mut last_purge = Instant::now();
            while let Ok(first) = rx.recv() {
                let mut round = vec![first];
                round.extend(rx.try_iter());
                let mut batch = LogBatch::with_capacity(round.len());
                let mut dones = Vec::with_capacity(round.len());
                for (group, entry, done) in round {
                    batch
                        .add_entries::<Raw>(group as u64, &[entry])
                        .expect("add entries");
                    dones.push(done);
                }
                e.write(&mut batch, true).expect("raft-engine write");
                n.fetch_add(1, Ordering::Relaxed);
                for done in dones {
                    done();
                }
                // Files whose entries every group compacted are removed here (raft-engine does
                // not purge on its own).
                if last_purge.elapsed() > Duration::from_secs(1) {
                    e.purge_expired_files().expect("purge files");
                    last_purge = Instant::now();
                }
            }
        });
        Arc::new(RaftEng {
            engine,
            queue: Mutex::new(Some(tx)),
            rounds,
            syncer: Mutex::new(Some(syncer)),
        })
    }

    fn close(&self) {
        drop(self.queue.lock().unwrap().take());
        if let Some(t) = self.syncer.lock().unwrap().take() {
            t.join().unwrap();
        }
    }
}

fn open_raft_engine(dir: &Path) -> Engine {
    let cfg = Config {
        dir: dir.to_string_lossy().into_owned(),
        // The node's RocksDB compresses nothing in its WAL either.
        batch_compression_threshold: ReadableSize(0),
        ..Default::default()
    };
    Engine::open(cfg).expect("open raft-engine")
}

impl Log for RaftEng {
    fn append(&self, group: u32, index: u64, bytes: &[u8], done: Done) {
        let queue = self.queue.lock().unwrap();
        queue
            .as_ref()
            .expect("open")
            .send((group, raw_entry(index, bytes), done))
            .expect("syncer running");
    }
    fn purge(&self, group: u32, upto: u64) {
        self.engine.compact_to(group as u64, upto + 1);
    }
    fn fsyncs(&self) -> u64 {
        self.rounds.load(Ordering::Relaxed)
    }
}

/// The process's bytes written to storage so far (`/proc/self/io`, `write_bytes`).
fn written_bytes() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    io.lines()
        .find_map(|l| l.strip_prefix("write_bytes: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Resident memory in KiB: now, and the peak.
fn rss_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// One group's writer, a task as a group's Raft core is (on a runtime of as many workers as
/// the node has cores): `in_flight` appends outstanding; each durable one is applied (a
/// state-machine write of the same size) and timed. Its engine calls run inline, as
/// `LogStore::append` runs in openraft's task.
async fn writer(
    group: u32,
    log: Arc<dyn Log>,
    state: Arc<DB>,
    args: Arc<Args>,
    stop: Arc<AtomicBool>,
    payload: Arc<Vec<u8>>,
) -> (Histogram<u64>, u64) {
    let mut hist = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let keep = ((8 << 20) / args.entry_bytes.max(1)).max(4) as u64;
    let wheel = state.cf_handle("wheel").expect("the wheel family");
    let (mut next, mut outstanding, mut appended) = (1u64, 0usize, 0u64);
    loop {
        while outstanding < args.in_flight && !stop.load(Ordering::Relaxed) {
            let tx = tx.clone();
            let submitted = Instant::now();
            log.append(
                group,
                next,
                &payload,
                Box::new(move || {
                    let _ = tx.send(submitted);
                }),
            );
            next += 1;
            outstanding += 1;
        }
        if outstanding == 0 {
            break;
        }
        let submitted = rx.recv().await.expect("an append answered");
        outstanding -= 1;
        appended += 1;
        hist.saturating_record(submitted.elapsed().as_micros() as u64);
        // Applied: a state-machine write beside the log (rotating keys: it overwrites).
        let mut key = group.to_be_bytes().to_vec();
        key.extend_from_slice(&(appended % 1024).to_be_bytes());
        state.put_cf(wheel, key, &payload[..]).expect("apply");
        if appended % 64 == 0 && appended > keep {
            log.purge(group, appended - keep);
        }
    }
    (hist, appended)
}

fn main() -> anyhow::Result<()> {
    let args = Arc::new(Args::parse());
    std::fs::create_dir_all(&args.dir)?;
    let gc = IndexGc::new();
    // The state machine: for `rocksdb` the same database as the log (one WAL), for
    // `raft-engine` its own.
    let state = open_db(&args.dir.join("node"), &gc)?;
    let engine_dir = args.dir.join("raft-engine");
    // Both handles kept apart from `log` to close them before the restart.
    let (mut rocks, mut raft) = (None, None);
    let log: Arc<dyn Log> = match args.engine {
        Kind::Rocksdb => {
            let engine = LogEngine::open(state.clone())?;
            rocks = Some(engine.clone());
            Arc::new(Rocks { engine })
        }
        Kind::RaftEngine => {
            let engine = RaftEng::open(&engine_dir);
            raft = Some(engine.clone());
            engine
        }
    };
    let mut payload = vec![0u8; args.entry_bytes];
    rand::fill(&mut payload[..]);
    let payload = Arc::new(payload);

    let stop = Arc::new(AtomicBool::new(false));
    let (written0, fsyncs0, started) = (written_bytes(), log.fsyncs(), Instant::now());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.workers)
        .enable_all()
        .build()?;
    let writers: Vec<_> = (0..args.groups)
        .map(|g| {
            let (log, state, args, stop, payload) = (
                log.clone(),
                state.clone(),
                args.clone(),
                stop.clone(),
                payload.clone(),
            );
            runtime.spawn(writer(g, log, state, args, stop, payload))
        })
        .collect();
    std::thread::sleep(Duration::from_secs(args.seconds));
    stop.store(true, Ordering::Relaxed);
    let mut hist = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).unwrap();
    let mut appends = 0;
    for w in writers {
        let (h, n) = runtime.block_on(w).expect("writer");
        hist.add(&h).unwrap();
        appends += n;
    }
    let secs = started.elapsed().as_secs_f64();
    let fsyncs = log.fsyncs() - fsyncs0;
    let (rss, hwm) = rss_kib();
    let appended_bytes = appends * args.entry_bytes as u64;
    let written = written_bytes() - written0;

    // Restart: everything closed, then the log opened again and each group's last index found.
    drop(log);
    if let Some(raft) = raft.take() {
        raft.close();
    }
    drop(rocks.take());
    drop(state);
    let restart = Instant::now();
    let found = match args.engine {
        Kind::Rocksdb => {
            let db = open_db(&args.dir.join("node"), &gc)?;
            let engine = LogEngine::open(db)?;
            (0..args.groups)
                .filter(|g| engine.last(*g).ok().flatten().is_some())
                .count()
        }
        Kind::RaftEngine => {
            let _state = open_db(&args.dir.join("node"), &gc)?;
            let engine = open_raft_engine(&engine_dir);
            (0..args.groups)
                .filter(|g| engine.last_index(*g as u64).is_some())
                .count()
        }
    };
    let restart_ms = restart.elapsed().as_secs_f64() * 1000.0;
    let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "{{\"engine\":\"{:?}\",\"groups\":{},\"entry_bytes\":{},\"in_flight\":{},\"seconds\":{:.2},\
         \"appends_per_s\":{:.0},\"mb_per_s\":{:.2},\"p50_ms\":{:.2},\"p99_ms\":{:.2},\
         \"max_ms\":{:.2},\"fsyncs_per_s\":{:.1},\"written_per_appended\":{:.2},\
         \"rss_mib\":{},\"peak_rss_mib\":{},\"restart_ms\":{:.0},\"groups_found\":{}}}",
        args.engine,
        args.groups,
        args.entry_bytes,
        args.in_flight,
        secs,
        appends as f64 / secs,
        appended_bytes as f64 / secs / 1e6,
        ms(0.5),
        ms(0.99),
        hist.max() as f64 / 1000.0,
        fsyncs as f64 / secs,
        written as f64 / appended_bytes.max(1) as f64,
        rss / 1024,
        hwm / 1024,
        restart_ms,
        found,
    );
    let _ = std::fs::remove_dir_all(&args.dir);
    Ok(())
}
