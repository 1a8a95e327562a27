#!/usr/bin/env bash
# The Java package with sqlite-jdbc: builds the extension's dist library (in CARGO_TARGET_DIR when
# set; skipped when SQLITE_BPE_LIBRARY names one), then `mvn test` with JUnit 5. Maven Central
# only, into ~/.m2; the library goes into the jar's resources from the dist directory.
set -euo pipefail
cd "$(dirname "$0")/../.."
libdir=""
if [[ -z "${SQLITE_BPE_LIBRARY:-}" ]]; then
  cargo build --profile dist -p sqlite-bpe
  target="$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
  libdir="$target/dist"
  [[ -f "$libdir/libsqlite_bpe.so" ]] || { echo "no $libdir/libsqlite_bpe.so after the build" >&2; exit 1; }
fi
cd bindings/java
rm -rf target/surefire-reports
# (Debian's Maven 3.8 prints colour resets even with -B and style.color=never: filtered out.)
mvn -B -q -Dstyle.color=never ${libdir:+"-Dsqlite.bpe.libdir=$libdir"} test 2>&1 | sed 's/\x1b\[0m//g'
# -q hides Surefire's summary: print one from its reports.
awk '/<testsuite / {
       for (i = 1; i <= NF; i++) if (match($i, /^(tests|failures|errors|skipped)="[0-9]+"/)) {
         split($i, kv, "\""); n[substr($i, 1, index($i, "=") - 1)] += kv[2]
       }
     }
     END { printf "java: %d passed, %d failed, %d skipped\n", n["tests"] - n["failures"] - n["errors"] - n["skipped"], n["failures"] + n["errors"], n["skipped"] }' \
  target/surefire-reports/TEST-*.xml
