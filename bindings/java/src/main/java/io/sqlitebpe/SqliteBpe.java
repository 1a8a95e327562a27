package io.sqlitebpe;

import java.io.IOException;
import java.io.InputStream;
import java.net.URISyntaxException;
import java.net.URL;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Properties;
import org.sqlite.SQLiteConnection;

/**
 * sqlite-bpe for Java: loads the buffer pool extension into sqlite-jdbc connections and opens
 * databases on its {@code bpe} VFS.
 *
 * <pre>{@code
 * Connection db = SqliteBpe.connect("app.db");   // loads the extension once, opens file:app.db?vfs=bpe
 * SqliteBpe.exec(db, "EXEC sp_configure 'max server memory (MB)', 256");
 * }</pre>
 *
 * or, with a connection of your own (any URL: the first load in a process registers the VFS):
 *
 * <pre>{@code
 * SqliteBpe.load(DriverManager.getConnection("jdbc:sqlite::memory:"));
 * Connection db = DriverManager.getConnection("jdbc:sqlite:file:app.db?vfs=bpe");
 * }</pre>
 *
 * <p>The extension is process-wide: one buffer pool for every connection; each connection opened
 * after the first load has the SQL functions and tables ({@code bpe_exec}, {@code
 * bpe_performance_counters}, ...) without loading again. Java cannot set an environment variable
 * for its own process, so code that cannot name the VFS (a plain file name through an ORM) makes
 * {@code bpe} the default VFS by starting the JVM with {@code BPE_DEFAULT_VFS=1}.
 *
 * <p>The library is found at, in order: the path passed to {@link #load(Connection, String)}, the
 * system property {@value #LIBRARY_PROPERTY}, the environment variable {@value #LIBRARY_ENV}, the
 * library bundled in this jar (Linux x86-64, when the jar was built after {@code cargo build
 * --profile dist -p sqlite-bpe}).
 */
public final class SqliteBpe {
  /** The extension's entry point. */
  public static final String ENTRY_POINT = "sqlite3_sqlitebpe_init";
  /** The environment variable naming the loadable extension. */
  public static final String LIBRARY_ENV = "SQLITE_BPE_LIBRARY";
  /** The system property naming the loadable extension (before the environment variable). */
  public static final String LIBRARY_PROPERTY = "sqlite.bpe.library";
  /** The VFS the extension registers. */
  public static final String VFS = "bpe";

  private static final String BUNDLED = "libsqlite_bpe.so";
  private static Path extracted;
  private static boolean loaded;

  private SqliteBpe() {}

  /**
   * The loadable extension's path: the system property {@value #LIBRARY_PROPERTY}, else {@value
   * #LIBRARY_ENV} (either must name an existing file), else the library bundled in the jar.
   *
   * @throws SQLException when none of them gives a library, saying which file is missing
   */
  public static String loadablePath() throws SQLException {
    String fromProperty = System.getProperty(LIBRARY_PROPERTY);
    if (fromProperty != null && !fromProperty.isEmpty()) {
      return existing(fromProperty, "the system property " + LIBRARY_PROPERTY);
    }
    String fromEnv = System.getenv(LIBRARY_ENV);
    if (fromEnv != null && !fromEnv.isEmpty()) {
      return existing(fromEnv, LIBRARY_ENV);
    }
    Path bundled = bundled();
    if (bundled != null) {
      return bundled.toString();
    }
    throw new SQLException(
        "sqlite-bpe: the loadable extension is missing (none bundled in the jar, "
            + LIBRARY_ENV
            + " and -D"
            + LIBRARY_PROPERTY
            + " unset); build it with `cargo build --profile dist -p sqlite-bpe` before"
            + " `mvn package`, or set "
            + LIBRARY_ENV);
  }

  private static String existing(String path, String source) throws SQLException {
    if (!Files.isRegularFile(Paths.get(path))) {
      throw new SQLException(
          "sqlite-bpe: " + source + " names a file that does not exist: " + path);
    }
    return path;
  }

  /** The bundled library as a file: itself when the class path is a directory, else extracted. */
  private static synchronized Path bundled() throws SQLException {
    if (extracted != null) {
      return extracted;
    }
    URL url = SqliteBpe.class.getResource(BUNDLED);
    if (url == null) {
      return null;
    }
    try {
      if ("file".equals(url.getProtocol())) {
        extracted = Paths.get(url.toURI());
        return extracted;
      }
      Path dir = Files.createTempDirectory("sqlite-bpe");
      Path file = dir.resolve(BUNDLED);
      // The process keeps its mapping: both can go when the JVM exits (in the reverse order).
      dir.toFile().deleteOnExit();
      file.toFile().deleteOnExit();
      try (InputStream in = url.openStream()) {
        Files.copy(in, file, StandardCopyOption.REPLACE_EXISTING);
      }
      extracted = file;
      return extracted;
    } catch (IOException | URISyntaxException e) {
      throw new SQLException("sqlite-bpe: cannot extract the bundled library: " + e, e);
    }
  }

  /**
   * Loads sqlite-bpe into {@code conn} (a sqlite-jdbc connection), from {@link #loadablePath()}.
   *
   * @see #load(Connection, String)
   */
  public static void load(Connection conn) throws SQLException {
    load(conn, null);
  }

