//! `timerctl namespace put|get|list`: replicated namespace policies.

use std::time::Duration;

use clap::Subcommand;
use timerdb::api::pb::{self, namespaces_client::NamespacesClient};
use tonic::transport::Channel;

use crate::output::{self, status_err};

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
    },
    /// Show a namespace's policy (the defaults if it was never configured).
    Get { name: String },
    /// List the configured namespaces.
    List,
}

fn ms(d: Option<Duration>) -> u64 {
    d.map_or(0, |d| d.as_millis() as u64)
}

fn namespace_json(ns: &pb::Namespace) -> serde_json::Value {
    let p = ns.policy.unwrap_or_default();
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
        }
    })
}

fn print_namespace(ns: &pb::Namespace) {
    if output::json() {
        return output::doc(namespace_json(ns));
    }
    let p = ns.policy.unwrap_or_default();
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
        } => {
            let policy = pb::NamespacePolicy {
                ack_timeout_ms: ms(ack_timeout),
                max_attempts: max_attempts.unwrap_or(0),
                backoff_min_ms: ms(backoff_min),
                backoff_max_ms: ms(backoff_max),
                backoff_multiplier_permille: backoff_multiplier
                    .map_or(0, |m| (m * 1000.0).round() as u32),
                backoff_jitter_percent: jitter_percent,
                retention_ms: ms(retention),
                max_payload_bytes: max_payload_bytes.unwrap_or(0),
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
