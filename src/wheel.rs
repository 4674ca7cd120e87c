//! The timing wheel's arithmetic and key encoding: pure functions, no I/O, no clock.
//!
//! timerdb's wheel is a hierarchical-free variant of Varghese & Lauck's scheme 6 ("hashed timing
//! wheel") turned on its side: instead of `ts mod N` slots with rounds, a bucket is the start of a
//! time slice of `width_ms`, stored as a big-endian u64 in an LSM key. RocksDB's order is then
//! time order, the horizon is unbounded, and the next non-empty bucket is one seek.
//!
//! A **slot** is where one row of the wheel sits: `(bucket, seq)`, ordered by bucket, then seq.
//! `seq` is `log index << 20 | position in the entry`, so two rows never share a slot and a row
//! written by a later entry sorts after every row of its bucket written before it. The fire
//! cursor is a slot too; [`Wheel::placement`] puts every new row after it, which is what makes
//! "behind the cursor" mean "fired, by the entry that passed it" (see `storage`).
//!
//! Keys (all integers big-endian, so byte order is numeric order):
//! - timer key (`index` family): `ns_len: u16 | namespace | id`. The length prefix means the
//!   keys of one namespace are exactly those starting with `ns_len | namespace`.
//! - row key (`wheel` family): `ns_len | namespace | slot`: one namespace's rows in slot order.
//! - lease key: `ns_len | namespace | to: slot` (a lease is found by the first key at or after a
//!   slot); deadline key: `deadline_ms: u64 | ns_len | namespace | to: slot`.
//! - fire record key: the cursor slot a Fire entry left.

use serde::{Deserialize, Serialize};

/// Default bucket width: 1 ms, so a timer fires at its own millisecond.
pub const DEFAULT_BUCKET_MS: u64 = 1;

/// Bits of `seq` that number the rows one entry writes; the log index takes the rest.
pub const POS_BITS: u32 = 20;
/// Most rows one entry may place (every entry is bounded far below this).
pub const MAX_ROWS_PER_ENTRY: u32 = 1 << POS_BITS;

/// Where a row sits on the wheel: its bucket, then a sequence number unique to it.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct Slot {
    pub bucket: u64,
    pub seq: u64,
}

impl Slot {
    /// Before every row: the cursors' starting point.
    pub const ZERO: Slot = Slot { bucket: 0, seq: 0 };

    /// The last slot of `bucket`: a cursor here has passed the whole bucket.
    pub fn end_of(bucket: u64) -> Slot {
        Slot {
            bucket,
            seq: u64::MAX,
        }
    }

    /// The seq of the `pos`-th row placed by the entry at log index `index`.
    pub fn seq(index: u64, pos: u32) -> u64 {
        debug_assert!(pos < MAX_ROWS_PER_ENTRY, "row {pos} of one entry");
        (index << POS_BITS) | pos as u64
    }

    pub fn encode(&self) -> [u8; 16] {
        let mut out = [0; 16];
        out[..8].copy_from_slice(&self.bucket.to_be_bytes());
        out[8..].copy_from_slice(&self.seq.to_be_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<Slot> {
        let (bucket, seq) = bytes.split_first_chunk::<8>()?;
        let seq: [u8; 8] = seq.try_into().ok()?;
        Some(Slot {
            bucket: u64::from_be_bytes(*bucket),
            seq: u64::from_be_bytes(seq),
        })
    }
}

impl std::fmt::Display for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.seq == u64::MAX {
            write!(f, "{}/end", self.bucket)
        } else {
            write!(
                f,
                "{}/{}.{}",
                self.bucket,
                self.seq >> POS_BITS,
                self.seq & (MAX_ROWS_PER_ENTRY as u64 - 1)
            )
        }
    }
}

/// Bucket arithmetic for one bucket width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wheel {
    width_ms: u64,
}

impl Wheel {
    /// A wheel of `width_ms` buckets; `width_ms` must be at least 1.
    pub fn new(width_ms: u64) -> Self {
        assert!(width_ms >= 1, "bucket width must be at least 1 ms");
        Wheel { width_ms }
    }

    pub fn width_ms(&self) -> u64 {
        self.width_ms
    }

    /// The bucket holding time `t_ms`: the start of its slice. Times before the epoch fall in 0.
    pub fn bucket_of(&self, t_ms: i64) -> u64 {
        let t = t_ms.max(0) as u64;
        t - t % self.width_ms
    }

    /// The last millisecond of `bucket`: when every timer in it is due.
    pub fn due_ms(&self, bucket: u64) -> i64 {
        let end = bucket.saturating_add(self.width_ms - 1);
        end.min(i64::MAX as u64) as i64
    }

