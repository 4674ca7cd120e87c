use super::*;

fn no_jitter() -> Policy {
    Policy {
        backoff_jitter_percent: 0,
        ..Policy::default()
    }
}

#[test]
fn backoff_grows_geometrically_and_caps() {
    let p = no_jitter(); // 1 s, ×2, cap 5 min
    let got: Vec<u64> = (1..=10).map(|a| p.backoff_ms(a, 7)).collect();
    assert_eq!(
        got,
        [1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 128_000, 256_000, 300_000]
    );
    assert_eq!(
        p.backoff_ms(1000, 7),
        300_000,
        "long retries stay at the cap"
    );
    assert_eq!(
        p.backoff_ms(0, 7),
        1_000,
        "attempt 0 is treated as the first"
    );
    let slow = Policy {
        backoff_multiplier_permille: 1500,
        ..no_jitter()
    };
    assert_eq!(
        (1..=4).map(|a| slow.backoff_ms(a, 0)).collect::<Vec<_>>(),
        [1_000, 1_500, 2_250, 3_375]
    );
    let flat = Policy {
        backoff_multiplier_permille: 1000,
        ..no_jitter()
    };
    assert_eq!(flat.backoff_ms(50, 0), 1_000, "×1 never grows");
    let huge = Policy {
        backoff_max_ms: DAY_MS,
        backoff_multiplier_permille: 10_000,
        ..no_jitter()
    };
    assert_eq!(
        huge.backoff_ms(1000, 0),
        DAY_MS,
        "no overflow on the way to the cap"
    );
}

#[test]
fn jitter_is_bounded_deterministic_and_spread() {
    let p = Policy::default(); // ±20 %
    let mut seen = std::collections::BTreeSet::new();
    for fire_index in 0..2_000u64 {
        for attempt in 1..=3 {
            let base = no_jitter().backoff_ms(attempt, fire_index);
            let d = p.backoff_ms(attempt, fire_index);
            assert!(
                d * 100 >= base * 80 && d * 100 <= base * 120,
                "{d} outside ±20% of {base}"
            );
            assert_eq!(d, p.backoff_ms(attempt, fire_index), "not deterministic");
            if attempt == 1 {
                seen.insert(d);
            }
        }
    }
    // 2,000 timers that failed together do not retry in a herd: the 401 possible
    // per-mille points of a 1 s base are nearly all used.
    assert!(seen.len() > 300, "only {} distinct delays", seen.len());
    let capped = Policy {
        backoff_min_ms: 300_000,
        ..Policy::default()
    };
    assert!(
        (0..500).all(|i| capped.backoff_ms(1, i) <= 300_000),
        "jitter must not exceed the cap"
    );
}

#[test]
fn defaults_are_valid() {
    Policy::default()
        .with_default_bursts()
        .validate(64 * 1024)
        .unwrap();
}

fn target(url: &str) -> PushTarget {
    PushTarget {
        url: url.into(),
        secrets: vec!["whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD".into()],
        timeout_ms: 5_000,
        dead_on_client_error: false,
    }
}

