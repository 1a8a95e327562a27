//! `sqlite-bpe shell DB`: an SQLite shell on the `bpe` VFS that also takes SQL Server's operator
//! statements, DMV names and `GO [n]`.
//!
//! Batch semantics:
//! - Lines accumulate until they form complete statements ending in `;` (run at once, as in the
//!   sqlite3 shell) or until a `GO [n]` line (run then, as in sqlcmd; T-SQL statements need no
//!   `;`). At the end of a script whatever is pending runs too.
//! - The *batch* is everything since the previous `GO`. `GO n` runs it n times in all: its
//!   pending part once now, and then the whole batch n-1 more times, so `INSERT ...;` followed
//!   by `GO 3` inserts three rows, as sqlcmd would.
//! - An error is printed to stderr and the shell goes on; a script with errors exits with 1.

use crate::tsql::{self, Part};
use bpe_bench::table::Table;
use rusqlite::fallible_iterator::FallibleIterator;
use rusqlite::types::ValueRef;
use rusqlite::Connection;
use std::io::{BufRead, IsTerminal, Write};

/// SQLite's own page cache per connection, in KiB. Kept small so that repeated reads reach the
/// buffer pool, whose tiers and counters the shell is for looking at.
const PAGER_CACHE_KIB: u32 = 256;

const HELP: &str = "\
SQLite statements end with ';' and run at once. Also accepted:
  ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION ON (FILENAME = '/ssd/x.bpe', SIZE = 4 GB)
  ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION OFF
  EXEC sp_configure 'max server memory (MB)', 256     (without a value: shows it)
  RECONFIGURE
  DBCC DROPCLEANBUFFERS
  SELECT ... FROM sys.dm_os_performance_counters | sys.dm_os_buffer_descriptors
                | sys.dm_os_buffer_pool_extension_configuration
GO [n] on its own line runs the batch (everything since the previous GO) n times in all.
.tables            list tables and views
.schema [TABLE]    show CREATE statements
.help              this text
.quit / .exit      leave
";

pub enum Flow {
    Continue,
    Quit,
}

pub struct Shell {
    conn: Connection,
    out: Box<dyn Write>,
    err: Box<dyn Write>,
    /// Lines read but not run yet, and the line number of the first.
    pending: String,
    pending_line: usize,
    /// Texts run since the previous GO, with their first line numbers (replayed by `GO n`).
    batch: Vec<(String, usize)>,
    errors: usize,
    /// Scripts report line numbers with their errors.
    interactive: bool,
}

impl Shell {
    pub fn new(conn: Connection, out: Box<dyn Write>, err: Box<dyn Write>) -> Shell {
        Shell {
            conn,
            out,
            err,
            pending: String::new(),
            pending_line: 1,
            batch: Vec::new(),
            errors: 0,
            interactive: false,
        }
    }

    /// Errors printed so far.
    pub fn errors(&self) -> usize {
        self.errors
    }

