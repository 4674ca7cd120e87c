//! The DST, calendar and interval cases of issue 17, against instants computed by hand from
//! the zones' published rules (noted beside each row), not by the code under test.

use super::*;

/// Unix milliseconds of an RFC 3339 UTC instant.
fn utc(s: &str) -> i64 {
    s.parse::<Timestamp>().unwrap().as_millisecond()
}

fn show(ms: i64) -> String {
    Timestamp::from_millisecond(ms).unwrap().to_string()
}

/// (rule, zone, search from, the occurrences expected after it, in order).
type Row = (
    &'static str,
    &'static str,
    &'static str,
    &'static [&'static str],
);

const TABLE: &[Row] = &[
    // Europe/Berlin 2026: CET (+1) → CEST (+2) on 29 March at 02:00; back on 25 October at 03:00.
    // 02:30 does not exist on 29 March: a fixed-time rule runs at 03:00 CEST (01:00Z).
    (
        "30 2 * * *",
        "Europe/Berlin",
        "2026-03-28T00:00:00Z",
        &[
            "2026-03-28T01:30:00Z", // 02:30 CET
            "2026-03-29T01:00:00Z", // 03:00 CEST, the first valid time after the gap
            "2026-03-30T00:30:00Z", // 02:30 CEST
        ],
    ),
    // 02:30 happens twice on 25 October (CEST, then CET): once, the first.
    (
        "30 2 * * *",
        "Europe/Berlin",
        "2026-10-24T12:00:00Z",
        &[
            "2026-10-25T00:30:00Z", // 02:30 CEST
            "2026-10-26T01:30:00Z", // 02:30 CET, the next day
        ],
    ),
    // An interval rule skips the gap (02:00 and 02:30 do not exist) ...
    (
        "*/30 * * * *",
        "Europe/Berlin",
        "2026-03-29T00:15:00Z",
        &[
            "2026-03-29T00:30:00Z", // 01:30 CET
            "2026-03-29T01:00:00Z", // 03:00 CEST
            "2026-03-29T01:30:00Z", // 03:30 CEST
        ],
    ),
    // ... and runs in both passes of the repeated hour, every 30 real minutes.
    (
        "*/30 * * * *",
        "Europe/Berlin",
        "2026-10-24T23:45:00Z",
        &[
            "2026-10-25T00:00:00Z", // 02:00 CEST
            "2026-10-25T00:30:00Z", // 02:30 CEST
            "2026-10-25T01:00:00Z", // 02:00 CET
            "2026-10-25T01:30:00Z", // 02:30 CET
            "2026-10-25T02:00:00Z", // 03:00 CET
        ],
    ),
    // America/New_York 2026: EST (−5) → EDT (−4) on 8 March at 02:00; back on 1 November at 02:00.
    (
        "30 2 * * *",
        "America/New_York",
        "2026-03-07T00:00:00Z",
        &[
            "2026-03-07T07:30:00Z", // 02:30 EST
            "2026-03-08T07:00:00Z", // 03:00 EDT, after the gap
            "2026-03-09T06:30:00Z", // 02:30 EDT
        ],
    ),
    (
        "30 1 * * *",
        "America/New_York",
        "2026-10-31T12:00:00Z",
        &[
            "2026-11-01T05:30:00Z", // 01:30 EDT; 01:30 EST (06:30Z) is the same wall time again
            "2026-11-02T06:30:00Z", // 01:30 EST
        ],
    ),
    // Weekdays at 09:00 across the spring change: Friday 6 March (EST), Monday 9 March (EDT).
    (
        "0 9 * * MON-FRI",
        "America/New_York",
        "2026-03-06T00:00:00Z",
        &["2026-03-06T14:00:00Z", "2026-03-09T13:00:00Z"],
    ),
    // Australia/Lord_Howe 2026: a 30-minute shift. +11 → +10:30 on Sunday 5 April at 02:00
    // (01:30–02:00 happens twice); +10:30 → +11 on Sunday 4 October at 02:00 (02:00–02:30 does
    // not exist).
    (
        "45 1 * * *",
        "Australia/Lord_Howe",
        "2026-04-03T12:00:00Z",
        &[
            "2026-04-03T14:45:00Z", // 4 April 01:45 +11
            "2026-04-04T14:45:00Z", // 5 April 01:45 +11, the first pass; not 15:15Z again
            "2026-04-05T15:15:00Z", // 6 April 01:45 +10:30
        ],
    ),
    (
        "15 2 * * *",
        "Australia/Lord_Howe",
        "2026-10-02T12:00:00Z",
        &[
            "2026-10-02T15:45:00Z", // 3 October 02:15 +10:30
            "2026-10-03T15:30:00Z", // 4 October: 02:15 does not exist; 02:30 +11
            "2026-10-04T15:15:00Z", // 5 October 02:15 +11
        ],
    ),
    // Leap days: 29 February comes in 2028.
    (
        "0 12 29 2 *",
        "UTC",
        "2026-01-01T00:00:00Z",
        &["2028-02-29T12:00:00Z", "2032-02-29T12:00:00Z"],
    ),
    // Month ends (L): February's 28th in 2026, 29th in 2028.
    (
        "0 0 L * *",
        "UTC",
        "2026-01-31T00:00:00Z",
        &[
            "2026-02-28T00:00:00Z",
            "2026-03-31T00:00:00Z",
            "2026-04-30T00:00:00Z",
        ],
    ),
    (
        "0 0 L 2 *",
        "UTC",
        "2027-03-01T00:00:00Z",
        &["2028-02-29T00:00:00Z"],
    ),
    // Six fields: seconds first.
    (
        "*/20 * * * * *",
        "UTC",
        "2026-01-01T00:00:05Z",
        &[
            "2026-01-01T00:00:20Z",
            "2026-01-01T00:00:40Z",
            "2026-01-01T00:01:00Z",
        ],
    ),
];

