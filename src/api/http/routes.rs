//! The HTTP routes: which method and path stand for which gRPC method, and how the request
//! message is made from the path, the query and the body (docs/http.md has the same table for
//! people; the OpenAPI document is generated from this one).
//!
//! A path template is segments; `{field}` matches one segment and fills that request field; the
//! last segment may end in a custom verb (`{id}:reschedule`, `timers:batch`): the text after the
//! segment's *last* `:`, so ids with colons (a recurring timer's occurrences) match `{id}` as
//! they are. Routes are tried in order; a segment is percent-decoded before it fills a field.

use http::Method;
use serde_json::Value;

use super::codec::{Codec, CODECS};
use crate::api::{MAX_CLIENT_MESSAGE_BYTES, MAX_SMALL_MESSAGE_BYTES};

/// Where a route's request fields come from, besides the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// The body, a JSON object (optional: none is `{}`).
    Body,
    /// The query string (the scalar fields of the request message).
    Query,
}

/// What a route answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// The response message as a JSON object.
    Unary,
    /// The server stream, one JSON object per line (NDJSON), then the end or an error line.
    Lines,
    /// The backup file itself (Backup's data messages), its info in a header.
    Backup,
}

/// One HTTP route onto one gRPC method.
#[derive(Debug)]
pub struct Route {
    pub method: Method,
    pub path: &'static str,
    /// The gRPC method's path, `/timerdb.v1.Service/Method`.
    pub rpc: &'static str,
    /// The request and response message names (in `timerdb.v1`).
    pub request: &'static str,
    pub response: &'static str,
    pub input: Input,
    pub output: Output,
    /// Fields set whatever the request says (Redrive of a whole namespace: `all`).
    pub fixed: &'static [(&'static str, bool)],
    /// In the batch calls, the repeated field whose elements take the path's namespace.
    pub each: Option<&'static str>,
    /// Largest body accepted, in bytes (gRPC's own limit for the method).
    pub body_limit: usize,
    pub summary: &'static str,
}

impl Route {
    /// The codec of this route's messages.
    pub fn codec(&self) -> &'static Codec {
        CODECS
            .iter()
            .find(|c| c.rpc == self.rpc)
            .expect("every route's method has a codec (checked by a unit test)")
    }

    /// The operation's name in the OpenAPI document: the method, and for a second route onto
    /// the same method what distinguishes it.
    pub fn operation_id(&self) -> String {
        let method = self.rpc.rsplit('/').next().unwrap_or(self.rpc);
        match self.fixed.first() {
            Some((field, _)) => format!("{method}_{field}"),
            None => method.to_string(),
        }
    }

    /// The names of the path's parameters, in order.
    pub fn params(&self) -> impl Iterator<Item = &'static str> {
        self.path.split('/').filter_map(|seg| {
            let inner = seg.strip_prefix('{')?;
            Some(&inner[..inner.find('}')?])
        })
    }
}

const fn route(
    method: Method,
    path: &'static str,
    rpc: &'static str,
    messages: (&'static str, &'static str),
    input: Input,
    summary: &'static str,
) -> Route {
    let body_limit = if matches!(input, Input::Body) && is_timers(rpc) {
        MAX_CLIENT_MESSAGE_BYTES
    } else {
        MAX_SMALL_MESSAGE_BYTES
    };
    Route {
        method,
        path,
        rpc,
        request: messages.0,
        response: messages.1,
        input,
        output: Output::Unary,
        fixed: &[],
        each: None,
        body_limit,
        summary,
    }
}

const fn is_timers(rpc: &str) -> bool {
    let p = rpc.as_bytes();
    let prefix = b"/timerdb.v1.Timers/";
    if p.len() < prefix.len() {
        return false;
    }
    let mut i = 0;
    while i < prefix.len() {
        if p[i] != prefix[i] {
            return false;
        }
        i += 1;
    }
    true
}

const TIMER: &str = "/v1/namespaces/{namespace}/timers/{id}";

