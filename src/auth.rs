//! Who may do what: API keys, their roles, and the replicated switch that turns checking on.
//!
//! The model is etcd's: the access state ([`AccessState`]: whether auth is on, and every key)
//! is replicated through the log like a namespace policy, so every node decides a call from
//! its own applied state and a revocation takes effect on a node as soon as it applies there.
//! Only what is needed to check a token is stored: a key's id, name, roles and the SHA-256 of
//! its secret (or the client-certificate name it stands for). The token itself,
//! `tdbk_<id>_<secret>`, is made by the leader's handler (randomness never enters apply) and
//! shown once.
//!
//! Invariants:
//! - Auth cannot be switched on while no key holds `admin`, and the last admin key cannot be
//!   revoked while it is on (apply refuses both), so a cluster cannot lock its operators out.
//!   A node's `--auth-bootstrap-token-file` is the break-glass credential besides.
//! - Checking a secret compares digests in constant time; a token never reaches a log line.
//! - A role names a namespace or a pattern ending in `*`; `*` alone is every namespace.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::{Error, Result};

/// What a namespace permission allows (docs/security.md, "Roles").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Permission {
    /// Schedule, ScheduleBatch, Cancel, Reschedule.
    Schedule,
    /// Get, List, GetNamespace, ListNamespaces.
    Read,
    /// Subscribe, Consume, Ack, AckBatch, Nack.
    Consume,
    /// PutNamespace, Pause/ResumeNamespace, Redrive.
    Manage,
}

impl Permission {
    pub const ALL: [Permission; 4] = [
        Permission::Schedule,
        Permission::Read,
        Permission::Consume,
        Permission::Manage,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Permission::Schedule => "schedule",
            Permission::Read => "read",
            Permission::Consume => "consume",
            Permission::Manage => "manage",
        }
    }
}

/// One role of a key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// Everything: membership, leadership, backups, keys, auth on/off, every namespace.
    Admin,
    /// `permission` on the namespaces `pattern` matches.
    Grant {
        permission: Permission,
        pattern: String,
    },
}

/// Longest namespace pattern of a role (namespaces are shorter still).
const MAX_PATTERN_BYTES: usize = 256;
/// Most roles one key holds.
pub const MAX_ROLES: usize = 64;
/// Longest key name or certificate name.
const MAX_NAME_BYTES: usize = 128;
/// Most keys the cluster holds (the whole access state is one value, read on every call).
pub const MAX_KEYS: usize = 10_000;

impl Role {
    /// Parses `admin` or `<permission>:<namespace pattern>` (`schedule:orders*`).
    pub fn parse(text: &str) -> Result<Role> {
        let bad = |why: &str| Error::InvalidArgument(format!("role {text:?}: {why}"));
        if text == "admin" {
            return Ok(Role::Admin);
        }
        let Some((perm, pattern)) = text.split_once(':') else {
            return Err(bad(
                "expected admin or <permission>:<namespace pattern>, e.g. schedule:orders*",
            ));
        };
        let permission = Permission::ALL
            .into_iter()
            .find(|p| p.name() == perm)
            .ok_or_else(|| bad("the permission must be schedule, read, consume or manage"))?;
        if pattern.is_empty() || pattern.len() > MAX_PATTERN_BYTES {
            return Err(bad(&format!(
                "the namespace pattern must be 1 to {MAX_PATTERN_BYTES} bytes"
            )));
        }
        if pattern[..pattern.len() - 1].contains('*') {
            return Err(bad("'*' may only end the namespace pattern"));
        }
        if pattern.chars().any(char::is_control) {
            return Err(bad("the namespace pattern holds a control character"));
        }
        Ok(Role::Grant {
            permission,
            pattern: pattern.to_string(),
        })
    }

    /// Whether this role allows `permission` on `namespace`.
    pub fn allows(&self, permission: Permission, namespace: &str) -> bool {
        match self {
            Role::Admin => true,
            Role::Grant {
                permission: p,
                pattern,
            } => *p == permission && matches(pattern, namespace),
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Role::Admin => f.write_str("admin"),
            Role::Grant {
                permission,
                pattern,
            } => write!(f, "{}:{pattern}", permission.name()),
        }
    }
}

/// Whether `pattern` (a name, or a prefix followed by `*`) matches `namespace`.
pub fn matches(pattern: &str, namespace: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => namespace.starts_with(prefix),
        None => pattern == namespace,
    }
}

