//! TPC-C schema and initial population (specification clauses 1.3 and 4.3.3), written for
//! SQLite: the tables with composite keys are WITHOUT ROWID, so rows are clustered on their
//! primary key as in SQL Server.

use crate::progress;
use rand::{rngs::StdRng, Rng, SeedableRng};
use rusqlite::{params, Connection};

pub const DISTRICTS: u32 = 10;
pub const CUSTOMERS: u32 = 3000;
pub const ORDERS: u32 = 3000;
/// Orders 2101..=3000 of each district are undelivered (in NEW-ORDER).
pub const FIRST_NEW_ORDER: u32 = 2101;

pub const SCHEMA: &str = "
CREATE TABLE warehouse (w_id INTEGER PRIMARY KEY, w_name TEXT, w_street_1 TEXT, w_street_2 TEXT,
  w_city TEXT, w_state TEXT, w_zip TEXT, w_tax REAL, w_ytd REAL);
CREATE TABLE district (d_id INTEGER, d_w_id INTEGER, d_name TEXT, d_street_1 TEXT, d_street_2 TEXT,
  d_city TEXT, d_state TEXT, d_zip TEXT, d_tax REAL, d_ytd REAL, d_next_o_id INTEGER,
  PRIMARY KEY (d_w_id, d_id)) WITHOUT ROWID;
CREATE TABLE customer (c_id INTEGER, c_d_id INTEGER, c_w_id INTEGER, c_first TEXT, c_middle TEXT,
  c_last TEXT, c_street_1 TEXT, c_street_2 TEXT, c_city TEXT, c_state TEXT, c_zip TEXT,
  c_phone TEXT, c_since TEXT, c_credit TEXT, c_credit_lim REAL, c_discount REAL, c_balance REAL,
  c_ytd_payment REAL, c_payment_cnt INTEGER, c_delivery_cnt INTEGER, c_data TEXT,
  PRIMARY KEY (c_w_id, c_d_id, c_id)) WITHOUT ROWID;
CREATE INDEX customer_last ON customer (c_w_id, c_d_id, c_last, c_first);
CREATE TABLE history (h_c_id INTEGER, h_c_d_id INTEGER, h_c_w_id INTEGER, h_d_id INTEGER,
  h_w_id INTEGER, h_date TEXT, h_amount REAL, h_data TEXT);
CREATE TABLE new_order (no_o_id INTEGER, no_d_id INTEGER, no_w_id INTEGER,
  PRIMARY KEY (no_w_id, no_d_id, no_o_id)) WITHOUT ROWID;
CREATE TABLE orders (o_id INTEGER, o_d_id INTEGER, o_w_id INTEGER, o_c_id INTEGER, o_entry_d TEXT,
  o_carrier_id INTEGER, o_ol_cnt INTEGER, o_all_local INTEGER,
  PRIMARY KEY (o_w_id, o_d_id, o_id)) WITHOUT ROWID;
CREATE INDEX orders_customer ON orders (o_w_id, o_d_id, o_c_id, o_id);
CREATE TABLE order_line (ol_o_id INTEGER, ol_d_id INTEGER, ol_w_id INTEGER, ol_number INTEGER,
  ol_i_id INTEGER, ol_supply_w_id INTEGER, ol_delivery_d TEXT, ol_quantity INTEGER,
  ol_amount REAL, ol_dist_info TEXT,
  PRIMARY KEY (ol_w_id, ol_d_id, ol_o_id, ol_number)) WITHOUT ROWID;
CREATE TABLE item (i_id INTEGER PRIMARY KEY, i_im_id INTEGER, i_name TEXT, i_price REAL, i_data TEXT);
CREATE TABLE stock (s_i_id INTEGER, s_w_id INTEGER, s_quantity INTEGER, s_dist_01 TEXT,
  s_dist_02 TEXT, s_dist_03 TEXT, s_dist_04 TEXT, s_dist_05 TEXT, s_dist_06 TEXT, s_dist_07 TEXT,
  s_dist_08 TEXT, s_dist_09 TEXT, s_dist_10 TEXT, s_ytd INTEGER, s_order_cnt INTEGER,
  s_remote_cnt INTEGER, s_data TEXT, PRIMARY KEY (s_w_id, s_i_id)) WITHOUT ROWID;
";

