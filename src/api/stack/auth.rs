//! Who may call what: one tower layer around every service, driven by the access rule of each
//! RPC in [`crate::api::stack::methods`].
//!
//! Per call, before anything else runs (so an answer never depends on whether a timer or a
//! namespace exists):
//! - a path without a rule is refused (default deny); `Open` RPCs (health, reflection) pass;
//! - while auth is off (the replicated switch, `crate::auth`) every call passes as today;
//! - otherwise the caller's credential (`authorization: Bearer <token>`: an API key, or the
//!   node's bootstrap token) must be valid: UNAUTHENTICATED if it is missing, malformed,
//!   unknown or revoked;
//! - `Admin` RPCs need the admin role; `Namespace(permission, names)` RPCs need the permission
//!   on every namespace the request names, read from the first request message (only the
//!   fields [`methods::Names`] points at are decoded; the bytes read are handed on unchanged).
//!   A lacking role is PERMISSION_DENIED, naming the permission and the namespace.
//!
//! Every refusal is counted (`timerdb_auth_denied_total{method,reason}`) and logged with the
//! key id, never the token. The caller's [`Principal`] goes into the request's extensions for
//! the handlers that answer about it (WhoAmI).
//!
//! A follower authorizes a call before forwarding it, and the leader authorizes it again from
//! its own state: the `authorization` header travels unchanged, and relayed streams carry it.
//! A key the follower does not know (created a moment ago, or made up) on a call that goes to
//! the leader anyway is left to the leader ([`LeaderDecides`]): it applied every key whose
//! creation it acknowledged — a new leader once it applied an entry of its own term, which it
//! waits for before refusing a key it does not know (`node/leading.rs`).
//! The peer service (`Access::Peer`) is guarded by the peer TLS identity, not by keys: with
//! peer TLS on, only a connection whose client certificate chains to the peer CA reaches it
//! (and none on the client port when the peers have their own). A client certificate (mTLS)
//! names a certificate user: the key bound to one of its names. A follower forwarding such a
//! user's call names it in [`PRINCIPAL_HEADER`], which a node believes only from a peer.

use std::sync::Arc;

use tonic::body::Body;
use tonic::Status;

use crate::api::stack::layer::{Answer, Around, Inner};
use crate::api::stack::methods::{self, Access, Names, Permission};
use crate::auth::{self, AccessState, Principal, Unauthenticated};
use crate::listen::ConnInfo;
use crate::node::{Leader, Node, Nodes};
use crate::tls::Port;

