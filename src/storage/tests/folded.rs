//! The folded commands (issue 35): a Schedule, Cancel or Reschedule is one command with
//! optional conditions, and the first forms of the three (`Legacy*`, variants 0, 2 and 3)
//! are still read from older logs. Each legacy entry must apply exactly as the folded one a
//! node proposes now — the same answer, the same state — or two replicas, one replaying its
//! old log and one fed the new form by a snapshot, could differ.

use openraft::RaftLogReader;

use super::*;
use crate::command::{Cond, Options, Shift};
use crate::recurring::{Recurrence, RecurringSpec};

/// One step in both forms: (legacy, folded).
fn pairs() -> Vec<(Command, Command)> {
    let key = |id: &str| TimerKey::new("ns", id);
    let both_schedule = |id: &str, at: i64, payload: &str| {
        (
            Command::LegacySchedule {
                now_ms: T0,
                spec: spec(id, at, payload),
            },
            Command::Schedule {
                now_ms: T0,
                spec: spec(id, at, payload),
                with: Options::default(),
            },
        )
    };
    let both_cancel = |id: &str| {
        (
            Command::LegacyCancel {
                now_ms: T0 + 1,
                key: key(id),
            },
            Command::Cancel {
                now_ms: T0 + 1,
                key: key(id),
                cond: Cond::default(),
            },
        )
    };
    let both_reschedule = |id: &str, at: i64| {
        (
            Command::LegacyReschedule {
                now_ms: T0 + 2,
                key: key(id),
                when: When::At(at),
            },
            Command::Reschedule {
                now_ms: T0 + 2,
                key: key(id),
                shift: Shift::To(When::At(at)),
                cond: Cond::default(),
            },
        )
    };
    let recurring = Command::ScheduleRecurring {
        now_ms: T0,
        spec: RecurringSpec {
            key: key("tick"),
            recurrence: Recurrence::every_for_test(60_000),
            payload: b"s".to_vec(),
            content_type: String::new(),
        },
    };
    // A Schedule whose spec the caller shapes (a relative time, a content type).
    let both_spec = |now_ms: i64, spec: TimerSpec| {
        (
            Command::LegacySchedule {
                now_ms,
                spec: spec.clone(),
            },
            Command::Schedule {
                now_ms,
                spec,
                with: Options::default(),
            },
        )
    };
    let after = |id: &str, ms: i64, content_type: &str| TimerSpec {
        key: key(id),
        when: When::After(ms),
        payload: b"p".to_vec(),
        content_type: content_type.into(),
    };
    let same = |c: Command| (c.clone(), c);
    let multi = |pairs: Vec<(Command, Command)>| {
        let (a, b): (Vec<_>, Vec<_>) = pairs.into_iter().unzip();
        (Command::Multi(a), Command::Multi(b))
    };
    vec![
        both_schedule("a", T0 + 100, "p"),
        both_schedule("a", T0 + 100, "p"), // a repeat: created = false
        both_schedule("a", T0 + 100, "other"), // another: AlreadyExists
        both_schedule("b", T0 + 5, "p"),
        both_reschedule("a", T0 + 500),
        both_reschedule("missing", T0 + 500),
        both_cancel("b"),
        both_cancel("b"), // again: still CANCELLED, answered
        both_cancel("missing"),
        // In one entry, where the later commands read what the earlier staged.
        multi(vec![
            both_schedule("m", T0 + 50, "p"),
            both_reschedule("m", T0 + 60),
            both_schedule("m", T0 + 60, "p"),
            both_cancel("m"),
        ]),
        both_schedule("c", T0 + 10, "p"),
        same(Command::Fire {
            now_ms: T0 + 20,
            max: 100,
            grants: Vec::new(),
        }),
        both_reschedule("c", T0 + 900),   // FIRED: refused
        both_cancel("c"),                 // FIRED: refused
        both_schedule("c", T0 + 10, "p"), // a repeat of a FIRED timer
        both_schedule("c", T0 + 10, "q"), // another over a FIRED one
        // Relative times: a repeat proposed later names a later time, yet is the same request.
        both_spec(T0, after("r", 1_000, "")),
        both_spec(T0 + 3, after("r", 1_000, "")),
        both_spec(T0 + 3, after("r", 2_000, "")),
        // Content types: the default spelled out, and another.
        both_spec(T0, after("t", 1_000, "text/plain")),
        both_spec(T0, after("t", 1_000, "")),
        both_spec(T0, after("t", 1_000, "text/plain")),
        both_spec(T0, after("d", 1_000, "")),
        both_spec(T0, after("d", 1_000, "application/octet-stream")),
        same(recurring),
        both_schedule("tick", T0 + 10, "p"), // a recurring timer's id
        both_reschedule("tick", T0 + 10),
        both_cancel("tick"), // deletes the series
        // A batch, then a Multi of plain forms over fired, cancelled and batched timers. (A
        // Multi holding a batch answers with the entry itself, which differs between the two
        // forms by construction: `the_two_apply_paths_agree_beside_a_batch` covers that one.)
        same(Command::ScheduleBatch {
            now_ms: T0,
            specs: vec![spec("b", T0 + 5, "p"), spec("n1", T0 + 5, "p")].into(),
        }),
        multi(vec![
            both_schedule("c", T0 + 10, "p"),
            both_schedule("n1", T0 + 5, "p"),
            both_schedule("n2", T0 + 5, "p"),
            both_cancel("n2"),
            both_schedule("n2", T0 + 5, "p"),
        ]),
    ]
}

