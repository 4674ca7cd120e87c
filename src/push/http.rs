//! The HTTP side of push: a connection per lane, a POST per delivery.
//!
//! Each of a namespace's lanes (`worker`) owns at most one HTTP/1.1 connection to the
//! receiver ([`Conn`]) and drives it itself: the request, the answer and the connection's I/O
//! run in the lane's task, so a push costs no task spawn, no pool lookup and no hand-over
//! between tasks. (hyper's pooled client did all three per request; at 40,000 pushes a second
//! they were a quarter of the leader's CPU.) Concurrency is the number of lanes, bounded by the
//! namespace's limits above this.
//!
//! `https://` goes through rustls (no OpenSSL), trusting the roots of [`super::trust`]. Redirects are never
//! followed (a 3xx is a failed attempt, as Standard Webhooks asks). At most [`DETAIL_BYTES`] of
//! an error body are kept and at most [`MAX_BODY_READ`] of any body are read, so a receiver
//! cannot make the leader buffer a large answer; a body not read to its end closes the
//! connection instead of being drained.
//!
//! A kept-alive connection the receiver closed while it was idle is noticed before the next
//! request (the connection is polled once); if the close races the request and hyper hands the
//! request back unsent, it goes again on a new connection. Anything else that goes wrong is
//! the attempt's outcome.

use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::client::legacy::connect::HttpConnector;
use tower::Service;

use super::guard::{Guard, GuardedResolver};
use super::{Answer, Message, RetryAfter};
use crate::error::chain;
use crate::timer::{Outcome, ATTEMPT_DETAIL_BYTES};

/// Bytes of an error body kept for the attempt log.
const DETAIL_BYTES: usize = ATTEMPT_DETAIL_BYTES;
/// Most bytes of an answer's body read to keep its connection; a longer body closes it.
const MAX_BODY_READ: usize = 64 * 1024;
/// Longest a connection may take to open (within the request's timeout).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

type Connector = hyper_rustls::HttpsConnector<HttpConnector<GuardedResolver>>;
type Io = hyper_rustls::MaybeHttpsStream<hyper_util::rt::TokioIo<tokio::net::TcpStream>>;

/// What opens connections to receivers (TCP, and TLS for `https://`); shared by every lane.
#[derive(Clone)]
pub struct HttpSender {
    connector: Connector,
    guard: Guard,
}

impl HttpSender {
    /// Connections for `https://` trust `trust`'s roots; `guard` says which addresses they
    /// may reach (names are resolved through it).
    pub fn new(trust: &super::trust::Trust, guard: Guard) -> crate::Result<HttpSender> {
        let mut http = HttpConnector::new_with_resolver(guard.resolver());
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(CONNECT_TIMEOUT));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(trust.client_config()?)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Ok(HttpSender { connector, guard })
    }

    /// Opens a connection to `url`'s host (an IP literal is checked here; a name by the
    /// resolver).
    async fn connect(&self, url: &http::Uri) -> Result<Conn, Answer> {
        if let Err(why) = self.guard.check_literal(url.host().unwrap_or_default()) {
            return Err(Answer::new(Outcome::Connection, why));
        }
        let mut connector = self.connector.clone();
        let io = async {
            std::future::poll_fn(|cx| connector.poll_ready(cx)).await?;
            connector.call(url.clone()).await
        }
        .await
        .map_err(|e| Answer::new(Outcome::Connection, chain(&*e)))?;
        let (sender, driver) = http1::Builder::new()
            .handshake(io)
            .await
            .map_err(|e| Answer::new(Outcome::Connection, chain(&e)))?;
        Ok(Conn {
            url: url.clone(),
            sender,
            driver,
            closed: false,
        })
    }
}

/// One HTTP/1.1 connection to a receiver, driven by the lane that sends on it.
pub struct Conn {
    url: http::Uri,
    sender: http1::SendRequest<Full<Bytes>>,
    driver: http1::Connection<Io, Full<Bytes>>,
    /// The connection ended (closed by either side, or failed).
    closed: bool,
}

impl Conn {
    /// Whether it can take a request to `url` now. Polls the connection once, so that a close
    /// the receiver sent while it was idle is seen here rather than by the request.
    fn usable(&mut self, url: &http::Uri) -> bool {
        if !self.closed && (&mut self.driver).now_or_never().is_some() {
            self.closed = true;
        }
        !self.closed && self.sender.is_ready() && self.url == *url
    }

    /// Runs `fut` while driving the connection's I/O (which `fut` waits on).
    async fn drive<F: std::future::Future>(
        driver: &mut http1::Connection<Io, Full<Bytes>>,
        closed: &mut bool,
        fut: F,
    ) -> F::Output {
        tokio::pin!(fut);
        loop {
            if *closed {
                return fut.await;
            }
            tokio::select! {
                biased;
                out = &mut fut => return out,
                _ = &mut *driver => *closed = true,
            }
        }
    }
}

