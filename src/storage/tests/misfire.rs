//! One-shot misfire on a real state machine: the scenarios (a late timer goes DEAD or EXPIRED
//! instead of firing, is never delivered, can be redriven; a timer's own policy wins) are the
//! goldenscripts `src/storage/testscripts/misfire*`; what is left here is the stored form.

use super::*;
use crate::namespace::{Misfire, MisfireAction, Policy};

#[tokio::test]
async fn a_format_4_namespace_record_reads_with_misfire_off() {
    let c = crate::namespace::Config {
        policy: Policy {
            misfire: Misfire {
                max_lateness_ms: 5,
                action: MisfireAction::Skip,
            },
            ..Policy::default()
        },
        push: None,
    };
    let five = config_bytes(&c);
    assert_eq!(config_of(&five).unwrap(), c);
    let four = encode(&c); // what a format-4 build wrote: no misfire after it
    assert_eq!(config_of(&four).unwrap().policy.misfire, Misfire::default());
}
