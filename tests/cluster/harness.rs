//! Test harness: the clusters and calls of `timerdb-harness` (tools/harness), and what only
//! these tests print.

pub use timerdb_harness::calls::*;
pub use timerdb_harness::inproc::*;

/// Prints what an attack got back, one line each (`grep '^attack |'` on a `--nocapture` run
/// collects them; docs/security.md's table of attacks came from there).
pub fn tried(attack: &str, got: &str) {
    println!("attack | {attack} | {got}");
}

/// A status as `tried` prints it: the code and the message a person reads (and, for a
/// transport failure, its causes).
pub fn status_text(s: &tonic::Status) -> String {
    let mut out = format!("{:?}: {}", s.code(), s.message());
    if let Some(cause) = std::error::Error::source(s) {
        out.push_str(" (");
        out.push_str(&error_chain(cause));
        out.push(')');
    }
    out
}

/// An error and its sources, for `tried` (a refused handshake says why only in its sources).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        out.push_str(": ");
        out.push_str(&s.to_string());
        next = s.source();
    }
    out
}
