//! The headers the layers of the client port speak to each other and to clients: which request
//! a follower forwarded, and whether an UNAVAILABLE call may be sent again (it did nothing, or
//! it is safe to repeat) or its outcome is unknown. The forwarding layer reads them; the auth
//! layer, the revocation watch and the `Error` → `Status` conversion set them. Kept apart so
//! that each of those names this file, not each other.

use tonic::Status;

/// Marks a request forwarded by a follower.
pub const FORWARDED_HEADER: &str = "x-timerdb-forwarded";
/// On an UNAVAILABLE answer: the handler found this node not (or no longer) the leader, so the
/// request may go to the next leader — if it did nothing, or is safe to repeat (set by the
/// `Error` → `Status` conversion).
pub const RETRY_HEADER: &str = "x-timerdb-retry";
/// On an UNAVAILABLE answer: the call did nothing (it was not proposed), so it may be sent again.
pub const NOT_APPLIED_HEADER: &str = "x-timerdb-not-applied";
/// On an UNAVAILABLE answer: the call may or may not have happened.
pub const OUTCOME_UNKNOWN_HEADER: &str = "x-timerdb-outcome-unknown";

/// On a forwarded call: the epoch of the slot map the sender routed it by
/// (docs/sharding.md §4).
pub const EPOCH_HEADER: &str = "x-timerdb-epoch";

/// On an answer this node forwarded: the id of the node that served it, the leader of the
/// call's group, so a client that routes by itself learns where that group is led
/// (docs/sharding.md §4) and sends the next call there.
pub const SERVED_BY_HEADER: &str = "x-timerdb-served-by";

/// UNAVAILABLE for a call this node refused without doing anything.
pub fn not_applied_status(msg: String) -> Status {
    let mut s = Status::unavailable(msg);
    let one = tonic::metadata::MetadataValue::from_static("1");
    s.metadata_mut().insert(NOT_APPLIED_HEADER, one);
    s
}
