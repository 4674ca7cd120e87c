//! Admission before proposing (DESIGN 10: every per-entry bound is checked before the entry is
//! proposed): each new timer's payload against its namespace's limit, then its namespace's
//! schedule rate. Each namespace's policy is read once per call, as this leader applied it,
//! and the same read serves both checks.
//!
//! Rate tokens are taken all or none: a call whose second namespace is out of tokens gives the
//! first its tokens back. The buckets fill from when the quorum watch first saw this node lead
//! ([`super::quorum::Tenure`]: after its election, within a metrics change), empty then, as
//! `cluster::limits` asks; the dispatch buckets start a little later, at the dispatcher's
//! first plan.

use openraft::async_runtime::WatchReceiver as _;
use std::collections::HashMap;

use super::Node;
use crate::namespace::Policy;
use crate::timer::KeyRef;
use crate::{Error, Result};

impl Node {
    /// Admits new timers, each given as its key and its payload's size: refuses the first
    /// payload over its namespace's limit, then takes every namespace's schedule-rate tokens
    /// or refuses with the wait.
    pub(super) fn admit<'a>(
        &self,
        timers: impl IntoIterator<Item = (KeyRef<'a>, usize)>,
    ) -> Result<()> {
        // Namespace → (its policy, how many new timers it gets).
        let mut per_ns: HashMap<&'a str, (Policy, usize)> = HashMap::new();
        for (key, len) in timers {
            let ns = key.namespace;
            let (policy, n) = match per_ns.get_mut(ns) {
                Some(entry) => entry,
                None => {
                    let policy = self.store.namespace(ns)?.policy;
                    per_ns.entry(ns).or_insert((policy, 0))
                }
            };
            let limit = policy.max_payload_bytes;
            if len > limit as usize {
                return Err(Error::ResourceExhausted(format!(
                    "payload of {key} is {len} bytes; namespace {ns} allows {limit}"
                )));
            }
            *n += 1;
        }
        let term = self.raft.metrics().borrow_watched().current_term;
        let now_ms = self.now_ms();
        let since = self.tenure.since(term).unwrap_or(now_ms);
        let mut taken = Vec::with_capacity(per_ns.len());
        for (ns, (policy, n)) in &per_ns {
            let took = (self.schedule_tokens).take(ns, *n, policy, (term, since), now_ms);
            if let Err(e) = took {
                crate::metrics::schedule_throttled(ns);
                for (ns, policy, n) in taken {
                    self.schedule_tokens.refund(ns, n, policy, term);
                }
                return Err(e);
            }
            taken.push((*ns, policy, *n));
        }
        Ok(())
    }
}
