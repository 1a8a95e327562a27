//! The five TPC-C transactions (clauses 2.4-2.8), without keying and think times, and the
//! consistency conditions 1-4 of clause 3.3.2.

use super::load::{last_name, Rand, CUSTOMERS, DISTRICTS, NOW};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    NewOrder,
    Payment,
    OrderStatus,
    Delivery,
    StockLevel,
}

pub const KINDS: [Kind; 5] = [
    Kind::NewOrder,
    Kind::Payment,
    Kind::OrderStatus,
    Kind::Delivery,
    Kind::StockLevel,
];

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::NewOrder => "new_order",
            Kind::Payment => "payment",
            Kind::OrderStatus => "order_status",
            Kind::Delivery => "delivery",
            Kind::StockLevel => "stock_level",
        }
    }

    /// The mix: New-Order 45 %, Payment 43 %, Order-Status, Delivery and Stock-Level 4 % each.
    pub fn pick(r: &mut Rand) -> Kind {
        match r.int(1, 100) {
            1..=45 => Kind::NewOrder,
            46..=88 => Kind::Payment,
            89..=92 => Kind::OrderStatus,
            93..=96 => Kind::Delivery,
            _ => Kind::StockLevel,
        }
    }

    /// New-Order, Payment and Delivery write; Order-Status and Stock-Level only read.
    pub fn writes(self) -> bool {
        matches!(self, Kind::NewOrder | Kind::Payment | Kind::Delivery)
    }
}

/// One terminal: a connection, its home warehouse and district, its random stream.
pub struct Terminal {
    pub conn: Connection,
    pub r: Rand,
    pub w: u32,
    pub d: u32,
    pub warehouses: u32,
    pub items: u32,
}

/// What happened: committed, or rolled back as the specification asks (1 % of New-Orders).
pub enum Outcome {
    Committed,
    RolledBack,
}

impl Terminal {
    pub fn run(&mut self, kind: Kind) -> anyhow::Result<Outcome> {
        match kind {
            Kind::NewOrder => self.new_order(),
            Kind::Payment => self.payment().map(|_| Outcome::Committed),
            Kind::OrderStatus => self.order_status().map(|_| Outcome::Committed),
            Kind::Delivery => self.delivery().map(|_| Outcome::Committed),
            Kind::StockLevel => self.stock_level().map(|_| Outcome::Committed),
        }
    }

    fn other_warehouse(&mut self) -> u32 {
        if self.warehouses == 1 {
            return self.w;
        }
        loop {
            let w = self.r.int(1, self.warehouses);
            if w != self.w {
                return w;
            }
        }
    }

