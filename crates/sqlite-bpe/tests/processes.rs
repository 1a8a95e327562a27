//! Two real processes on one database. The second process is the stock sqlite3 shell, as a plain
//! SQLite writer or with bpe loaded: either way its changes must never leave this process
//! reading a stale cached page (rollback and WAL modes), and neither process is refused. And
//! closing one connection must not drop the POSIX locks another connection of this process holds.

mod common;
use common::*;

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn value(c: &rusqlite::Connection) -> String {
    c.query_row("SELECT v FROM kv WHERE k = 7", [], |r| r.get(0))
        .unwrap()
}

fn stale_check(journal: &str) {
    let dir = tempdir();
    let db = dir.path().join("shared.db");
    let a = open_bpe(&db);
    a.execute_batch(&format!(
        "PRAGMA journal_mode = {journal}; CREATE TABLE kv(k INTEGER PRIMARY KEY, v TEXT);"
    ))
    .unwrap();
    let tx = a.unchecked_transaction().unwrap();
    for k in 1..=2000 {
        tx.execute("INSERT INTO kv VALUES (?1, 'old')", [k])
            .unwrap();
    }
    tx.commit().unwrap();
    if journal == "WAL" {
        a.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
    }
    // SQLite's own cache holds one page, so the next reads come from our pool.
    a.execute_batch("PRAGMA cache_size = 1").unwrap();
    assert_eq!(value(&a), "old");
    assert_eq!(value(&a), "old");
    // Another process, plain SQLite, changes the row; in WAL mode it also checkpoints, so the
    // new page reaches the database file while our pool holds the old one.
    let checkpoint = if journal == "WAL" {
        "PRAGMA wal_checkpoint(TRUNCATE);"
    } else {
        ""
    };
    let (out, err, ok) = run_shell(
        dir.path(),
        &format!(".open {}\nUPDATE kv SET v = 'new' WHERE k = 7;\n{checkpoint}\nSELECT v FROM kv WHERE k = 7;\n", db.display()),
    );
    assert!(
        ok && err.is_empty() && out.contains("new"),
        "plain writer failed: {err} {out}"
    );
    assert_eq!(
        value(&a),
        "new",
        "{journal}: this process served a stale page"
    );
}

#[test]
fn a_plain_sqlite_writer_in_another_process_is_seen_in_rollback_mode() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    stale_check("DELETE");
}

#[test]
fn a_plain_sqlite_writer_in_another_process_is_seen_in_wal_mode() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    stale_check("WAL");
}

/// Another process using bpe on the same database (the stock sqlite3 shell with the extension
/// loaded) reads what this process committed, commits itself, and this process sees it at its
/// next read transaction: in both journal modes, with no refusal and no stale page.
fn second_bpe_process(journal: &str) {
    let lib = extension_library();
    let dir = tempdir();
    let db = dir.path().join("shared.db");
    let a = open_bpe(&db);
    a.execute_batch(&format!(
        "PRAGMA journal_mode = {journal}; CREATE TABLE kv(k INTEGER PRIMARY KEY, v TEXT);"
    ))
    .unwrap();
    let tx = a.unchecked_transaction().unwrap();
    for k in 1..=2000 {
        tx.execute("INSERT INTO kv VALUES (?1, 'old')", [k])
            .unwrap();
    }
    tx.commit().unwrap();
    a.execute_batch("PRAGMA cache_size = 1").unwrap();
    assert_eq!(value(&a), "old");
    // The other process caches the page too, then changes it (and, in WAL mode, checkpoints it
    // into the database file, where this process's cache holds the old copy).
    let checkpoint = if journal == "WAL" {
        "PRAGMA wal_checkpoint(TRUNCATE);"
    } else {
        ""
    };
    let (out, err, ok) = run_shell(
        dir.path(),
        &format!(
            ".bail on\n.load {}\n.open file:{}?vfs=bpe\nPRAGMA busy_timeout = 5000;\n\
             SELECT v FROM kv WHERE k = 7;\nUPDATE kv SET v = 'new' WHERE k = 7;\n{checkpoint}\n\
             SELECT v FROM kv WHERE k = 7;\n",
            lib.with_extension("").display(),
            db.display()
        ),
    );
    assert!(
        ok && err.is_empty(),
        "the second bpe process failed: {err} {out}"
    );
    assert!(out.contains("old") && out.contains("new"), "{out}");
    assert_eq!(
        value(&a),
        "new",
        "{journal}: this process served a stale page"
    );
    // And the other way round: this process commits, a new bpe process reads it.
    a.execute("UPDATE kv SET v = 'third' WHERE k = 7", [])
        .unwrap();
    let (out, err, ok) = run_shell(
        dir.path(),
        &format!(
            ".load {}\n.open file:{}?vfs=bpe\nSELECT v FROM kv WHERE k = 7;\n",
            lib.with_extension("").display(),
            db.display()
        ),
    );
    assert!(ok && err.is_empty() && out.trim() == "third", "{out} {err}");
}