/// Marks a call a follower's gate let on without a principal, for the leader to authorize:
/// the forwarding layer sends it to the leader, and never runs it on this node (if this node
/// leads by then, it is answered UNAVAILABLE, not applied, to be sent again).
/// It holds one of the gate's [`MAX_DEFERRED`] places until the call is done.
#[derive(Debug, Clone)]
pub struct LeaderDecides(#[allow(dead_code)] Arc<tokio::sync::OwnedSemaphorePermit>);

/// Calls let on for the leader to authorize at once; beyond, an unknown key waits or is
/// refused as before. With [`DEFERRED_MESSAGE_BYTES`] each, what unauthenticated callers can
/// make a follower hold stays bounded (64 × 1 MiB).
const MAX_DEFERRED: usize = 64;
/// The largest message of a call let on for the leader to authorize (`forward`): a larger one
/// is answered UNAVAILABLE (not applied; by then this node knows the key, or it never will).
pub const DEFERRED_MESSAGE_BYTES: usize = 1 << 20;

/// The header a credential travels in.
pub const AUTHORIZATION: &str = "authorization";

/// Longest a follower waits to learn of a key it does not know (see `after_catching_up`).
const CATCH_UP: std::time::Duration = std::time::Duration::from_millis(1000);
/// Calls that may wait for a key this follower does not know at once; beyond, an unknown key
/// is refused at once. Made-up keys (a flood of them) would otherwise each hold one of the
/// node's request slots for [`CATCH_UP`] and lock legitimate callers out (issue 33 finding 12).
const MAX_CATCHING_UP: usize = 64;
/// Key ids remembered as unknown (after a whole wait) while the access state stays the same.
const MAX_UNKNOWN_IDS: usize = 10_000;

/// Carries a certificate user's name on a call a follower forwards (believed only from a
/// connection that presented a peer certificate).
pub const PRINCIPAL_HEADER: &str = "x-timerdb-principal";

/// What the layer checks against: the replicated access state, this node's bootstrap token,
/// and which listener it guards.
pub struct Gate {
    /// Group 0's door: the access state, the members, who leads.
    node: Arc<Node>,
    /// Every group's door: whether a data group's call runs here (`group.rs`).
    nodes: Arc<Nodes>,
    /// SHA-256 of `--auth-bootstrap-token-file`'s token: an admin on this node only.
    bootstrap: Option<[u8; 32]>,
    port: Port,
    /// Places for calls waiting to learn of a key ([`MAX_CATCHING_UP`]).
    catching_up: Arc<tokio::sync::Semaphore>,
    /// Places for calls let on for the leader to authorize ([`MAX_DEFERRED`]).
    deferring: Arc<tokio::sync::Semaphore>,
    /// Key ids a whole wait did not find, and the access state they were not in: while it is
    /// the one applied, a call with one of them is refused at once.
    unknown: std::sync::Mutex<(Option<Arc<AccessState>>, std::collections::HashSet<String>)>,
}

impl Gate {
    pub fn new(nodes: Arc<Nodes>, bootstrap_token: Option<&str>, port: Port) -> Gate {
        Gate {
            node: nodes.meta().clone(),
            nodes,
            bootstrap: bootstrap_token.map(|t| auth::sha256(t.as_bytes())),
            port,
            catching_up: Arc::new(tokio::sync::Semaphore::new(MAX_CATCHING_UP)),
            deferring: Arc::new(tokio::sync::Semaphore::new(MAX_DEFERRED)),
            unknown: Default::default(),
        }
    }

    /// The id of the key `headers`' bearer token names, if it is one.
    fn token_id(headers: &http::HeaderMap) -> Option<String> {
        let value = headers.get(AUTHORIZATION)?.to_str().ok()?;
        auth::split_token(bearer(value)?).map(|(id, _)| id.to_string())
    }

    /// Whether a wait may find the key of `headers`: not one a whole wait missed under the
    /// access state `state` (the one applied now).
    fn worth_waiting(&self, headers: &http::HeaderMap, state: &Arc<AccessState>) -> bool {
        let Some(id) = Self::token_id(headers) else {
            return true; // a certificate's user: waited for as before
        };
        if state.keys.contains_key(&id) {
            return false; // a known key with another secret: no wait will change that
        }
        let unknown = self.unknown.lock().unwrap_or_else(|p| p.into_inner());
        match &unknown.0 {
            Some(seen) if Arc::ptr_eq(seen, state) => !unknown.1.contains(&id),
            _ => true,
        }
    }

    /// A whole wait under `state` did not find the key of `headers`.
    fn remember_unknown(&self, headers: &http::HeaderMap, state: Arc<AccessState>) {
        let Some(id) = Self::token_id(headers) else {
            return;
        };
        let mut unknown = self.unknown.lock().unwrap_or_else(|p| p.into_inner());
        let same = unknown.0.as_ref().is_some_and(|s| Arc::ptr_eq(s, &state));
        if !same || unknown.1.len() >= MAX_UNKNOWN_IDS {
            *unknown = (Some(state), Default::default());
        }
        unknown.1.insert(id);
    }

    /// Whether `conn` is another member: a client certificate the peer CA signed (naming a
    /// member, if required). Without peer TLS nothing can be told apart: every caller is.
    fn peer(&self, conn: Option<&ConnInfo>) -> Result<(), String> {
        let tls = &self.node.config().tls;
        if self.port == Port::Client && tls.files.peer_listen.is_some() {
            return Err("this node serves its peers on its peer port only".into());
        }
        if !tls.peer_tls() {
            return Ok(());
        }
        let ca = tls.peer_ca()?;
        let conn = conn.ok_or("no client certificate")?;
        // Verified once per connection and CA load (listen::ConnInfo keeps the verdict).
        let certs = conn.certs.as_deref().map(Vec::as_slice);
        conn.peer_verdict(ca.id(), || ca.verify(certs))?;
        tls.check_member(conn.cert_names(), || {
            let members = self.members();
            // No members known: a node waiting to be added takes any peer (it admits only the
            // leader's Hello, `storage/admission.rs`); any other is starting (its metrics
            // have not shown its membership yet) and is called again in a moment.
            (!members.is_empty() || self.node.config().join)
                .then_some(members)
                .ok_or_else(|| "this node has not loaded its membership yet: try again".into())
        })
    }

    /// The addresses of the current members.
    fn members(&self) -> Vec<String> {
        let members = self.node.members().into_iter();
        members.map(|(_, addr, _)| addr).collect()
    }

    /// The caller: a bearer token's key (or the bootstrap token), else the key bound to the
    /// connection's client certificate (or, from a peer, the certificate user it forwards).
    fn principal(
        &self,
        headers: &http::HeaderMap,
        conn: Option<&ConnInfo>,
        state: &AccessState,
    ) -> Result<Principal, Unauthenticated> {
        let Some(value) = headers.get(AUTHORIZATION) else {
            return self.cert_principal(headers, conn, state);
        };
        let text = value.to_str().map_err(|_| Unauthenticated::Malformed)?;
        let token = bearer(text).ok_or(Unauthenticated::Malformed)?;
        if let Some(want) = &self.bootstrap {
            if auth::digest_eq(&auth::sha256(token.as_bytes()), want) {
                return Ok(Principal::Bootstrap);
            }
        }
        state.by_token(token).map(|k| Principal::Key(k.clone()))
    }

    /// A key this follower does not know may have been created an instant ago: its creation is
    /// acknowledged once the leader applied it, and a follower applies it a heartbeat later
    /// at most. So wait for the access state to change, up to [`CATCH_UP`], and look again.
    /// (A caller with a made-up key is held that long at most, within the node's bound on
    /// requests in progress.)
    ///
    /// At most [`MAX_CATCHING_UP`] calls wait at once, and a key id a whole wait did not find
    /// is not waited for again while the access state is the same: a flood of made-up keys is
    /// refused at once.
    async fn after_catching_up(
        &self,
        headers: &http::HeaderMap,
        conn: Option<&ConnInfo>,
    ) -> Result<Principal, Unauthenticated> {
        let first = self.node.access();
        if !self.worth_waiting(headers, &first) {
            return Err(Unauthenticated::Unknown);
        }
        let Ok(_place) = self.catching_up.clone().try_acquire_owned() else {
            return Err(Unauthenticated::Unknown);
        };
        let changes = self.node.access_changes();
        let deadline = tokio::time::Instant::now() + CATCH_UP;
        loop {
            let next = changes.notified();
            tokio::pin!(next);
            next.as_mut().enable();
            let state = self.node.access();
            match self.principal(headers, conn, &state) {
                Err(Unauthenticated::Unknown) => {}
                found => return found,
            }
            if tokio::time::timeout_at(deadline, next).await.is_err() {
                self.remember_unknown(headers, state);
                return Err(Unauthenticated::Unknown);
            }
        }
    }

    /// With data groups, a key this node does not know: once its replica of group 0 has
    /// applied group 0's read index, it holds every key whose creation group 0 acknowledged,
    /// so the key is looked up again then, and is unknown if still missing. Bounded as
    /// [`Gate::after_catching_up`] is (its places, and the key ids a whole wait missed).
    async fn after_reading_group_0(
        &self,
        headers: &http::HeaderMap,
        conn: Option<&ConnInfo>,
    ) -> Result<Result<Principal, Unauthenticated>, Status> {
        let first = self.node.access();
        if !self.worth_waiting(headers, &first) {
            return Ok(Err(Unauthenticated::Unknown));
        }
        let Ok(_place) = self.catching_up.clone().try_acquire_owned() else {
            return Ok(Err(Unauthenticated::Unknown));
        };
        self.nodes.meta_caught_up(CATCH_UP).await?;
        let state = self.node.access();
        let found = self.principal(headers, conn, &state);
        if let Err(Unauthenticated::Unknown) = found {
            self.remember_unknown(headers, state);
        }
        Ok(found)
    }

    /// On a leader that has not yet applied an entry of its own term: waits (within
    /// [`CATCH_UP`]) until it has, so the access state it decides from holds everything its
    /// predecessor acknowledged — a key created, one revoked, auth turned on
    /// (`node/leading.rs`). A leader that has not caught up by then (a backlog longer than the
    /// wait) answers UNAVAILABLE, never a decision: a client must not be told a valid key is
    /// unknown, nor be let through by a state its predecessor already changed. Every call
    /// waits, unlike a follower's wait for one key (no places): the window closes for all at
    /// once (usually within milliseconds of the election), nothing a caller sends keeps it
    /// open, and the node's request limit bounds the waiters.
    async fn until_caught_up_as_leader(&self) -> Result<(), Status> {
        match self.node.until_applied_own_term(CATCH_UP).await {
            true => Ok(()),
            false => Err(crate::api::stack::headers::not_applied_status(
                "this node was just elected leader and is still applying its predecessor's \
                 entries: it cannot check the call's credentials yet; send it again"
                    .into(),
            )),
        }
    }

    fn cert_principal(
        &self,
        headers: &http::HeaderMap,
        conn: Option<&ConnInfo>,
        state: &AccessState,
    ) -> Result<Principal, Unauthenticated> {
        let Some(conn) = conn.filter(|c| c.certs.as_deref().is_some_and(|c| !c.is_empty())) else {
            return Err(Unauthenticated::Missing);
        };
        if let Some(name) = headers.get(PRINCIPAL_HEADER) {
            if self.node.config().tls.peer_tls() && self.peer(Some(conn)).is_ok() {
                let name = name.to_str().map_err(|_| Unauthenticated::Malformed)?;
                let key = state.by_cert_name(name).ok_or(Unauthenticated::Unknown)?;
                return Ok(Principal::Key(key.clone()));
            }
        }
        // Verified by the handshake against --client-ca (or the peer CA on a shared port).
        let key = conn.cert_names().iter().find_map(|n| state.by_cert_name(n));
        key.map(|k| Principal::Key(k.clone()))
            .ok_or(Unauthenticated::UnknownCert)
    }

    /// Lets `req` through (with its principal in its extensions) or refuses it.
    async fn check(&self, mut req: http::Request<Body>) -> Result<http::Request<Body>, Status> {
        let Some(rule) = methods::rule_of(req.uri().path()) else {
            let path = req.uri().path();
            return Err(Status::unimplemented(format!("no method {path}")));
        };
        let path = rule.path;
        // A forwarded call skips what the member that forwarded it already did (a stream's
        // ack filter at the client's edge; the retry to the next leader), so only a member may
        // say a call is forwarded.
        if req
            .headers()
            .contains_key(crate::api::stack::headers::FORWARDED_HEADER)
        {
            if let Err(why) = self.peer(req.extensions().get::<ConnInfo>()) {
                denied(path, "not_peer", None);
                return Err(Status::unauthenticated(format!(
                    "{} marks a call a member forwarded, and this caller is no member: {why}",
                    crate::api::stack::headers::FORWARDED_HEADER
                )));
            }
        }
        match rule.access {
            Access::Open => return Ok(req),
            Access::Peer => {
                return match self.peer(req.extensions().get::<ConnInfo>()) {
                    Ok(()) => Ok(req),
                    Err(why) => {
                        denied(path, "not_peer", None);
                        Err(Status::unauthenticated(format!(
                            "{path} is for the cluster's members only: {why}"
                        )))
                    }
                };
            }
            _ => {}
        }
        let mut view = self.node.leader_view();
        if view.leads && !view.caught_up {
            self.until_caught_up_as_leader().await?;
            view = self.node.leader_view();
        }
        // For the router: a call judged elsewhere than on this term's caught-up leader of group
        // 0 is looked at again before it runs — one that waited at a follower that is then
        // elected, and every call of a data group (run by that group's leader, which need not
        // lead group 0: `forward.rs`, `judged_here`).
        req.extensions_mut().insert(JudgedAt(view.judging_term()));
        let state = self.node.access();
        if !state.enabled {
            req.extensions_mut().insert(Principal::Anyone);
            return Ok(req);
        }
        let conn = req.extensions().get::<ConnInfo>();
        let found = match self.principal(req.headers(), conn, &state) {
            // With data groups a call may run on a node that does not lead group 0, which
            // cannot leave a key it does not know to a leader: it catches up with group 0 (its
            // read index, `node/groups.rs`) and looks again. Nothing is let on unauthorized.
            Err(Unauthenticated::Unknown)
                if self.node.leader() != Leader::Me && self.nodes.sharded() =>
            {
                self.after_reading_group_0(req.headers(), conn).await?
            }
            Err(Unauthenticated::Unknown) if self.node.leader() != Leader::Me => {
                let place = (matches!(rule.route, methods::Route::Leader { .. })
                    && Self::token_id(req.headers())
                        .is_some_and(|id| !state.keys.contains_key(&id)))
                .then(|| self.deferring.clone().try_acquire_owned().ok())
                .flatten();
                if let Some(place) = place {
                    // A key this follower does not know, on a call that goes to the leader
                    // anyway: the leader applied every key whose creation it acknowledged, so
                    // it decides (at once), however far this node lags.
                    req.extensions_mut().insert(LeaderDecides(Arc::new(place)));
                    return Ok(req);
                }
                self.after_catching_up(req.headers(), conn).await
            }
            other => other,
        };
        let principal = match found {
            Ok(p) => p,
            Err(why) => {
                denied(path, why.reason(), None);
                return Err(Status::unauthenticated(why.message()));
            }
        };
        match rule.access {
            Access::Open | Access::Peer | Access::Authenticated => {}
            Access::Admin => {
                if !principal.is_admin() {
                    denied(path, "not_admin", Some(&principal));
                    return Err(Status::permission_denied(format!(
                        "{} is not an admin: {path} needs the admin role",
                        principal.describe()
                    )));
                }
            }
            Access::Namespace(permission, names) => {
                let (parts, body) = req.into_parts();
                let first =
                    crate::api::stack::first::first_message(body, methods::message_limit(path))
                        .await?;
                if let Some(namespace) = refusal(&principal, permission, names, &first.message)? {
                    denied(path, "no_permission", Some(&principal));
                    return Err(Status::permission_denied(format!(
                        "{} may not {} in namespace {namespace:?}",
                        principal.describe(),
                        permission.name()
                    )));
                }
                req = http::Request::from_parts(parts, first.hand_on());
            }
        }
        req.extensions_mut().insert(principal);
        Ok(req)
    }
}

/// What a relayed stream carries to the leader for it to authorize the client again: its
/// `authorization`, or the certificate user it is (in [`PRINCIPAL_HEADER`]).
pub type Credential = (
    &'static str,
    tonic::metadata::MetadataValue<tonic::metadata::Ascii>,
);

/// The credential of `req` to send on (see [`Credential`]).
pub fn credential<T>(req: &tonic::Request<T>) -> Option<Credential> {
    if let Some(v) = req.metadata().get(AUTHORIZATION) {
        return Some((AUTHORIZATION, v.clone()));
    }
    let name = cert_user(req.extensions())?;
    Some((PRINCIPAL_HEADER, name.parse().ok()?))
}

/// The certificate name of the certificate user a call comes from, if it does.
pub fn cert_user(extensions: &http::Extensions) -> Option<&str> {
    match extensions.get::<Principal>()? {
        Principal::Key(k) => k.cert_name.as_deref(),
        _ => None,
    }
}

/// The token of an `authorization` value `Bearer <token>` (the scheme in any case).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Counts and logs a refusal; never the token.
fn denied(path: &str, reason: &'static str, principal: Option<&Principal>) {
    crate::metrics::auth_denied(path, reason);
    let who = principal.map(Principal::describe);
    tracing::warn!(method = path, reason, who, "call refused");
}

/// The namespace `principal` may not use `permission` in, among those `message` names.
fn refusal(
    principal: &Principal,
    permission: Permission,
    names: Names,
    message: &[u8],
) -> Result<Option<String>, Status> {
    let Some(namespaces) = crate::api::stack::names::namespaces(names, message)? else {
        return Ok((!principal.allows_every(permission)).then(|| "*".to_string()));
    };
    Ok(namespaces
        .into_iter()
        .find(|ns| !principal.allows(permission, ns)))
}

/// The auth layer (`LayerOf(Arc<Gate>)`): [`Gate::check`] before every call.
impl Around for Arc<Gate> {
    fn around<S: Inner>(&self, inner: S, req: http::Request<Body>) -> Answer {
        let gate = self.clone();
        Box::pin(async move {
            let req = match gate.check(req).await {
                Ok(req) => req,
                Err(status) => return Ok(status.into_http()),
            };
            use crate::api::stack::revocable::Watched;
            // A node-local call (the streams) let in while auth was off ends when it is
            // turned on; leader calls are short, and judged again if they wait for a leader
            // (`forward.rs`).
            let local = methods::rule_of(req.uri().path())
                .is_some_and(|r| r.route == methods::Route::Local);
            let watched = match req.extensions().get::<Principal>() {
                Some(Principal::Key(key)) => Some(Watched::Key(key.clone())),
                Some(Principal::Anyone) if local => Some(Watched::AuthOff),
                _ => None,
            };
            let response = crate::api::stack::layer::call(inner, req).await;
            Ok(match watched {
                // An open call ends when what let it in is gone (api/stack/revocable.rs).
                Some(watched) => crate::api::stack::revocable::wrap(response, &gate.node, watched),
                None => response,
            })
        })
    }
}

/// The term whose caught-up leader of group 0 this node was when its gate judged a call
/// (None: it was not — a follower, a candidate), in the call's extensions for the router.
#[derive(Debug, Clone, Copy)]
pub struct JudgedAt(pub Option<u64>);

/// Whether a call's principal, judged by this node's gate when it was not yet this term's
/// caught-up leader, still holds against the access state it has now applied as leader: auth
/// still off, or the same key unrevoked and unchanged. A follower elected while the call
/// waited would otherwise run it past an acknowledged SetAuth(on) or revocation.
pub fn still_holds(principal: Option<&Principal>, state: &AccessState) -> Result<(), Status> {
    if !state.enabled {
        return Ok(());
    }
    match principal {
        Some(Principal::Bootstrap) => Ok(()),
        Some(Principal::Key(k)) => match state.keys.get(&k.id) {
            Some(now) if now == k => Ok(()),
            Some(_) => Err(crate::api::stack::headers::not_applied_status(
                "the call's API key changed after this node first judged the call (it waited \
                 for a leader, or this node had not yet applied the change): send it again"
                    .into(),
            )),
            None => Err(Status::unauthenticated(Unauthenticated::Unknown.message())),
        },
        // Judged while auth was off, its credentials were not read: judged afresh on a resend.
        Some(Principal::Anyone) | None => Err(crate::api::stack::headers::not_applied_status(
            "auth was turned on after this node first judged the call (it waited for a leader, \
             or this node had not yet applied the change): send it again"
                .into(),
        )),
    }
}

#[cfg(test)]
mod tests;