    fn new_order(&mut self) -> anyhow::Result<Outcome> {
        let (w, d) = (self.w, self.r.int(1, DISTRICTS));
        let c = self.r.nurand(1023, 1, CUSTOMERS);
        let ol_cnt = self.r.int(5, 15);
        let rollback = self.r.int(1, 100) == 1;
        let mut lines = Vec::with_capacity(ol_cnt as usize);
        for n in 1..=ol_cnt {
            let item = if rollback && n == ol_cnt {
                self.items + 1 // unused item number: the transaction rolls back
            } else {
                self.r.nurand(8191, 1, self.items)
            };
            let supply = if self.r.int(1, 100) == 1 {
                self.other_warehouse()
            } else {
                w
            };
            lines.push((item, supply, self.r.int(1, 10)));
        }
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let w_tax: f64 = tx
            .prepare_cached("SELECT w_tax FROM warehouse WHERE w_id = ?1")?
            .query_row([w], |x| x.get(0))?;
        let (d_tax, o_id): (f64, u32) = tx
            .prepare_cached(
                "SELECT d_tax, d_next_o_id FROM district WHERE d_w_id = ?1 AND d_id = ?2",
            )?
            .query_row([w, d], |x| Ok((x.get(0)?, x.get(1)?)))?;
        tx.prepare_cached(
            "UPDATE district SET d_next_o_id = d_next_o_id + 1 WHERE d_w_id = ?1 AND d_id = ?2",
        )?
        .execute([w, d])?;
        let discount: f64 = tx
            .prepare_cached(
                "SELECT c_discount FROM customer WHERE c_w_id = ?1 AND c_d_id = ?2 AND c_id = ?3",
            )?
            .query_row([w, d, c], |x| x.get(0))?;
        let all_local = lines.iter().all(|l| l.1 == w) as u32;
        tx.prepare_cached("INSERT INTO orders VALUES (?1, ?2, ?3, ?4, ?5, NULL, ?6, ?7)")?
            .execute(params![o_id, d, w, c, NOW, ol_cnt, all_local])?;
        tx.prepare_cached("INSERT INTO new_order VALUES (?1, ?2, ?3)")?
            .execute([o_id, d, w])?;
        let mut total = 0.0;
        for (n, (item, supply, qty)) in lines.into_iter().enumerate() {
            let price: Option<f64> = tx
                .prepare_cached("SELECT i_price FROM item WHERE i_id = ?1")?
                .query_row([item], |x| x.get(0))
                .optional()?;
            let Some(price) = price else {
                tx.rollback()?;
                return Ok(Outcome::RolledBack);
            };
            let (s_qty, dist): (u32, String) = tx
                .prepare_cached(&format!(
                    "SELECT s_quantity, s_dist_{d:02} FROM stock WHERE s_w_id = ?1 AND s_i_id = ?2"
                ))?
                .query_row([supply, item], |x| Ok((x.get(0)?, x.get(1)?)))?;
            let new_qty = if s_qty >= qty + 10 {
                s_qty - qty
            } else {
                s_qty + 91 - qty
            };
            tx.prepare_cached(
                "UPDATE stock SET s_quantity = ?1, s_ytd = s_ytd + ?2, s_order_cnt = s_order_cnt + 1,
                 s_remote_cnt = s_remote_cnt + ?3 WHERE s_w_id = ?4 AND s_i_id = ?5",
            )?
            .execute(params![new_qty, qty, (supply != w) as u32, supply, item])?;
            let amount = qty as f64 * price;
            total += amount;
            tx.prepare_cached(
                "INSERT INTO order_line VALUES (?1, ?2, ?3, ?4, ?5, ?6, NULL, ?7, ?8, ?9)",
            )?
            .execute(params![
                o_id,
                d,
                w,
                n as u32 + 1,
                item,
                supply,
                qty,
                amount,
                dist
            ])?;
        }
        let _total = total * (1.0 - discount) * (1.0 + w_tax + d_tax);
        tx.commit()?;
        Ok(Outcome::Committed)
    }

    fn payment(&mut self) -> anyhow::Result<()> {
        let (w, d) = (self.w, self.r.int(1, DISTRICTS));
        let (c_w, c_d) = if self.r.int(1, 100) <= 85 {
            (w, d)
        } else {
            (self.other_warehouse(), self.r.int(1, DISTRICTS))
        };
        let amount = self.r.amount(1.0, 5000.0);
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        {
            let c = pick_customer(&mut self.r, &tx, c_w, c_d)?;
            tx.prepare_cached("UPDATE warehouse SET w_ytd = w_ytd + ?1 WHERE w_id = ?2")?
                .execute(params![amount, w])?;
            tx.prepare_cached(
                "UPDATE district SET d_ytd = d_ytd + ?1 WHERE d_w_id = ?2 AND d_id = ?3",
            )?
            .execute(params![amount, w, d])?;
            let credit: String = tx
                .prepare_cached(
                    "SELECT c_credit FROM customer WHERE c_w_id = ?1 AND c_d_id = ?2 AND c_id = ?3",
                )?
                .query_row([c_w, c_d, c], |x| x.get(0))?;
            tx.prepare_cached(
                "UPDATE customer SET c_balance = c_balance - ?1, c_ytd_payment = c_ytd_payment + ?1,
                 c_payment_cnt = c_payment_cnt + 1 WHERE c_w_id = ?2 AND c_d_id = ?3 AND c_id = ?4",
            )?
            .execute(params![amount, c_w, c_d, c])?;
            if credit == "BC" {
                let note = format!("{c} {c_d} {c_w} {d} {w} {amount:.2} | ");
                tx.prepare_cached(
                    "UPDATE customer SET c_data = substr(?1 || c_data, 1, 500)
                     WHERE c_w_id = ?2 AND c_d_id = ?3 AND c_id = ?4",
                )?
                .execute(params![note, c_w, c_d, c])?;
            }
            tx.prepare_cached("INSERT INTO history VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)")?
                .execute(params![c, c_d, c_w, d, w, NOW, amount, "payment"])?;
        }
        tx.commit()?;
        Ok(())
    }