#[test]
fn a_second_bpe_process_shares_the_database_in_rollback_mode() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    second_bpe_process("DELETE");
}

#[test]
fn a_second_bpe_process_shares_the_database_in_wal_mode() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    second_bpe_process("WAL");
}

#[test]
fn closing_one_connection_keeps_the_other_connections_locks() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempdir();
    let db = dir.path().join("locks.db");
    let a = open_bpe(&db);
    a.execute_batch("PRAGMA journal_mode = DELETE; CREATE TABLE t(x); INSERT INTO t VALUES (1);")
        .unwrap();
    // A holds a read transaction: a SHARED POSIX lock on the file.
    a.execute_batch("BEGIN; SELECT * FROM t;").unwrap();
    let n: i64 = a
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 1);
    // B opens and closes the same file in this process.
    {
        let b = open_bpe(&db);
        let _: i64 = b
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
    }
    // Another process must still be unable to write while A's read transaction is open.
    let (out, err, _) = run_shell(
        dir.path(),
        &format!(
            ".open {}\n.timeout 0\nINSERT INTO t VALUES (2);\n",
            db.display()
        ),
    );
    assert!(
        err.contains("database is locked"),
        "A's lock was lost: out {out:?} err {err:?}"
    );
    a.execute_batch("COMMIT").unwrap();
    let (_, err, ok) = run_shell(
        dir.path(),
        &format!(".open {}\nINSERT INTO t VALUES (2);\n", db.display()),
    );
    assert!(ok && err.is_empty(), "{err}");
}

/// In WAL mode another process's checkpoint forgets only the pages it wrote into the database
/// file (the wal-index lists them), not the whole file: the rest stays cached, and the changed
/// rows are read fresh. Here the other process's write also restarts the WAL (it was fully
/// checkpointed), which is followed too. (After a TRUNCATE checkpoint the next writer picks
/// random salts, generations cannot be counted, and the whole file is forgotten instead.)
#[test]
fn a_foreign_checkpoint_forgets_only_the_pages_it_backfilled() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempdir();
    let db = dir.path().join("wal.db");
    let a = open_bpe(&db);
    a.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE kv(k INTEGER PRIMARY KEY, v TEXT);")
        .unwrap();
    let tx = a.unchecked_transaction().unwrap();
    for k in 1..=5000 {
        tx.execute("INSERT INTO kv VALUES (?1, printf('old%0200d', ?1))", [k])
            .unwrap();
    }
    tx.commit().unwrap();
    a.execute_batch("PRAGMA wal_checkpoint(PASSIVE); PRAGMA cache_size = 1")
        .unwrap();
    let sum = |c: &rusqlite::Connection| -> i64 {
        c.query_row("SELECT sum(length(v)) FROM kv", [], |r| r.get(0))
            .unwrap()
    };
    sum(&a);
    sum(&a); // every page cached in the pool
    let whole_before = counter(&a, "File cache invalidations");
    let pages_before = counter(&a, "Pages invalidated by other processes");
    let (out, err, ok) = run_shell(
        dir.path(),
        &format!(
            ".open {}\nUPDATE kv SET v = 'new' WHERE k IN (7, 2500, 4999);\nPRAGMA wal_checkpoint(PASSIVE);\n",
            db.display()
        ),
    );
    assert!(ok && err.is_empty(), "{out} {err}");
    let reads_before = counter(&a, "Page reads/sec");
    let seen: Vec<String> = a
        .prepare("SELECT v FROM kv WHERE k IN (7, 2500, 4999) ORDER BY k")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        seen,
        ["new", "new", "new"],
        "a stale page after a foreign checkpoint"
    );
    sum(&a);
    let forgotten = counter(&a, "Pages invalidated by other processes") - pages_before;
    let refetched = counter(&a, "Page reads/sec") - reads_before;
    assert_eq!(
        counter(&a, "File cache invalidations"),
        whole_before,
        "the whole file was forgotten"
    );
    assert!(
        (3..=12).contains(&forgotten),
        "{forgotten} pages forgotten for 3 rows changed"
    );
    assert!(
        refetched <= forgotten + 2,
        "{refetched} pages read again from the file after {forgotten} were forgotten"
    );
}

