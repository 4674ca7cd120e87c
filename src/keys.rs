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
//! key order is `Slot`'s order. A namespace's hash slot is a function of its name ([`hslot_of`]:
//! `timerdb_client::hash_slot`, the rule the clients route by).
//!
//! Each group's state machine builds its keys through its [`Space`] (the group, carried by
//! value): the only way to name a namespace's keys, so no code of one group can write under
//! another's prefix. Decoders skip the prefix; a key read back is known to be its group's
//! because it was read under that prefix.
//!
//! A timer's *name bytes* (`ns_len ns id`, [`timer_name`]) are what a series' jitter hashes
//! and what a `series_due` value holds: they carry no group or hash slot, so neither changes
//! when the layout or a timer's owner does.

use crate::wheel::{Slot, SLOT_BYTES};

/// A Raft group, as state keys carry it.
pub type Group = u16;
/// A hash slot (`timerdb_client::hash_slot`), 0..1024.
pub type HSlot = u16;

/// Group 0: the only group of a cluster that has one, and the meta group of one that has
/// more (docs/sharding.md §2).
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
    /// `G H`: the prefix of this hash slot's keys in a family keyed by hash slot.
    pub fn prefix(&self) -> [u8; 4] {
        let mut out = [0; 4];
        out[..2].copy_from_slice(&self.group.to_be_bytes());
        out[2..].copy_from_slice(&self.hslot.to_be_bytes());
        out
    }
}

/// One group's keys: every key a group's state machine writes or reads is built here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Space {
    pub group: Group,
}

impl Space {
    pub const fn of(group: Group) -> Space {
        Space { group }
    }

    /// `G`: the prefix of every key of the group, in every family.
    pub fn prefix(self) -> [u8; 2] {
        group_prefix(self.group)
    }

    /// Where `namespace`'s keys live in this group.
    pub fn home(self, namespace: &str) -> Home {
        Home {
            group: self.group,
            hslot: hslot_of(namespace),
        }
    }

    /// A timer's key in `index` and `series`: `G H ns_len ns id`.
    pub fn timer_key(self, namespace: &str, id: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + 2 + namespace.len() + id.len());
        out.extend_from_slice(&self.home(namespace).prefix());
        push_namespace(&mut out, namespace);
        out.extend_from_slice(id.as_bytes());
        out
    }

    /// The prefix shared by exactly the timer, row and lease keys of `namespace`.
    pub fn namespace_prefix(self, namespace: &str) -> Vec<u8> {
        let ns = namespace.as_bytes();
        debug_assert!(ns.len() <= u16::MAX as usize, "namespace of {}", ns.len());
        let mut out = Vec::with_capacity(4 + 2 + ns.len() + SLOT_BYTES + 1);
        out.extend_from_slice(&self.home(namespace).prefix());
        push_namespace(&mut out, namespace);
        out
    }

    /// A row's key: the namespace, then the slot. Also a lease's key (the slot it ends at).
    pub fn slot_key(self, namespace: &str, slot: Slot) -> Vec<u8> {
        let mut out = self.namespace_prefix(namespace);
        out.extend_from_slice(&slot.encode());
        out
    }

    /// The first key after `slot_key(namespace, slot)` and before any later slot's: with it
    /// as a lower bound a scan starts just after `slot`, with it as an upper bound it ends at
    /// `slot`.
    pub fn slot_key_after(self, namespace: &str, slot: Slot) -> Vec<u8> {
        let mut out = self.slot_key(namespace, slot);
        out.push(0);
        out
    }

    /// A lease deadline's key: the group, the deadline, then the lease's hash slot,
    /// namespace and end.
    pub fn deadline_key(self, deadline_ms: i64, namespace: &str, to: Slot) -> Vec<u8> {
        let mut out = Vec::with_capacity(2 + 8 + 2 + 2 + namespace.len() + SLOT_BYTES);
        out.extend_from_slice(&self.prefix());
        out.extend_from_slice(&(deadline_ms.max(0) as u64).to_be_bytes());
        out.extend_from_slice(&hslot_of(namespace).to_be_bytes());
        push_namespace(&mut out, namespace);
        out.extend_from_slice(&to.encode());
        out
    }

    /// The bound of the group's deadlines at `ms`: every deadline key of the group before
    /// `ms` sorts before it, every one at or after it sorts at or after it.
    pub fn deadline_bound(self, ms: u64) -> Vec<u8> {
        let mut out = self.prefix().to_vec();
        out.extend_from_slice(&ms.to_be_bytes());
        out
    }

    /// The first `series_due` key of the group after every one at `slot` (any hash slot).
    pub fn series_due_after(self, slot: Slot) -> Vec<u8> {
        let mut out = self.prefix().to_vec();
        out.extend_from_slice(&slot.encode());
        out.extend_from_slice(&[0xff, 0xff, 0xff]);
        out
    }

    /// A namespace's key in `nsmeta`: `G H ns`.
    pub fn nsmeta_key(self, namespace: &str) -> Vec<u8> {
        let mut out = self.home(namespace).prefix().to_vec();
        out.extend_from_slice(namespace.as_bytes());
        out
    }

    /// A namespace's key in `namespaces`: `G ns`.
    pub fn namespace_key(self, namespace: &str) -> Vec<u8> {
        let mut out = self.prefix().to_vec();
        out.extend_from_slice(namespace.as_bytes());
        out
    }

    /// The group's record `name` in `meta`: `G name`.
    pub fn meta_key(self, name: &[u8]) -> Vec<u8> {
        let mut out = self.prefix().to_vec();
        out.extend_from_slice(name);
        out
    }
}