    pub fn prompt(&self) -> &'static str {
        if tsql::is_blank(&self.pending) {
            "bpe> "
        } else {
            " ...> "
        }
    }

    /// Takes one line of input (without its newline); `number` is 1-based.
    pub fn feed(&mut self, line: &str, number: usize) -> Flow {
        if tsql::is_blank(&self.pending) && line.trim_start().starts_with('.') {
            self.pending.clear();
            return self.dot_command(line.trim(), number);
        }
        if let Some(count) = tsql::go_count(line) {
            match count {
                Ok(n) => self.go(n),
                Err(msg) => self.report(number, &msg),
            }
            return Flow::Continue;
        }
        if tsql::is_blank(&self.pending) {
            self.pending.clear();
            self.pending_line = number;
        }
        self.pending.push_str(line);
        self.pending.push('\n');
        if tsql::is_complete(&self.pending) {
            self.run_pending();
        }
        Flow::Continue
    }

    /// End of input: runs what is pending, as sqlcmd runs a last batch without GO.
    pub fn finish(&mut self) {
        self.run_pending();
        let _ = self.out.flush();
    }

    fn run_pending(&mut self) {
        let text = std::mem::take(&mut self.pending);
        if !tsql::is_blank(&text) {
            self.run_text(&text, self.pending_line);
            self.batch.push((text, self.pending_line));
        }
    }

    fn go(&mut self, count: u64) {
        self.run_pending();
        let batch = std::mem::take(&mut self.batch);
        for _ in 1..count {
            for (text, line) in &batch {
                self.run_text(text, *line);
            }
        }
    }

    fn run_text(&mut self, text: &str, line: usize) {
        for part in tsql::split_batch(text) {
            let result = match &part {
                Part::Operator(statements) => {
                    crate::bpe_exec(&self.conn, statements).map(|status| {
                        let _ = writeln!(self.out, "{status}");
                        if sets_memory(statements) {
                            let _ = writeln!(self.out, "{MEMORY_NOT_KEPT}");
                        }
                    })
                }
                Part::Sql(sql) => self
                    .refresh_configurations(sql)
                    .and_then(|()| self.run_sql(sql)),
            };
            if let Err(e) = result {
                self.report(line, &e.to_string());
                // Later parts may depend on the failed one, as in a T-SQL batch.
                break;
            }
        }
        let _ = self.out.flush();
    }

    /// Fills the shell's `sys.configurations` table with bpe's settings now, when `sql` reads it.
    fn refresh_configurations(&self, sql: &str) -> rusqlite::Result<()> {
        if !sql
            .to_ascii_lowercase()
            .contains(tsql::CONFIGURATIONS_TABLE)
        {
            return Ok(());
        }
        let memory: String = self
            .conn
            .query_row("PRAGMA bpe_max_server_memory_mb", [], |row| row.get(0))?;
        let memory: i64 = memory.trim().parse().unwrap_or(0);
        let machine = machine_memory_mb().unwrap_or(i64::MAX);
        let table = tsql::CONFIGURATIONS_TABLE;
        self.conn.execute_batch(&format!(
            "CREATE TEMP TABLE IF NOT EXISTS {table}(configuration_id INTEGER, name TEXT, \
             value INTEGER, minimum INTEGER, maximum INTEGER, value_in_use INTEGER, \
             description TEXT, is_dynamic INTEGER, is_advanced INTEGER);
             DELETE FROM temp.{table};"
        ))?;
        let mut insert = self.conn.prepare(&format!(
            "INSERT INTO temp.{table} VALUES (?1, ?2, ?3, ?4, ?5, ?3, ?6, 1, ?7)"
        ))?;
        insert.execute(rusqlite::params![
            1544,
            "max server memory (MB)",
            memory,
            1,
            machine,
            "Maximum size of the buffer pool's RAM tier (MB), for this process",
            1
        ])?;
        insert.execute(rusqlite::params![
            518,
            "show advanced options",
            1,
            0,
            1,
            "Accepted for scripts; every option is always shown",
            0
        ])?;
        Ok(())
    }

    /// Runs SQLite statements one by one, printing each result set as a table.
    fn run_sql(&mut self, sql: &str) -> rusqlite::Result<()> {
        let mut statements = rusqlite::Batch::new(&self.conn, sql);
        while let Some(mut statement) = statements.next()? {
            let headers: Vec<String> = statement
                .column_names()
                .into_iter()
                .map(String::from)
                .collect();
            if headers.is_empty() {
                statement.execute([])?;
                continue;
            }
            let columns = headers.len();
            let mut table = Table::new(headers);
            let mut rows = statement.query([])?;
            while let Some(row) = rows.next()? {
                let cells = (0..columns)
                    .map(|i| row.get_ref(i).map(cell_text))
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                table.push(cells);
            }
            let _ = write!(self.out, "{}", table.render());
        }
        Ok(())
    }

    fn report(&mut self, line: usize, message: &str) {
        self.errors += 1;
        let _ = self.out.flush();
        let _ = if self.interactive {
            writeln!(self.err, "Error: {message}")
        } else {
            writeln!(self.err, "Error (line {line}): {message}")
        };
    }

    fn dot_command(&mut self, line: &str, number: usize) -> Flow {
        let mut words = line.split_whitespace();
        let command = words.next().unwrap_or("");
        let argument = words.next();
        let result = match command {
            ".quit" | ".exit" | ".q" => return Flow::Quit,
            ".help" => {
                let _ = write!(self.out, "{HELP}");
                return Flow::Continue;
            }
            ".tables" => self.print_column(
                "SELECT name FROM sqlite_schema WHERE type IN ('table', 'view') \
                 AND name NOT LIKE 'sqlite_%' ORDER BY 1",
                (),
            ),
            ".schema" => self.print_column(
                "SELECT sql || ';' FROM sqlite_schema WHERE sql IS NOT NULL \
                 AND (?1 IS NULL OR tbl_name LIKE ?1) ORDER BY tbl_name, type DESC, name",
                [argument],
            ),
            other => Err(format!("unknown command '{other}': try .help")),
        };
        if let Err(message) = result {
            self.report(number, &message);
        }
        Flow::Continue
    }

    /// Prints the first column of each row, one per line.
    fn print_column(&mut self, sql: &str, params: impl rusqlite::Params) -> Result<(), String> {
        let mut statement = self.conn.prepare(sql).map_err(|e| e.to_string())?;
        let mut rows = statement.query(params).map_err(|e| e.to_string())?;
        while let Some(row) = rows.next().map_err(|e| e.to_string())? {
            let value = row.get_ref(0).map_err(|e| e.to_string())?;
            let _ = writeln!(self.out, "{}", cell_text(value));
        }
        Ok(())
    }
}

