//! The access state as replicated state: applied alike, refused changes write nothing, the
//! in-memory copy follows every entry, a restart and a snapshot carry it.

use super::*;
use crate::auth::{AccessChange, Key, Role};

fn key(id: &str, role: &str) -> Key {
    Key {
        id: id.into(),
        name: format!("{id}-name"),
        secret_sha256: Some(crate::auth::sha256(id.as_bytes())),
        cert_name: None,
        roles: vec![Role::parse(role).unwrap()],
        created_ms: T0,
    }
}

fn put(id: &str, role: &str) -> Command {
    Command::Access(AccessChange::PutKey(key(id, role)))
}

#[tokio::test]
async fn access_changes_apply_in_order_and_a_refused_one_writes_nothing() {
    let mut s = Sm::new();
    let stored = |s: &Sm| {
        let db = s.store.db();
        db.get_cf(
            cf(db, CF_META),
            crate::keys::Space::of(0).meta_key(meta::ACCESS),
        )
        .unwrap()
    };
    let r = s.apply(Command::Access(AccessChange::Enable(true))).await;
    assert!(matches!(
        r,
        Response::Rejected(Rejection::Access(Error::FailedPrecondition(_)))
    ));
    assert!(!s.store.access().enabled);
    assert_eq!(stored(&s), None, "a refused change wrote");

    s.apply(put("aa", "read:*")).await;
    // In one entry: a key, then the switch (which sees the key), beside a schedule.
    let r = s
        .apply(Command::Multi(vec![
            put("bb", "admin"),
            Command::Access(AccessChange::Enable(true)),
            schedule("t", T0 + 10),
        ]))
        .await;
    let Response::Multi(rs) = r else {
        panic!("{r:?}")
    };
    assert_eq!(
        rs[1],
        Response::Access {
            enabled: true,
            key: None
        }
    );
    let state = s.store.access();
    assert!(state.enabled);
    assert_eq!(state.keys.len(), 2);
    assert!(stored(&s).is_some());

    let r = s
        .apply(Command::Access(AccessChange::RevokeKey("aa".into())))
        .await;
    assert_eq!(
        r,
        Response::Access {
            enabled: true,
            key: Some(key("aa", "read:*"))
        }
    );
    assert!(!s.store.access().keys.contains_key("aa"));
    // A repeat (a retry after a lost answer) is not refused: the revocation happened.
    let again = s
        .apply(Command::Access(AccessChange::RevokeKey("aa".into())))
        .await;
    assert_eq!(
        again,
        Response::Access {
            enabled: true,
            key: None
        }
    );

    // Another replica from a snapshot, and this one after a restart, hold the same state.
    let (other, _) = replica_from_snapshot(&mut s.sm).await;
    assert_eq!(*other.store.access(), *s.store.access());
    let Sm {
        _dir, sm, store, ..
    } = s;
    let want = sm.store.access();
    drop((sm, store, other));
    let (_, again) = open(&_dir);
    assert_eq!(*again.store.access(), *want);
}

#[tokio::test]
async fn two_replicas_applying_the_same_access_log_agree() {
    let cmds = vec![
        put("k1", "schedule:orders*"),
        put("k2", "admin"),
        Command::Access(AccessChange::Enable(true)),
        Command::Access(AccessChange::RevokeKey("k2".into())), // last admin: refused
        put("k3", "admin"),
        Command::Access(AccessChange::RevokeKey("k2".into())),
        Command::Access(AccessChange::RevokeKey("nope".into())),
    ];
    let (mut one, mut two) = (Sm::new(), Sm::new());
    let mut a = Vec::new();
    for c in cmds.clone() {
        a.push(one.apply(c).await);
    }
    let mut b = Vec::new();
    for c in cmds {
        b.push(two.apply(c).await);
    }
    assert_eq!(a, b);
    assert!(matches!(a[3], Response::Rejected(_)));
    assert!(matches!(
        a[6],
        Response::Rejected(Rejection::Access(Error::NotFound(_)))
    ));
    assert_eq!(one.store.digest().unwrap(), two.store.digest().unwrap());
    let ids: Vec<_> = one.store.access().keys.keys().cloned().collect();
    assert_eq!(ids, ["k1", "k3"]);
}

/// The committed feature level is replicated state like the access state: raised only, by
/// one entry or inside a Multi, kept by a restart and carried by a snapshot (`level.rs`).
#[tokio::test]
async fn the_committed_level_only_rises_and_survives_restart_and_snapshot() {
    let mut s = Sm::new();
    assert_eq!(s.store.committed_level(), 0);
    s.apply(Command::RaiseLevel { level: 1 }).await;
    assert_eq!(s.store.committed_level(), 1);
    s.apply(Command::RaiseLevel { level: 0 }).await;
    assert_eq!(s.store.committed_level(), 1, "a level is never lowered");
    // In one entry, the second part sees the first's raise (and does not lower it).
    s.apply(Command::Multi(vec![
        Command::RaiseLevel { level: 3 },
        Command::RaiseLevel { level: 2 },
        schedule("t", T0 + 10),
    ]))
    .await;
    assert_eq!(s.store.committed_level(), 3);

    let (other, _) = replica_from_snapshot(&mut s.sm).await;
    assert_eq!(other.store.committed_level(), 3, "a snapshot carries it");
    assert_eq!(other.store.digest().unwrap().1, s.store.digest().unwrap().1);
    let Sm {
        _dir, sm, store, ..
    } = s;
    drop((sm, store, other));
    let (_, again) = open(&_dir);
    assert_eq!(again.store.committed_level(), 3, "a restart keeps it");
}