/// Every route, in the order they are tried.
pub static ROUTES: &[Route] = &[
    // timerdb.v1.Timers
    route(
        Method::POST,
        "/v1/namespaces/{namespace}/timers:batch",
        "/timerdb.v1.Timers/ScheduleBatch",
        ("ScheduleBatchRequest", "ScheduleBatchResponse"),
        Input::Body,
        "Creates many timers in one replicated write: all or none.",
    )
    .each("timers"),
    route(
        Method::POST,
        "/v1/namespaces/{namespace}/timers:ack",
        "/timerdb.v1.Timers/AckBatch",
        ("AckBatchRequest", "AckBatchResponse"),
        Input::Body,
        "Acknowledges many deliveries; each is answered alone, in order.",
    )
    .each("acks"),
    route(
        Method::POST,
        "/v1/namespaces/{namespace}/timers:redrive",
        "/timerdb.v1.Timers/Redrive",
        ("RedriveRequest", "RedriveResponse"),
        Input::Body,
        "Returns every DEAD timer of the namespace to PENDING, due at once.",
    )
    .fixed(&[("all", true)]),
    route(
        Method::POST,
        "/v1/namespaces/{namespace}/timers",
        "/timerdb.v1.Timers/Schedule",
        ("ScheduleRequest", "ScheduleResponse"),
        Input::Body,
        "Creates a timer (idempotent on namespace and id).",
    ),
    route(
        Method::GET,
        "/v1/namespaces/{namespace}/timers",
        "/timerdb.v1.Timers/List",
        ("ListRequest", "ListResponse"),
        Input::Query,
        "Pages through a namespace's timers, filtered by state and fire time.",
    ),
    route(
        Method::POST,
        "/v1/namespaces/{namespace}/timers/{id}:reschedule",
        "/timerdb.v1.Timers/Reschedule",
        ("RescheduleRequest", "RescheduleResponse"),
        Input::Body,
        "Moves a PENDING timer to a new fire time.",
    ),
    route(
        Method::POST,
        "/v1/namespaces/{namespace}/timers/{id}:ack",
        "/timerdb.v1.Timers/Ack",
        ("AckRequest", "AckResponse"),
        Input::Body,
        "Acknowledges one delivery: FIRED -> ACKED exactly once.",
    ),
    route(
        Method::POST,
        "/v1/namespaces/{namespace}/timers/{id}:nack",
        "/timerdb.v1.Timers/Nack",
        ("NackRequest", "NackResponse"),
        Input::Body,
        "Gives up on one delivery now: redelivered after the backoff, or DEAD.",
    ),
    route(
        Method::POST,
        "/v1/namespaces/{namespace}/timers/{id}:redrive",
        "/timerdb.v1.Timers/Redrive",
        ("RedriveRequest", "RedriveResponse"),
        Input::Body,
        "Returns one DEAD timer to PENDING, due at once.",
    ),
    route(
        Method::POST,
        "/v1/namespaces/{namespace}/timers/{id}:pause",
        "/timerdb.v1.Timers/Pause",
        ("PauseRequest", "PauseResponse"),
        Input::Body,
        "Pauses a recurring timer.",
    ),
    route(
        Method::POST,
        "/v1/namespaces/{namespace}/timers/{id}:resume",
        "/timerdb.v1.Timers/Resume",
        ("PauseRequest", "PauseResponse"),
        Input::Body,
        "Resumes a paused recurring timer from its next occurrence after now.",
    ),
    route(
        Method::GET,
        TIMER,
        "/timerdb.v1.Timers/Get",
        ("GetRequest", "GetResponse"),
        Input::Query,
        "Reads one timer (linearizable).",
    ),
    route(
        Method::DELETE,
        TIMER,
        "/timerdb.v1.Timers/Cancel",
        ("CancelRequest", "CancelResponse"),
        Input::Query,
        "Cancels a PENDING timer; the answer is definitive.",
    ),
    route(
        Method::GET,
        "/v1/namespaces/{namespace}/deliveries",
        "/timerdb.v1.Timers/Subscribe",
        ("SubscribeRequest", "Delivery"),
        Input::Query,
        "Streams the namespace's fired timers as they are delivered, one JSON object per line.",
    )
    .lines(),
    // timerdb.v1.Namespaces
    route(
        Method::GET,
        "/v1/namespaces",
        "/timerdb.v1.Namespaces/ListNamespaces",
        ("ListNamespacesRequest", "ListNamespacesResponse"),
        Input::Query,
        "Pages through the configured namespaces in name order.",
    ),
    route(
        Method::POST,
        "/v1/namespaces/{name}:pause",
        "/timerdb.v1.Namespaces/PauseNamespace",
        ("PauseNamespaceRequest", "PauseNamespaceResponse"),
        Input::Body,
        "Stops dispatching the namespace's fired timers.",
    ),
    route(
        Method::POST,
        "/v1/namespaces/{name}:resume",
        "/timerdb.v1.Namespaces/ResumeNamespace",
        ("PauseNamespaceRequest", "PauseNamespaceResponse"),
        Input::Body,
        "Resumes dispatching the namespace's fired timers.",
    ),
    route(
        Method::GET,
        "/v1/namespaces/{name}",
        "/timerdb.v1.Namespaces/GetNamespace",
        ("GetNamespaceRequest", "GetNamespaceResponse"),
        Input::Query,
        "Reads a namespace's policy (configured = false: the defaults).",
    ),
    route(
        Method::PUT,
        "/v1/namespaces/{name}",
        "/timerdb.v1.Namespaces/PutNamespace",
        ("PutNamespaceRequest", "PutNamespaceResponse"),
        Input::Body,
        "Sets a namespace's policy; a zero field takes the default.",
    ),
    // timerdb.v1.Cluster
    route(
        Method::GET,
        "/v1/cluster/status",
        "/timerdb.v1.Cluster/Status",
        ("StatusRequest", "StatusResponse"),
        Input::Query,
        "This node and its cluster: role, leader, indexes, members.",
    ),
    route(
        Method::GET,
        "/v1/cluster/digest",
        "/timerdb.v1.Cluster/Digest",
        ("DigestRequest", "DigestResponse"),
        Input::Query,
        "A digest of this node's state machine at its applied index.",
    ),
    route(
        Method::GET,
        "/v1/cluster/slots",
        "/timerdb.v1.Cluster/Slots",
        ("SlotsRequest", "SlotsResponse"),
        Input::Query,
        "The slot map as this node routes by it: each Raft group's hash slots, leader and members.",
    ),
    route(
        Method::GET,
        "/v1/cluster/overview",
        "/timerdb.v1.Cluster/Overview",
        ("OverviewRequest", "OverviewResponse"),
        Input::Query,
        "The cluster as its leader sees it: members' progress and lag, namespaces' counts.",
    ),
    route(
        Method::GET,
        "/v1/cluster/backup",
        "/timerdb.v1.Cluster/Backup",
        ("BackupRequest", "BackupChunk"),
        Input::Query,
        "A backup file, taken on the leader once it holds every acknowledged write.",
    )
    .backup(),
    route(
        Method::POST,
        "/v1/cluster/nodes",
        "/timerdb.v1.Cluster/AddNode",
        ("AddNodeRequest", "AddNodeResponse"),
        Input::Body,
        "Adds a node started with --join: learner, then voter.",
    ),
    route(
        Method::DELETE,
        "/v1/cluster/nodes/{node_id}",
        "/timerdb.v1.Cluster/RemoveNode",
        ("RemoveNodeRequest", "RemoveNodeResponse"),
        Input::Query,
        "Removes a voter or learner.",
    ),
    route(
        Method::POST,
        "/v1/cluster:transferLeader",
        "/timerdb.v1.Cluster/TransferLeader",
        ("TransferLeaderRequest", "TransferLeaderResponse"),
        Input::Body,
        "Hands a group's leadership to a voter (node_id 0: the most up-to-date; group 0 default).",
    ),
    // timerdb.v1.Access
    route(
        Method::GET,
        "/v1/access/keys",
        "/timerdb.v1.Access/ListKeys",
        ("ListKeysRequest", "ListKeysResponse"),
        Input::Query,
        "Every API key (never a secret) and whether auth is on.",
    ),
    route(
        Method::POST,
        "/v1/access/keys",
        "/timerdb.v1.Access/CreateKey",
        ("CreateKeyRequest", "CreateKeyResponse"),
        Input::Body,
        "Creates an API key; its token is in the answer only.",
    ),
    route(
        Method::DELETE,
        "/v1/access/keys/{id}",
        "/timerdb.v1.Access/RevokeKey",
        ("RevokeKeyRequest", "RevokeKeyResponse"),
        Input::Query,
        "Revokes an API key on every node.",
    ),
    route(
        Method::PUT,
        "/v1/access/auth",
        "/timerdb.v1.Access/SetAuth",
        ("SetAuthRequest", "SetAuthResponse"),
        Input::Body,
        "Switches auth on or off.",
    ),
    route(
        Method::GET,
        "/v1/access/whoami",
        "/timerdb.v1.Access/WhoAmI",
        ("WhoAmIRequest", "WhoAmIResponse"),
        Input::Query,
        "Who the caller is to this node.",
    ),
];