#[test]
fn cron_occurrences_match_the_hand_computed_table() {
    let mut wrong = Vec::new();
    for (expr, zone, from, want) in TABLE {
        let rule = Rule::cron(expr, zone).unwrap();
        let got: Vec<String> = rule
            .upcoming(utc(from), want.len())
            .into_iter()
            .map(show)
            .collect();
        let want: Vec<String> = want.iter().map(|w| show(utc(w))).collect();
        if got != want {
            wrong.push(format!(
                "{expr} in {zone} after {from}:\n  got  {got:?}\n  want {want:?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "\n{}", wrong.join("\n"));
}

#[test]
fn intervals_count_whole_periods_from_their_anchor() {
    let every = Rule::every(30_000, 1_000).unwrap();
    for (after, next) in [
        (0, 1_000), // before the anchor: the anchor
        (999, 1_000),
        (1_000, 31_000), // strictly after
        (30_999, 31_000),
        (31_000, 61_000),
        (-5_000_000, 1_000), // long before
    ] {
        assert_eq!(every.next_after(after), Some(next), "after {after}");
    }
    assert_eq!(every.upcoming(1_000, 3), vec![31_000, 61_000, 91_000]);
    // At the end of the representable time, no occurrence rather than an overflow.
    let huge = i64::MAX / 2 + 1;
    assert_eq!(Rule::every(huge, 0).unwrap().next_after(huge), None);
}

#[test]
fn bad_rules_are_refused_naming_the_field() {
    let msg = |r: Result<Rule>| match r {
        Err(Error::InvalidArgument(m)) => m,
        other => panic!("expected INVALID_ARGUMENT, got {other:?}"),
    };
    let m = msg(Rule::cron("61 * * * *", "UTC"));
    assert!(m.starts_with("recurrence.cron: "), "{m}");
    let m = msg(Rule::cron("* * *", "UTC"));
    assert!(
        m.starts_with("recurrence.cron: ") && m.contains("3 fields"),
        "{m}"
    );
    let m = msg(Rule::cron("0 9 * * *", "Mars/Olympus_Mons"));
    assert!(
        m.starts_with("recurrence.time_zone: ") && m.contains("Mars/Olympus_Mons"),
        "{m}"
    );
    let m = msg(Rule::cron("0 9 * * *", ""));
    assert!(m.starts_with("recurrence.time_zone: "), "{m}");
    let m = msg(Rule::every(0, 0));
    assert!(m.starts_with("recurrence.every: "), "{m}");
    let m = msg(Rule::cron(&"1 ".repeat(200), "UTC"));
    assert!(m.starts_with("recurrence: "), "{m}");
}

#[test]
fn zones_come_from_the_compiled_in_database() {
    // Even with the host's zoneinfo gone, every replica finds the same zones.
    assert!(Rule::cron("0 9 * * *", "Australia/Lord_Howe").is_ok());
    let db = TimeZoneDatabase::bundled();
    assert!(
        db.get("Europe/Berlin").is_ok(),
        "the bundled database is empty"
    );
}
