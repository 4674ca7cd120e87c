//! Which calls may be sent twice: the one rule (DESIGN invariant 9) that the server's
//! forwarder and the client libraries follow.
//!
//! A call whose outcome is unknown (its connection broke, its leader went away, it timed out)
//! may have happened. Sending it again is safe only if applying it twice is the same as
//! applying it once — the same state *and* the same answer, since a refusal means "nothing
//! happened" (docs/guarantees.md, guarantee 5) — **and** no other client's call that lands in
//! between can be undone by the repeat: a blind write that someone else may reverse (pause
//! then resume, one policy then another) applied again after the reversal takes effect twice,
//! before and after the other call, which no order of the calls explains.
//!
//! - safe: reads; create-only Schedule and ScheduleBatch (a repeat finds the timer it made,
//!   `created = false`, relative ones too: the stored `delay_ms` is compared; nobody else can
//!   make that id anew while the first one's row is kept); an unconditional Cancel (a
//!   cancelled timer answers as cancelled); Ack and AckBatch (judged by attempt); RevokeKey (a
//!   revoked id answers OK; nothing un-revokes it).
//! - not safe: anything with `if_state` / `if_revision` (the first application moved the
//!   revision: the repeat is refused for a change that happened); a Reschedule (a relative
//!   one shifts twice, an absolute one is refused once the timer fired meanwhile); a one-shot
//!   Schedule in another mode (upsert, debounce, keep-*: the time moves again, or the repeat is
//!   refused after a fire); an upsert of a recurring timer, pausing and resuming (a timer or a
//!   namespace), PutNamespace, SetAuth, AddNode and TransferLeader (someone else's opposite
//!   call may have landed in between); Nack; Redrive (one timer: refused as "not DEAD" after it
//!   happened; a namespace: timers that went DEAD since would be redriven by nobody's call);
//!   CreateKey (a second key nobody has the secret of); RemoveNode. Such a call is sent once;
//!   an unknown outcome is answered as unknown, and the caller finds out with a read.
//!
//! An RPC this table does not know is not safe. `clients/idempotence.json` holds the cases both
//! client libraries are tested against.

use prost::Message;

use crate::pb;

/// Whether `message` (one encoded request, no gRPC frame) sent to `path`
/// (`/timerdb.v1.Service/Method`) twice is the same as once. Undecodable is not safe.
pub fn retry_safe(path: &str, message: &[u8]) -> bool {
    fn decoded<M: Message + Default>(message: &[u8], safe: fn(&M) -> bool) -> bool {
        M::decode(message).is_ok_and(|m| safe(&m))
    }
    let Some(method) = path.strip_prefix("/timerdb.v1.") else {
        return false;
    };
    match method {
        "Timers/Schedule" => decoded(message, schedule),
        "Timers/Cancel" => decoded(message, cancel),
        "Timers/ScheduleBatch"
        | "Timers/Get"
        | "Timers/List"
        | "Timers/Ack"
        | "Timers/AckBatch"
        | "Namespaces/GetNamespace"
        | "Namespaces/ListNamespaces"
        | "Cluster/Status"
        | "Cluster/Digest"
        | "Cluster/Overview"
        | "Cluster/Backup"
        | "Access/RevokeKey"
        | "Access/ListKeys"
        | "Access/WhoAmI" => true,
        // Reschedule, pausing, policies, Redrive, Nack, membership, CreateKey, SetAuth, and
        // anything unknown.
        _ => false,
    }
}

/// A Schedule without conditions that only creates.
pub fn schedule(r: &pb::ScheduleRequest) -> bool {
    use pb::CreateMode as M;
    let conditional = r.if_state != 0 || r.if_revision != 0;
    let creates = matches!(M::try_from(r.mode), Ok(M::Unspecified | M::CreateOnly));
    !conditional && creates
}

/// A Cancel without conditions.
pub fn cancel(r: &pb::CancelRequest) -> bool {
    r.if_state == 0 && r.if_revision == 0
}

/// A Reschedule: never (see the module).
pub fn reschedule(_: &pb::RescheduleRequest) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One case of `clients/idempotence.json`: a request as proto JSON and the verdict.
    #[derive(serde::Deserialize)]
    struct Case {
        method: String,
        request: serde_json::Value,
        retry_safe: bool,
    }

    fn encode(method: &str, json: serde_json::Value) -> Vec<u8> {
        fn enc<M: Message + serde::de::DeserializeOwned>(json: serde_json::Value) -> Vec<u8> {
            serde_json::from_value::<M>(json)
                .expect("a request of the method")
                .encode_to_vec()
        }
        match method.rsplit('/').next().unwrap() {
            "Schedule" => enc::<pb::ScheduleRequest>(json),
            "ScheduleBatch" => enc::<pb::ScheduleBatchRequest>(json),
            "Cancel" => enc::<pb::CancelRequest>(json),
            "Reschedule" => enc::<pb::RescheduleRequest>(json),
            "Get" => enc::<pb::GetRequest>(json),
            "Ack" => enc::<pb::AckRequest>(json),
            "Nack" => enc::<pb::NackRequest>(json),
            "Redrive" => enc::<pb::RedriveRequest>(json),
            "Pause" | "Resume" => enc::<pb::PauseRequest>(json),
            "PutNamespace" => enc::<pb::PutNamespaceRequest>(json),
            "TransferLeader" => enc::<pb::TransferLeaderRequest>(json),
            "RemoveNode" => enc::<pb::RemoveNodeRequest>(json),
            "AddNode" => enc::<pb::AddNodeRequest>(json),
            "CreateKey" => enc::<pb::CreateKeyRequest>(json),
            "RevokeKey" => enc::<pb::RevokeKeyRequest>(json),
            other => panic!("no encoder for {other} in the test"),
        }
    }

    #[test]
    fn the_shared_cases_hold() {
        let cases: Vec<Case> =
            serde_json::from_str(include_str!("../../idempotence.json")).expect("the cases");
        assert!(cases.len() >= 20);
        for c in cases {
            let message = encode(&c.method, c.request.clone());
            assert_eq!(
                retry_safe(&c.method, &message),
                c.retry_safe,
                "{} {}",
                c.method,
                c.request
            );
        }
    }

    #[test]
    fn unknown_methods_and_garbage_are_not_safe() {
        assert!(!retry_safe("/timerdb.v1.Timers/Frobnicate", &[]));
        assert!(!retry_safe("/other.Service/Get", &[]));
        assert!(!retry_safe(
            "/timerdb.v1.Timers/Schedule",
            &[0xff, 0xff, 0xff]
        ));
    }
}
