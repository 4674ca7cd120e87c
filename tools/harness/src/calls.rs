//! The calls tests make of a cluster, in-process or not: requests in the test namespace
//! ([`NS`], each timer's payload its id), reads through List paging, and waits for timers to
//! fire that also check, on the client's clock, that none was seen FIRED before its time.

use std::time::{Duration, Instant};

use timerdb::api::pb::{self, timers_client::TimersClient};
use tonic::transport::Channel;

/// The namespace the test calls use.
pub const NS: &str = "test";

pub fn now_ms() -> i64 {
    timerdb::clock::Clock::system().now_ms()
}

pub fn at(t: i64) -> Option<pb::schedule_request::When> {
    Some(pb::schedule_request::When::FireAtMs(t))
}

pub fn schedule_req(id: &str, fire_at_ms: i64) -> pb::ScheduleRequest {
    pb::ScheduleRequest {
        namespace: NS.into(),
        id: id.into(),
        when: at(fire_at_ms),
        payload: id.as_bytes().to_vec(),
        ..Default::default()
    }
}

pub async fn get(c: &mut TimersClient<Channel>, id: &str) -> Result<pb::Timer, tonic::Status> {
    let r = c
        .get(pb::GetRequest {
            namespace: NS.into(),
            id: id.into(),
            ..Default::default()
        })
        .await?;
    Ok(r.into_inner().timer.unwrap())
}

/// Every timer of the namespace, through List paging.
pub async fn list_all(c: &mut TimersClient<Channel>, state: pb::TimerState) -> Vec<pb::Timer> {
    list_in(c, NS, state).await
}

/// Every timer of `namespace` in `state` (UNSPECIFIED: all), through List paging.
pub async fn list_in(
    c: &mut TimersClient<Channel>,
    namespace: &str,
    state: pb::TimerState,
) -> Vec<pb::Timer> {
    let mut out = Vec::new();
    let mut token = String::new();
    loop {
        let req = pb::ListRequest {
            namespace: namespace.into(),
            state: state as i32,
            limit: 1000,
            page_token: token,
            ..Default::default()
        };
        // A loaded leader may answer UNAVAILABLE for a moment (a stalled fsync, "no quorum"
        // for ~1 s); the read is safe to retry.
        let mut tries = 0;
        let page = loop {
            match c.list(req.clone()).await {
                Err(s) if s.code() == tonic::Code::Unavailable && tries < 50 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                r => break r.unwrap().into_inner(),
            }
        };
        out.extend(page.timers);
        token = page.next_page_token;
        if token.is_empty() {
            return out;
        }
    }
}

/// Polls until `n` timers of the namespace are FIRED (through any node), or panics.
///
/// Also the observer's never-early check: `fired_at_ms` is the state machine's own claim, so it
/// cannot reveal an early fire; the client's clock can. A timer seen FIRED in a response that
/// arrived before its `fire_at_ms` (same machine, same clock) fired early.
pub async fn wait_fired(
    c: &mut TimersClient<Channel>,
    n: usize,
    within: Duration,
) -> Vec<pb::Timer> {
    let deadline = Instant::now() + within;
    loop {
        let fired = list_all(c, pb::TimerState::Fired).await;
        let seen_at = now_ms();
        assert_not_early(&fired, seen_at);
        if fired.len() >= n {
            return fired;
        }
        assert!(
            Instant::now() < deadline,
            "only {} of {n} timers fired within {within:?}",
            fired.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Panics if any of `fired` is due after `seen_at`, the client time its FIRED state was known by.
pub fn assert_not_early(fired: &[pb::Timer], seen_at: i64) {
    for t in fired {
        assert!(
            t.fire_at_ms <= seen_at,
            "{} observed FIRED at {seen_at}, {} ms before its fire time {}",
            t.id,
            t.fire_at_ms - seen_at,
            t.fire_at_ms
        );
        assert!(
            t.fired_at_ms >= t.fire_at_ms,
            "{} claims fired_at {} < fire_at {}",
            t.id,
            t.fired_at_ms,
            t.fire_at_ms
        );
    }
}

/// Polls one timer until it reaches `state`, checking it is never seen fired early.
pub async fn wait_state(
    c: &mut TimersClient<Channel>,
    id: &str,
    state: pb::TimerState,
    within: Duration,
) -> pb::Timer {
    let deadline = Instant::now() + within;
    loop {
        let t = get(c, id).await.unwrap();
        if t.state == pb::TimerState::Fired as i32 {
            assert_not_early(std::slice::from_ref(&t), now_ms());
        }
        if t.state == state as i32 {
            return t;
        }
        assert!(
            Instant::now() < deadline,
            "{id} did not reach {state:?} within {within:?}: {t:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
