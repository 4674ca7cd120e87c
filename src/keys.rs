//! The state database's key layout (storage format 6): pure functions, no I/O.
//!
//! Every state-machine key starts with the **group** that owns it, then (in every family a
//! hash slot's rows live in) the **hash slot**, both u16 big-endian, so byte order is
//! (group, hash slot, …) order. A group's state is then one prefix per family (a snapshot is
//! that prefix, an install deletes it first), and a hash slot of a group is one range per
//! family (what a move copies and drops: docs/sharding.md §3, §6). With the group first, two
//! groups hosted on one node never share a key, even for the same hash slot.
//!
//! | family | key |
//! |---|---|
//! | `wheel` (rows) | `G H ns_len ns slot` |
//! | `index` | `G H ns_len ns id` |
//! | `leases` | `G H ns_len ns to` (a lease's end slot) |
//! | `deadlines` | `G deadline_ms H ns_len ns to`: one scan per group finds every expired lease |
//! | `fires` | `G H end` (the hash slot's cursor a Fire entry left) |
//! | `series` | `G H ns_len ns id` |
//! | `series_due` | `G slot H`: one scan per group over the slots a Fire passed |
//! | `nsmeta` | `G H ns` |
//! | `namespaces` | `G ns` |
//! | `meta` | `G name`; node-wide `0xFFFF name` |
//!
//! A slot is written `bucket era seq` (u64, u16, u64: 18 bytes, `wheel::Slot::encode`), so
//! key order is `Slot`'s order. Until groups come (sharding.md §12 step 4) one group, 0, owns
//! every hash slot and a namespace's hash slot is a function of its name
//! ([`hslot_of`]: `timerdb_client::hash_slot`, the rule the clients route by).
//!
//! A timer's *name bytes* (`ns_len ns id`, [`timer_name`]) are what a series' jitter hashes
//! and what a `series_due` value holds: they carry no group or hash slot, so neither changes
//! when the layout or a timer's owner does.

use crate::wheel::{Slot, SLOT_BYTES};

/// A Raft group, as state keys carry it.
pub type Group = u16;
/// A hash slot (`timerdb_client::hash_slot`), 0..1024.
pub type HSlot = u16;

/// The group owning every hash slot until groups come (sharding.md §12 step 4).
pub const GROUP_ZERO: Group = 0;
/// The prefix of node-wide records in `meta` (the storage format, the bucket width): no
/// group is numbered 0xFFFF.
pub const NODE_WIDE: Group = 0xFFFF;

/// The hash slot a pinned namespace's timers live in.
pub fn hslot_of(namespace: &str) -> HSlot {
    use timerdb_client::hash_slot::{hash_slot, Placement};
    hash_slot(namespace, Placement::Pinned, "").get()
}

/// Where a namespace's keys live: its group and hash slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Home {
    pub group: Group,
    pub hslot: HSlot,
}

impl Home {
    /// The home of `namespace` while group 0 owns every hash slot.
    pub fn of(namespace: &str) -> Home {
        Home {
            group: GROUP_ZERO,
            hslot: hslot_of(namespace),
        }
    }

    /// `G H`: the prefix of this hash slot's keys in a family keyed by hash slot.
    pub fn prefix(&self) -> [u8; 4] {
        let mut out = [0; 4];
        out[..2].copy_from_slice(&self.group.to_be_bytes());
        out[2..].copy_from_slice(&self.hslot.to_be_bytes());
        out
    }
}

/// `G`: the prefix of one group's keys in every family.
pub fn group_prefix(group: Group) -> [u8; 2] {
    group.to_be_bytes()
}

/// A timer's name bytes, `ns_len ns id`: no group, no hash slot (see the module essay).
pub fn timer_name(namespace: &str, id: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + namespace.len() + id.len());
    push_namespace(&mut out, namespace);
    out.extend_from_slice(id.as_bytes());
    out
}

/// Decodes name bytes into (namespace, id).
pub fn decode_timer_name(bytes: &[u8]) -> Option<(String, String)> {
    let (ns, rest) = split_namespace(bytes)?;
    Some((ns, String::from_utf8(rest.to_vec()).ok()?))
}

/// A timer's key in `index` and `series`: `G H ns_len ns id`.
pub fn timer_key(namespace: &str, id: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + 2 + namespace.len() + id.len());
    out.extend_from_slice(&Home::of(namespace).prefix());
    push_namespace(&mut out, namespace);
    out.extend_from_slice(id.as_bytes());
    out
}

/// Decodes an `index` or `series` key into (namespace, id).
pub fn decode_timer_key(bytes: &[u8]) -> Option<(String, String)> {
    decode_timer_name(bytes.get(4..)?)
}

/// The prefix shared by exactly the timer, row and lease keys of `namespace`.
pub fn namespace_prefix(namespace: &str) -> Vec<u8> {
    let ns = namespace.as_bytes();
    debug_assert!(ns.len() <= u16::MAX as usize, "namespace of {}", ns.len());
    let mut out = Vec::with_capacity(4 + 2 + ns.len() + SLOT_BYTES + 1);
    out.extend_from_slice(&Home::of(namespace).prefix());
    push_namespace(&mut out, namespace);
    out
}

