//! The client `Timers` service: validate, then run the domain operation.
//!
//! Every handler has the same shape: validate the request, call the node, convert the answer.
//! Where it runs is not its concern: the forwarding layer ([`crate::api::stack::forward`]) sends each call
//! to the leader (or keeps it here, for the streams), and the auth layer has checked the
//! caller. Subscribe and Consume are streams that follow the leader: see [`crate::api::services::subscribe`].

use std::sync::Arc;

use tonic::{Request, Response, Status, Streaming};

use crate::api::convert::modes;
use crate::api::convert::recurring;
use crate::api::convert::{self, encode_token, RedriveTarget};
use crate::api::pb::{self, timers_server};
use crate::api::services::subscribe;
use crate::api::stack::forward::{self, Router};
use crate::command::Options;
use crate::config::Limits;
use crate::node::Node;
use crate::storage::Page;

/// Serves the Timers API on one node.
pub struct TimersService {
    router: Arc<Router>,
}

impl TimersService {
    pub fn new(router: Arc<Router>) -> Self {
        TimersService { router }
    }

    /// The door of the group the call is for (the grouping layer found it, and the
    /// forwarding layer sent the call to this node because it leads that group).
    fn node_for<T>(&self, request: &Request<T>) -> Result<Arc<Node>, Status> {
        let group = crate::api::stack::group::of_request(request);
        Ok(self.router.group(group)?.clone())
    }

    fn limits(&self) -> &Limits {
        &self.router.node().config().limits
    }
}

#[tonic::async_trait]
impl timers_server::Timers for TimersService {
    async fn schedule(
        &self,
        request: Request<pb::ScheduleRequest>,
    ) -> Result<Response<pb::ScheduleResponse>, Status> {
        let node = self.node_for(&request)?;
        let req = request.get_ref();
        let (mode, cond) = modes::mode(req)?;
        let (timer, created): (pb::Timer, bool) = match (req.recurrence.is_some(), mode) {
            (true, mode) => {
                let spec = recurring::recurring_spec(req, self.limits())?;
                // Only create-only and UPSERT get here (`modes::mode`).
                let (recurring, created) =
                    node.schedule_recurring(spec, mode.map(|_| cond)).await?;
                (recurring.into(), created)
            }
            (false, mode) => {
                let spec = convert::spec(req, self.limits())?;
                let misfire =
                    crate::api::convert::policy::misfire(req.max_lateness_ms, req.misfire, "")?;
                let with = Options {
                    mode,
                    cond,
                    misfire,
                };
                let (timer, created) = node.schedule(spec, with).await?;
                (timer.into(), created)
            }
        };
        Ok(Response::new(pb::ScheduleResponse {
            timer: Some(timer),
            created,
        }))
    }

    async fn schedule_batch(
        &self,
        request: Request<pb::ScheduleBatchRequest>,
    ) -> Result<Response<pb::ScheduleBatchResponse>, Status> {
        let node = self.node_for(&request)?;
        // The decoded request goes before the commit is waited for: a leader loading timers
        // holds a few batches in flight, and their protobuf form (grown a timer at a time, so
        // up to twice its length) was most of what they cost while they waited.
        let specs = convert::specs(&request.into_inner(), self.limits())?;
        let results = node.schedule_batch(specs).await?;
        let results = results
            .into_iter()
            .map(|(t, created)| pb::ScheduleResponse {
                timer: Some(t.into()),
                created,
            })
            .collect();
        Ok(Response::new(pb::ScheduleBatchResponse { results }))
    }

    async fn cancel(
        &self,
        request: Request<pb::CancelRequest>,
    ) -> Result<Response<pb::CancelResponse>, Status> {
        let node = self.node_for(&request)?;
        let req = request.into_inner();
        let key = convert::key(&req.namespace, &req.id, self.limits())?;
        let cond = modes::cond(req.if_state, req.if_revision)?;
        let timer = node.cancel(key, cond).await?;
        Ok(Response::new(pb::CancelResponse {
            timer: Some(timer.into()),
        }))
    }

    async fn reschedule(
        &self,
        request: Request<pb::RescheduleRequest>,
    ) -> Result<Response<pb::RescheduleResponse>, Status> {
        let node = self.node_for(&request)?;
        let req = request.into_inner();
        let key = convert::key(&req.namespace, &req.id, self.limits())?;
        let shift = modes::shift(req.when, self.limits())?;
        let cond = modes::cond(req.if_state, req.if_revision)?;
        let timer = node.reschedule(key, shift, cond).await?;
        Ok(Response::new(pb::RescheduleResponse {
            timer: Some(timer.into()),
        }))
    }

    async fn get(
        &self,
        request: Request<pb::GetRequest>,
    ) -> Result<Response<pb::GetResponse>, Status> {
        let node = self.node_for(&request)?;
        let req = request.into_inner();
        let key = convert::key(&req.namespace, &req.id, self.limits())?;
        let upcoming = recurring::next_count(req.next_count)?;
        let timer = node.get_with(&key, upcoming).await?;
        Ok(Response::new(pb::GetResponse {
            timer: Some(timer.into()),
        }))
    }

