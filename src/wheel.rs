//! The timing wheel's arithmetic and key encoding: pure functions, no I/O, no clock.
//!
//! timerdb's wheel is a hierarchical-free variant of Varghese & Lauck's scheme 6 ("hashed timing
//! wheel") turned on its side: instead of `ts mod N` slots with rounds, a bucket is the start of a
//! time slice of `width_ms`, stored as a big-endian u64 at the front of an LSM key. RocksDB's
//! order is then time order, the horizon is unbounded, and the next non-empty bucket is one seek.
//!
//! Keys (all integers big-endian, so byte order is numeric order):
//! - timer key: `ns_len: u16 | namespace | id`. The length prefix means the keys of one
//!   namespace are exactly those starting with `ns_len | namespace`.
//! - wheel key: `bucket: u64 | timer key`. Within a bucket, timers are in (namespace, id) order,
//!   which is the deterministic order a Fire entry fires them in.
//!
//! - ready key: `ns_len: u16 | namespace | fire_index: u64 | id`: the FIRED timers waiting for a
//!   consumer, per namespace in fire order (then id order), so delivery follows firing.
//!
//! Invariant kept by the state machine with `placement`: every wheel key's bucket is at or after
//! the replicated wheel floor, so scans start at the floor and never wade through the tombstones
//! that fired timers leave behind at the queue's head.

use crate::timer::TimerKey;

/// Default bucket width: 1 ms, so a timer fires at its own millisecond.
pub const DEFAULT_BUCKET_MS: u64 = 1;

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

    /// Where a timer due at `fire_at_ms` is placed when the wheel floor is `floor`: its own
    /// bucket, or the floor if that bucket is already behind it (scheduled in the past).
    pub fn placement(&self, fire_at_ms: i64, floor: u64) -> u64 {
        self.bucket_of(fire_at_ms).max(floor)
    }
}

impl Default for Wheel {
    fn default() -> Self {
        Wheel::new(DEFAULT_BUCKET_MS)
    }
}

/// Encodes a timer's primary key.
pub fn timer_key(key: &TimerKey) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + key.namespace.len() + key.id.len());
    push_timer_key(&mut out, key);
    out
}

fn push_timer_key(out: &mut Vec<u8>, key: &TimerKey) {
    let ns = key.namespace.as_bytes();
    debug_assert!(
        ns.len() <= u16::MAX as usize,
        "namespace too long: {}",
        ns.len()
    );
    out.extend_from_slice(&(ns.len() as u16).to_be_bytes());
    out.extend_from_slice(ns);
    out.extend_from_slice(key.id.as_bytes());
}

/// Decodes a timer key; `None` if the bytes are not one.
pub fn decode_timer_key(bytes: &[u8]) -> Option<TimerKey> {
    let (len, rest) = bytes.split_first_chunk::<2>()?;
    let len = u16::from_be_bytes(*len) as usize;
    if rest.len() < len {
        return None;
    }
    let (ns, id) = rest.split_at(len);
    Some(TimerKey {
        namespace: String::from_utf8(ns.to_vec()).ok()?,
        id: String::from_utf8(id.to_vec()).ok()?,
    })
}

/// The prefix shared by exactly the timer keys of `namespace`.
pub fn namespace_prefix(namespace: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + namespace.len());
    out.extend_from_slice(&(namespace.len() as u16).to_be_bytes());
    out.extend_from_slice(namespace.as_bytes());
    out
}

/// Encodes a wheel key: the bucket, then the timer key.
pub fn wheel_key(bucket: u64, key: &TimerKey) -> Vec<u8> {
    let mut out = Vec::with_capacity(10 + key.namespace.len() + key.id.len());
    out.extend_from_slice(&bucket.to_be_bytes());
    push_timer_key(&mut out, key);
    out
}

/// The smallest wheel key in `bucket` (a seek target).
pub fn bucket_start_key(bucket: u64) -> Vec<u8> {
    bucket.to_be_bytes().to_vec()
}

/// Decodes a wheel key into its bucket and timer key.
pub fn decode_wheel_key(bytes: &[u8]) -> Option<(u64, TimerKey)> {
    let (bucket, rest) = bytes.split_first_chunk::<8>()?;
    Some((u64::from_be_bytes(*bucket), decode_timer_key(rest)?))
}

