//! A node-wide bound on client requests in progress: one tower layer, outermost but for the
//! metrics, so a flood of clients gets RESOURCE_EXHAUSTED at once instead of queueing without
//! end in front of the handlers (and their memory).
//!
//! A request holds its slot until its answer begins (a stream's slot frees once it is open).
//! The peer `Raft` service and health checks are never refused here: a cluster flooded by
//! clients must still replicate and elect. Per connection, HTTP/2 bounds the streams
//! (`MAX_STREAMS_PER_CONNECTION` in `server.rs`).

use std::sync::Arc;

use tokio::sync::Semaphore;
use tonic::body::Body;
use tonic::Status;

use crate::api::stack::layer::{Answer, Around, Inner};

/// Most client requests a node works on at once.
pub const MAX_REQUESTS_IN_PROGRESS: usize = 8192;

/// The request bound: slots for client requests in progress.
#[derive(Clone)]
pub struct Bound {
    slots: Arc<Semaphore>,
    max: usize,
}

impl Bound {
    pub fn new(max: usize) -> Self {
        Bound {
            slots: Arc::new(Semaphore::new(max)),
            max,
        }
    }
}

/// Whether `path` is exempt: peers and health checks.
fn exempt(path: &str) -> bool {
    path.starts_with("/timerdb.v1.Raft/")
        || path.starts_with("/timerdb.v1.Groups/")
        || path.starts_with("/grpc.health.v1.")
}

/// The request bound as a layer (`LayerOf(Bound)`).
impl Around for Bound {
    fn around<S: Inner>(&self, mut inner: S, req: http::Request<Body>) -> Answer {
        if exempt(req.uri().path()) {
            return Box::pin(inner.call(req));
        }
        let Ok(permit) = self.slots.clone().try_acquire_owned() else {
            let max = self.max;
            let status = Status::resource_exhausted(format!(
                "this node is working on {max} requests already; retry shortly or elsewhere"
            ));
            return Box::pin(async move { Ok(status.into_http()) });
        };
        Box::pin(async move {
            let resp = inner.call(req).await;
            drop(permit);
            resp
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::stack::layer::LayerOf;
    use std::convert::Infallible;
    use tower::{Layer, Service, ServiceExt};

    #[tokio::test]
    async fn beyond_the_bound_a_client_call_is_refused_and_a_peer_call_is_not() {
        let (release, wait) = tokio::sync::watch::channel(false);
        let slow = tower::service_fn(move |_req: http::Request<Body>| {
            let mut wait = wait.clone();
            async move {
                let _ = wait.wait_for(|go| *go).await;
                Ok::<_, Infallible>(http::Response::new(Body::empty()))
            }
        });
        let mut svc = LayerOf(Bound::new(2)).layer(slow);
        let req = |path: &str| {
            http::Request::builder()
                .uri(path)
                .body(Body::empty())
                .unwrap()
        };
        let a = svc
            .ready()
            .await
            .unwrap()
            .call(req("/timerdb.v1.Timers/Get"));
        let b = svc
            .ready()
            .await
            .unwrap()
            .call(req("/timerdb.v1.Timers/Get"));
        let refused = svc
            .ready()
            .await
            .unwrap()
            .call(req("/timerdb.v1.Timers/Get"))
            .await
            .unwrap();
        let s = Status::from_header_map(refused.headers()).unwrap();
        assert_eq!(s.code(), tonic::Code::ResourceExhausted);
        let peer = svc
            .ready()
            .await
            .unwrap()
            .call(req("/timerdb.v1.Raft/Vote"));
        release.send(true).unwrap();
        for f in [a, b, peer] {
            let r = f.await.unwrap();
            assert!(Status::from_header_map(r.headers()).is_none());
        }
        // The slots came back.
        let again = svc
            .ready()
            .await
            .unwrap()
            .call(req("/timerdb.v1.Timers/Get"));
        assert!(Status::from_header_map(again.await.unwrap().headers()).is_none());
    }
}
