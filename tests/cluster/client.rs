//! The Rust client library (`timerdb-client`) against real `timerd` processes with the leader
//! SIGKILLed mid-load: every Schedule call is answered OK exactly once from the caller's point
//! of view (its idempotent retries hidden), every timer exists once, and the subscription, held
//! on the killed leader, resumes on another node until every timer is delivered and acked.

use std::collections::HashSet;
use std::time::Duration;

use tempfile::TempDir;
use timerdb::api::pb;
use timerdb_client::{Client, Connector, SubscriptionOptions};

use crate::process::start_three;

const NS: &str = "client-lib";
const WRITERS: usize = 8;
const PER_WRITER: usize = 150;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_rides_through_a_leader_kill() {
    crate::harness::init_tracing();
    let tmp = TempDir::new().unwrap();
    let (mut procs, _) = start_three(&tmp);
    let addrs: Vec<String> = procs.iter().map(|p| p.addr.clone()).collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let client = loop {
        match Client::connect(Connector::new(), &addrs).await {
            Ok(c) if c.leader_id().is_some() => break c,
            _ if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            other => panic!("no leader: {:?}", other.err()),
        }
    };
    let leader = client.leader_id().unwrap();
    assert_eq!(
        client.current(),
        addrs[leader as usize - 1],
        "calls go to the leader"
    );
    let policy = pb::NamespacePolicy {
        ack_timeout_ms: 3_000,
        ..Default::default()
    };
    client
        .put_namespace(pb::PutNamespaceRequest {
            name: NS.into(),
            policy: Some(policy),
        })
        .await
        .unwrap();
    // Subscribed through the leader, which is about to die.
    let options = SubscriptionOptions {
        consumer: "client-test".into(),
        max_in_flight: 2_000,
        ..Default::default()
    };
    let mut sub = client.subscribe(NS, options);

    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let client = client.clone();
        writers.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            for i in 0..PER_WRITER {
                let req = pb::ScheduleRequest {
                    namespace: NS.into(),
                    id: format!("w{w}-{i}"),
                    when: Some(pb::schedule_request::When::DelayMs(1_500)),
                    payload: b"x".to_vec(),
                    ..Default::default()
                };
                answers.push((req.id.clone(), client.schedule(req).await));
            }
            answers
        }));
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    let killed = &mut procs[leader as usize - 1];
    let mut child = killed.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();

    let mut ids = HashSet::new();
    let mut not_created = 0;
    for w in writers {
        for (id, answer) in w.await.unwrap() {
            let answer = answer.unwrap_or_else(|s| panic!("schedule {id} failed: {s:?}"));
            not_created += usize::from(!answer.created);
            assert_eq!(answer.timer.unwrap().id, id);
            assert!(ids.insert(id), "one answer per call");
        }
    }
    let total = WRITERS * PER_WRITER;
    assert_eq!(ids.len(), total);
    eprintln!("{total} schedules answered OK once each; {not_created} of them by a retry that found the timer made (created = false)");

    // Every timer delivered (at least once) and acked, through whichever node serves.
    let mut seen = HashSet::new();
    while seen.len() < total {
        let d = tokio::time::timeout(Duration::from_secs(60), sub.next())
            .await
            .unwrap_or_else(|_| panic!("{} of {total} delivered after 60 s", seen.len()))
            .expect("the subscription lives")
            .expect("the subscription is served");
        sub.ack(&d);
        let id = d.timer.unwrap().id;
        assert!(
            ids.contains(&id),
            "a delivery of a timer never scheduled: {id}"
        );
        seen.insert(id);
    }
    let outcome = sub.flush().await;
    assert!(
        sub.resubscribed() >= 1,
        "the stream on the killed leader was opened again elsewhere"
    );
    eprintln!(
        "delivered {total}, acks applied {}, refused {} (deliveries handed out again), resubscribed {}",
        outcome.acked,
        outcome.refused.len(),
        sub.resubscribed()
    );
    // The server's view: every timer ACKED once.
    let mut acked = 0;
    let mut token = String::new();
    loop {
        let page = client
            .list(pb::ListRequest {
                namespace: NS.into(),
                state: pb::TimerState::Acked as i32,
                limit: 1_000,
                page_token: token,
                ..Default::default()
            })
            .await
            .unwrap();
        acked += page.timers.len();
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    assert_eq!(acked, total, "every timer acked");
    assert_ne!(
        client.leader_id(),
        Some(leader),
        "the client follows the new leader"
    );
}
