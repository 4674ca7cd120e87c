//! Answers that stop when their caller's key is revoked (or, for a stream opened while auth was
//! off, when auth is turned on).
//!
//! The auth layer checks a credential when a call starts. A unary call ends a moment later, but
//! a Subscribe or Consume stream may run for days: without more, a key revoked while its stream
//! is open would keep receiving timers. So the auth layer wraps the response body of every call
//! made with an API key in a [`Revocable`]: it passes the body's frames through and watches the
//! node's access state (woken by `Store::access_changes`, i.e. when this node applies an access
//! change). Once the key is gone while auth is on, the body ends with the trailers of an
//! UNAUTHENTICATED status, and the handler's stream is dropped, as when a client goes away. A
//! relayed stream is cut on both nodes: each runs this layer with its own applied state.
//!
//! A revocation reaches a follower's streams as fast as it reaches its new calls: when the
//! follower applies the entry (a heartbeat after the leader, at most).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::Frame;
use tonic::body::Body;
use tonic::Status;

use crate::api::stack::layer::BoxFuture;
use crate::auth::{AccessState, Key};
use crate::node::Node;

/// What an open call was let in as, and so what ends it.
pub enum Watched {
    /// An API key: the call ends when the key is revoked.
    Key(Key),
    /// Nobody (auth was off): the call ends when auth is turned on — a stream opened before
    /// an acknowledged SetAuth(on), or judged by a follower that had not applied it yet and
    /// was then elected, must not go on delivering to a caller without a key.
    AuthOff,
}

/// A response body that ends with UNAUTHENTICATED once what let it in no longer holds.
pub struct Revocable {
    inner: Body,
    /// Resolves when the key has been revoked, or auth turned on (never, while it stands).
    revoked: BoxFuture<()>,
    /// The trailers were sent: the body is over.
    done: bool,
    /// Why it ended, for the status.
    why: String,
    /// It watched a key (else: auth off).
    watched_key: bool,
}

impl Revocable {
    /// `access` reads the applied access state; `changes` is notified when it changes.
    pub fn new(
        inner: Body,
        access: impl Fn() -> Arc<AccessState> + Send + 'static,
        changes: Arc<tokio::sync::Notify>,
        watched: Watched,
    ) -> Revocable {
        let watched_key = matches!(watched, Watched::Key(_));
        let why = match &watched {
            Watched::Key(key) => format!(
                "the API key {} ({}) was revoked while this call was open",
                key.id, key.name
            ),
            Watched::AuthOff => {
                "auth was turned on while this call was open: open it again (with an API key)"
                    .into()
            }
        };
        let revoked = Box::pin(async move {
            loop {
                let next = changes.notified();
                tokio::pin!(next);
                next.as_mut().enable();
                let state = access();
                let gone = match &watched {
                    Watched::Key(key) => !state.keys.contains_key(&key.id),
                    Watched::AuthOff => true,
                };
                if state.enabled && gone {
                    return;
                }
                next.await;
            }
        });
        Revocable {
            inner,
            revoked,
            done: false,
            why,
            watched_key,
        }
    }
}

impl hyper::body::Body for Revocable {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if self.done {
            return Poll::Ready(None);
        }
        if self.revoked.as_mut().poll(cx).is_ready() {
            self.done = true;
            // Dropping the inner body ends the handler's stream now, not at the next message.
            self.inner = Body::empty();
            let status = match self.watched_key {
                true => Status::unauthenticated(self.why.clone()),
                // Let in while auth was off, its caller's credentials were never read: a
                // caller with a key reconnects and is judged afresh, one without is refused.
                false => crate::api::stack::headers::not_applied_status(self.why.clone()),
            };
            crate::metrics::auth_denied("(open stream)", "revoked");
            tracing::warn!("an open call ended: {}", self.why);
            return Poll::Ready(Some(Ok(Frame::trailers(trailers(&status)))));
        }
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            self.done = true;
        }
        polled
    }

    /// The inner body's answer too: an error answer is one closing HEADERS frame ("trailers
    /// only") only if the server knows the body is empty before it sends the headers. Said
    /// only of itself, it went out as headers and then an empty DATA frame with END_STREAM,
    /// which grpc-core clients (Python, Go, Java) read as UNKNOWN "Stream removed" (issue 33
    /// finding 11).
    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self.done {
            true => hyper::body::SizeHint::with_exact(0),
            false => self.inner.size_hint(),
        }
    }
}

/// The gRPC trailers of `status` (`grpc-status`, `grpc-message`).
fn trailers(status: &Status) -> http::HeaderMap {
    let mut map = http::HeaderMap::new();
    // Fails only for a message that cannot be a header value; ours is percent-encoded.
    let _ = status.add_header(&mut map);
    map
}

/// Wraps `response`'s body so that it stops when `key` is revoked (see the module).
pub fn wrap(
    response: http::Response<Body>,
    node: &Arc<Node>,
    watched: Watched,
) -> http::Response<Body> {
    let (parts, body) = response.into_parts();
    let changes = node.access_changes();
    let node = node.clone();
    let body = Revocable::new(body, move || node.access(), changes, watched);
    http::Response::from_parts(parts, Body::new(body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::Store;
    use hyper::body::Body as _;

    /// An answer that is only a status (tonic's trailers-only error) is an ended body, so it
    /// goes out as one HEADERS frame with END_STREAM.
    #[test]
    fn an_empty_answer_is_ended_when_wrapped() {
        let gc = crate::storage::IndexGc::new();
        let dir = tempfile::TempDir::new().unwrap();
        let db = crate::storage::open_db(dir.path(), &gc).unwrap();
        let store = Store::new(db, crate::wheel::Wheel::default(), gc);
        let key = Key {
            id: "k".into(),
            name: "n".into(),
            secret_sha256: None,
            cert_name: None,
            roles: Vec::new(),
            created_ms: 0,
        };
        let access = |s: Store| move || s.access();
        let changes = store.access_changes();
        let wrapped = Revocable::new(
            Body::empty(),
            access(store.clone()),
            changes.clone(),
            Watched::Key(key.clone()),
        );
        assert!(
            wrapped.is_end_stream(),
            "a trailers-only answer must stay one"
        );
        let full = Revocable::new(
            Body::new(http_body_util::Full::new(Bytes::from("x"))),
            access(store),
            changes,
            Watched::Key(key),
        );
        assert!(!full.is_end_stream());
    }
}
