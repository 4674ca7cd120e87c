//! The seams of the deterministic simulator (`timerdb-sim`): a virtual clock, an in-memory
//! network with faults, and synchronous storage work, all switched on for one thread only.
//!
//! The simulator runs a whole cluster — three nodes with the real openraft, state machine
//! (RocksDB on tmpfs), gRPC servers, forwarding and workers — and its clients on one
//! current-thread tokio runtime whose time is paused: time jumps to the next timer whenever
//! every task waits, so seconds of cluster life cost milliseconds, and nothing depends on how
//! fast this machine is. What would make a run depend on more than its seed is replaced while
//! a [`World`] is installed on the thread ([`install`]):
//!
//! - the wall clock: [`crate::clock::Clock`] reads [`now_ms`], the runtime's (virtual) time
//!   from a fixed epoch;
//! - the network: [`crate::tls::Tls::channel`] dials through [`connect`], and a node started on
//!   a [`Listener`] accepts [`SimStream`]s — pairs of byte queues whose every chunk is delivered
//!   after the link's delay, held while the link is cut, and reset when either end's node stops.
//!   Addresses name directed links (the simulator gives each node a `--dial` map), so a fault
//!   can cut `1 → 2` and not `2 → 1`;
//! - threads: the log store syncs its writes inline instead of on its syncer thread, snapshots
//!   are built and files read inline ([`inline`]), so no work finishes at a wall-clock moment.
//!
//! Outside a simulation (every production thread) nothing here is active and nothing changes.
//! What is still left to chance is listed in docs/guarantees.md ("What the tests do not
//! reach"); the simulator runs every seed twice in a row now and then and compares the two
//! histories, so a new source of chance shows up as a failure.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// A node's id in the simulated network; 0 is the clients.
pub type Host = u64;

/// One direction of a link: how long its bytes take, and whether it is cut.
#[derive(Debug, Clone, Copy, Default)]
pub struct Link {
    /// Cut: bytes written are held (as TCP retransmits them) until the link heals; new
    /// connections over it are not made.
    pub cut: bool,
    /// Extra delay of every chunk, in ms (on top of [`BASE_DELAY`]).
    pub delay_ms: u64,
    /// Each chunk is late by up to this many ms more, drawn from the world's seeded generator:
    /// one connection's chunks stay in order (TCP), two connections' overtake each other.
    pub jitter_ms: u64,
    /// Chunks (of 1,000) that break their connection, as a segment TCP gave up resending
    /// does: both ends get a reset, the bytes in flight are lost.
    pub loss_per_mille: u32,
}

/// Every chunk's delay on a healthy link: none (a link's own delay comes on top). With
/// 200 µs here, one seed stalled replication for good after a log purge, every connection
/// task asleep with bytes waiting (not understood yet: docs/guarantees.md, "What the tests do
/// not reach").
pub const BASE_DELAY: Duration = Duration::ZERO;

/// The simulated network and clock of one thread.
pub struct World {
    epoch_ms: i64,
    start: Instant,
    /// Address → (from, to): who dials whom through it.
    routes: BTreeMap<String, (Host, Host)>,
    /// Each running node's accept queue, and its incarnation (bumped by every start).
    listeners: BTreeMap<Host, (mpsc::UnboundedSender<SimStream>, u64)>,
    links: BTreeMap<(Host, Host), Link>,
    /// Connections made so far (their ports, for the addresses the servers see).
    connections: u64,
    /// Bugs planted on purpose ([`planted`]).
    planted: std::collections::BTreeSet<&'static str>,
    /// Each entry index [`TRAIL_EVERY`] divides → (data directory, digest after applying it),
    /// for every time a replica applied it ([`trail`]).
    trails: BTreeMap<(u16, u64), Vec<(String, u64)>>,
    /// The network's dice (jitter, loss), seeded by [`install`].
    rng: u64,
}

/// Every replica records its digest after each entry whose index this divides: replicas must
/// agree at every index, not only at the end (a divergence a later entry heals, such as a
/// lease that is purged soon after, shows only here).
pub const TRAIL_EVERY: u64 = 8;

