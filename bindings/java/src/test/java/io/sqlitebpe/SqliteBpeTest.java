package io.sqlitebpe;

import static io.sqlitebpe.Rows.ROWS;
import static io.sqlitebpe.Rows.fill;
import static io.sqlitebpe.Rows.scalar;
import static io.sqlitebpe.Rows.text;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The package in this JVM: one process-wide extension shared by every test here. */
class SqliteBpeTest {
  @TempDir Path dir;

  @Test
  void loadAddsTheFunctionsAndTablesAndDisablesExtensionLoadingAfter() throws Exception {
    String lib = SqliteBpe.loadablePath();
    assertTrue(Files.isRegularFile(Path.of(lib)), lib);
    try (Connection db = DriverManager.getConnection("jdbc:sqlite::memory:")) {
      SqliteBpe.load(db, lib);
      assertTrue(scalar(db, "SELECT count(*) FROM bpe_performance_counters") > 10);
      assertEquals("SQLServer:Buffer Manager", text(db, "SELECT DISTINCT object_name FROM bpe_performance_counters"));
      // Loading twice is harmless (later loads only add the functions to that connection).
      SqliteBpe.load(db);
      SQLException e = assertThrows(SQLException.class, () -> scalar(db, "SELECT load_extension('" + lib + "')"));
      assertTrue(e.getMessage().contains("not authorized"), e.getMessage());
    }
  }

  @Test
  void connectOpensTheFileOnBpeAndItsPagesAreInThePool() throws Exception {
    Path file = dir.resolve("a b%?#.db");
    try (Connection db = SqliteBpe.connect(file.toString())) {
      long before = scalar(db, "SELECT count(*) FROM bpe_buffer_descriptors");
      fill(db);
      assertEquals(ROWS * 500L, scalar(db, "SELECT sum(length(n)) FROM t"));
      // (Not by DB_ID(): the engine names a file after the first path it saw for its inode, and
      // another test's deleted file may have had this one's.)
      long cached = scalar(db, "SELECT count(*) FROM bpe_buffer_descriptors") - before;
      assertTrue(cached >= 200, cached + " more pages in the buffer pool");
    }
    assertTrue(Files.isRegularFile(file), "the file name was not decoded: " + file);
  }

  @Test
  void manyConnectionsOnManyThreadsWriteAndReadTheSameRows() throws Exception {
    String path = dir.resolve("threads.db").toString();
    Properties wal = new Properties();
    wal.setProperty("journal_mode", "WAL");
    wal.setProperty("busy_timeout", "30000");
    try (Connection db = SqliteBpe.connect(path, wal)) {
      fill(db);
    }
    int threads = 6;
    int each = 200;
    ExecutorService pool = Executors.newFixedThreadPool(threads);
    try {
      List<Future<Long>> done = new ArrayList<>();
      for (int t = 0; t < threads; t++) {
        final int me = t;
        done.add(
            pool.submit(
                () -> {
                  long read = 0;
                  try (Connection db = SqliteBpe.connect(path, wal);
                      PreparedStatement ins = db.prepareStatement("INSERT INTO t(id, n) VALUES (?, ?)");
                      PreparedStatement get = db.prepareStatement("SELECT n FROM t WHERE id = ?")) {
                    for (int i = 0; i < each; i++) {
                      int id = 100_000 + me * each + i;
                      ins.setInt(1, id);
                      ins.setString(2, "w" + id);
                      ins.executeUpdate();
                      get.setInt(1, id);
                      try (ResultSet rs = get.executeQuery()) {
                        assertTrue(rs.next(), "row " + id + " written, not read back");
                        assertEquals("w" + id, rs.getString(1));
                      }
                      get.setInt(1, 1 + (me * each + i) % ROWS);
                      try (ResultSet rs = get.executeQuery()) {
                        assertTrue(rs.next());
                        read += rs.getString(1).length();
                      }
                    }
                  }
                  return read;
                }));
      }
      for (Future<Long> f : done) {
        assertEquals(each * 500L, f.get());
      }
    } finally {
      pool.shutdown();
    }
    try (Connection db = SqliteBpe.connect(path)) {
      assertEquals(ROWS + threads * each, scalar(db, "SELECT count(*) FROM t"));
      assertEquals("ok", text(db, "PRAGMA integrity_check"));
    }
  }

