//! Accepting connections for the gRPC server: TCP, then TLS when the port has it.
//!
//! Each accepted socket gets `TCP_NODELAY` (tonic ignores its own setting for an injected
//! listener, and Nagle's algorithm held small answers back for a delayed ACK, ~20-40 ms). A
//! TLS handshake runs in its own task, bounded in time and in number, so a client that
//! connects and says nothing holds up neither the accept loop nor other clients. The acceptor
//! is asked for at each handshake, so a SIGHUP reload applies to the next connection.
//!
//! Every connection reports a [`ConnInfo`] (tonic puts it in each request's extensions): the
//! remote address and the client certificates it presented, which the auth layer reads to
//! tell a peer from a client and to find a certificate user. What it works out from the
//! certificate (its names; whether the peer CA signed it) is kept with the connection, so
//! that a call does not parse or verify the certificate again: the verdict is redone when the
//! CA was reloaded or after [`VERDICT_FOR`], so a rotation or an expiry still takes effect.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls_pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;

use crate::tls::{Port, Tls};

/// Longest a TLS handshake may take while few are in progress.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);
/// Longest one may take once half the places are taken: a connection that says nothing for
/// this long is not a client in a hurry.
const HANDSHAKE_LIMIT_BUSY: Duration = Duration::from_secs(1);
/// Most TLS handshakes in progress at once on one listener. When all are taken, a new
/// connection takes the place of one in progress, chosen so that no flood can aim at a client:
/// - the source (address, or IPv6 /64) holding the most places gives up one of its own — its
///   oldest that has not sent a byte, else its oldest — so a flood from one address evicts
///   only its own handshakes (256 silent connections held every place for 10 s each and
///   locked every new client out: issue 33 finding 12), however it behaves;
/// - when every source holds one place (a flood from many networks), a connection that has
///   sent nothing for [`SILENT_AFTER`] makes way, the oldest first (a client sends its
///   ClientHello as soon as it connects); failing that, one drawn at random — no rule an
///   attacker can time (the newest-first tie-break it replaces let each arrival evict the
///   client just before it; its first replacement, "silent first", evicted a client whose
///   first bytes the node had not read yet).
const MAX_HANDSHAKES: usize = 256;

/// How long a connection may send nothing before it counts as silent: longer than a
/// client's ClientHello takes to arrive after the connection (half a round trip).
const SILENT_AFTER: Duration = Duration::from_millis(250);

/// One handshake in progress: its source, when it came, whether it sent a byte yet, and what
/// tells it to give up.
struct Place {
    source: Option<IpAddr>,
    at: std::time::Instant,
    spoke: bool,
    give_up: tokio::sync::oneshot::Sender<()>,
}

/// The handshakes in progress on one listener, oldest first: each can be told to give up.
#[derive(Default)]
struct Handshakes {
    next: u64,
    pending: std::collections::BTreeMap<u64, Place>,
    evicted: u64,
}

impl Handshakes {
    /// A place for a new handshake from `source`: its number and what tells it to give up,
    /// and how long it may take. Takes another's place when all are taken ([`MAX_HANDSHAKES`]).
    fn start(
        &mut self,
        source: Option<IpAddr>,
    ) -> (u64, tokio::sync::oneshot::Receiver<()>, Duration) {
        self.start_at(source, std::time::Instant::now())
    }

    /// [`Handshakes::start`] at `now`.
    fn start_at(
        &mut self,
        source: Option<IpAddr>,
        now: std::time::Instant,
    ) -> (u64, tokio::sync::oneshot::Receiver<()>, Duration) {
        if self.pending.len() >= MAX_HANDSHAKES {
            self.evict(now);
        }
        let limit = match self.pending.len() >= MAX_HANDSHAKES / 2 {
            true => HANDSHAKE_LIMIT_BUSY,
            false => HANDSHAKE_LIMIT,
        };
        let (give_up, rx) = tokio::sync::oneshot::channel();
        self.next += 1;
        let place = Place {
            source: source.map(network_of),
            at: now,
            spoke: false,
            give_up,
        };
        self.pending.insert(self.next, place);
        (self.next, rx, limit)
    }

