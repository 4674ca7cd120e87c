//! The client side of `timerdb.v1.Receiver`: how the leader's pusher delivers to a namespace
//! whose push target is `grpc://HOST:PORT` (or `grpcs://`, TLS).
//!
//! `grpcs://` trusts the web roots and the operator's `--push-ca` ([`Trust`]). One channel per
//! target, kept while the target is used (tonic multiplexes the requests of a
//! namespace over it and reconnects by itself). The signed Standard Webhooks values travel as
//! request metadata, the delivery as the message; OK acks, any other status is a failed
//! attempt (`push::Answer` judges it).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::api::pb;
use crate::push::guard::Guard;
use crate::push::trust::Trust;
use crate::push::{Answer, GrpcSender, Message, RetryAfter};
use crate::timer::{Outcome, ATTEMPT_DETAIL_BYTES};
use hyper_util::client::legacy::connect::HttpConnector;

/// Pushes over gRPC, with a channel per target.
pub struct ReceiverClient {
    channels: Mutex<HashMap<String, Channel>>,
    trust: Trust,
    guard: Guard,
}

impl ReceiverClient {
    fn channel(&self, url: &str) -> Result<Channel, String> {
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(ch) = channels.get(url) {
            return Ok(ch.clone());
        }
        let (tls, rest) = match url.split_once("://") {
            Some(("grpcs", rest)) => (true, rest),
            Some((_, rest)) => (false, rest),
            None => (false, url),
        };
        let rest = rest.trim_end_matches('/');
        let scheme = if tls { "https" } else { "http" };
        let mut ep = Endpoint::from_shared(format!("{scheme}://{rest}"))
            .map_err(|e| e.to_string())?
            .connect_timeout(Duration::from_secs(10));
        // An IP literal is checked here, a name by the resolver of every connection.
        let host = ep.uri().host().unwrap_or_default().to_string();
        self.guard.check_literal(&host)?;
        if tls {
            let mut config = ClientTlsConfig::new().with_webpki_roots();
            if let Some(pem) = self.trust.pem() {
                config = config.ca_certificate(Certificate::from_pem(pem));
            }
            ep = ep.tls_config(config).map_err(|e| e.to_string())?;
        }
        let mut connector = HttpConnector::new_with_resolver(self.guard.resolver());
        connector.enforce_http(false);
        connector.set_nodelay(true);
        let ch = ep.connect_with_connector_lazy(connector);
        channels.insert(url.to_string(), ch.clone());
        Ok(ch)
    }
}

impl GrpcSender for ReceiverClient {
    fn send(&self, url: &str, msg: Message, timeout: Duration) -> BoxFuture<'static, Answer> {
        let channel = self.channel(url);
        Box::pin(async move {
            let channel = match channel {
                Ok(ch) => ch,
                Err(e) => return Answer::new(Outcome::Connection, e),
            };
            let mut client = pb::receiver_client::ReceiverClient::new(channel);
            let metadata = tonic::metadata::MetadataMap::from_headers(msg.headers());
            let delivery = pb::Delivery {
                attempt: msg.attempt,
                timer: Some(msg.timer.into()),
            };
            let mut req =
                tonic::Request::from_parts(metadata, tonic::Extensions::default(), delivery);
            req.set_timeout(timeout);
            match tokio::time::timeout(timeout, client.receive(req)).await {
                Ok(Ok(_)) => Answer::new(Outcome::Grpc(0), ""),
                Ok(Err(status)) => {
                    let code = status.code();
                    // gRFC A6's server pushback: how long the receiver wants the retry to wait.
                    let pushback = status
                        .metadata()
                        .get("grpc-retry-pushback-ms")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse::<u64>().ok())
                        .map(RetryAfter::Ms);
                    let mut detail = status.message().to_string();
                    detail.truncate(detail.floor_char_boundary(ATTEMPT_DETAIL_BYTES));
                    match code {
                        // The call never reached a receiver: no connection.
                        tonic::Code::Unavailable if is_transport(&status) => {
                            Answer::new(Outcome::Connection, detail)
                        }
                        tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
                            Answer::new(Outcome::Timeout, detail)
                        }
                        code => Answer {
                            retry_after: pushback,
                            ..Answer::new(Outcome::Grpc(code as i32), detail)
                        },
                    }
                }
                Err(_) => Answer::new(
                    Outcome::Timeout,
                    format!("no answer within {} ms", timeout.as_millis()),
                ),
            }
        })
    }
}

/// Whether an UNAVAILABLE came from the transport (connecting failed), not from the receiver.
fn is_transport(status: &tonic::Status) -> bool {
    std::error::Error::source(status).is_some()
}

/// The gRPC sender the pusher uses, trusting `trust`'s roots for `grpcs://`, reaching only
/// what `guard` allows.
pub fn grpc_sender(trust: Trust, guard: Guard) -> Arc<dyn GrpcSender> {
    Arc::new(ReceiverClient {
        channels: Mutex::default(),
        trust,
        guard,
    })
}
