//! A ScheduleBatch's specs, packed: the batch's names in one string, its payloads in one buffer.
//!
//! A ScheduleBatch entry carries up to 10,000 timers, and every replica decodes it (a follower
//! from the leader's AppendEntries, any node from its log after a restart). As a
//! `Vec<TimerSpec>` that was three or four allocations per timer (namespace, id, payload,
//! content type) on each node, and a payload decoded byte by byte. [`Specs`] keeps the batch's
//! text in one string and its payloads in one byte buffer, and each spec as ranges into them,
//! so decoding a batch allocates a few times (the buffers growing) however many timers it
//! holds; apply reads each spec borrowed ([`SpecRef`]) and writes its row from there.
//!
//! Invariants:
//! - The encoding is exactly that of the `Vec<TimerSpec>` it replaced (a sequence of specs,
//!   each namespace, id, when, payload, content type), so entries written by older builds
//!   decode, and older builds decode ours: no feature level moves (`cluster::level`).
//! - Every range lies inside its buffer, and a text range on `char` boundaries (`push` appends
//!   whole `&str`s), so the accessors cannot fail. The text is a `String`, not bytes checked
//!   again on each read: apply and the log read every spec several times per entry, and
//!   validating each id's UTF-8 every time cost the batch workload measurably.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use serde::de::{SeqAccess, Visitor};
use serde::ser::SerializeSeq;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{TimerKey, TimerSpec, When};

/// See the module documentation.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Specs {
    /// Namespaces, ids and content types, back to back.
    text: String,
    payloads: Vec<u8>,
    items: Vec<Item>,
}

/// One spec: where its parts lie in the buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Item {
    namespace: Range<u32>,
    id: Range<u32>,
    payload: Range<u32>,
    content_type: Range<u32>,
    when: When,
}

/// A timer's key, borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct KeyRef<'a> {
    pub namespace: &'a str,
    pub id: &'a str,
}

/// One spec of a [`Specs`], borrowed. Serializes as a [`TimerSpec`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SpecRef<'a> {
    pub key: KeyRef<'a>,
    pub when: When,
    pub payload: &'a [u8],
    pub content_type: &'a str,
}

impl KeyRef<'_> {
    /// Its key in the `index` family, as [`TimerKey::index_key`].
    pub fn index_key(&self, space: crate::keys::Space) -> Vec<u8> {
        space.timer_key(self.namespace, self.id)
    }

    pub fn to_owned(self) -> TimerKey {
        TimerKey::new(self.namespace, self.id)
    }
}

impl fmt::Display for KeyRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.id)
    }
}

impl TimerKey {
    pub fn as_ref(&self) -> KeyRef<'_> {
        KeyRef {
            namespace: &self.namespace,
            id: &self.id,
        }
    }
}

impl<'a> From<&'a TimerKey> for KeyRef<'a> {
    fn from(key: &'a TimerKey) -> KeyRef<'a> {
        key.as_ref()
    }
}

impl<'a> From<&'a TimerSpec> for SpecRef<'a> {
    fn from(spec: &'a TimerSpec) -> SpecRef<'a> {
        spec.as_ref()
    }
}

impl SpecRef<'_> {
    pub fn to_owned(self) -> TimerSpec {
        TimerSpec {
            key: self.key.to_owned(),
            when: self.when,
            payload: self.payload.to_vec(),
            content_type: self.content_type.to_owned(),
        }
    }
}

impl TimerSpec {
    pub fn as_ref(&self) -> SpecRef<'_> {
        SpecRef {
            key: self.key.as_ref(),
            when: self.when,
            payload: &self.payload,
            content_type: &self.content_type,
        }
    }
}

