//! `sqlite-bpe bench`: the published SQL Server Buffer Pool Extension experiments, rerun on
//! sqlite-bpe.
//!
//! - `lookup`: 10,000 random point selects on a 1 GB table, five memory/storage configurations.
//! - `scan`: a full-scan aggregate over a ~1 GB table, cold, warm, limited memory, extension.
//! - `oltp`: a TPC-C-like workload, memory at 100 % and 25 % of the database, extension on/off.
//! - `dw`: the 22 TPC-H queries at a scale exceeding memory, extension on/off.
//!
//! Each configuration runs in a fresh child process (the current executable, re-run with the
//! same arguments and `BPE_BENCH_CHILD` naming the configuration), because a process has one
//! engine whose settings are read when it is created. The parent loads the data (untimed),
//! measures the physical reference, runs the children and aggregates their JSON.

pub mod args;
mod child;
mod db;
mod lookup;
mod plot;
mod progress;
mod reference;
mod report;
mod sampler;
mod scan;
mod storage;
mod tpcc;
mod tpch;

pub use args::{BenchArgs, Experiment};
pub use report::{BenchReport, ConfigResult};

/// Runs one benchmark (or, in a child process, one configuration of it).
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    if let Some(spec) = child::spec_from_env() {
        return child::run(spec);
    }
    match args.experiment {
        Experiment::Lookup(a) => lookup::run(a),
        Experiment::Scan(a) => scan::run(a),
        Experiment::Oltp(a) => tpcc::run(a),
        Experiment::Dw(a) => tpch::run(a),
        Experiment::Plot(a) => {
            let report: BenchReport = serde_json::from_slice(&std::fs::read(&a.json)?)?;
            plot::draw(&report, &a.out)
        }
    }
}
