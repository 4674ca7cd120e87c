//! A tower layer that counts every gRPC call by method and status and times it, for the
//! metrics endpoint (see [`crate::metrics`]).
//!
//! The status is read from the response headers: tonic answers a failed call "trailers only",
//! with `grpc-status` in the headers; a call whose headers carry none succeeded so far and is
//! counted OK (a stream that fails later still counts OK: its status travels in trailers this
//! layer does not wait for). Latency is the time to the response headers, which for a unary
//! call is the whole call.

use std::task::{Context, Poll};
use std::time::Instant;

use crate::api::stack::layer::BoxFuture;

/// Wraps a service in [`Observe`].
#[derive(Debug, Clone, Copy, Default)]
pub struct ObserveLayer;

impl<S> tower::Layer<S> for ObserveLayer {
    type Service = Observe<S>;
    fn layer(&self, inner: S) -> Observe<S> {
        Observe { inner }
    }
}

/// The service [`ObserveLayer`] makes.
#[derive(Debug, Clone)]
pub struct Observe<S> {
    inner: S,
}

impl<S, B, RB> tower::Service<http::Request<B>> for Observe<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let known = crate::api::stack::methods::index_of(req.uri().path());
        let method = match known {
            Some(_) => String::new(), // the metrics keep the known methods' names
            None => req.uri().path().to_string(),
        };
        let started = Instant::now();
        let call = self.inner.call(req);
        Box::pin(async move {
            let result = call.await;
            let code = match &result {
                Ok(resp) => resp
                    .headers()
                    .get("grpc-status")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<i32>().ok())
                    .map_or(tonic::Code::Ok, tonic::Code::from),
                Err(_) => tonic::Code::Unknown,
            };
            match known {
                Some(i) if code == tonic::Code::Ok => {
                    let (calls, seconds) = ok_series(i);
                    calls.increment(1);
                    seconds.record(started.elapsed().as_secs_f64());
                }
                Some(i) => crate::metrics::grpc(
                    crate::api::stack::methods::RULES[i].path,
                    code,
                    started.elapsed(),
                ),
                None => crate::metrics::grpc(&method, code, started.elapsed()),
            }
            result
        })
    }
}

/// The OK series of the method at `i` in `methods::RULES`, looked up in the registry at its
/// first call and kept.
fn ok_series(i: usize) -> &'static (metrics::Counter, metrics::Histogram) {
    type Series = std::sync::OnceLock<(metrics::Counter, metrics::Histogram)>;
    static OK: std::sync::OnceLock<Vec<Series>> = std::sync::OnceLock::new();
    let all = OK.get_or_init(|| {
        crate::api::stack::methods::RULES
            .iter()
            .map(|_| Series::new())
            .collect()
    });
    all[i].get_or_init(|| {
        crate::metrics::grpc_series(crate::api::stack::methods::RULES[i].path, tonic::Code::Ok)
    })
}
