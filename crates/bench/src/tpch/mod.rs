//! TPC-H (stub).
use crate::args::DwArgs;
use crate::report::ConfigResult;
pub fn run(_a: DwArgs) -> anyhow::Result<()> {
    anyhow::bail!("not yet")
}
pub fn child(_c: serde_json::Value, _s: u64) -> anyhow::Result<Vec<ConfigResult>> {
    anyhow::bail!("not yet")
}