    /// The last bucket wholly due at `now_ms` (its last millisecond has come); `None` before the
    /// first bucket ends. A Fire entry fires whole buckets only, so nothing fires early.
    pub fn last_due_bucket(&self, now_ms: i64) -> Option<u64> {
        let b = self.bucket_of(now_ms);
        if self.due_ms(b) <= now_ms {
            Some(b)
        } else {
            b.checked_sub(self.width_ms)
        }
    }

    /// Where a new row due at `due_ms` goes when the fire cursor is at `cursor`: its own bucket,
    /// or, when that is not after the cursor, the cursor's bucket (or the next one, if the cursor
    /// took its bucket whole). Always strictly after the cursor, given that `seq` is newer than
    /// every existing row's (it comes from a later entry than any the cursor stopped at).
    pub fn placement(&self, due_ms: i64, cursor: Slot, seq: u64) -> Slot {
        let own = self.bucket_of(due_ms);
        let bucket = if own > cursor.bucket {
            own
        } else if cursor.seq == u64::MAX {
            cursor.bucket.saturating_add(self.width_ms)
        } else {
            cursor.bucket
        };
        let slot = Slot { bucket, seq };
        debug_assert!(slot > cursor, "placed {slot} behind the cursor {cursor}");
        slot
    }
}

impl Default for Wheel {
    fn default() -> Self {
        Wheel::new(DEFAULT_BUCKET_MS)
    }
}

/// Encodes the primary key (the `index` family) of the timer `id` in `namespace`
/// (`TimerKey::index_key`).
pub fn timer_key_of(namespace: &str, id: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + namespace.len() + id.len());
    out.extend_from_slice(&(namespace.len() as u16).to_be_bytes());
    out.extend_from_slice(namespace.as_bytes());
    out.extend_from_slice(id.as_bytes());
    out
}

/// Decodes a timer key into (namespace, id); `None` if the bytes are not one.
pub fn decode_timer_key(bytes: &[u8]) -> Option<(String, String)> {
    let (ns, rest) = split_namespace(bytes)?;
    Some((ns, String::from_utf8(rest.to_vec()).ok()?))
}

/// The prefix shared by exactly the timer, row and lease keys of `namespace`.
pub fn namespace_prefix(namespace: &str) -> Vec<u8> {
    let ns = namespace.as_bytes();
    debug_assert!(ns.len() <= u16::MAX as usize, "namespace of {}", ns.len());
    let mut out = Vec::with_capacity(2 + ns.len() + 16);
    out.extend_from_slice(&(ns.len() as u16).to_be_bytes());
    out.extend_from_slice(ns);
    out
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
    let (ns, rest) = split_namespace(bytes)?;
    (rest.len() == 16).then_some(())?;
    Some((ns, Slot::decode(rest)?))
}

/// A lease deadline's key: the deadline, then the lease's key.
pub fn deadline_key(deadline_ms: i64, namespace: &str, to: Slot) -> Vec<u8> {
    let mut out = (deadline_ms.max(0) as u64).to_be_bytes().to_vec();
    out.extend_from_slice(&slot_key(namespace, to));
    out
}

