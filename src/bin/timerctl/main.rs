//! `timerctl`: the command-line client of a timerdb cluster.
//!
//! Talks to any node (`--endpoint`, default `127.0.0.1:7101` or `$TIMERDB_ENDPOINT`); the node
//! forwards to the leader. Output is for people (one line per timer, times in RFC 3339 UTC)
//! or, with `--output json`, for scripts (see `output`).

mod access;
mod backup;
mod delivery;
mod groups;
mod load;
mod member;
mod modes;
mod namespace;
mod output;
mod recurring;
mod status;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use clap::{Parser, Subcommand, ValueEnum};
use timerdb::api::pb::{self, timers_client::TimersClient};

#[derive(Parser, Debug)]
#[command(name = "timerctl", version, about = "Command-line client for timerdb")]
struct Cli {
    /// Any node of the cluster, as HOST:PORT or http://HOST:PORT.
    #[arg(
        long,
        short,
        global = true,
        env = "TIMERDB_ENDPOINT",
        default_value = "127.0.0.1:7101"
    )]
    endpoint: String,
    /// An API key (`tdbk_...`) or bootstrap token, sent as `authorization: Bearer` on every
    /// call; needed once auth is on (docs/security.md).
    #[arg(long, global = true, env = "TIMERDB_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// PEM CA certificate(s) to trust for a TLS cluster (implies https://).
    #[arg(long, global = true, env = "TIMERDB_CA")]
    ca: Option<std::path::PathBuf>,
    /// PEM client certificate for a cluster that asks for one (mTLS); with --key.
    #[arg(long, global = true, env = "TIMERDB_CERT", requires = "key")]
    cert: Option<std::path::PathBuf>,
    /// PEM private key of --cert.
    #[arg(long, global = true, env = "TIMERDB_KEY", requires = "cert")]
    key: Option<std::path::PathBuf>,
    /// text (for people) or json (one document per command, for scripts).
    #[arg(long, short, global = true, value_enum, default_value = "text")]
    output: output::Format,
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Debug)]
#[group(required = false, multiple = false)]
struct WhenArgs {
    /// Fire after this delay, e.g. 500ms, 10s, 5m, 2h.
    #[arg(long = "in", value_parser = humantime::parse_duration)]
    delay: Option<Duration>,
    /// Fire at this time: RFC 3339 (2030-01-01T00:00:00Z) or Unix epoch milliseconds.
    #[arg(long)]
    at: Option<String>,
}