/// In rollback mode a commit by another bpe process forgets only the pages it wrote (the bpe
/// processes log them), not the whole file; a plain SQLite writer's commit, which logs nothing,
/// still forgets the whole file.
#[test]
fn a_bpe_peers_commit_forgets_only_its_pages_and_a_plain_writers_the_whole_file() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lib = extension_library();
    let dir = tempdir();
    let db = dir.path().join("rollback.db");
    let a = open_bpe(&db);
    a.execute_batch(
        "PRAGMA journal_mode = DELETE; CREATE TABLE kv(k INTEGER PRIMARY KEY, v TEXT);",
    )
    .unwrap();
    let tx = a.unchecked_transaction().unwrap();
    for k in 1..=5000 {
        tx.execute("INSERT INTO kv VALUES (?1, printf('old%0200d', ?1))", [k])
            .unwrap();
    }
    tx.commit().unwrap();
    a.execute_batch("PRAGMA cache_size = 1").unwrap();
    let sum = |c: &rusqlite::Connection| -> i64 {
        c.query_row("SELECT sum(length(v)) FROM kv", [], |r| r.get(0))
            .unwrap()
    };
    sum(&a);
    let values = |c: &rusqlite::Connection| -> Vec<String> {
        c.prepare("SELECT v FROM kv WHERE k IN (7, 2500, 4999) ORDER BY k")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    let update = |tag: &str, bpe: bool| {
        let open = if bpe {
            format!(
                ".load {}\n.open file:{}?vfs=bpe\n",
                lib.with_extension("").display(),
                db.display()
            )
        } else {
            format!(".open {}\n", db.display())
        };
        let (out, err, ok) = run_shell(
            dir.path(),
            &format!("{open}UPDATE kv SET v = '{tag}' WHERE k IN (7, 2500, 4999);\n"),
        );
        assert!(ok && err.is_empty(), "{out} {err}");
    };
    for round in ["peer1", "peer2"] {
        let whole = counter(&a, "File cache invalidations");
        let pages = counter(&a, "Pages invalidated by other processes");
        update(round, true);
        let reads = counter(&a, "Page reads/sec");
        assert_eq!(
            values(&a),
            [round, round, round],
            "stale page after a peer's commit"
        );
        sum(&a);
        let forgotten = counter(&a, "Pages invalidated by other processes") - pages;
        let refetched = counter(&a, "Page reads/sec") - reads;
        assert_eq!(
            counter(&a, "File cache invalidations"),
            whole,
            "{round}: whole file forgotten"
        );
        assert!(
            (3..=12).contains(&forgotten),
            "{round}: {forgotten} pages forgotten"
        );
        assert!(
            refetched <= forgotten + 2,
            "{round}: {refetched} pages read again"
        );
    }
    let whole = counter(&a, "File cache invalidations");
    update("plain", false);
    assert_eq!(
        values(&a),
        ["plain", "plain", "plain"],
        "stale page after a plain commit"
    );
    assert_eq!(counter(&a, "File cache invalidations"), whole + 1);
    // And after the plain writer, peers' commits are followed page by page again.
    update("peer3", true);
    let whole = counter(&a, "File cache invalidations");
    assert_eq!(values(&a), ["peer3", "peer3", "peer3"]);
    assert_eq!(counter(&a, "File cache invalidations"), whole);
}