/// Decodes a deadline key into (deadline, namespace, lease end).
pub fn decode_deadline_key(bytes: &[u8]) -> Option<(i64, String, Slot)> {
    let (deadline, rest) = bytes.split_first_chunk::<8>()?;
    let (ns, to) = decode_slot_key(rest)?;
    Some((u64::from_be_bytes(*deadline) as i64, ns, to))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(bucket: u64, seq: u64) -> Slot {
        Slot { bucket, seq }
    }

    #[test]
    fn bucket_arithmetic_one_ms() {
        let w = Wheel::default();
        assert_eq!(w.bucket_of(0), 0);
        assert_eq!(w.bucket_of(1_700_000_000_123), 1_700_000_000_123);
        assert_eq!(w.due_ms(42), 42);
        assert_eq!(w.bucket_of(-5), 0, "pre-epoch times clamp to bucket 0");
        assert_eq!(
            w.last_due_bucket(42),
            Some(42),
            "1 ms buckets are due at once"
        );
    }

    #[test]
    fn bucket_arithmetic_wide() {
        let w = Wheel::new(100);
        for (t, b) in [(0, 0), (99, 0), (100, 100), (101, 100), (12_345, 12_300)] {
            assert_eq!(w.bucket_of(t), b, "bucket_of({t})");
            // Every time in a bucket is due by the bucket's due time, and never before its start.
            assert!(w.due_ms(b) >= t && b as i64 <= t);
        }
        assert_eq!(w.due_ms(100), 199);
        assert_eq!(w.due_ms(u64::MAX - 5), i64::MAX, "due time saturates");
    }

    #[test]
    fn only_whole_buckets_are_due() {
        let w = Wheel::new(100);
        assert_eq!(w.last_due_bucket(50), None, "the first bucket is not over");
        assert_eq!(w.last_due_bucket(99), Some(0));
        assert_eq!(w.last_due_bucket(150), Some(0), "bucket 100 ends at 199");
        assert_eq!(w.last_due_bucket(199), Some(100));
        // Never early: every time in the last due bucket is at or before now.
        for now in 0..1000 {
            if let Some(b) = w.last_due_bucket(now) {
                assert!(w.due_ms(b) <= now, "bucket {b} not due at {now}");
                assert!(
                    w.due_ms(b + 100) > now,
                    "bucket {} was due at {now}",
                    b + 100
                );
            }
        }
    }

    #[test]
    fn placement_is_always_after_the_cursor() {
        let w = Wheel::new(10);
        let seq = Slot::seq(9, 0);
        assert_eq!(
            w.placement(55, s(30, 7), seq),
            s(50, seq),
            "own bucket when later"
        );
        assert_eq!(
            w.placement(5, s(30, 7), seq),
            s(30, seq),
            "the cursor's bucket, after the row it stopped at"
        );
        assert_eq!(
            w.placement(30, Slot::end_of(30), seq),
            s(40, seq),
            "the next bucket when the cursor took its bucket whole"
        );
        for due in [0, 29, 30, 31, 39, 40, 1000] {
            for cursor in [s(30, 5), Slot::end_of(30), Slot::ZERO] {
                assert!(w.placement(due, cursor, seq) > cursor, "{due} {cursor}");
                assert!(
                    w.due_ms(w.placement(due, cursor, seq).bucket) >= due,
                    "early slot"
                );
            }
        }
    }

    #[test]
    fn seqs_order_by_entry_then_position() {
        assert!(Slot::seq(2, 0) > Slot::seq(1, MAX_ROWS_PER_ENTRY - 1));
        assert!(Slot::seq(1, 1) > Slot::seq(1, 0));
        assert_eq!(s(7, Slot::seq(3, 2)).to_string(), "7/3.2");
        assert_eq!(Slot::end_of(7).to_string(), "7/end");
    }

    #[test]
    fn timer_keys_round_trip() {
        for (ns, id) in [("a", "b"), ("", "x"), ("ns", ""), ("名前", "ид/1")] {
            assert_eq!(
                decode_timer_key(&timer_key_of(ns, id)),
                Some((ns.to_string(), id.to_string()))
            );
        }
        assert_eq!(decode_timer_key(&[0, 5, b'a']), None, "truncated key");
    }

    #[test]
    fn slot_keys_round_trip_and_sort_by_slot() {
        let slots = [s(2, 5), s(2, 9), s(256, 0), s(300, 1), Slot::end_of(300)];
        for w in slots.windows(2) {
            assert!(w[0] < w[1]);
            assert!(
                slot_key("ns", w[0]) < slot_key("ns", w[1]),
                "{} {}",
                w[0],
                w[1]
            );
            // The "just after" key sits between a slot and the next.
            assert!(slot_key("ns", w[0]) < slot_key_after("ns", w[0]));
            assert!(slot_key_after("ns", w[0]) < slot_key("ns", w[1]));
        }
        for slot in slots {
            assert_eq!(
                decode_slot_key(&slot_key("ns", slot)),
                Some(("ns".into(), slot))
            );
        }
        assert_eq!(decode_slot_key(&[0, 2, b'n', b's', 1]), None, "truncated");
        let d = deadline_key(1234, "ns", s(5, 6));
        assert_eq!(decode_deadline_key(&d), Some((1234, "ns".into(), s(5, 6))));
        assert!(
            deadline_key(5, "zz", s(9, 9)) < deadline_key(6, "aa", s(0, 0)),
            "time first"
        );
    }

    #[test]
    fn namespace_prefix_selects_exactly_its_namespace() {
        let p = namespace_prefix("ab");
        assert!(timer_key_of("ab", "x").starts_with(&p));
        assert!(timer_key_of("ab", "").starts_with(&p));
        assert!(slot_key("ab", s(1, 1)).starts_with(&p));
        assert!(
            !timer_key_of("abc", "x").starts_with(&p),
            "longer namespace must not match"
        );
        assert!(
            !timer_key_of("a", "bx").starts_with(&p),
            "split point must matter"
        );
    }
}
