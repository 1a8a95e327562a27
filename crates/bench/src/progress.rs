//! Progress bars on stderr (hidden when stderr is not a terminal).

use indicatif::{ProgressBar, ProgressStyle};

pub fn bar(len: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template(
            "{prefix:>12} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg} (eta {eta})",
        )
        .expect("valid template"),
    );
    pb.set_prefix(what.to_string());
    pb
}

pub fn spinner(what: &str) -> ProgressBar {
    let pb = ProgressBar::new_spinner();
    pb.set_style(
        ProgressStyle::with_template("{prefix:>12} [{elapsed_precise}] {spinner} {msg}")
            .expect("valid template"),
    );
    pb.set_prefix(what.to_string());
    pb.enable_steady_tick(std::time::Duration::from_millis(200));
    pb
}
