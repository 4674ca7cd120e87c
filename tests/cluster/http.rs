//! The HTTP/JSON API on a real 3-node cluster, over real HTTP/1.1 connections: every route
//! through a follower, and the OpenAPI document checked against what is served (refusals and
//! auth: `http_refusals`).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

use crate::harness::*;

type Http = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

/// One node's HTTP API.
pub struct Api {
    base: String,
    pub http: Http,
    pub token: Option<String>,
}

impl Api {
    pub fn new(c: &TestCluster, id: u64) -> Api {
        Api {
            base: format!("http://{}", c.node(id).addr),
            http: Client::builder(TokioExecutor::new()).build_http(),
            token: None,
        }
    }

    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> http::Request<Full<Bytes>> {
        let mut b = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            b = b.header("authorization", format!("Bearer {t}"));
        }
        if body.is_some() {
            // What `curl -d` sends: the API reads the body as JSON whatever it is labelled.
            b = b.header("content-type", "application/x-www-form-urlencoded");
        }
        b.body(Full::new(Bytes::from(body.unwrap_or_default())))
            .unwrap()
    }

    /// The status and JSON answer of one call.
    pub async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let body = body.map(|b| serde_json::to_vec(&b).unwrap());
        self.raw(method, path, body).await
    }

    pub async fn raw(&self, method: &str, path: &str, body: Option<Vec<u8>>) -> (u16, Value) {
        let resp = self
            .http
            .request(self.request(method, path, body))
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let v = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            panic!(
                "{method} {path}: not JSON ({e}): {}",
                String::from_utf8_lossy(&bytes)
            )
        });
        (status, v)
    }

    /// A call that must succeed.
    pub async fn ok(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let (status, v) = self.call(method, path, body).await;
        assert_eq!(status, 200, "{method} {path}: {v}");
        v
    }

    /// A call that must be refused with `status` and gRPC code name `code`; returns the message.
    pub async fn refused(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        status: u16,
        code: &str,
    ) -> String {
        let (got, v) = self.call(method, path, body).await;
        check_refusal(method, path, got, &v, status, code)
    }
}

pub fn check_refusal(
    method: &str,
    path: &str,
    got: u16,
    v: &Value,
    status: u16,
    code: &str,
) -> String {
    assert_eq!(got, status, "{method} {path}: {v}");
    assert_eq!(v["error"]["code"], json!(status), "{v}");
    assert_eq!(v["error"]["status"], json!(code), "{method} {path}: {v}");
    let message = v["error"]["message"].as_str().unwrap().to_string();
    assert!(!message.is_empty());
    message
}