/// What the shell says after `sp_configure` sets max server memory.
const MEMORY_NOT_KEPT: &str = "note: max server memory holds for this shell's process only; \
     the next session starts from BPE_MAX_SERVER_MEMORY_MB (or the default): set that to keep it";

/// Do the operator statements set max server memory?
fn sets_memory(statements: &str) -> bool {
    bpe_tsql::parse(statements).is_ok_and(|all| {
        all.iter()
            .any(|s| matches!(s, bpe_tsql::Statement::MaxServerMemory { .. }))
    })
}

/// The machine's RAM in MB (`MemTotal` in /proc/meminfo), the most max server memory can be.
fn machine_memory_mb() -> Option<i64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: i64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

/// A value as the sqlite3 shell shows it (blobs in hex, cut after 32 bytes).
fn cell_text(value: ValueRef<'_>) -> String {
    match value {
        ValueRef::Null => "NULL".into(),
        ValueRef::Integer(i) => i.to_string(),
        ValueRef::Real(r) => format!("{r:?}"),
        ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned(),
        ValueRef::Blob(b) => {
            let hex: String = b.iter().take(32).map(|x| format!("{x:02x}")).collect();
            let more = if b.len() > 32 { "..." } else { "" };
            format!("x'{hex}{more}'")
        }
    }
}

/// Opens `db` and runs the shell on stdin: with line editing on a terminal, as a script
/// otherwise. Returns the process exit code.
pub fn run(db: &str) -> anyhow::Result<i32> {
    let conn = crate::open(db)?;
    conn.execute_batch(&format!("PRAGMA cache_size = -{PAGER_CACHE_KIB};"))?;
    let mut shell = Shell::new(
        conn,
        Box::new(std::io::stdout()),
        Box::new(std::io::stderr()),
    );
    if std::io::stdin().is_terminal() {
        interactive(&mut shell)?;
        Ok(0)
    } else {
        script(&mut shell, std::io::stdin().lock())?;
        Ok(i32::from(shell.errors() > 0))
    }
}

/// Reads a script to its end (or `.quit`).
pub fn script(shell: &mut Shell, input: impl BufRead) -> std::io::Result<()> {
    for (i, line) in input.lines().enumerate() {
        if let Flow::Quit = shell.feed(&line?, i + 1) {
            break;
        }
    }
    shell.finish();
    Ok(())
}

fn interactive(shell: &mut Shell) -> anyhow::Result<()> {
    use rustyline::error::ReadlineError;
    shell.interactive = true;
    println!("sqlite-bpe shell: SQLite on the bpe VFS. Enter .help for help.");
    let mut editor = rustyline::DefaultEditor::new()?;
    let history = std::env::var_os("HOME")
        .map(|home| std::path::Path::new(&home).join(".sqlite_bpe_history"));
    if let Some(h) = &history {
        let _ = editor.load_history(h);
    }
    let mut number = 0;
    loop {
        match editor.readline(shell.prompt()) {
            Ok(line) => {
                number += 1;
                let _ = editor.add_history_entry(line.as_str());
                if let Flow::Quit = shell.feed(&line, number) {
                    break;
                }
            }
            // Ctrl-C drops the statement being typed, as in the sqlite3 shell.
            Err(ReadlineError::Interrupted) => shell.pending.clear(),
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(e.into()),
        }
    }
    shell.finish();
    if let Some(h) = &history {
        let _ = editor.save_history(h);
    }
    Ok(())
}
