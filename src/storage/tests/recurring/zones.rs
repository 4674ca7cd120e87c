//! Series in time zones: a cron series follows its zone across DST; a replica keeps the
//! proposer's zone rules or stops, and a Fire naming this build's tzdb moves rows to its rules.

use super::*;

#[tokio::test]
async fn a_cron_recurring_timer_follows_its_zone_across_a_dst_change() {
    let mut s = Sm::new();
    // 02:30 every day in Berlin; 2027-03-28 02:30 does not exist (clocks go 02:00 -> 03:00).
    let mut r = every(SEC);
    r.rule = RuleSpec::Cron {
        expr: "30 2 * * *".into(),
        zone: "Europe/Berlin".into(),
    };
    let now = 1_806_019_200_000; // 2027-03-26T00:00:00Z
    s.apply(Command::ScheduleRecurring {
        now_ms: now,
        spec: RecurringSpec {
            key: TimerKey::new("ns", "dst"),
            recurrence: r,
            payload: vec![],
            content_type: String::new(),
        },
    })
    .await;
    // 03-26 01:30Z (CET), 03-27 01:30Z, 03-28 01:00Z (03:00 CEST, after the gap), 03-29 00:30Z.
    let want = [
        1_806_024_600_000,
        1_806_111_000_000,
        1_806_195_600_000,
        1_806_280_200_000,
    ];
    assert_eq!(recurring(&s, "dst").upcoming_ms[..4], want);
    for w in want {
        s.apply(fire(w, 100)).await;
        assert_eq!(occ(&s, "dst", w).unwrap().state, TimerState::Fired, "{w}");
    }
}

/// Review of issue 33: each replica stamped a new series with its own build's tzdb, so two
/// builds wrote different bytes for one entry (the digests differed), and the stop-don't-
/// diverge check compared each replica's rules with themselves. Now the proposer's stamp
/// travels in the command: stored as proposed, and a replica with other rules for the zone
/// stops before it writes anything.
#[tokio::test]
async fn a_recurring_timer_keeps_its_proposers_zone_rules_and_other_rules_stop_the_replica() {
    let mut cron = every(SEC);
    cron.rule = RuleSpec::Cron {
        expr: "30 2 * * *".into(),
        zone: "Europe/Berlin".into(),
    };
    let stamped = |id: &str, zone_fp: u64| Command::ZoneRules {
        tzdb: "2099a".into(),
        zone_fp,
        change: crate::command::RecurringChange::Schedule {
            now_ms: T0,
            spec: RecurringSpec {
                key: TimerKey::new("ns", id),
                recurrence: cron.clone(),
                payload: b"p".to_vec(),
                content_type: String::new(),
            },
        },
    };
    let mut s = Sm::new();
    let own = cron.zone_fingerprint();
    assert_ne!(own, 0);
    assert!(created(&s.apply(stamped("berlin", own)).await));
    assert_eq!(recurring(&s, "berlin").recurring.tzdb, "2099a");

    let before = s.store.digest().unwrap();
    s.next += 1;
    let refused =
        s.sm.apply_entries([entry(s.next - 1, stamped("other", own ^ 1))])
            .await;
    let e = refused.expect_err("a replica with other rules for the zone applied the entry");
    assert!(e.to_string().contains("other rules"), "{e}");
    assert_eq!(s.store.digest().unwrap(), before, "half an entry written");

    // A bare command (a builds' before ZoneRules, or one proposed while a member is older)
    // keeps the effect it had on those builds: the replica's own tzdb version.
    let bare = Command::ScheduleRecurring {
        now_ms: T0,
        spec: RecurringSpec {
            key: TimerKey::new("ns", "bare"),
            recurrence: cron.clone(),
            payload: b"p".to_vec(),
            content_type: String::new(),
        },
    };
    assert!(created(&s.apply(bare).await));
    assert_eq!(
        recurring(&s, "bare").recurring.tzdb,
        crate::recurring::tzdb_version(),
        "a bare command's effect changed from the older builds'"
    );
}

