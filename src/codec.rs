//! The binary encoding of stored values and peer messages: bincode over serde.
//!
//! Compact and fast (no JSON on the hot path); private to one timerdb build.
//!
//! Decoding reads bytes from the network (peer messages) and the disk, so it is bounded: a
//! length prefix is checked against [`MAX_DECODE_BYTES`] before anything is allocated for it.
//! Unbounded, nine bytes claiming a 1 TiB string made the node abort on the allocation (found
//! by the test below); bounded, the worst a crafted value costs is one allocation of the limit
//! before the decode fails on the missing bytes.

use bincode::config::{Configuration, Limit, LittleEndian, Varint};
use serde::{de::DeserializeOwned, Serialize};

use crate::{Error, Result};

/// Most bytes one decoded value may hold: the largest peer message (an AppendEntries of
/// several full batches; the gRPC limit on the peer service is the same).
pub const MAX_DECODE_BYTES: usize = 256 * 1024 * 1024;

fn config() -> Configuration<LittleEndian, Varint, Limit<MAX_DECODE_BYTES>> {
    bincode::config::standard().with_limit::<MAX_DECODE_BYTES>()
}

/// Encodes `value`; encoding our own types cannot fail short of a bug.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    bincode::serde::encode_to_vec(value, config()).expect("bincode encoding of timerdb types")
}

/// Appends `value`'s encoding to `out` (the same bytes `encode` returns).
pub fn encode_into<T: Serialize>(value: &T, out: &mut Vec<u8>) {
    bincode::serde::encode_into_std_write(value, out, config())
        .expect("bincode encoding of timerdb types");
}

/// Decodes bytes written by `encode`: all of them (bytes left over mean they were not).
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    let (value, read) = bincode::serde::decode_from_slice(bytes, config())
        .map_err(|e| Error::Storage(format!("corrupt value: {e}")))?;
    if read != bytes.len() {
        return Err(Error::Storage(format!(
            "corrupt value: {} bytes left over after it",
            bytes.len() - read
        )));
    }
    Ok(value)
}

/// Decodes one value from the front of `bytes`; returns it and how many bytes it took (for a
/// record followed by an optional extension, as a row is: see `row.rs`).
pub fn decode_prefix<T: DeserializeOwned>(bytes: &[u8]) -> Result<(T, usize)> {
    bincode::serde::decode_from_slice(bytes, config())
        .map_err(|e| Error::Storage(format!("corrupt value: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_length_claiming_more_than_there_is_fails_without_allocating_it() {
        // varint marker 253 = u64 follows: a byte vector "of" 2^40 bytes in 9 bytes.
        let mut bytes = vec![253u8];
        bytes.extend_from_slice(&(1u64 << 40).to_le_bytes());
        let r: Result<serde_bytes_like::Bytes> = decode(&bytes);
        assert!(r.is_err());
        let r: Result<Vec<u8>> = decode(&bytes);
        assert!(r.is_err());
        let r: Result<String> = decode(&bytes);
        assert!(r.is_err());
    }

    mod serde_bytes_like {
        #[derive(serde::Deserialize, Debug)]
        pub struct Bytes(#[allow(dead_code)] pub Vec<u8>);
    }
}
