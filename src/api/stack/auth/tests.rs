use prost::Message;

use super::*;

#[test]
fn bearer_takes_the_token_in_any_case_and_nothing_else() {
    assert_eq!(bearer("Bearer abc"), Some("abc"));
    assert_eq!(bearer("bearer  abc "), Some("abc"));
    assert_eq!(bearer("Basic abc"), None);
    assert_eq!(bearer("Bearer"), None);
    assert_eq!(bearer("Bearer "), None);
}

#[test]
fn the_namespaces_of_a_batch_and_of_a_consume_are_all_checked() {
    use crate::api::pb;
    let k = crate::auth::Key {
        id: "aa".into(),
        name: "orders-writer".into(),
        secret_sha256: None,
        cert_name: Some("x".into()),
        roles: vec![crate::auth::Role::parse("schedule:orders*").unwrap()],
        created_ms: 0,
    };
    let p = Principal::Key(k);
    let batch = pb::ScheduleBatchRequest {
        timers: vec![
            pb::ScheduleRequest {
                namespace: "orders-1".into(),
                ..Default::default()
            },
            pb::ScheduleRequest {
                namespace: "billing".into(),
                ..Default::default()
            },
        ],
    };
    let refused = refusal(
        &p,
        Permission::Schedule,
        Names::EachOf1,
        &batch.encode_to_vec(),
    );
    assert_eq!(refused.unwrap().as_deref(), Some("billing"));
    let consume = pb::ConsumeRequest {
        subscribe: Some(pb::SubscribeRequest {
            namespace: "orders".into(),
            ..Default::default()
        }),
        acks: vec![],
    };
    let r = refusal(
        &p,
        Permission::Consume,
        Names::InnerOf1,
        &consume.encode_to_vec(),
    );
    assert_eq!(
        r.unwrap().as_deref(),
        Some("orders"),
        "schedule is not consume"
    );
    let one = pb::CancelRequest {
        namespace: "orders-9".into(),
        id: "a".into(),
        ..Default::default()
    };
    let r = refusal(
        &p,
        Permission::Schedule,
        Names::Field1,
        &one.encode_to_vec(),
    );
    assert_eq!(r.unwrap(), None);
    let r = refusal(&p, Permission::Read, Names::All, &[]);
    assert_eq!(r.unwrap().as_deref(), Some("*"));
    let garbage = refusal(&p, Permission::Schedule, Names::Field1, &[0xff, 0xff, 0xff]);
    assert_eq!(garbage.unwrap_err().code(), tonic::Code::InvalidArgument);
}