  @Test
  void theCountersShowL1Hits() throws Exception {
    try (Connection db = SqliteBpe.connect(dir.resolve("hits.db").toString())) {
      fill(db);
      scalar(db, "SELECT sum(length(n)) FROM t");
      Map<String, Long> before = SqliteBpe.counters(db);
      for (int i = 0; i < 3; i++) {
        // SQLite's own cache is emptied between statements only across connections: a second
        // connection's reads are lookups in the buffer pool.
        try (Connection other = SqliteBpe.connect(dir.resolve("hits.db").toString())) {
          assertEquals(ROWS * 500L, scalar(other, "SELECT sum(length(n)) FROM t"));
        }
      }
      Map<String, Long> after = SqliteBpe.counters(db);
      long hits = after.get("Buffer cache hit ratio") - before.get("Buffer cache hit ratio");
      long lookups = after.get("Buffer cache hit ratio base") - before.get("Buffer cache hit ratio base");
      assertTrue(hits > 3 * 150, "L1 hits " + hits + " of " + lookups + " lookups");
      assertTrue(hits <= lookups, hits + " > " + lookups);
    }
  }

  @Test
  void aBadOperatorStatementIsAnSqlErrorWithSqlServersNumber() throws Exception {
    try (Connection db = SqliteBpe.connect(dir.resolve("op.db").toString())) {
      SQLException e = assertThrows(SQLException.class, () -> SqliteBpe.exec(db, "EXEC sp_configure 'no such option', 1"));
      assertTrue(e.getMessage().contains("15123"), e.getMessage());
    }
  }

  @Test
  void aWrongLibraryPathIsAnErrorNamingIt() throws Exception {
    try (Connection db = DriverManager.getConnection("jdbc:sqlite::memory:")) {
      SQLException missing =
          assertThrows(SQLException.class, () -> SqliteBpe.load(db, "/nonexistent/libsqlite_bpe.so"));
      assertTrue(
          missing.getMessage().contains("does not exist: /nonexistent/libsqlite_bpe.so"),
          missing.getMessage());

      Path notALibrary = Files.writeString(dir.resolve("libnot.so"), "not a shared object");
      SQLException refused = assertThrows(SQLException.class, () -> SqliteBpe.load(db, notALibrary.toString()));
      assertTrue(
          refused.getMessage().startsWith("sqlite-bpe: loading " + notALibrary + ": "),
          refused.getMessage());

      String saved = System.getProperty(SqliteBpe.LIBRARY_PROPERTY);
      System.setProperty(SqliteBpe.LIBRARY_PROPERTY, "/nonexistent/prop.so");
      try {
        SQLException prop = assertThrows(SQLException.class, () -> SqliteBpe.load(db));
        assertTrue(
            prop.getMessage().contains("sqlite.bpe.library names a file that does not exist: /nonexistent/prop.so"),
            prop.getMessage());
      } finally {
        if (saved == null) {
          System.clearProperty(SqliteBpe.LIBRARY_PROPERTY);
        } else {
          System.setProperty(SqliteBpe.LIBRARY_PROPERTY, saved);
        }
      }
      // The connection is still usable, with extension loading off again.
      try (Statement st = db.createStatement()) {
        st.execute("CREATE TABLE ok(x)");
      }
    }
  }

  @Test
  void theUrlEscapesWhatAUriGivesAMeaningTo() {
    assertEquals("jdbc:sqlite:file:///tmp/a%3Fb%23c%25d.db?vfs=bpe", SqliteBpe.url("/tmp/a?b#c%d.db"));
    assertEquals("jdbc:sqlite:file:rel/a.db?vfs=bpe", SqliteBpe.url("rel/a.db"));
  }
}
