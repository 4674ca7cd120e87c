//! The `scale` workload (issue 36; docs/sharding.md §9, step 1 of §12): what sharding can buy,
//! measured on today's single group before any of it is built.
//!
//! Sharding spreads the leading over the nodes; it cannot spread the following, which every
//! replica does for every timer. On 3 equal machines the gain is bounded by 3L / (L + 2F), L
//! and F the CPU one timer costs the leader and a follower: ≈ 1.9× at F = 0.3 L, ≈ 1× at F = L.
//! This workload runs the Schedule ×200 and ScheduleBatch closed loops against the leader and
//! reads every node's CPU time (`/proc/<pid>/stat`, user + system, all threads) at the start
//! and end of the measured window, so L, F and the bound come from the same window as the
//! rate.
//!
//! Each `timerd` can be given a fixed CPU share (`--scale-quotas`, millicores per node; 0 is
//! none): a cgroup v1 `cpu` group per process with `cpu.cfs_quota_us`, made before the load
//! and removed after it ([`Quota`]). Two cores cannot show a speed-up by themselves; under
//! equal quotas the nodes behave like equal machines, which the later parts of §9 compare.

use std::path::PathBuf;

use anyhow::Context;

use crate::report::Results;
use crate::target::Target;
use crate::write::{closed_loop, Window};
use crate::Opts;

/// Linux reports `/proc/<pid>/stat` times in USER_HZ ticks, 100 a second on every
/// architecture this runs on (the ABI fixes it, whatever the kernel's HZ).
const TICKS_PER_SEC: f64 = 100.0;

pub async fn scale(
    target: &mut Target,
    opts: &Opts,
    millicores: u64,
    build: &str,
    results: &mut Results,
) -> anyhow::Result<()> {
    let procs = target.procs("scale")?;
    let pids: Vec<(u64, u32)> = procs
        .nodes
        .keys()
        .filter_map(|id| Some((*id, procs.pid(*id)?)))
        .collect();
    anyhow::ensure!(
        pids.len() == 3,
        "the scale workload needs all three nodes up"
    );
    let _quota = match millicores {
        0 => None,
        m => Some(Quota::apply(&pids, m)?),
    };
    let share = match millicores {
        0 => "no quota".to_string(),
        m => format!("{m} millicores per node"),
    };
    let loops = [
        ("Schedule x200", 200, 1),
        ("ScheduleBatch 1000", opts.batch_in_flight, 1000),
    ];
    for (name, clients, size) in loops {
        let w = closed_loop(target, opts, clients, size, name, Some(&pids)).await?;
        let mut rec = results.recorder_for(build, "scale", format!("{name}, {share}"));
        report(&w, &mut rec)?;
    }
    Ok(())
}

/// CPU seconds each node spent so far.
pub fn cpu(pids: &[(u64, u32)]) -> anyhow::Result<Vec<(u64, f64)>> {
    pids.iter()
        .map(|(id, pid)| Ok((*id, cpu_seconds(*pid)?)))
        .collect()
}

fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    // The command name (field 2) may hold spaces: the fields that follow start after its ')'.
    let rest = &stat[stat.rfind(')').context("no ')' in stat")? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime) of proc(5); `rest` starts at field 3.
    let ticks = |n: usize| -> anyhow::Result<f64> {
        Ok(fields.get(n - 3).context("short stat")?.parse::<u64>()? as f64)
    };
    Ok((ticks(14)? + ticks(15)?) / TICKS_PER_SEC)
}

fn report(w: &Window, rec: &mut crate::report::Recorder<'_>) -> anyhow::Result<()> {
    let (leader, spent) = (w.leader, w.cpu.as_deref().context("no CPU sample")?);
    anyhow::ensure!(w.timers > 0, "no timer scheduled in the window");
    let per_timer_us = |secs: f64| secs * 1e6 / w.timers as f64;
    let l = spent
        .iter()
        .find(|(id, _)| *id == leader)
        .map(|(_, s)| per_timer_us(*s))
        .context("the leader's CPU")?;
    let followers: Vec<f64> = spent
        .iter()
        .filter(|(id, _)| *id != leader)
        .map(|(_, s)| per_timer_us(*s))
        .collect();
    let f = followers.iter().sum::<f64>() / followers.len().max(1) as f64;
    rec.put("rate", "timers/s", w.timers as f64 / w.secs);
    rec.put("leader CPU per timer", "µs", l);
    rec.put("follower CPU per timer", "µs", f);
    rec.put("follower ÷ leader", "ratio", f / l);
    rec.put("3-group gain bound 3L/(L+2F)", "×", 3.0 * l / (l + 2.0 * f));
    rec.put("errors", "calls", w.errors as f64);
    Ok(())
}

/// A cgroup v1 `cpu` group per node holding it to `millicores`; removed on drop (the
/// processes are moved back to the root group first, so the groups can be removed while the
/// nodes still run).
pub struct Quota {
    groups: Vec<(u32, PathBuf)>,
}

const CPU_ROOT: &str = "/sys/fs/cgroup/cpu";

impl Quota {
    pub fn apply(pids: &[(u64, u32)], millicores: u64) -> anyhow::Result<Quota> {
        let mut quota = Quota { groups: Vec::new() };
        for (id, pid) in pids {
            let dir = PathBuf::from(CPU_ROOT)
                .join(format!("timerdb-bench-{}-node{id}", std::process::id()));
            std::fs::create_dir_all(&dir).with_context(|| {
                format!(
                    "making {} (cgroup v1's cpu controller, as root)",
                    dir.display()
                )
            })?;
            quota.groups.push((*pid, dir.clone()));
            // A period of 100 ms; the quota is the share of one core within it.
            std::fs::write(dir.join("cpu.cfs_period_us"), "100000")?;
            std::fs::write(dir.join("cpu.cfs_quota_us"), (millicores * 100).to_string())?;
            std::fs::write(dir.join("cgroup.procs"), pid.to_string())
                .with_context(|| format!("moving node {id} (pid {pid}) into its group"))?;
        }
        Ok(quota)
    }
}

impl Drop for Quota {
    fn drop(&mut self) {
        for (pid, dir) in &self.groups {
            let _ = std::fs::write(
                PathBuf::from(CPU_ROOT).join("cgroup.procs"),
                pid.to_string(),
            );
            if let Err(e) = std::fs::remove_dir(dir) {
                eprintln!("could not remove {}: {e}", dir.display());
            }
        }
    }
}
