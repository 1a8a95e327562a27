#!/usr/bin/env bash
# Builds a testfixture from the SQLite 3.50 amalgamation bundled by libsqlite3-sys (the SQLite
# the Rust side links) and the test harness C sources of the 3.40 tree (Debian's source
# package: there is no 3.50 source tree with test/ to be had from a package registry).
#
# The harness sources use SQLite's internals (sqliteInt.h, btreeInt.h, vdbeInt.h, ...), which
# must be 3.50's to match the library: they are cut back out of the amalgamation, which keeps
# each file between "Begin file X" / "End of X" markers (a header inlined inside another
# becomes an #include again). The harness files are copied into one directory with those
# headers on top, so that `#include "sqliteInt.h"` next to test1.c finds 3.50's.
#
# Called by run.sh with TREE (3.40 source tree), BUILD_40 (its configured build: sqlite_cfg.h),
# BUILD_50 (output directory) and INIT_C (bpe_suite_init.c).
set -euo pipefail
: "${TREE:?}" "${BUILD_40:?}" "${BUILD_50:?}" "${INIT_C:?}"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)

AMAL_DIR=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/libsqlite3-sys-0.35*/sqlite3 2>/dev/null \
  | sort -V | tail -1 || true)
if [ -z "$AMAL_DIR" ]; then
  ( cd "$REPO" && cargo fetch -q )
  AMAL_DIR=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/libsqlite3-sys-0.35*/sqlite3 | sort -V | tail -1)
fi
mkdir -p "$BUILD_50"
SRC="$BUILD_50/tsrc"
if [ -f "$BUILD_50/testfixture" ] && [ "$BUILD_50/testfixture" -nt "$INIT_C" ] \
    && [ "$BUILD_50/testfixture" -nt "$HERE/build350.sh" ] \
    && [ "$BUILD_50/testfixture" -nt "$HERE/../bpe_load_extension.h" ] \
    && [ "$BUILD_50/testfixture" -nt "$AMAL_DIR/sqlite3.c" ]; then
  exit 0
fi
rm -rf "$SRC"
mkdir -p "$SRC"

# The harness sources of the 3.40 Makefile (TESTSRC), less those whose code the 3.50
# amalgamation now carries itself (duplicate symbols) or that need 3.40-only internals.
TESTSRC=$(make -s -C "$BUILD_40" -f - print-testsrc <<'EOF' 2>/dev/null
include Makefile
print-testsrc:
	@echo $(TESTSRC) $(TOP)/src/tclsqlite.c
EOF
)
for f in $TESTSRC; do cp "$f" "$SRC/"; done
# Headers the harness sources include from their own directories.
for d in src ext/fts3 ext/fts5 ext/rtree ext/session ext/rbu ext/recover ext/expert ext/misc \
         ext/userauth ext/icu ext/async; do
  cp "$TREE/$d"/*.h "$SRC/" 2>/dev/null || true
done
cp "$BUILD_40/sqlite_cfg.h" "$SRC/"
# fts5's harness needs fts5Int.h and fts5parse.h, which 3.50's amalgamation keeps inside fts5.c.
rm -f "$SRC/fts5Int.h" "$SRC/fts5parse.h"

# 3.50's headers, out of the amalgamation, over the 3.40 ones.
python3 - "$AMAL_DIR/sqlite3.c" "$SRC" <<'EOF'
import re, sys, os
amal, out = sys.argv[1], sys.argv[2]
begin = re.compile(r'^/\*+ Begin file (\S+) \*+/$')
end = re.compile(r'^/\*+ End of (\S+) \*+/$')
cont = re.compile(r'^/\*+ Continuing where we left off in (\S+) \*+/$')
stack, files = [], {}
for line in open(amal, encoding='utf-8', errors='surrogateescape'):
    s = line.rstrip('\n')
    m = begin.match(s)
    if m:
        name = m.group(1)
        if stack and name.endswith('.h'):
            files[stack[-1]].append(f'#include "{name}"\n')
        stack.append(name)
        files.setdefault(name, [])
        continue
    m = end.match(s)
    if m:
        if stack: stack.pop()
        continue
    if cont.match(s):
        continue
    if stack:
        # The amalgamation comments out #includes of files it already inlined: restore them.
        m2 = re.match(r'^/\* (#\s*include\s+"[^"]+") \*/$', s)
        if m2:
            line = m2.group(1) + '\n'
        elif stack[-1].endswith('.h') and line.startswith('SQLITE_PRIVATE ') and '=' not in line:
            # The amalgamation made the headers' `extern` declarations SQLITE_PRIVATE (static
            # there; empty in a test build, which would define every variable in every file).
            line = 'extern ' + line[len('SQLITE_PRIVATE '):]
        files[stack[-1]].append(line)
