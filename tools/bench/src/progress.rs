//! Progress shown while a workload runs (indicatif; hidden when stderr is not a terminal, so
//! logs of scripted runs hold only the results).

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// A bar over a measured window of `length`.
pub fn timed(label: &str, length: Duration) -> ProgressBar {
    let bar = ProgressBar::new(length.as_millis() as u64);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>24} [{bar:30}] {elapsed:>4} {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(label.to_string());
    bar
}

/// A bar over `total` items.
pub fn counted(label: &str, total: u64) -> ProgressBar {
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix:>24} [{bar:30}] {human_pos}/{human_len} {per_sec} eta {eta} {msg}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    bar.set_prefix(label.to_string());
    bar
}

/// Moves a timed bar to the elapsed time and shows the count and rate so far.
pub fn tick(bar: &ProgressBar, started: Instant, done: u64, what: &str) {
    let secs = started.elapsed().as_secs_f64().max(1e-3);
    bar.set_position(started.elapsed().as_millis() as u64);
    bar.set_message(format!("{done} {what}, {:.0}/s", done as f64 / secs));
}
