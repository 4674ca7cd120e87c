//! The DST, calendar and interval cases of issue 17, against instants computed by hand from
//! the zones' published rules, not by the code under test: the cron table is the goldenscript
//! `testscripts/dst` (the notes beside each instant), run by [`RuleRunner`]; intervals and
//! refusals below.

use super::*;

/// Unix milliseconds of an RFC 3339 UTC instant.
fn utc(s: &str) -> i64 {
    s.parse::<Timestamp>().unwrap().as_millisecond()
}

fn show(ms: i64) -> String {
    Timestamp::from_millisecond(ms).unwrap().to_string()
}

/// Runs the DST and calendar table, `testscripts/dst` (a goldenscript: commands in, the
/// occurrences out; its expected instants are the hand-computed ones, with their notes).
struct RuleRunner;

impl goldenscript::Runner for RuleRunner {
    type Command = goldenscript::Command;

    fn run(
        &mut self,
        command: &goldenscript::Command,
        _: &goldenscript::Context,
    ) -> Result<String, Box<dyn std::error::Error>> {
        match command.name.as_str() {
            "upcoming" => {
                let mut args = command.consume_args();
                let expr = args.next_pos().ok_or("upcoming takes a rule")?;
                let zone = args.take_key("zone").ok_or("upcoming takes zone=")?;
                let from = args.take_key("from").ok_or("upcoming takes from=")?;
                let n = args.take_key("n").unwrap_or("1").parse()?;
                args.reject_next()?;
                let rule = Rule::cron(expr, zone)?;
                let got = rule.upcoming(utc(from), n).into_iter().map(show);
                Ok(got.map(|t| t + "\n").collect())
            }
            other => Err(format!("unknown command {other}").into()),
        }
    }
}

#[test]
fn cron_occurrences_match_the_hand_computed_table() {
    // The expected instants are computed by hand: regenerating them from the code under test
    // would turn the table into a copy of what it checks.
    assert!(
        std::env::var_os("UPDATE_GOLDENFILES").is_none(),
        "testscripts/dst is edited by hand, never regenerated"
    );
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src/recurring/rule/testscripts/dst"
    );
    goldenscript::run(&mut RuleRunner, dir).unwrap();
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