/// One delivery of one timer.
#[derive(clap::Args, Debug)]
struct AttemptArgs {
    namespace: String,
    id: String,
    /// The `attempt` of the delivery, as `watch` prints it.
    attempt: u32,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Schedule a timer (--in or --at), or a recurring one (--cron with --tz, or --every).
    Schedule {
        namespace: String,
        id: String,
        #[command(flatten)]
        when: WhenArgs,
        #[command(flatten)]
        recur: recurring::RecurArgs,
        #[command(flatten)]
        mode: modes::ModeArgs,
        /// Payload, as text.
        #[arg(long, default_value = "")]
        payload: String,
        /// The payload's media type, sent with a push (default application/octet-stream).
        #[arg(long, default_value = "")]
        content_type: String,
    },
    /// Cancel a PENDING timer (definitive: it will never fire, or the call fails).
    Cancel {
        namespace: String,
        id: String,
        #[command(flatten)]
        cond: modes::CondArgs,
    },
    /// Move a PENDING timer to a new time (--in, --at) or by a shift (--extend-by, --pull-in).
    Reschedule {
        namespace: String,
        id: String,
        #[command(flatten)]
        when: WhenArgs,
        #[command(flatten)]
        shift: modes::ShiftArgs,
        #[command(flatten)]
        cond: modes::CondArgs,
    },
    /// Show one timer, with its latest delivery attempts (a recurring one: its rule, counters
    /// and latest occurrences).
    Get { namespace: String, id: String },
    /// Show a recurring timer's next occurrence times.
    Next {
        namespace: String,
        id: String,
        #[arg(long, default_value_t = 10)]
        count: u32,
    },
    /// Pause a recurring timer: its pending occurrence is removed until resume.
    Pause { namespace: String, id: String },
    /// Resume a paused recurring timer: the next occurrence is the first after now.
    Resume { namespace: String, id: String },
    /// Show a timer's attempt log: each delivery, its channel, outcome and latency.
    Attempts { namespace: String, id: String },
    /// List a namespace's timers.
    List {
        namespace: String,
        #[arg(long, value_enum)]
        state: Option<State>,
        /// Page size (0: server default).
        #[arg(long, default_value_t = 0)]
        limit: u32,
        /// Follow page tokens to the end.
        #[arg(long)]
        all: bool,
        /// List the recurring timers instead (their occurrences are listed as timers).
        #[arg(long, conflicts_with = "state")]
        recurring: bool,
    },
    /// Show every member of the cluster: role, term, applied index, lag, pending timers.
    Status,
    /// Access control: API keys and the auth switch (docs/security.md).
    Auth {
        #[command(subcommand)]
        command: access::AuthCommand,
    },
    /// Add, remove and list cluster members.
    Member {
        #[command(subcommand)]
        command: member::MemberCommand,
    },
    /// Save a backup of the cluster's state, or check one (restore: `timerd --restore-from`).
    Backup {
        #[command(subcommand)]
        command: backup::BackupCommand,
    },
    /// The slot map: which Raft group owns which hash slots, and its leader.
    Slots {
        /// Show only the group holding this namespace's timers.
        #[arg(long)]
        namespace: Option<String>,
    },
    /// The Raft groups: list them, move a group's leader.
    Group {
        #[command(subcommand)]
        command: groups::GroupCommand,
    },
    /// Move leadership.
    Leader {
        #[command(subcommand)]
        command: member::LeaderCommand,
    },
    /// Read and set namespace policies.
    Namespace {
        #[command(subcommand)]
        command: namespace::NamespaceCommand,
    },
    /// Subscribe to a namespace and print each delivery as it arrives (Ctrl-C to stop).
    Watch {
        namespace: String,
        /// Acknowledge each delivery after printing it.
        #[arg(long)]
        ack: bool,
        /// A name for this consumer in the server's logs.
        #[arg(long, default_value = "timerctl")]
        consumer: String,
        /// Unacknowledged deliveries this stream may hold (0: the server default, 100).
        #[arg(long, default_value_t = 0)]
        max_in_flight: u32,
        /// Exit after this many deliveries.
        #[arg(long)]
        count: Option<usize>,
    },
    /// Acknowledge delivery ATTEMPT of a timer: FIRED -> ACKED.
    Ack(AttemptArgs),
    /// Give up delivery ATTEMPT now: redelivered after backoff, or DEAD at the last attempt.
    Nack(AttemptArgs),
    /// Return DEAD timers to PENDING (due at once): one id, or every DEAD timer with --all.
    Redrive {
        namespace: String,
        id: Option<String>,
        #[arg(long, conflicts_with = "id")]
        all: bool,
    },
    /// Schedule many timers from concurrent clients and report the rate; with --wait, wait for
    /// them to fire and report lateness (fired_at - fire_at).
    Load {
        namespace: String,
        #[arg(long, default_value_t = 1000)]
        count: usize,
        /// Concurrent single-timer Schedule calls in flight.
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        /// Fire this long after scheduling starts.
        #[arg(long = "in", default_value = "3s", value_parser = humantime::parse_duration)]
        delay: Duration,
        /// Spread fire times evenly over this span after the delay.
        #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
        spread: Duration,
        /// Wait until every timer fired and print lateness percentiles.
        #[arg(long)]
        wait: bool,
    },
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum State {
    Pending,
    Fired,
    Acked,
    Cancelled,
    Dead,
    Expired,
}

impl State {
    fn to_pb(self) -> pb::TimerState {
        match self {
            State::Pending => pb::TimerState::Pending,
            State::Fired => pb::TimerState::Fired,
            State::Acked => pb::TimerState::Acked,
            State::Cancelled => pb::TimerState::Cancelled,
            State::Dead => pb::TimerState::Dead,
            State::Expired => pb::TimerState::Expired,
        }
    }
}

/// A connection to a node that sends the `--token` credential with every call.
pub(crate) type Ch = timerdb_client::Conn;

/// How to reach the cluster (`--ca`, `--cert`, `--key`, `--token`), set once in `main`.
static CONNECTOR: std::sync::OnceLock<timerdb_client::Connector> = std::sync::OnceLock::new();

/// The connector `--ca`, `--cert`, `--key` and `--token` make (plain text without TLS flags).
fn connector(cli: &Cli) -> anyhow::Result<timerdb_client::Connector> {
    let mut c = timerdb_client::Connector::new();
    if cli.ca.is_some() || cli.cert.is_some() || cli.endpoint.starts_with("https://") {
        let pair = cli.cert.as_deref().zip(cli.key.as_deref());
        c = c
            .tls_files(cli.ca.as_deref(), pair)
            .map_err(anyhow::Error::msg)?;
    }
    c.token(cli.token.as_deref()).map_err(anyhow::Error::msg)
}

pub(crate) async fn channel(endpoint: &str) -> anyhow::Result<Ch> {
    let connector = CONNECTOR.get().cloned().unwrap_or_default();
    connector
        .connect_timeout(Duration::from_secs(3))
        .connect(endpoint)
        .await
        .map_err(|s| output::unreachable(s.message()))
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn parse_at(s: &str) -> anyhow::Result<i64> {
    if let Ok(ms) = s.parse::<i64>() {
        return Ok(ms);
    }
    let t = humantime::parse_rfc3339_weak(s)
        .with_context(|| format!("--at {s:?} is neither epoch ms nor an RFC 3339 time"))?;
    Ok(t.duration_since(UNIX_EPOCH)?.as_millis() as i64)
}

pub(crate) use output::status_err;

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    output::set(cli.output);
    match connector(&cli) {
        Ok(c) => {
            let _ = CONNECTOR.set(c);
        }
        Err(e) => {
            output::error(&e);
            std::process::exit(1);
        }
    }
    if let Err(e) = run(cli).await {
        output::error(&e);
        std::process::exit(1);
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    // Before connecting: `backup inspect` needs no cluster.
    if let Command::Backup { command } = cli.command {
        return backup::backup(&cli.endpoint, command).await;
    }
    let ch = channel(&cli.endpoint).await?;
    let mut timers = TimersClient::new(ch.clone());
    match cli.command {
        Command::Schedule {
            namespace,
            id,
            when,
            recur,
            mode,
            payload,
            content_type,
        } => {
            let recurrence = recur.recurrence()?;
            let when = match (when.delay, when.at, &recurrence) {
                (Some(_), _, Some(_)) | (_, Some(_), Some(_)) => {
                    bail!("a recurring timer takes no --in or --at (use --start)")
                }
                (Some(d), _, _) => Some(pb::schedule_request::When::DelayMs(d.as_millis() as i64)),
                (None, Some(at), _) => Some(pb::schedule_request::When::FireAtMs(parse_at(&at)?)),
                (None, None, Some(_)) => None,
                (None, None, None) => bail!("give --in or --at (or --cron/--every)"),
            };
            let mut req = pb::ScheduleRequest {
                namespace,
                id,
                when,
                payload: payload.into_bytes(),
                content_type,
                recurrence,
                ..Default::default()
            };
            mode.apply(&mut req);
            // A mode that changes timers: "updated" rather than "exists" for created = false.
            let changes = req.mode > pb::CreateMode::CreateOnly as i32;
            if req.recurrence.is_none() {
                req.max_lateness_ms = recur.max_lateness.map_or(0, |d| d.as_millis() as i64);
            }
            let r = timers.schedule(req).await.map_err(status_err)?.into_inner();
            let verb = match (r.created, changes) {
                (true, _) => "scheduled",
                (false, true) => "updated",
                (false, false) => "exists",
            };
            output::timer(verb, &r.timer.unwrap_or_default());
        }
        Command::Cancel {
            namespace,
            id,
            cond,
        } => {
            let r = timers
                .cancel(pb::CancelRequest {
                    namespace,
                    id,
                    if_state: cond.state(),
                    if_revision: cond.revision(),
                })
                .await
                .map_err(status_err)?;
            output::timer("cancelled", &r.into_inner().timer.unwrap_or_default());
        }
        Command::Reschedule {
            namespace,
            id,
            when,
            shift,
            cond,
        } => {
            let when = match (when.delay, when.at, shift.when()) {
                (Some(d), _, None) => pb::reschedule_request::When::DelayMs(d.as_millis() as i64),
                (None, Some(at), None) => pb::reschedule_request::When::FireAtMs(parse_at(&at)?),
                (None, None, Some(shift)) => shift,
                _ => bail!("give one of --in, --at, --extend-by, --pull-in"),
            };
            let req = pb::RescheduleRequest {
                namespace,
                id,
                when: Some(when),
                if_state: cond.state(),
                if_revision: cond.revision(),
            };
            let r = timers.reschedule(req).await.map_err(status_err)?;
            output::timer("rescheduled", &r.into_inner().timer.unwrap_or_default());
        }
        Command::Get { namespace, id } => {
            let r = timers
                .get(pb::GetRequest {
                    namespace,
                    id,
                    ..Default::default()
                })
                .await
                .map_err(status_err)?;
            let t = r.into_inner().timer.unwrap_or_default();
            output::timer("", &t);
            if !output::json() && t.series.is_none() {
                output::attempts(&t);
            }
        }
        Command::Attempts { namespace, id } => {
            let r = timers
                .get(pb::GetRequest {
                    namespace,
                    id,
                    ..Default::default()
                })
                .await
                .map_err(status_err)?;
            output::attempts(&r.into_inner().timer.unwrap_or_default());
        }
        Command::List {
            namespace,
            state,
            limit,
            all,
            recurring,
        } => {
            list(&mut timers, namespace, (state, recurring), limit, all).await?;
        }
        Command::Next {
            namespace,
            id,
            count,
        } => recurring::next(timers, namespace, id, count).await?,
        Command::Pause { namespace, id } => recurring::pause(timers, namespace, id, true).await?,
        Command::Resume { namespace, id } => recurring::pause(timers, namespace, id, false).await?,
        Command::Status => status::status(ch).await?,
        Command::Namespace { command } => namespace::namespace(ch, command).await?,
        Command::Member { command } => member::member(ch, command).await?,
        Command::Auth { command } => access::auth(ch, command).await?,
        Command::Leader { command } => member::leader(ch, command).await?,
        Command::Slots { namespace } => groups::slots(ch, namespace).await?,
        Command::Group { command } => groups::group(ch, command).await?,
        Command::Backup { .. } => unreachable!("run before connecting"),
        Command::Watch {
            namespace,
            ack,
            consumer,
            max_in_flight,
            count,
        } => {
            // With --count, hold no more than will be printed: the rest would sit unacked in
            // this stream until their ack timeout.
            let max_in_flight = match count {
                Some(c) if max_in_flight == 0 => c.clamp(1, 100) as u32,
                _ => max_in_flight,
            };
            let req = pb::SubscribeRequest {
                namespace,
                consumer,
                max_in_flight,
            };
            let connector = CONNECTOR.get().cloned().unwrap_or_default();
            let client = timerdb_client::Client::connect(connector, &[cli.endpoint.as_str()])
                .await
                .map_err(status_err)?;
            delivery::watch(client, req, ack, count).await?;
        }
        Command::Ack(a) => delivery::settle(timers, a.namespace, a.id, a.attempt, true).await?,
        Command::Nack(a) => delivery::settle(timers, a.namespace, a.id, a.attempt, false).await?,
        Command::Redrive { namespace, id, all } => {
            delivery::redrive(timers, namespace, id, all).await?
        }
        Command::Load {
            namespace,
            count,
            concurrency,
            delay,
            spread,
            wait,
        } => {
            load::load(timers, namespace, count, concurrency, delay, spread, wait).await?;
        }
    }
    Ok(())
}

async fn list(
    timers: &mut TimersClient<Ch>,
    namespace: String,
    (state, recurring): (Option<State>, bool),
    limit: u32,
    all: bool,
) -> anyhow::Result<()> {
    let mut token = String::new();
    let mut n = 0;
    let mut docs = Vec::new();
    loop {
        let req = pb::ListRequest {
            namespace: namespace.clone(),
            state: state.map_or(0, |s| s.to_pb() as i32),
            limit,
            page_token: token,
            recurring,
            ..Default::default()
        };
        let page = timers.list(req).await.map_err(status_err)?.into_inner();
        for t in &page.timers {
            if output::json() {
                docs.push(output::timer_json(t));
            } else {
                println!("{}", output::timer_line(t));
            }
        }
        n += page.timers.len();
        token = page.next_page_token;
        if token.is_empty() || !all {
            break;
        }
    }
    if output::json() {
        output::doc(serde_json::json!({"timers": docs, "next_page_token": token}));
        return Ok(());
    }
    if !token.is_empty() {
        println!("(more: use --all)");
    }
    println!("{n} timer(s)");
    Ok(())
}
