//! Backup and restore on real `timerd` processes, with the commands docs/operations.md gives:
//! `timerctl backup save` from a follower, `timerd --restore-from` on each node of a new
//! cluster, then the new cluster holds exactly the acknowledged state, works, and gives a node
//! added later the restored state too.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;
use tempfile::TempDir;
use timerdb::api::pb::timers_client::TimersClient;
use timerdb::api::pb::{self, cluster_client::ClusterClient, namespaces_client::NamespacesClient};
use tonic::Code;

use crate::harness::*;
use crate::process::*;

const NAMESPACES: [&str; 3] = ["bk-a", "bk-b", "bk-fired"];

fn timerctl(endpoint: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_timerctl"))
        .args(["--endpoint", endpoint, "--output", "json"])
        .args(args)
        .output()
        .expect("run timerctl")
}

fn json_ok(out: &Output, what: &str) -> Value {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// `timerd --restore-from` for node `id` into `data`; returns its output.
fn restore(id: u64, addr: &str, peers: &str, data: &Path, backup: &Path) -> Output {
    Command::new(timerd())
        .args(["--id", &id.to_string(), "--listen", addr, "--peers", peers])
        .arg("--data-dir")
        .arg(data)
        .arg("--restore-from")
        .arg(backup)
        .output()
        .expect("run timerd --restore-from")
}

/// Every timer of the test's namespaces, by (namespace, id).
async fn all_timers(addr: &str) -> BTreeMap<(String, String), pb::Timer> {
    let mut c = TimersClient::new(channel(addr).await.unwrap());
    let mut out = BTreeMap::new();
    for ns in NAMESPACES {
        for t in list_in(&mut c, ns, pb::TimerState::Unspecified).await {
            out.insert((t.namespace.clone(), t.id.clone()), t);
        }
    }
    out
}

fn batch(ns: &str, prefix: &str, n: usize, at: i64) -> pb::ScheduleBatchRequest {
    let timers = (0..n)
        .map(|i| pb::ScheduleRequest {
            namespace: ns.into(),
            id: format!("{prefix}{i}"),
            when: crate::harness::at(at + i as i64),
            payload: format!("payload of {ns}/{prefix}{i}").into_bytes(),
            ..Default::default()
        })
        .collect();
    pb::ScheduleBatchRequest { timers }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_restores_into_a_new_cluster_that_holds_every_acknowledged_write() {
    init_tracing();
    let tmp = TempDir::new().unwrap();
    let (mut source, _) = start_three(&tmp);
    let l = leader(&source).await;
    let follower = source[(l + 1) % 3].addr.clone();

    // Phase 1: state of every kind: PENDING timers in two namespaces, CANCELLED ones, FIRED
    // ones waiting for a consumer, and a namespace policy.
    let mut c = TimersClient::new(channel(&follower).await.unwrap());
    let later = now_ms() + 3_600_000;
    c.schedule_batch(batch("bk-a", "a", 300, later))
        .await
        .unwrap();
    c.schedule_batch(batch("bk-b", "b", 200, later))
        .await
        .unwrap();
    c.schedule_batch(batch("bk-fired", "f", 20, now_ms() + 200))
        .await
        .unwrap();
    for i in 0..10 {
        let req = pb::CancelRequest {
            namespace: "bk-a".into(),
            id: format!("a{}", i * 7),
            ..Default::default()
        };
        c.cancel(req).await.unwrap();
    }
    let policy = pb::NamespacePolicy {
        max_attempts: 7,
        ack_timeout_ms: 12_000,
        ..Default::default()
    };
    let mut ns = NamespacesClient::new(channel(&follower).await.unwrap());
    ns.put_namespace(pb::PutNamespaceRequest {
        name: "bk-b".into(),
        policy: Some(policy),
    })
    .await
    .unwrap();
    wait_fired_in(&mut c, "bk-fired", 20).await;
    // An earlier backup leaves a snapshot behind; the next backup must not serve it.
    let early = tmp.path().join("early.tdb");
    let early = json_ok(
        &timerctl(&follower, &["backup", "save", early.to_str().unwrap()]),
        "early save",
    );
    assert_eq!(early["timers"], 520);
    // The last acknowledged write before the backup: it must be in it.
    c.schedule(batch_one("bk-b", "last", later)).await.unwrap();
    let before = all_timers(&follower).await;
    assert_eq!(before.len(), 300 + 200 + 20 + 1);

    // Phase 2: back up through a follower (forwarded to the leader), check the file offline.
    let file = tmp.path().join("cluster.tdb");
    let path = file.to_str().unwrap();
    let saved = json_ok(&timerctl(&follower, &["backup", "save", path]), "save");
    assert_eq!(
        saved["node_id"],
        l as u64 + 1,
        "taken on the leader: {saved}"
    );
    assert_eq!(saved["timers"], 521);
    assert_eq!(saved["pending"], 300 - 10 + 200 + 1);
    assert!(!tmp.path().join("cluster.tdb.part").exists());
    let inspected = json_ok(
        &timerctl("127.0.0.1:1", &["backup", "inspect", path]),
        "inspect",
    );
    assert_eq!(
        inspected,
        saved
            .as_object()
            .map(|o| {
                let mut o = o.clone();
                o.remove("node_id");
                Value::Object(o)
            })
            .unwrap()
    );
    let again = timerctl(&follower, &["backup", "save", path]);
    assert!(!again.status.success(), "overwrote an existing backup");
    // A write after the backup: the restored cluster must not have it.
    c.schedule(batch_one("bk-b", "after", later)).await.unwrap();

    // Phase 3: the old cluster goes away; restore the file on three new nodes.
    for p in source.iter_mut() {
        p.child.take().unwrap().kill().unwrap();
    }
    let (mut restored, peers) = three_procs(&tmp, "r");
    for (i, p) in restored.iter().enumerate() {
        let out = restore(i as u64 + 1, &p.addr, &peers, &p.dir.join("data"), &file);
        assert!(
            out.status.success(),
            "restore {}: {}",
            i + 1,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Never over a node's existing state.
    let p = &restored[0];
    let out = restore(1, &p.addr, &peers, &p.dir.join("data"), &file);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("not empty"), "{err}");
    for (i, p) in restored.iter_mut().enumerate() {
        p.child = Some(spawn(i as u64 + 1, p, &peers));
    }

    // Phase 4: the new cluster holds exactly the backed-up state, on every node.
    let rl = leader(&restored).await;
    let addr = restored[(rl + 1) % 3].addr.clone();
    let after = all_timers(&addr).await;
    assert_eq!(after.len(), before.len());
    for (key, t) in &before {
        assert_eq!(after.get(key), Some(t), "{key:?} differs after restore");
    }
    let mut c = TimersClient::new(channel(&addr).await.unwrap());
    let missing = c
        .get(pb::GetRequest {
            namespace: "bk-b".into(),
            id: "after".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    let mut ns = NamespacesClient::new(channel(&addr).await.unwrap());
    let got = ns
        .get_namespace(pb::GetNamespaceRequest {
            name: "bk-b".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .namespace
        .unwrap();
    assert_eq!(got.policy.unwrap().max_attempts, 7);
    let (applied, _) = same_digests(&restored, Duration::from_secs(30)).await;
    let index = saved["index"].as_u64().unwrap();
    assert!(
        applied > index,
        "new entries follow the backup's index {index}: {applied}"
    );

    // Phase 5: it works: a new timer fires, after the old fire indexes; a restored one cancels.
    c.schedule(batch_one("bk-fired", "new", now_ms() + 300))
        .await
        .unwrap();
    let fired = wait_fired_in(&mut c, "bk-fired", 21).await;
    let new = fired.iter().find(|t| t.id == "new").unwrap();
    assert!(
        new.fire_index > index,
        "fire index {} reused",
        new.fire_index
    );
    c.cancel(pb::CancelRequest {
        namespace: "bk-a".into(),
        id: "a1".into(),
        ..Default::default()
    })
    .await
    .unwrap();

    // Phase 6: a node added later gets the restored state too (through a snapshot: the
    // restored log holds nothing before the backup's index).
    let extra = Proc {
        addr: free_addr(),
        dir: tmp.path().join("r4"),
        child: None,
    };
    std::fs::create_dir_all(&extra.dir).unwrap();
    let all_peers = format!("{peers},4={}", extra.addr);
    let mut extra = extra;
    extra.child = Some(spawn_with(4, &extra, &all_peers, &["--join"]));
    let mut admin = ClusterClient::new(channel(&addr).await.unwrap());
    admin
        .add_node(pb::AddNodeRequest {
            node_id: 4,
            addr: extra.addr.clone(),
            learner: false,
        })
        .await
        .unwrap();
    restored.push(extra);
    same_digests(&restored, Duration::from_secs(60)).await;
    let joined = all_timers(&restored[3].addr).await;
    assert_eq!(joined.len(), before.len() + 1);
}

fn batch_one(ns: &str, id: &str, at: i64) -> pb::ScheduleRequest {
    pb::ScheduleRequest {
        namespace: ns.into(),
        id: id.into(),
        when: crate::harness::at(at),
        payload: id.as_bytes().to_vec(),
        ..Default::default()
    }
}

/// Waits until `n` timers of `namespace` are FIRED; returns them.
async fn wait_fired_in(
    c: &mut TimersClient<tonic::transport::Channel>,
    namespace: &str,
    n: usize,
) -> Vec<pb::Timer> {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let fired = list_in(c, namespace, pb::TimerState::Fired).await;
        if fired.len() >= n {
            return fired;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} of {n} fired in {namespace}",
            fired.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