impl Specs {
    /// Room for `n` specs of `text` bytes of names and `payloads` bytes of payload.
    pub fn with_capacity(n: usize, text: usize, payloads: usize) -> Specs {
        Specs {
            text: String::with_capacity(text),
            payloads: Vec::with_capacity(payloads),
            items: Vec::with_capacity(n),
        }
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Appends a spec. A namespace equal to the previous spec's is stored once.
    pub fn push(&mut self, spec: SpecRef<'_>) {
        let namespace = match self.items.last() {
            Some(last) if self.text(&last.namespace) == spec.key.namespace => {
                last.namespace.clone()
            }
            _ => self.put_text(spec.key.namespace),
        };
        let id = self.put_text(spec.key.id);
        let content_type = self.put_text(spec.content_type);
        let start = self.payloads.len();
        self.payloads.extend_from_slice(spec.payload);
        let item = Item {
            namespace,
            id,
            payload: range(start, self.payloads.len()),
            content_type,
            when: spec.when,
        };
        self.items.push(item);
    }

    /// The spec at `i`.
    pub fn get(&self, i: usize) -> Option<SpecRef<'_>> {
        self.items.get(i).map(|item| self.spec(item))
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = SpecRef<'_>> + '_ {
        self.items.iter().map(|item| self.spec(item))
    }

    fn spec(&self, item: &Item) -> SpecRef<'_> {
        SpecRef {
            key: KeyRef {
                namespace: self.text(&item.namespace),
                id: self.text(&item.id),
            },
            when: item.when,
            payload: &self.payloads[item.payload.start as usize..item.payload.end as usize],
            content_type: self.text(&item.content_type),
        }
    }

    /// Gives back what the buffers grew beyond a quarter over their contents: a decoded batch
    /// lives in the log cache and in openraft's queues, and doubling left up to twice its bytes
    /// reserved (a 40 MB payload in an 80 MB buffer).
    fn trim(&mut self) {
        if self.text.capacity() > self.text.len() + self.text.len() / 4 {
            self.text.shrink_to_fit();
        }
        if self.payloads.capacity() > self.payloads.len() + self.payloads.len() / 4 {
            self.payloads.shrink_to_fit();
        }
    }

    fn put_text(&mut self, part: &str) -> Range<u32> {
        let start = self.text.len();
        self.text.push_str(part);
        range(start, self.text.len())
    }

    fn text(&self, range: &Range<u32>) -> &str {
        &self.text[range.start as usize..range.end as usize]
    }
}

fn range(start: usize, end: usize) -> Range<u32> {
    // A batch is bounded far below 4 GiB (`codec::MAX_DECODE_BYTES`, the message limits).
    let end = u32::try_from(end).expect("a batch under 4 GiB");
    start as u32..end
}

impl From<Vec<TimerSpec>> for Specs {
    fn from(specs: Vec<TimerSpec>) -> Specs {
        specs.iter().map(TimerSpec::as_ref).collect()
    }
}

impl<'a> FromIterator<SpecRef<'a>> for Specs {
    fn from_iter<I: IntoIterator<Item = SpecRef<'a>>>(iter: I) -> Specs {
        let mut specs = Specs::default();
        for spec in iter {
            specs.push(spec);
        }
        specs
    }
}

impl FromIterator<TimerSpec> for Specs {
    fn from_iter<I: IntoIterator<Item = TimerSpec>>(iter: I) -> Specs {
        let mut specs = Specs::default();
        for spec in iter {
            specs.push(spec.as_ref());
        }
        specs
    }
}

impl fmt::Debug for Specs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Serialize for Specs {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.len()))?;
        for spec in self.iter() {
            seq.serialize_element(&spec)?;
        }
        seq.end()
    }
}

/// A spec as decoded: borrowed from the input where the decoder can lend (bincode from a
/// slice, as `codec::decode` does), owned otherwise. Fields in [`TimerSpec`]'s order.
#[derive(Deserialize)]
struct SpecIn<'a> {
    #[serde(borrow)]
    key: KeyIn<'a>,
    when: When,
    // `Cow<[u8]>` reads the bytes whole (`deserialize_bytes`); bincode writes a `Vec<u8>` and
    // a byte string alike (a length, then the bytes), so the encoding is unchanged.
    #[serde(borrow)]
    payload: Cow<'a, [u8]>,
    #[serde(borrow)]
    content_type: Cow<'a, str>,
}

#[derive(Deserialize)]
struct KeyIn<'a> {
    #[serde(borrow)]
    namespace: Cow<'a, str>,
    #[serde(borrow)]
    id: Cow<'a, str>,
}

