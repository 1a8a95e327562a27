//! Plots (stub).
use crate::report::BenchReport;
pub fn draw(_r: &BenchReport, _p: &std::path::Path) -> anyhow::Result<()> {
    Ok(())
}