    async fn list(
        &self,
        request: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ListResponse>, Status> {
        let node = self.node_for(&request)?;
        let query = convert::list_query(request.get_ref(), self.limits())?;
        let (timers, next_after): (Vec<pb::Timer>, _) = if request.get_ref().recurring {
            let after = query.after.as_deref();
            let (recurring, next_after) = node
                .list_recurring(&query.namespace, after, query.limit)
                .await?;
            (recurring.into_iter().map(Into::into).collect(), next_after)
        } else {
            let Page { timers, next_after } = node.list(&query).await?;
            (timers.into_iter().map(Into::into).collect(), next_after)
        };
        Ok(Response::new(pb::ListResponse {
            timers,
            next_page_token: next_after.as_deref().map(encode_token).unwrap_or_default(),
        }))
    }

    type SubscribeStream = subscribe::DeliveryStream;

    async fn subscribe(
        &self,
        request: Request<pb::SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let forwarded = forward::is_forwarded(&request);
        let caller = subscribe::Caller::of(&request);
        let req = subscribe::validate(request.into_inner(), self.limits())?;
        let stream = subscribe::start(self.router.clone(), req, forwarded, caller, None)?;
        Ok(Response::new(stream))
    }

    type ConsumeStream = subscribe::DeliveryStream;

    async fn consume(
        &self,
        request: Request<Streaming<pb::ConsumeRequest>>,
    ) -> Result<Response<Self::ConsumeStream>, Status> {
        let forwarded = forward::is_forwarded(&request);
        let caller = subscribe::Caller::of(&request);
        let mut inbound = request.into_inner();
        let first = inbound.message().await?.ok_or_else(|| {
            Status::invalid_argument("the stream ended before its first message (subscribe)")
        })?;
        let sub = first.subscribe.ok_or_else(|| {
            Status::invalid_argument("the first Consume message must carry `subscribe`")
        })?;
        let req = subscribe::validate(sub, self.limits())?;
        let first_acks = subscribe::validate_acks(first.acks, self.limits())?;
        // A task reads the client's messages; the stream's task takes their acks (or the
        // reason to end) from it.
        let (tx, rx) = tokio::sync::mpsc::channel(subscribe::INBOUND);
        if !first_acks.is_empty() {
            let _ = tx.try_send(Ok(first_acks));
        }
        let limits = self.limits().clone();
        tokio::spawn(async move {
            loop {
                let msg = match inbound.message().await {
                    Ok(Some(msg)) => msg,
                    Ok(None) | Err(_) => return, // the client stopped sending
                };
                let acks = if msg.subscribe.is_some() {
                    Err(Status::invalid_argument(
                        "only the first Consume message may carry `subscribe`",
                    ))
                } else {
                    subscribe::validate_acks(msg.acks, &limits).map_err(Status::from)
                };
                let bad = acks.is_err();
                // Waits while the stream's task is behind: the client is held back by HTTP/2
                // flow control meanwhile.
                if tx.send(acks).await.is_err() || bad {
                    return;
                }
            }
        });
        let stream = subscribe::start(self.router.clone(), req, forwarded, caller, Some(rx))?;
        Ok(Response::new(stream))
    }

    async fn ack(
        &self,
        request: Request<pb::AckRequest>,
    ) -> Result<Response<pb::AckResponse>, Status> {
        let node = self.node_for(&request)?;
        let req = request.into_inner();
        let key = convert::key(&req.namespace, &req.id, self.limits())?;
        let attempt = convert::attempt(req.attempt)?;
        let acked = node.ack(key, attempt, req.wait_for_commit).await?;
        Ok(Response::new(pb::AckResponse {
            timer: Some(acked.timer.into()),
            committed: acked.committed,
        }))
    }

    async fn ack_batch(
        &self,
        request: Request<pb::AckBatchRequest>,
    ) -> Result<Response<pb::AckBatchResponse>, Status> {
        let node = self.node_for(&request)?;
        let acks = convert::acks(request.get_ref(), self.limits())?;
        let results = node.ack_batch(acks).await?;
        Ok(Response::new(pb::AckBatchResponse {
            results: results.into_iter().map(convert::ack_result).collect(),
        }))
    }

    async fn nack(
        &self,
        request: Request<pb::NackRequest>,
    ) -> Result<Response<pb::NackResponse>, Status> {
        let node = self.node_for(&request)?;
        let req = request.into_inner();
        let key = convert::key(&req.namespace, &req.id, self.limits())?;
        let attempt = convert::attempt(req.attempt)?;
        let timer = node.nack(key, attempt).await?;
        Ok(Response::new(pb::NackResponse {
            timer: Some(timer.into()),
        }))
    }

    async fn redrive(
        &self,
        request: Request<pb::RedriveRequest>,
    ) -> Result<Response<pb::RedriveResponse>, Status> {
        let node = self.node_for(&request)?;
        let target = convert::redrive_target(request.get_ref(), self.limits())?;
        Ok(Response::new(match target {
            RedriveTarget::One(key) => pb::RedriveResponse {
                timers: vec![node.redrive(key).await?.into()],
                redriven: 1,
            },
            RedriveTarget::All(namespace) => pb::RedriveResponse {
                timers: Vec::new(),
                redriven: node.redrive_all(&namespace).await?,
            },
        }))
    }

    async fn pause(
        &self,
        request: Request<pb::PauseRequest>,
    ) -> Result<Response<pb::PauseResponse>, Status> {
        let node = self.node_for(&request)?;
        let req = request.into_inner();
        let key = convert::key(&req.namespace, &req.id, self.limits())?;
        let timer = node.pause_recurring(key, true).await?;
        Ok(Response::new(pb::PauseResponse {
            timer: Some(timer.into()),
        }))
    }

    async fn resume(
        &self,
        request: Request<pb::PauseRequest>,
    ) -> Result<Response<pb::PauseResponse>, Status> {
        let node = self.node_for(&request)?;
        let req = request.into_inner();
        let key = convert::key(&req.namespace, &req.id, self.limits())?;
        let timer = node.pause_recurring(key, false).await?;
        Ok(Response::new(pb::PauseResponse {
            timer: Some(timer.into()),
        }))
    }
}
