//! The fault plan: which faults, when, for how long, derived from one seed.
//!
//! A plan alternates calm and fault windows. Fault kinds come in shuffled rounds (every kind
//! once per round), so even a short run injects each kind; targets are named by role (the
//! leader, a follower) and resolved when the fault starts. One seed gives the same plan.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// Who a fault hits, resolved when it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Leader,
    Follower,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL, restarted after the window.
    Kill(Target),
    /// SIGSTOP, SIGCONT after the window.
    Pause(Target),
    /// Every link to and from the node blackholed.
    Partition(Target),
    /// Every peer link delayed by this many ms each way.
    Delay(u64),
    /// Every peer link resets connections with this per-mille chance per chunk.
    Drop(u32),
    /// The node restarted with its clock skewed by this many ms, restarted unskewed after.
    Skew(Target, i64),
    /// Node 3's data dir filled; freed and node 3 restarted after the window.
    DiskFull,
    /// A membership change under load: the node removed (`Cluster.RemoveNode`; the leader hands
    /// over first) and wiped; after the window it starts empty with `--join` and is added
    /// back (`Cluster.AddNode`), catching up through a snapshot. On the leader: a replacement.
    Rejoin(Target),
    /// Every node in turn, followers first, stopped with SIGTERM and started again, each one
    /// caught up before the next goes: an operator's rolling upgrade.
    RollingRestart,
    /// Node 3 removed, wiped and added back, and its disk filled the moment it starts to
    /// receive the snapshot it catches up through; freed, restarted and added again after.
    InstallDiskFull,
}

impl Fault {
    /// The kind's name, for the report.
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::Kill(Target::Leader) => "kill leader",
            Fault::Kill(Target::Follower) => "kill follower",
            Fault::Pause(_) => "pause (SIGSTOP)",
            Fault::Partition(Target::Leader) => "isolate leader",
            Fault::Partition(Target::Follower) => "partition follower",
            Fault::Delay(_) => "delay links",
            Fault::Drop(_) => "drop connections",
            Fault::Skew(..) => "clock skew",
            Fault::DiskFull => "disk full",
            Fault::Rejoin(Target::Leader) => "replace leader",
            Fault::Rejoin(Target::Follower) => "rejoin follower wiped",
            Fault::RollingRestart => "rolling restart",
            Fault::InstallDiskFull => "disk full in install",
        }
    }

    /// Whether the fault can make the cluster elect a new leader.
    pub fn hits_leader(&self) -> bool {
        matches!(
            self,
            Fault::Kill(Target::Leader)
                | Fault::Pause(Target::Leader)
                | Fault::Partition(Target::Leader)
                | Fault::Skew(Target::Leader, _)
                | Fault::Rejoin(Target::Leader)
                | Fault::RollingRestart
        )
    }
}

/// One planned fault: starts `at` after the run starts and lasts `length`.
#[derive(Debug, Clone)]
pub struct Step {
    pub at: Duration,
    pub length: Duration,
    pub fault: Fault,
}

/// Which faults a plan may draw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mix {
    /// Every kind (disk full only with a tmpfs).
    All { disk: bool },
    /// Only isolating the leader (the ack-before-commit proof: an isolated leader keeps
    /// acknowledging writes that can never commit, and they vanish when it steps down).
    IsolateLeader,
    /// No faults at all.
    Calm,
}

fn kinds(rng: &mut StdRng, mix: Mix) -> Vec<Fault> {
    match mix {
        Mix::Calm => Vec::new(),
        Mix::IsolateLeader => vec![Fault::Partition(Target::Leader)],
        Mix::All { disk } => {
            let skew = if rng.random_bool(0.5) { 1 } else { -1 } * rng.random_range(500..3000);
            let mut all = vec![
                Fault::Kill(Target::Leader),
                Fault::Kill(Target::Follower),
                Fault::Pause(if rng.random_bool(0.5) {
                    Target::Leader
                } else {
                    Target::Follower
                }),
                Fault::Partition(Target::Leader),
                Fault::Partition(Target::Follower),
                Fault::Delay(rng.random_range(20..150)),
                Fault::Drop(rng.random_range(5..50)),
                Fault::Skew(Target::Leader, skew),
                Fault::Rejoin(Target::Leader),
                Fault::Rejoin(Target::Follower),
                Fault::RollingRestart,
            ];
            if disk {
                all.push(Fault::DiskFull);
                all.push(Fault::InstallDiskFull);
            }
            all
        }
    }
}

/// The plan for a run of `length` under `seed`.
pub fn plan(seed: u64, length: Duration, mix: Mix) -> Vec<Step> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut steps = Vec::new();
    let mut at = Duration::from_secs(4);
    let mut round: Vec<Fault> = Vec::new();
    loop {
        if round.is_empty() {
            round = kinds(&mut rng, mix);
            if round.is_empty() {
                return steps;
            }
            round.shuffle(&mut rng);
        }
        let fault = round.pop().expect("non-empty");
        let length_ms = rng.random_range(1_500..5_000);
        let step = Step {
            at,
            length: Duration::from_millis(length_ms),
            fault,
        };
        let calm = Duration::from_millis(rng.random_range(2_500..5_000));
        at += step.length + calm;
        if at > length {
            return steps;
        }
        steps.push(step);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_seed_one_plan_and_every_kind_soon() {
        let a = plan(7, Duration::from_secs(150), Mix::All { disk: true });
        let b = plan(7, Duration::from_secs(150), Mix::All { disk: true });
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        let kinds: std::collections::BTreeSet<_> = a.iter().map(|s| s.fault.kind()).collect();
        assert_eq!(kinds.len(), 13, "{kinds:?}");
        assert_ne!(
            format!("{a:?}"),
            format!(
                "{:?}",
                plan(8, Duration::from_secs(150), Mix::All { disk: true })
            )
        );
    }
}
