//! The client `Namespaces` service: replicated namespace policies.
//!
//! Same shape as the Timers handlers: validate here, then run on the leader or forward the
//! unchanged request to it (see [`super::forward`]). Reads are linearizable.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::convert::{self, encode_token};
use super::forward::{self, Router};
use super::pb::{self, namespaces_server};
use crate::node::Node;
use crate::Error;

/// Serves the Namespaces API on one node.
pub struct NamespacesService {
    router: Router,
}

impl NamespacesService {
    pub fn new(node: Arc<Node>) -> Self {
        NamespacesService {
            router: Router::new(node),
        }
    }
}

impl NamespacesService {
    /// PauseNamespace (`paused`) or ResumeNamespace.
    async fn pause(
        &self,
        request: Request<pb::PauseNamespaceRequest>,
        paused: bool,
    ) -> Result<Response<pb::PauseNamespaceResponse>, Status> {
        let forwarded = forward::is_forwarded(&request);
        let req = request.into_inner();
        let node = self.router.node().as_ref();
        convert::check_name(
            "namespace",
            &req.name,
            node.config.limits.max_namespace_bytes,
        )?;
        let (req, timeout) = (&req, self.router.forward_timeout());
        let reply = self
            .router
            .route(
                forwarded,
                move || async move {
                    let ns = node.pause_namespace(req.name.clone(), paused).await?;
                    Ok(pb::PauseNamespaceResponse {
                        namespace: Some(ns.into()),
                    })
                },
                move |ch| async move {
                    let mut client = forward::namespaces(ch);
                    let r = forward::request(req.clone(), timeout);
                    if paused {
                        client.pause_namespace(r).await
                    } else {
                        client.resume_namespace(r).await
                    }
                },
            )
            .await?;
        Ok(Response::new(reply))
    }
}

#[tonic::async_trait]
impl namespaces_server::Namespaces for NamespacesService {
    async fn put_namespace(
        &self,
        request: Request<pb::PutNamespaceRequest>,
    ) -> Result<Response<pb::PutNamespaceResponse>, Status> {
        let forwarded = forward::is_forwarded(&request);
        let req = request.into_inner();
        let node = self.router.node().as_ref();
        let (name, policy, push) = super::policy::namespace_put(&req, &node.config.limits)?;
        let (name, push) = (&name, &push);
        let (req, timeout) = (&req, self.router.forward_timeout());
        let reply = self
            .router
            .route(
                forwarded,
                move || async move {
                    let ns = node
                        .put_namespace(name.clone(), policy, push.clone())
                        .await?;
                    Ok(pb::PutNamespaceResponse {
                        namespace: Some(ns.into()),
                    })
                },
                move |ch| async move {
                    forward::namespaces(ch)
                        .put_namespace(forward::request(req.clone(), timeout))
                        .await
                },
            )
            .await?;
        Ok(Response::new(reply))
    }

    async fn get_namespace(
        &self,
        request: Request<pb::GetNamespaceRequest>,
    ) -> Result<Response<pb::GetNamespaceResponse>, Status> {
        let forwarded = forward::is_forwarded(&request);
        let req = request.into_inner();
        let node = self.router.node().as_ref();
        convert::check_name(
            "namespace",
            &req.name,
            node.config.limits.max_namespace_bytes,
        )?;
        let (req, timeout) = (&req, self.router.forward_timeout());
        let reply = self
            .router
            .route(
                forwarded,
                move || async move {
                    let ns = node.namespace(&req.name).await?;
                    Ok(pb::GetNamespaceResponse {
                        namespace: Some(ns.into()),
                    })
                },
                move |ch| async move {
                    forward::namespaces(ch)
                        .get_namespace(forward::request(req.clone(), timeout))
                        .await
                },
            )
            .await?;
        Ok(Response::new(reply))
    }

    async fn pause_namespace(
        &self,
        request: Request<pb::PauseNamespaceRequest>,
    ) -> Result<Response<pb::PauseNamespaceResponse>, Status> {
        self.pause(request, true).await
    }

    async fn resume_namespace(
        &self,
        request: Request<pb::PauseNamespaceRequest>,
    ) -> Result<Response<pb::PauseNamespaceResponse>, Status> {
        self.pause(request, false).await
    }

    async fn list_namespaces(
        &self,
        request: Request<pb::ListNamespacesRequest>,
    ) -> Result<Response<pb::ListNamespacesResponse>, Status> {
        let forwarded = forward::is_forwarded(&request);
        let req = request.into_inner();
        let node = self.router.node().as_ref();
        let limits = &node.config.limits;
        let limit = match req.limit as usize {
            0 => limits.default_list_limit,
            n if n > limits.max_list_limit => {
                return Err(Error::InvalidArgument(format!(
                    "limit {n} exceeds the maximum page size {}",
                    limits.max_list_limit
                ))
                .into())
            }
            n => n,
        };
        let after = match req.page_token.as_str() {
            "" => None,
            token => Some(convert::decode_token(token)?),
        };
        let (after, req, timeout) = (&after, &req, self.router.forward_timeout());
        let reply = self
            .router
            .route(
                forwarded,
                move || async move {
                    let page = node.namespaces(after.as_deref(), limit).await?;
                    let next_page_token = match page.last() {
                        Some(last) if page.len() == limit => encode_token(&last.name),
                        _ => String::new(),
                    };
                    let namespaces = page.into_iter().map(Into::into).collect();
                    Ok(pb::ListNamespacesResponse {
                        namespaces,
                        next_page_token,
                    })
                },
                move |ch| async move {
                    forward::namespaces(ch)
                        .list_namespaces(forward::request(req.clone(), timeout))
                        .await
                },
            )
            .await?;
        Ok(Response::new(reply))
    }
}
