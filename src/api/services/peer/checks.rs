//! What openraft only asserts (or panics on) in a peer's message, checked before it gets
//! there: bytes from the network never stop this node's Raft.

use openraft::raft::AppendEntriesRequest;
use openraft_legacy::network_v1::InstallSnapshotRequest;
use tonic::Status;

use crate::raft_types::{LogId, TypeConfig};

/// The entries of an AppendEntries follow `prev_log_id` one index at a time, with terms that
/// never go down and none past the sender's vote. openraft only asserts this in debug builds
/// (a panic of its core; in release the entries were taken and the log's order broken): bytes
/// from the network are checked here instead.
pub(super) fn check_entries(rpc: &AppendEntriesRequest<TypeConfig>) -> Result<(), Status> {
    let bad = |why: String| Err(Status::invalid_argument(format!("AppendEntries: {why}")));
    let (mut index, mut term) = match rpc.prev_log_id {
        Some(p) => match p.index.checked_add(1) {
            Some(next) => (next, p.leader_id.term),
            None => return bad("prev_log_id is the last index there is".into()),
        },
        None => (0, 0),
    };
    let vote_term = rpc.vote.leader_id().term;
    for (i, entry) in rpc.entries.iter().enumerate() {
        let id = entry.log_id;
        if id.index != index {
            return bad(format!(
                "entry {i} has index {}, not {index} (after {:?})",
                id.index, rpc.prev_log_id
            ));
        }
        if id.leader_id.term < term || id.leader_id.term > vote_term {
            return bad(format!(
                "entry {i} has term {}, before the previous entry's {term} or past the vote's \
                 {vote_term}",
                id.leader_id.term
            ));
        }
        term = id.leader_id.term;
        index = match index.checked_add(1) {
            Some(next) => next,
            None => return bad("entries past the last index there is".into()),
        };
    }
    Ok(())
}

/// A snapshot's last log id is within its sender's leadership, and one past this node's commit
/// is at a later index. openraft 0.10 panics (in release builds too) on a snapshot that breaks
/// either — a forged or corrupted one — and a panic stops this node's Raft: bytes from the
/// network are checked here instead. (A commit that moves on between this check and the
/// install can only meet a snapshot that breaks the second rule if the snapshot is forged.)
pub(super) fn check_snapshot(
    rpc: &InstallSnapshotRequest<TypeConfig>,
    committed: Option<LogId>,
) -> Result<(), Status> {
    let bad = |why: String| Err(Status::invalid_argument(format!("InstallSnapshot: {why}")));
    let Some(last) = rpc.meta.last_log_id else {
        return Ok(());
    };
    if last.leader_id > rpc.vote.leader_id {
        return bad(format!(
            "the snapshot ends at {last}, past the sender's vote {}",
            rpc.vote
        ));
    }
    if let Some(c) = committed.filter(|c| last > *c && last.index <= c.index) {
        return bad(format!(
            "the snapshot ends at {last}, after this node's commit {c} but not at a later index"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft_types::{log_id, Entry, Vote};
    use openraft::EntryPayload;

    fn append(
        prev: Option<(u64, u64)>,
        entries: &[(u64, u64)],
    ) -> AppendEntriesRequest<TypeConfig> {
        let id = |(term, index)| log_id(term, 1, index);
        AppendEntriesRequest {
            vote: Vote::new_committed(5, 1),
            prev_log_id: prev.map(id),
            entries: entries
                .iter()
                .map(|e| Entry {
                    log_id: id(*e),
                    payload: EntryPayload::Blank,
                })
                .collect(),
            leader_commit: None,
        }
    }

    /// Review of issue 33's change: what openraft only debug-asserts is refused, and no index
    /// arithmetic on a peer's numbers can overflow.
    #[test]
    fn entries_that_do_not_follow_their_predecessor_are_refused() {
        assert!(check_entries(&append(None, &[(1, 0), (1, 1), (3, 2)])).is_ok());
        assert!(check_entries(&append(Some((2, 7)), &[(2, 8), (5, 9)])).is_ok());
        assert!(check_entries(&append(Some((2, 7)), &[])).is_ok());
        for (prev, entries) in [
            (None, vec![(1, 1)]),
            (Some((2, 7)), vec![(2, 9)]),
            (Some((2, 7)), vec![(2, 8), (1, 9)]),
            (Some((2, 7)), vec![(6, 8)]),
            (Some((2, u64::MAX)), vec![(2, 0)]),
            (Some((2, u64::MAX - 1)), vec![(2, u64::MAX), (2, 0)]),
        ] {
            let e = check_entries(&append(prev, &entries)).unwrap_err();
            assert_eq!(
                e.code(),
                tonic::Code::InvalidArgument,
                "{prev:?} {entries:?}"
            );
        }
    }

    fn snapshot(vote_term: u64, last: Option<(u64, u64)>) -> InstallSnapshotRequest<TypeConfig> {
        InstallSnapshotRequest {
            vote: Vote::new_committed(vote_term, 1),
            meta: openraft_legacy::network_v1::SnapshotMeta {
                last_log_id: last.map(|(term, index)| log_id(term, 1, index)),
                last_membership: Default::default(),
                snapshot_id: "s".into(),
            },
            offset: 0,
            data: Vec::new(),
            done: true,
        }
    }

    /// What openraft 0.10 panics on (release builds too) is refused before it gets there.
    #[test]
    fn snapshots_past_the_vote_or_the_commit_are_refused() {
        let committed = Some(log_id(3, 1, 100));
        for ok in [
            None,
            Some((5, 101)),
            Some((3, 100)),
            Some((3, 50)),
            Some((2, 200)),
        ] {
            assert!(
                check_snapshot(&snapshot(5, ok), committed).is_ok(),
                "{ok:?}"
            );
        }
        assert!(check_snapshot(&snapshot(5, Some((5, 7))), None).is_ok());
        for bad in [
            Some((6, 101)),
            Some((5, 100)),
            Some((4, 100)),
            Some((4, 99)),
        ] {
            let e = check_snapshot(&snapshot(5, bad), committed).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad:?}");
        }
    }
}