/// Reads NDJSON lines from a streaming answer until `n` lines came.
async fn lines(api: &Api, path: &str, n: usize) -> Vec<Value> {
    let resp = api
        .http
        .request(api.request("GET", path, None))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/x-ndjson");
    let mut body = resp.into_body();
    let mut buf = Vec::new();
    let mut out = Vec::new();
    while out.len() < n {
        let frame = tokio::time::timeout(Duration::from_secs(20), body.frame())
            .await
            .expect("a delivery within 20 s")
            .expect("the stream goes on")
            .unwrap();
        if let Ok(data) = frame.into_data() {
            buf.extend_from_slice(&data);
        }
        while let Some(at) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=at).collect();
            out.push(serde_json::from_slice(&line).unwrap());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_through_a_follower() {
    let cluster = TestCluster::start(3).await;
    let follower = cluster.follower().await;
    let api = Api::new(&cluster, follower);
    let ns = "/v1/namespaces/web";

    // Namespaces: a policy with one attempt, so a nack makes a timer DEAD.
    let put = json!({"policy": {"max_attempts": 1, "ack_timeout_ms": 60000}});
    let v = api.ok("PUT", "/v1/namespaces/web", Some(put)).await;
    assert_eq!(v["namespace"]["policy"]["max_attempts"], json!(1));
    let v = api.ok("GET", "/v1/namespaces/web", None).await;
    assert_eq!(v["namespace"]["name"], json!("web"));
    let v = api.ok("GET", "/v1/namespaces?limit=10", None).await;
    assert!(v["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .any(|n| n["name"] == "web"));
    api.ok("POST", "/v1/namespaces/web:pause", None).await;
    api.ok("POST", "/v1/namespaces/web:resume", None).await;

    // Schedule with a JSON payload: shown back as JSON, and as base64.
    let body = json!({"id": "a", "delay_ms": 600000, "payload_json": {"customer": 7}});
    let v = api
        .ok("POST", &format!("{ns}/timers"), Some(body.clone()))
        .await;
    assert_eq!(v["created"], json!(true));
    assert_eq!(v["timer"]["state"], json!("TIMER_STATE_PENDING"));
    assert_eq!(v["timer"]["content_type"], json!("application/json"));
    assert_eq!(v["timer"]["payload_json"], json!({"customer": 7}));
    assert_eq!(v["timer"]["payload"], json!("eyJjdXN0b21lciI6N30="));
    assert!(
        v["timer"]["fire_at_ms"].is_string(),
        "64-bit integers are strings"
    );
    // The same request again: the same timer, not created (idempotent retry).
    let again = api.ok("POST", &format!("{ns}/timers"), Some(body)).await;
    assert_eq!(again["created"], json!(false));
    assert_eq!(again["timer"]["fire_at_ms"], v["timer"]["fire_at_ms"]);
    // A different request for the id: ALREADY_EXISTS → 409.
    let other = json!({"id": "a", "delay_ms": 1000, "payload": "eA=="});
    api.refused(
        "POST",
        &format!("{ns}/timers"),
        Some(other),
        409,
        "ALREADY_EXISTS",
    )
    .await;

    // Get, and a timer that does not exist.
    let v = api.ok("GET", &format!("{ns}/timers/a"), None).await;
    assert_eq!(v["timer"]["id"], json!("a"));
    api.refused("GET", &format!("{ns}/timers/nope"), None, 404, "NOT_FOUND")
        .await;

    // A batch: the path's namespace fills each timer's; a base64 payload.
    let batch = json!({"timers": [
        {"id": "b1", "delay_ms": 600000, "payload": "aGk="},
        {"id": "b2", "fire_at_ms": (now_ms() + 600_000).to_string(), "payload": "aGk="},
        {"id": "b3", "delay_ms": 600000, "payload": "aGk=", "namespace": "web"},
    ]});
    let v = api
        .ok("POST", &format!("{ns}/timers:batch"), Some(batch))
        .await;
    assert_eq!(v["results"].as_array().unwrap().len(), 3);

    // List with filters and paging.
    let v = api
        .ok("GET", &format!("{ns}/timers?state=pending&limit=2"), None)
        .await;
    assert_eq!(v["timers"].as_array().unwrap().len(), 2);
    let token = v["next_page_token"].as_str().unwrap().to_string();
    assert!(!token.is_empty());
    let path = format!("{ns}/timers?state=TIMER_STATE_PENDING&limit=2&page_token={token}");
    let v = api.ok("GET", &path, None).await;
    assert_eq!(v["timers"].as_array().unwrap().len(), 2);

    // Reschedule, then cancel (definitive), conditional on the revision.
    let v = api
        .ok(
            "POST",
            &format!("{ns}/timers/b1:reschedule"),
            Some(json!({"delay_ms": 900000})),
        )
        .await;
    assert_eq!(v["timer"]["revision"], json!("2"));
    let m = api
        .refused(
            "DELETE",
            &format!("{ns}/timers/b1?if_revision=1"),
            None,
            400,
            "FAILED_PRECONDITION",
        )
        .await;
    assert!(m.contains("revision 2"), "{m}");
    let v = api
        .ok("DELETE", &format!("{ns}/timers/b1?if_revision=2"), None)
        .await;
    assert_eq!(v["timer"]["state"], json!("TIMER_STATE_CANCELLED"));

    // Deliveries as NDJSON: nack (one attempt: DEAD), redrive, then ack.
    let body = json!({"id": "d", "delay_ms": 0, "payload_json": "now"});
    api.ok("POST", &format!("{ns}/timers"), Some(body)).await;
    let got = lines(
        &api,
        &format!("{ns}/deliveries?consumer=http-test&max_in_flight=10"),
        1,
    )
    .await;
    assert_eq!(got[0]["timer"]["id"], json!("d"));
    assert_eq!(got[0]["timer"]["payload_json"], json!("now"));
    let attempt = got[0]["attempt"].clone();
    let v = api
        .ok(
            "POST",
            &format!("{ns}/timers/d:nack"),
            Some(json!({"attempt": attempt})),
        )
        .await;
    assert_eq!(v["timer"]["state"], json!("TIMER_STATE_DEAD"));
    let v = api
        .ok("POST", &format!("{ns}/timers/d:redrive"), None)
        .await;
    assert_eq!(v["redriven"], json!("1"));
    let got = lines(&api, &format!("{ns}/deliveries"), 1).await;
    let attempt = got[0]["attempt"].clone();
    let v = api
        .ok(
            "POST",
            &format!("{ns}/timers/d:ack"),
            Some(json!({"attempt": attempt, "waitForCommit": true})),
        )
        .await;
    assert_eq!(v["timer"]["state"], json!("TIMER_STATE_ACKED"));
    assert_eq!(v["committed"], json!(true));
    // The batch ack route answers each ack alone: this one again (idempotent), and a stranger.
    let acks = json!({"acks": [{"id": "d", "attempt": attempt}, {"id": "zz", "attempt": 1}]});
    let v = api
        .ok("POST", &format!("{ns}/timers:ack"), Some(acks))
        .await;
    assert_eq!(v["results"][0]["code"], json!(0));
    assert_eq!(v["results"][1]["code"], json!(5), "NOT_FOUND: {v}");
    let v = api.ok("POST", &format!("{ns}/timers:redrive"), None).await;
    assert_eq!(v["redriven"], json!("0"));

    // A recurring timer: pause, resume, and its next times.
    let every = json!({"id": "tick", "recurrence": {"every_ms": 3600000}, "payload": ""});
    api.ok("POST", &format!("{ns}/timers"), Some(every)).await;
    let v = api
        .ok("GET", &format!("{ns}/timers/tick?next_count=3"), None)
        .await;
    assert_eq!(
        v["timer"]["series"]["next_ms"].as_array().map(Vec::len),
        Some(3),
        "{v}"
    );
    api.ok("POST", &format!("{ns}/timers/tick:pause"), None)
        .await;
    api.ok("POST", &format!("{ns}/timers/tick:resume"), None)
        .await;
    let v = api
        .ok("GET", &format!("{ns}/timers?recurring=true"), None)
        .await;
    assert_eq!(v["timers"][0]["id"], json!("tick"));

    // Cluster and Access.
    let v = api.ok("GET", "/v1/cluster/status", None).await;
    assert_eq!(v["node_id"], json!(follower.to_string()));
    assert_eq!(v["members"].as_array().unwrap().len(), 3);
    let v = api.ok("GET", "/v1/cluster/digest", None).await;
    assert_eq!(v["node_id"], json!(follower.to_string()));
    // The leader's overview: members with progress, and counts by state that add up.
    let v = api
        .ok("GET", "/v1/cluster/overview?by_state=true", None)
        .await;
    let members = v["members"].as_array().unwrap();
    assert_eq!(members.len(), 3);
    assert_eq!(
        members
            .iter()
            .filter(|m| m["leader"] == json!(true))
            .count(),
        1
    );
    let web = v["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "web")
        .expect("web is listed");
    let counted: u64 = web["by_state"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["count"].as_str().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(json!(counted.to_string()), web["stored"], "{web}");
    assert!(
        web["by_state"]
            .to_string()
            .contains("TIMER_STATE_CANCELLED"),
        "{web}"
    );
    assert_eq!(web["by_state_partial"], json!(false));
    let v = api.ok("GET", "/v1/access/whoami", None).await;
    assert_eq!(v["auth_enabled"], json!(false));
    let key = api
        .ok(
            "POST",
            "/v1/access/keys",
            Some(json!({"name": "k", "roles": ["read:*"]})),
        )
        .await;
    let key_id = key["key"]["id"].as_str().unwrap().to_string();
    let v = api.ok("GET", "/v1/access/keys", None).await;
    assert!(v["keys"]
        .as_array()
        .unwrap()
        .iter()
        .any(|k| k["id"] == key_id.as_str()));
    api.ok("DELETE", &format!("/v1/access/keys/{key_id}"), None)
        .await;
    api.ok("PUT", "/v1/access/auth", Some(json!({"enabled": false})))
        .await;
    api.refused("DELETE", "/v1/cluster/nodes/99", None, 404, "NOT_FOUND")
        .await;
    let bad_node = json!({"node_id": 4, "addr": "not an address"});
    api.refused(
        "POST",
        "/v1/cluster/nodes",
        Some(bad_node),
        400,
        "INVALID_ARGUMENT",
    )
    .await;
    // A backup over HTTP is the file itself, checked whole by the restore tool's reader.
    let resp = api
        .http
        .request(api.request("GET", "/v1/cluster/backup", None))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/octet-stream");
    let info: Value =
        serde_json::from_str(resp.headers()["x-timerdb-backup"].to_str().unwrap()).unwrap();
    let file = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(json!(file.len().to_string()), info["bytes"], "{info}");
    let path = cluster.dir.path().join("http.tdb");
    std::fs::write(&path, &file).unwrap();
    let summary = timerdb::storage::restore::inspect(&path).expect("a whole, valid backup");
    assert_eq!(json!(summary.index.to_string()), info["index"]);
    assert!(
        summary.timers >= 5 && summary.namespaces == 1,
        "{summary:?}"
    );
    let leader = cluster.leader().await;
    let v = api
        .ok(
            "POST",
            "/v1/cluster:transferLeader",
            Some(json!({"node_id": follower})),
        )
        .await;
    assert_eq!(v["leader_id"], json!(follower.to_string()), "was {leader}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_describes_what_is_served() {
    let cluster = TestCluster::start(3).await;
    let api = Api::new(&cluster, cluster.follower().await);
    let doc = api.ok("GET", "/v1/openapi.json", None).await;
    assert_eq!(doc["openapi"], json!("3.0.3"));
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    let mut operations = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            // Streams and files are checked by the route test above; here the JSON answers.
            let streaming = !op["responses"]["200"]["content"]["application/json"].is_object();
            if streaming || path == "/v1/openapi.json" {
                continue;
            }
            operations += 1;
            // Fill the path's parameters as the document types them.
            let mut concrete = path.clone();
            for p in op["parameters"].as_array().unwrap() {
                if p["in"] == "path" {
                    let name = p["name"].as_str().unwrap();
                    let value = match p["schema"]["type"].as_str() {
                        Some("string") if p["schema"]["format"].is_string() => "7",
                        Some("integer") => "7",
                        _ => "x",
                    };
                    concrete = concrete.replace(&format!("{{{name}}}"), value);
                }
            }
            let m = method.to_ascii_uppercase();
            let body = op["requestBody"].is_object().then(|| json!({}));
            let (status, v) = api.call(&m, &concrete, body).await;
            // Served: not the transcoder's "no such route" nor a wrong method; never a 5xx for
            // an empty request.
            let no_route = status == 404
                && v["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("no such route"));
            assert!(!no_route && status != 405, "{m} {concrete}: {status} {v}");
            assert!(
                status < 500 || status == 503,
                "{m} {concrete}: {status} {v}"
            );
            if status == 200 {
                // Every key of the answer is a property of the documented response schema.
                let reference = op["responses"]["200"]["content"]["application/json"]["schema"]
                    ["$ref"]
                    .as_str()
                    .unwrap();
                let name = reference.rsplit('/').next().unwrap();
                let props = schemas[name]["properties"].as_object().unwrap();
                for key in v.as_object().unwrap().keys() {
                    assert!(
                        props.contains_key(key),
                        "{m} {concrete}: {key} undocumented in {name}"
                    );
                }
            } else {
                assert!(v["error"]["status"].is_string(), "{m} {concrete}: {v}");
            }
        }
    }
    assert!(operations >= 27, "{operations} operations checked");
    cluster.shutdown().await;
}