/// Applied one entry at a time to three state machines — the legacy forms; the folded forms;
/// the folded forms with a plain Schedule taken by `schedule_with`, as builds before the fold
/// apply it (this build takes the fast path, `schedule`) — every step answers alike and leaves
/// the same state.
#[tokio::test]
async fn each_legacy_form_applies_as_its_folded_form() {
    let (mut legacy, mut folded, mut general) = (Sm::new(), Sm::new(), Sm::new());
    general.sm.apply_plain_schedules_generally();
    for (i, (old, new)) in pairs().into_iter().enumerate() {
        let a = legacy.apply(old.clone()).await;
        let b = folded.apply(new.clone()).await;
        let c = general.apply(new).await;
        assert_eq!(a, b, "step {i}: {} answers otherwise", old.name());
        assert_eq!(b, c, "step {i}: the two apply paths answer otherwise");
        let digests = [&legacy, &folded, &general].map(|s| s.store.digest().unwrap());
        assert_eq!(
            digests[0],
            digests[1],
            "step {i}: {} leaves another state",
            old.name()
        );
        assert_eq!(
            digests[1], digests[2],
            "step {i}: the two apply paths leave other states"
        );
    }
}

/// A Multi mixing plain Schedules with a batch that names the same timers, applied by this
/// build's fast path and by the general path older builds take: same answers, same state.
#[tokio::test]
async fn the_two_apply_paths_agree_beside_a_batch() {
    let plain = |id: &str| Command::Schedule {
        now_ms: T0,
        spec: spec(id, T0 + 5, "p"),
        with: Options::default(),
    };
    let entry = Command::Multi(vec![
        plain("x"),
        Command::ScheduleBatch {
            now_ms: T0,
            specs: vec![spec("x", T0 + 5, "p"), spec("y", T0 + 5, "p")].into(),
        },
        plain("y"),
        plain("z"),
        Command::ScheduleBatch {
            now_ms: T0,
            specs: vec![spec("z", T0 + 5, "other")].into(),
        },
    ]);
    let (mut fast, mut general) = (Sm::new(), Sm::new());
    general.sm.apply_plain_schedules_generally();
    for cmd in [entry.clone(), entry] {
        let (a, b) = (fast.apply(cmd.clone()).await, general.apply(cmd).await);
        assert_eq!(a, b, "the two apply paths answer otherwise");
        assert_eq!(
            fast.store.digest().unwrap(),
            general.store.digest().unwrap()
        );
    }
}

/// A data directory whose log holds the legacy forms (as a build before the fold wrote them,
/// bytes pinned by `forms.golden`) and whose state machine has not applied them yet, opened
/// by this build: the entries read back from the log and apply to the state the folded forms
/// give.
#[tokio::test]
async fn a_log_of_legacy_forms_replays_to_the_folded_state() {
    let dir = TempDir::new().unwrap();
    let (olds, news): (Vec<_>, Vec<_>) = pairs().into_iter().unzip();
    {
        let (log, _) = open(&dir);
        let entries: Vec<Entry> = olds
            .iter()
            .enumerate()
            .map(|(i, cmd)| entry(i as u64 + 1, cmd.clone()))
            .collect();
        log.write_stored(&entries);
    }
    let (mut log, mut sm) = open(&dir);
    let n = olds.len() as u64;
    let read = log.try_get_log_entries(1..n + 1).await.unwrap();
    assert_eq!(read.len(), olds.len(), "every entry reads back");
    for (e, old) in read.iter().zip(&olds) {
        match &e.payload {
            EntryPayload::Normal(cmd) => assert_eq!(&**cmd, old, "decoded as written"),
            other => panic!("entry {} is {other:?}", e.log_id.index),
        }
    }
    let replayed = sm.apply_entries(read).await.unwrap();
    let mut folded = Sm::new();
    for (i, (cmd, answer)) in news.into_iter().zip(replayed).enumerate() {
        assert_eq!(folded.apply(cmd).await, answer, "entry {}", i + 1);
    }
    assert_eq!(sm.store.digest().unwrap(), folded.store.digest().unwrap());
}
