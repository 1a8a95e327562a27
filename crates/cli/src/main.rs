//! `sqlite-bpe`: SQLite with a buffer pool extension, after SQL Server's.

use clap::{Parser, Subcommand};
use sqlite_bpe_cli::{demo, monitor, shell};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "sqlite-bpe",
    version,
    about = "SQLite with a buffer pool extension (RAM pool + SSD extension), after SQL Server 2014's"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// An SQLite shell on DB through the bpe VFS, taking SQL Server's statements too.
    ///
    /// Also takes SQL Server's operator statements (ALTER SERVER CONFIGURATION, sp_configure,
    /// RECONFIGURE, DBCC DROPCLEANBUFFERS), the sys.dm_os_* DMV names, and GO [n] on its own
    /// line. Interactive on a terminal; otherwise reads a script from stdin and exits with 1 if
    /// any statement failed.
    Shell {
        /// The database file (or a file: URI).
        db: String,
    },
    /// The lookup benchmark in small, on an emulated slow disk (about a minute).
    ///
    /// Three configurations: RAM-resident, limited memory, limited memory with the extension.
    /// No flags needed.
    Demo(demo::DemoOptions),
    /// The published SQL Server BPE experiments, rerun on sqlite-bpe.
    Bench(bpe_bench::BenchArgs),
    /// A running process's Buffer Manager counters, live (like perfmon); lists processes
    /// without --pid.
    ///
    /// Every process with a sqlite-bpe engine publishes its counters about once a second for
    /// other processes of the same user (/dev/shm/sqlite-bpe-UID, mode 0700). --once and --json
    /// print one sample for scripts.
    Monitor(monitor::MonitorArgs),
}

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => {
            // The error and its causes on one line (`{:#}`), never a backtrace: anyhow's Debug
            // form (what `fn main() -> Result` prints) adds one wherever RUST_BACKTRACE is set.
            eprintln!("sqlite-bpe: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<ExitCode> {
    // A configuration's process of the benchmarks or the demo (the same command line, run
    // again with the configuration in the environment).
    if let Some(done) = bpe_bench::run_child() {
        return done.map(|()| ExitCode::SUCCESS);
    }
    match Cli::parse().command {
        Command::Shell { db } => {
            let code = shell::run(&db)?;
            Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
        }
        Command::Demo(options) => demo::run(&options).map(|()| ExitCode::SUCCESS),
        Command::Bench(args) => bpe_bench::run(args).map(|()| ExitCode::SUCCESS),
        Command::Monitor(args) => monitor::run(&args).map(|()| ExitCode::SUCCESS),
    }
}
