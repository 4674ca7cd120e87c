//! `timerdb-harness`: the one place that starts timerdb clusters for everything that is not
//! the server — the integration tests (`tests/cluster`), the chaos runs (`timerdb-chaos`), the
//! benchmarks (`timerdb-bench`) and the simulator (`timerdb-sim`) — and the client load and
//! history checker that chaos and the simulator share.
//!
//! Three kinds of cluster, one module each; every node is the real thing (RocksDB, openraft,
//! tonic), only where it runs differs:
//! - [`inproc`]: nodes in this process on loopback ports, with a hand inside each node (the
//!   tests);
//! - [`simulated`]: nodes in this process on `timerdb::sim`'s network and paused clock (the
//!   simulator);
//! - [`process`]: real `timerd` processes (the tests that kill or upgrade a binary, chaos,
//!   benchmarks), started through one [`process::Launch`], with fault [`proxy`]s on the peer
//!   links and TLS and auth from [`secure`] when asked.
//!
//! Then what runs against a cluster: [`calls`] (the tests' requests and waits), [`workload`]
//! (chaos's and the simulator's clients, recording a history) and [`checker`] (the guarantees
//! judged on that history, the final state and the replicas' digests).
//!
//! Callers that assert (the tests) get functions that panic on a surprise; the tools get
//! `anyhow` errors, so a run can report and go on. The harness never reads a node's insides
//! but through `RunningNode` (in-process clusters) or the public API (processes).

pub mod calls;
pub mod checker;
pub mod inproc;
pub mod process;
pub mod proxy;
pub mod secure;
pub mod simulated;
pub mod workload;
