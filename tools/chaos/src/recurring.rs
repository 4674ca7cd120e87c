//! Recurring timers in the chaos run: a few series created before the load (each ends before
//! the faults stop), their occurrences delivered to the same consumers as every timer, and the
//! rule "every occurrence due in the run fired exactly once" checked against the expected
//! nominal times, worked out here by arithmetic, not by the server's cron library.
//!
//! FIRE_ALL series must show every nominal time of their rule from the first to the end, once
//! each, fired (and then delivered and acked like any timer: `checker::fires` sees them too),
//! none missed. Series whose policy may drop occurrences (FIRE_ONCE after an outage, overlap
//! SKIP behind a slow consumer) must account for each nominal time exactly once: fired,
//! skipped or missed, and show no occurrence the rule does not have.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use timerdb::api::pb::{self, timers_client::TimersClient};
use timerdb::recurring::parse_occurrence;

use timerdb_harness::checker::Findings;
use timerdb_harness::secure::Conn;
use timerdb_harness::workload::NAMESPACE;

/// A series the run creates, and what its rule makes.
#[derive(Debug, Clone)]
pub struct Planned {
    pub id: &'static str,
    pub recurrence: pb::Recurrence,
    /// Every nominal time of the rule in the series' life, in order.
    pub expected: Vec<i64>,
    /// Whether every one of them must fire (FIRE_ALL, overlap ALLOW).
    pub all_fire: bool,
}

/// The run's series, their first occurrences a few seconds after `start_ms`, their last
/// before `start_ms + length` less a margin (so they are over before the load stops).
pub fn plans(start_ms: i64, length: Duration) -> Vec<Planned> {
    let first = (start_ms / 2000 + 2) * 2000;
    let end = start_ms + length.as_millis() as i64 - 3_000;
    let every = |period: i64| -> Vec<i64> {
        (0..)
            .map(|k| first + k * period)
            .take_while(|t| *t <= end)
            .collect()
    };
    let base = pb::Recurrence {
        start_ms: first,
        end_ms: end,
        misfire: pb::Misfire::FireAll as i32,
        ..Default::default()
    };
    vec![
        Planned {
            id: "r-every-1s",
            recurrence: pb::Recurrence {
                every_ms: 1000,
                anchor_ms: first,
                ..base.clone()
            },
            expected: every(1000),
            all_fire: true,
        },
        Planned {
            // Every even second, read in a zone with DST (the seconds field alone decides).
            id: "r-cron-2s-berlin",
            recurrence: pb::Recurrence {
                cron: "*/2 * * * * *".into(),
                time_zone: "Europe/Berlin".into(),
                jitter_ms: 300,
                ..base.clone()
            },
            expected: every(2000),
            all_fire: true,
        },
        Planned {
            id: "r-once-1500ms",
            recurrence: pb::Recurrence {
                every_ms: 1500,
                anchor_ms: first,
                misfire: pb::Misfire::FireOnce as i32,
                ..base.clone()
            },
            expected: every(1500),
            all_fire: false,
        },
        Planned {
            id: "r-overlap-skip-1s",
            recurrence: pb::Recurrence {
                every_ms: 1000,
                anchor_ms: first,
                overlap: pb::Overlap::Skip as i32,
                ..base
            },
            expected: every(1000),
            all_fire: false,
        },
    ]
}

/// Creates each series through some node, retrying an unknown outcome (a repeat of the same
/// Schedule answers the existing series).
pub async fn create(
    clients: &[(u64, TimersClient<Conn>)],
    plans: &[Planned],
) -> anyhow::Result<()> {
    for (i, p) in plans.iter().enumerate() {
        let req = pb::ScheduleRequest {
            namespace: NAMESPACE.into(),
            id: p.id.into(),
            payload: p.id.as_bytes().to_vec(),
            recurrence: Some(p.recurrence.clone()),
            ..Default::default()
        };
        let mut tries = 0;
        loop {
            let mut c = clients[(i + tries) % clients.len()].1.clone();
            match c.schedule(req.clone()).await {
                Ok(_) => break,
                Err(s) if tries < 50 && s.code() != tonic::Code::InvalidArgument => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(s) => anyhow::bail!("creating series {}: {s}", p.id),
            }
        }
    }
    Ok(())
}

/// Each series as Get shows it at the end (its counters).
pub async fn views(
    clients: &[(u64, TimersClient<Conn>)],
    plans: &[Planned],
) -> BTreeMap<String, pb::Series> {
    let mut out = BTreeMap::new();
    for p in plans {
        for (_, c) in clients {
            let req = pb::GetRequest {
                namespace: NAMESPACE.into(),
                id: p.id.into(),
                ..Default::default()
            };
            if let Ok(r) = c.clone().get(req).await {
                if let Some(s) = r.into_inner().timer.and_then(|t| t.series) {
                    out.insert(p.id.to_string(), s);
                    break;
                }
            }
        }
    }
    out
}