thread_local! {
    static WORLD: RefCell<Option<World>> = const { RefCell::new(None) };
    static INLINE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Installs a world on this thread: its clock starts at `epoch_ms` now (the runtime's time),
/// its network's dice are seeded by `seed`. Call inside the runtime (its time must be paused
/// for the run to be deterministic).
pub fn install(epoch_ms: i64, seed: u64) {
    WORLD.with(|w| {
        *w.borrow_mut() = Some(World {
            epoch_ms,
            start: Instant::now(),
            routes: BTreeMap::new(),
            listeners: BTreeMap::new(),
            links: BTreeMap::new(),
            connections: 0,
            planted: Default::default(),
            trails: Default::default(),
            rng: seed,
        })
    });
    INLINE.with(|i| i.set(true));
}

/// Removes this thread's world.
pub fn uninstall() {
    WORLD.with(|w| *w.borrow_mut() = None);
    INLINE.with(|i| i.set(false));
}

/// Runs `f` on this thread's world (never log from `f`: the log's clock reads the world too).
fn with<T>(f: impl FnOnce(&mut World) -> T) -> Option<T> {
    WORLD.with(|w| w.borrow_mut().as_mut().map(f))
}

/// A number below `n` (> 0) from the world's seeded generator (splitmix64).
fn roll(w: &mut World, n: u64) -> u64 {
    w.rng = w.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = w.rng;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) % n
}

/// A random number from the world's seeded generator, if a world is installed (openraft's
/// draws: election timeouts, its first tick; see `raft_types::runtime`).
pub fn dice() -> Option<u64> {
    with(|w| roll(w, u64::MAX))
}

/// Whether a simulation runs on this thread.
pub fn active() -> bool {
    WORLD.with(|w| w.borrow().is_some())
}

/// Whether work that would go to another thread (a blocking task, the log's syncer) must run
/// inline instead: in a simulation, where a thread's wall-clock timing must not decide what
/// runs first.
pub fn inline() -> bool {
    INLINE.with(|i| i.get())
}

/// The simulated wall clock in Unix ms, if a simulation runs on this thread.
pub fn now_ms() -> Option<i64> {
    with(|w| w.epoch_ms + w.start.elapsed().as_millis() as i64)
}

/// `address` leads from `from` to `to` (a node's advertised address for the clients, or one
/// of its `--dial` addresses for a peer).
pub fn route(address: &str, from: Host, to: Host) {
    with(|w| w.routes.insert(address.to_string(), (from, to)));
}

/// Sets the link `from → to`.
pub fn set_link(from: Host, to: Host, link: Link) {
    with(|w| w.links.insert((from, to), link));
}

/// The link `from → to` now.
pub fn link(from: Host, to: Host) -> Link {
    with(|w| w.links.get(&(from, to)).copied().unwrap_or_default()).unwrap_or_default()
}

/// Plants bug `name` in every node of this simulation (see [`planted`]).
pub fn plant(name: &'static str) {
    with(|w| w.planted.insert(name));
}

/// The replica in `dir` had `digest` after applying entry `index` (see [`TRAIL_EVERY`]).
pub fn trail(dir: &str, group: u16, index: u64, digest: u64) {
    with(|w| {
        let at = w.trails.entry((group, index)).or_default();
        at.push((dir.to_string(), digest))
    });
}

/// The trail so far: (group, index) → (data directory, digest) for each time a replica of
/// the group applied it.
pub fn trails() -> BTreeMap<(u16, u64), Vec<(String, u64)>> {
    with(|w| w.trails.clone()).unwrap_or_default()
}

/// Whether bug `name` is planted: the simulator shows its checks find bugs of each kind by
/// planting one and seeing the run fail. Always false outside a simulation. The bugs:
/// - `heads-pass`: a Fire entry gives pass leases to the namespaces its node's heads cache
///   names (issue 33 finding 1, back);
/// - `retry-unsafe`: the forwarder sends any call again after an unknown outcome (finding 2);
/// - `install-keeps-caches`: a snapshot install does not rebuild the node-local caches;
/// - `apply-reads-clock`: apply times a retry by the node's clock, not the entry's;
/// - `retry-refires`: a delivery given back for a retry loses its fire index, as if the
///   timer fired again;
/// - `drop-stream-acks`: the ack coalescer loses every other ack a stream hands in.
/// - `drop-queued-acks`: it loses every other unary Ack answered once queued.
pub fn planted(name: &str) -> bool {
    with(|w| w.planted.contains(name)).unwrap_or(false)
}

/// Node `host` stops accepting; every connection to or from its current incarnation is reset.
pub fn stop(host: Host) {
    with(|w| w.listeners.remove(&host));
}

/// A node's listener: the connections made to it.
pub struct Listener {
    host: Host,
    rx: mpsc::UnboundedReceiver<SimStream>,
    addr: SocketAddr,
}

impl Listener {
    /// Starts accepting for node `host` (a new incarnation of it), known to clients as `addr`.
    pub fn bind(host: Host, addr: SocketAddr) -> Listener {
        let (tx, rx) = mpsc::unbounded_channel();
        with(|w| {
            let incarnation = w.listeners.get(&host).map_or(0, |l| l.1) + 1;
            w.listeners.insert(host, (tx, incarnation));
        });
        Listener { host, rx, addr }
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn host(&self) -> Host {
        self.host
    }

    /// The next connection; `None` once the node stopped accepting.
    pub async fn accept(&mut self) -> Option<SimStream> {
        self.rx.recv().await
    }
}

/// Connects to `address` (`host:port`): a stream, or "refused" if no node listens there or the
/// link is cut (a SYN lost: the caller's connect timeout or retry decides).
pub fn connect(address: &str) -> io::Result<SimStream> {
    let refused = |why: &str| io::Error::new(io::ErrorKind::ConnectionRefused, why.to_string());
    with(|w| {
        let (from, to) = *w
            .routes
            .get(address)
            .ok_or_else(|| refused("no such address in the simulation"))?;
        if w.links.get(&(from, to)).is_some_and(|l| l.cut) {
            return Err(refused("link cut"));
        }
        let Some((accept, _)) = w.listeners.get(&to) else {
            return Err(refused("node down"));
        };
        w.connections += 1;
        let port = 10_000 + (w.connections % 50_000) as u16;
        let client_addr = SocketAddr::from(([10, 99, from as u8, 0], port));
        let server_addr: SocketAddr = address
            .parse()
            .unwrap_or_else(|_| SocketAddr::from(([10, 0, 0, to as u8], 7100)));
        let up = Arc::new(Pipe::default());
        let down = Arc::new(Pipe::default());
        let client = SimStream {
            tx: up.clone(),
            rx: down.clone(),
            link: (from, to),
            peer: server_addr,
            timer: None,
        };
        let server = SimStream {
            tx: down,
            rx: up,
            link: (to, from),
            peer: client_addr,
            timer: None,
        };
        accept.send(server).map_err(|_| refused("node stopping"))?;
        Ok(client)
    })
    .unwrap_or_else(|| Err(refused("no simulation on this thread")))
    .inspect(|c| tracing::trace!(from = c.link.0, to = c.link.1, "sim: connected"))
}

/// One direction's bytes in flight.
#[derive(Default)]
struct Pipe {
    inner: Mutex<PipeInner>,
}

#[derive(Default)]
struct PipeInner {
    chunks: VecDeque<(Instant, Bytes)>,
    /// The writer is gone: after the chunks, end of stream.
    closed: bool,
    /// The connection broke (a lost chunk): both ends get an error.
    reset: bool,
    reader: Option<Waker>,
}

impl Pipe {
    fn lock(&self) -> std::sync::MutexGuard<'_, PipeInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One end of a simulated connection.
pub struct SimStream {
    tx: Arc<Pipe>,
    rx: Arc<Pipe>,
    /// (this end, the other end): bytes written go over `link.0 → link.1`.
    link: (Host, Host),
    peer: SocketAddr,
    /// A read waiting for a chunk's delivery time (or a cut link to heal).
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl SimStream {
    /// The other end's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }
}

/// How often a read over a cut link looks again.
const CUT_POLL: Duration = Duration::from_millis(20);

impl AsyncRead for SimStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let (from, to) = (self.link.1, self.link.0);
        let now = Instant::now();
        let wait_until = {
            let mut p = self.rx.lock();
            if p.reset {
                return Poll::Ready(Err(io::ErrorKind::ConnectionReset.into()));
            }
            match p.chunks.front() {
                None if p.closed => return Poll::Ready(Ok(())),
                None => {
                    p.reader = Some(cx.waker().clone());
                    return Poll::Pending;
                }
                Some((at, _)) if *at > now => {
                    let at = *at;
                    p.reader = Some(cx.waker().clone());
                    at
                }
                Some(_) if link(from, to).cut => now + CUT_POLL,
                Some(_) => {
                    let (at, mut chunk) = p.chunks.pop_front().expect("a chunk");
                    let n = chunk.len().min(buf.remaining());
                    buf.put_slice(&chunk.split_to(n));
                    if !chunk.is_empty() {
                        p.chunks.push_front((at, chunk));
                    }
                    return Poll::Ready(Ok(()));
                }
            }
        };
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(wait_until)));
        timer.as_mut().reset(wait_until);
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncWrite for SimStream {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            // Nothing to send; a chunk of nothing would read as the end of the stream.
            return Poll::Ready(Ok(0));
        }
        let l = link(self.link.0, self.link.1);
        let (jitter, lost) = with(|w| {
            let jitter = if l.jitter_ms > 0 {
                roll(w, l.jitter_ms + 1)
            } else {
                0
            };
            let lost = l.loss_per_mille > 0 && roll(w, 1000) < u64::from(l.loss_per_mille);
            (jitter, lost)
        })
        .unwrap_or((0, false));
        if lost {
            self.reset();
            return Poll::Ready(Err(io::ErrorKind::ConnectionReset.into()));
        }
        let delay = BASE_DELAY + Duration::from_millis(l.delay_ms + jitter);
        let mut p = self.tx.lock();
        if p.reset {
            return Poll::Ready(Err(io::ErrorKind::ConnectionReset.into()));
        }
        if p.closed {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        // In order: a chunk is never delivered before the one written before it.
        let at = (Instant::now() + delay).max(p.chunks.back().map_or(Instant::now(), |c| c.0));
        p.chunks.push_back((at, Bytes::copy_from_slice(buf)));
        if let Some(w) = p.reader.take() {
            w.wake();
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.close();
        Poll::Ready(Ok(()))
    }
}

impl SimStream {
    /// Breaks the connection: both directions' bytes are dropped, both ends' next read or write
    /// fails.
    fn reset(&self) {
        tracing::trace!(
            from = self.link.0,
            to = self.link.1,
            "sim: connection reset"
        );
        for pipe in [&self.tx, &self.rx] {
            let mut p = pipe.lock();
            p.reset = true;
            p.chunks.clear();
            if let Some(w) = p.reader.take() {
                w.wake();
            }
        }
    }

    fn close(&self) {
        let mut p = self.tx.lock();
        p.closed = true;
        if let Some(w) = p.reader.take() {
            w.wake();
        }
    }
}

impl Drop for SimStream {
    fn drop(&mut self) {
        tracing::trace!(from = self.link.0, to = self.link.1, peer = %self.peer, "sim: closed");
        self.close();
        // What the other end had sent and this end never read is gone with it.
        let mut p = self.rx.lock();
        p.chunks.clear();
        p.closed = true;
    }
}

/// Runs `f` here in a simulation; elsewhere on tokio's blocking pool.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, tokio::task::JoinError> {
    if inline() {
        return Ok(f());
    }
    tokio::task::spawn_blocking(f).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn a_lost_chunk_resets_both_ends_and_jitter_keeps_order() {
        install(1_000_000, 7);
        route("10.0.0.2:7100", 1, 2);
        let mut listener = Listener::bind(2, "10.0.0.2:7100".parse().unwrap());
        let jittery = Link {
            delay_ms: 5,
            jitter_ms: 40,
            ..Link::default()
        };
        set_link(1, 2, jittery);
        let mut client = connect("10.0.0.2:7100").unwrap();
        let mut server = listener.accept().await.unwrap();
        for i in 0..50u8 {
            client.write_all(&[i]).await.unwrap();
        }
        let mut got = vec![0u8; 50];
        server.read_exact(&mut got).await.unwrap();
        assert_eq!(
            got,
            (0..50).collect::<Vec<u8>>(),
            "one connection stays in order"
        );
        let lossy = Link {
            loss_per_mille: 1000,
            ..Link::default()
        };
        set_link(1, 2, lossy);
        let err = client.write_all(b"gone").await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);
        let mut buf = [0u8; 4];
        let err = server.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);
        uninstall();
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_arrive_in_order_after_the_delay_and_wait_out_a_cut() {
        install(1_000_000, 7);
        route("10.0.0.2:7100", 1, 2);
        let mut listener = Listener::bind(2, "10.0.0.2:7100".parse().unwrap());
        set_link(
            1,
            2,
            Link {
                delay_ms: 50,
                ..Link::default()
            },
        );
        let mut client = connect("10.0.0.2:7100").unwrap();
        let mut server = listener.accept().await.unwrap();
        let started = Instant::now();
        client.write_all(b"hello ").await.unwrap();
        client.write_all(b"world").await.unwrap();
        let mut got = vec![0u8; 11];
        server.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello world");
        assert!(started.elapsed() >= Duration::from_millis(50));
        assert_eq!(
            now_ms(),
            Some(1_000_000 + started.elapsed().as_millis() as i64)
        );
        // Cut: held, delivered once healed.
        set_link(
            1,
            2,
            Link {
                cut: true,
                ..Link::default()
            },
        );
        client.write_all(b"later").await.unwrap();
        let reader = tokio::spawn(async move {
            let mut got = vec![0u8; 5];
            server.read_exact(&mut got).await.unwrap();
            (got, Instant::now())
        });
        tokio::time::sleep(Duration::from_secs(2)).await;
        set_link(1, 2, Link::default());
        let (got, at) = reader.await.unwrap();
        assert_eq!(&got, b"later");
        assert!(at.duration_since(started) >= Duration::from_secs(2));
        assert!(connect("10.0.0.9:7100").is_err(), "no such address");
        drop(client);
        uninstall();
    }
}
