//! The HTTP side of push: one pooled client for every namespace, a POST per delivery.
//!
//! The client is hyper's (already in the tree through tonic) with rustls for `https://`
//! (webpki roots compiled in, no OpenSSL). Idle connections are pooled per host (at most
//! [`IDLE_PER_HOST`], closed after [`IDLE_TIMEOUT`]); concurrency is bounded above this, by each
//! namespace's limit. Redirects are never followed (hyper does not follow them; a 3xx is a
//! failed attempt, as Standard Webhooks asks). Only the first [`DETAIL_BYTES`] of an error
//! body are read, so a receiver cannot make the leader buffer a large answer.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::{Answer, Message};
use crate::timer::{Outcome, ATTEMPT_DETAIL_BYTES};

/// Idle connections kept per receiver host: as many as a namespace may have requests
/// outstanding, so a busy namespace reuses its connections instead of reconnecting.
const IDLE_PER_HOST: usize = super::MAX_PUSH_IN_FLIGHT;
/// How long an idle connection is kept.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes of an error body kept for the attempt log.
const DETAIL_BYTES: usize = ATTEMPT_DETAIL_BYTES;

type Connector = hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>;

/// The leader's HTTP client for pushes.
#[derive(Clone)]
pub struct HttpSender {
    client: Client<Connector, Full<Bytes>>,
}

impl HttpSender {
    pub fn new() -> crate::Result<HttpSender> {
        let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(Duration::from_secs(10)));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
            .map_err(|e| crate::Error::Internal(format!("TLS for push: {e}")))?
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(IDLE_PER_HOST)
            .pool_idle_timeout(IDLE_TIMEOUT)
            .build(connector);
        Ok(HttpSender { client })
    }

    /// POSTs `msg` to `url`; whatever happens within `timeout` is the answer.
    pub async fn send(&self, url: &str, msg: &Message, timeout: Duration) -> Answer {
        let mut req = http::Request::post(url).header("content-type", &msg.content_type);
        for (name, value) in &msg.headers {
            req = req.header(*name, value);
        }
        req = req.header("user-agent", concat!("timerdb/", env!("CARGO_PKG_VERSION")));
        let req = match req.body(Full::new(Bytes::from(msg.timer.payload.clone()))) {
            Ok(r) => r,
            Err(e) => return Answer::new(Outcome::Connection, format!("bad request: {e}")),
        };
        let exchange = async {
            let resp = self.client.request(req).await.map_err(|e| {
                let mut text = e.to_string();
                let mut source = std::error::Error::source(&e);
                while let Some(s) = source {
                    text = format!("{text}: {s}");
                    source = s.source();
                }
                Answer::new(Outcome::Connection, text)
            })?;
            let status = resp.status().as_u16();
            let detail = if resp.status().is_success() {
                String::new()
            } else {
                first_bytes(resp.into_body()).await
            };
            Ok::<_, Answer>(Answer::new(Outcome::Http(status), detail))
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(Ok(a)) | Ok(Err(a)) => a,
            Err(_) => Answer::new(
                Outcome::Timeout,
                format!("no answer within {} ms", timeout.as_millis()),
            ),
        }
    }
}

/// The first [`DETAIL_BYTES`] of a body, as text (lossy), reading no further.
async fn first_bytes(mut body: hyper::body::Incoming) -> String {
    let mut buf = Vec::new();
    while buf.len() < DETAIL_BYTES {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    let take = (DETAIL_BYTES - buf.len()).min(data.len());
                    buf.extend_from_slice(&data[..take]);
                }
            }
            _ => break,
        }
    }
    String::from_utf8_lossy(&buf).into_owned()
}
