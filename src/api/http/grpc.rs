//! The gRPC side of transcoding: a request message framed as a gRPC call through the server's
//! own stack, its answer unframed, and a gRPC status turned into an HTTP status and a JSON error.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::StreamExt;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tonic::body::Body;
use tonic::Code;

use super::codec::Decode;
use crate::api::stack::layer::{self, Inner};

/// The request headers that travel from the HTTP request into the gRPC call: the credential.
/// (A client certificate travels in the request's extensions, as for gRPC.)
const FORWARDED_HEADERS: &[&str] = &[crate::api::stack::auth::AUTHORIZATION, "user-agent"];

/// The gRPC request for method `rpc` with the encoded `message`, carrying the HTTP request's
/// credential and connection.
pub fn request(
    rpc: &str,
    message: Vec<u8>,
    headers: &HeaderMap,
    extensions: http::Extensions,
) -> http::Request<Body> {
    let mut framed = BytesMut::with_capacity(5 + message.len());
    framed.put_u8(0);
    framed.put_u32(message.len() as u32);
    framed.put_slice(&message);
    let mut req = http::Request::new(Body::new(http_body_util::Full::new(framed.freeze())));
    *req.method_mut() = Method::POST;
    *req.uri_mut() = http::Uri::try_from(rpc).expect("route methods are valid paths");
    *req.version_mut() = http::Version::HTTP_2;
    *req.extensions_mut() = extensions;
    let h = req.headers_mut();
    h.insert("content-type", HeaderValue::from_static("application/grpc"));
    h.insert("te", HeaderValue::from_static("trailers"));
    for name in FORWARDED_HEADERS {
        if let Some(v) = headers.get(*name) {
            h.insert(*name, v.clone());
        }
    }
    req
}

/// Runs a unary call through `inner` and answers it as JSON.
pub async fn unary<S: Inner>(inner: S, req: http::Request<Body>, decode: Decode) -> Reply {
    let (parts, body) = layer::call(inner, req).await.into_parts();
    if let Some(status) = failed(&parts.headers) {
        return Reply::Status(status);
    }
    let mut messages = Messages::new(body);
    let first = messages.next().await;
    // Read to the end: the call's status comes in the trailers.
    while let Some(more) = messages.next().await {
        if let Err(status) = more {
            return Reply::Status(status);
        }
    }
    match first {
        Some(Ok(message)) => match decode(&message) {
            Ok(mut v) => {
                super::schema::decorate(&mut v);
                Reply::Json(StatusCode::OK, v)
            }
            Err(e) => Reply::Status(tonic::Status::internal(e)),
        },
        Some(Err(status)) => Reply::Status(status),
        None => Reply::Status(tonic::Status::internal("the call ended without an answer")),
    }
}

/// Runs a server-streaming call through `inner` and answers NDJSON: one JSON object per
/// message, and an `{"error": …}` line if the stream ends with a failure.
pub async fn lines<S: Inner>(inner: S, req: http::Request<Body>, decode: Decode) -> Reply {
    let (parts, body) = layer::call(inner, req).await.into_parts();
    if let Some(status) = failed(&parts.headers) {
        return Reply::Status(status);
    }
    let stream = futures::stream::unfold(Messages::new(body), move |mut messages| async move {
        let line = match messages.next().await? {
            Ok(message) => match decode(&message) {
                Ok(mut v) => {
                    super::schema::decorate(&mut v);
                    v
                }
                Err(e) => error_json(&tonic::Status::internal(e)),
            },
            // The last line: the stream's failure (`messages` ends after it).
            Err(status) => error_json(&status),
        };
        Some((ndjson(&line), messages))
    });
    let frames = stream.map(|b| Ok::<_, tonic::Status>(hyper::body::Frame::data(b)));
    let body = Body::new(http_body_util::StreamBody::new(frames));
    let mut resp = http::Response::new(body);
    resp.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("application/x-ndjson"),
    );
    Reply::Raw(resp)
}