n = 0
for name, body in files.items():
    if name.endswith('.h') and name not in ('sqlite3.h',):
        with open(os.path.join(out, name), 'w', encoding='utf-8', errors='surrogateescape') as f:
            # The extensions' public headers lost their own #include "sqlite3.h".
            if name in ('fts5.h', 'sqlite3rtree.h', 'sqlite3session.h', 'sqlite3rbu.h'):
                f.write('#include "sqlite3.h"\n')
            f.writelines(body)
        n += 1
print(f'{n} headers extracted', file=sys.stderr)
EOF
cp "$AMAL_DIR/sqlite3.h" "$AMAL_DIR/sqlite3ext.h" "$SRC/"
# What 3.50 moved or renamed since 3.40, for the 3.40 harness sources and the amalgamation's
# own SQLITE_TEST code: LONGDOUBLE_TYPE is plain `long double` now, and tclsqlite.h (3.44+)
# is not in the 3.40 tree.
cat >> "$SRC/sqliteInt.h" <<'EOF'
#ifndef LONGDOUBLE_TYPE
# define LONGDOUBLE_TYPE long double
#endif
EOF
cat > "$SRC/tclsqlite.h" <<'EOF'
#ifndef BPE_SUITE_TCLSQLITE_H
#define BPE_SUITE_TCLSQLITE_H
#include <tcl.h>
#ifndef Tcl_Size
# define Tcl_Size int
#endif
#include "sqlite3.h"
#endif
EOF
cp "$AMAL_DIR/sqlite3.c" "$BUILD_50/sqlite3.c"

FLAGS=(-g -O2 -DSQLITE_OS_UNIX=1 -I"$SRC" -D_HAVE_SQLITE_CONFIG_H -DBUILD_sqlite -DNDEBUG
  -I/usr/include/tcl8.6 -DSQLITE_THREADSAFE=1 -DSQLITE_ENABLE_MATH_FUNCTIONS
  -DSQLITE_ENABLE_FTS4 -DSQLITE_ENABLE_FTS5 -DSQLITE_ENABLE_GEOPOLY -DSQLITE_ENABLE_RTREE
  -DSQLITE_ENABLE_SESSION -DSQLITE_ENABLE_PREUPDATE_HOOK -DSQLITE_EXTRA_INIT=bpe_suite_init
  -DSQLITE_HAVE_ZLIB=1 -DSQLITE_NO_SYNC=1 -DSQLITE_TEMP_STORE=1 -DSQLITE_TEST=1
  -DSQLITE_CRASH_TEST=1 -DTCLSH_INIT_PROC=sqlite3TestInit -DSQLITE_SERVER=1 -DSQLITE_PRIVATE=
  -DSQLITE_CORE -DSQLITE_SERIES_CONSTRAINT_VERIFY=1 -DSQLITE_DEFAULT_PAGE_SIZE=1024
  -DSQLITE_ENABLE_STMTVTAB -DSQLITE_ENABLE_DBPAGE_VTAB -DSQLITE_ENABLE_BYTECODE_VTAB
  -DSQLITE_CKSUMVFS_STATIC)
# Harness files that do not build against 3.50's internals are left out (their Tcl commands
# are then missing, and the test files that use them fail in both modes alike).
SKIP=${BPE_SUITE_350_SKIP:-}
objs=()
mkdir -p "$BUILD_50/obj"
for f in "$SRC"/*.c "$BUILD_50/sqlite3.c" "$INIT_C"; do
  b=$(basename "$f" .c)
  case " $SKIP " in *" $b "*) continue ;; esac
  objs+=("$BUILD_50/obj/$b.o")
  echo "gcc ${FLAGS[*]} -c $f -o $BUILD_50/obj/$b.o"
done > "$BUILD_50/compile.cmds"
# Compile in parallel, then report every file that failed with its first errors.
rm -f "$BUILD_50"/obj/*.err
xargs -P "$(nproc)" -I{} bash -c '{} 2> "$(echo "{}" | sed "s/.* -o //").err" || echo "FAILED: $(echo "{}" | sed "s/.* -c //; s/ -o .*//")"' \
  < "$BUILD_50/compile.cmds" > "$BUILD_50/compile.log"
if grep -q FAILED "$BUILD_50/compile.log"; then
  cat "$BUILD_50/compile.log" >&2
  for e in "$BUILD_50"/obj/*.err; do
    grep -q error "$e" && { echo "== $e" >&2; grep error "$e" | head -5 >&2; }
  done
  exit 1
fi
gcc -o "$BUILD_50/testfixture" "${objs[@]}" -L/usr/lib/x86_64-linux-gnu -ltcl8.6 -lm -lz -ldl -lpthread
echo "built $BUILD_50/testfixture (SQLite $(grep -m1 '#define SQLITE_VERSION ' "$AMAL_DIR/sqlite3.h" | awk '{print $3}'))" >&2