fn push_namespace(out: &mut Vec<u8>, namespace: &str) {
    out.extend_from_slice(&(namespace.len() as u16).to_be_bytes());
    out.extend_from_slice(namespace.as_bytes());
}

fn split_namespace(bytes: &[u8]) -> Option<(String, &[u8])> {
    let (len, rest) = bytes.split_first_chunk::<2>()?;
    let len = u16::from_be_bytes(*len) as usize;
    if rest.len() < len {
        return None;
    }
    let (ns, rest) = rest.split_at(len);
    Some((String::from_utf8(ns.to_vec()).ok()?, rest))
}

/// A row's key: the namespace, then the slot. Also a lease's key (the slot it ends at).
pub fn slot_key(namespace: &str, slot: Slot) -> Vec<u8> {
    let mut out = namespace_prefix(namespace);
    out.extend_from_slice(&slot.encode());
    out
}

/// The first key after `slot_key(namespace, slot)` and before any later slot's: with it as a
/// lower bound a scan starts just after `slot`, with it as an upper bound it ends at `slot`.
pub fn slot_key_after(namespace: &str, slot: Slot) -> Vec<u8> {
    let mut out = slot_key(namespace, slot);
    out.push(0);
    out
}

/// Decodes a row or lease key into its namespace and slot.
pub fn decode_slot_key(bytes: &[u8]) -> Option<(String, Slot)> {
    let (ns, rest) = split_namespace(bytes.get(4..)?)?;
    (rest.len() == SLOT_BYTES).then_some(())?;
    Some((ns, Slot::decode(rest)?))
}

/// A lease deadline's key: the group, the deadline, then the lease's hash slot, namespace
/// and end.
pub fn deadline_key(deadline_ms: i64, namespace: &str, to: Slot) -> Vec<u8> {
    let home = Home::of(namespace);
    let mut out = Vec::with_capacity(2 + 8 + 2 + 2 + namespace.len() + SLOT_BYTES);
    out.extend_from_slice(&group_prefix(home.group));
    out.extend_from_slice(&(deadline_ms.max(0) as u64).to_be_bytes());
    out.extend_from_slice(&home.hslot.to_be_bytes());
    push_namespace(&mut out, namespace);
    out.extend_from_slice(&to.encode());
    out
}

/// The bound of `group`'s deadlines at `ms`: every deadline key of the group before `ms`
/// sorts before it, every one at or after it sorts at or after it.
pub fn deadline_bound(group: Group, ms: u64) -> Vec<u8> {
    let mut out = group_prefix(group).to_vec();
    out.extend_from_slice(&ms.to_be_bytes());
    out
}

/// Decodes a deadline key into (deadline, namespace, lease end).
pub fn decode_deadline_key(bytes: &[u8]) -> Option<(i64, String, Slot)> {
    let rest = bytes.get(2..)?;
    let (deadline, rest) = rest.split_first_chunk::<8>()?;
    let (_hslot, rest) = rest.split_first_chunk::<2>()?;
    let (ns, to) = split_namespace(rest)?;
    (to.len() == SLOT_BYTES).then_some(())?;
    Some((u64::from_be_bytes(*deadline) as i64, ns, Slot::decode(to)?))
}

/// A `series_due` key: `G slot H`. By slot first, so that a Fire reads the occurrences it
/// passed with one scan of its group, whichever hash slots hold them (format 5 read one range).
pub fn series_due_key(home: Home, slot: Slot) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + SLOT_BYTES + 2);
    out.extend_from_slice(&group_prefix(home.group));
    out.extend_from_slice(&slot.encode());
    out.extend_from_slice(&home.hslot.to_be_bytes());
    out
}

/// The first `series_due` key of `group` after every one at `slot` (any hash slot).
pub fn series_due_after(group: Group, slot: Slot) -> Vec<u8> {
    let mut out = group_prefix(group).to_vec();
    out.extend_from_slice(&slot.encode());
    out.extend_from_slice(&[0xff, 0xff, 0xff]);
    out
}

/// Decodes a `series_due` key.
pub fn decode_series_due_key(bytes: &[u8]) -> Option<(Home, Slot)> {
    let (g, rest) = bytes.split_first_chunk::<2>()?;
    let (slot, h) = rest.split_at_checked(SLOT_BYTES)?;
    let h: [u8; 2] = h.try_into().ok()?;
    let home = Home {
        group: u16::from_be_bytes(*g),
        hslot: u16::from_be_bytes(h),
    };
    Some((home, Slot::decode(slot)?))
}

/// A key of a family keyed by hash slot then slot (`fires`): `G H slot`.
pub fn hslot_slot_key(home: Home, slot: Slot) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + SLOT_BYTES + 1);
    out.extend_from_slice(&home.prefix());
    out.extend_from_slice(&slot.encode());
    out
}

