//! The bytes of every entry form are pinned (`forms.golden`): an older build decodes a log
//! entry only if this build encodes it exactly as that build did, nested enums and all
//! (bincode names a variant by its index). `cluster::level` pins the `Command` tags; this
//! pins everything beneath them (review 33c, MED 5: a nested variant added to a form of
//! level 1 was invisible to that test).
//!
//! The golden file holds entries' bytes themselves (written once, never rewritten): each must
//! still decode to the same form and encode to the same bytes (review 33d, LOW 5: lines keyed
//! by a workload other tests edit could be re-blessed over a real change). Every `Command`
//! variant has examples (an exhaustive match says so), and the enums they carry have one per
//! variant where the determinism workload reaches none (push outcomes, lease acks, roles).
//! A new variant: `TIMERDB_BLESS=1 cargo test --lib forms` appends its examples; a changed
//! line means older builds can no longer read that form — put the new variant last, or give
//! the changed form a new level.

use super::*;
use crate::command::RecurringChange;
use crate::namespace::{Misfire, MisfireAction, Policy, PushTarget};

/// The forms a build writes: the mixed workload of the determinism tests, and each newer form
/// with every nested variant it can carry.
fn forms() -> Vec<Command> {
    let mut cmds = workload();
    let push = PushTarget {
        url: "https://receiver.example/hook".into(),
        secrets: vec!["whsec_AAAA".into(), "whsec_BBBB".into()],
        timeout_ms: 5_000,
        dead_on_client_error: true,
    };
    let policy = Policy {
        max_attempts: 3,
        ..Default::default()
    };
    let misfire = Misfire {
        max_lateness_ms: 60_000,
        action: MisfireAction::Skip,
    };
    cmds.push(Command::SetNamespace {
        name: "ns".into(),
        policy,
        push: Some(push.clone()),
        misfire,
    });
    cmds.push(Command::ConfigureNamespace {
        name: "ns".into(),
        policy,
        push: Some(push.clone()),
        misfire,
        keep_secrets: true,
    });
    let recurring: Vec<Command> = recurring::workload();
    let spec = recurring.iter().find_map(|c| match c {
        Command::ScheduleRecurring { spec, .. } => Some(spec.clone()),
        _ => None,
    });
    let spec = spec.expect("the series workload schedules a series");
    for change in [
        RecurringChange::Schedule {
            now_ms: T0,
            spec: spec.clone(),
        },
        RecurringChange::Upsert {
            now_ms: T0,
            spec: spec.clone(),
            cond: Default::default(),
        },
        RecurringChange::Pause {
            now_ms: T0,
            key: spec.key.clone(),
            paused: false,
        },
    ] {
        // Fixed rules, not this build's (`with_zone_rules`): a tzdb upgrade changes those.
        cmds.push(Command::ZoneRules {
            tzdb: "2026a".into(),
            zone_fp: 0x1234_5678_9abc_def0,
            change,
        });
    }
    cmds.push(Command::FireWithZones {
        tzdb: "2026a".into(),
        now_ms: T0,
        max: 100,
        grants: vec![crate::command::Grant {
            namespace: "ns".into(),
            room: 3,
            push: true,
        }],
    });
    cmds.push(Command::RaiseLevel { level: 1 });
    cmds.push(Command::Policy {
        name: "ns".into(),
        version: 42,
        policy,
        push: Some(push.clone()),
        misfire,
    });
    cmds.push(Command::Policy {
        name: "other".into(),
        version: 7,
        policy: Policy::default(),
        push: None,
        misfire: Misfire::default(),
    });
    // Forms the workload holds only inside a Multi, or only as their newer form.
    for when in [When::At(T0 + 5), When::After(40)] {
        cmds.push(Command::LegacyReschedule {
            now_ms: T0,
            key: TimerKey::new("ns", "r"),
            when,
        });
    }
    cmds.push(Command::UpsertRecurring {
        now_ms: T0,
        spec: spec.clone(),
        cond: Default::default(),
    });
    // Push outcomes, every variant of the attempt record's enums.
    use crate::command::LeaseRef;
    use crate::timer::{AttemptRecord, Channel, Outcome};
    let outcomes = [
        Outcome::Acked,
        Outcome::Nacked,
        Outcome::Expired,
        Outcome::InFlight,
        Outcome::Http(503),
        Outcome::Grpc(14),
        Outcome::Timeout,
        Outcome::Connection,
        Outcome::Misfired,
    ];
    for (n, outcome) in outcomes.into_iter().enumerate() {
        cmds.push(Command::Pushed {
            now_ms: T0,
            key: TimerKey::new("ns", "p"),
            attempt: 1 + n as u32,
            ok: n == 0,
            dead: n == 1,
            retry_after_ms: 250,
            record: AttemptRecord {
                at_ms: T0,
                attempt: 1 + n as u32,
                channel: [Channel::Push, Channel::Subscribe][n % 2],
                outcome,
                latency_ms: 12,
                detail: "detail".into(),
            },
        });
    }
    cmds.push(Command::PauseNamespace {
        name: "ns".into(),
        paused: true,
    });
    cmds.push(Command::Purge {
        now_ms: T0,
        namespace: "ns".into(),
        through: crate::wheel::Slot::new(9, 2),
    });
    cmds.push(Command::Acks {
        now_ms: T0,
        leases: vec![LeaseRef {
            namespace: "ns".into(),
            to: crate::wheel::Slot::new(3, 1),
        }],
        acks: vec![(TimerKey::new("ns", "a"), 2)],
    });
    cmds.push(Command::Access(crate::auth::AccessChange::PutKey(
        crate::auth::Key {
            id: "rd".into(),
            name: "reader".into(),
            secret_sha256: None,
            cert_name: Some("reader.example".into()),
            roles: vec![crate::auth::Role::parse("read:orders*").unwrap()],
            created_ms: T0,
        },
    )));
    cmds
}

