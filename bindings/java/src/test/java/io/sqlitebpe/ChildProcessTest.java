package io.sqlitebpe;

import static io.sqlitebpe.Rows.ROWS;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.jar.JarEntry;
import java.util.jar.JarOutputStream;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * What depends on the process: the VFS before any load, the memory setting and the extension
 * file, the environment (BPE_DEFAULT_VFS, SQLITE_BPE_LIBRARY). Each runs {@link Child} in a JVM of
 * its own, with the BPE_* variables of this one removed (and those set to "" in {@code env}).
 */
class ChildProcessTest {
  @TempDir Path dir;

  private Map<String, String> run(String scenario, Map<String, String> env)
      throws IOException, InterruptedException {
    return run(scenario, env, System.getProperty("java.class.path"));
  }

  private Map<String, String> run(String scenario, Map<String, String> env, String classPath, String... jvmArgs)
      throws IOException, InterruptedException {
    List<String> command = new ArrayList<>();
    command.add(Paths.get(System.getProperty("java.home"), "bin", "java").toString());
    command.addAll(Arrays.asList(jvmArgs));
    command.addAll(List.of("-cp", classPath, Child.class.getName(), scenario, dir.toString()));
    ProcessBuilder pb = new ProcessBuilder(command);
    pb.environment().keySet().removeIf(k -> k.startsWith("BPE_"));
    pb.environment().putAll(env);
    pb.environment().values().removeIf(String::isEmpty);
    pb.redirectErrorStream(true);
    Path log = dir.resolve(scenario + ".out");
    pb.redirectOutput(log.toFile());
    Process p = pb.start();
    assertTrue(p.waitFor(120, TimeUnit.SECONDS), "the child did not finish");
    String out = Files.readString(log, StandardCharsets.UTF_8);
    assertEquals(0, p.exitValue(), out);
    Map<String, String> values = new HashMap<>();
    for (String line : out.split("\n")) {
      int eq = line.indexOf('=');
      if (eq > 0) {
        values.merge(line.substring(0, eq), line.substring(eq + 1), (a, b) -> a + "\n" + b);
      }
    }
    values.put("", out);
    return values;
  }

  @Test
  void vfsBpeIsMissingUntilTheExtensionLoadsAndConnectLoadsIt() throws Exception {
    Map<String, String> r = run("no-load", Map.of());
    assertTrue(r.get("raw").contains("no such vfs: bpe"), r.get(""));
    assertEquals(String.valueOf(ROWS * 500), r.get("sum"), r.get(""));
    assertTrue(Long.parseLong(r.get("cached")) > 0, r.get(""));
  }

  @Test
  void anExtensionFileEnabledOnlineHoldsTheTablesPages() throws Exception {
    Map<String, String> r = run("extension", Map.of());
    String out = r.get("");
    assertEquals("4000000\n4000000", r.get("sum"), out);
    assertEquals("BUFFER POOL EXTENSION ENABLED", r.get("state"), out);
    assertTrue(Long.parseLong(r.get("ext_reads")) > 500, out);
    assertTrue(Long.parseLong(r.get("in_ext")) > 500, out);
    assertEquals("ok", r.get("check"), out);
    assertFalse(Files.exists(dir.resolve("app.bpe")), "OFF left the extension file");
  }

  @Test
  void bpeDefaultVfsServesPlainFileNamesAndWithoutItTheyBypassThePool() throws Exception {
    Map<String, String> on = run("plain-name", Map.of("BPE_DEFAULT_VFS", "1"));
    assertEquals(String.valueOf(ROWS * 500), on.get("sum"), on.get(""));
    assertTrue(Long.parseLong(on.get("cached")) > 0, on.get(""));
    Files.delete(dir.resolve("plain.db"));
    Map<String, String> off = run("plain-name", Map.of());
    assertEquals(String.valueOf(ROWS * 500), off.get("sum"), off.get(""));
    assertEquals("0", off.get("cached"), off.get(""));
  }

  @Test
  void aBadBpeDefaultVfsFailsTheLoadNamingIt() throws Exception {
    Map<String, String> r = run("plain-name", Map.of("BPE_DEFAULT_VFS", "yes"));
    assertTrue(r.get("error").contains("BPE_DEFAULT_VFS"), r.get(""));
  }

  @Test
  void sqliteBpeLibraryNamingAMissingFileIsAnErrorNamingIt() throws Exception {
    Map<String, String> r = run("connect", Map.of("SQLITE_BPE_LIBRARY", "/nonexistent/libsqlite_bpe.so"));
    assertEquals(
        List.of("sqlite-bpe: SQLITE_BPE_LIBRARY names a file that does not exist: /nonexistent/libsqlite_bpe.so"),
        List.of(r.getOrDefault("error", r.get(""))));
  }

  /**
   * The jar as a user gets it (target/classes packed, the library inside): the library is
   * extracted to a temporary directory, loads, and the directory goes when the JVM exits.
   */
  @Test
  void theLibraryBundledInTheJarIsExtractedAndLoads() throws Exception {
    Path classes = Paths.get(SqliteBpe.class.getProtectionDomain().getCodeSource().getLocation().toURI());
    // (None when the tests were given SQLITE_BPE_LIBRARY and the dist directory had no library.)
    assumeTrue(Files.isRegularFile(classes.resolve("io/sqlitebpe/libsqlite_bpe.so")), "no library bundled in " + classes);
    Path jar = dir.resolve("sqlite-bpe.jar");
    try (JarOutputStream out = new JarOutputStream(Files.newOutputStream(jar));
        Stream<Path> files = Files.walk(classes)) {
      for (Path f : files.filter(Files::isRegularFile).collect(Collectors.toList())) {
        out.putNextEntry(new JarEntry(classes.relativize(f).toString().replace('\\', '/')));
        Files.copy(f, out);
        out.closeEntry();
      }
    }
    // Surefire's test class path with the jar in place of target/classes.
    String testPath = System.getProperty("surefire.test.class.path", System.getProperty("java.class.path"));
    List<String> entries = new ArrayList<>();
    entries.add(jar.toString());
    for (String e : testPath.split(java.io.File.pathSeparator)) {
      if (!e.isEmpty() && !Paths.get(e).toAbsolutePath().equals(classes.toAbsolutePath())) {
        entries.add(e);
      }
    }
    Path tmp = Files.createDirectory(dir.resolve("tmp"));
    Map<String, String> r =
        run("bundled", Map.of(SqliteBpe.LIBRARY_ENV, ""), String.join(java.io.File.pathSeparator, entries), "-Djava.io.tmpdir=" + tmp);
    assertTrue(r.get("library").startsWith(tmp.resolve("sqlite-bpe").toString()), r.get(""));
    assertEquals(String.valueOf(ROWS * 500), r.get("sum"), r.get(""));
    try (Stream<Path> left = Files.list(tmp)) {
      assertEquals(List.of(), left.collect(Collectors.toList()), "the extracted library was left behind");
    }
  }
}