/// Decodes a `G H slot` key.
pub fn decode_hslot_slot_key(bytes: &[u8]) -> Option<(Home, Slot)> {
    let (g, rest) = bytes.split_first_chunk::<2>()?;
    let (h, rest) = rest.split_first_chunk::<2>()?;
    (rest.len() == SLOT_BYTES).then_some(())?;
    let home = Home {
        group: u16::from_be_bytes(*g),
        hslot: u16::from_be_bytes(*h),
    };
    Some((home, Slot::decode(rest)?))
}

/// A namespace's key in `nsmeta`: `G H ns`.
pub fn nsmeta_key(namespace: &str) -> Vec<u8> {
    let mut out = Home::of(namespace).prefix().to_vec();
    out.extend_from_slice(namespace.as_bytes());
    out
}

/// Decodes an `nsmeta` key into its namespace.
pub fn decode_nsmeta_key(bytes: &[u8]) -> Option<String> {
    String::from_utf8(bytes.get(4..)?.to_vec()).ok()
}

/// A namespace's key in `namespaces`: `G ns`.
pub fn namespace_key(group: Group, namespace: &str) -> Vec<u8> {
    let mut out = group_prefix(group).to_vec();
    out.extend_from_slice(namespace.as_bytes());
    out
}

/// Decodes a `namespaces` key into its namespace.
pub fn decode_namespace_key(bytes: &[u8]) -> Option<String> {
    String::from_utf8(bytes.get(2..)?.to_vec()).ok()
}

/// A group's record `name` in `meta`: `G name`.
pub fn meta_key(group: Group, name: &[u8]) -> Vec<u8> {
    let mut out = group_prefix(group).to_vec();
    out.extend_from_slice(name);
    out
}

/// A node-wide record `name` in `meta`: `0xFFFF name`.
pub fn node_key(name: &[u8]) -> Vec<u8> {
    meta_key(NODE_WIDE, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(bucket: u64, era: u16, seq: u64) -> Slot {
        Slot { bucket, era, seq }
    }

    #[test]
    fn keys_round_trip() {
        let slot = s(7, 1, 9);
        assert_eq!(
            decode_slot_key(&slot_key("ns", slot)),
            Some(("ns".into(), slot))
        );
        assert_eq!(
            decode_timer_key(&timer_key("ns", "a/b")),
            Some(("ns".into(), "a/b".into()))
        );
        assert_eq!(
            decode_timer_name(&timer_name("ns", "a")),
            Some(("ns".into(), "a".into()))
        );
        assert_eq!(
            decode_deadline_key(&deadline_key(42, "ns", slot)),
            Some((42, "ns".into(), slot))
        );
        let home = Home::of("ns");
        assert_eq!(
            decode_hslot_slot_key(&hslot_slot_key(home, slot)),
            Some((home, slot))
        );
        assert_eq!(
            decode_series_due_key(&series_due_key(home, slot)),
            Some((home, slot))
        );
        let other = Home {
            group: 0,
            hslot: home.hslot ^ 1,
        };
        assert!(series_due_after(0, slot) > series_due_key(other, slot));
        assert!(series_due_after(0, slot) < series_due_key(other, Slot { seq: 10, ..slot }));
        assert_eq!(decode_nsmeta_key(&nsmeta_key("ns")), Some("ns".into()));
        assert_eq!(
            decode_namespace_key(&namespace_key(0, "ns")),
            Some("ns".into())
        );
    }

    #[test]
    fn a_namespace_lives_in_its_pinned_hash_slot_of_group_zero() {
        let home = Home::of("orders");
        assert_eq!(home.group, GROUP_ZERO);
        assert_eq!(
            home.hslot,
            timerdb_client::hash_slot::hash_slot(
                "orders",
                timerdb_client::hash_slot::Placement::Pinned,
                "any-id"
            )
            .get()
        );
        let key = slot_key("orders", s(1, 0, 1));
        assert_eq!(&key[..4], &home.prefix());
        assert!(key.starts_with(&namespace_prefix("orders")));
        assert!(!key.starts_with(&namespace_prefix("order")));
    }

    #[test]
    fn deadline_keys_sort_by_group_then_deadline() {
        let mut keys = [
            deadline_key(30, "b", s(1, 0, 1)),
            deadline_key(10, "a", s(5, 0, 1)),
            deadline_key(20, "zzz", s(0, 0, 0)),
        ];
        keys.sort();
        let times: Vec<i64> = keys
            .iter()
            .map(|k| decode_deadline_key(k).unwrap().0)
            .collect();
        assert_eq!(times, [10, 20, 30]);
        assert!(deadline_bound(0, 10) <= keys[0]);
        assert!(deadline_bound(0, 11) > keys[0]);
        assert!(deadline_bound(1, 0) > keys[2]);
    }

    #[test]
    fn node_wide_records_sort_after_every_group() {
        assert!(node_key(b"format") > meta_key(0xFFFE, b"zzzz"));
        assert!(node_key(b"format").starts_with(&[0xff, 0xff]));
    }
}