/// Runs Backup through `inner` and answers the backup file itself (`application/octet-stream`),
/// with the first message's `info` as JSON in the `x-timerdb-backup` header: what `timerctl
/// backup save` writes, for `curl -o`.
pub async fn backup<S: Inner>(inner: S, req: http::Request<Body>) -> Reply {
    use prost::Message;
    let (parts, body) = layer::call(inner, req).await.into_parts();
    if let Some(status) = failed(&parts.headers) {
        return Reply::Status(status);
    }
    // The first message (the info) before the headers go out.
    let mut messages = Messages::new(body);
    let info = match messages.next().await {
        Some(Ok(m)) => match crate::api::pb::BackupChunk::decode(m) {
            Ok(c) => c.info.unwrap_or_default(),
            Err(e) => return Reply::Status(tonic::Status::internal(e.to_string())),
        },
        Some(Err(status)) => return Reply::Status(status),
        None => return Reply::Status(tonic::Status::internal("no backup was sent")),
    };
    let info_json = serde_json::to_string(&info).unwrap_or_default();
    // Then the data of every message, as it comes; a failure mid-way cuts the body short
    // (the file's own row count and CRC-32 tell a cut file from a whole one).
    let stream = futures::stream::unfold(messages, |mut messages| async move {
        let data = match messages.next().await? {
            Ok(m) => crate::api::pb::BackupChunk::decode(m)
                .map(|c| Bytes::from(c.data))
                .map_err(|e| tonic::Status::internal(e.to_string())),
            Err(status) => Err(status),
        };
        Some((data, messages))
    });
    let frames = stream.map(|r| r.map(hyper::body::Frame::data));
    let mut resp = http::Response::new(Body::new(http_body_util::StreamBody::new(frames)));
    let h = resp.headers_mut();
    h.insert(
        "content-type",
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(
        "content-length",
        HeaderValue::from_str(&info.bytes.to_string()).expect("digits"),
    );
    if let Ok(v) = HeaderValue::from_str(&info_json) {
        h.insert("x-timerdb-backup", v);
    }
    Reply::Raw(resp)
}

fn ndjson(v: &Value) -> Bytes {
    let mut line = serde_json::to_vec(v).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

/// A failed status in `headers` (trailers-only answers) or trailers; OK is not a failure.
fn failed(headers: &HeaderMap) -> Option<tonic::Status> {
    tonic::Status::from_header_map(headers).filter(|s| s.code() != Code::Ok)
}

/// Splits a gRPC body into its messages.
#[derive(Default)]
struct Deframer {
    buf: BytesMut,
}

impl Deframer {
    fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next whole message, if one is buffered.
    fn next(&mut self) -> Result<Option<Bytes>, String> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        if self.buf[0] != 0 {
            return Err("the answer was compressed, which was not asked for".into());
        }
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]);
        let len = len as usize;
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        self.buf.advance(5);
        Ok(Some(self.buf.split_to(len).freeze()))
    }
}

/// The messages of a gRPC answer's body, in order, then its end: `None` after an OK end, one
/// error (a failed status in the trailers, a broken body or frame) and then `None`.
struct Messages {
    body: Body,
    deframer: Deframer,
    done: bool,
}

impl Messages {
    fn new(body: Body) -> Messages {
        Messages {
            body,
            deframer: Deframer::default(),
            done: false,
        }
    }

    async fn next(&mut self) -> Option<Result<Bytes, tonic::Status>> {
        if self.done {
            return None;
        }
        loop {
            match self.deframer.next() {
                Ok(Some(message)) => return Some(Ok(message)),
                Ok(None) => {}
                Err(e) => {
                    self.done = true;
                    return Some(Err(tonic::Status::internal(e)));
                }
            }
            match self.body.frame().await {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => self.deframer.push(&data),
                    Err(frame) => {
                        self.done = true;
                        return frame.trailers_ref().and_then(failed).map(Err);
                    }
                },
                Some(Err(status)) => {
                    self.done = true;
                    return Some(Err(status));
                }
                None => {
                    self.done = true;
                    return None;
                }
            }
        }
    }
}

/// What the HTTP layer answers.
pub enum Reply {
    Json(StatusCode, Value),
    Status(tonic::Status),
    /// The transcoder's own refusal.
    Refuse(StatusCode, String),
    Raw(http::Response<Body>),
}

