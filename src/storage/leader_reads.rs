//! What the leader's workers ask of the applied state: when the fire driver must next propose
//! (`next_due`), what a lease handed out (`leased`, for the dispatcher to send), what is still in
//! flight under a previous leader's leases, whether a namespace has READY timers, and how far the
//! purger may purge or pass. Each question is answered from one RocksDB snapshot, like every
//! read of [`Store`]; a worker decides what to propose from the answer, and apply checks again.

use rocksdb::{Direction, IteratorMode, ReadOptions};

use super::meta::NsMeta;
use super::read::{slot_of_key, Reader};
use super::row::{derive, header, Lease, Row};
use super::store::{Snap, Store};
use super::{cf, decode, prefix_end, CF_DEADLINES, CF_LEASES, CF_NSMETA};
use crate::command::Granted;
use crate::keys;
use crate::timer::Timer;
use crate::wheel::Slot;
use crate::{Error, Result};

impl Store {
    /// The timers a lease handed out, still in flight under it (each with its attempt in
    /// `attempts`), in slot order.
    pub fn leased(&self, g: &Granted) -> Result<Vec<Timer>> {
        let mut snap = Snap::new(&self.db, self.space)?;
        let mut rows = Vec::new();
        let mut iter = snap.reader.rows_between(&g.namespace, g.from, g.to);
        while let (Some(k), Some(v)) = (iter.key(), iter.value()) {
            if header(v)?.0.deliverable() {
                rows.push((slot_of_key(k)?, Row::decode(v)?));
            }
            iter.next();
        }
        iter.status()?;
        drop(iter);
        let mut out = Vec::with_capacity(rows.len());
        for (slot, row) in rows {
            let t = derive(&g.namespace, slot, &row, &mut snap)?;
            if t.phase == crate::timer::Phase::InFlight {
                out.push(t);
            }
        }
        Ok(out)
    }

    /// Deliveries of `namespace` still in flight at `now_ms` under leases made before
    /// `before_ms` (by a previous leader): open leases whose deadline has not passed, each
    /// counted whole (a delivery of one acked alone is still counted until its deadline).
    /// The open leases are the `deadlines` family, in deadline order.
    pub fn in_flight_before(&self, namespace: &str, before_ms: i64, now_ms: i64) -> Result<u64> {
        let start = self.space.deadline_bound((now_ms.max(0) as u64) + 1);
        let mut opts = ReadOptions::default();
        opts.set_iterate_upper_bound(prefix_end(&self.space.prefix()));
        let iter = self.db.iterator_cf_opt(
            cf(&self.db, CF_DEADLINES),
            opts,
            IteratorMode::From(&start, Direction::Forward),
        );
        let mut n = 0u64;
        for item in iter {
            let (k, _) = item?;
            let Some((_, ns, to)) = keys::decode_deadline_key(&k) else {
                continue;
            };
            if ns != namespace {
                continue;
            }
            let raw = self
                .db
                .get_cf(cf(&self.db, CF_LEASES), self.space.slot_key(&ns, to))?;
            let Some(raw) = raw else { continue };
            let lease: Lease = decode(&raw)?;
            if lease.settled.is_none() && lease.delivered_at_ms < before_ms {
                n += lease.count as u64;
            }
        }
        Ok(n)
    }

    /// Whether `namespace` has a fired timer waiting for a consumer (READY).
    pub fn has_ready(&self, namespace: &str) -> Result<bool> {
        let mut snap = Snap::new(&self.db, self.space)?;
        let from = snap.ns(namespace)?.delivered_to;
        let cursor = snap.cursor;
        if from >= cursor {
            return Ok(false);
        }
        let mut iter = snap.reader.rows_between(namespace, from, cursor);
        while let Some(v) = iter.value() {
            if header(v)?.0.deliverable() {
                return Ok(true);
            }
            iter.next();
        }
        iter.status()?;
        Ok(false)
    }

    /// Whether the deadline floor holds: no deadline in the database lies below it
    /// (`floor.rs`). The apply fuzzer asks after every entry: a floor too high shows here at
    /// once, long before the lease it hides fails to expire.
    pub fn check_deadline_floor(&self) -> std::result::Result<(), String> {
        let floor = self.deadline_floor.get();
        let reader = Reader::live(&self.db, self.space);
        let group = self.space.prefix();
        let iter = reader.iter(CF_DEADLINES, group.to_vec(), Some(prefix_end(&group)));
        let first = iter.key().and_then(keys::decode_deadline_key);
        match first {
            Some((at, ns, _)) if (at.max(0) as u64) < floor => Err(format!(
                "the deadline floor {floor} is above a live deadline {at} (namespace {ns})"
            )),
            _ => Ok(()),
        }
    }

