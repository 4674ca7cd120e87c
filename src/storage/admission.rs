//! Admission: what a node that holds nothing (started with `--join`, or wiped) takes from
//! whom, before it knows the members that would tell a peer from a stranger.
//!
//! Such a node has no membership, so `--peer-require-member` cannot say who may call it, and
//! without it anyone can. Yet the first Raft call it takes decides a lot: its bucket width, a
//! vote it persists, entries it appends. Left open, a node of another cluster that still has
//! this address among its members, or a removed leader that still runs (a zombie, which holds
//! the old membership with this node in it and counts it towards a quorum), would reach it
//! before the real leader does and lock that one out or commit through it (issue 33 review
//! F2). So:
//!
//! - it takes the width, and the right to send it Raft calls, only from a `Hello` — the call
//!   `AddNode` makes before it adds a node — which names the adding leader's term; the latest
//!   `Hello` wins while the node holds nothing, so whoever adds it last is heard;
//! - until it has a membership it refuses AppendEntries, Vote and InstallSnapshot without a
//!   `Hello` first, or from a leader of an older term than the `Hello`'s (a zombie's);
//! - after the `Hello` and before its first entries it votes for nobody: it becomes a learner
//!   first, and a removed voter still campaigning (its term climbing past the `Hello`'s) would
//!   otherwise win a vote it persists and depose the leader adding it;
//! - the admitted term is kept in the log's column family (node-local, like the vote), so a
//!   restart between the `Hello` and the first entry keeps it; one per group, since each
//!   group's leader adds the node in its own term (`Groups.Hello` for a data group).
//!
//! What this does not stop: a holder of a peer-CA certificate that means harm can send its own
//! `Hello`. The peer CA is the trust boundary (docs/security.md).

use super::{cf, codec, meta, Store, CF_META, CF_RAFT};
use crate::{Error, Result};

/// Key (in `CF_RAFT`) of the term of the latest `Hello` this node took while it held nothing.
const ADMITTED: &[u8] = b"admitted_term";

impl Store {
    /// This group's key of the admitted term: each group is added by its own leader, of its
    /// own term (a data group's `Hello` is `Groups.Hello`); group 0's key is the one builds
    /// before groups wrote.
    fn admitted_key(&self) -> Vec<u8> {
        let mut key = ADMITTED.to_vec();
        if self.space.group != crate::keys::GROUP_ZERO {
            key.extend_from_slice(&self.space.group.to_be_bytes());
        }
        key
    }

    /// The term of the latest `Hello` taken while this node held nothing (None: none yet).
    pub fn admitted(&self) -> Result<Option<u64>> {
        match self.db.get_cf(cf(&self.db, CF_RAFT), self.admitted_key())? {
            Some(v) => Ok(Some(codec::decode(&v)?)),
            None => Ok(None),
        }
    }

    /// A `Hello` of a leader at `term` whose cluster's width is `width_ms` (0: a build before
    /// the width header), from `from`. While nothing is applied it replaces the width this node
    /// took from an earlier `Hello`; a width of its own (`--bucket-ms`, or data) must match.
    /// `pinned`: the width is this node's own (`--bucket-ms`), never replaced.
    pub fn admit(&self, width_ms: u64, term: u64, from: &str, pinned: bool) -> Result<()> {
        let last_applied = self.space.meta_key(meta::LAST_APPLIED);
        let applied = self.db.get_cf(cf(&self.db, CF_META), last_applied)?;
        let holds_nothing = match applied {
            Some(v) => codec::decode::<Option<crate::raft_types::LogId>>(&v)?.is_none(),
            None => true,
        };
        let mine = self.width_ms();
        if width_ms != 0 && mine != width_ms {
            // A width an earlier Hello gave may be replaced while nothing is applied; one of
            // this node's own (--bucket-ms, or its data) may not.
            let replaceable = mine == 0 || (!pinned && holds_nothing && self.admitted()?.is_some());
            if !replaceable {
                return Err(Error::FailedPrecondition(super::store::width_mismatch(
                    mine, width_ms, from,
                )));
            }
            self.db.put_cf_opt(
                cf(&self.db, CF_META),
                meta::BUCKET_MS,
                codec::encode(&width_ms),
                &super::synced(),
            )?;
            self.set_width(width_ms);
            tracing::info!(
                bucket_ms = width_ms,
                from,
                "took the cluster's bucket width"
            );
        }
        // Synced: the log no longer shares this database's WAL, and a restart must keep it.
        self.db.put_cf_opt(
            cf(&self.db, CF_RAFT),
            self.admitted_key(),
            codec::encode(&term),
            &super::synced(),
        )?;
        Ok(())
    }
}

impl Store {
    /// Takes the bucket width the data dir records, or records the one given; refuses one
    /// given that differs from the recorded (`StateMachine::open` checks the same, for each
    /// group). Called at open before anything decides a width, so a restart without
    /// `--bucket-ms` keeps the cluster's.
    pub fn settle_width(&self) -> Result<()> {
        super::state_machine::check_bucket_width(self)
    }

    /// The number of data groups this data dir belongs to must be `asked` (`--groups`): a new
    /// data dir records it (synced); one that records another number is refused, as is one
    /// that holds a single-group cluster's state (no record, entries applied) asked for data
    /// groups: a running cluster gains groups by moving hash slots (docs/sharding.md §6), not
    /// by a flag at a restart.
    pub fn settle_groups(&self, asked: u16) -> Result<()> {
        let recorded = self.recorded_groups()?;
        let holds_state = self.meta()?.last_applied.is_some();
        let found = match recorded {
            Some(n) => n,
            None if holds_state => 0,
            None => {
                let mut batch = rocksdb::WriteBatch::default();
                let meta_cf = cf(&self.db, CF_META);
                batch.put_cf(meta_cf, meta::GROUPS, codec::encode(&asked));
                if asked > 0 {
                    // A build before groups must not open it (it would serve group 0 alone).
                    let format = codec::encode(&super::SHARDED_FORMAT);
                    batch.put_cf(meta_cf, meta::FORMAT, format);
                }
                self.db.write_opt(batch, &super::synced())?;
                self.sharded
                    .store(asked > 0, std::sync::atomic::Ordering::Release);
                return Ok(());
            }
        };
        self.sharded
            .store(found > 0, std::sync::atomic::Ordering::Release);
        if found != asked {
            return Err(Error::InvalidArgument(format!(
                "this data dir belongs to a cluster of {found} data groups, not {asked}: a \
                 cluster's number of groups is fixed when it is created (start with --groups \
                 {found})"
            )));
        }
        Ok(())
    }

    /// The number of data groups the data dir records (`None`: none recorded).
    fn recorded_groups(&self) -> Result<Option<u16>> {
        match self.db.get_cf(cf(&self.db, CF_META), meta::GROUPS)? {
            Some(v) => Ok(Some(codec::decode(&v)?)),
            None => Ok(None),
        }
    }

    /// Takes whether the cluster has data groups from the data dir's record, as a state
    /// machine opens: what apply composes fire tokens by (`Applier::fire_token`) comes from
    /// the data dir itself, whoever opens it, never from a flag.
    pub(super) fn load_groups(&self) -> Result<()> {
        let sharded = self.recorded_groups()?.is_some_and(|n| n > 0);
        self.sharded
            .store(sharded, std::sync::atomic::Ordering::Release);
        Ok(())
    }
}
