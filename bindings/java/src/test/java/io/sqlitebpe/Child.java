package io.sqlitebpe;

import java.nio.file.Path;
import java.nio.file.Paths;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.SQLException;
import java.util.Map;

/**
 * The scenarios that need a JVM of their own (the extension, its memory setting and the default
 * VFS are process-wide): run by ChildProcessTest as {@code java io.sqlitebpe.Child SCENARIO DIR},
 * printing {@code key=value} lines.
 */
public final class Child {
  private Child() {}

  public static void main(String[] args) throws Exception {
    String scenario = args[0];
    Path dir = Paths.get(args[1]);
    switch (scenario) {
      case "no-load":
        noLoad(dir);
        break;
      case "extension":
        extension(dir);
        break;
      case "plain-name":
        plainName(dir);
        break;
      case "bundled":
        System.out.println("library=" + SqliteBpe.loadablePath());
        noLoad(dir);
        break;
      case "connect":
        try (Connection db = SqliteBpe.connect(dir.resolve("c.db").toString())) {
          System.out.println("opened=yes");
        } catch (SQLException e) {
          System.out.println("error=" + e.getMessage());
        }
        break;
      default:
        throw new IllegalArgumentException(scenario);
    }
  }

  /** A URL naming vfs=bpe before anything loaded the extension, then SqliteBpe.connect. */
  private static void noLoad(Path dir) throws SQLException {
    String path = dir.resolve("a.db").toString();
    try (Connection db = DriverManager.getConnection(SqliteBpe.url(path))) {
      System.out.println("raw=opened");
    } catch (SQLException e) {
      System.out.println("raw=" + e.getMessage());
    }
    try (Connection db = SqliteBpe.connect(path)) {
      Rows.fill(db);
      System.out.println("sum=" + Rows.scalar(db, "SELECT sum(length(n)) FROM t"));
      System.out.println("cached=" + Rows.scalar(db, "SELECT count(*) FROM bpe_buffer_descriptors"));
    }
  }

  /** An extension file enabled online, memory at 1 MB: the table's pages go to the extension. */
  private static void extension(Path dir) throws SQLException {
    try (Connection db = SqliteBpe.connect(dir.resolve("e.db").toString())) {
      Rows.fill(db, 4000, 1000);
      System.out.println("memory=" + SqliteBpe.exec(db, "EXEC sp_configure 'max server memory (MB)', 1"));
      String file = dir.resolve("app.bpe").toString().replace("'", "''");
      System.out.println(
          "on="
              + SqliteBpe.exec(
                  db,
                  "ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION ON (FILENAME = '"
                      + file
                      + "', SIZE = 64 MB)"));
      for (int i = 0; i < 2; i++) {
        System.out.println("sum=" + Rows.scalar(db, "SELECT sum(length(n)) FROM t"));
      }
      Map<String, Long> c = SqliteBpe.counters(db);
      System.out.println("ext_reads=" + c.get("Extension page reads/sec"));
      System.out.println(
          "in_ext="
              + Rows.scalar(
                  db, "SELECT count(*) FROM bpe_buffer_descriptors WHERE is_in_bpool_extension = 1"));
      System.out.println(
          "state=" + Rows.text(db, "SELECT state_description FROM bpe_extension_configuration"));
      System.out.println("check=" + Rows.text(db, "PRAGMA integrity_check"));
      System.out.println("off=" + SqliteBpe.exec(db, "ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION OFF"));
    }
  }

  /** A plain file name after a load: served by the pool only with BPE_DEFAULT_VFS=1. */
  private static void plainName(Path dir) throws SQLException {
    try (Connection boot = DriverManager.getConnection("jdbc:sqlite::memory:")) {
      SqliteBpe.load(boot);
    } catch (SQLException e) {
      System.out.println("error=" + e.getMessage());
      return;
    }
    try (Connection db = DriverManager.getConnection("jdbc:sqlite:" + dir.resolve("plain.db"))) {
      Rows.fill(db);
      System.out.println("sum=" + Rows.scalar(db, "SELECT sum(length(n)) FROM t"));
      System.out.println("cached=" + Rows.scalar(db, "SELECT count(*) FROM bpe_buffer_descriptors"));
    } catch (SQLException e) {
      System.out.println("error=" + e.getMessage());
    }
  }
}
