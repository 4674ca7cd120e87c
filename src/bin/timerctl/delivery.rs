//! `timerctl watch|ack|nack|redrive`: consuming fired timers by hand.

use crate::Ch as Channel;
use timerdb::api::pb::{self, timers_client::TimersClient};

use crate::output::{self, status_err};

/// Subscribes and prints each delivery; acks it with `ack`; stops after `count` if given. The
/// client library's subscription: it resubscribes if the stream breaks, and sends the acks in
/// batches, all applied (or reported refused) before this returns.
pub async fn watch(
    client: timerdb_client::Client,
    req: pb::SubscribeRequest,
    ack: bool,
    count: Option<usize>,
) -> anyhow::Result<()> {
    let namespace = req.namespace.clone();
    let options = timerdb_client::SubscriptionOptions {
        consumer: req.consumer,
        max_in_flight: req.max_in_flight,
        ..Default::default()
    };
    let mut sub = client.subscribe(&namespace, options);
    eprintln!("watching {namespace} (Ctrl-C to stop)");
    let mut n = 0;
    while count.is_none_or(|c| n < c) {
        let Some(d) = sub.next().await else {
            anyhow::bail!("the subscription ended");
        };
        let d = d.map_err(status_err)?;
        n += 1;
        let t = d.timer.clone().unwrap_or_default();
        if output::json() {
            output::doc(serde_json::json!({"attempt": d.attempt, "timer": output::timer_json(&t)}));
        } else {
            println!("delivery attempt={}  {}", d.attempt, output::timer_line(&t));
        }
        if ack {
            sub.ack(&d);
        }
    }
    if ack {
        let outcome = sub.flush().await;
        for (id, attempt, why) in &outcome.refused {
            eprintln!(
                "ack of {namespace}/{id} attempt {attempt} refused: {}",
                why.message()
            );
        }
        if !outcome.refused.is_empty() {
            anyhow::bail!("{} of the acks were refused", outcome.refused.len());
        }
    }
    Ok(())
}

/// Acks (`ack`) or nacks delivery `attempt` of a timer and prints the timer after it.
pub async fn settle(
    mut timers: TimersClient<Channel>,
    namespace: String,
    id: String,
    attempt: u32,
    ack: bool,
) -> anyhow::Result<()> {
    let timer = if ack {
        // A person at a terminal wants to see the timer ACKED: wait for the ack to apply.
        let req = pb::AckRequest {
            namespace,
            id,
            attempt,
            wait_for_commit: true,
        };
        timers
            .ack(req)
            .await
            .map_err(status_err)?
            .into_inner()
            .timer
    } else {
        let req = pb::NackRequest {
            namespace,
            id,
            attempt,
        };
        timers
            .nack(req)
            .await
            .map_err(status_err)?
            .into_inner()
            .timer
    };
    let verb = if ack { "acked" } else { "nacked" };
    output::timer(verb, &timer.unwrap_or_default());
    Ok(())
}

pub async fn redrive(
    mut timers: TimersClient<Channel>,
    namespace: String,
    id: Option<String>,
    all: bool,
) -> anyhow::Result<()> {
    if id.is_none() && !all {
        anyhow::bail!("give the id of a DEAD timer, or --all");
    }
    let req = pb::RedriveRequest {
        namespace: namespace.clone(),
        id: id.unwrap_or_default(),
        all,
    };
    let r = timers.redrive(req).await.map_err(status_err)?.into_inner();
    if output::json() {
        let timers: Vec<_> = r.timers.iter().map(output::timer_json).collect();
        output::doc(serde_json::json!({"redriven": r.redriven, "timers": timers}));
        return Ok(());
    }
    for t in &r.timers {
        output::timer("redriven", t);
    }
    if all {
        println!(
            "{} DEAD timer(s) of {namespace} are PENDING again",
            r.redriven
        );
    }
    Ok(())
}