/// A key as the state machine keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Key {
    /// Public, unique: the middle of the token, and what logs and `key list` show.
    pub id: String,
    /// A name for people (`billing-service`).
    pub name: String,
    /// SHA-256 of the token's secret; `None` for a certificate-only key.
    pub secret_sha256: Option<[u8; 32]>,
    /// A client certificate whose CN or DNS SAN is this name acts as this key (mTLS users).
    pub cert_name: Option<String>,
    pub roles: Vec<Role>,
    /// The replicated clock when it was created.
    pub created_ms: i64,
}

impl Key {
    pub fn is_admin(&self) -> bool {
        self.roles.contains(&Role::Admin)
    }

    /// Checks what a client may ask for; the leader's handler calls it before proposing.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidArgument(m));
        if self.name.is_empty() || self.name.len() > MAX_NAME_BYTES {
            return bad(format!("key name must be 1 to {MAX_NAME_BYTES} bytes"));
        }
        if self.roles.is_empty() || self.roles.len() > MAX_ROLES {
            return bad(format!("a key needs 1 to {MAX_ROLES} roles"));
        }
        if let Some(c) = &self.cert_name {
            if c.is_empty() || c.len() > MAX_NAME_BYTES {
                return bad(format!("cert_name must be 1 to {MAX_NAME_BYTES} bytes"));
            }
        }
        if self.secret_sha256.is_none() && self.cert_name.is_none() {
            return bad("a key needs a secret or a certificate name".into());
        }
        Ok(())
    }
}

/// The replicated access state: the switch and every key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessState {
    pub enabled: bool,
    /// By id.
    pub keys: BTreeMap<String, Key>,
    /// Ids of revoked keys, oldest first, the latest [`MAX_KEYS`]: a node refuses them at
    /// once, while it gives an id it has never seen a moment to arrive (`api::stack::auth`).
    pub revoked: std::collections::VecDeque<String>,
}

/// Why a credential was not accepted (UNAUTHENTICATED), for metrics and messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unauthenticated {
    Missing,
    Malformed,
    /// Unknown id or wrong secret: the same answer as revoked, so a caller learns nothing.
    Unknown,
    /// A revoked key (answered as `Unknown`; told apart for metrics and for waiting).
    Revoked,
    /// No token, and no key is bound to the client certificate presented.
    UnknownCert,
}

impl Unauthenticated {
    pub fn reason(self) -> &'static str {
        match self {
            Unauthenticated::Missing => "missing",
            Unauthenticated::Malformed => "malformed",
            Unauthenticated::Unknown => "unknown",
            Unauthenticated::Revoked => "revoked",
            Unauthenticated::UnknownCert => "unknown_cert",
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Unauthenticated::Missing => {
                "auth is on: send an API key as 'authorization: Bearer tdbk_...'"
            }
            Unauthenticated::Malformed => {
                "the authorization header is not 'Bearer tdbk_<id>_<secret>'"
            }
            Unauthenticated::Unknown | Unauthenticated::Revoked => "unknown or revoked API key",
            Unauthenticated::UnknownCert => {
                "no API key was sent, and no key is bound to the client certificate's names"
            }
        }
    }
}

impl AccessState {
    pub fn has_admin(&self) -> bool {
        self.keys.values().any(Key::is_admin)
    }

    /// The key a token names, if its secret is right.
    pub fn by_token(&self, token: &str) -> std::result::Result<&Key, Unauthenticated> {
        let (id, secret) = split_token(token).ok_or(Unauthenticated::Malformed)?;
        let Some(key) = self.keys.get(id) else {
            return Err(match self.revoked.contains(&id.to_string()) {
                true => Unauthenticated::Revoked,
                false => Unauthenticated::Unknown,
            });
        };
        match &key.secret_sha256 {
            Some(want) if digest_eq(&sha256(secret.as_bytes()), want) => Ok(key),
            _ => Err(Unauthenticated::Unknown),
        }
    }

    /// The key bound to a client-certificate name.
    pub fn by_cert_name(&self, name: &str) -> Option<&Key> {
        self.keys
            .values()
            .find(|k| k.cert_name.as_deref() == Some(name))
    }

