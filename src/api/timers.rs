//! The client `Timers` service: validate, then route to the leader (see [`super::forward`]).
//!
//! Every handler has the same shape: validate the request here (a bad request never leaves
//! this node), then let the router run the domain operation on the leader or forward the
//! original request to it. Subscribe is a stream that follows the leader: see
//! [`super::subscribe`].

use std::sync::Arc;

use tonic::{Request, Response, Status, Streaming};

use super::convert::{self, encode_token, RedriveTarget};
use super::forward::{self, Router};
use super::pb::{self, timers_server};
use super::subscribe;
use crate::config::Limits;
use crate::node::Node;

/// Serves the Timers API on one node.
pub struct TimersService {
    router: Arc<Router>,
}

impl TimersService {
    pub fn new(node: Arc<Node>) -> Self {
        TimersService {
            router: Arc::new(Router::new(node)),
        }
    }

    fn node(&self) -> &Node {
        self.router.node()
    }

    fn limits(&self) -> &Limits {
        &self.node().config.limits
    }
}

#[tonic::async_trait]
impl timers_server::Timers for TimersService {
    async fn schedule(
        &self,
        request: Request<pb::ScheduleRequest>,
    ) -> Result<Response<pb::ScheduleResponse>, Status> {
        let forwarded = forward::is_forwarded(&request);
        let req = request.into_inner();
        let spec = &convert::spec(&req, self.limits())?;
        let (node, req, timeout) = (self.node(), &req, self.router.forward_timeout());
        let reply = self
            .router
            .route(
                forwarded,
                move || async move {
                    let (timer, created) = node.schedule(spec.clone()).await?;
                    Ok(pb::ScheduleResponse {
                        timer: Some(timer.into()),
                        created,
                    })
                },
                move |ch| async move {
                    forward::timers(ch)
                        .schedule(forward::request(req.clone(), timeout))
                        .await
                },
            )
            .await?;
        Ok(Response::new(reply))
    }

    async fn schedule_batch(
        &self,
        request: Request<pb::ScheduleBatchRequest>,
    ) -> Result<Response<pb::ScheduleBatchResponse>, Status> {
        let forwarded = forward::is_forwarded(&request);
        let req = request.into_inner();
        let limits = self.limits();
        // The first attempt takes the specs; a retry (leadership moved meanwhile) converts the
        // request again rather than every call copying 10,000 specs in case it retries.
        let first = &std::sync::Mutex::new(Some(convert::specs(&req, limits)?));
        let (node, req, timeout) = (self.node(), &req, self.router.forward_timeout());
        let reply = self
            .router
            .route(
                forwarded,
                move || async move {
                    let taken = first.lock().expect("specs lock").take();
                    let specs = match taken {
                        Some(specs) => specs,
                        None => convert::specs(req, limits)?,
                    };
                    let results = node.schedule_batch(specs).await?;
                    let results = results
                        .into_iter()
                        .map(|(t, created)| pb::ScheduleResponse {
                            timer: Some(t.into()),
                            created,
                        })
                        .collect();
                    Ok(pb::ScheduleBatchResponse { results })
                },
                move |ch| async move {
                    forward::timers(ch)
                        .schedule_batch(forward::request(req.clone(), timeout))
                        .await
                },
            )
            .await?;
        Ok(Response::new(reply))
    }

    async fn cancel(
        &self,
        request: Request<pb::CancelRequest>,
    ) -> Result<Response<pb::CancelResponse>, Status> {
        let forwarded = forward::is_forwarded(&request);
        let req = request.into_inner();
        let key = &convert::key(&req.namespace, &req.id, self.limits())?;
        let (node, req, timeout) = (self.node(), &req, self.router.forward_timeout());
        let reply = self
            .router
            .route(
                forwarded,
                move || async move {
                    let timer = node.cancel(key.clone()).await?;
                    Ok(pb::CancelResponse {
                        timer: Some(timer.into()),
                    })
                },
                move |ch| async move {
                    forward::timers(ch)
                        .cancel(forward::request(req.clone(), timeout))
                        .await
                },
            )
            .await?;
        Ok(Response::new(reply))
    }

    async fn reschedule(
        &self,
        request: Request<pb::RescheduleRequest>,
    ) -> Result<Response<pb::RescheduleResponse>, Status> {
        let forwarded = forward::is_forwarded(&request);
        let req = request.into_inner();
        let key = &convert::key(&req.namespace, &req.id, self.limits())?;
        let when = convert::reschedule_when(req.when, self.limits())?;
        let (node, req, timeout) = (self.node(), &req, self.router.forward_timeout());
        let reply = self
            .router
            .route(
                forwarded,
                move || async move {
                    let timer = node.reschedule(key.clone(), when).await?;
                    Ok(pb::RescheduleResponse {
                        timer: Some(timer.into()),
                    })
                },
                move |ch| async move {
                    forward::timers(ch)
                        .reschedule(forward::request(req.clone(), timeout))
                        .await
                },
            )
            .await?;
        Ok(Response::new(reply))
    }

    async fn get(
        &self,
        request: Request<pb::GetRequest>,
    ) -> Result<Response<pb::GetResponse>, Status> {
        let forwarded = forward::is_forwarded(&request);
        let req = request.into_inner();
        let key = &convert::key(&req.namespace, &req.id, self.limits())?;
        let (node, req, timeout) = (self.node(), &req, self.router.forward_timeout());
        let reply = self
            .router
            .route(
                forwarded,
                move || async move {
                    let timer = node.get(key).await?;
                    Ok(pb::GetResponse {
                        timer: Some(timer.into()),
                    })
                },
                move |ch| async move {
                    forward::timers(ch)
                        .get(forward::request(req.clone(), timeout))
                        .await
                },
            )
            .await?;
        Ok(Response::new(reply))
    }

