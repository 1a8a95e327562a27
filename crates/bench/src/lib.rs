//! `sqlite-bpe bench`: the published SQL Server Buffer Pool Extension experiments, rerun on
//! sqlite-bpe.
//!
//! - `lookup`: 10,000 random point selects on a 1 GB table, five memory/storage configurations.
//! - `scan`: a full-scan aggregate over a ~1 GB table, cold, warm, limited memory, extension.
//! - `oltp`: a TPC-C-like workload, memory at 100 % and 25 % of the database, extension on/off.
//! - `dw`: the 22 TPC-H queries at a scale exceeding memory, extension on/off.
//! - `autocommit`: the cost of a read transaction (autocommit against one transaction, bpe
//!   against stock SQLite, alone and beside a plain SQLite writer process).
//! - `workers`: four worker processes on one database, a shared extension against private ones
//!   (and stock SQLite on a real device).
//!
//! Each configuration runs in a fresh child process (the current executable, re-run with the
//! same arguments and `BPE_BENCH_CHILD` naming the configuration), because a process has one
//! engine whose settings are read when it is created. The parent loads the data (untimed),
//! measures the physical reference, runs the children and aggregates their JSON.
//!
//! `sqlite-bpe demo` is the lookup benchmark at demo scale ([`lookup::Plan::demo`]).

pub mod args;
mod autocommit;
mod cgroup;
mod child;
mod db;
mod latency_volume;
pub mod lookup;
mod plot;
mod progress;
mod reference;
mod report;
mod sampler;
mod scan;
mod slow_volume;
mod storage;
pub mod table;
mod tpcc;
mod tpch;
mod workers;
mod zipf;

pub use args::{BenchArgs, CommonArgs, Experiment};
pub use report::{BenchReport, ConfigResult};
pub use storage::{fs_type, DataDevice, Storage};

/// Runs one benchmark. A binary calls [`run_child`] first, before it parses its arguments,
/// which are not the benchmark's in a configuration's or a helper's process.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let (report, common) = match &args.experiment {
        Experiment::Lookup(a) => (lookup::run(a)?, &a.common),
        Experiment::Scan(a) => (scan::run(a)?, &a.common),
        Experiment::Oltp(a) => (tpcc::run(a)?, &a.common),
        Experiment::Dw(a) => (tpch::run(a)?, &a.common),
        Experiment::Autocommit(a) => (autocommit::run(a)?, &a.common),
        Experiment::Workers(a) => (workers::run(a)?, &a.common),
        Experiment::Plot(a) => {
            let report: BenchReport = serde_json::from_slice(&std::fs::read(&a.json)?)?;
            return plot::draw(&report, &a.out);
        }
    };
    write_outputs(&report, common)
}

/// In a configuration's process (one a benchmark or the demo started, with `BPE_BENCH_CHILD`
/// naming the configuration): runs the configuration, hands its results to the parent and
/// returns how that went; the same in a helper process a configuration started. None in any
/// other process. Also the server of a slow volume's latency (`slowvol:...+1ms`), started by
/// the benchmark with [`latency_volume::SERVE_ARG`].
pub fn run_child() -> Option<anyhow::Result<()>> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(served) = latency_volume::serve_if_asked(&args) {
        return Some(served);
    }
    let spec = child::spec_from_env()?;
    let results = match spec.bench.as_str() {
        "lookup" => lookup::child(spec.config.clone(), spec.sample_ms),
        "scan" => scan::child(spec.config.clone(), spec.sample_ms),
        "oltp" => tpcc::child(spec.config.clone(), spec.sample_ms),
        "dw" => tpch::child(spec.config.clone(), spec.sample_ms),
        "autocommit" => autocommit::child(spec.config.clone(), spec.sample_ms),
        "workers" => workers::child(spec.config.clone(), spec.sample_ms),
        autocommit::WRITER => {
            let done = autocommit::writer(spec.config.clone());
            return Some(done.and_then(|r| child::write_results(&spec, &r)));
        }
        other => Err(anyhow::anyhow!("unknown benchmark {other}")),
    };
    Some(results.and_then(|r| child::write_results(&spec, &r)))
}

/// Writes the report as JSON (--json) and draws it (--plot) where asked.
pub fn write_outputs(report: &BenchReport, common: &CommonArgs) -> anyhow::Result<()> {
    if let Some(path) = &common.json {
        report.write_json(path)?;
    }
    if let Some(path) = &common.plot {
        plot::draw(report, path)?;
        eprintln!("plot written to {}", path.display());
    }
    Ok(())
}