    fn order_status(&mut self) -> anyhow::Result<()> {
        let (w, d) = (self.w, self.r.int(1, DISTRICTS));
        let tx = self.conn.unchecked_transaction()?;
        {
            let c = pick_customer(&mut self.r, &tx, w, d)?;
            let _balance: f64 = tx
                .prepare_cached(
                    "SELECT c_balance FROM customer WHERE c_w_id = ?1 AND c_d_id = ?2 AND c_id = ?3",
                )?
                .query_row([w, d, c], |x| x.get(0))?;
            let o: Option<u32> = tx
                .prepare_cached(
                    "SELECT max(o_id) FROM orders WHERE o_w_id = ?1 AND o_d_id = ?2 AND o_c_id = ?3",
                )?
                .query_row([w, d, c], |x| x.get(0))?;
            if let Some(o) = o {
                let mut q = tx.prepare_cached(
                    "SELECT ol_i_id, ol_supply_w_id, ol_quantity, ol_amount, ol_delivery_d
                     FROM order_line WHERE ol_w_id = ?1 AND ol_d_id = ?2 AND ol_o_id = ?3",
                )?;
                let mut rows = q.query([w, d, o])?;
                while rows.next()?.is_some() {}
            }
        }
        tx.commit()?;
        Ok(())
    }

    fn delivery(&mut self) -> anyhow::Result<()> {
        let w = self.w;
        let carrier = self.r.int(1, 10);
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        for d in 1..=DISTRICTS {
            let o: Option<u32> = tx
                .prepare_cached(
                    "SELECT min(no_o_id) FROM new_order WHERE no_w_id = ?1 AND no_d_id = ?2",
                )?
                .query_row([w, d], |x| x.get(0))?;
            let Some(o) = o else { continue };
            tx.prepare_cached(
                "DELETE FROM new_order WHERE no_w_id = ?1 AND no_d_id = ?2 AND no_o_id = ?3",
            )?
            .execute([w, d, o])?;
            let c: u32 = tx
                .prepare_cached(
                    "SELECT o_c_id FROM orders WHERE o_w_id = ?1 AND o_d_id = ?2 AND o_id = ?3",
                )?
                .query_row([w, d, o], |x| x.get(0))?;
            tx.prepare_cached(
                "UPDATE orders SET o_carrier_id = ?1 WHERE o_w_id = ?2 AND o_d_id = ?3 AND o_id = ?4",
            )?
            .execute([carrier, w, d, o])?;
            tx.prepare_cached(
                "UPDATE order_line SET ol_delivery_d = ?1
                 WHERE ol_w_id = ?2 AND ol_d_id = ?3 AND ol_o_id = ?4",
            )?
            .execute(params![NOW, w, d, o])?;
            let sum: f64 = tx
                .prepare_cached(
                    "SELECT coalesce(sum(ol_amount), 0) FROM order_line
                     WHERE ol_w_id = ?1 AND ol_d_id = ?2 AND ol_o_id = ?3",
                )?
                .query_row([w, d, o], |x| x.get(0))?;
            tx.prepare_cached(
                "UPDATE customer SET c_balance = c_balance + ?1, c_delivery_cnt = c_delivery_cnt + 1
                 WHERE c_w_id = ?2 AND c_d_id = ?3 AND c_id = ?4",
            )?
            .execute(params![sum, w, d, c])?;
        }
        tx.commit()?;
        Ok(())
    }

