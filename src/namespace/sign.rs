//! Standard Webhooks signatures (spec v1.0.0): what a receiver checks to know a request came
//! from this cluster and was not altered or replayed.
//!
//! `webhook-signature` is `v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{body}")>`, one entry
//! per secret, space-separated: during a rotation the namespace holds two secrets and a receiver
//! that knows either accepts the request. A secret is written `whsec_<base64 key>`; the key is
//! the decoded bytes. Signing is pure (no clock): the caller passes the attempt's timestamp.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::{Error, Result};

/// The prefix Standard Webhooks gives secrets.
pub const SECRET_PREFIX: &str = "whsec_";
/// Key sizes the spec allows, in bytes.
const KEY_BYTES: std::ops::RangeInclusive<usize> = 24..=64;

/// A decoded signing secret, kept as the HMAC state after the key (so that signing a message
/// costs only the message's hashing).
#[derive(Clone)]
pub struct Secret(Hmac<Sha256>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)") // never logged
    }
}

impl Secret {
    /// Parses `whsec_<base64>`, checking the key's size.
    pub fn parse(s: &str) -> Result<Secret> {
        let b64 = s.strip_prefix(SECRET_PREFIX).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "a push secret must start with {SECRET_PREFIX} (Standard Webhooks format)"
            ))
        })?;
        let key = STANDARD.decode(b64).map_err(|e| {
            Error::InvalidArgument(format!(
                "a push secret must be {SECRET_PREFIX} followed by base64: {e}"
            ))
        })?;
        if !KEY_BYTES.contains(&key.len()) {
            return Err(Error::InvalidArgument(format!(
                "a push secret's key is {} bytes; it must be 24 to 64",
                key.len()
            )));
        }
        Ok(Secret(
            Hmac::<Sha256>::new_from_slice(&key).expect("HMAC takes any key size"),
        ))
    }

    /// A new random secret (32 bytes), as text.
    pub fn generate() -> String {
        let key: [u8; 32] = rand::random();
        format!("{SECRET_PREFIX}{}", STANDARD.encode(key))
    }

    /// The `v1,<base64>` signature of one message.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let mut out = String::with_capacity(SIGNATURE_LEN);
        self.sign_into(&mut out, id, &timestamp.to_string(), body);
        out
    }

    /// Appends the `v1,<base64>` signature of one message to `out`.
    fn sign_into(&self, out: &mut String, id: &str, timestamp: &str, body: &[u8]) {
        let mut mac = self.0.clone();
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.as_bytes());
        mac.update(b".");
        mac.update(body);
        out.push_str("v1,");
        STANDARD.encode_string(mac.finalize().into_bytes(), out);
    }

    /// Whether `header` (a `webhook-signature` value) holds a valid signature of the message by
    /// this secret, compared in constant time. What a receiver does; the tests use it.
    pub fn verify(&self, header: &str, id: &str, timestamp: i64, body: &[u8]) -> bool {
        let want = self.sign(id, timestamp, body);
        header.split(' ').any(|sig| {
            let (a, b) = (sig.as_bytes(), want.as_bytes());
            a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
        })
    }
}

/// Length of one `v1,<base64 of 32 bytes>` signature.
const SIGNATURE_LEN: usize = 3 + 44;

/// The `webhook-signature` header for `secrets` (space-separated, one entry per secret).
pub fn signature_header(secrets: &[Secret], id: &str, timestamp: i64, body: &[u8]) -> String {
    let timestamp = timestamp.to_string();
    let mut out = String::with_capacity(secrets.len() * (SIGNATURE_LEN + 1));
    for (i, s) in secrets.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        s.sign_into(&mut out, id, &timestamp, body);
    }
    out
}

/// The `webhook-id` of a firing: stable across the attempts of one firing of one timer,
/// different for another timer or another firing (a redrive fires with a new fire_index).
pub fn message_id(namespace: &str, id: &str, fire_index: u64) -> String {
    let mut h = Sha256::new();
    h.update(namespace.as_bytes());
    h.update([0]);
    h.update(id.as_bytes());
    let digest = h.finalize();
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = format!("tdb_{fire_index}_");
    for b in &digest[..8] {
        out.push(HEX[(b >> 4) as usize] as char);
        out.push(HEX[(b & 15) as usize] as char);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The conformance vector of the Standard Webhooks reference libraries.
    #[test]
    fn signs_the_spec_vector() {
        let s = Secret::parse("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD").unwrap();
        let body = br#"{"email":"test@example.com","username":"test_user"}"#;
        let id = "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk";
        assert_eq!(
            s.sign(id, 1649367553, body),
            "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw="
        );
        assert!(s.verify(&s.sign(id, 1649367553, body), id, 1649367553, body));
        assert!(!s.verify(&s.sign(id, 1649367553, body), id, 1649367554, body));
        assert!(!s.verify(&s.sign(id, 1649367553, b"other"), id, 1649367553, body));
    }

    #[test]
    fn two_secrets_both_verify_and_generated_ones_parse() {
        let old = Secret::parse(&Secret::generate()).unwrap();
        let new = Secret::parse(&Secret::generate()).unwrap();
        let header = signature_header(&[old.clone(), new.clone()], "m", 7, b"x");
        assert_eq!(header.split(' ').count(), 2);
        assert!(old.verify(&header, "m", 7, b"x") && new.verify(&header, "m", 7, b"x"));
        let stranger = Secret::parse(&Secret::generate()).unwrap();
        assert!(!stranger.verify(&header, "m", 7, b"x"));
    }

    #[test]
    fn bad_secrets_are_refused() {
        for bad in ["C2FVsBQIhrscChlQIMV", "whsec_***", "whsec_AAAA"] {
            assert!(Secret::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn message_ids_are_stable_and_distinct() {
        assert_eq!(message_id("ns", "a", 5), message_id("ns", "a", 5));
        assert_ne!(message_id("ns", "a", 5), message_id("ns", "b", 5));
        assert_ne!(message_id("ns", "a", 5), message_id("ns", "a", 6));
        assert_ne!(message_id("n", "sa", 5), message_id("ns", "a", 5));
        // The hex of the first 8 bytes of SHA-256("ns\0a"), as receivers already stored it.
        let digest = Sha256::digest(b"ns\0a");
        let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(message_id("ns", "a", 5), format!("tdb_5_{hex}"));
    }
}
