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
/// connection takes the place of the oldest handshake of the address holding the most places:
/// silent connections (256 of them held every place for 10 s each and locked every new client
/// out: issue 33 finding 12) cannot keep a client that completes its handshake in milliseconds
/// from being served, and a flood from one address evicts only its own handshakes (a client
/// behind the same address as a flood still competes with it, as in finding 12's fix).
const MAX_HANDSHAKES: usize = 256;

/// The handshakes in progress on one listener, oldest first: each can be told to give up.
#[derive(Default)]
struct Handshakes {
    next: u64,
    pending: std::collections::BTreeMap<u64, (Option<IpAddr>, tokio::sync::oneshot::Sender<()>)>,
    /// The handshakes of each remote address (`None`: unknown), oldest first.
    by_source: std::collections::HashMap<Option<IpAddr>, std::collections::BTreeSet<u64>>,
    evicted: u64,
}

impl Handshakes {
    /// A place for a new handshake from `source`: its number and what tells it to give up,
    /// and how long it may take. Takes a place of the largest holder when all are taken.
    fn start(
        &mut self,
        source: Option<IpAddr>,
    ) -> (u64, tokio::sync::oneshot::Receiver<()>, Duration) {
        if self.pending.len() >= MAX_HANDSHAKES {
            self.evict();
        }
        let limit = match self.pending.len() >= MAX_HANDSHAKES / 2 {
            true => HANDSHAKE_LIMIT_BUSY,
            false => HANDSHAKE_LIMIT,
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.next += 1;
        let source = source.map(network_of);
        self.pending.insert(self.next, (source, tx));
        self.by_source.entry(source).or_default().insert(self.next);
        (self.next, rx, limit)
    }

    /// Tells a handshake to give up: the oldest of the source holding the most places (of two
    /// holding as many, the one whose oldest is older) — unless every source holds one place
    /// (a flood from many networks), when the newest gives up: ties among single places are
    /// broken against the one that has waited least, not the client that waited longest.
    fn evict(&mut self) {
        let largest = self
            .by_source
            .iter()
            .filter_map(|(source, ids)| {
                Some((ids.len(), std::cmp::Reverse(*ids.first()?), *source))
            })
            .max();
        let Some((held, std::cmp::Reverse(oldest), _)) = largest else {
            return;
        };
        let id = match held {
            1 => match self.pending.keys().next_back() {
                Some(newest) => *newest,
                None => return,
            },
            _ => oldest,
        };
        if let Some((_, give_up)) = self.remove(id) {
            let _ = give_up.send(());
            self.evicted += 1;
            if self.evicted.is_power_of_two() {
                tracing::warn!(
                    evicted = self.evicted,
                    "TLS handshakes in progress at the limit: the largest holder's oldest made way"
                );
            }
        }
    }

    fn remove(&mut self, id: u64) -> Option<(Option<IpAddr>, tokio::sync::oneshot::Sender<()>)> {
        let (source, give_up) = self.pending.remove(&id)?;
        if let Some(ids) = self.by_source.get_mut(&source) {
            ids.remove(&id);
            if ids.is_empty() {
                self.by_source.remove(&source);
            }
        }
        Some((source, give_up))
    }

    fn finished(&mut self, id: u64) {
        self.remove(id);
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
                let handshake = tokio::time::timeout(limit, acceptor.accept(tcp));
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
mod tests {
    use super::*;

    #[test]
    fn a_peer_verdict_is_kept_for_the_connection_until_the_ca_is_reloaded() {
        let conn = ConnInfo::default();
        let calls = std::cell::Cell::new(0);
        let verify = |result: Result<(), String>| {
            calls.set(calls.get() + 1);
            result
        };
        assert_eq!(conn.peer_verdict(1, || verify(Ok(()))), Ok(()));
        // Every request of the connection (each holds a clone) reuses it.
        let request = conn.clone();
        assert_eq!(request.peer_verdict(1, || verify(Err("x".into()))), Ok(()));
        assert_eq!(calls.get(), 1);
        // Another CA load: verified again, and the new verdict is the one kept.
        let refused = request.peer_verdict(2, || verify(Err("not the cluster's".into())));
        assert_eq!(refused, Err("not the cluster's".to_string()));
        assert_eq!(conn.peer_verdict(2, || verify(Ok(()))), refused);
        assert_eq!(calls.get(), 2);
        assert!(conn.cert_names().is_empty());
    }

    /// Review of issue 33: with every place taken, a new handshake took the oldest one's,
    /// whoever held it, so one address opening ~850 silent connections a second evicted every
    /// other client whose handshake took 300 ms. Now the address holding the most places
    /// gives up its oldest: a flood from one address evicts only its own.
    #[test]
    fn a_flood_from_one_address_evicts_only_its_own_handshakes() {
        let flood: Option<IpAddr> = Some([10, 0, 0, 66].into());
        let client: Option<IpAddr> = Some([10, 0, 0, 7].into());
        let mut h = Handshakes::default();
        let mut flooding = Vec::new();
        for _ in 0..MAX_HANDSHAKES - 1 {
            flooding.push(h.start(flood).1);
        }
        let (_, mut served, _) = h.start(client);
        for _ in 0..10 * MAX_HANDSHAKES {
            flooding.push(h.start(flood).1);
        }
        assert!(
            served.try_recv().is_err(),
            "the client's handshake was evicted"
        );
        assert_eq!(h.pending.len(), MAX_HANDSHAKES);
        let given_up = flooding
            .iter_mut()
            .filter_map(|r| r.try_recv().ok())
            .count();
        assert_eq!(given_up, 10 * MAX_HANDSHAKES);
        // The addresses of one IPv6 /64 count as one source.
        let mut h = Handshakes::default();
        let (_, mut v6_client, _) = h.start(Some("2001:db8:1::7".parse().unwrap()));
        for i in 0..2 * MAX_HANDSHAKES as u16 {
            let one_host = std::net::Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 9, i);
            h.start(Some(one_host.into()));
        }
        assert!(
            v6_client.try_recv().is_err(),
            "a /64's flood evicted another network"
        );
        // One address alone still takes the oldest place (as before), and a finished
        // handshake frees its address's place.
        let mut h = Handshakes::default();
        let (first, _gone, _) = h.start(client);
        h.finished(first);
        let (_, mut lone, _) = h.start(client);
        for _ in 0..MAX_HANDSHAKES {
            h.start(client);
        }
        assert!(lone.try_recv().is_ok());
    }

    /// Review of issue 33's change (F8): when every source holds one place (a flood from
    /// many networks), the tie among the largest holders went to the oldest place: the
    /// client that had waited longest. Now, among sources that hold a place each, the newest
    /// place makes way: the handshakes furthest along keep theirs.
    #[test]
    fn a_flood_from_many_networks_does_not_evict_the_longest_waiting_client() {
        let mut h = Handshakes::default();
        let (_, mut client, _) = h.start(Some([192, 0, 2, 7].into()));
        let source = |i: u32| Some(IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i)));
        for i in 0..MAX_HANDSHAKES as u32 - 1 {
            h.start(source(i));
        }
        for i in 0..4 * MAX_HANDSHAKES as u32 {
            h.start(source(100_000 + i));
        }
        assert!(
            client.try_recv().is_err(),
            "a flood of one place per network evicted the longest-waiting client"
        );
        assert_eq!(h.pending.len(), MAX_HANDSHAKES);
    }
}