/// Encodes a ready-queue key.
pub fn ready_key(fire_index: u64, key: &TimerKey) -> Vec<u8> {
    let mut out = namespace_prefix(&key.namespace);
    out.extend_from_slice(&fire_index.to_be_bytes());
    out.extend_from_slice(key.id.as_bytes());
    out
}

/// Decodes a ready-queue key into its fire index and timer key.
pub fn decode_ready_key(bytes: &[u8]) -> Option<(u64, TimerKey)> {
    let (len, rest) = bytes.split_first_chunk::<2>()?;
    let len = u16::from_be_bytes(*len) as usize;
    if rest.len() < len {
        return None;
    }
    let (ns, rest) = rest.split_at(len);
    let (index, id) = rest.split_first_chunk::<8>()?;
    let key = TimerKey {
        namespace: String::from_utf8(ns.to_vec()).ok()?,
        id: String::from_utf8(id.to_vec()).ok()?,
    };
    Some((u64::from_be_bytes(*index), key))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(ns: &str, id: &str) -> TimerKey {
        TimerKey::new(ns, id)
    }

    #[test]
    fn bucket_arithmetic_one_ms() {
        let w = Wheel::default();
        assert_eq!(w.bucket_of(0), 0);
        assert_eq!(w.bucket_of(1_700_000_000_123), 1_700_000_000_123);
        assert_eq!(w.due_ms(42), 42);
        assert_eq!(w.bucket_of(-5), 0, "pre-epoch times clamp to bucket 0");
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
    fn placement_clamps_to_floor() {
        let w = Wheel::new(10);
        assert_eq!(
            w.placement(55, 30),
            50,
            "future timers keep their own bucket"
        );
        assert_eq!(w.placement(5, 30), 30, "past timers go to the floor");
        assert_eq!(w.placement(30, 30), 30);
    }

    #[test]
    fn timer_keys_round_trip() {
        for key in [k("a", "b"), k("", "x"), k("ns", ""), k("名前", "ид/1")] {
            assert_eq!(decode_timer_key(&timer_key(&key)), Some(key.clone()));
            assert_eq!(decode_wheel_key(&wheel_key(7, &key)), Some((7, key)));
        }
        assert_eq!(decode_timer_key(&[0, 5, b'a']), None, "truncated key");
        assert_eq!(decode_wheel_key(&[1, 2, 3]), None);
    }

    #[test]
    fn ready_keys_round_trip_and_sort_by_fire_index() {
        let a = ready_key(300, &k("ns", "a"));
        let b = ready_key(7, &k("ns", "z"));
        assert_eq!(decode_ready_key(&a), Some((300, k("ns", "a"))));
        assert!(b < a, "fire order, not id order");
        assert!(a.starts_with(&namespace_prefix("ns")));
        assert_eq!(decode_ready_key(&[0, 2, b'n', b's', 1]), None, "truncated");
    }

    #[test]
    fn namespace_prefix_selects_exactly_its_namespace() {
        let p = namespace_prefix("ab");
        assert!(timer_key(&k("ab", "x")).starts_with(&p));
        assert!(timer_key(&k("ab", "")).starts_with(&p));
        assert!(
            !timer_key(&k("abc", "x")).starts_with(&p),
            "longer namespace must not match"
        );
        assert!(
            !timer_key(&k("a", "bx")).starts_with(&p),
            "split point must matter"
        );
    }

    #[test]
    fn wheel_keys_sort_by_time_then_key() {
        let mut keys = [
            wheel_key(300, &k("a", "a")),
            wheel_key(2, &k("z", "z")),
            wheel_key(256, &k("a", "a")),
            wheel_key(2, &k("a", "b")),
            wheel_key(2, &k("a", "a")),
            wheel_key(u64::MAX, &k("", "")),
        ];
        keys.sort();
        let decoded: Vec<_> = keys.iter().map(|b| decode_wheel_key(b).unwrap()).collect();
        let expect = vec![
            (2, k("a", "a")),
            (2, k("a", "b")),
            (2, k("z", "z")),
            (256, k("a", "a")),
            (300, k("a", "a")),
            (u64::MAX, k("", "")),
        ];
        assert_eq!(decoded, expect);
        // Big-endian: 256 sorts after 2 although its first byte is smaller than 2's low byte.
        assert!(bucket_start_key(256) > bucket_start_key(2));
    }
}
