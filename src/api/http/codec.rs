//! JSON ⇄ protobuf for each gRPC method the HTTP routes reach: the typed step of transcoding,
//! through the `serde` implementations `pbjson` generates for the protobuf messages (the proto3
//! JSON mapping, proto field names).

use prost::Message;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::api::pb;

/// Encodes a JSON request into the protobuf bytes of the method's request message.
pub type Encode = fn(Value) -> Result<Vec<u8>, String>;
/// Decodes the protobuf bytes of a response message into JSON.
pub type Decode = fn(&[u8]) -> Result<Value, String>;

/// One method's request and response conversions.
pub struct Codec {
    pub rpc: &'static str,
    pub encode: Encode,
    pub decode: Decode,
}

fn encode<M: Message + DeserializeOwned>(json: Value) -> Result<Vec<u8>, String> {
    let message: M = serde_path_to_error::deserialize(json).map_err(|e| {
        let at = e.path().to_string();
        match at.as_str() {
            "." | "" => e.inner().to_string(),
            _ => format!("{at}: {}", e.inner()),
        }
    })?;
    Ok(message.encode_to_vec())
}

fn decode<M: Message + Default + Serialize>(bytes: &[u8]) -> Result<Value, String> {
    let message = M::decode(bytes).map_err(|e| format!("undecodable answer: {e}"))?;
    serde_json::to_value(&message).map_err(|e| e.to_string())
}

macro_rules! codec {
    ($rpc:literal, $req:ty, $resp:ty) => {
        Codec {
            rpc: $rpc,
            encode: encode::<$req>,
            decode: decode::<$resp>,
        }
    };
}

/// The conversions of every method an HTTP route reaches.
pub static CODECS: &[Codec] = &[
    codec!(
        "/timerdb.v1.Timers/Schedule",
        pb::ScheduleRequest,
        pb::ScheduleResponse
    ),
    codec!(
        "/timerdb.v1.Timers/ScheduleBatch",
        pb::ScheduleBatchRequest,
        pb::ScheduleBatchResponse
    ),
    codec!(
        "/timerdb.v1.Timers/Cancel",
        pb::CancelRequest,
        pb::CancelResponse
    ),
    codec!(
        "/timerdb.v1.Timers/Reschedule",
        pb::RescheduleRequest,
        pb::RescheduleResponse
    ),
    codec!("/timerdb.v1.Timers/Get", pb::GetRequest, pb::GetResponse),
    codec!("/timerdb.v1.Timers/List", pb::ListRequest, pb::ListResponse),
    codec!(
        "/timerdb.v1.Timers/Subscribe",
        pb::SubscribeRequest,
        pb::Delivery
    ),
    codec!("/timerdb.v1.Timers/Ack", pb::AckRequest, pb::AckResponse),
    codec!(
        "/timerdb.v1.Timers/AckBatch",
        pb::AckBatchRequest,
        pb::AckBatchResponse
    ),
    codec!("/timerdb.v1.Timers/Nack", pb::NackRequest, pb::NackResponse),
    codec!(
        "/timerdb.v1.Timers/Redrive",
        pb::RedriveRequest,
        pb::RedriveResponse
    ),
    codec!(
        "/timerdb.v1.Timers/Pause",
        pb::PauseRequest,
        pb::PauseResponse
    ),
    codec!(
        "/timerdb.v1.Timers/Resume",
        pb::PauseRequest,
        pb::PauseResponse
    ),
    codec!(
        "/timerdb.v1.Namespaces/PutNamespace",
        pb::PutNamespaceRequest,
        pb::PutNamespaceResponse
    ),
    codec!(
        "/timerdb.v1.Namespaces/GetNamespace",
        pb::GetNamespaceRequest,
        pb::GetNamespaceResponse
    ),
    codec!(
        "/timerdb.v1.Namespaces/ListNamespaces",
        pb::ListNamespacesRequest,
        pb::ListNamespacesResponse
    ),
    codec!(
        "/timerdb.v1.Namespaces/PauseNamespace",
        pb::PauseNamespaceRequest,
        pb::PauseNamespaceResponse
    ),
    codec!(
        "/timerdb.v1.Namespaces/ResumeNamespace",
        pb::PauseNamespaceRequest,
        pb::PauseNamespaceResponse
    ),
    codec!(
        "/timerdb.v1.Cluster/Status",
        pb::StatusRequest,
        pb::StatusResponse
    ),
    codec!(
        "/timerdb.v1.Cluster/Digest",
        pb::DigestRequest,
        pb::DigestResponse
    ),
    codec!(
        "/timerdb.v1.Cluster/Backup",
        pb::BackupRequest,
        pb::BackupChunk
    ),
    codec!(
        "/timerdb.v1.Cluster/Slots",
        pb::SlotsRequest,
        pb::SlotsResponse
    ),
    codec!(
        "/timerdb.v1.Cluster/Overview",
        pb::OverviewRequest,
        pb::OverviewResponse
    ),
    codec!(
        "/timerdb.v1.Cluster/AddNode",
        pb::AddNodeRequest,
        pb::AddNodeResponse
    ),
    codec!(
        "/timerdb.v1.Cluster/RemoveNode",
        pb::RemoveNodeRequest,
        pb::RemoveNodeResponse
    ),
    codec!(
        "/timerdb.v1.Cluster/TransferLeader",
        pb::TransferLeaderRequest,
        pb::TransferLeaderResponse
    ),
    codec!(
        "/timerdb.v1.Access/CreateKey",
        pb::CreateKeyRequest,
        pb::CreateKeyResponse
    ),
    codec!(
        "/timerdb.v1.Access/RevokeKey",
        pb::RevokeKeyRequest,
        pb::RevokeKeyResponse
    ),
    codec!(
        "/timerdb.v1.Access/ListKeys",
        pb::ListKeysRequest,
        pb::ListKeysResponse
    ),
    codec!(
        "/timerdb.v1.Access/SetAuth",
        pb::SetAuthRequest,
        pb::SetAuthResponse
    ),
    codec!(
        "/timerdb.v1.Access/WhoAmI",
        pb::WhoAmIRequest,
        pb::WhoAmIResponse
    ),
];
