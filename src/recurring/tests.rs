//! The pure parts of a series: occurrence names, jitter, counting the missed, and the
//! validation of a recurrence (each bad field named).

use super::*;

fn every(period_ms: i64) -> Recurrence {
    Recurrence::every_for_test(period_ms)
}

#[test]
fn occurrence_ids_name_the_nominal_time_and_parse_back() {
    let t = 1_800_000_000_123;
    let id = occurrence_id("daily@report", t);
    assert_eq!(id, "daily@report@2027-01-15T08:00:00.123Z");
    assert_eq!(id.len(), "daily@report".len() + OCCURRENCE_SUFFIX_BYTES);
    assert_eq!(parse_occurrence(&id), Some(("daily@report", t)));
    for not in [
        "plain",
        "a@b",
        "x@2027-01-15T08:00:00Z", // no milliseconds
        "x@2027-01-15T08:00:00.123+01:00",
        "x@2027-01-15t08:00:00.123Z", // not as we write it
        "x@2027-02-30T08:00:00.123Z", // no such day
    ] {
        assert_eq!(parse_occurrence(not), None, "{not}");
    }
}

#[test]
fn jitter_is_stable_bounded_and_spread() {
    let key = TimerKey::new("ns", "herd");
    assert_eq!(jitter(&key, 1, 0), 0);
    let offsets: Vec<i64> = (0..200).map(|i| jitter(&key, i * 60_000, 10_000)).collect();
    assert!(offsets.iter().all(|o| (0..10_000).contains(o)));
    let distinct: std::collections::HashSet<_> = offsets.iter().collect();
    assert!(distinct.len() > 150, "{} distinct of 200", distinct.len());
    // The same on every call (and, being SHA-256, on every build): a fixed value.
    assert_eq!(jitter(&key, 0, 10_000), jitter(&key, 0, 10_000));
    let other = TimerKey::new("ns", "herd2");
    assert_ne!(
        (0..20)
            .map(|i| jitter(&key, i, 1 << 40))
            .collect::<Vec<_>>(),
        (0..20)
            .map(|i| jitter(&other, i, 1 << 40))
            .collect::<Vec<_>>()
    );
}

#[test]
fn missed_occurrences_are_counted_by_arithmetic_or_by_walking() {
    let every = Rule::every(1000, 500).unwrap();
    assert_eq!(count_between(&every, 500, 10_500), 10);
    assert_eq!(count_between(&every, 500, 10_499), 9);
    assert_eq!(count_between(&every, 0, 400), 0);
    let cron = Rule::cron("*/10 * * * * *", "UTC").unwrap();
    assert_eq!(count_between(&cron, 0, 60_000), 6);
    assert_eq!(count_between(&cron, 0, i64::MAX / 2), MAX_MISSED_WALK);
}

#[test]
fn a_recurrence_names_the_field_it_refuses() {
    let bad = |r: Recurrence, field: &str| {
        let e = r.validate().expect_err(field).to_string();
        assert!(e.contains(field), "{field}: {e}");
    };
    bad(every(0), "recurrence.every");
    bad(every(999), "recurrence.every_ms");
    bad(
        Recurrence {
            start_ms: 2_000,
            end_ms: 1_000,
            ..every(1000)
        },
        "recurrence.end_ms",
    );
    bad(
        Recurrence {
            jitter_ms: MAX_JITTER_MS + 1,
            ..every(1000)
        },
        "recurrence.jitter_ms",
    );
    let cron = |expr: &str, zone: &str| Recurrence {
        rule: RuleSpec::Cron {
            expr: expr.into(),
            zone: zone.into(),
        },
        ..every(1000)
    };
    bad(cron("61 * * * *", "UTC"), "recurrence.cron");
    bad(cron("* * *", "UTC"), "recurrence.cron");
    bad(
        cron("0 9 * * MON-FRI", "Mars/Olympus"),
        "recurrence.time_zone",
    );
    bad(cron("0 9 * * MON-FRI", ""), "recurrence.time_zone");
    bad(cron("0 0 30 2 *", "UTC"), "recurrence.cron never matches");
    bad(
        Recurrence {
            start_ms: 1_800_000_000_000,
            end_ms: 1_800_000_000_500,
            ..cron("0 9 * * *", "UTC")
        },
        "no occurrence between",
    );
    assert!(cron("0 9 * * MON-FRI", "Europe/Berlin").validate().is_ok());
    assert!(every(1000).validate().is_ok());
}

#[test]
fn a_recurring_timer_refuses_to_compute_with_other_zone_rules() {
    let spec = RecurringSpec {
        key: TimerKey::new("ns", "s"),
        recurrence: Recurrence {
            rule: RuleSpec::Cron {
                expr: "0 9 * * *".into(),
                zone: "Europe/Berlin".into(),
            },
            ..every(1000)
        },
        payload: vec![],
        content_type: String::new(),
    };
    let mut s = RecurringTimer::new(spec, 1_800_000_000_000);
    assert!(s.rule().is_ok());
    assert_eq!(s.tzdb, tzdb_version());
    s.zone_fp ^= 1; // as if computed by a build with other rules for Berlin
    let e = s.rule().unwrap_err().to_string();
    assert!(e.contains("tzdb") && e.contains("Europe/Berlin"), "{e}");
}

#[test]
fn following_respects_start_end_and_max_count() {
    let spec = |r: Recurrence| RecurringSpec {
        key: TimerKey::new("ns", "s"),
        recurrence: r,
        payload: vec![],
        content_type: String::new(),
    };
    let now = 1_800_000_000_000;
    let s = RecurringTimer::new(
        spec(Recurrence {
            start_ms: now + 10_500,
            end_ms: now + 12_000,
            ..every(1000)
        }),
        now,
    );
    let rule = s.rule().unwrap();
    assert_eq!(s.following(&rule, now), Some(now + 11_000));
    assert_eq!(s.following(&rule, now + 11_000), Some(now + 12_000));
    assert_eq!(s.following(&rule, now + 12_000), None);
    let mut s = RecurringTimer::new(
        spec(Recurrence {
            max_count: 1,
            ..every(1000)
        }),
        now,
    );
    assert!(s.following(&rule, now).is_some());
    s.fired = 1;
    assert_eq!(s.following(&rule, now), None);
}

/// A series' jitter hashes its name bytes, as format 5 hashed its index key: the storage
/// layout moving under it (format 6 prefixed index keys with the group and hash slot) must not
/// move any occurrence. The figure is SHA-256 of `00 02 "ns" "daily"` and the nominal time.
#[test]
fn jitter_is_the_same_under_every_storage_layout() {
    let key = crate::timer::TimerKey::new("ns", "daily");
    assert_eq!(super::jitter(&key, 1_700_000_000_000, 3_600_000), 2_615_089);
}
