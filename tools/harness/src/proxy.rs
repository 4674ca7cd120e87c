//! Fault-injecting TCP proxies, one per directed peer link.
//!
//! Node `i` dials node `j` through the proxy for link (i, j) (`timerd --dial`), so every Raft
//! message and every forwarded client call from `i` to `j` crosses it. A link's mode applies to
//! the connections it carries now and to new ones:
//! - `Pass`: bytes flow unchanged;
//! - `Blackhole`: open connections are cut, new ones are accepted and then ignored (a partition:
//!   the dialler sees timeouts, not refusals);
//! - `Delay(ms)`: every chunk waits `ms` before it is forwarded, in both directions;
//! - `Flaky(permille)`: each forwarded chunk resets the connection with this probability.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What a link does to its traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Pass,
    Blackhole,
    Delay(u64),
    Flaky(u32),
}

/// One directed link's proxy.
pub struct Link {
    pub addr: String,
    mode: watch::Sender<Mode>,
    task: tokio::task::JoinHandle<()>,
}

impl Link {
    /// Listens on an ephemeral loopback port and forwards to `target`.
    pub async fn start(target: String) -> std::io::Result<Link> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let (mode, rx) = watch::channel(Mode::Pass);
        let task = tokio::spawn(accept_loop(listener, target, rx));
        Ok(Link { addr, mode, task })
    }

    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(listener: TcpListener, target: String, mode: watch::Receiver<Mode>) {
    let seq = Arc::new(AtomicU64::new(1));
    while let Ok((inbound, _)) = listener.accept().await {
        let _ = inbound.set_nodelay(true);
        let (target, mode, seq) = (target.clone(), mode.clone(), seq.clone());
        tokio::spawn(async move {
            let seed = seq.fetch_add(1, Ordering::Relaxed);
            carry(inbound, &target, mode, seed).await;
        });
    }
}

/// Carries one connection until it closes or the link cuts it.
async fn carry(inbound: TcpStream, target: &str, mut mode: watch::Receiver<Mode>, seed: u64) {
    if *mode.borrow() == Mode::Blackhole {
        // Hold the connection silently until the partition heals, then drop it.
        let _ = mode.wait_for(|m| *m != Mode::Blackhole).await;
        return;
    }
    let Ok(outbound) = TcpStream::connect(target).await else {
        return;
    };
    let _ = outbound.set_nodelay(true);
    let (ri, wi) = inbound.into_split();
    let (ro, wo) = outbound.into_split();
    let up = pump(ri, wo, mode.clone(), seed);
    let down = pump(ro, wi, mode.clone(), seed.wrapping_mul(31));
    tokio::select! {
        _ = up => {}
        _ = down => {}
        _ = mode.wait_for(|m| *m == Mode::Blackhole) => {}
    }
}

/// Copies one direction, applying the link's delay and flakiness to each chunk.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mode: watch::Receiver<Mode>,
    seed: u64,
) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut rng = seed | 1;
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let current = *mode.borrow();
        match current {
            Mode::Delay(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
            Mode::Flaky(permille) => {
                // xorshift: cheap, and nothing here needs to be reproducible.
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                if rng % 1000 < permille as u64 {
                    return;
                }
            }
            Mode::Pass | Mode::Blackhole => {}
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
