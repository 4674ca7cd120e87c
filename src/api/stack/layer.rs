//! The one shape of the server's own layers (auth, forwarding, the request bound): a tower
//! layer and service pair, written once, around an [`Around`] that says what happens to one
//! call given the inner service (already made ready) and the request.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tonic::body::Body;

pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
/// What every layer here answers: the response (a refusal is a response with a status).
pub type Answer = BoxFuture<Result<http::Response<Body>, Infallible>>;

/// The services the server's layers wrap: tonic's routes, or another of these layers.
pub trait Inner:
    tower::Service<
        http::Request<Body>,
        Response = http::Response<Body>,
        Error = Infallible,
        Future: Send + 'static,
    > + Clone
    + Send
    + 'static
{
}

impl<S> Inner for S where
    S: tower::Service<
            http::Request<Body>,
            Response = http::Response<Body>,
            Error = Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
        + 'static
{
}

/// What a layer does with one call.
pub trait Around: Clone + Send + Sync + 'static {
    fn around<S: Inner>(&self, inner: S, req: http::Request<Body>) -> Answer;
}

/// The tower layer of an [`Around`].
#[derive(Clone)]
pub struct LayerOf<A>(pub A);

impl<A: Around, S> tower::Layer<S> for LayerOf<A> {
    type Service = Wrapped<A, S>;
    fn layer(&self, inner: S) -> Wrapped<A, S> {
        Wrapped {
            around: self.0.clone(),
            inner,
        }
    }
}

/// The service a [`LayerOf`] makes.
#[derive(Clone)]
pub struct Wrapped<A, S> {
    around: A,
    inner: S,
}

impl<A: Around, S: Inner> tower::Service<http::Request<Body>> for Wrapped<A, S> {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Answer;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Answer {
        // The service that was made ready serves this call; a clone waits for the next one.
        let ready = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, ready);
        self.around.around(inner, req)
    }
}

/// Calls `inner` (made ready first: a clone of a ready service may not be).
pub async fn call<S: Inner>(mut inner: S, req: http::Request<Body>) -> http::Response<Body> {
    let ready = std::future::poll_fn(|cx| inner.poll_ready(cx)).await;
    if let Err(never) = ready {
        match never {}
    }
    match inner.call(req).await {
        Ok(r) => r,
        Err(never) => match never {},
    }
}
