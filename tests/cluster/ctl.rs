//! `timerctl` against real `timerd` processes: the cluster table, `--output json` on each kind
//! of command, and the errors a person sees when the endpoint is down or no leader exists.

use std::process::{Command, Output};

use serde_json::Value;
use tempfile::TempDir;

use crate::process::*;

fn ctl(endpoint: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_timerctl"))
        .args(["--endpoint", endpoint])
        .args(args)
        .output()
        .expect("run timerctl")
}

/// Runs a command that must succeed and print one JSON document.
pub(crate) fn ctl_json(endpoint: &str, args: &[&str]) -> Value {
    let out = ctl(endpoint, &[&["--output", "json"], args].concat());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "timerctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{args:?} printed {stdout:?}: {e}"))
}

fn text(out: &Output) -> (String, String) {
    let s = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (s(&out.stdout), s(&out.stderr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timerctl_tables_json_and_helpful_errors() {
    let tmp = TempDir::new().unwrap();
    let (mut procs, _) = start_three(&tmp);
    let l = leader(&procs).await;
    let ep = procs[(l + 1) % 3].addr.clone();
    // A leader is elected by two votes: the third node may not have had its first
    // AppendEntries yet (it then knows no members and calls itself a learner of term 0).
    // The table is of a formed cluster, so wait until both others follow.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    for p in procs.iter().filter(|p| p.addr != procs[l].addr) {
        while status(&p.addr).await.is_none_or(|s| s.role != "follower") {
            assert!(
                std::time::Instant::now() < deadline,
                "{} never followed",
                p.addr
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    // Phase 1: the whole cluster as a table, from a follower.
    let (out, err) = text(&ctl(&ep, &["status"]));
    let rows: Vec<&str> = out.lines().collect();
    assert!(rows[0].contains("ID") && rows[0].contains("LAG") && rows[0].contains("PENDING"));
    assert_eq!(
        rows.iter().filter(|r| r.contains(" leader ")).count(),
        1,
        "{out}{err}"
    );
    assert_eq!(
        rows.iter().filter(|r| r.contains(" follower ")).count(),
        2,
        "{out}"
    );
    // The summary names the node the table shows leading (sampled with it: an election just
    // after start may have moved leadership since `leader` looked).
    let led = rows
        .iter()
        .find(|r| r.contains(" leader "))
        .and_then(|r| r.split_whitespace().next())
        .expect("a leader row")
        .trim_matches(|c: char| !c.is_ascii_digit())
        .to_string();
    assert!(
        led.parse::<u64>().is_ok_and(|id| (1..=3).contains(&id)),
        "{out}"
    );
    assert!(
        rows.last()
            .unwrap()
            .starts_with(&format!("leader: node {led}")),
        "{out}"
    );
    let l = leader(&procs).await;

    // Phase 2: --output json on each kind of command.
    let st = ctl_json(&ep, &["status"]);
    assert_eq!(st["leader"], l as u64 + 1);
    assert_eq!(st["nodes"].as_array().unwrap().len(), 3);
    assert!(st["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .all(|n| n["lag"].is_u64()));
    let s = ctl_json(
        &ep,
        &["schedule", "ctl", "a", "--in", "1h", "--payload", "hi"],
    );
    assert_eq!(s["result"], "scheduled");
    assert_eq!(s["timer"]["state"], "PENDING");
    assert_eq!(s["timer"]["payload"], "hi");
    let list = ctl_json(&ep, &["list", "ctl"]);
    assert_eq!(list["timers"].as_array().unwrap().len(), 1);
    let c = ctl_json(&ep, &["cancel", "ctl", "a"]);
    assert_eq!(c["timer"]["state"], "CANCELLED");
    let members = ctl_json(&ep, &["member", "list"]);
    assert_eq!(members["members"].as_array().unwrap().len(), 3);
    let ns = ctl_json(&ep, &["namespace", "get", "ctl"]);
    assert_eq!(ns["name"], "ctl");
    assert!(ns["policy"]["max_attempts"].as_u64().unwrap() > 0);
    let st = ctl_json(&ep, &["status"]);
    let pending: u64 = (st["nodes"].as_array().unwrap().iter())
        .map(|n| n["pending"].as_u64().unwrap())
        .max()
        .unwrap();
    assert_eq!(pending, 0);

    // Phase 3: a failure in JSON is a structured error on stderr, exit status 1.
    let out = ctl(&ep, &["--output", "json", "get", "ctl", "nope"]);
    assert_eq!(out.status.code(), Some(1));
    let e: Value = serde_json::from_slice(&out.stderr).unwrap();
    assert_eq!(e["error"]["code"], "NotFound");

    // Phase 4: an endpoint with nothing behind it.
    let (_, err) = text(&ctl("127.0.0.1:1", &["status"]));
    assert!(
        err.contains("cannot reach a timerdb node at http://127.0.0.1:1"),
        "{err}"
    );
    assert!(
        err.contains("Connection refused") && err.contains("hint:"),
        "{err}"
    );

    // Phase 5: no leader (two of three voters killed): the table says so, writes explain why.
    let alive = (l + 1) % 3;
    for (i, p) in procs.iter_mut().enumerate() {
        if i != alive {
            p.child.take().unwrap().kill().unwrap();
        }
    }
    let (out, _) = text(&ctl(&ep, &["status"]));
    assert_eq!(out.matches("unreachable").count(), 2, "{out}");
    assert!(out.contains("no leader answers"), "{out}");
    let fail = ctl(&ep, &["schedule", "ctl", "b", "--in", "1h"]);
    let (_, err) = text(&fail);
    assert_eq!(fail.status.code(), Some(1));
    assert!(
        err.contains("Unavailable") && err.contains("no leader"),
        "{err}"
    );
    assert!(err.contains("timerctl status"), "no hint: {err}");
}