/// Which group owns each hash slot: the slot map (docs/sharding.md §2, §4). Until hash slots
/// move (§12 step 6) it is the cluster's map at epoch 1, a function of its number of data
/// groups: with G of them, group g (1..=G) owns hash slots `[(g-1)·1024/G, g·1024/G)`; with
/// none, group 0 owns every hash slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotMap {
    groups: Group,
}

/// Hash slots there are.
pub const HASH_SLOTS: u32 = timerdb_client::hash_slot::HASH_SLOTS as u32;

impl SlotMap {
    /// The map of a cluster of `groups` data groups.
    pub const fn new(groups: Group) -> SlotMap {
        SlotMap { groups }
    }

    /// Its data groups (0: group 0 owns everything).
    pub fn groups(&self) -> Group {
        self.groups
    }

    /// The map's epoch: 1 until hash slots move.
    pub fn epoch(&self) -> u64 {
        1
    }

    /// The group owning `hslot`.
    pub fn owner(&self, hslot: HSlot) -> Group {
        match self.groups {
            0 => GROUP_ZERO,
            g => (u32::from(hslot) * u32::from(g) / HASH_SLOTS) as Group + 1,
        }
    }

    /// The group holding pinned `namespace`'s timers.
    pub fn group_of(&self, namespace: &str) -> Group {
        self.owner(hslot_of(namespace))
    }

