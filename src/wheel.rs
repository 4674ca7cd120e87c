//! The timing wheel's arithmetic and key encoding: pure functions, no I/O, no clock.
//!
//! timerdb's wheel is a hierarchical-free variant of Varghese & Lauck's scheme 6 ("hashed timing
//! wheel") turned on its side: instead of `ts mod N` slots with rounds, a bucket is the start of a
//! time slice of `width_ms`, stored as a big-endian u64 in an LSM key. RocksDB's order is then
//! time order, the horizon is unbounded, and the next non-empty bucket is one seek.
//!
//! A **slot** is where one row of the wheel sits: `(bucket, era, seq)`, ordered by bucket, then
//! era, then seq. `seq` is `log index << 20 | position in the entry`, so two rows one group
//! placed never share a slot and a row written by a later entry sorts after every row of its
//! bucket written before it. The **era** counts its hash slot's adoptions by a new group
//! (docs/sharding.md §3, §6): rows two owners placed never share a key, and the new owner's
//! sort after the old owner's. Until moves come every era is 0. A hash slot's fire cursor is
//! a slot too; [`Wheel::placement`] puts every new row after it, which is what makes "behind
//! the cursor" mean "fired, by the entry that passed it" (see `storage`).
//!
//! Keys are laid out in `crate::keys`; a slot is written there as [`Slot::encode`] (18
//! bytes, big-endian, so byte order is `Slot`'s order).

use serde::{Deserialize, Serialize};

/// Default bucket width: 1 ms, so a timer fires at its own millisecond.
pub const DEFAULT_BUCKET_MS: u64 = 1;

/// Bits of `seq` that number the rows one entry writes; the log index takes the rest.
pub const POS_BITS: u32 = 20;
/// Most rows one entry may place (every entry is bounded far below this).
pub const MAX_ROWS_PER_ENTRY: u32 = 1 << POS_BITS;

/// Where a row sits on the wheel: its bucket, its hash slot's era, then a sequence number
/// unique to it. The field order is the order (`Ord` is derived) and the key bytes' order.
///
/// Stored values and log entries carry a slot through serde as `(bucket, era << 64 | seq)`,
/// the second a u128: bincode's varint writes a u128 below 2^64 exactly as it writes that
/// u64, so a slot of era 0 has the bytes format 5 gave `(bucket, seq)`, and those bytes read
/// back as era 0. Values and entries written before eras need no rewrite.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(from = "SlotForm", into = "SlotForm")]
pub struct Slot {
    pub bucket: u64,
    pub era: u16,
    pub seq: u64,
}

/// The serde form of a [`Slot`] (see there).
#[derive(Clone, Copy, Serialize, Deserialize)]
struct SlotForm {
    bucket: u64,
    seq: u128,
}

impl From<Slot> for SlotForm {
    fn from(s: Slot) -> SlotForm {
        SlotForm {
            bucket: s.bucket,
            seq: (u128::from(s.era) << 64) | u128::from(s.seq),
        }
    }
}

impl From<SlotForm> for Slot {
    fn from(f: SlotForm) -> Slot {
        Slot {
            bucket: f.bucket,
            // Bits above the era's cannot come from `into`; a value carrying them is corrupt
            // and reads as the era it names in its low 16 bits.
            era: (f.seq >> 64) as u16,
            seq: f.seq as u64,
        }
    }
}

/// Bytes of an encoded slot: bucket (8), era (2), seq (8).
pub const SLOT_BYTES: usize = 18;

impl Slot {
    /// Before every row: the cursors' starting point.
    pub const ZERO: Slot = Slot {
        bucket: 0,
        era: 0,
        seq: 0,
    };

    /// The slot at `bucket` and `seq` in era 0.
    pub const fn new(bucket: u64, seq: u64) -> Slot {
        Slot {
            bucket,
            era: 0,
            seq,
        }
    }

    /// The last slot of `bucket`: a cursor here has passed the whole bucket.
    pub fn end_of(bucket: u64) -> Slot {
        Slot {
            bucket,
            era: u16::MAX,
            seq: u64::MAX,
        }
    }

