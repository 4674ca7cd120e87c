//! The client `Access` service: API keys and the auth switch (docs/security.md).
//!
//! Who may call it is the auth layer's business (admin, or anyone while auth is off); this
//! file only validates and proposes. A key's token is made here, on the leader, from the
//! operating system's randomness, and returned once: the command carries only its SHA-256.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::api::pb::{self, access_server};
use crate::auth::{self, AccessChange, Key, Principal, Role};
use crate::command::{Command, Response as Applied};
use crate::node::Node;
use crate::{Error, Result};

/// Serves the Access API on one node.
pub struct AccessService {
    node: Arc<Node>,
}

impl AccessService {
    pub fn new(node: Arc<Node>) -> Self {
        AccessService { node }
    }

    async fn change(&self, change: AccessChange) -> Result<(bool, Option<Key>)> {
        match self.node.write(Command::Access(change)).await? {
            Applied::Access { enabled, key } => Ok((enabled, key)),
            Applied::Rejected(r) => Err(r.into_error()),
            other => Err(Error::Internal(format!("access change answered {other:?}"))),
        }
    }
}

fn info(k: &Key) -> pb::KeyInfo {
    pb::KeyInfo {
        id: k.id.clone(),
        name: k.name.clone(),
        roles: k.roles.iter().map(Role::to_string).collect(),
        cert_name: k.cert_name.clone().unwrap_or_default(),
        created_at_ms: k.created_ms,
        has_secret: k.secret_sha256.is_some(),
    }
}

#[tonic::async_trait]
impl access_server::Access for AccessService {
    async fn create_key(
        &self,
        request: Request<pb::CreateKeyRequest>,
    ) -> Result<Response<pb::CreateKeyResponse>, Status> {
        let req = request.into_inner();
        let roles = req
            .roles
            .iter()
            .map(|r| Role::parse(r))
            .collect::<Result<Vec<_>>>()?;
        let cert_name = (!req.cert_name.is_empty()).then_some(req.cert_name);
        if req.no_secret && cert_name.is_none() {
            return Err(Error::InvalidArgument("no_secret needs a cert_name".into()).into());
        }
        let random: [u8; 40] = rand::random();
        let (id, token, digest) = auth::new_token(&random);
        let key = Key {
            id,
            name: req.name,
            secret_sha256: (!req.no_secret).then_some(digest),
            cert_name,
            roles,
            created_ms: self.node.now_ms(),
        };
        key.validate()?;
        let (_, key) = self.change(AccessChange::PutKey(key)).await?;
        let key = key.ok_or_else(|| Error::Internal("no key in the answer".into()))?;
        tracing::info!(id = key.id, name = key.name, "API key created");
        Ok(Response::new(pb::CreateKeyResponse {
            token: if req.no_secret { String::new() } else { token },
            key: Some(info(&key)),
        }))
    }

    async fn revoke_key(
        &self,
        request: Request<pb::RevokeKeyRequest>,
    ) -> Result<Response<pb::RevokeKeyResponse>, Status> {
        let id = request.into_inner().id;
        if id.is_empty() || id.len() > 128 {
            return Err(Error::InvalidArgument("key id must be 1 to 128 bytes".into()).into());
        }
        let (_, key) = self.change(AccessChange::RevokeKey(id)).await?;
        if let Some(k) = &key {
            tracing::info!(id = k.id, name = k.name, "API key revoked");
        }
        Ok(Response::new(pb::RevokeKeyResponse {
            key: key.as_ref().map(info),
        }))
    }

    async fn list_keys(
        &self,
        _request: Request<pb::ListKeysRequest>,
    ) -> Result<Response<pb::ListKeysResponse>, Status> {
        self.node.read_barrier().await?;
        let state = self.node.access();
        Ok(Response::new(pb::ListKeysResponse {
            keys: state.keys.values().map(info).collect(),
            auth_enabled: state.enabled,
        }))
    }

    async fn set_auth(
        &self,
        request: Request<pb::SetAuthRequest>,
    ) -> Result<Response<pb::SetAuthResponse>, Status> {
        let on = request.into_inner().enabled;
        let (enabled, _) = self.change(AccessChange::Enable(on)).await?;
        tracing::info!(enabled, "auth switched");
        Ok(Response::new(pb::SetAuthResponse { enabled }))
    }

    async fn who_am_i(
        &self,
        request: Request<pb::WhoAmIRequest>,
    ) -> Result<Response<pb::WhoAmIResponse>, Status> {
        let principal = request
            .extensions()
            .get::<Principal>()
            .cloned()
            .unwrap_or(Principal::Anyone);
        Ok(Response::new(pb::WhoAmIResponse {
            auth_enabled: self.node.access().enabled,
            principal: principal.describe(),
            roles: principal.roles(),
        }))
    }
}
