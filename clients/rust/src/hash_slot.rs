//! Hash slots: the unit a sharded cluster places timers by (docs/sharding.md §1).
//!
//! A timer's hash slot is `crc32(namespace ‖ 0x00 ‖ routing key) mod 1024`, CRC-32 as zlib
//! computes it. The rule is fixed forever: the server, this library and the Python client
//! compute it alike, with no lookup, so any of them can say where a timer lives from its
//! namespace, the namespace's placement and its id. `clients/hash_slots.json` holds the cases
//! all of them are tested against (as `idempotence.json` holds the retry rule's).
//!
//! The **routing key** of an id, in this order:
//! - a **hash tag**: the text between the first `{` and the next `}`, if it is not empty
//!   (Redis Cluster's rule). Timers that must share a group — an atomic batch, a debounce
//!   family — name one tag; the tag is part of the id, so every call routes by the id alone;
//! - else the id without every trailing **occurrence suffix** `@YYYY-MM-DDTHH:MM:SS.mmmZ`
//!   (the shape of a recurring timer's occurrence ids), so a series and all its occurrences
//!   share a group. The shape is checked, not the date: the rule needs no calendar. A suffix is
//!   removed only when something precedes it, as an occurrence always has its series' id;
//! - else the id itself.
//!
//! A **pinned** namespace (the default) hashes an empty routing key: every timer of it is in
//! one hash slot, where every namespace-wide promise holds exactly. A **spread** one hashes each
//! timer's routing key.

/// How many hash slots there are: at most this many groups can share a cluster's timers.
pub const HASH_SLOTS: u16 = 1024;

/// One of the [`HASH_SLOTS`] hash slots. Not the wheel's slot (a row's place in time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HashSlot(u16);

impl HashSlot {
    /// Hash slot `n`, if there is one.
    pub fn new(n: u16) -> Option<HashSlot> {
        (n < HASH_SLOTS).then_some(HashSlot(n))
    }

    pub fn get(self) -> u16 {
        self.0
    }
}

impl std::fmt::Display for HashSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// How a namespace's timers are placed: all in one hash slot, or each by its routing key.
/// Chosen when the namespace is created and never changed (it would move every timer).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Placement {
    /// Every timer in the namespace's one hash slot (the default).
    #[default]
    Pinned,
    /// Each timer in the hash slot of its routing key.
    Spread,
}

/// The hash slot of timer `id` in `namespace`, placed as `placement` says.
pub fn hash_slot(namespace: &str, placement: Placement, id: &str) -> HashSlot {
    let key = match placement {
        Placement::Pinned => "",
        Placement::Spread => routing_key(id),
    };
    let mut h = crc32fast::Hasher::new();
    h.update(namespace.as_bytes());
    h.update(&[0]);
    h.update(key.as_bytes());
    HashSlot((h.finalize() % u32::from(HASH_SLOTS)) as u16)
}

/// The part of `id` a spread namespace hashes (see the module).
pub fn routing_key(id: &str) -> &str {
    if let Some(tag) = hash_tag(id) {
        return tag;
    }
    let mut key = id;
    while let Some(series) = without_occurrence_suffix(key) {
        key = series;
    }
    key
}

/// The text between the first `{` and the next `}`, if not empty.
fn hash_tag(id: &str) -> Option<&str> {
    let (_, rest) = id.split_once('{')?;
    let (tag, _) = rest.split_once('}')?;
    (!tag.is_empty()).then_some(tag)
}

/// An occurrence suffix's shape: `d` stands for an ASCII digit, every other byte for itself.
const OCCURRENCE_SHAPE: &[u8] = b"@dddd-dd-ddTdd:dd:dd.dddZ";

/// `id` without one trailing occurrence suffix, if it ends in one after a non-empty series id.
fn without_occurrence_suffix(id: &str) -> Option<&str> {
    let start = id.len().checked_sub(OCCURRENCE_SHAPE.len())?;
    if start == 0 {
        return None;
    }
    let suffix = &id.as_bytes()[start..];
    let fits = suffix.iter().zip(OCCURRENCE_SHAPE).all(|(b, s)| match s {
        b'd' => b.is_ascii_digit(),
        s => b == s,
    });
    // The suffix is ASCII, so `start` is a character boundary when it fits.
    fits.then(|| &id[..start])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One case of `clients/hash_slots.json`.
    #[derive(serde::Deserialize)]
    struct Case {
        namespace: String,
        placement: String,
        id: String,
        routing_key: String,
        hash_slot: u16,
    }

    #[test]
    fn the_shared_cases_hold() {
        let cases: Vec<Case> =
            serde_json::from_str(include_str!("../../hash_slots.json")).expect("the cases");
        assert!(cases.len() >= 20);
        for c in cases {
            let placement = match c.placement.as_str() {
                "pinned" => Placement::Pinned,
                "spread" => Placement::Spread,
                other => panic!("placement {other}"),
            };
            assert_eq!(
                routing_key(&c.id),
                c.routing_key,
                "routing key of {:?}",
                c.id
            );
            let slot = hash_slot(&c.namespace, placement, &c.id);
            assert_eq!(
                slot.get(),
                c.hash_slot,
                "{} {:?} {:?}",
                c.namespace,
                c.placement,
                c.id
            );
        }
    }

    #[test]
    fn a_pinned_namespace_is_one_hash_slot_and_a_spread_one_many() {
        let pinned: std::collections::HashSet<_> = (0..1000)
            .map(|i| hash_slot("orders", Placement::Pinned, &format!("o{i}")))
            .collect();
        assert_eq!(pinned.len(), 1);
        let spread: std::collections::HashSet<_> = (0..10_000)
            .map(|i| hash_slot("orders", Placement::Spread, &format!("o{i}")))
            .collect();
        // 10,000 ids over 1,024 hash slots leave about 0.006 % of them empty.
        assert!(spread.len() > 1000, "{} hash slots", spread.len());
        assert!(spread.iter().all(|s| s.get() < HASH_SLOTS));
    }

    #[test]
    fn only_hash_slots_below_the_count_exist() {
        assert_eq!(HashSlot::new(1023).map(HashSlot::get), Some(1023));
        assert_eq!(HashSlot::new(HASH_SLOTS), None);
    }
}