    /// Handshake `id`'s client sent its first bytes.
    fn spoke(&mut self, id: u64) {
        if let Some(place) = self.pending.get_mut(&id) {
            place.spoke = true;
        }
    }

    /// Tells one handshake to give up (see [`MAX_HANDSHAKES`] for which). A scan of at most
    /// [`MAX_HANDSHAKES`] places, only when all are taken.
    fn evict(&mut self, now: std::time::Instant) {
        // Per source: how many places, its oldest, and its oldest silent one (the map
        // iterates oldest first).
        let mut held =
            std::collections::HashMap::<Option<IpAddr>, (usize, u64, Option<u64>)>::new();
        for (id, place) in &self.pending {
            let entry = held.entry(place.source).or_insert((0, *id, None));
            entry.0 += 1;
            if !place.spoke && entry.2.is_none() {
                entry.2 = Some(*id);
            }
        }
        let largest = held
            .values()
            .map(|(n, oldest, silent)| (*n, std::cmp::Reverse(*oldest), *silent))
            .max();
        let id = match largest {
            None => return,
            Some((n, std::cmp::Reverse(oldest), silent)) if n > 1 => silent.unwrap_or(oldest),
            Some(_) => {
                let silent = self
                    .pending
                    .iter()
                    .find(|(_, p)| !p.spoke && now.saturating_duration_since(p.at) >= SILENT_AFTER);
                match silent {
                    Some((id, _)) => *id,
                    None => {
                        let at = rand::random_range(0..self.pending.len());
                        match self.pending.keys().nth(at) {
                            Some(id) => *id,
                            None => return,
                        }
                    }
                }
            }
        };
        if let Some(place) = self.pending.remove(&id) {
            let _ = place.give_up.send(());
            self.evicted += 1;
            if self.evicted.is_power_of_two() {
                tracing::warn!(
                    evicted = self.evicted,
                    "TLS handshakes in progress at the limit: one made way for a new connection"
                );
            }
        }
    }

    fn finished(&mut self, id: u64) {
        self.pending.remove(&id);
    }
}

/// The source a handshake place is counted against: an IPv4 address, or an IPv6 address's
/// /64 (one host usually holds a whole /64, so counting single IPv6 addresses would let one
/// host look like millions).
fn network_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        },
    }
}

/// Where a node accepts connections: a TCP listener, or the simulated network (`crate::sim`).
pub enum Listener {
    Tcp(TcpListener),
    Sim(crate::sim::Listener),
}

impl From<TcpListener> for Listener {
    fn from(l: TcpListener) -> Self {
        Listener::Tcp(l)
    }
}

impl Listener {
    pub fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        match self {
            Listener::Tcp(l) => l.local_addr(),
            Listener::Sim(l) => Ok(l.local_addr()),
        }
    }
}

/// One accepted connection, plain or TLS (or simulated, plain).
pub enum Conn {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    Sim(crate::sim::SimStream),
}

/// How long a connection's peer-CA verdict is believed before it is checked again.
pub const VERDICT_FOR: Duration = Duration::from_secs(60);

/// What a request knows of its connection.
#[derive(Debug, Clone, Default)]
pub struct ConnInfo {
    pub remote: Option<SocketAddr>,
    /// The client's certificate chain (end entity first), if it presented one over TLS.
    pub certs: Option<Arc<Vec<CertificateDer<'static>>>>,
    /// Worked out from `certs` once per connection (shared by its requests).
    memo: Arc<Memo>,
}

#[derive(Debug, Default)]
struct Memo {
    names: std::sync::OnceLock<Vec<String>>,
    peer: std::sync::Mutex<Option<Verdict>>,
}

/// Whether the peer CA signed a connection's certificate: which CA load said so, and when.
#[derive(Debug)]
struct Verdict {
    verifier: usize,
    at: tokio::time::Instant,
    result: Result<(), String>,
}

impl ConnInfo {
    /// The names of the client certificate (CN, DNS and IP SANs); none without one.
    pub fn cert_names(&self) -> &[String] {
        self.memo.names.get_or_init(|| {
            let end = self.certs.as_deref().and_then(|c| c.first());
            end.map(crate::tls::cert_names).unwrap_or_default()
        })
    }