/// Gives the stored row of series `id` the tzdb version `tzdb` and, with `other_rules`, a
/// fingerprint of other rules for its zone: the row as a build with other rules left it.
fn stamp_row(s: &Sm, id: &str, tzdb: &str, other_rules: bool) {
    let db = &s.store.db;
    let k = TimerKey::new("ns", id).index_key(crate::keys::Space::of(0));
    let raw = db.get_cf(cf(db, CF_RECURRING), &k).unwrap().unwrap();
    let mut row: crate::recurring::RecurringTimer = codec::decode(&raw).unwrap();
    row.tzdb = tzdb.into();
    if other_rules {
        row.zone_fp ^= 1;
    }
    db.put_cf(cf(db, CF_RECURRING), &k, codec::encode(&row))
        .unwrap();
}

/// After an upgrade to a tzdb whose file for a zone changed, every row of a series in that
/// zone holds the old rules' fingerprint, and every replica stopped at the series' next fire,
/// even once all ran the new build (the review of issue 33's change). A Fire that names this
/// build's tzdb (its proposer runs it) moves the row to this build's rules and fires on; one
/// that names another version computes only a row stamped with that version whose rules are
/// this build's; a bare one (an older leader's) still needs the row's rules to be this
/// build's. Otherwise the replica stops rather than diverge.
#[tokio::test]
async fn a_fire_naming_this_builds_tzdb_moves_rows_to_its_rules_instead_of_stopping() {
    let mut cron = every(SEC);
    cron.rule = RuleSpec::Cron {
        expr: "30 2 * * *".into(),
        zone: "Europe/Berlin".into(),
    };
    let own = crate::recurring::tzdb_version().to_string();
    let fire_with = |tzdb: Option<&str>, now_ms: i64| match tzdb {
        Some(t) => Command::FireWithZones {
            tzdb: t.into(),
            now_ms,
            max: 100,
            grants: Vec::new(),
        },
        None => fire(now_ms, 100),
    };
    // (row's tzdb, its rules other than this build's, the Fire's tzdb, fires on)
    let cases = [
        ("2000a", true, None, false),
        ("2000a", true, Some(own.as_str()), true),
        ("2000a", true, Some("2000a"), false),
        ("2000a", false, Some("2000a"), true),
        ("1999z", false, Some("2000a"), false),
        ("2000a", false, None, true),
    ];
    for (row_tzdb, other_rules, named, fires_on) in cases {
        let case = format!("row {row_tzdb} other rules {other_rules}, Fire naming {named:?}");
        let mut s = Sm::new();
        assert!(created(&s.apply(create("berlin", cron.clone())).await));
        let first = recurring(&s, "berlin").upcoming_ms[0];
        stamp_row(&s, "berlin", row_tzdb, other_rules);
        let before = s.store.digest().unwrap();
        s.next += 1;
        let got =
            s.sm.apply_entries([entry(s.next - 1, fire_with(named, first + SEC))])
                .await;
        if !fires_on {
            assert!(got.is_err(), "{case}: computed with rules it cannot know");
            assert_eq!(
                s.store.digest().unwrap(),
                before,
                "{case}: half an entry written"
            );
            continue;
        }
        got.unwrap_or_else(|e| panic!("{case}: stopped: {e}"));
        let after = recurring(&s, "berlin");
        assert_eq!(after.recurring.fired, 1, "{case}");
        assert!(
            after.upcoming_ms[0] > first,
            "{case}: the next occurrence is planned"
        );
        if named == Some(own.as_str()) {
            assert_eq!(
                after.recurring.tzdb, own,
                "{case}: moved to this build's rules"
            );
            assert_eq!(after.recurring.zone_fp, cron.zone_fingerprint(), "{case}");
        } else {
            assert_eq!(after.recurring.tzdb, row_tzdb, "{case}");
        }
    }
}