    fn stock_level(&mut self) -> anyhow::Result<()> {
        let (w, d) = (self.w, self.d);
        let threshold = self.r.int(10, 20);
        let tx = self.conn.unchecked_transaction()?;
        let next: u32 = tx
            .prepare_cached("SELECT d_next_o_id FROM district WHERE d_w_id = ?1 AND d_id = ?2")?
            .query_row([w, d], |x| x.get(0))?;
        let _low: u32 = tx
            .prepare_cached(
                "SELECT count(DISTINCT s_i_id) FROM order_line JOIN stock
                 ON s_w_id = ?1 AND s_i_id = ol_i_id
                 WHERE ol_w_id = ?1 AND ol_d_id = ?2 AND ol_o_id >= ?3 AND ol_o_id < ?4
                   AND s_quantity < ?5",
            )?
            .query_row([w, d, next.saturating_sub(20), next, threshold], |x| {
                x.get(0)
            })?;
        tx.commit()?;
        Ok(())
    }
}

/// 60 % by last name (the middle one of those ordered by first name), 40 % by number.
fn pick_customer(r: &mut Rand, tx: &Connection, w: u32, d: u32) -> anyhow::Result<u32> {
    if r.int(1, 100) <= 60 {
        let last = last_name(r.nurand(255, 0, 999));
        let ids: Vec<u32> = tx
            .prepare_cached(
                "SELECT c_id FROM customer WHERE c_w_id = ?1 AND c_d_id = ?2 AND c_last = ?3
                 ORDER BY c_first",
            )?
            .query_map(params![w, d, last], |x| x.get(0))?
            .collect::<Result<_, _>>()?;
        if !ids.is_empty() {
            return Ok(ids[(ids.len() - 1) / 2]);
        }
    }
    Ok(r.nurand(1023, 1, CUSTOMERS))
}

/// Consistency conditions 1-4 (clause 3.3.2); returns (condition, passed, detail).
pub fn check(conn: &Connection) -> anyhow::Result<Vec<(u32, bool, String)>> {
    let count = |sql: &str| -> anyhow::Result<i64> { Ok(conn.query_row(sql, [], |x| x.get(0))?) };
    let c1 = count(
        "SELECT count(*) FROM warehouse WHERE abs(w_ytd -
           (SELECT sum(d_ytd) FROM district WHERE d_w_id = w_id)) > 0.005",
    )?;
    let c2 = count(
        "SELECT count(*) FROM district WHERE d_next_o_id - 1 <>
           (SELECT max(o_id) FROM orders WHERE o_w_id = d_w_id AND o_d_id = d_id)
         OR coalesce(d_next_o_id - 1 <>
           (SELECT max(no_o_id) FROM new_order WHERE no_w_id = d_w_id AND no_d_id = d_id), 0)",
    )?;
    let c3 = count(
        "SELECT count(*) FROM (SELECT no_w_id, no_d_id FROM new_order GROUP BY no_w_id, no_d_id
           HAVING max(no_o_id) - min(no_o_id) + 1 <> count(*))",
    )?;
    let c4 = count(
        "SELECT count(*) FROM district WHERE
           (SELECT sum(o_ol_cnt) FROM orders WHERE o_w_id = d_w_id AND o_d_id = d_id) <>
           (SELECT count(*) FROM order_line WHERE ol_w_id = d_w_id AND ol_d_id = d_id)",
    )?;
    Ok([
        (
            1,
            c1,
            "warehouses whose W_YTD differs from the sum of D_YTD",
        ),
        (
            2,
            c2,
            "districts whose D_NEXT_O_ID - 1 differs from max(O_ID) or max(NO_O_ID)",
        ),
        (3, c3, "districts whose NEW-ORDER rows are not contiguous"),
        (
            4,
            c4,
            "districts whose sum(O_OL_CNT) differs from the ORDER-LINE count",
        ),
    ]
    .into_iter()
    .map(|(n, bad, what)| (n, bad == 0, format!("{bad} {what}")))
    .collect())
}