#[test]
fn push_targets_are_checked() {
    let p = Policy::default();
    for ok in [
        "http://127.0.0.1:8080/hook",
        "https://example.com/a?b=c",
        "grpc://10.0.0.1:50051",
        "grpcs://receiver.internal:443",
    ] {
        target(ok)
            .validate(&p)
            .unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    assert_eq!(target("grpc://h:1").protocol(), Protocol::Grpc);
    assert_eq!(target("https://h").protocol(), Protocol::Http);
    for (bad, says) in [
        ("not a url", "not a URL"),
        ("ftp://host/x", "must start with"),
        ("file:///etc/passwd", "not a URL"),
        ("file://host/etc/passwd", "must start with"),
        ("http://user:pw@host/x", "credentials"),
        (
            "grpc://host:1/timerdb.v1.Receiver/Receive",
            "host:port only",
        ),
        ("/relative/path", "must start with"),
    ] {
        let e = target(bad).validate(&p).unwrap_err().to_string();
        assert!(e.contains(says), "{bad}: {e}");
    }
    let long = format!("http://h/{}", "a".repeat(MAX_URL_BYTES));
    assert!(target(&long).validate(&p).is_err());
    let mut t = target("http://h/");
    t.timeout_ms = p.ack_timeout_ms;
    assert!(t
        .validate(&p)
        .unwrap_err()
        .to_string()
        .contains("ack_timeout_ms"));
    t.timeout_ms = 5_000;
    t.secrets = vec![];
    assert!(t.validate(&p).unwrap_err().to_string().contains("secrets"));
    t.secrets = vec!["whsec_!!notbase64".into()];
    assert!(t.validate(&p).is_err());
}

#[test]
fn limits_are_checked_and_bursts_default() {
    let p = Policy {
        max_dispatches_per_second: Some(200),
        max_schedules_per_second: Some(1000),
        max_burst: 0,
        max_schedule_burst: 0,
        ..Policy::default()
    }
    .with_default_bursts();
    assert_eq!((p.max_burst, p.max_schedule_burst), (20, 1000));
    p.validate(64 * 1024).unwrap();
    for (bad, field) in [
        (
            Policy {
                max_dispatches_per_second: Some(0),
                ..p
            },
            "max_dispatches_per_second 0",
        ),
        (
            Policy {
                max_schedules_per_second: Some(MAX_RATE + 1),
                ..p
            },
            "max_schedules_per_second",
        ),
        (
            Policy {
                max_concurrent_dispatches: Some(0),
                ..p
            },
            "max_concurrent_dispatches",
        ),
    ] {
        let e = bad.validate(64 * 1024).unwrap_err().to_string();
        assert!(e.contains(field), "{e} lacks {field}");
    }
}

#[test]
fn each_field_is_range_checked() {
    type Breaker = fn(&mut Policy);
    let cases: Vec<(Breaker, &str)> = vec![
        (|p| p.ack_timeout_ms = 99, "ack_timeout_ms"),
        (|p| p.ack_timeout_ms = DAY_MS + 1, "ack_timeout_ms"),
        (|p| p.max_attempts = 0, "max_attempts"),
        (|p| p.backoff_min_ms = 0, "backoff_min_ms"),
        (
            |p| p.backoff_min_ms = p.backoff_max_ms + 1,
            "backoff_min_ms",
        ),
        (|p| p.backoff_max_ms = DAY_MS + 1, "backoff_max_ms"),
        (|p| p.backoff_multiplier_permille = 999, "multiplier"),
        (|p| p.backoff_jitter_percent = 101, "jitter"),
        (|p| p.retention_ms = 999, "retention_ms"),
        (|p| p.max_payload_bytes = 64 * 1024 + 1, "max_payload_bytes"),
        (|p| p.max_payload_bytes = 0, "max_payload_bytes"),
    ];
    for (breaks, field) in cases {
        let mut p = Policy::default();
        breaks(&mut p);
        let e = p.validate(64 * 1024).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
        assert!(e.to_string().contains(field), "{e} lacks {field}");
    }
}

/// Finding 13 of issue 33: docs/push.md said "0 means unlimited" for the rates and the
/// concurrency, which the server refuses. The docs say what validation does.
#[test]
fn the_push_docs_say_what_a_limit_of_zero_does() {
    let doc = include_str!("../../docs/push.md");
    type Set = fn(&mut Policy);
    let zero: [(Set, &str); 3] = [
        (
            |p| p.max_dispatches_per_second = Some(0),
            "max_dispatches_per_second",
        ),
        (
            |p| p.max_schedules_per_second = Some(0),
            "max_schedules_per_second",
        ),
        (
            |p| p.max_concurrent_dispatches = Some(0),
            "max_concurrent_dispatches",
        ),
    ];
    for (set, field) in zero {
        let mut p = Policy::default();
        set(&mut p);
        let e = p.validate(64 * 1024).unwrap_err().to_string();
        assert!(e.contains(field) && e.contains("leave it unset"), "{e}");
    }
    assert!(
        !doc.contains("0 means unlimited"),
        "docs/push.md contradicts validation"
    );
    assert!(
        doc.contains("Unset means unlimited") && doc.contains("0 is refused"),
        "docs/push.md says what a limit of 0 does"
    );
}
