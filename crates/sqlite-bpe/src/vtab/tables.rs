//! The three tables: sys.dm_os_performance_counters, sys.dm_os_buffer_descriptors and
//! sys.dm_os_buffer_pool_extension_configuration, under bpe_ names; and the latency
//! histograms beside the counters (ours: SQL Server has none).

use super::{TableDef, Value};
use crate::page_decode;
use bpe_core::Tier;

pub static ALL: &[&TableDef] = &[
    &COUNTERS,
    &DESCRIPTORS,
    &CONFIGURATION,
    &PRAGMA_EXTENSION,
    &ALLOCATION_UNITS,
    &HISTOGRAMS,
];

pub const OBJECT_NAME: &str = "SQLServer:Buffer Manager";

static COUNTERS: TableDef = TableDef {
    name: c"bpe_performance_counters",
    schema: c"CREATE TABLE x(object_name TEXT, counter_name TEXT, instance_name TEXT, cntr_value INTEGER, cntr_type INTEGER)",
    rows: counter_rows,
};

fn counter_rows() -> Vec<Vec<Value>> {
    crate::process::engine()
        .counters()
        .rows()
        .into_iter()
        .map(|r| {
            vec![
                Value::Text(OBJECT_NAME.into()),
                Value::Text(r.name.into()),
                Value::Text(String::new()),
                Value::Int(r.value),
                Value::Int(r.kind.cntr_type()),
            ]
        })
        .collect()
}

static DESCRIPTORS: TableDef = TableDef {
    name: c"bpe_buffer_descriptors",
    schema: c"CREATE TABLE x(database_id INTEGER, file_id INTEGER, page_id INTEGER, page_level INTEGER, allocation_unit_id INTEGER, page_type TEXT, row_count INTEGER, free_space_in_bytes INTEGER, is_modified INTEGER, numa_node INTEGER, read_microsec INTEGER, is_in_bpool_extension INTEGER, loaded_by_process_id INTEGER)",
    rows: descriptor_rows,
};

fn opt(v: Option<i64>) -> Value {
    v.map_or(Value::Null, Value::Int)
}

fn descriptor_rows() -> Vec<Vec<Value>> {
    crate::process::engine()
        .descriptors()
        .into_iter()
        .map(|d| {
            let page_id = d.page as i64 + 1;
            // Extension copies have no bytes in RAM: their decoded columns stay NULL.
            let info = d
                .frame
                .as_ref()
                .map(|f| page_decode::decode(page_id as u64, &f.data));
            vec![
                Value::Int(d.file as i64),
                Value::Int(1),
                Value::Int(page_id),
                opt(info.as_ref().and_then(|i| i.level)),
                // A SQLite page does not record which b-tree it belongs to (see ALLOCATION_UNITS).
                Value::Null,
                info.as_ref()
                    .map_or(Value::Null, |i| Value::Text(i.page_type.into())),
                opt(info.as_ref().and_then(|i| i.row_count)),
                opt(info.as_ref().and_then(|i| i.free_space)),
                // Clean pages only: nothing cached is ever modified.
                Value::Int(0),
                Value::Int(0),
                Value::Int(d.read_micros as i64),
                Value::Int((d.tier == Tier::Extension) as i64),
                // A shared extension's page another process loaded: that process.
                opt(d.loaded_by.map(i64::from)),
            ]
        })
        .collect()
}

static CONFIGURATION: TableDef = TableDef {
    name: c"bpe_extension_configuration",
    schema: c"CREATE TABLE x(path TEXT, file_id INTEGER, state INTEGER, state_description TEXT, current_size_in_kb INTEGER, last_failure TEXT HIDDEN, sharing TEXT HIDDEN, private_because TEXT HIDDEN)",
    rows: configuration_rows,
};

/// `PRAGMA bpe_extension` as a table with named columns, the way SQLite shows its own pragmas
/// (`SELECT * FROM pragma_table_info(...)`): a VFS pragma can hand SQLite back only one string,
/// so the columns are here, and the shell runs this table for `PRAGMA bpe_extension;`.
static PRAGMA_EXTENSION: TableDef = TableDef {
    name: c"pragma_bpe_extension",
    schema: c"CREATE TABLE x(path TEXT, file_id INTEGER, state INTEGER, state_description TEXT, current_size_in_kb INTEGER, last_failure TEXT, sharing TEXT, private_because TEXT)",
    rows: configuration_rows,
};

fn configuration_rows() -> Vec<Vec<Value>> {
    let s = crate::process::engine().extension_status();
    vec![vec![
        s.path
            .map_or(Value::Null, |p| Value::Text(p.display().to_string())),
        Value::Int(0),
        Value::Int(s.state as i64),
        Value::Text(s.state.description().into()),
        Value::Int((s.size_bytes / 1024) as i64),
        s.last_failure.map_or(Value::Null, Value::Text),
        // sqlite-bpe's own: 'shared' or 'private' while enabled (SQL Server's has no such choice).
        s.sharing
            .map_or(Value::Null, |sharing| Value::Text(sharing.word().into())),
        // Why it is private though sharing was the default (no shared memory to be had).
        s.private_because.map_or(Value::Null, Value::Text),
    ]]
}

/// The latency histograms (`Extension read time`, `Extension shared lock wait`): one row per
/// bucket that holds anything, cumulative as the "/sec" counters are; a bucket holds the
/// durations from `low_ns` up to (not including) `high_ns`. The p99 of L2 reads:
///
/// ```sql
/// SELECT high_ns FROM bpe_latency_histograms h WHERE name = 'Extension read time'
///   AND (SELECT sum(count) FROM bpe_latency_histograms WHERE name = h.name AND high_ns <= h.high_ns)
///     >= 0.99 * (SELECT sum(count) FROM bpe_latency_histograms WHERE name = h.name)
///   ORDER BY high_ns LIMIT 1
/// ```
static HISTOGRAMS: TableDef = TableDef {
    name: c"bpe_latency_histograms",
    schema: c"CREATE TABLE x(name TEXT, low_ns INTEGER, high_ns INTEGER, count INTEGER)",
    rows: histogram_rows,
};

fn histogram_rows() -> Vec<Vec<Value>> {
    let mut rows = Vec::new();
    for h in crate::process::engine().histograms() {
        for (i, &count) in h.buckets.iter().enumerate().filter(|(_, &c)| c > 0) {
            // Bucket 0 also holds what took under a nanosecond.
            let low = if i == 0 { 0 } else { 1i64 << i };
            rows.push(vec![
                Value::Text(h.name.clone()),
                Value::Int(low),
                Value::Int(1i64 << (i + 1)),
                Value::Int(count as i64),
            ]);
        }
    }
    rows
}

/// `sys.allocation_units`, so that SQL Server's scripts that join the descriptors to it run as
/// written. SQLite's pages do not name their b-tree, so the descriptors' `allocation_unit_id`
/// is NULL and this table has no rows: the joined columns come out NULL.
static ALLOCATION_UNITS: TableDef = TableDef {
    name: c"bpe_allocation_units",
    schema: c"CREATE TABLE x(allocation_unit_id INTEGER, type INTEGER, type_desc TEXT, container_id INTEGER, data_space_id INTEGER, total_pages INTEGER, used_pages INTEGER, data_pages INTEGER)",
    rows: Vec::new,
};