/// A lane's connection slot: a connection kept between requests, opened when needed.
#[derive(Default)]
pub struct Lane {
    conn: Option<Conn>,
}

impl Lane {
    /// POSTs `msg` to `url` on this lane's connection (opening one if needed); whatever
    /// happens within `timeout` is the answer.
    pub async fn send(
        &mut self,
        http: &HttpSender,
        url: &http::Uri,
        msg: Message,
        timeout: Duration,
    ) -> Answer {
        match tokio::time::timeout(timeout, self.exchange(http, url, msg)).await {
            Ok(answer) => answer,
            Err(_) => {
                // The connection may still carry the abandoned exchange: never reuse it.
                self.conn = None;
                Answer::new(
                    Outcome::Timeout,
                    format!("no answer within {} ms", timeout.as_millis()),
                )
            }
        }
    }

    async fn exchange(&mut self, http: &HttpSender, url: &http::Uri, msg: Message) -> Answer {
        let mut req = match request(url, msg) {
            Ok(r) => r,
            Err(e) => return Answer::new(Outcome::Connection, format!("bad request: {e}")),
        };
        // Twice at most: a kept-alive connection the receiver closed just as the request was
        // handed to it gives the request back unsent, and it goes on a fresh connection.
        for _ in 0..2 {
            if !self.conn.as_mut().is_some_and(|c| c.usable(url)) {
                self.conn = None;
                match http.connect(url).await {
                    Ok(c) => self.conn = Some(c),
                    Err(a) => return a,
                }
            }
            let conn = self.conn.as_mut().expect("connected above");
            let sent = conn.sender.try_send_request(req);
            let resp = Conn::drive(&mut conn.driver, &mut conn.closed, sent).await;
            match resp {
                Ok(resp) => return self.answer(resp).await,
                Err(mut e) => {
                    self.conn = None;
                    match e.take_message() {
                        Some(unsent) => req = unsent,
                        None => return Answer::new(Outcome::Connection, chain(e.error())),
                    }
                }
            }
        }
        Answer::new(
            Outcome::Connection,
            "the receiver closed two connections in a row",
        )
    }

    /// Judges the answer, reading its body (the first bytes of an error body are kept).
    async fn answer(&mut self, resp: http::Response<hyper::body::Incoming>) -> Answer {
        let status = resp.status().as_u16();
        let keep_detail = !resp.status().is_success();
        let retry_after = resp
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(RetryAfter::parse_http);
        let conn = self.conn.as_mut().expect("the answer came on it");
        let read = Conn::drive(
            &mut conn.driver,
            &mut conn.closed,
            first_bytes(resp.into_body(), keep_detail),
        )
        .await;
        let (detail, whole) = read;
        if !whole {
            // Unread body left on the connection: it cannot carry another request.
            self.conn = None;
        }
        let mut answer = Answer::new(Outcome::Http(status), detail);
        answer.retry_after = retry_after;
        answer
    }
}

/// The POST of `msg` to `url` (origin-form target, `host` header, signed headers).
fn request(url: &http::Uri, msg: Message) -> http::Result<http::Request<Full<Bytes>>> {
    let target = match url.path_and_query().map(|p| p.as_str()) {
        Some(p) if !p.is_empty() => p,
        _ => "/",
    };
    let host = url.authority().map_or("", |a| a.as_str());
    let mut headers = msg.headers();
    headers.insert(http::header::HOST, http::HeaderValue::from_str(host)?);
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_str(msg.content_type())?,
    );
    headers.insert(
        http::header::USER_AGENT,
        http::HeaderValue::from_static(concat!("timerdb/", env!("CARGO_PKG_VERSION"))),
    );
    let body = Bytes::from(msg.timer.payload);
    let mut req = http::Request::post(target).body(Full::new(body))?;
    *req.headers_mut() = headers;
    Ok(req)
}

/// Reads `body` to its end, up to [`MAX_BODY_READ`]: its first [`DETAIL_BYTES`] as text
/// (lossy) if `keep`, and whether it was read whole.
async fn first_bytes(mut body: hyper::body::Incoming, keep: bool) -> (String, bool) {
    let mut buf = Vec::new();
    let mut read = 0;
    loop {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    read += data.len();
                    if keep && buf.len() < DETAIL_BYTES {
                        let take = (DETAIL_BYTES - buf.len()).min(data.len());
                        buf.extend_from_slice(&data[..take]);
                    }
                }
                if read > MAX_BODY_READ {
                    break (String::from_utf8_lossy(&buf).into_owned(), false);
                }
            }
            Some(Err(_)) => break (String::from_utf8_lossy(&buf).into_owned(), false),
            None => break (String::from_utf8_lossy(&buf).into_owned(), true),
        }
    }
}