/// "Every occurrence due in the run fired exactly once" (see the module essay).
pub fn check(
    f: &mut Findings,
    plans: &[Planned],
    timers: &BTreeMap<String, pb::Timer>,
    views: &BTreeMap<String, pb::Series>,
) {
    let mut by_recurring: BTreeMap<&str, Vec<(i64, &pb::Timer)>> = BTreeMap::new();
    for (id, t) in timers {
        if let Some((series, nominal)) = parse_occurrence(id) {
            by_recurring.entry(series).or_default().push((nominal, t));
        }
    }
    for (series, occs) in &by_recurring {
        if !plans.iter().any(|p| p.id == *series) {
            f.violate(
                "phantom occurrence",
                format!("{} occurrences of unknown series {series}", occs.len()),
            );
        }
    }
    for p in plans {
        let occs = by_recurring
            .get(p.id)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let expected: BTreeSet<i64> = p.expected.iter().copied().collect();
        let got: BTreeSet<i64> = occs.iter().map(|(n, _)| *n).collect();
        f.occurrences += occs.len();
        for (n, t) in occs {
            if !expected.contains(n) {
                f.violate(
                    "phantom occurrence",
                    format!("{}: {} is not a time of its rule", p.id, t.id),
                );
            }
            let jitter = p.recurrence.jitter_ms;
            if t.fire_at_ms < *n || t.fire_at_ms > n + jitter.max(0) {
                f.violate(
                    "occurrence fire time",
                    format!(
                        "{}: fire_at {} is not its nominal time + jitter < {jitter}",
                        t.id, t.fire_at_ms
                    ),
                );
            }
        }
        let Some(view) = views.get(p.id) else {
            f.violate("series lost", format!("{} cannot be read", p.id));
            continue;
        };
        f.occurrences_missed += view.missed as usize;
        f.occurrences_skipped += view.skipped as usize;
        if view.status != "ended" {
            f.violate(
                "series not ended",
                format!("{}: {} after its end time", p.id, view.status),
            );
        }
        if p.all_fire {
            let missing: Vec<&i64> = expected.difference(&got).collect();
            if !missing.is_empty() || view.missed != 0 || view.skipped != 0 {
                f.violate(
                    "occurrence not fired once",
                    format!(
                        "{}: {} of {} nominal times have no occurrence (first {:?}); missed {}, skipped {}",
                        p.id,
                        missing.len(),
                        expected.len(),
                        missing.first(),
                        view.missed,
                        view.skipped
                    ),
                );
            }
        }
        let accounted = view.fired + view.skipped + view.missed;
        if view.fired as usize != got.len() || accounted as usize != expected.len() {
            f.violate(
                "occurrence not accounted once",
                format!(
                    "{}: rule has {} times; series says fired {} skipped {} missed {}; {} occurrences exist",
                    p.id,
                    expected.len(),
                    view.fired,
                    view.skipped,
                    view.missed,
                    got.len()
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: i64 = 1_800_000_000_000;

    fn occurrence(series: &str, nominal: i64) -> (String, pb::Timer) {
        let id = timerdb::recurring::occurrence_id(series, nominal);
        let t = pb::Timer {
            id: id.clone(),
            fire_at_ms: nominal,
            fired_at_ms: nominal + 1,
            fire_index: 7,
            state: pb::TimerState::Acked as i32,
            ..Default::default()
        };
        (id, t)
    }

    fn view(fired: u64, skipped: u64, missed: u64) -> pb::Series {
        pb::Series {
            status: "ended".into(),
            fired,
            skipped,
            missed,
            ..Default::default()
        }
    }

    fn kinds(
        plans: &[Planned],
        timers: &BTreeMap<String, pb::Timer>,
        views: &BTreeMap<String, pb::Series>,
    ) -> Vec<&'static str> {
        let mut f = Findings::default();
        check(&mut f, plans, timers, views);
        f.violations.iter().map(|v| v.kind).collect()
    }

    /// A clean run passes; a missing, an extra, a doubly counted, an unknown series' and a
    /// jitter-breaking occurrence are each reported.
    #[test]
    fn each_broken_rule_is_reported() {
        let plans = plans(T - 2_000, Duration::from_secs(13));
        let mut timers = BTreeMap::new();
        let mut views = BTreeMap::new();
        for p in &plans {
            let n = p.expected.len() as u64;
            let fired: Vec<i64> = if p.all_fire {
                p.expected.clone()
            } else {
                p.expected.iter().copied().step_by(2).collect()
            };
            for t in &fired {
                let (id, o) = occurrence(p.id, *t);
                timers.insert(id, o);
            }
            let f = fired.len() as u64;
            views.insert(p.id.to_string(), view(f, (n - f) / 2, n - f - (n - f) / 2));
        }
        assert_eq!(kinds(&plans, &timers, &views), Vec::<&str>::new());

        let all = &plans[0];
        let mut missing = timers.clone();
        missing.remove(&timerdb::recurring::occurrence_id(all.id, all.expected[3]));
        views.get_mut(all.id).unwrap().fired -= 1;
        assert_eq!(
            kinds(&plans, &missing, &views),
            vec!["occurrence not fired once", "occurrence not accounted once"]
        );
        views.get_mut(all.id).unwrap().fired += 1;

        let mut extra = timers.clone();
        let (id, t) = occurrence(all.id, all.expected[0] + 500);
        extra.insert(id, t);
        assert!(kinds(&plans, &extra, &views).contains(&"phantom occurrence"));

        let mut unknown = timers.clone();
        let (id, t) = occurrence("r-nobody", T);
        unknown.insert(id, t);
        assert_eq!(kinds(&plans, &unknown, &views), vec!["phantom occurrence"]);

        let mut counted = views.clone();
        counted.get_mut(plans[2].id).unwrap().missed += 1;
        assert_eq!(
            kinds(&plans, &timers, &counted),
            vec!["occurrence not accounted once"]
        );

        let mut early = timers.clone();
        let id = timerdb::recurring::occurrence_id(all.id, all.expected[1]);
        early.get_mut(&id).unwrap().fire_at_ms -= 1;
        assert_eq!(kinds(&plans, &early, &views), vec!["occurrence fire time"]);

        let mut lost = views.clone();
        lost.remove(plans[1].id);
        assert_eq!(kinds(&plans, &timers, &lost), vec!["series lost"]);
    }
}