/// The index of `cmd`'s variant: an exhaustive match, so a new variant needs an example.
fn variant(cmd: &Command) -> usize {
    match cmd {
        Command::LegacySchedule { .. } => 0,
        Command::ScheduleBatch { .. } => 1,
        Command::LegacyCancel { .. } => 2,
        Command::LegacyReschedule { .. } => 3,
        Command::Fire { .. } => 4,
        Command::Deliver { .. } => 5,
        Command::Ack { .. } => 6,
        Command::Acks { .. } => 7,
        Command::Nack { .. } => 8,
        Command::Pushed { .. } => 9,
        Command::PauseNamespace { .. } => 10,
        Command::Redrive { .. } => 11,
        Command::PutNamespace { .. } => 12,
        Command::Purge { .. } => 13,
        Command::Multi(_) => 14,
        Command::Access(_) => 15,
        Command::ScheduleRecurring { .. } => 16,
        Command::PauseRecurring { .. } => 17,
        Command::Schedule { .. } => 18,
        Command::Cancel { .. } => 19,
        Command::Reschedule { .. } => 20,
        Command::UpsertRecurring { .. } => 21,
        Command::SetNamespace { .. } => 22,
        Command::ConfigureNamespace { .. } => 23,
        Command::ZoneRules { .. } => 24,
        Command::FireWithZones { .. } => 25,
        Command::RaiseLevel { .. } => 26,
        Command::Policy { .. } => 27,
    }
}

/// How many examples of each variant the golden file keeps.
const PER_VARIANT: usize = 9;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

/// The golden file holds the bytes of older builds' entries themselves: each must decode to
/// the same form and encode to the same bytes, whatever the examples here become. A variant
/// without a line fails (its example is appended with `TIMERDB_BLESS=1`; lines already there
/// are never rewritten).
#[test]
fn every_entry_form_keeps_its_encoding() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src/storage/tests/forms.golden"
    );
    let all: std::collections::BTreeSet<usize> = forms().iter().map(variant).collect();
    assert_eq!(
        all.len(),
        28,
        "a Command variant has no example in forms(): {all:?}"
    );
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut covered = std::collections::BTreeSet::new();
    for (n, line) in text.lines().enumerate() {
        let mut parts = line.split(' ');
        let (Some(name), Some(level), Some(bytes)) = (parts.next(), parts.next(), parts.next())
        else {
            panic!("forms.golden line {}: not `name level hex`", n + 1)
        };
        let bytes = unhex(bytes);
        let cmd: Command = crate::storage::decode(&bytes).unwrap_or_else(|e| {
            panic!(
                "forms.golden line {} ({name}) no longer decodes: {e}",
                n + 1
            )
        });
        assert_eq!(cmd.name(), name, "line {} decodes to another form", n + 1);
        assert_eq!(
            cmd.level().to_string(),
            level,
            "line {}: its level moved",
            n + 1
        );
        assert_eq!(
            crate::storage::encode(&cmd),
            bytes,
            "line {} ({name}): this build encodes it otherwise, so older builds no longer read \
             what it writes (see forms.rs)",
            n + 1
        );
        covered.insert(variant(&cmd));
    }
    let missing: Vec<Command> = {
        let mut taken = std::collections::HashMap::<usize, usize>::new();
        forms()
            .into_iter()
            .filter(|c| !covered.contains(&variant(c)))
            .filter(|c| {
                let n = taken.entry(variant(c)).or_default();
                *n += 1;
                *n <= PER_VARIANT
            })
            .collect()
    };
    if missing.is_empty() {
        assert_eq!(covered, all, "forms.golden lacks a variant forms() has");
        return;
    }
    if std::env::var_os("TIMERDB_BLESS").is_none() {
        let names: Vec<&str> = missing.iter().map(Command::name).collect();
        panic!("forms without a pinned example: {names:?} (TIMERDB_BLESS=1, see forms.rs)");
    }
    let mut text = text;
    for cmd in &missing {
        let bytes = crate::storage::encode(cmd);
        text += &format!("{} {} {}\n", cmd.name(), cmd.level(), hex(&bytes));
    }
    std::fs::write(path, text).unwrap();
}
