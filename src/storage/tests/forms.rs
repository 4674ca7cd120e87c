//! The bytes of every entry form are pinned (`forms.golden`): an older build decodes a log
//! entry only if this build encodes it exactly as that build did, nested enums and all
//! (bincode names a variant by its index). `cluster::level` pins the `Command` tags; this
//! pins everything beneath them (review 33c, MED 5: a nested variant added to a form of
//! level 1 was invisible to that test).
//!
//! A line changed while the command that made it did not: older builds can no longer read
//! that form — put the new variant last, or give the changed form a new level. A new command
//! in the list: add its line with `TIMERDB_BLESS=1 cargo test --lib forms`.

use super::*;
use crate::namespace::{Misfire, MisfireAction, Policy, PushTarget};
use crate::storage::Fnv64;
use crate::timer::SeriesChange;

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
        push: Some(push),
        misfire,
        keep_secrets: true,
    });
    let series: Vec<Command> = series::workload();
    let spec = series.iter().find_map(|c| match c {
        Command::ScheduleSeries { spec, .. } => Some(spec.clone()),
        _ => None,
    });
    let spec = spec.expect("the series workload schedules a series");
    for change in [
        SeriesChange::Schedule {
            now_ms: T0,
            spec: spec.clone(),
        },
        SeriesChange::Upsert {
            now_ms: T0,
            spec: spec.clone(),
            cond: Default::default(),
        },
        SeriesChange::Pause {
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
        grants: vec![crate::timer::Grant {
            namespace: "ns".into(),
            room: 3,
            push: true,
        }],
    });
    cmds.push(Command::RaiseLevel { level: 1 });
    cmds
}

fn line(i: usize, cmd: &Command) -> String {
    let mut h = Fnv64::new();
    h.write(&crate::storage::encode(cmd));
    format!("{i} {} {} {:016x}", cmd.name(), cmd.level(), h.finish())
}

#[test]
fn every_entry_form_keeps_its_encoding() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src/storage/tests/forms.golden"
    );
    let now: Vec<String> = forms()
        .iter()
        .enumerate()
        .map(|(i, c)| line(i, c))
        .collect();
    if std::env::var_os("TIMERDB_BLESS").is_some() {
        std::fs::write(path, now.join("\n") + "\n").unwrap();
        return;
    }
    let pinned = std::fs::read_to_string(path).expect("forms.golden (TIMERDB_BLESS=1 makes it)");
    let pinned: Vec<&str> = pinned.lines().collect();
    for (i, line) in now.iter().enumerate() {
        match pinned.get(i) {
            Some(was) => assert_eq!(
                was, line,
                "the encoding of form {i} changed: older builds no longer read it (see forms.rs)"
            ),
            None => panic!("form {i} is not pinned: {line} (TIMERDB_BLESS=1, see forms.rs)"),
        }
    }
    assert_eq!(pinned.len(), now.len(), "forms were removed from the list");
}