  /**
   * Loads sqlite-bpe into {@code conn} (a sqlite-jdbc connection) from {@code libraryPath} (null:
   * {@link #loadablePath()}). Extension loading is enabled on the connection for the load and
   * disabled again after it.
   *
   * <p>The first load in a process creates the buffer pool and registers the {@code bpe} VFS,
   * reading the {@code BPE_*} environment variables (max server memory, an extension file, {@code
   * BPE_DEFAULT_VFS}); later loads only add the SQL functions and tables to that connection, and a
   * connection opened after the first load has them already (then this returns at once).
   *
   * @throws SQLException when the library is missing or SQLite refuses it (the message says which
   *     file and why)
   */
  public static void load(Connection conn, String libraryPath) throws SQLException {
    String path =
        libraryPath == null
            ? loadablePath()
            : existing(libraryPath, "the path given to SqliteBpe.load");
    SQLiteConnection sqlite;
    try {
      sqlite = conn.unwrap(SQLiteConnection.class);
    } catch (SQLException e) {
      throw new SQLException(
          "sqlite-bpe: load() takes a sqlite-jdbc (org.xerial) connection, not "
              + conn.getClass().getName(),
          e);
    }
    if (hasFunctions(conn)) {
      // Opened after an earlier load: the extension's auto-extension already gave this connection
      // its functions, and load_extension() cannot replace them from inside a statement.
      synchronized (SqliteBpe.class) {
        loaded = true;
      }
      return;
    }
    sqlite.getDatabase().enable_load_extension(true);
    try (PreparedStatement st = conn.prepareStatement("SELECT load_extension(?, ?)")) {
      st.setString(1, path);
      st.setString(2, ENTRY_POINT);
      st.executeQuery().close();
    } catch (SQLException e) {
      throw new SQLException("sqlite-bpe: loading " + path + ": " + e.getMessage(), e);
    } finally {
      sqlite.getDatabase().enable_load_extension(false);
    }
    synchronized (SqliteBpe.class) {
      loaded = true;
    }
  }

  private static boolean hasFunctions(Connection conn) {
    try (Statement st = conn.createStatement();
        ResultSet rs =
            st.executeQuery("SELECT count(*) FROM pragma_function_list WHERE name = 'bpe_exec'")) {
      return rs.next() && rs.getLong(1) > 0;
    } catch (SQLException e) {
      return false; // a SQLite built without the introspection pragmas: load as usual
    }
  }

  /**
   * Loads the extension into the process once, through a throwaway in-memory connection, so that
   * URLs naming {@code vfs=bpe} open. {@link #connect} calls it; call it yourself before handing
   * {@link #url} to a connection pool.
   */
  public static synchronized void ensureLoaded() throws SQLException {
    if (loaded) {
      return;
    }
    try (Connection boot = DriverManager.getConnection("jdbc:sqlite::memory:")) {
      load(boot);
    }
  }

  /**
   * The JDBC URL of the database file at {@code path} on the bpe VFS: {@code
   * jdbc:sqlite:file:PATH?vfs=bpe} (sqlite-jdbc opens URIs by default), with {@code % ? #} in
   * the path escaped.
   */
  public static String url(String path) {
    // An absolute path gets an empty authority (file:///...), so that one starting with "//"
    // is not read as a host.
    StringBuilder b = new StringBuilder(path.startsWith("/") ? "jdbc:sqlite:file://" : "jdbc:sqlite:file:");
    for (char c : path.toCharArray()) {
      if (c == '%' || c == '?' || c == '#') {
        b.append(String.format("%%%02X", (int) c));
      } else {
        b.append(c);
      }
    }
    return b.append("?vfs=").append(VFS).toString();
  }

  /** Opens the database file at {@code path} on the bpe VFS, loading the extension first once. */
  public static Connection connect(String path) throws SQLException {
    return connect(path, new Properties());
  }

  /**
   * Opens the database file at {@code path} on the bpe VFS with sqlite-jdbc's {@code properties}
   * (pragmas such as {@code journal_mode}, {@code busy_timeout}), loading the extension first once.
   */
  public static Connection connect(String path, Properties properties) throws SQLException {
    ensureLoaded();
    return DriverManager.getConnection(url(path), properties);
  }

  /**
   * Runs SQL Server's operator statements ({@code ALTER SERVER CONFIGURATION SET BUFFER POOL
   * EXTENSION ON (FILENAME = '...', SIZE = 4 GB)}, {@code EXEC sp_configure 'max server memory
   * (MB)', 256}, {@code DBCC DROPCLEANBUFFERS}) through {@code bpe_exec}: returns its status line;
   * a rejected statement is an SQLException with SQL Server's message, and nothing changes.
   */
  public static String exec(Connection conn, String statements) throws SQLException {
    try (PreparedStatement st = conn.prepareStatement("SELECT bpe_exec(?)")) {
      st.setString(1, statements);
      try (ResultSet rs = st.executeQuery()) {
        rs.next();
        return rs.getString(1);
      }
    }
  }

  /**
   * The Buffer Manager counters ({@code bpe_performance_counters}) by name, in the table's order:
   * {@code "Buffer cache hit ratio"} (L1 hits) over {@code "Buffer cache hit ratio base"} (page
   * lookups), {@code "Extension page reads/sec"}, ... ("/sec" counters are cumulative counts).
   */
  public static Map<String, Long> counters(Connection conn) throws SQLException {
    Map<String, Long> out = new LinkedHashMap<>();
    try (Statement st = conn.createStatement();
        ResultSet rs =
            st.executeQuery("SELECT counter_name, cntr_value FROM bpe_performance_counters")) {
      while (rs.next()) {
        out.put(rs.getString(1), rs.getLong(2));
      }
    }
    return out;
  }
}