    /// The seq of the `pos`-th row placed by the entry at log index `index`.
    pub fn seq(index: u64, pos: u32) -> u64 {
        debug_assert!(pos < MAX_ROWS_PER_ENTRY, "row {pos} of one entry");
        (index << POS_BITS) | pos as u64
    }

    pub fn encode(&self) -> [u8; SLOT_BYTES] {
        let mut out = [0; SLOT_BYTES];
        out[..8].copy_from_slice(&self.bucket.to_be_bytes());
        out[8..10].copy_from_slice(&self.era.to_be_bytes());
        out[10..].copy_from_slice(&self.seq.to_be_bytes());
        out
    }

    /// Reads exactly [`SLOT_BYTES`] written by [`Slot::encode`].
    pub fn decode(bytes: &[u8]) -> Option<Slot> {
        let (bucket, rest) = bytes.split_first_chunk::<8>()?;
        let (era, seq) = rest.split_first_chunk::<2>()?;
        let seq: [u8; 8] = seq.try_into().ok()?;
        Some(Slot {
            bucket: u64::from_be_bytes(*bucket),
            era: u16::from_be_bytes(*era),
            seq: u64::from_be_bytes(seq),
        })
    }
}

impl std::fmt::Display for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.seq == u64::MAX {
            write!(f, "{}/end", self.bucket)
        } else if self.era == 0 {
            write!(
                f,
                "{}/{}.{}",
                self.bucket,
                self.seq >> POS_BITS,
                self.seq & (MAX_ROWS_PER_ENTRY as u64 - 1)
            )
        } else {
            write!(
                f,
                "{}/e{}:{}.{}",
                self.bucket,
                self.era,
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
        // Era 0: every row's until hash slots move (sharding.md §12 step 6).
        let slot = Slot::new(bucket, seq);
        debug_assert!(slot > cursor, "placed {slot} behind the cursor {cursor}");
        slot
    }
}

impl Default for Wheel {
    fn default() -> Self {
        Wheel::new(DEFAULT_BUCKET_MS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(bucket: u64, seq: u64) -> Slot {
        Slot::new(bucket, seq)
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
    fn encoded_slots_sort_as_slots_do() {
        let e = |bucket, era, seq| Slot { bucket, era, seq };
        let slots = [
            s(2, 5),
            s(2, 9),
            e(2, 1, 0),
            e(2, 1, 7),
            s(256, 0),
            e(256, 3, 0),
            s(300, 1),
            Slot::end_of(300),
        ];
        for w in slots.windows(2) {
            assert!(w[0] < w[1], "{} {}", w[0], w[1]);
            assert!(w[0].encode() < w[1].encode(), "{} {}", w[0], w[1]);
        }
        for slot in slots {
            assert_eq!(Slot::decode(&slot.encode()), Some(slot));
        }
        assert_eq!(Slot::decode(&[0; 16]), None, "a format-5 slot is not one");
        assert_eq!(e(7, 2, Slot::seq(3, 2)).to_string(), "7/e2:3.2");
    }

    /// Format 5 stored slots as (bucket u64, seq u64) in values and log entries: those bytes
    /// must read as era 0, and an era-0 slot must write them (see `Slot`).
    #[test]
    fn an_era_zero_slot_has_format_5s_value_bytes() {
        #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
        struct Format5 {
            bucket: u64,
            seq: u64,
        }
        for (bucket, seq) in [
            (0, 0),
            (9, 2),
            (300, 251),
            (1 << 40, Slot::seq(77, 3)),
            (5, u64::MAX),
        ] {
            let old = crate::codec::encode(&Format5 { bucket, seq });
            assert_eq!(crate::codec::encode(&Slot::new(bucket, seq)), old);
            assert_eq!(
                crate::codec::decode::<Slot>(&old).unwrap(),
                Slot::new(bucket, seq)
            );
        }
        let later = Slot {
            bucket: 1,
            era: 3,
            seq: 4,
        };
        let bytes = crate::codec::encode(&later);
        assert_eq!(crate::codec::decode::<Slot>(&bytes).unwrap(), later);
        assert!(
            crate::codec::decode::<Format5>(&bytes).is_err(),
            "an old build refuses an era"
        );
    }
}