impl Route {
    const fn each(mut self, field: &'static str) -> Route {
        self.each = Some(field);
        self
    }
    const fn fixed(mut self, fields: &'static [(&'static str, bool)]) -> Route {
        self.fixed = fields;
        self
    }
    const fn lines(mut self) -> Route {
        self.output = Output::Lines;
        self
    }
    const fn backup(mut self) -> Route {
        self.output = Output::Backup;
        self
    }
}

/// What a method and path find.
#[derive(Debug)]
pub enum Found {
    Route(&'static Route, Vec<(&'static str, String)>),
    /// The path exists with these other methods.
    WrongMethod(Vec<Method>),
    /// A path parameter is not valid percent-encoded UTF-8.
    BadPath(String),
    NotFound,
}

/// The route of `method` and `path` (without the query), with its parameters decoded.
pub fn find(method: &Method, path: &str) -> Found {
    let mut allowed = Vec::new();
    for route in ROUTES {
        let Some(raw) = matches(route.path, path) else {
            continue;
        };
        if route.method != *method {
            if !allowed.contains(&route.method) {
                allowed.push(route.method.clone());
            }
            continue;
        }
        let mut params = Vec::with_capacity(raw.len());
        for (name, value) in raw {
            match percent_encoding::percent_decode_str(value).decode_utf8() {
                Ok(v) if !v.is_empty() => params.push((name, v.into_owned())),
                _ => return Found::BadPath(format!("the path parameter {name} is not valid")),
            }
        }
        return Found::Route(route, params);
    }
    if allowed.is_empty() {
        Found::NotFound
    } else {
        Found::WrongMethod(allowed)
    }
}

