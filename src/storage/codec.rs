//! The binary encoding of stored values and peer messages: bincode over serde.
//!
//! Compact and fast (no JSON on the hot path); private to one timerdb build.

use serde::{de::DeserializeOwned, Serialize};

use crate::{Error, Result};

fn config() -> bincode::config::Configuration {
    bincode::config::standard()
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

/// Decodes bytes written by `encode`.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    let (value, _) = bincode::serde::decode_from_slice(bytes, config())
        .map_err(|e| Error::Storage(format!("corrupt value: {e}")))?;
    Ok(value)
}
