//! The HTTP/JSON API (docs/http.md): the Timers, Namespaces, Cluster and Access calls as JSON
//! over HTTP on the client port, by transcoding into gRPC.
//!
//! [`Transcode`] is the outermost layer of the client port's server. A gRPC request passes it
//! untouched. Any other request is an HTTP call: its route ([`routes`]) names a gRPC method;
//! the path, query and JSON body become that method's request message ([`schema`] types the
//! query and the friendly forms, [`codec`] maps JSON to protobuf); the message is framed as a
//! gRPC request and sent down the same stack a gRPC call takes ([`grpc`]) — metrics, the
//! request bound, auth, forwarding to the leader, the handler — and the gRPC answer comes back
//! up as JSON, a failure as a JSON error with the HTTP status of its code.
//!
//! [`console`] serves the web console's page, script and style (compiled in) beside the API.
//!
//! Invariants: the HTTP API has no behaviour of its own beyond the mapping (a call over HTTP
//! is the gRPC call, with its validation, auth and forwarding); a client's mistake is a 4xx
//! with a message a person understands, never a 5xx; a body is read only up to the method's
//! gRPC message limit.

pub mod codec;
pub mod console;
pub mod grpc;
pub mod openapi;
pub mod routes;
pub mod schema;

use http::{HeaderValue, Method, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Map, Value};
use tonic::body::Body;

use self::grpc::Reply;
use self::routes::{Found, Input, Output, Route};
use crate::api::stack::layer::{self, Answer, Around, Inner};

/// The layer that serves HTTP/JSON calls and lets gRPC through.
#[derive(Debug, Clone, Copy, Default)]
pub struct Transcode;

impl Around for Transcode {
    fn around<S: Inner>(&self, inner: S, req: http::Request<Body>) -> Answer {
        if is_grpc(req.headers()) {
            return Box::pin(async move { Ok(layer::call(inner, req).await) });
        }
        Box::pin(async move { Ok(serve(inner, req).await) })
    }
}

/// gRPC, gRPC-web and the like: left to the gRPC services.
fn is_grpc(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/grpc"))
}

async fn serve<S: Inner>(inner: S, req: http::Request<Body>) -> http::Response<Body> {
    let path = req.uri().path();
    if let Some(page) = console::serve(req.method(), path) {
        return page;
    }
    if path == "/v1/openapi.json" {
        return match *req.method() {
            Method::GET | Method::HEAD => grpc::json_response(StatusCode::OK, openapi::document()),
            _ => not_allowed(vec![Method::GET]),
        };
    }
    match routes::find(req.method(), path) {
        Found::Route(route, params) => call(inner, req, route, params).await.into_response(),
        Found::WrongMethod(allowed) => not_allowed(allowed),
        Found::BadPath(why) => Reply::Refuse(StatusCode::BAD_REQUEST, why).into_response(),
        Found::NotFound => Reply::Refuse(
            StatusCode::NOT_FOUND,
            format!("no such route: {path} (the routes: GET /v1/openapi.json)"),
        )
        .into_response(),
    }
}

fn not_allowed(allowed: Vec<Method>) -> http::Response<Body> {
    let names: Vec<&str> = allowed.iter().map(Method::as_str).collect();
    let message = format!("this path takes {}", names.join(", "));
    let mut resp = Reply::Refuse(StatusCode::METHOD_NOT_ALLOWED, message).into_response();
    if let Ok(v) = HeaderValue::from_str(&names.join(", ")) {
        resp.headers_mut().insert(http::header::ALLOW, v);
    }
    resp
}

/// One HTTP call of `route`: the request message from the path, query and body, then the gRPC
/// call.
async fn call<S: Inner>(
    inner: S,
    req: http::Request<Body>,
    route: &'static Route,
    params: Vec<(&'static str, String)>,
) -> Reply {
    let (parts, body) = req.into_parts();
    let bad = |m: String| Reply::Refuse(StatusCode::BAD_REQUEST, m);
    let mut object = match route.input {
        Input::Body => match read_object(body, route.body_limit).await {
            Ok(o) => o,
            Err(reply) => return reply,
        },
        Input::Query => Map::new(),
    };
    if let Some(query) = parts.uri.query().filter(|q| !q.is_empty()) {
        if route.input == Input::Body {
            return bad("this call takes its fields in the JSON body, not the query".into());
        }
        for (key, raw) in query_pairs(query) {
            match schema::query_value(route.request, &key, &raw) {
                Ok((field, v)) => {
                    object.insert(field, v);
                }
                Err(e) => return bad(e),
            }
        }
    }
    for (name, raw) in params {
        if let Err(e) = set_path_param(route, &mut object, name, &raw) {
            return bad(e);
        }
    }
    for (field, v) in route.fixed {
        object.insert(field.to_string(), Value::Bool(*v));
    }
    let mut value = Value::Object(object);
    if let Err(e) = schema::prepare(route.request, &mut value, "") {
        return bad(e);
    }
    let codec = route.codec();
    let message = match (codec.encode)(value) {
        Ok(m) => m,
        Err(e) => return bad(format!("the request: {e}")),
    };
    let grpc_req = grpc::request(route.rpc, message, &parts.headers, parts.extensions);
    match route.output {
        Output::Unary => grpc::unary(inner, grpc_req, codec.decode).await,
        Output::Lines => grpc::lines(inner, grpc_req, codec.decode).await,
        Output::Backup => grpc::backup(inner, grpc_req).await,
    }
}

/// Sets a path parameter's field: on the request, or (batch calls) on each element.
fn set_path_param(
    route: &Route,
    object: &mut Map<String, Value>,
    name: &str,
    raw: &str,
) -> Result<(), String> {
    let Some(each) = route.each else {
        let (field, v) = schema::query_value(route.request, name, raw)?;
        return routes::set_param(object, &field, v);
    };
    let items = match object.get_mut(each) {
        Some(Value::Array(items)) => items,
        Some(_) => return Err(format!("{each} must be an array")),
        None => return Ok(()),
    };
    for (i, item) in items.iter_mut().enumerate() {
        let Value::Object(element) = item else {
            return Err(format!("{each}[{i}] must be an object"));
        };
        routes::set_param(element, name, Value::String(raw.to_string()))
            .map_err(|e| format!("{each}[{i}]: {e}"))?;
    }
    Ok(())
}

/// The body as a JSON object (none: `{}`), read up to `limit` bytes.
async fn read_object(body: Body, limit: usize) -> Result<Map<String, Value>, Reply> {
    let bytes = match http_body_util::Limited::new(body, limit).collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(Reply::Refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the body is larger than this call's limit of {limit} bytes"),
            ))
        }
        Err(e) => {
            return Err(Reply::Refuse(
                StatusCode::BAD_REQUEST,
                format!("the body could not be read: {e}"),
            ))
        }
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(Reply::Refuse(
            StatusCode::BAD_REQUEST,
            "the body must be a JSON object".into(),
        )),
        Err(e) => Err(Reply::Refuse(
            StatusCode::BAD_REQUEST,
            format!("the body is not valid JSON: {e}"),
        )),
    }
}

/// `a=1&b=x%20y` → (a, 1), (b, x y); `+` is a space, as in HTML forms.
fn query_pairs(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    query.split('&').filter(|p| !p.is_empty()).map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let decode = |s: &str| {
            let spaced = s.replace('+', " ");
            percent_encoding::percent_decode_str(&spaced)
                .decode_utf8_lossy()
                .into_owned()
        };
        (decode(k), decode(v))
    })
}