    /// Applies a change (in apply: deterministic, reads nothing else). A refused change
    /// leaves the state as it was.
    pub fn change(&mut self, change: &AccessChange) -> Result<()> {
        match change {
            AccessChange::PutKey(key) => {
                if self.keys.len() >= MAX_KEYS && !self.keys.contains_key(&key.id) {
                    return Err(Error::ResourceExhausted(format!(
                        "the cluster holds {MAX_KEYS} keys already: revoke some first"
                    )));
                }
                if let Some(c) = &key.cert_name {
                    if let Some(other) = self.by_cert_name(c).filter(|o| o.id != key.id) {
                        return Err(Error::AlreadyExists(format!(
                            "certificate name {c:?} already belongs to key {}",
                            other.id
                        )));
                    }
                }
                self.keys.insert(key.id.clone(), key.clone());
            }
            AccessChange::RevokeKey(id) => {
                let Some(key) = self.keys.get(id) else {
                    // Revoked already: a repeat (a retry after a lost answer) changes nothing
                    // and is not refused, for the revocation did happen (DESIGN 9).
                    if self.revoked.contains(id) {
                        return Ok(());
                    }
                    return Err(Error::NotFound(format!("no key {id:?}")));
                };
                let admins = self.keys.values().filter(|k| k.is_admin()).count();
                if self.enabled && key.is_admin() && admins == 1 {
                    return Err(Error::FailedPrecondition(format!(
                        "key {id} is the last admin key and auth is on: create another admin \
                         key or disable auth first"
                    )));
                }
                self.keys.remove(id);
                self.revoked.push_back(id.clone());
                if self.revoked.len() > MAX_KEYS {
                    self.revoked.pop_front();
                }
            }
            AccessChange::Enable(on) => {
                if *on && !self.has_admin() {
                    return Err(Error::FailedPrecondition(
                        "auth cannot be enabled while no key holds the admin role (create one \
                         first: timerctl auth key create NAME --role admin)"
                            .into(),
                    ));
                }
                self.enabled = *on;
            }
        }
        Ok(())
    }
}

/// Who a call comes from, as the auth layer found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// Auth is off: anyone may do anything.
    Anyone,
    /// The node's `--auth-bootstrap-token-file` token: an admin, on this node only.
    Bootstrap,
    Key(Key),
}

impl Principal {
    pub fn is_admin(&self) -> bool {
        match self {
            Principal::Anyone | Principal::Bootstrap => true,
            Principal::Key(k) => k.is_admin(),
        }
    }

    /// Whether the caller may use `permission` in `namespace`.
    pub fn allows(&self, permission: Permission, namespace: &str) -> bool {
        match self {
            Principal::Key(k) => k.roles.iter().any(|r| r.allows(permission, namespace)),
            _ => self.is_admin(),
        }
    }

    /// Whether the caller may use `permission` in every namespace (admin, or a grant on `*`).
    pub fn allows_every(&self, permission: Permission) -> bool {
        match self {
            Principal::Key(k) => k.roles.iter().any(|r| match r {
                Role::Admin => true,
                Role::Grant {
                    permission: p,
                    pattern,
                } => *p == permission && pattern == "*",
            }),
            _ => self.is_admin(),
        }
    }

    /// For messages and logs: never a secret.
    pub fn describe(&self) -> String {
        match self {
            Principal::Anyone => "anyone (auth is off)".into(),
            Principal::Bootstrap => "the bootstrap token".into(),
            Principal::Key(k) => format!("key {} ({})", k.id, k.name),
        }
    }

    /// The roles, as text.
    pub fn roles(&self) -> Vec<String> {
        match self {
            Principal::Key(k) => k.roles.iter().map(Role::to_string).collect(),
            _ => vec!["admin".into()],
        }
    }
}

/// A change to the access state (the payload of `Command::Access`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AccessChange {
    PutKey(Key),
    RevokeKey(String),
    Enable(bool),
}

/// The prefix of every token.
pub const TOKEN_PREFIX: &str = "tdbk_";

/// `(id, secret)` of a `tdbk_<id>_<secret>` token.
pub fn split_token(token: &str) -> Option<(&str, &str)> {
    let rest = token.strip_prefix(TOKEN_PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    let ok = |s: &str| !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_hexdigit());
    (ok(id) && ok(secret)).then_some((id, secret))
}

/// A new key id and token for it, from 8 + 32 random bytes (the caller's randomness: the
/// leader's handler, never apply).
pub fn new_token(random: &[u8; 40]) -> (String, String, [u8; 32]) {
    let id = hex(&random[..8]);
    let secret = hex(&random[8..]);
    let token = format!("{TOKEN_PREFIX}{id}_{secret}");
    (id, token, sha256(secret.as_bytes()))
}

pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// Compares two digests without an early exit, so the time taken says nothing of where
/// they differ.
pub fn digest_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str, roles: &[&str], secret: Option<&str>) -> Key {
        Key {
            id: id.into(),
            name: format!("{id}-name"),
            secret_sha256: secret.map(|s| sha256(s.as_bytes())),
            cert_name: None,
            roles: roles.iter().map(|r| Role::parse(r).unwrap()).collect(),
            created_ms: 0,
        }
    }

    #[test]
    fn patterns_match_a_name_or_a_prefix() {
        assert!(matches("orders", "orders"));
        assert!(!matches("orders", "orders-eu"));
        assert!(matches("orders*", "orders-eu"));
        assert!(matches("orders*", "orders"));
        assert!(!matches("orders*", "billing"));
        assert!(matches("*", "anything"));
    }

    #[test]
    fn roles_parse_and_print_back_and_bad_ones_are_named() {
        for text in [
            "admin",
            "schedule:orders*",
            "read:*",
            "consume:a",
            "manage:b*",
        ] {
            assert_eq!(Role::parse(text).unwrap().to_string(), text);
        }
        for (text, says) in [
            ("root", "expected admin"),
            ("write:orders", "schedule, read, consume or manage"),
            ("read:", "1 to 256"),
            ("read:a*b", "may only end"),
            ("read:*a", "may only end"),
        ] {
            let e = Role::parse(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn a_grant_allows_only_its_permission_on_its_namespaces() {
        let r = Role::parse("schedule:orders*").unwrap();
        assert!(r.allows(Permission::Schedule, "orders-1"));
        assert!(!r.allows(Permission::Schedule, "billing"));
        assert!(!r.allows(Permission::Read, "orders-1"));
        assert!(Role::Admin.allows(Permission::Manage, "billing"));
    }

    #[test]
    fn tokens_check_against_the_stored_digest_only() {
        let (id, token, digest) = new_token(&[7; 40]);
        let mut state = AccessState::default();
        let mut k = key(&id, &["admin"], None);
        k.secret_sha256 = Some(digest);
        state.change(&AccessChange::PutKey(k)).unwrap();
        assert_eq!(state.by_token(&token).unwrap().id, id);
        let wrong = format!("{TOKEN_PREFIX}{id}_{}", "0".repeat(64));
        assert_eq!(state.by_token(&wrong), Err(Unauthenticated::Unknown));
        let other = format!("{TOKEN_PREFIX}{}_{}", "ab".repeat(8), "0".repeat(64));
        assert_eq!(state.by_token(&other), Err(Unauthenticated::Unknown));
        for bad in ["", "tdbk_", "tdbk_x_y", "Bearer", "tdbk_abc", "tdbk__ab"] {
            assert_eq!(
                state.by_token(bad),
                Err(Unauthenticated::Malformed),
                "{bad}"
            );
        }
    }

    #[test]
    fn auth_cannot_be_enabled_without_an_admin_nor_lose_its_last_admin() {
        let mut s = AccessState::default();
        s.change(&AccessChange::PutKey(key("aa", &["read:*"], Some("1"))))
            .unwrap();
        let e = s.change(&AccessChange::Enable(true)).unwrap_err();
        assert!(e.to_string().contains("no key holds the admin role"), "{e}");
        assert!(!s.enabled);
        s.change(&AccessChange::PutKey(key("bb", &["admin"], Some("2"))))
            .unwrap();
        s.change(&AccessChange::Enable(true)).unwrap();
        let e = s.change(&AccessChange::RevokeKey("bb".into())).unwrap_err();
        assert!(e.to_string().contains("last admin key"), "{e}");
        s.change(&AccessChange::RevokeKey("aa".into())).unwrap();
        // A repeat of a revocation that happened changes nothing and is not refused (DESIGN
        // 9: a retry after a lost answer); a key never seen is not found.
        let before = s.clone();
        s.change(&AccessChange::RevokeKey("aa".into())).unwrap();
        assert_eq!(s, before);
        let e = s.change(&AccessChange::RevokeKey("zz".into())).unwrap_err();
        assert!(matches!(e, Error::NotFound(_)));
        s.change(&AccessChange::Enable(false)).unwrap();
        s.change(&AccessChange::RevokeKey("bb".into())).unwrap();
        assert!(s.keys.is_empty());
        // A revoked key is told from one never seen (answered alike; waited for differently).
        let token = |id: &str| format!("{TOKEN_PREFIX}{id}_{}", "0".repeat(64));
        assert_eq!(s.by_token(&token("bb")), Err(Unauthenticated::Revoked));
        assert_eq!(s.by_token(&token("cc")), Err(Unauthenticated::Unknown));
    }

    #[test]
    fn a_certificate_name_belongs_to_one_key() {
        let mut s = AccessState::default();
        let mut a = key("aa", &["admin"], None);
        a.cert_name = Some("ops".into());
        s.change(&AccessChange::PutKey(a.clone())).unwrap();
        let mut b = key("bb", &["read:*"], None);
        b.cert_name = Some("ops".into());
        let e = s.change(&AccessChange::PutKey(b)).unwrap_err();
        assert!(matches!(e, Error::AlreadyExists(_)), "{e}");
        assert_eq!(s.by_cert_name("ops").unwrap().id, "aa");
    }
}