impl<'de> Deserialize<'de> for Specs {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Specs, D::Error> {
        struct SpecsVisitor;

        impl<'de> Visitor<'de> for SpecsVisitor {
            type Value = Specs;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a sequence of timer specs")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Specs, A::Error> {
                // The claimed length is the peer's word: reserve no more than a sane batch.
                let n = seq.size_hint().unwrap_or(0).min(16 * 1024);
                let mut specs = Specs::with_capacity(n, n * 32, n * 32);
                while let Some(spec) = seq.next_element::<SpecIn<'de>>()? {
                    specs.push(SpecRef {
                        key: KeyRef {
                            namespace: &spec.key.namespace,
                            id: &spec.key.id,
                        },
                        when: spec.when,
                        payload: &spec.payload,
                        content_type: &spec.content_type,
                    });
                }
                specs.trim();
                Ok(specs)
            }
        }

        deserializer.deserialize_seq(SpecsVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{decode, encode};

    fn spec(ns: &str, i: usize, payload: &[u8], content_type: &str) -> TimerSpec {
        TimerSpec {
            key: TimerKey::new(ns, format!("id-{i}")),
            when: if i.is_multiple_of(2) {
                When::At(i as i64)
            } else {
                When::After(i as i64)
            },
            payload: payload.to_vec(),
            content_type: content_type.into(),
        }
    }

    /// The log and the peers keep the `Vec<TimerSpec>` encoding: each decodes as the other.
    #[test]
    fn specs_encode_as_the_vector_of_specs_they_replaced() {
        let specs = vec![
            spec("a", 0, b"", ""),
            spec("a", 1, &[0, 255, 7], "text/plain"),
            spec("b", 2, &[1; 300], ""),
            spec("a", 3, "é".as_bytes(), "application/json"),
            spec("", 4, b"x", ""),
        ];
        let packed = Specs::from(specs.clone());
        assert_eq!(encode(&packed), encode(&specs));
        let back: Specs = decode(&encode(&specs)).unwrap();
        assert_eq!(back, packed);
        let owned: Vec<TimerSpec> = back.iter().map(SpecRef::to_owned).collect();
        assert_eq!(owned, specs);
        let again: Vec<TimerSpec> = decode(&encode(&packed)).unwrap();
        assert_eq!(again, specs);
        assert_eq!(
            decode::<Specs>(&encode(&Specs::default())).unwrap().len(),
            0
        );
    }

    /// Review of f803032: a decoded batch of large payloads kept the doubling's spare room
    /// (up to twice its bytes) for as long as the log cache held it.
    #[test]
    fn a_decoded_batch_keeps_no_more_than_a_quarter_spare() {
        // 3,000 bytes each: the buffer reserved at 32 per spec doubles past them to 4,096.
        let specs: Vec<TimerSpec> = (0..2_000).map(|i| spec("ns", i, &[9; 3000], "")).collect();
        let decoded: Specs = decode(&encode(&specs)).unwrap();
        let (len, capacity) = (decoded.payloads.len(), decoded.payloads.capacity());
        assert_eq!(len, 2_000 * 3000);
        assert!(
            capacity <= len + len / 4,
            "{capacity} bytes reserved for {len}"
        );
    }

    /// Bytes from a peer that are not a batch fail to decode; they never panic.
    #[test]
    fn bad_bytes_are_an_error() {
        let good = encode(&Specs::from(vec![spec("ns", 1, b"pay", "")]));
        for cut in 0..good.len() {
            assert!(decode::<Specs>(&good[..cut]).is_err(), "cut at {cut}");
        }
        // An id that is not UTF-8.
        let mut bad = good.clone();
        let at = bad.windows(4).position(|w| w == b"id-1").unwrap();
        bad[at] = 0xff;
        assert!(decode::<Specs>(&bad).is_err());
        // A count claiming a billion specs reserves a bounded amount, then fails.
        let mut huge = vec![252u8];
        huge.extend_from_slice(&1_000_000_000u32.to_le_bytes());
        assert!(decode::<Specs>(&huge).is_err());
    }
}
