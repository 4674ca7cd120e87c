//! Recurring timers from the command line: the `--cron/--tz/--every…` flags of `schedule`,
//! `next`, `pause` and `resume`, and how a series is printed (docs/recurrence.md).

use std::time::Duration;

use anyhow::bail;
use clap::ValueEnum;
use serde_json::json;
use timerdb::api::pb::{self, timers_client::TimersClient};

use crate::output::{self, fmt_ms};
use crate::{parse_at, status_err, Ch};

/// The flags that make `schedule` create a recurring timer.
#[derive(clap::Args, Debug)]
pub struct RecurArgs {
    /// Recurring, by a cron expression: 5 fields (minute hour day month weekday) or 6 with
    /// seconds first; L, W and # work. Needs --tz.
    #[arg(long, conflicts_with = "every")]
    cron: Option<String>,
    /// The IANA time zone --cron is read in, e.g. Europe/Berlin or UTC.
    #[arg(long, requires = "cron")]
    tz: Option<String>,
    /// Recurring, at a fixed interval, e.g. 30s, 5m, 1h (at least 1s).
    #[arg(long, value_parser = humantime::parse_duration)]
    every: Option<Duration>,
    /// An instant the --every interval passes through (default: the creation time).
    #[arg(long, requires = "every")]
    anchor: Option<String>,
    /// No occurrence before this time (RFC 3339 or epoch ms).
    #[arg(long)]
    start: Option<String>,
    /// No occurrence after this time (RFC 3339 or epoch ms).
    #[arg(long)]
    end: Option<String>,
    /// At most this many occurrences fire.
    #[arg(long)]
    max_count: Option<u64>,
    /// Late occurrences after an outage: fire-once (default), fire-all, skip.
    #[arg(long, value_enum)]
    misfire: Option<MisfireArg>,
    /// fire-all's window (default 1h).
    #[arg(long, value_parser = humantime::parse_duration)]
    catch_up_window: Option<Duration>,
    /// How late is too late: a recurring timer's misfire skip tolerance (default 1m), or a
    /// one-shot timer's own, with --on-misfire.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub max_lateness: Option<Duration>,
    /// An occurrence due while the previous is not acked: allow (default), skip, buffer-one.
    #[arg(long, value_enum)]
    overlap: Option<OverlapArg>,
    /// Spread each occurrence by a fixed offset within this window, e.g. 30s.
    #[arg(long, value_parser = humantime::parse_duration)]
    jitter: Option<Duration>,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum MisfireArg {
    FireOnce,
    FireAll,
    Skip,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum OverlapArg {
    Allow,
    Skip,
    BufferOne,
}

fn ms(d: Option<Duration>) -> i64 {
    d.map_or(0, |d| d.as_millis() as i64)
}

fn at(s: &Option<String>) -> anyhow::Result<i64> {
    s.as_deref().map_or(Ok(0), parse_at)
}

impl RecurArgs {
    /// The recurrence these flags describe; `None` without --cron or --every.
    pub fn recurrence(&self) -> anyhow::Result<Option<pb::Recurrence>> {
        if self.cron.is_none() && self.every.is_none() {
            let given = self.start.is_some()
                || self.end.is_some()
                || self.max_count.is_some()
                || self.misfire.is_some()
                || self.overlap.is_some()
                || self.jitter.is_some();
            if given {
                bail!("the recurrence flags need --cron (with --tz) or --every");
            }
            return Ok(None);
        }
        Ok(Some(pb::Recurrence {
            cron: self.cron.clone().unwrap_or_default(),
            time_zone: self.tz.clone().unwrap_or_default(),
            every_ms: ms(self.every),
            anchor_ms: at(&self.anchor)?,
            start_ms: at(&self.start)?,
            end_ms: at(&self.end)?,
            max_count: self.max_count.unwrap_or(0),
            misfire: match self.misfire {
                None => pb::Misfire::Unspecified,
                Some(MisfireArg::FireOnce) => pb::Misfire::FireOnce,
                Some(MisfireArg::FireAll) => pb::Misfire::FireAll,
                Some(MisfireArg::Skip) => pb::Misfire::Skip,
            } as i32,
            catch_up_window_ms: ms(self.catch_up_window),
            max_lateness_ms: ms(self.max_lateness),
            overlap: match self.overlap {
                None => pb::Overlap::Unspecified,
                Some(OverlapArg::Allow) => pb::Overlap::Allow,
                Some(OverlapArg::Skip) => pb::Overlap::Skip,
                Some(OverlapArg::BufferOne) => pb::Overlap::BufferOne,
            } as i32,
            jitter_ms: ms(self.jitter),
        }))
    }
}

/// `timerctl next NS ID --count N`: the next occurrence times of a recurring timer.
pub async fn next(
    mut timers: TimersClient<Ch>,
    namespace: String,
    id: String,
    count: u32,
) -> anyhow::Result<()> {
    let req = pb::GetRequest {
        namespace,
        id,
        next_count: count,
    };
    let t = timers.get(req).await.map_err(status_err)?.into_inner();
    let t = t.timer.unwrap_or_default();
    let Some(s) = &t.series else {
        bail!(
            "{}/{} is a one-shot timer (fire_at {})",
            t.namespace,
            t.id,
            fmt_ms(t.fire_at_ms)
        );
    };
    if output::json() {
        output::doc(json!({"namespace": t.namespace, "id": t.id, "next_ms": s.next_ms}));
        return Ok(());
    }
    for n in &s.next_ms {
        println!("{}", fmt_ms(*n));
    }
    if s.next_ms.is_empty() {
        println!("no occurrence to come ({})", s.status);
    }
    Ok(())
}

/// `timerctl pause|resume NS ID`.
pub async fn pause(
    mut timers: TimersClient<Ch>,
    namespace: String,
    id: String,
    paused: bool,
) -> anyhow::Result<()> {
    let req = pb::PauseRequest { namespace, id };
    let r = if paused {
        timers.pause(req).await
    } else {
        timers.resume(req).await
    };
    let t = r
        .map_err(status_err)?
        .into_inner()
        .timer
        .unwrap_or_default();
    output::timer(if paused { "paused" } else { "resumed" }, &t);
    Ok(())
}