impl Reply {
    pub fn into_response(self) -> http::Response<Body> {
        match self {
            Reply::Json(code, v) => json_response(code, &v),
            Reply::Status(status) => {
                let mut resp = json_response(http_status(status.code()), &error_json(&status));
                // HTTP's own form of the wait, in whole seconds (rounded up).
                if let Some(ms) = retry_after_ms(&status) {
                    let secs = ms.div_ceil(1000).max(1);
                    if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                        resp.headers_mut().insert(http::header::RETRY_AFTER, v);
                    }
                }
                resp
            }
            Reply::Refuse(code, message) => {
                let status = json!({"error": {
                    "code": code.as_u16(),
                    "status": grpc_name(grpc_of(code)),
                    "message": message,
                }});
                let mut resp = json_response(code, &status);
                if code == StatusCode::PAYLOAD_TOO_LARGE {
                    // The rest of the body is never read, so this connection cannot carry
                    // another request: say so, or a client's pool reuses it and its next
                    // request meets a closed socket.
                    resp.headers_mut()
                        .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
                }
                resp
            }
            Reply::Raw(r) => r,
        }
    }
}

pub fn json_response(code: StatusCode, v: &Value) -> http::Response<Body> {
    let mut bytes = serde_json::to_vec_pretty(v).unwrap_or_default();
    bytes.push(b'\n');
    let mut resp = http::Response::new(Body::new(http_body_util::Full::new(Bytes::from(bytes))));
    *resp.status_mut() = code;
    resp.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/json"));
    resp
}

/// The JSON error of a gRPC status (the shape of Google APIs' errors), with the wait the
/// server asked for (`retry_after_ms`) when it asked for one.
pub fn error_json(status: &tonic::Status) -> Value {
    let mut error = json!({
        "code": http_status(status.code()).as_u16(),
        "status": grpc_name(status.code()),
        "message": status.message(),
    });
    if let Some(ms) = retry_after_ms(status) {
        error["retry_after_ms"] = json!(ms);
    }
    json!({ "error": error })
}

/// The `retry-after-ms` a refusal carries (a schedule rate limit).
fn retry_after_ms(status: &tonic::Status) -> Option<u64> {
    let v = status.metadata().get(crate::api::convert::RETRY_AFTER_MS)?;
    v.to_str().ok()?.parse().ok()
}

/// The HTTP status of a gRPC code, as Google APIs map them.
pub fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
            StatusCode::BAD_REQUEST
        }
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        // 499 Client Closed Request: no constant in `http`.
        Code::Cancelled => StatusCode::from_u16(499).expect("499 is a valid status"),
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The gRPC code a transcoder refusal stands for.
fn grpc_of(code: StatusCode) -> Code {
    match code {
        StatusCode::NOT_FOUND => Code::NotFound,
        StatusCode::METHOD_NOT_ALLOWED => Code::Unimplemented,
        StatusCode::PAYLOAD_TOO_LARGE => Code::ResourceExhausted,
        _ => Code::InvalidArgument,
    }
}

/// `NOT_FOUND`, as in the gRPC specification.
pub fn grpc_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_grpc_code_has_its_google_http_status() {
        let table = [
            (Code::Ok, 200),
            (Code::Cancelled, 499),
            (Code::Unknown, 500),
            (Code::InvalidArgument, 400),
            (Code::DeadlineExceeded, 504),
            (Code::NotFound, 404),
            (Code::AlreadyExists, 409),
            (Code::PermissionDenied, 403),
            (Code::ResourceExhausted, 429),
            (Code::FailedPrecondition, 400),
            (Code::Aborted, 409),
            (Code::OutOfRange, 400),
            (Code::Unimplemented, 501),
            (Code::Internal, 500),
            (Code::Unavailable, 503),
            (Code::DataLoss, 500),
            (Code::Unauthenticated, 401),
        ];
        for (code, http) in table {
            assert_eq!(http_status(code).as_u16(), http, "{code:?}");
            let e = error_json(&tonic::Status::new(code, "why"));
            assert_eq!(e["error"]["code"], json!(http));
            assert_eq!(e["error"]["message"], json!("why"));
            assert_eq!(
                e["error"]["status"].as_str().map(str::len),
                Some(grpc_name(code).len())
            );
        }
    }

    #[test]
    fn a_wait_the_server_asks_for_becomes_retry_after() {
        let mut s = tonic::Status::resource_exhausted("slow down");
        s.metadata_mut()
            .insert(crate::api::convert::RETRY_AFTER_MS, "1500".parse().unwrap());
        let resp = Reply::Status(s).into_response();
        assert_eq!(resp.status().as_u16(), 429);
        assert_eq!(resp.headers()[http::header::RETRY_AFTER], "2");
    }
}