/// The random functions of clause 4.3.2 and 2.1.6.
pub struct Rand {
    pub rng: StdRng,
    /// NURand's C constants for C_LAST (A=255), C_ID (A=1023), OL_I_ID (A=8191).
    pub c_last: u32,
    pub c_id: u32,
    pub ol_i_id: u32,
}

impl Rand {
    pub fn new(seed: u64) -> Rand {
        let mut rng = StdRng::seed_from_u64(seed);
        Rand {
            c_last: rng.gen_range(0..=255),
            c_id: rng.gen_range(0..=1023),
            ol_i_id: rng.gen_range(0..=8191),
            rng,
        }
    }

    pub fn int(&mut self, lo: u32, hi: u32) -> u32 {
        self.rng.gen_range(lo..=hi)
    }

    /// NURand(A, x, y) = (((random(0, A) | random(x, y)) + C) % (y - x + 1)) + x
    pub fn nurand(&mut self, a: u32, x: u32, y: u32) -> u32 {
        let c = match a {
            255 => self.c_last,
            1023 => self.c_id,
            _ => self.ol_i_id,
        };
        (((self.int(0, a) | self.int(x, y)) + c) % (y - x + 1)) + x
    }

    /// a-string: random alphanumeric characters, length in [lo, hi].
    pub fn astring(&mut self, lo: usize, hi: usize) -> String {
        const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        let n = self.rng.gen_range(lo..=hi);
        (0..n)
            .map(|_| CHARS[self.rng.gen_range(0..CHARS.len())] as char)
            .collect()
    }

    pub fn nstring(&mut self, lo: usize, hi: usize) -> String {
        let n = self.rng.gen_range(lo..=hi);
        (0..n)
            .map(|_| (b'0' + self.rng.gen_range(0..10u8)) as char)
            .collect()
    }

    /// I_DATA and S_DATA: 10 % contain "ORIGINAL" at a random position.
    pub fn data(&mut self) -> String {
        let mut s = self.astring(26, 50);
        if self.rng.gen_range(0..10) == 0 {
            let at = self.rng.gen_range(0..=s.len() - 8);
            s.replace_range(at..at + 8, "ORIGINAL");
        }
        s
    }

    pub fn zip(&mut self) -> String {
        format!("{}11111", self.nstring(4, 4))
    }

    pub fn amount(&mut self, lo: f64, hi: f64) -> f64 {
        (self.rng.gen_range(lo..=hi) * 100.0).round() / 100.0
    }
}

/// C_LAST from a number 0..=999 (clause 4.3.2.3).
pub fn last_name(n: u32) -> String {
    const S: [&str; 10] = [
        "BAR", "OUGHT", "ABLE", "PRI", "PRES", "ESE", "ANTI", "CALLY", "ATION", "EING",
    ];
    format!(
        "{}{}{}",
        S[(n / 100) as usize],
        S[(n / 10 % 10) as usize],
        S[(n % 10) as usize]
    )
}

pub const NOW: &str = "2026-01-01 00:00:00";

/// Creates and fills the database for `warehouses` warehouses and `items` items.
pub fn load(conn: &Connection, warehouses: u32, items: u32) -> anyhow::Result<()> {
    conn.execute_batch(SCHEMA)?;
    let mut r = Rand::new(1);
    let total = items as u64 + warehouses as u64 * (items as u64 + 10 * CUSTOMERS as u64 * 3);
    let pb = progress::bar(total, "load rows");
    let tx = conn.unchecked_transaction()?;
    {
        let mut ins = tx.prepare("INSERT INTO item VALUES (?1, ?2, ?3, ?4, ?5)")?;
        for i in 1..=items {
            ins.execute(params![
                i,
                r.int(1, 10000),
                r.astring(14, 24),
                r.amount(1.0, 100.0),
                r.data()
            ])?;
        }
    }
    tx.commit()?;
    pb.inc(items as u64);
    for w in 1..=warehouses {
        let tx = conn.unchecked_transaction()?;
        insert_place(
            &tx,
            &mut r,
            "INSERT INTO warehouse VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 300000.0)",
            &[w],
        )?;
        {
            let mut ins = tx.prepare(
                "INSERT INTO stock VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, 0, 0, 0, ?14)",
            )?;
            for i in 1..=items {
                let d: Vec<String> = (0..10).map(|_| r.astring(24, 24)).collect();
                ins.execute(params![
                    i,
                    w,
                    r.int(10, 100),
                    d[0],
                    d[1],
                    d[2],
                    d[3],
                    d[4],
                    d[5],
                    d[6],
                    d[7],
                    d[8],
                    d[9],
                    r.data()
                ])?;
            }
        }
        pb.inc(items as u64);
        for d in 1..=DISTRICTS {
            load_district(&tx, &mut r, w, d)?;
            pb.inc(CUSTOMERS as u64 * 3);
        }
        tx.commit()?;
    }
    pb.finish_and_clear();
    Ok(())
}

