//! The fuzz targets: each a function from bytes to a verdict that must never panic, abort or
//! disagree with itself. What each feeds the bytes to, and the seeds it starts from.

use std::sync::Arc;

use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, VoteRequest, VoteResponse};
use openraft::EntryPayload;
use openraft_legacy::network_v1::InstallSnapshotRequest;
use prost::Message;
use timerdb::api::pb;
use timerdb::command::Command;
use timerdb::config::Limits;
use timerdb::raft_types::{log_id, Entry, TypeConfig, Vote};
use timerdb::storage::{decode, encode};
use timerdb::timer::{TimerKey, TimerSpec, When};

pub use crate::apply::Verdict;

/// Which targets exist.
pub const TARGETS: [&str; 4] = ["peer", "backup", "convert", "apply"];

pub fn run(target: &str, input: &[u8]) -> Verdict {
    match target {
        "peer" => peer(input),
        "backup" => backup(input),
        "convert" => convert(input),
        "apply" => crate::apply::run(input),
        other => Err(format!("no target {other}")),
    }
}

/// The first words of an error, without numbers or quoted values: its class (coarse, so the
/// corpus keeps a few hundred inputs, not one per length or name).
fn class(e: impl std::fmt::Display) -> String {
    class_of(e, 2)
}

fn class_of(e: impl std::fmt::Display, words: usize) -> String {
    let text = e.to_string();
    let words: Vec<String> = text
        .split_whitespace()
        // Plain words only: values (names, ids, numbers) would make every input a class.
        .filter(|w| {
            w.chars()
                .all(|c| c.is_ascii_lowercase() || "_-:,".contains(c))
        })
        .take(words)
        .map(str::to_string)
        .collect();
    words.join(" ")
}

fn outcome<T>(r: timerdb::Result<T>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => class(e),
    }
}

/// The peer message decoder: bytes as every message a peer sends or answers.
fn peer(input: &[u8]) -> Verdict {
    // bincode's errors name what it was reading: three words tell the kinds apart.
    fn o<T>(r: timerdb::Result<T>) -> String {
        r.map_or_else(|e| class_of(e, 3), |_| "ok".into())
    }
    let mut classes = vec![
        o(decode::<VoteRequest<TypeConfig>>(input)),
        o(decode::<AppendEntriesRequest<TypeConfig>>(input)),
        o(decode::<InstallSnapshotRequest<TypeConfig>>(input)),
        o(decode::<u64>(input)),
        o(decode::<VoteResponse<TypeConfig>>(input)),
        o(decode::<AppendEntriesResponse<TypeConfig>>(input)),
    ];
    // Whatever decodes must survive a round trip: its encoding decodes to a value with the
    // same encoding. (Not the input's bytes: a varint may come in a longer form than the one
    // encoding writes, and means the same.)
    if let Ok(v) = decode::<AppendEntriesRequest<TypeConfig>>(input) {
        let once = encode(&v);
        match decode::<AppendEntriesRequest<TypeConfig>>(&once) {
            Ok(again) if encode(&again) == once => {}
            Ok(_) => return Err("an AppendEntries changed in a round trip".into()),
            Err(e) => {
                return Err(format!(
                    "an AppendEntries does not decode its own encoding: {e}"
                ))
            }
        }
    }
    classes.dedup();
    Ok(classes.join("|"))
}

/// The backup/snapshot reader: the bytes as a file.
fn backup(input: &[u8]) -> Verdict {
    let dir = crate::Scratch::new()?;
    let path = dir.path().join("b.tdb");
    std::fs::write(&path, input).map_err(|e| e.to_string())?;
    Ok(outcome(timerdb::storage::restore::inspect(&path)))
}