/// The raw parameters of `path` if it matches `template`.
fn matches<'p>(template: &'static str, path: &'p str) -> Option<Vec<(&'static str, &'p str)>> {
    let mut t = template.split('/');
    let mut p = path.split('/');
    let mut params = Vec::new();
    loop {
        match (t.next(), p.next()) {
            (None, None) => return Some(params),
            (Some(ts), Some(ps)) => {
                // A custom verb: the last `:` of both.
                let (tname, tverb) = split_verb(ts);
                let (pname, pverb) = match tverb {
                    Some(_) => {
                        let at = ps.rfind(':')?;
                        (&ps[..at], Some(&ps[at + 1..]))
                    }
                    None => (ps, None),
                };
                if tverb != pverb {
                    return None;
                }
                match tname.strip_prefix('{').and_then(|n| n.strip_suffix('}')) {
                    Some(field) if !pname.is_empty() => params.push((field, pname)),
                    Some(_) => return None,
                    None if tname == pname => {}
                    None => return None,
                }
            }
            _ => return None,
        }
    }
}

fn split_verb(segment: &str) -> (&str, Option<&str>) {
    match segment.rfind(':') {
        Some(at) => (&segment[..at], Some(&segment[at + 1..])),
        None => (segment, None),
    }
}

/// Sets `field` of the request object to the path's `value`, refusing a body that says
/// otherwise.
pub fn set_param(
    object: &mut serde_json::Map<String, Value>,
    field: &str,
    value: Value,
) -> Result<(), String> {
    let camel = super::schema::camel(field);
    for key in [field, camel.as_str()] {
        if let Some(given) = object.get(key) {
            if !same(given, &value) {
                return Err(format!(
                    "{field} is {given} in the body but {value} in the path: leave it out of the body"
                ));
            }
            object.remove(key);
        }
    }
    object.insert(field.to_string(), value);
    Ok(())
}

/// Equal as request values (a number and its string are the same 64-bit integer).
fn same(a: &Value, b: &Value) -> bool {
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    a == b || text(a) == text(b)
}

#[cfg(test)]
mod tests;
