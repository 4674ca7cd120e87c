use http::Method;

use super::*;
use crate::api::stack::methods::RULES;

fn params(method: Method, path: &str) -> (&'static str, Vec<(&'static str, String)>) {
    match find(&method, path) {
        Found::Route(r, p) => (r.rpc, p),
        other => panic!("{method} {path}: {other:?}"),
    }
}

#[test]
fn verbs_and_ids_with_colons() {
    let (rpc, p) = params(Method::POST, "/v1/namespaces/ns/timers/a:reschedule");
    assert_eq!(rpc, "/timerdb.v1.Timers/Reschedule");
    assert_eq!(p, vec![("namespace", "ns".into()), ("id", "a".into())]);
    // A recurring timer's occurrence: colons in the id, and a verb after them.
    let occ = "daily@2026-11-26T09:00:00.000Z";
    let (rpc, p) = params(Method::GET, &format!("/v1/namespaces/ns/timers/{occ}"));
    assert_eq!(rpc, "/timerdb.v1.Timers/Get");
    assert_eq!(p[1], ("id", occ.to_string()));
    let (rpc, p) = params(Method::POST, &format!("/v1/namespaces/ns/timers/{occ}:ack"));
    assert_eq!(rpc, "/timerdb.v1.Timers/Ack");
    assert_eq!(p[1], ("id", occ.to_string()));
    let (rpc, _) = params(Method::POST, "/v1/namespaces/ns/timers:batch");
    assert_eq!(rpc, "/timerdb.v1.Timers/ScheduleBatch");
    let (rpc, _) = params(Method::POST, "/v1/namespaces/ns/timers");
    assert_eq!(rpc, "/timerdb.v1.Timers/Schedule");
    let (rpc, p) = params(Method::POST, "/v1/namespaces/ns:pause");
    assert_eq!(rpc, "/timerdb.v1.Namespaces/PauseNamespace");
    assert_eq!(p, vec![("name", "ns".into())]);
    let (rpc, _) = params(Method::POST, "/v1/cluster:transferLeader");
    assert_eq!(rpc, "/timerdb.v1.Cluster/TransferLeader");
}

#[test]
fn path_parameters_are_percent_decoded() {
    let (_, p) = params(Method::GET, "/v1/namespaces/a%2Fb/timers/x%20y%3Az");
    assert_eq!(p, vec![("namespace", "a/b".into()), ("id", "x y:z".into())]);
    assert!(matches!(
        find(&Method::GET, "/v1/namespaces/ns/timers/%FF"),
        Found::BadPath(_)
    ));
}

#[test]
fn unknown_paths_and_wrong_methods() {
    assert!(matches!(find(&Method::GET, "/v1/nothing"), Found::NotFound));
    assert!(matches!(
        find(&Method::GET, "/v1/namespaces/ns/timers/a/b"),
        Found::NotFound
    ));
    assert!(matches!(
        find(&Method::GET, "/v1/namespaces//timers"),
        Found::NotFound
    ));
    match find(&Method::PATCH, "/v1/namespaces/ns/timers/a") {
        Found::WrongMethod(m) => assert_eq!(m, vec![Method::GET, Method::DELETE]),
        other => panic!("{other:?}"),
    }
    // An unknown verb is no POST route: the path is then the timer "a:frobnicate" (ids may
    // hold colons), which takes GET and DELETE.
    assert!(matches!(
        find(&Method::POST, "/v1/namespaces/ns/timers/a:frobnicate"),
        Found::WrongMethod(_)
    ));
}

#[test]
fn every_client_rpc_has_a_route_and_every_route_a_codec() {
    // Not over HTTP: the bidirectional stream, the binary backup, the pushed-to service.
    let skipped = ["/timerdb.v1.Timers/Consume", "/timerdb.v1.Cluster/Backup"];
    for rule in RULES {
        let client = ["Timers", "Namespaces", "Cluster", "Access"]
            .iter()
            .any(|s| rule.path.starts_with(&format!("/timerdb.v1.{s}/")));
        if !client || skipped.contains(&rule.path) {
            continue;
        }
        assert!(
            ROUTES.iter().any(|r| r.rpc == rule.path),
            "{} has no HTTP route",
            rule.path
        );
    }
    for r in ROUTES {
        assert_eq!(r.codec().rpc, r.rpc);
        let schema = crate::api::http::schema::schema();
        assert!(schema.messages.contains_key(r.request), "{}", r.request);
        assert!(schema.messages.contains_key(r.response), "{}", r.response);
        // Every path parameter is a field of the request (or of each batch element).
        for p in r.params() {
            let m = match r.each {
                Some(_) => continue,
                None => &schema.messages[r.request],
            };
            assert!(
                crate::api::http::schema::field(m, p).is_some(),
                "{} {p}",
                r.path
            );
        }
    }
}

#[test]
fn a_path_value_may_be_repeated_in_the_body_only_unchanged() {
    let mut o = serde_json::Map::new();
    o.insert("namespace".into(), "ns".into());
    assert!(set_param(&mut o, "namespace", "ns".into()).is_ok());
    o.insert("nodeId".into(), "7".into());
    assert!(set_param(&mut o, "node_id", 7.into()).is_ok());
    assert_eq!(o.get("node_id"), Some(&7.into()));
    assert!(!o.contains_key("nodeId"));
    o.insert("id".into(), "other".into());
    let e = set_param(&mut o, "id", "a".into()).unwrap_err();
    assert!(e.contains("in the path"), "{e}");
}
