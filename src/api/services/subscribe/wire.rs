//! What a Subscribe or Consume stream carries, checked and converted: the subscription request
//! validated and given its defaults, the acks a consumer sends upstream, and a delivery as the
//! client sees it.

use crate::api::convert::check_name;
use crate::api::pb;
use crate::cluster::Delivery;
use crate::config::Limits;
use crate::Error;

/// Unacked deliveries a stream may hold when the client asks for 0.
pub const DEFAULT_MAX_IN_FLIGHT: u32 = 100;
/// The most a client may ask for.
pub const MAX_MAX_IN_FLIGHT: u32 = 10_000;
/// An ack (or nack) a consumer sent on its stream, validated.
#[derive(Debug, Clone)]
pub struct StreamAck {
    pub id: String,
    pub attempt: u32,
    pub nack: bool,
}

/// Validates a Subscribe and fills in the defaults.
pub fn validate(
    mut req: pb::SubscribeRequest,
    limits: &Limits,
) -> Result<pb::SubscribeRequest, Error> {
    check_name("namespace", &req.namespace, limits.max_namespace_bytes)?;
    if req.consumer.len() > limits.max_id_bytes {
        return Err(Error::InvalidArgument(format!(
            "consumer name is {} bytes; the limit is {}",
            req.consumer.len(),
            limits.max_id_bytes
        )));
    }
    if req.max_in_flight > MAX_MAX_IN_FLIGHT {
        return Err(Error::InvalidArgument(format!(
            "max_in_flight {} is over the limit of {MAX_MAX_IN_FLIGHT}",
            req.max_in_flight
        )));
    }
    if req.max_in_flight == 0 {
        req.max_in_flight = DEFAULT_MAX_IN_FLIGHT;
    }
    Ok(req)
}

/// Validates the acks of one Consume message (at most `max_batch` of them).
pub fn validate_acks(acks: Vec<pb::DeliveryAck>, limits: &Limits) -> Result<Vec<StreamAck>, Error> {
    if acks.len() > limits.max_batch {
        return Err(Error::InvalidArgument(format!(
            "{} acks in one Consume message; the limit is {}",
            acks.len(),
            limits.max_batch
        )));
    }
    acks.into_iter()
        .map(|a| {
            check_name("id", &a.id, limits.max_id_bytes)?;
            if a.attempt == 0 {
                return Err(Error::InvalidArgument(format!(
                    "ack of {}: attempt must be at least 1 (deliveries count from 1)",
                    a.id
                )));
            }
            Ok(StreamAck {
                id: a.id,
                attempt: a.attempt,
                nack: a.nack,
            })
        })
        .collect()
}

pub(super) fn to_pb_acks(acks: Vec<StreamAck>) -> Vec<pb::DeliveryAck> {
    acks.into_iter()
        .map(|a| pb::DeliveryAck {
            id: a.id,
            attempt: a.attempt,
            nack: a.nack,
        })
        .collect()
}

pub(super) fn to_pb(d: Delivery) -> pb::Delivery {
    pb::Delivery {
        attempt: d.attempt,
        timer: Some(d.timer.into()),
    }
}