/// Inserts a warehouse or a district with `sql`: its `keys`, then a random name, address and tax
/// (NAME, STREET_1, STREET_2, CITY, STATE, ZIP, TAX, clause 4.3.3.1).
fn insert_place(conn: &Connection, r: &mut Rand, sql: &str, keys: &[u32]) -> anyhow::Result<()> {
    use rusqlite::types::Value;
    let mut values: Vec<Value> = keys.iter().map(|&k| Value::Integer(k.into())).collect();
    let texts = [
        r.astring(6, 10),
        r.astring(10, 20),
        r.astring(10, 20),
        r.astring(10, 20),
        r.astring(2, 2),
        r.zip(),
    ];
    values.extend(texts.map(Value::Text));
    values.push(Value::Real(r.amount(0.0, 0.2)));
    conn.execute(sql, rusqlite::params_from_iter(values))?;
    Ok(())
}

fn load_district(tx: &Connection, r: &mut Rand, w: u32, d: u32) -> anyhow::Result<()> {
    insert_place(
        tx,
        r,
        "INSERT INTO district VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 30000.0, 3001)",
        &[d, w],
    )?;
    let mut cust = tx.prepare_cached(
        "INSERT INTO customer VALUES (?1, ?2, ?3, ?4, 'OE', ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13,
         50000.0, ?14, -10.0, 10.0, 1, 0, ?15)",
    )?;
    let mut hist =
        tx.prepare_cached("INSERT INTO history VALUES (?1, ?2, ?3, ?2, ?3, ?4, 10.0, ?5)")?;
    for c in 1..=CUSTOMERS {
        let last = if c <= 1000 {
            last_name(c - 1)
        } else {
            last_name(r.nurand(255, 0, 999))
        };
        let credit = if r.int(1, 10) == 1 { "BC" } else { "GC" };
        cust.execute(params![
            c,
            d,
            w,
            r.astring(8, 16),
            last,
            r.astring(10, 20),
            r.astring(10, 20),
            r.astring(10, 20),
            r.astring(2, 2),
            r.zip(),
            r.nstring(16, 16),
            NOW,
            credit,
            r.amount(0.0, 0.5),
            r.astring(300, 500)
        ])?;
        hist.execute(params![c, d, w, NOW, r.astring(12, 24)])?;
    }
    // O_C_ID: a random permutation of the customer numbers.
    let mut perm: Vec<u32> = (1..=CUSTOMERS).collect();
    for i in (1..perm.len()).rev() {
        perm.swap(i, r.rng.gen_range(0..=i));
    }
    let mut ord = tx.prepare_cached("INSERT INTO orders VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 1)")?;
    let mut line =
        tx.prepare_cached("INSERT INTO order_line VALUES (?1, ?2, ?3, ?4, ?5, ?3, ?6, 5, ?7, ?8)")?;
    let mut no = tx.prepare_cached("INSERT INTO new_order VALUES (?1, ?2, ?3)")?;
    let items: u32 = tx.query_row("SELECT count(*) FROM item", [], |x| x.get(0))?;
    for o in 1..=ORDERS {
        let delivered = o < FIRST_NEW_ORDER;
        let ol_cnt = r.int(5, 15);
        let carrier = delivered.then(|| r.int(1, 10));
        ord.execute(params![o, d, w, perm[o as usize - 1], NOW, carrier, ol_cnt])?;
        for n in 1..=ol_cnt {
            let amount = if delivered {
                0.0
            } else {
                r.amount(0.01, 9999.99)
            };
            line.execute(params![
                o,
                d,
                w,
                n,
                r.int(1, items),
                delivered.then_some(NOW),
                amount,
                r.astring(24, 24)
            ])?;
        }
        if !delivered {
            no.execute(params![o, d, w])?;
        }
    }
    Ok(())
}
