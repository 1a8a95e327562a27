//! The scan benchmark (stub).
use crate::args::ScanArgs;
use crate::report::ConfigResult;
pub fn run(_a: ScanArgs) -> anyhow::Result<()> {
    anyhow::bail!("not yet")
}
pub fn child(_c: serde_json::Value, _s: u64) -> anyhow::Result<Vec<ConfigResult>> {
    anyhow::bail!("not yet")
}
