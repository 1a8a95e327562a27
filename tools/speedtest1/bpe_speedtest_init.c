/*
** bpe_speedtest_init.c: compiled into SQLite's speedtest1 with
**
**     -DSQLITE_EXTRA_INIT=bpe_speedtest_init
**
** When the environment variable BPE_SPEEDTEST_LIB names sqlite-bpe's loadable extension
** (target/release/libsqlite_bpe.so), the first sqlite3_initialize() loads it through a throw-away
** :memory: connection, which registers the `bpe` VFS (not as the default: speedtest1 is then run
** with `--vfs bpe`, and its clock stays the unix VFS's). The extension reads its settings
** (BPE_MAX_SERVER_MEMORY_MB, BPE_EXTENSION_FILE, ...) from the environment as it loads.
** Without BPE_SPEEDTEST_LIB this does nothing: the same binary is stock SQLite.
**
** The extension's SQL functions and virtual tables are removed again (speedtest1 measures SQL,
** not the extension's surface) unless BPE_SPEEDTEST_KEEP_FUNCS=1. If the library cannot be
** loaded, or registers no `bpe` VFS, the process says so on stderr and exits with status 3.
*/
#include "sqlite3.h"
#include "../bpe_load_extension.h"

int bpe_speedtest_init(const char *zArg){
  static int done = 0;
  const char *zLib;
  (void)zArg;
  if( done ) return SQLITE_OK;
  done = 1;
  zLib = getenv("BPE_SPEEDTEST_LIB");
  if( zLib==0 || zLib[0]==0 ) return SQLITE_OK;
  bpe_load_extension("bpe_speedtest_init", zLib, "BPE_SPEEDTEST_KEEP_FUNCS");
  if( sqlite3_vfs_find("bpe")==0 ){
    fprintf(stderr, "bpe_speedtest_init: %s loaded but registered no `bpe` VFS\n", zLib);
    exit(3);
  }
  return SQLITE_OK;
}
