//! The stack: the layers every client call goes through before and after its service, one
//! table ([`methods`]) driving them. Outermost first, as `server` wires them: the HTTP/JSON
//! transcoder (`api/http`), the metrics ([`observe`]), the node-wide request bound
//! ([`limit`]), which Raft group a call is for ([`group`]), who may call what ([`auth`], with
//! [`first`] reading a request's first message, [`names`] the namespaces in it, and
//! [`revocable`] ending calls whose key is revoked), then forwarding to the group's leader
//! ([`forward`]). [`layer`] is the one shape they share; [`headers`] the headers they speak.

pub mod auth;
pub mod first;
pub mod forward;
pub mod group;
pub mod headers;
pub mod layer;
pub mod limit;
pub mod methods;
pub mod names;
pub mod observe;
pub mod revocable;