    /// The hash slots `group` owns, as `[first, end)`.
    pub fn owned(&self, group: Group) -> std::ops::Range<u32> {
        match (self.groups, group) {
            (0, GROUP_ZERO) => 0..HASH_SLOTS,
            (0, _) | (_, GROUP_ZERO) => 0..0,
            (n, g) if g > n => 0..0,
            (n, g) => {
                let (n, g) = (u32::from(n), u32::from(g));
                // The first hash slot h with h·n / 1024 = g - 1, and the first with g.
                let first = |k: u32| (k * HASH_SLOTS).div_ceil(n);
                first(g - 1)..first(g)
            }
        }
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

/// Decodes an `index` or `series` key into (namespace, id).
pub fn decode_timer_key(bytes: &[u8]) -> Option<(String, String)> {
    decode_timer_name(bytes.get(4..)?)
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

/// Decodes a row or lease key into its namespace and slot.
pub fn decode_slot_key(bytes: &[u8]) -> Option<(String, Slot)> {
    let (ns, rest) = split_namespace(bytes.get(4..)?)?;
    (rest.len() == SLOT_BYTES).then_some(())?;
    Some((ns, Slot::decode(rest)?))
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

/// Decodes an `nsmeta` key into its namespace.
pub fn decode_nsmeta_key(bytes: &[u8]) -> Option<String> {
    String::from_utf8(bytes.get(4..)?.to_vec()).ok()
}

/// Decodes a `namespaces` key into its namespace.
pub fn decode_namespace_key(bytes: &[u8]) -> Option<String> {
    String::from_utf8(bytes.get(2..)?.to_vec()).ok()
}

/// A node-wide record `name` in `meta`: `0xFFFF name`.
pub fn node_key(name: &[u8]) -> Vec<u8> {
    Space::of(NODE_WIDE).meta_key(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(bucket: u64, era: u16, seq: u64) -> Slot {
        Slot { bucket, era, seq }
    }

    const G0: Space = Space::of(GROUP_ZERO);

    #[test]
    fn keys_round_trip() {
        let slot = s(7, 1, 9);
        assert_eq!(
            decode_slot_key(&G0.slot_key("ns", slot)),
            Some(("ns".into(), slot))
        );
        assert_eq!(
            decode_timer_key(&Space::of(3).timer_key("ns", "a/b")),
            Some(("ns".into(), "a/b".into()))
        );
        assert_eq!(
            decode_timer_name(&timer_name("ns", "a")),
            Some(("ns".into(), "a".into()))
        );
        assert_eq!(
            decode_deadline_key(&G0.deadline_key(42, "ns", slot)),
            Some((42, "ns".into(), slot))
        );
        let home = G0.home("ns");
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
        assert!(G0.series_due_after(slot) > series_due_key(other, slot));
        assert!(G0.series_due_after(slot) < series_due_key(other, Slot { seq: 10, ..slot }));
        assert_eq!(decode_nsmeta_key(&G0.nsmeta_key("ns")), Some("ns".into()));
        assert_eq!(
            decode_namespace_key(&G0.namespace_key("ns")),
            Some("ns".into())
        );
    }

    #[test]
    fn a_namespace_lives_in_its_pinned_hash_slot_of_its_group() {
        let space = Space::of(7);
        let home = space.home("orders");
        assert_eq!(home.group, 7);
        assert_eq!(
            home.hslot,
            timerdb_client::hash_slot::hash_slot(
                "orders",
                timerdb_client::hash_slot::Placement::Pinned,
                "any-id"
            )
            .get()
        );
        let key = space.slot_key("orders", s(1, 0, 1));
        assert_eq!(&key[..4], &home.prefix());
        assert!(key.starts_with(&space.namespace_prefix("orders")));
        assert!(!key.starts_with(&space.namespace_prefix("order")));
        // Another group's keys of the same namespace share no prefix with these.
        assert!(!key.starts_with(&Space::of(8).namespace_prefix("orders")));
        assert!(!key.starts_with(&G0.namespace_prefix("orders")));
    }

    #[test]
    fn deadline_keys_sort_by_group_then_deadline() {
        let mut keys = [
            G0.deadline_key(30, "b", s(1, 0, 1)),
            G0.deadline_key(10, "a", s(5, 0, 1)),
            G0.deadline_key(20, "zzz", s(0, 0, 0)),
        ];
        keys.sort();
        let times: Vec<i64> = keys
            .iter()
            .map(|k| decode_deadline_key(k).unwrap().0)
            .collect();
        assert_eq!(times, [10, 20, 30]);
        assert!(G0.deadline_bound(10) <= keys[0]);
        assert!(G0.deadline_bound(11) > keys[0]);
        assert!(Space::of(1).deadline_bound(0) > keys[2]);
    }

    #[test]
    fn the_slot_map_gives_every_hash_slot_one_owner_and_each_group_one_range() {
        for groups in [0u16, 1, 3, 7, 8, 64, 255] {
            let map = SlotMap::new(groups);
            let mut counts = std::collections::BTreeMap::new();
            for h in 0..HASH_SLOTS {
                let owner = map.owner(h as HSlot);
                assert!(map.owned(owner).contains(&h), "{groups}: {h} → {owner}");
                *counts.entry(owner).or_insert(0u32) += 1;
            }
            let expected: Vec<Group> = match groups {
                0 => vec![GROUP_ZERO],
                n => (1..=n).collect(),
            };
            assert_eq!(counts.keys().copied().collect::<Vec<_>>(), expected);
            // Sizes differ by at most one hash slot, and every range is what `owned` says.
            let (min, max) = (counts.values().min(), counts.values().max());
            assert!(max.unwrap() - min.unwrap() <= 1, "{groups}: {counts:?}");
            for (g, n) in counts {
                assert_eq!(map.owned(g).len() as u32, n);
            }
            assert!(groups == 0 || map.owned(GROUP_ZERO).is_empty());
        }
    }

    #[test]
    fn node_wide_records_sort_after_every_group() {
        assert!(node_key(b"format") > Space::of(0xFFFE).meta_key(b"zzzz"));
        assert!(node_key(b"format").starts_with(&[0xff, 0xff]));
    }
}