    /// `verify`'s verdict on this connection's certificate, reused while the same verifier
    /// (`verifier`, an identity) is in force and for at most [`VERDICT_FOR`].
    pub fn peer_verdict(
        &self,
        verifier: usize,
        verify: impl FnOnce() -> Result<(), String>,
    ) -> Result<(), String> {
        let mut memo = self.memo.peer.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = memo.as_ref() {
            if v.verifier == verifier && v.at.elapsed() < VERDICT_FOR {
                return v.result.clone();
            }
        }
        let result = verify();
        *memo = Some(Verdict {
            verifier,
            at: tokio::time::Instant::now(),
            result: result.clone(),
        });
        result
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        match self {
            Conn::Plain(s) => ConnInfo {
                remote: s.peer_addr().ok(),
                ..ConnInfo::default()
            },
            Conn::Tls(s) => {
                let (tcp, session) = s.get_ref();
                ConnInfo {
                    remote: tcp.peer_addr().ok(),
                    certs: session.peer_certificates().map(|c| Arc::new(c.to_vec())),
                    ..ConnInfo::default()
                }
            }
            Conn::Sim(s) => ConnInfo {
                remote: Some(s.peer_addr()),
                ..ConnInfo::default()
            },
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Conn::Sim(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Conn::Sim(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Conn::Sim(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Conn::Sim(s) => Pin::new(s).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
            Conn::Sim(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(s) => s.is_write_vectored(),
            Conn::Tls(s) => s.is_write_vectored(),
            Conn::Sim(_) => false,
        }
    }
}

/// The connections accepted on `listener`, TLS if `tls` has a configuration for `port`, until
/// `shutdown`.
pub fn incoming(
    listener: Listener,
    tls: Tls,
    port: Port,
    mut shutdown: watch::Receiver<bool>,
) -> ReceiverStream<io::Result<Conn>> {
    let (tx, rx) = mpsc::channel(64);
    let listener = match listener {
        Listener::Tcp(l) => l,
        Listener::Sim(mut l) => {
            // Simulated connections are plain (the simulation leaves TLS out).
            tokio::spawn(async move {
                loop {
                    let accepted = tokio::select! {
                        a = l.accept() => a,
                        _ = shutdown.wait_for(|stop| *stop) => return,
                    };
                    let Some(stream) = accepted else { return };
                    if tx.send(Ok(Conn::Sim(stream))).await.is_err() {
                        return;
                    }
                }
            });
            return ReceiverStream::new(rx);
        }
    };
    let handshakes = Arc::new(std::sync::Mutex::new(Handshakes::default()));
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = shutdown.wait_for(|stop| *stop) => return,
            };
            let tcp = match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of file descriptors and the like: go on after a pause.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "set_nodelay failed");
            }
            let Some(acceptor) = tls.acceptor(port) else {
                if tx.send(Ok(Conn::Plain(tcp))).await.is_err() {
                    return;
                }
                continue;
            };
            let remote = tcp.peer_addr().ok();
            let (id, give_up, limit) = lock(&handshakes).start(remote.map(|a| a.ip()));
            let (tx, handshakes) = (tx.clone(), handshakes.clone());
            tokio::spawn(async move {
                let handshake = tokio::time::timeout(limit, async {
                    // Waits for the client's first bytes (its ClientHello) without taking
                    // them: until then this place is among the first to make way.
                    let _ = tcp.peek(&mut [0u8; 1]).await;
                    lock(&handshakes).spoke(id);
                    acceptor.accept(tcp).await
                });
                tokio::select! {
                    done = handshake => match done {
                        Ok(Ok(s)) => {
                            lock(&handshakes).finished(id);
                            let _ = tx.send(Ok(Conn::Tls(Box::new(s)))).await;
                            return;
                        }
                        Ok(Err(e)) => tracing::debug!(?remote, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(?remote, "TLS handshake timed out"),
                    },
                    _ = give_up => tracing::debug!(?remote, "TLS handshake made way for a newer one"),
                }
                lock(&handshakes).finished(id);
            });
        }
    });
    ReceiverStream::new(rx)
}

fn lock(h: &std::sync::Mutex<Handshakes>) -> std::sync::MutexGuard<'_, Handshakes> {
    h.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests;
