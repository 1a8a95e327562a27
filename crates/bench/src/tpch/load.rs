//! TPC-H schema for SQLite and its population with the `tpchgen` crate's generators (the
//! specification's dbgen, in Rust). Rows come out in TBL format and are bound as text: SQLite's
//! column affinity stores the numbers as numbers and the dates as 'YYYY-MM-DD' text.

use crate::progress;
use rusqlite::Connection;
use std::fmt::Display;
use tpchgen::generators::*;

pub const SCHEMA: &str = "
CREATE TABLE region (r_regionkey INTEGER PRIMARY KEY, r_name TEXT, r_comment TEXT);
CREATE TABLE nation (n_nationkey INTEGER PRIMARY KEY, n_name TEXT, n_regionkey INTEGER,
  n_comment TEXT);
CREATE TABLE part (p_partkey INTEGER PRIMARY KEY, p_name TEXT, p_mfgr TEXT, p_brand TEXT,
  p_type TEXT, p_size INTEGER, p_container TEXT, p_retailprice REAL, p_comment TEXT);
CREATE TABLE supplier (s_suppkey INTEGER PRIMARY KEY, s_name TEXT, s_address TEXT,
  s_nationkey INTEGER, s_phone TEXT, s_acctbal REAL, s_comment TEXT);
CREATE TABLE partsupp (ps_partkey INTEGER, ps_suppkey INTEGER, ps_availqty INTEGER,
  ps_supplycost REAL, ps_comment TEXT, PRIMARY KEY (ps_partkey, ps_suppkey)) WITHOUT ROWID;
CREATE TABLE customer (c_custkey INTEGER PRIMARY KEY, c_name TEXT, c_address TEXT,
  c_nationkey INTEGER, c_phone TEXT, c_acctbal REAL, c_mktsegment TEXT, c_comment TEXT);
CREATE TABLE orders (o_orderkey INTEGER PRIMARY KEY, o_custkey INTEGER, o_orderstatus TEXT,
  o_totalprice REAL, o_orderdate TEXT, o_orderpriority TEXT, o_clerk TEXT,
  o_shippriority INTEGER, o_comment TEXT);
CREATE TABLE lineitem (l_orderkey INTEGER, l_partkey INTEGER, l_suppkey INTEGER,
  l_linenumber INTEGER, l_quantity REAL, l_extendedprice REAL, l_discount REAL, l_tax REAL,
  l_returnflag TEXT, l_linestatus TEXT, l_shipdate TEXT, l_commitdate TEXT, l_receiptdate TEXT,
  l_shipinstruct TEXT, l_shipmode TEXT, l_comment TEXT,
  PRIMARY KEY (l_orderkey, l_linenumber)) WITHOUT ROWID;
";

/// Indexes on foreign keys (what the specification allows), built after the load.
pub const INDEXES: &str = "
CREATE INDEX lineitem_part ON lineitem (l_partkey, l_suppkey);
CREATE INDEX lineitem_supp ON lineitem (l_suppkey);
CREATE INDEX orders_cust ON orders (o_custkey);
CREATE INDEX partsupp_supp ON partsupp (ps_suppkey);
CREATE INDEX customer_nation ON customer (c_nationkey);
CREATE INDEX supplier_nation ON supplier (s_nationkey);
";

pub fn load(conn: &Connection, sf: f64) -> anyhow::Result<()> {
    conn.execute_batch(SCHEMA)?;
    // Rows per table at this scale (lineitem is about 4 per order).
    let orders = (1_500_000.0 * sf) as u64;
    let pb = progress::bar(orders * 6, "load rows");
    fill(conn, "region", 3, RegionGenerator::new(sf, 1, 1), &pb)?;
    fill(conn, "nation", 4, NationGenerator::new(sf, 1, 1), &pb)?;
    fill(conn, "part", 9, PartGenerator::new(sf, 1, 1), &pb)?;
    fill(conn, "supplier", 7, SupplierGenerator::new(sf, 1, 1), &pb)?;
    fill(conn, "partsupp", 5, PartSuppGenerator::new(sf, 1, 1), &pb)?;
    fill(conn, "customer", 8, CustomerGenerator::new(sf, 1, 1), &pb)?;
    fill(conn, "orders", 9, OrderGenerator::new(sf, 1, 1), &pb)?;
    fill(conn, "lineitem", 16, LineItemGenerator::new(sf, 1, 1), &pb)?;
    pb.set_message("indexes");
    conn.execute_batch(INDEXES)?;
    conn.execute_batch("ANALYZE;")?;
    pb.finish_and_clear();
    Ok(())
}

fn fill<T: Display>(
    conn: &Connection,
    table: &str,
    columns: usize,
    rows: impl IntoIterator<Item = T>,
    pb: &indicatif::ProgressBar,
) -> anyhow::Result<()> {
    pb.set_message(table.to_string());
    let marks: Vec<String> = (1..=columns).map(|i| format!("?{i}")).collect();
    let sql = format!("INSERT INTO {table} VALUES ({})", marks.join(", "));
    let mut tx = conn.unchecked_transaction()?;
    let mut n = 0u64;
    let mut line = String::new();
    for row in rows {
        line.clear();
        std::fmt::write(&mut line, format_args!("{row}"))?;
        let fields: Vec<&str> = line.split('|').take(columns).collect();
        anyhow::ensure!(fields.len() == columns, "{table}: short row {line:?}");
        tx.prepare_cached(&sql)?
            .execute(rusqlite::params_from_iter(fields))?;
        n += 1;
        if n.is_multiple_of(200_000) {
            tx.commit()?;
            tx = conn.unchecked_transaction()?;
            pb.inc(200_000);
        }
    }
    tx.commit()?;
    pb.inc(n % 200_000);
    Ok(())
}
