//! The client `Timers` service: validate, then route to the leader (see [`super::forward`]).
//!
//! Every handler has the same shape: validate the request here (a bad request never leaves
//! this node), then let the router run the domain operation on the leader or forward the
//! original request to it. Subscribe and Ack belong to the delivery issue and answer
//! UNIMPLEMENTED until then.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use tonic::{Request, Response, Status};

use super::convert::{self, encode_token};
use super::forward::{self, Router};
use super::pb::{self, timers_server};
use crate::config::Limits;
use crate::node::Node;

/// Serves the Timers API on one node.
pub struct TimersService {
    router: Router,
}

impl TimersService {
    pub fn new(node: Arc<Node>) -> Self {
        TimersService {
            router: Router::new(node),
        }
    }

    fn node(&self) -> &Node {
        self.router.node()
    }

    fn limits(&self) -> &Limits {
        &self.node().config.limits
    }
}

type DeliveryStream = Pin<Box<dyn Stream<Item = Result<pb::Delivery, Status>> + Send>>;

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
        let specs = &convert::specs(&req, self.limits())?;
        let (node, req, timeout) = (self.node(), &req, self.router.forward_timeout());
        let reply = self
            .router
            .route(
                forwarded,
                move || async move {
                    let results = node.schedule_batch(specs.clone()).await?;
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

    type SubscribeStream = DeliveryStream;

    async fn subscribe(
        &self,
        _request: Request<pb::SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        Err(Status::unimplemented(
            "Subscribe is not available yet: fired timers can be read with List(state=FIRED)",
        ))
    }

    async fn ack(
        &self,
        _request: Request<pb::AckRequest>,
    ) -> Result<Response<pb::AckResponse>, Status> {
        Err(Status::unimplemented("Ack is not available yet"))
    }
}
