//! `timerctl namespace put|get|list|pause|resume`: replicated namespace policies, push
//! targets and limits.

use std::time::Duration;

use crate::Ch as Channel;
use clap::Subcommand;
use timerdb::api::pb::{self, namespaces_client::NamespacesClient};

use crate::output::{self, status_err};

// Put carries every policy flag; the enum is parsed once per process, so its size is moot.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum NamespaceCommand {
    /// Set a namespace's policy; options left out take the defaults.
    Put {
        name: String,
        /// Redeliver after this long unacknowledged (default 30s).
        #[arg(long, value_parser = humantime::parse_duration)]
        ack_timeout: Option<Duration>,
        /// Deliveries before the timer becomes DEAD (default 5).
        #[arg(long)]
        max_attempts: Option<u32>,
        /// First redelivery backoff (default 1s).
        #[arg(long, value_parser = humantime::parse_duration)]
        backoff_min: Option<Duration>,
        /// Largest redelivery backoff (default 5m).
        #[arg(long, value_parser = humantime::parse_duration)]
        backoff_max: Option<Duration>,
        /// Backoff growth per attempt, e.g. 2 or 1.5 (default 2).
        #[arg(long)]
        backoff_multiplier: Option<f64>,
        /// Random spread of each backoff in percent, 0 for none (default 20).
        #[arg(long)]
        jitter_percent: Option<u32>,
        /// Keep ACKED, CANCELLED and DEAD timers this long (default 7d).
        #[arg(long, value_parser = humantime::parse_duration)]
        retention: Option<Duration>,
        /// Largest payload per timer (default 65536).
        #[arg(long)]
        max_payload_bytes: Option<u32>,
        /// Push fired timers to this URL: http(s)://… (a signed POST) or grpc(s)://HOST:PORT
        /// (timerdb.v1.Receiver). Left out: consumers Subscribe.
        #[arg(long)]
        push_url: Option<String>,
        /// A signing secret (whsec_…); give it twice to rotate (both sign). Left out: keep the
        /// current one, or have one generated.
        #[arg(long)]
        push_secret: Vec<String>,
        /// How long one push request may take (default 10s, below the ack timeout).
        #[arg(long, value_parser = humantime::parse_duration)]
        push_timeout: Option<Duration>,
        /// A 4xx answer other than 408/429 makes the timer DEAD at once instead of retrying.
        #[arg(long)]
        dead_on_client_error: bool,
        /// Deliveries (push or Subscribe) started per second (default: no limit).
        #[arg(long)]
        max_dispatches_per_second: Option<u32>,
        /// Deliveries that may start at once (default: a tenth of the rate).
        #[arg(long)]
        max_burst: Option<u32>,
        /// Deliveries unsettled at once (default: no limit).
        #[arg(long)]
        max_concurrent_dispatches: Option<u32>,
        /// Timers scheduled per second; beyond it RESOURCE_EXHAUSTED (default: no limit).
        #[arg(long)]
        max_schedules_per_second: Option<u32>,
        /// Timers that may be scheduled at once (default: the schedule rate).
        #[arg(long)]
        max_schedule_burst: Option<u32>,
        /// A timer firing more than this late (after an outage) gets --misfire instead.
        #[arg(long, value_parser = humantime::parse_duration)]
        max_lateness: Option<Duration>,
        /// What a too-late timer becomes: fire (default), dead, skip (EXPIRED).
        #[arg(long, value_enum)]
        misfire: Option<crate::modes::MisfireArg>,
    },
    /// Stop dispatching a namespace's fired timers (they still fire, and wait).
    Pause { name: String },
    /// Dispatch a paused namespace's timers again.
    Resume { name: String },
    /// Show a namespace's policy (the defaults if it was never configured).
    Get { name: String },
    /// List the configured namespaces.
    List,
}

fn ms(d: Option<Duration>) -> u64 {
    d.map_or(0, |d| d.as_millis() as u64)
}

fn namespace_json(ns: &pb::Namespace) -> serde_json::Value {
    let p = ns.policy.clone().unwrap_or_default();
    serde_json::json!({
        "name": ns.name,
        "configured": ns.configured,
        "policy": {
            "ack_timeout_ms": p.ack_timeout_ms,
            "max_attempts": p.max_attempts,
            "backoff_min_ms": p.backoff_min_ms,
            "backoff_max_ms": p.backoff_max_ms,
            "backoff_multiplier": p.backoff_multiplier_permille as f64 / 1000.0,
            "backoff_jitter_percent": p.backoff_jitter_percent.unwrap_or(0),
            "retention_ms": p.retention_ms,
            "max_payload_bytes": p.max_payload_bytes,
            "max_dispatches_per_second": p.max_dispatches_per_second,
            "max_burst": p.max_burst,
            "max_concurrent_dispatches": p.max_concurrent_dispatches,
            "max_schedules_per_second": p.max_schedules_per_second,
            "max_schedule_burst": p.max_schedule_burst,
            "paused": p.paused,
            "max_lateness_ms": p.max_lateness_ms,
            "misfire": pb::MisfireAction::try_from(p.misfire).map_or("?", |a| a.as_str_name()),
            "push": p.push.as_ref().map(|t| serde_json::json!({
                "url": t.url,
                "secrets": t.secrets,
                "timeout_ms": t.timeout_ms,
                "dead_on_client_error": t.dead_on_client_error,
            })),
        }
    })
}

