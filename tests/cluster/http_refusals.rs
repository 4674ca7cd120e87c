//! The HTTP/JSON API's refusals on a real cluster: every kind of client mistake answered 4xx
//! with a JSON error that says what is wrong (never a 5xx, nothing half-written), and auth
//! applied to HTTP calls exactly as to gRPC calls, on every node.

use std::time::Duration;

use http_body_util::BodyExt;
use serde_json::{json, Value};

use crate::harness::*;
use crate::http::{check_refusal, Api};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_mistakes_are_4xx_with_a_message() {
    let cluster = TestCluster::start(3).await;
    let api = Api::new(&cluster, cluster.follower().await);
    let timers = "/v1/namespaces/web/timers";
    // (method, path, body, HTTP status, gRPC code, a phrase the message must hold)
    type Case<'a> = (&'a str, &'a str, Option<&'a str>, u16, &'a str, &'a str);
    let cases: Vec<Case> = vec![
        (
            "POST",
            timers,
            Some("{not json"),
            400,
            "INVALID_ARGUMENT",
            "not valid JSON",
        ),
        (
            "POST",
            timers,
            Some("[1, 2]"),
            400,
            "INVALID_ARGUMENT",
            "must be a JSON object",
        ),
        (
            "POST",
            timers,
            Some(r#"{"id": "a", "fire_inn": 5}"#),
            400,
            "INVALID_ARGUMENT",
            "fire_inn",
        ),
        (
            "POST",
            timers,
            Some(r#"{"id": "a", "delay_ms": "soon"}"#),
            400,
            "INVALID_ARGUMENT",
            "delay_ms: invalid",
        ),
        (
            "POST",
            timers,
            Some(r#"{"id": 5, "delay_ms": 1}"#),
            400,
            "INVALID_ARGUMENT",
            "id: invalid type",
        ),
        (
            "POST",
            timers,
            Some(r#"{"id": "a", "delay_ms": 1, "mode": "sometimes"}"#),
            400,
            "INVALID_ARGUMENT",
            "one of create_only, upsert",
        ),
        (
            "POST",
            timers,
            Some(r#"{"id": "a", "delay_ms": 1, "payload": "!!"}"#),
            400,
            "INVALID_ARGUMENT",
            "payload: ",
        ),
        (
            "POST",
            timers,
            Some(r#"{"id": "a", "delay_ms": 1, "payload": "eA==", "payload_json": 1}"#),
            400,
            "INVALID_ARGUMENT",
            "give one of them",
        ),
        (
            "POST",
            timers,
            Some(r#"{"delay_ms": 1}"#),
            400,
            "INVALID_ARGUMENT",
            "id",
        ),
        (
            "POST",
            timers,
            Some(r#"{"id": "a", "delay_ms": -5}"#),
            400,
            "INVALID_ARGUMENT",
            "delay",
        ),
        (
            "POST",
            timers,
            Some(r#"{"id": "a", "delay_ms": 1, "namespace": "other"}"#),
            400,
            "INVALID_ARGUMENT",
            "in the path",
        ),
        (
            "POST",
            "/v1/namespaces/web/timers?delay_ms=5",
            Some("{}"),
            400,
            "INVALID_ARGUMENT",
            "in the JSON body",
        ),
        (
            "POST",
            "/v1/namespaces/web/timers:batch",
            Some(r#"{"timers": 5}"#),
            400,
            "INVALID_ARGUMENT",
            "array",
        ),
        (
            "POST",
            "/v1/namespaces/web/timers:batch",
            Some(r#"{"timers": [{"id": "a", "delay_ms": 1}, {"id": "b", "delay_ms": []}]}"#),
            400,
            "INVALID_ARGUMENT",
            "timers[1].delay_ms",
        ),
        (
            "GET",
            "/v1/namespaces/web/timers?state=sleeping",
            None,
            400,
            "INVALID_ARGUMENT",
            "one of pending",
        ),
        (
            "GET",
            "/v1/namespaces/web/timers?limit=many",
            None,
            400,
            "INVALID_ARGUMENT",
            "integer",
        ),
        (
            "GET",
            "/v1/namespaces/web/timers?colour=red",
            None,
            400,
            "INVALID_ARGUMENT",
            "unknown query parameter colour",
        ),
        (
            "GET",
            "/v1/namespaces/web/timers?recurring=perhaps",
            None,
            400,
            "INVALID_ARGUMENT",
            "true or false",
        ),
        (
            "GET",
            "/v1/namespaces/web/timers/%FF",
            None,
            400,
            "INVALID_ARGUMENT",
            "not valid",
        ),
        (
            "DELETE",
            "/v1/cluster/nodes/abc",
            None,
            400,
            "INVALID_ARGUMENT",
            "non-negative integer",
        ),
        (
            "GET",
            "/v1/nothing/here",
            None,
            404,
            "NOT_FOUND",
            "no such route",
        ),
        (
            "PATCH",
            "/v1/namespaces/web/timers/a",
            None,
            405,
            "UNIMPLEMENTED",
            "GET, DELETE",
        ),
        (
            "PUT",
            "/v1/namespaces/web",
            Some(r#"{"policy": {"max_attempts": -1}}"#),
            400,
            "INVALID_ARGUMENT",
            "max_attempts",
        ),
    ];
    for (method, path, body, status, code, needle) in cases {
        let (got, v) = api
            .raw(method, path, body.map(|b| b.as_bytes().to_vec()))
            .await;
        let message = check_refusal(method, path, got, &v, status, code);
        assert!(
            message.contains(needle),
            "{method} {path} {body:?}: {message:?} lacks {needle:?}"
        );
    }
    // A namespace's schedule rate limit: 429 with the wait, as Retry-After and in the JSON.
    let slow = json!({"policy": {"max_schedules_per_second": 1, "max_schedule_burst": 1}});
    api.ok("PUT", "/v1/namespaces/slow", Some(slow)).await;
    // The leader's bucket starts empty in each term: send until one is refused.
    let mut refused = None;
    for i in 0..4 {
        let body = json!({"id": format!("s{i}"), "delay_ms": 60000, "payload": ""});
        let body = serde_json::to_vec(&body).unwrap();
        let resp = api
            .http
            .request(api.request("POST", "/v1/namespaces/slow/timers", Some(body)))
            .await
            .unwrap();
        if resp.status() != 200 {
            refused = Some(resp);
            break;
        }
    }
    let resp = refused.expect("a schedule over 1 a second is refused");
    assert_eq!(resp.status(), 429);
    let wait: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=2).contains(&wait), "{wait}");
    let v: Value =
        serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(v["error"]["status"], json!("RESOURCE_EXHAUSTED"));
    assert!(v["error"]["retry_after_ms"].as_u64().unwrap() > 0, "{v}");
    // A body over the call's limit (4 MiB for Namespaces) → 413, before it is transcoded.
    let big = vec![b' '; 5 * 1024 * 1024];
    let (got, v) = api.raw("PUT", "/v1/namespaces/web", Some(big)).await;
    check_refusal("PUT", "big", got, &v, 413, "RESOURCE_EXHAUSTED");
    // The 405 names what the path takes.
    let resp = api
        .http
        .request(api.request("PATCH", "/v1/namespaces/web/timers/a", None))
        .await
        .unwrap();
    assert_eq!(resp.headers()["allow"], "GET, DELETE");
    // Nothing half-written: no timer "a" came of any of it.
    api.refused("GET", "/v1/namespaces/web/timers/a", None, 404, "NOT_FOUND")
        .await;
    // gRPC still works on the same port.
    let mut c = cluster.client(cluster.follower().await).await;
    c.schedule(schedule_req("g", now_ms() + 60_000))
        .await
        .unwrap();
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_covers_http_as_it_covers_grpc() {
    let cluster = TestCluster::start(3).await;
    let mut api = Api::new(&cluster, cluster.follower().await);
    let admin = api
        .ok(
            "POST",
            "/v1/access/keys",
            Some(json!({"name": "ops", "roles": ["admin"]})),
        )
        .await;
    let writer = api
        .ok(
            "POST",
            "/v1/access/keys",
            Some(json!({"name": "orders", "roles": ["schedule:orders*", "read:orders*"]})),
        )
        .await;
    let admin = admin["token"].as_str().unwrap().to_string();
    let writer = writer["token"].as_str().unwrap().to_string();
    api.ok("PUT", "/v1/access/auth", Some(json!({"enabled": true})))
        .await;
    // Every node applies the switch; then no key: 401 on every node.
    let body = json!({"id": "x", "delay_ms": 60000, "payload": ""});
    for id in cluster.running() {
        let anon = Api::new(&cluster, id);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let (status, v) = anon
                .call("POST", "/v1/namespaces/orders/timers", Some(body.clone()))
                .await;
            if status == 401 {
                assert_eq!(v["error"]["status"], json!("UNAUTHENTICATED"));
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "node {id}: {status} {v}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    api.token = Some(writer.clone());
    api.ok("POST", "/v1/namespaces/orders/timers", Some(body.clone()))
        .await;
    api.ok("GET", "/v1/namespaces/orders/timers/x", None).await;
    let m = api
        .refused(
            "POST",
            "/v1/namespaces/billing/timers",
            Some(body),
            403,
            "PERMISSION_DENIED",
        )
        .await;
    assert!(m.contains("may not schedule"), "{m}");
    api.refused("GET", "/v1/access/keys", None, 403, "PERMISSION_DENIED")
        .await;
    api.token = Some("tdbk_nonsense".into());
    api.refused(
        "GET",
        "/v1/namespaces/orders/timers/x",
        None,
        401,
        "UNAUTHENTICATED",
    )
    .await;
    api.token = Some(admin);
    let v = api.ok("GET", "/v1/access/keys", None).await;
    assert_eq!(v["auth_enabled"], json!(true));
    let v = api.ok("GET", "/v1/access/whoami", None).await;
    assert_eq!(v["roles"], json!(["admin"]));
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_leader_is_503_unavailable() {
    let mut cluster = TestCluster::start(3).await;
    let survivor = cluster.follower().await;
    let api = Api::new(&cluster, survivor);
    let timer = json!({"id": "a", "delay_ms": 60000});
    api.ok("POST", "/v1/namespaces/web/timers", Some(timer))
        .await;
    for id in cluster.running() {
        if id != survivor {
            cluster.stop(id).await;
        }
    }
    // No quorum: the call waits the node's leader wait, then 503 with why.
    let m = api
        .refused(
            "GET",
            "/v1/namespaces/web/timers/a",
            None,
            503,
            "UNAVAILABLE",
        )
        .await;
    assert!(!m.is_empty());
    cluster.shutdown().await;
}
