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
    match bpe_bench::run(Cli::parse().bench) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // The error and its causes (`{:#}`), without the backtrace anyhow's Debug form adds
            // wherever RUST_BACKTRACE is set.
            eprintln!("bpe-bench: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
