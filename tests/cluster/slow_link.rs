//! Peer links slower than loopback: three real `timerd` processes, each peer link through a
//! proxy that holds every chunk of up to 64 KiB for a few ms (about 16 MB/s, a slow or
//! shared network). A large batch entry then takes longer to reach a follower than a
//! heartbeat interval; the cluster must still commit it, not send it again and again.

use std::time::Duration;

use tempfile::TempDir;
use timerdb::api::pb;
use timerdb_harness::proxy::Mode;

use crate::harness::*;
use crate::process::{timerd, Options, ProcCluster, NODES};

/// Three batches of 10,000 timers with 300-byte payloads (entries of ~3.3 MB each) cross
/// links of ~16 MB/s: each AppendEntries takes ~200 ms to arrive. openraft gives one a
/// heartbeat (100 ms); a call given no longer was abandoned before its answer every time, the
/// leader sent the same entries again without end and, hearing from no quorum for 1 s,
/// refused the write (found on a busy machine by
/// `operations::a_stopped_node_leaves_nothing_to_replay`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_batches_cross_slow_peer_links() {
    init_tracing();
    let tmp = TempDir::new().unwrap();
    let options = Options {
        proxies: true,
        ..Default::default()
    };
    let mut c = ProcCluster::start(tmp.path(), &timerd(), options)
        .await
        .unwrap();
    let leader = c.wait_leader(Duration::from_secs(20)).await.unwrap();
    c.set_links(None, Mode::Delay(4));
    let mut client = c.timers(leader).await.unwrap();
    let base = now_ms() + 3_600_000;
    for b in 0..3 {
        let timers = (0..10_000)
            .map(|i| {
                let mut r = schedule_req(&format!("s{b}-{i}"), base + i);
                r.payload = vec![b as u8; 300];
                r
            })
            .collect();
        let started = std::time::Instant::now();
        let r = client
            .schedule_batch(pb::ScheduleBatchRequest { timers })
            .await;
        let took = started.elapsed();
        if let Err(e) = r {
            panic!(
                "batch {b} over slow links, after {took:?}: {}",
                status_text(&e)
            );
        }
        eprintln!("batch {b}: committed after {took:?}");
    }
    // Every replica holds all three batches, over the same slow links.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let mut digests = Vec::new();
        for id in NODES {
            digests.push(c.digest(id).await.map(|d| (d.applied_index, d.digest)));
        }
        if digests[0].is_some() && digests.iter().all(|d| *d == digests[0]) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the replicas never converged: {digests:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    c.stop();
}