fn print_namespace(ns: &pb::Namespace) {
    if output::json() {
        return output::doc(namespace_json(ns));
    }
    let p = ns.policy.clone().unwrap_or_default();
    let dur = |ms: u64| humantime::format_duration(Duration::from_millis(ms)).to_string();
    println!(
        "{}{}\n  ack_timeout={}  max_attempts={}  backoff={}..{} x{:.3} ±{}%\n  retention={}  max_payload_bytes={}",
        ns.name,
        if ns.configured { "" } else { "  (not configured: defaults)" },
        dur(p.ack_timeout_ms),
        p.max_attempts,
        dur(p.backoff_min_ms),
        dur(p.backoff_max_ms),
        p.backoff_multiplier_permille as f64 / 1000.0,
        p.backoff_jitter_percent.unwrap_or(0),
        dur(p.retention_ms),
        p.max_payload_bytes
    );
    let rate = |r: Option<u32>, burst: u32| match r {
        Some(r) => format!("{r}/s burst {burst}"),
        None => "no limit".to_string(),
    };
    let concurrency = p
        .max_concurrent_dispatches
        .map_or("no limit".to_string(), |c| c.to_string());
    println!(
        "  dispatch: rate {}, concurrency {}{}  schedule: rate {}",
        rate(p.max_dispatches_per_second, p.max_burst),
        concurrency,
        if p.paused { "  PAUSED" } else { "" },
        rate(p.max_schedules_per_second, p.max_schedule_burst),
    );
    match &p.push {
        Some(t) => println!(
            "  push: {}  timeout={}  dead_on_client_error={}\n  secrets: {}",
            t.url,
            dur(t.timeout_ms),
            t.dead_on_client_error,
            t.secrets.join(" ")
        ),
        None => println!("  delivery: Subscribe"),
    }
    let action = pb::MisfireAction::try_from(p.misfire).map_or("?", |a| a.as_str_name());
    match p.max_lateness_ms {
        0 => println!("  misfire: off (late timers fire)"),
        ms => println!(
            "  misfire: {} when more than {} late",
            action.trim_start_matches("MISFIRE_ACTION_"),
            dur(ms)
        ),
    }
}

pub async fn namespace(ch: Channel, command: NamespaceCommand) -> anyhow::Result<()> {
    let mut client = NamespacesClient::new(ch);
    match command {
        NamespaceCommand::Put {
            name,
            ack_timeout,
            max_attempts,
            backoff_min,
            backoff_max,
            backoff_multiplier,
            jitter_percent,
            retention,
            max_payload_bytes,
            push_url,
            push_secret,
            push_timeout,
            dead_on_client_error,
            max_dispatches_per_second,
            max_burst,
            max_concurrent_dispatches,
            max_schedules_per_second,
            max_schedule_burst,
            max_lateness,
            misfire,
        } => {
            let policy = pb::NamespacePolicy {
                max_lateness_ms: ms(max_lateness),
                misfire: misfire.map_or(0, |m| m.to_pb() as i32),
                ack_timeout_ms: ms(ack_timeout),
                max_attempts: max_attempts.unwrap_or(0),
                backoff_min_ms: ms(backoff_min),
                backoff_max_ms: ms(backoff_max),
                backoff_multiplier_permille: backoff_multiplier
                    .map_or(0, |m| (m * 1000.0).round() as u32),
                backoff_jitter_percent: jitter_percent,
                retention_ms: ms(retention),
                max_payload_bytes: max_payload_bytes.unwrap_or(0),
                push: push_url.map(|url| pb::PushTarget {
                    url,
                    secrets: push_secret,
                    timeout_ms: ms(push_timeout),
                    dead_on_client_error,
                }),
                max_dispatches_per_second,
                max_burst: max_burst.unwrap_or(0),
                max_concurrent_dispatches,
                max_schedules_per_second,
                max_schedule_burst: max_schedule_burst.unwrap_or(0),
                paused: false,
            };
            let req = pb::PutNamespaceRequest {
                name,
                policy: Some(policy),
            };
            let r = client
                .put_namespace(req)
                .await
                .map_err(status_err)?
                .into_inner();
            print_namespace(&r.namespace.unwrap_or_default());
        }
        NamespaceCommand::Pause { name } => {
            let r = client
                .pause_namespace(pb::PauseNamespaceRequest { name })
                .await
                .map_err(status_err)?;
            print_namespace(&r.into_inner().namespace.unwrap_or_default());
        }
        NamespaceCommand::Resume { name } => {
            let r = client
                .resume_namespace(pb::PauseNamespaceRequest { name })
                .await
                .map_err(status_err)?;
            print_namespace(&r.into_inner().namespace.unwrap_or_default());
        }
        NamespaceCommand::Get { name } => {
            let r = client
                .get_namespace(pb::GetNamespaceRequest { name })
                .await
                .map_err(status_err)?;
            print_namespace(&r.into_inner().namespace.unwrap_or_default());
        }
        NamespaceCommand::List => {
            let mut token = String::new();
            let mut n = 0;
            let mut docs = Vec::new();
            loop {
                let req = pb::ListNamespacesRequest {
                    limit: 0,
                    page_token: token,
                };
                let page = client
                    .list_namespaces(req)
                    .await
                    .map_err(status_err)?
                    .into_inner();
                for ns in &page.namespaces {
                    if output::json() {
                        docs.push(namespace_json(ns));
                    } else {
                        print_namespace(ns);
                    }
                }
                n += page.namespaces.len();
                token = page.next_page_token;
                if token.is_empty() {
                    break;
                }
            }
            if output::json() {
                output::doc(serde_json::json!({ "namespaces": docs }));
            } else {
                println!("{n} configured namespace(s)");
            }
        }
    }
    Ok(())
}
