package io.sqlitebpe;

import java.sql.Connection;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;

/** The tests' table: ROWS rows of 500 bytes (ROWS * 500 in all). */
final class Rows {
  static final int ROWS = 2000;

  private Rows() {}

  static void fill(Connection db, int rows, int width) throws SQLException {
    try (Statement st = db.createStatement()) {
      st.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, n TEXT)");
      st.execute(
          "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < "
              + rows
              + ") INSERT INTO t SELECT i, printf('%."
              + width
              + "c', 'A') FROM c");
    }
  }

  static void fill(Connection db) throws SQLException {
    fill(db, ROWS, 500);
  }

  static long scalar(Connection db, String sql) throws SQLException {
    try (Statement st = db.createStatement();
        ResultSet rs = st.executeQuery(sql)) {
      if (!rs.next()) {
        throw new SQLException("no row: " + sql);
      }
      return rs.getLong(1);
    }
  }

  static String text(Connection db, String sql) throws SQLException {
    try (Statement st = db.createStatement();
        ResultSet rs = st.executeQuery(sql)) {
      if (!rs.next()) {
        throw new SQLException("no row: " + sql);
      }
      return rs.getString(1);
    }
  }
}
