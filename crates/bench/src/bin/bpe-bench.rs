//! `cargo run --release -p sqlite-bpe-bench --bin bpe-bench -- lookup --quick`: the benchmarks
//! without the CLI (which runs the same thing as `sqlite-bpe bench ...`).

use clap::Parser;

#[derive(Parser)]
#[command(name = "bpe-bench", about = "sqlite-bpe benchmarks")]
struct Cli {
    #[command(flatten)]
    bench: bpe_bench::BenchArgs,
}

fn main() -> anyhow::Result<()> {
    bpe_bench::run(Cli::parse().bench)
}
