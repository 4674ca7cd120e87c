use super::Command;
use super::{Cond, RecurringChange, LEVEL};
use crate::codec::{decode, encode};
use crate::namespace::{Misfire, Policy};
use crate::recurring::{Recurrence, RecurringSpec};
use crate::timer::TimerKey;

/// How many variants `Command` had before the level (f8d3df2): bincode names a variant
/// by its index, so a build before the level decodes exactly indexes below this.
const LEVEL_0_VARIANTS: u8 = 23;

/// The bincode tag of `cmd` (a varint: a tag under 251 is its own first byte).
fn tag(cmd: &Command) -> u8 {
    encode(cmd)[0]
}

#[test]
fn the_older_forms_keep_their_place_and_every_newer_one_has_a_level() {
    let spec = RecurringSpec {
        key: TimerKey::new("ns", "s"),
        recurrence: Recurrence::every_for_test(1000),
        payload: vec![],
        content_type: String::new(),
    };
    let (name, policy, misfire) = ("ns".to_string(), Policy::default(), Misfire::default());
    let older = [
        (
            10,
            Command::PauseNamespace {
                name: name.clone(),
                paused: true,
            },
        ),
        (
            16,
            Command::ScheduleRecurring {
                now_ms: 1,
                spec: spec.clone(),
            },
        ),
        (
            21,
            Command::UpsertRecurring {
                now_ms: 1,
                spec: spec.clone(),
                cond: Cond::default(),
            },
        ),
        (
            22,
            Command::SetNamespace {
                name: name.clone(),
                policy,
                push: None,
                misfire,
            },
        ),
    ];
    for (at, cmd) in &older {
        assert_eq!(
            tag(cmd),
            *at,
            "{cmd:?} moved: older builds read another variant"
        );
        assert_eq!(cmd.level(), 0);
    }
    let newer = [
        Command::ConfigureNamespace {
            name,
            policy,
            push: None,
            misfire,
            keep_secrets: true,
        },
        Command::with_zone_rules(RecurringChange::Schedule { now_ms: 1, spec }),
        Command::FireWithZones {
            tzdb: "2026f".into(),
            now_ms: 1,
            max: 1,
            grants: vec![],
        },
        Command::RaiseLevel { level: 1 },
    ];
    let level_2 = [Command::Policy {
        name: "ns".into(),
        version: 3,
        policy,
        push: None,
        misfire,
    }];
    let newer = (newer.into_iter().map(|c| (c, 1))).chain(level_2.into_iter().map(|c| (c, 2)));
    for (cmd, level) in newer {
        assert!(tag(&cmd) >= LEVEL_0_VARIANTS, "{cmd:?}");
        assert_eq!(cmd.level(), level, "{cmd:?}");
        let multi = Command::Multi(vec![older[0].1.clone(), cmd]);
        assert_eq!(multi.level(), level, "a Multi is as new as its newest part");
    }
    assert_eq!(LEVEL, 2, "this build's level is its newest form's");
    assert_eq!(Command::Multi(vec![older[0].1.clone()]).level(), 0);
    let above = Command::RaiseLevel { level: LEVEL + 1 };
    assert_eq!(above.level(), LEVEL + 1, "a build below it must refuse it");
}

/// Review of issue 33's change: bincode has no depth limit, so bytes nesting a command in
/// a command a hundred thousand deep (a few hundred KB, from a peer) overflowed the
/// decoding thread's stack and killed the process. A Multi inside a Multi is refused.
#[test]
fn deeply_nested_commands_are_refused_not_a_stack_overflow() {
    let empty = encode(&Command::Multi(vec![]));
    let one = encode(&Command::Multi(vec![Command::Multi(vec![])]));
    assert!(decode::<Command>(&empty).is_ok());
    let e = decode::<Command>(&one).expect_err("a Multi inside a Multi");
    assert!(e.to_string().contains("a Multi inside a Multi"), "{e}");
    let prefix = &one[..one.len() - empty.len()];
    let mut deep = prefix.repeat(100_000);
    deep.extend_from_slice(&empty);
    // On a thread with a tokio worker's stack (2 MiB), as the peer service decodes.
    let decoded = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || decode::<Command>(&deep).is_err())
        .unwrap()
        .join()
        .expect("the decoding thread died");
    assert!(decoded);
    // The depth count is back to 0: a proper Multi decodes after a refused one.
    assert!(decode::<Command>(&empty).is_ok());
}

/// Issue 34 part 5: a follower decodes a ScheduleBatch entry of n timers with a number of
/// allocations that does not grow with n (it used to make three per timer: namespace, id,
/// payload), and into the same specs.
#[test]
fn a_batch_decodes_without_an_allocation_per_timer() {
    let spec = |i: usize| crate::timer::TimerSpec {
        key: crate::timer::TimerKey::new("orders", format!("order-{i}")),
        when: crate::timer::When::At(1_000 + i as i64),
        payload: vec![i as u8; 32],
        content_type: if i.is_multiple_of(2) {
            String::new()
        } else {
            "text/plain".into()
        },
    };
    let mut counts = Vec::new();
    for n in [1_000, 8_000] {
        let batch = Command::ScheduleBatch {
            now_ms: 7,
            specs: (0..n).map(spec).collect::<Vec<_>>().into(),
        };
        let bytes = encode(&batch);
        let (decoded, allocations) =
            crate::alloc_count::allocations(|| decode::<Command>(&bytes).unwrap());
        assert_eq!(decoded, batch);
        counts.push(allocations);
    }
    // Growing buffers reallocate a few times more for 8 times the timers; nothing per timer.
    assert!(
        counts[0] <= 64,
        "{counts:?} allocations for 1,000 and 8,000 timers"
    );
    assert!(
        counts[1] <= counts[0] + 16,
        "{counts:?} allocations for 1,000 and 8,000 timers"
    );
}

/// A log line names the command and counts a batch; it never lists the timers.
#[test]
fn a_command_displays_as_its_name_and_a_batch_as_its_size() {
    let ack = Command::Ack {
        now_ms: 1,
        key: crate::timer::TimerKey::new("ns", "id"),
        attempt: 1,
    };
    assert_eq!(ack.to_string(), "ack");
    let batch = Command::ScheduleBatch {
        now_ms: 1,
        specs: Default::default(),
    };
    assert_eq!(batch.to_string(), "schedule_batch(0)");
    assert_eq!(Command::Multi(vec![ack, batch]).to_string(), "multi(2)");
}

/// A plain folded command reads as what it does; its form keeps the conditional form's name
/// (`forms.golden` pins names), and a conditional one reads as that form.
#[test]
fn a_plain_folded_command_reads_as_what_it_does() {
    let key = TimerKey::new("ns", "id");
    let plain = Command::Cancel {
        now_ms: 1,
        key: key.clone(),
        cond: Cond::default(),
    };
    assert_eq!((plain.label(), plain.name()), ("cancel", "cancel_if"));
    assert_eq!(plain.to_string(), "cancel");
    let held = Command::Cancel {
        now_ms: 1,
        key,
        cond: Cond {
            if_state: Some(crate::timer::TimerState::Pending),
            ..Cond::default()
        },
    };
    assert_eq!((held.label(), held.name()), ("cancel_if", "cancel_if"));
}
