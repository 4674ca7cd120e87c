//! `timerctl`: the command-line client of a timerdb cluster.
//!
//! Talks to any node (`--endpoint`, default `127.0.0.1:7101` or `$TIMERDB_ENDPOINT`); the node
//! forwards to the leader. Output is for people: one line per timer, times in RFC 3339 UTC.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use clap::{Parser, Subcommand, ValueEnum};
use timerdb::api::pb::{
    self, cluster_client::ClusterClient, namespaces_client::NamespacesClient,
    timers_client::TimersClient,
};
use tonic::transport::Channel;

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
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Debug)]
#[group(required = true, multiple = false)]
struct WhenArgs {
    /// Fire after this delay, e.g. 500ms, 10s, 5m, 2h.
    #[arg(long = "in", value_parser = humantime::parse_duration)]
    delay: Option<Duration>,
    /// Fire at this time: RFC 3339 (2030-01-01T00:00:00Z) or Unix epoch milliseconds.
    #[arg(long)]
    at: Option<String>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Schedule a timer.
    Schedule {
        namespace: String,
        id: String,
        #[command(flatten)]
        when: WhenArgs,
        /// Payload, as text.
        #[arg(long, default_value = "")]
        payload: String,
    },
    /// Cancel a PENDING timer (definitive: it will never fire, or the call fails).
    Cancel { namespace: String, id: String },
    /// Move a PENDING timer to a new time.
    Reschedule {
        namespace: String,
        id: String,
        #[command(flatten)]
        when: WhenArgs,
    },
    /// Show one timer.
    Get { namespace: String, id: String },
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
    },
    /// Show this node's view of the cluster.
    Status,
    /// Read and set namespace policies.
    Namespace {
        #[command(subcommand)]
        command: NamespaceCommand,
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

#[derive(Subcommand, Debug)]
enum NamespaceCommand {
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

#[derive(ValueEnum, Clone, Copy, Debug)]
enum State {
    Pending,
    Fired,
    Acked,
    Cancelled,
    Dead,
}

impl State {
    fn to_pb(self) -> pb::TimerState {
        match self {
            State::Pending => pb::TimerState::Pending,
            State::Fired => pb::TimerState::Fired,
            State::Acked => pb::TimerState::Acked,
            State::Cancelled => pb::TimerState::Cancelled,
            State::Dead => pb::TimerState::Dead,
        }
    }
}

fn endpoint_uri(e: &str) -> String {
    if e.starts_with("http://") || e.starts_with("https://") {
        e.to_string()
    } else {
        format!("http://{e}")
    }
}

async fn channel(endpoint: &str) -> anyhow::Result<Channel> {
    let uri = endpoint_uri(endpoint);
    tonic::transport::Endpoint::from_shared(uri.clone())?
        .connect_timeout(Duration::from_secs(3))
        .connect()
        .await
        .with_context(|| format!("cannot reach a timerdb node at {uri} (is it running?)"))
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn fmt_ms(ms: i64) -> String {
    if ms <= 0 {
        return "-".into();
    }
    let t = UNIX_EPOCH + Duration::from_millis(ms as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

fn parse_at(s: &str) -> anyhow::Result<i64> {
    if let Ok(ms) = s.parse::<i64>() {
        return Ok(ms);
    }
    let t = humantime::parse_rfc3339_weak(s)
        .with_context(|| format!("--at {s:?} is neither epoch ms nor an RFC 3339 time"))?;
    Ok(t.duration_since(UNIX_EPOCH)?.as_millis() as i64)
}

fn state_name(v: i32) -> &'static str {
    pb::TimerState::try_from(v).map_or("?", |s| s.as_str_name().trim_start_matches("TIMER_STATE_"))
}

fn print_timer(t: &pb::Timer) {
    let mut line = format!(
        "{}/{}  {}  fire_at={}",
        t.namespace,
        t.id,
        state_name(t.state),
        fmt_ms(t.fire_at_ms)
    );
    if t.fire_index > 0 {
        line += &format!(
            "  fired_at={} (+{} ms) fire_index={}",
            fmt_ms(t.fired_at_ms),
            t.fired_at_ms - t.fire_at_ms,
            t.fire_index
        );
    }
    if t.finished_at_ms > 0 {
        line += &format!("  finished_at={}", fmt_ms(t.finished_at_ms));
    }
    if !t.payload.is_empty() {
        line += &format!("  payload={:?}", String::from_utf8_lossy(&t.payload));
    }
    println!("{line}");
}

fn status_err(s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{:?}: {}", s.code(), s.message())
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli).await {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let ch = channel(&cli.endpoint).await?;
    let mut timers = TimersClient::new(ch.clone());
    match cli.command {
        Command::Schedule {
            namespace,
            id,
            when,
            payload,
        } => {
            let when = match (when.delay, when.at) {
                (Some(d), _) => pb::schedule_request::When::DelayMs(d.as_millis() as i64),
                (None, Some(at)) => pb::schedule_request::When::FireAtMs(parse_at(&at)?),
                (None, None) => bail!("give --in or --at"),
            };
            let req = pb::ScheduleRequest {
                namespace,
                id,
                when: Some(when),
                payload: payload.into_bytes(),
            };
            let r = timers.schedule(req).await.map_err(status_err)?.into_inner();
            print!("{} ", if r.created { "scheduled" } else { "exists" });
            print_timer(&r.timer.unwrap_or_default());
        }
        Command::Cancel { namespace, id } => {
            let r = timers
                .cancel(pb::CancelRequest { namespace, id })
                .await
                .map_err(status_err)?;
            print!("cancelled ");
            print_timer(&r.into_inner().timer.unwrap_or_default());
        }
        Command::Reschedule {
            namespace,
            id,
            when,
        } => {
            let when = match (when.delay, when.at) {
                (Some(d), _) => pb::reschedule_request::When::DelayMs(d.as_millis() as i64),
                (None, Some(at)) => pb::reschedule_request::When::FireAtMs(parse_at(&at)?),
                (None, None) => bail!("give --in or --at"),
            };
            let req = pb::RescheduleRequest {
                namespace,
                id,
                when: Some(when),
            };
            let r = timers.reschedule(req).await.map_err(status_err)?;
            print!("rescheduled ");
            print_timer(&r.into_inner().timer.unwrap_or_default());
        }
        Command::Get { namespace, id } => {
            let r = timers
                .get(pb::GetRequest { namespace, id })
                .await
                .map_err(status_err)?;
            print_timer(&r.into_inner().timer.unwrap_or_default());
        }
        Command::List {
            namespace,
            state,
            limit,
            all,
        } => {
            list(&mut timers, namespace, state, limit, all).await?;
        }
        Command::Status => status(ch).await?,
        Command::Namespace { command } => namespace(ch, command).await?,
        Command::Load {
            namespace,
            count,
            concurrency,
            delay,
            spread,
            wait,
        } => {
            load(timers, namespace, count, concurrency, delay, spread, wait).await?;
        }
    }
    Ok(())
}

async fn list(
    timers: &mut TimersClient<Channel>,
    namespace: String,
    state: Option<State>,
    limit: u32,
    all: bool,
) -> anyhow::Result<()> {
    let mut token = String::new();
    let mut n = 0;
    loop {
        let req = pb::ListRequest {
            namespace: namespace.clone(),
            state: state.map_or(0, |s| s.to_pb() as i32),
            limit,
            page_token: token,
            ..Default::default()
        };
        let page = timers.list(req).await.map_err(status_err)?.into_inner();
        for t in &page.timers {
            print_timer(t);
        }
        n += page.timers.len();
        token = page.next_page_token;
        if token.is_empty() || !all {
            break;
        }
    }
    if !token.is_empty() {
        println!("(more: use --all)");
    }
    println!("{n} timer(s)");
    Ok(())
}

async fn status(ch: Channel) -> anyhow::Result<()> {
    let s = ClusterClient::new(ch)
        .status(pb::StatusRequest {})
        .await
        .map_err(status_err)?
        .into_inner();
    println!(
        "node {}  role={}  leader={}  term={}",
        s.node_id, s.role, s.leader_id, s.term
    );
    println!(
        "last_log_index={}  applied_index={}  pending_timers={}",
        s.last_log_index, s.applied_index, s.pending_timers
    );
    println!("time_cursor={}", fmt_ms(s.time_cursor_ms));
    for m in s.members {
        let lead = if m.node_id == s.leader_id {
            "  (leader)"
        } else {
            ""
        };
        println!(
            "  member {}  {}  {}{lead}",
            m.node_id,
            m.addr,
            if m.voter { "voter" } else { "learner" }
        );
    }
    Ok(())
}

async fn load(
    timers: TimersClient<Channel>,
    namespace: String,
    count: usize,
    concurrency: usize,
    delay: Duration,
    spread: Duration,
    wait: bool,
) -> anyhow::Result<()> {
    let base = now_ms() + delay.as_millis() as i64;
    let spread_ms = spread.as_millis() as i64;
    let run = now_ms();
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency.max(1) {
        let (mut c, next, ns) = (timers.clone(), next.clone(), namespace.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= count {
                    return Ok::<_, tonic::Status>(());
                }
                let offset = if count > 1 {
                    spread_ms * i as i64 / (count as i64 - 1)
                } else {
                    0
                };
                let req = pb::ScheduleRequest {
                    namespace: ns.clone(),
                    id: format!("load-{run}-{i}"),
                    when: Some(pb::schedule_request::When::FireAtMs(base + offset)),
                    payload: Vec::new(),
                };
                c.schedule(req).await?;
            }
        }));
    }
    for t in tasks {
        t.await?.map_err(status_err)?;
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "scheduled {count} timers in {secs:.2} s: {:.0} schedules/s ({concurrency} in flight)",
        count as f64 / secs
    );
    if wait {
        report_lateness(
            timers,
            &namespace,
            &format!("load-{run}-"),
            count,
            base + spread_ms,
        )
        .await?;
    }
    Ok(())
}

/// Waits until every timer of this load run fired, then prints lateness percentiles.
async fn report_lateness(
    mut timers: TimersClient<Channel>,
    namespace: &str,
    prefix: &str,
    count: usize,
    last_fire_ms: i64,
) -> anyhow::Result<()> {
    let deadline = Instant::now()
        + Duration::from_millis((last_fire_ms - now_ms()).max(0) as u64)
        + Duration::from_secs(60);
    loop {
        let mut lateness = Vec::with_capacity(count);
        let mut token = String::new();
        loop {
            let req = pb::ListRequest {
                namespace: namespace.into(),
                state: pb::TimerState::Fired as i32,
                limit: 10_000,
                page_token: token,
                ..Default::default()
            };
            let page = timers.list(req).await.map_err(status_err)?.into_inner();
            lateness.extend(
                page.timers
                    .iter()
                    .filter(|t| t.id.starts_with(prefix))
                    .map(|t| t.fired_at_ms - t.fire_at_ms),
            );
            token = page.next_page_token;
            if token.is_empty() {
                break;
            }
        }
        if lateness.len() >= count {
            lateness.sort_unstable();
            let p = |q: f64| lateness[((lateness.len() - 1) as f64 * q) as usize];
            println!(
                "all {count} fired; lateness (fired_at - fire_at, ms): min {} p50 {} p99 {} max {}",
                lateness[0],
                p(0.5),
                p(0.99),
                lateness[lateness.len() - 1]
            );
            if lateness[0] < 0 {
                bail!("a timer fired early");
            }
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("only {} of {count} timers fired in time", lateness.len());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn ms(d: Option<Duration>) -> u64 {
    d.map_or(0, |d| d.as_millis() as u64)
}

fn print_namespace(ns: &pb::Namespace) {
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

async fn namespace(ch: Channel, command: NamespaceCommand) -> anyhow::Result<()> {
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
                    print_namespace(ns);
                }
                n += page.namespaces.len();
                token = page.next_page_token;
                if token.is_empty() {
                    break;
                }
            }
            println!("{n} configured namespace(s)");
        }
    }
    Ok(())
}