/// Protobuf → domain: every request message the validation reads.
fn convert(input: &[u8]) -> Verdict {
    let l = Limits::default();
    let mut out = Vec::new();
    let mut push = |r: Result<String, String>| out.push(r.unwrap_or_else(|e| e));
    use timerdb::api::convert as c;
    push(decoded::<pb::ScheduleRequest>(input, |m| {
        outcome(c::spec(m, &l))
    }));
    push(decoded::<pb::ScheduleRequest>(input, |m| {
        match m.recurrence {
            Some(_) => outcome(timerdb::api::convert::recurring::recurring_spec(m, &l)),
            None => "one-shot".into(),
        }
    }));
    push(decoded::<pb::ScheduleBatchRequest>(input, |m| {
        outcome(c::specs(m, &l))
    }));
    push(decoded::<pb::ListRequest>(input, |m| {
        outcome(c::list_query(m, &l))
    }));
    push(decoded::<pb::RedriveRequest>(input, |m| {
        outcome(c::redrive_target(m, &l))
    }));
    push(decoded::<pb::AckBatchRequest>(input, |m| {
        outcome(c::acks(m, &l))
    }));
    push(decoded::<pb::PutNamespaceRequest>(input, |m| {
        outcome(timerdb::api::convert::policy::namespace_put(m, &l))
    }));
    push(decoded::<pb::SubscribeRequest>(input, |m| {
        outcome(timerdb::api::services::subscribe::validate(m.clone(), &l))
    }));
    push(decoded::<pb::CreateKeyRequest>(input, |m| {
        let roles: Vec<_> = m
            .roles
            .iter()
            .map(|r| timerdb::auth::Role::parse(r))
            .collect();
        format!("{}", roles.iter().filter(|r| r.is_ok()).count())
    }));
    // The class: how many messages it decodes as, and what the first of them made of it
    // (every combination would be a class of its own: too many to guide anything).
    let decodable: Vec<&String> = out.iter().filter(|o| *o != "undecodable").collect();
    let first = decodable.first().map_or("-", |s| s.as_str());
    Ok(format!("{} {first}", decodable.len()))
}

fn decoded<M: Message + Default>(
    input: &[u8],
    f: impl FnOnce(&M) -> String,
) -> Result<String, String> {
    match M::decode(input) {
        Ok(m) => Ok(f(&m)),
        Err(_) => Err("undecodable".into()),
    }
}

/// Valid inputs of each target to start from.
pub fn seeds(target: &str) -> Vec<Vec<u8>> {
    let spec = |id: &str, at: i64| TimerSpec {
        key: TimerKey::new("orders", id),
        when: When::At(at),
        payload: b"payload".to_vec(),
        content_type: String::new(),
    };
    match target {
        "peer" => {
            let entry = |i: u64, cmd: Command| Entry {
                log_id: log_id(3, 1, i),
                payload: EntryPayload::Normal(Arc::new(cmd)),
            };
            let append = AppendEntriesRequest::<TypeConfig> {
                vote: Vote::new_committed(3, 1),
                prev_log_id: Some(log_id(3, 1, 9)),
                entries: vec![
                    entry(
                        10,
                        Command::LegacySchedule {
                            now_ms: 1,
                            spec: spec("a", 5),
                        },
                    ),
                    entry(
                        11,
                        Command::ScheduleBatch {
                            now_ms: 2,
                            specs: vec![spec("b", 6), spec("c", 7)].into(),
                        },
                    ),
                ],
                leader_commit: Some(log_id(3, 1, 9)),
            };
            vec![
                encode(&append),
                encode(&VoteRequest::<TypeConfig>::new(Vote::new(4, 2), None)),
                encode(&7u64),
            ]
        }
        "backup" => crate::apply::seed_backup(),
        "convert" => vec![
            pb::ScheduleRequest {
                namespace: "orders".into(),
                id: "o-1".into(),
                when: Some(pb::schedule_request::When::DelayMs(1000)),
                payload: b"x".to_vec(),
                content_type: "application/json".into(),
                ..Default::default()
            }
            .encode_to_vec(),
            pb::PutNamespaceRequest {
                name: "orders".into(),
                policy: Some(pb::NamespacePolicy {
                    max_attempts: 3,
                    ..Default::default()
                }),
            }
            .encode_to_vec(),
            pb::ListRequest {
                namespace: "orders".into(),
                limit: 10,
                page_token: "6f2d31".into(),
                ..Default::default()
            }
            .encode_to_vec(),
        ],
        "apply" => crate::program::seed_programs(),
        _ => Vec::new(),
    }
}
