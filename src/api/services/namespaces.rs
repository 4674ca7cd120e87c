//! The client `Namespaces` service: replicated namespace policies.
//!
//! Same shape as the Timers handlers: validate, then call the node. The forwarding layer runs
//! every call on the leader ([`crate::api::stack::forward`]), so reads are linearizable.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::api::convert::{self, encode_token};
use crate::api::pb::{self, namespaces_server};
use crate::node::{Node, Nodes};
use crate::Error;

/// Serves the Namespaces API on one node.
pub struct NamespacesService {
    /// Group 0's door: namespaces are configured there.
    node: Arc<Node>,
    /// Every group's: a change is acknowledged once the group owning the namespace's timers
    /// has it (`node/policies.rs`).
    nodes: Arc<Nodes>,
}

impl NamespacesService {
    pub fn new(nodes: Arc<Nodes>) -> Self {
        let node = nodes.meta().clone();
        NamespacesService { node, nodes }
    }

    /// PauseNamespace (`paused`) or ResumeNamespace.
    async fn pause(
        &self,
        request: Request<pb::PauseNamespaceRequest>,
        paused: bool,
    ) -> Result<Response<pb::PauseNamespaceResponse>, Status> {
        let req = request.into_inner();
        let max = self.node.config().limits.max_namespace_bytes;
        convert::check_name("namespace", &req.name, max)?;
        let ns = self.node.pause_namespace(req.name, paused).await?;
        self.nodes.namespace_applied(&ns.name).await?;
        Ok(Response::new(pb::PauseNamespaceResponse {
            namespace: Some(ns.into()),
        }))
    }
}

#[tonic::async_trait]
impl namespaces_server::Namespaces for NamespacesService {
    async fn put_namespace(
        &self,
        request: Request<pb::PutNamespaceRequest>,
    ) -> Result<Response<pb::PutNamespaceResponse>, Status> {
        let limits = &self.node.config().limits;
        let (name, policy, push) =
            crate::api::convert::policy::namespace_put(request.get_ref(), limits)?;
        if let Some(target) = &push {
            check_reach(&self.node, &target.url).await?;
        }
        let ns = self.node.put_namespace(name, policy, push).await?;
        self.nodes.namespace_applied(&ns.name).await?;
        Ok(Response::new(pb::PutNamespaceResponse {
            namespace: Some(ns.into()),
        }))
    }

    async fn get_namespace(
        &self,
        request: Request<pb::GetNamespaceRequest>,
    ) -> Result<Response<pb::GetNamespaceResponse>, Status> {
        let req = request.into_inner();
        let max = self.node.config().limits.max_namespace_bytes;
        convert::check_name("namespace", &req.name, max)?;
        let ns = self.node.namespace(&req.name).await?;
        Ok(Response::new(pb::GetNamespaceResponse {
            namespace: Some(ns.into()),
        }))
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
        let req = request.into_inner();
        let limits = &self.node.config().limits;
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
        let page = self.node.namespaces(after.as_deref(), limit).await?;
        let next_page_token = match page.last() {
            Some(last) if page.len() == limit => encode_token(&last.name),
            _ => String::new(),
        };
        Ok(Response::new(pb::ListNamespacesResponse {
            namespaces: page.into_iter().map(Into::into).collect(),
            next_page_token,
        }))
    }
}

/// Refuses a push target the push guard would refuse (a private address without
/// `--push-allow-private`), so the operator learns it now rather than from failed attempts.
async fn check_reach(node: &Node, url: &str) -> Result<(), Status> {
    let Ok(uri) = url.parse::<http::Uri>() else {
        return Ok(()); // the policy's own validation judged the URL
    };
    let Some(host) = uri.host() else {
        return Ok(());
    };
    let port = uri.port_u16().unwrap_or(443);
    crate::push::guard::Guard::of(node.config())
        .check_target(host, port)
        .await
        .map_err(Status::invalid_argument)
}
