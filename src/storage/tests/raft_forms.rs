//! openraft's own types as this build stores them (the vote, log ids, entries, the membership
//! the state machine keeps), pinned as bytes: the openraft 0.10 port (docs/openraft-0.10.md,
//! C0a) must read every one of them back unchanged, or say which it cannot. Each must encode to
//! the pinned bytes and decode to the same value.

use std::collections::BTreeMap;

use openraft::{BasicNode, Membership};

use crate::raft_types::{StoredMembership, Vote};

use super::*;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `value` encodes to `want` (hex), and those bytes decode to a value that encodes to them
/// again (openraft's peer messages do not all compare).
fn pinned_message<T>(what: &str, value: &T, want: &str) -> T
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    let bytes = encode(value);
    assert_eq!(
        hex(&bytes),
        want,
        "{what}: the bytes this build writes changed"
    );
    let back: T = decode(&bytes).unwrap();
    assert_eq!(
        hex(&encode(&back)),
        want,
        "{what}: does not decode to itself"
    );
    back
}

/// As [`pinned_message`], and the value decoded is equal to `value`.
fn pinned<T>(what: &str, value: &T, want: &str)
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let back = pinned_message(what, value, want);
    assert_eq!(&back, value, "{what}: does not decode to itself");
}

fn membership() -> Membership<u64, BasicNode> {
    let nodes: BTreeMap<u64, BasicNode> = (1..=3)
        .map(|id| (id, BasicNode::new(format!("127.0.0.1:710{id}"))))
        .collect();
    Membership::new(vec![[1, 2].into_iter().collect()], nodes).unwrap()
}

#[test]
fn openraft_types_keep_their_bytes() {
    let log_id = crate::raft_types::log_id(3, 2, 42);
    pinned("vote", &Vote::new(3, 2), VOTE);
    pinned("committed vote", &Vote::new_committed(4, 1), COMMITTED_VOTE);
    pinned("log id", &Some(log_id), LOG_ID);
    pinned("no log id", &None::<LogId>, NO_LOG_ID);
    let blank: Entry = Entry {
        log_id,
        payload: EntryPayload::Blank,
    };
    pinned("blank entry", &blank, BLANK);
    let normal: Entry = Entry {
        log_id,
        payload: EntryPayload::Normal(Arc::new(Command::LegacyCancel {
            now_ms: 1_700_000_000_000,
            key: TimerKey::new("ns", "id"),
        })),
    };
    pinned("normal entry", &normal, NORMAL);
    let change: Entry = Entry {
        log_id,
        payload: EntryPayload::Membership(membership()),
    };
    pinned("membership entry", &change, MEMBERSHIP);
    let stored = StoredMembership::new(Some(log_id), membership());
    pinned("stored membership", &stored, STORED_MEMBERSHIP);
}

/// The peer messages, as this build sends them: 0.10 changes VoteRequest (a
/// `leadership_transfer` field), so a rolling upgrade needs these to translate
/// (docs/openraft-0.10.md R6).
#[test]
fn openraft_peer_messages_keep_their_bytes() {
    use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, VoteRequest, VoteResponse};
    let log_id = crate::raft_types::log_id(3, 2, 42);
    let append: AppendEntriesRequest<TypeConfig> = AppendEntriesRequest {
        vote: Vote::new_committed(3, 2),
        prev_log_id: Some(log_id),
        entries: vec![Entry {
            log_id: crate::raft_types::log_id(3, 2, 43),
            payload: EntryPayload::Blank,
        }],
        leader_commit: Some(log_id),
    };
    pinned_message("append entries", &append, APPEND);
    let answer: AppendEntriesResponse<TypeConfig> = AppendEntriesResponse::Success;
    pinned_message("append answer", &answer, APPEND_ANSWER);
    let vote: VoteRequest<TypeConfig> = VoteRequest::new(Vote::new(4, 1), Some(log_id));
    pinned_message("vote request", &vote, VOTE_REQUEST);
    // openraft 0.10 added `leadership_transfer` to the vote request: a 0.9 node's request does
    // not decode here (nor ours there), so the upgrade is a full stop (docs/operations.md).
    let old = (0..VOTE_REQUEST_09.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&VOTE_REQUEST_09[i..i + 2], 16).unwrap())
        .collect::<Vec<_>>();
    assert!(decode::<VoteRequest<TypeConfig>>(&old).is_err());
    let granted: VoteResponse<TypeConfig> = VoteResponse::new(Vote::new(4, 1), Some(log_id), true);
    pinned_message("vote answer", &granted, VOTE_ANSWER);
}

// As 0.9.25 writes them (bincode, variable-length integers), 2026-11-27, checked against a
// program built on openraft 0.9.25 alone; openraft 0.10 writes the same but for VOTE_REQUEST.
const VOTE: &str = "030200";
const COMMITTED_VOTE: &str = "040101";
const LOG_ID: &str = "0103022a";
const NO_LOG_ID: &str = "00";
const BLANK: &str = "03022a00";
const NORMAL: &str = "03022a0102fd00d0ca9f17030000026e73026964";
const MEMBERSHIP: &str = "03022a020102010203010e3132372e302e302e313a37313031020e3132372e302e302e313a37313032030e3132372e302e302e313a37313033";
const STORED_MEMBERSHIP: &str = "0103022a0102010203010e3132372e302e302e313a37313031020e3132372e302e302e313a37313032030e3132372e302e302e313a37313033";
const APPEND: &str = "0302010103022a0103022b000103022a";
const APPEND_ANSWER: &str = "00";
const VOTE_REQUEST: &str = "0401000103022a00";
const VOTE_REQUEST_09: &str = "0401000103022a";
const VOTE_ANSWER: &str = "040100010103022a";