    async fn list(
        &self,
        request: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ListResponse>, Status> {
        let forwarded = forward::is_forwarded(&request);
        let req = request.into_inner();
        let p = &convert::list_query(&req, self.limits())?;
        let (node, req, timeout) = (self.node(), &req, self.router.forward_timeout());
        let reply = self
            .router
            .route(
                forwarded,
                move || async move {
                    let page = node.list(p).await?;
                    Ok(pb::ListResponse {
                        timers: page.timers.into_iter().map(Into::into).collect(),
                        next_page_token: page
                            .next_after
                            .as_deref()
                            .map(encode_token)
                            .unwrap_or_default(),
                    })
                },
                move |ch| async move {
                    forward::timers(ch)
                        .list(forward::request(req.clone(), timeout))
                        .await
                },
            )
            .await?;
        Ok(Response::new(reply))
    }

    type SubscribeStream = subscribe::DeliveryStream;

    async fn subscribe(
        &self,
        request: Request<pb::SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let forwarded = forward::is_forwarded(&request);
        let req = subscribe::validate(request.into_inner(), self.limits())?;
        let stream = subscribe::start(self.router.clone(), req, forwarded, None)?;
        Ok(Response::new(stream))
    }

    type ConsumeStream = subscribe::DeliveryStream;

    async fn consume(
        &self,
        request: Request<Streaming<pb::ConsumeRequest>>,
    ) -> Result<Response<Self::ConsumeStream>, Status> {
        let forwarded = forward::is_forwarded(&request);
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
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        if !first_acks.is_empty() {
            let _ = tx.send(Ok(first_acks));
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
                if tx.send(acks).is_err() || bad {
                    return;
                }
            }
        });
        let stream = subscribe::start(self.router.clone(), req, forwarded, Some(rx))?;
        Ok(Response::new(stream))
    }

    async fn ack(
        &self,
        request: Request<pb::AckRequest>,
    ) -> Result<Response<pb::AckResponse>, Status> {
        let forwarded = forward::is_forwarded(&request);
        let req = request.into_inner();
        let key = &convert::key(&req.namespace, &req.id, self.limits())?;
        let attempt = convert::attempt(req.attempt)?;
        let (node, req, timeout) = (self.node(), &req, self.router.forward_timeout());
        let reply = self
            .router
            .route(
                forwarded,
                move || async move {
                    let timer = node.ack(key.clone(), attempt).await?;
                    Ok(pb::AckResponse {
                        timer: Some(timer.into()),
                    })
                },
                move |ch| async move {
                    forward::timers(ch)
                        .ack(forward::request(req.clone(), timeout))
                        .await
                },
            )
            .await?;
        Ok(Response::new(reply))
    }

    async fn ack_batch(
        &self,
        request: Request<pb::AckBatchRequest>,
    ) -> Result<Response<pb::AckBatchResponse>, Status> {
        let forwarded = forward::is_forwarded(&request);
        let req = request.into_inner();
        let acks = &convert::acks(&req, self.limits())?;
        let (node, req, timeout) = (self.node(), &req, self.router.forward_timeout());
        let reply = self
            .router
            .route(
                forwarded,
                move || async move {
                    let results = node.ack_batch(acks.clone()).await?;
                    Ok(pb::AckBatchResponse {
                        results: results.into_iter().map(convert::ack_result).collect(),
                    })
                },
                move |ch| async move {
                    forward::timers(ch)
                        .ack_batch(forward::request(req.clone(), timeout))
                        .await
                },
            )
            .await?;
        Ok(Response::new(reply))
    }

    async fn nack(
        &self,
        request: Request<pb::NackRequest>,
    ) -> Result<Response<pb::NackResponse>, Status> {
        let forwarded = forward::is_forwarded(&request);
        let req = request.into_inner();
        let key = &convert::key(&req.namespace, &req.id, self.limits())?;
        let attempt = convert::attempt(req.attempt)?;
        let (node, req, timeout) = (self.node(), &req, self.router.forward_timeout());
        let reply = self
            .router
            .route(
                forwarded,
                move || async move {
                    let timer = node.nack(key.clone(), attempt).await?;
                    Ok(pb::NackResponse {
                        timer: Some(timer.into()),
                    })
                },
                move |ch| async move {
                    forward::timers(ch)
                        .nack(forward::request(req.clone(), timeout))
                        .await
                },
            )
            .await?;
        Ok(Response::new(reply))
    }

    async fn redrive(
        &self,
        request: Request<pb::RedriveRequest>,
    ) -> Result<Response<pb::RedriveResponse>, Status> {
        let forwarded = forward::is_forwarded(&request);
        let req = request.into_inner();
        let target = &convert::redrive_target(&req, self.limits())?;
        let (node, req, timeout) = (self.node(), &req, self.router.forward_timeout());
        let reply = self
            .router
            .route(
                forwarded,
                move || async move {
                    Ok(match target {
                        RedriveTarget::One(key) => pb::RedriveResponse {
                            timers: vec![node.redrive(key.clone()).await?.into()],
                            redriven: 1,
                        },
                        RedriveTarget::All(namespace) => pb::RedriveResponse {
                            timers: Vec::new(),
                            redriven: node.redrive_all(namespace).await?,
                        },
                    })
                },
                move |ch| async move {
                    forward::timers(ch)
                        .redrive(forward::request(req.clone(), timeout))
                        .await
                },
            )
            .await?;
        Ok(Response::new(reply))
    }
}
