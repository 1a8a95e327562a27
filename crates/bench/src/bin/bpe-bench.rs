//! `cargo run --release -p sqlite-bpe-bench --bin bpe-bench -- lookup --quick`: the benchmarks
//! without the CLI (which runs the same thing as `sqlite-bpe bench ...`).

use clap::Parser;

#[derive(Parser)]
#[command(name = "bpe-bench", about = "sqlite-bpe benchmarks")]
struct Cli {
    #[command(flatten)]
    bench: bpe_bench::BenchArgs,
}

fn main() -> std::process::ExitCode {
    // A configuration's process, or a helper one started (before the arguments, which are not
    // the benchmark's there).
    let done = bpe_bench::run_child().unwrap_or_else(|| bpe_bench::run(Cli::parse().bench));
    match done {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // The error and its causes (`{:#}`), without the backtrace anyhow's Debug form adds
            // wherever RUST_BACKTRACE is set.
            eprintln!("bpe-bench: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