    /// When the fire driver must next propose a Fire: the earliest bucket a row waits in after
    /// the cursor, or the earliest lease deadline; `None` when nothing waits.
    pub fn next_due(&self) -> Result<Option<i64>> {
        // Both under the heads' lock, which apply holds while it updates them: an entry that
        // lowered either either did so before this read, or reads the driver's target (`MAX`
        // while it looks) after it, and wakes it to look again.
        let (head, floor) = {
            let heads = self.heads.lock().unwrap_or_else(|p| p.into_inner());
            let head = heads.first().map(|slot| self.wheel().due_ms(slot.bucket));
            (head, self.deadline_floor.get())
        };
        let reader = Reader::live(&self.db, self.space);
        let floor = self.space.deadline_bound(floor);
        let upper = prefix_end(&self.space.prefix());
        let iter = reader.iter(CF_DEADLINES, floor, Some(upper));
        iter.status()?;
        let deadline = match iter.key() {
            Some(k) => Some(
                keys::decode_deadline_key(k)
                    .ok_or_else(|| Error::Storage("corrupt deadline key".into()))?
                    .0,
            ),
            None => None,
        };
        Ok([head, deadline].into_iter().flatten().min())
    }

    /// Per namespace with timers: how far a purge may go now (`through`, rows), for the
    /// leader's purger: rows finished a retention ago, and at least `floor` ago. (Apply checks
    /// the retention only: the floor is the proposer's, so a node with another floor still
    /// applies the same.)
    pub fn purgeable(
        &self,
        now_ms: i64,
        floor: std::time::Duration,
        max_rows: u64,
    ) -> Result<Vec<(String, Slot, u64)>> {
        let mut out = Vec::new();
        for (ns, m) in self.namespace_metas()? {
            if m.purged_to >= m.delivered_to {
                continue;
            }
            let retention = (self.namespace(&ns)?.policy.retention_ms)
                .max(u64::try_from(floor.as_millis()).unwrap_or(u64::MAX));
            let found = super::purge::purgeable_through(
                &self.db,
                self.space,
                &ns,
                m.purged_to,
                retention,
                now_ms,
                max_rows,
            )?;
            if let Some((through, rows)) = found {
                out.push((ns, through, rows));
            }
        }
        Ok(out)
    }

    /// The namespaces whose delivery cursor could pass finished rows: the first row after it
    /// (behind the fire cursor) is finished (acked late, cancelled, dead, expired). A Fire
    /// entry passes such rows for the namespaces whose rows it fires; the purger asks for the
    /// rest (a grant of room 0), or they would never be purged. Read from one snapshot.
    pub fn passable(&self) -> Result<Vec<String>> {
        let snap = Snap::new(&self.db, self.space)?;
        let mut out = Vec::new();
        let group = self.space.prefix();
        let mut names = snap
            .reader
            .iter(CF_NSMETA, group.to_vec(), Some(prefix_end(&group)));
        let mut metas = Vec::new();
        while let (Some(k), Some(v)) = (names.key(), names.value()) {
            metas.push((k.to_vec(), decode::<NsMeta>(v)?));
            names.next();
        }
        names.status()?;
        drop(names);
        for (k, m) in metas {
            let ns = keys::decode_nsmeta_key(&k)
                .ok_or_else(|| Error::Storage("corrupt namespace name".into()))?;
            let cursor = snap.cursor;
            if m.delivered_to >= cursor {
                continue;
            }
            let iter = snap.reader.rows_between(&ns, m.delivered_to, cursor);
            if let Some(v) = iter.value() {
                if !super::row::header(v)?.0.deliverable() {
                    out.push(ns);
                }
            }
            iter.status()?;
        }
        Ok(out)
    }

    /// Every namespace's meta (`nsmeta`), in key order (by hash slot, then name).
    pub(super) fn namespace_metas(&self) -> Result<Vec<(String, NsMeta)>> {
        let mut out = Vec::new();
        let group = self.space.prefix();
        for item in self.db.prefix_iterator_cf(cf(&self.db, CF_NSMETA), group) {
            let (k, v) = item?;
            if !k.starts_with(&group) {
                break;
            }
            let ns = keys::decode_nsmeta_key(&k)
                .ok_or_else(|| Error::Storage("corrupt namespace name".into()))?;
            out.push((ns, decode(&v)?));
        }
        Ok(out)
    }
}
