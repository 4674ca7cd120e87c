//! Validation table: each bad input gets the right code and a message naming the problem.

use tonic::Code;

use super::*;

fn req(
    ns: &str,
    id: &str,
    when: Option<pb::schedule_request::When>,
    payload: usize,
) -> pb::ScheduleRequest {
    pb::ScheduleRequest {
        namespace: ns.into(),
        id: id.into(),
        when,
        payload: vec![7; payload],
        content_type: String::new(),
        ..Default::default()
    }
}

fn at(t: i64) -> Option<pb::schedule_request::When> {
    Some(pb::schedule_request::When::FireAtMs(t))
}

fn after(d: i64) -> Option<pb::schedule_request::When> {
    Some(pb::schedule_request::When::DelayMs(d))
}

const NOW: i64 = 1_800_000_000_000;

#[test]
fn schedule_validation_table() {
    let l = Limits::default();
    let long_ns = "n".repeat(129);
    let long_id = "i".repeat(257);
    let cases: Vec<(pb::ScheduleRequest, Code, &str)> = vec![
        (
            req("", "a", at(NOW), 0),
            Code::InvalidArgument,
            "namespace must not be empty",
        ),
        (
            req("ns", "", at(NOW), 0),
            Code::InvalidArgument,
            "id must not be empty",
        ),
        (
            req(&long_ns, "a", at(NOW), 0),
            Code::InvalidArgument,
            "namespace is 129 bytes",
        ),
        (
            req("ns", &long_id, at(NOW), 0),
            Code::InvalidArgument,
            "id is 257 bytes",
        ),
        (
            req("ns", "a\n", at(NOW), 0),
            Code::InvalidArgument,
            "control characters",
        ),
        (
            req("ns", "a", None, 0),
            Code::InvalidArgument,
            "fire_at_ms or delay_ms",
        ),
        (
            req("ns", "a", at(1_700_000_000), 0),
            Code::InvalidArgument,
            "seconds",
        ),
        (
            req("ns", "a", at(MAX_FIRE_AT_MS + 1), 0),
            Code::InvalidArgument,
            "9999",
        ),
        (
            req("ns", "a", after(-1), 0),
            Code::InvalidArgument,
            "negative",
        ),
        (
            req("ns", "a", after(l.max_delay_ms + 1), 0),
            Code::InvalidArgument,
            "exceeds",
        ),
        (
            req("ns", "a", at(NOW), 64 * 1024 + 1),
            Code::ResourceExhausted,
            "payload",
        ),
    ];
    for (r, code, needle) in cases {
        let err = Status::from(spec(&r, &l).unwrap_err());
        assert_eq!(err.code(), code, "{r:?}: {err:?}");
        assert!(
            err.message().contains(needle),
            "{:?} lacks {needle:?}",
            err.message()
        );
    }
}

#[test]
fn schedule_accepts_limits_exactly() {
    let l = Limits::default();
    let ok = req(&"n".repeat(128), &"i".repeat(256), at(NOW), 64 * 1024);
    let s = spec(&ok, &l).unwrap();
    assert_eq!(s.when, When::At(NOW));
    let s = spec(&req("ns", "名前", after(0), 0), &l).unwrap();
    assert_eq!(s.when, When::After(0));
}

#[test]
fn batch_validation() {
    let l = Limits {
        max_batch: 3,
        ..Limits::default()
    };
    let batch = |reqs: Vec<pb::ScheduleRequest>| pb::ScheduleBatchRequest { timers: reqs };
    let e = specs(&batch(vec![]), &l).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)));
    let four = (0..4)
        .map(|i| req("ns", &i.to_string(), at(NOW), 0))
        .collect();
    assert!(matches!(
        specs(&batch(four), &l).unwrap_err(),
        Error::ResourceExhausted(_)
    ));
    let dup = vec![req("ns", "a", at(NOW), 0), req("ns", "a", at(NOW), 0)];
    let e = specs(&batch(dup), &l).unwrap_err();
    assert!(
        e.to_string().contains("timers[1]") && e.to_string().contains("twice"),
        "{e}"
    );
    let bad = vec![req("ns", "a", at(NOW), 0), req("ns", "", at(NOW), 0)];
    assert!(specs(&batch(bad), &l)
        .unwrap_err()
        .to_string()
        .starts_with("timers[1]: "));
}

#[test]
fn list_validation_and_tokens() {
    let l = Limits::default();
    let mut r = pb::ListRequest {
        namespace: "ns".into(),
        ..Default::default()
    };
    let p = list_query(&r, &l).unwrap();
    assert_eq!(p.limit, l.default_list_limit);
    assert!(p.filter.state.is_none() && p.after.is_none());
    r.state = 99;
    assert!(list_query(&r, &l).is_err());
    r.state = pb::TimerState::Fired as i32;
    r.limit = (l.max_list_limit + 1) as u32;
    assert!(list_query(&r, &l).is_err());
    r.limit = 5;
    r.page_token = "zz".into();
    assert!(list_query(&r, &l).is_err());
    // A multi-byte character where a hex pair would split it, and a huge token: refused, no
    // panic, and not echoed back.
    for bad in ["aéb".to_string(), "ab".repeat(100_000)] {
        r.page_token = bad;
        let e = list_query(&r, &l).unwrap_err().to_string();
        assert!(
            e.contains("not one this server issued") && e.len() < 200,
            "{e}"
        );
    }
    r.page_token = encode_token("id/名");
    let p = list_query(&r, &l).unwrap();
    assert_eq!(p.after.as_deref(), Some("id/名"));
    assert_eq!(p.filter.state, Some(TimerState::Fired));
    r.fire_from_ms = 10;
    r.fire_to_ms = 10;
    assert!(list_query(&r, &l).is_err());
}

#[test]
fn every_error_maps_to_its_code() {
    let cases = [
        (Error::InvalidArgument("x".into()), Code::InvalidArgument),
        (Error::NotFound("x".into()), Code::NotFound),
        (Error::AlreadyExists("x".into()), Code::AlreadyExists),
        (
            Error::FailedPrecondition("x".into()),
            Code::FailedPrecondition,
        ),
        (
            Error::ResourceExhausted("x".into()),
            Code::ResourceExhausted,
        ),
        (Error::NotLeader, Code::Unavailable),
        (Error::Unavailable("x".into()), Code::Unavailable),
        (Error::Storage("x".into()), Code::Internal),
    ];
    for (e, code) in cases {
        assert_eq!(Status::from(e).code(), code);
    }
}
