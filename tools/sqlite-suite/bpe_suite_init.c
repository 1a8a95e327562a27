/*
** bpe_suite_init.c: compiled into SQLite's testfixture with
**
**     -DSQLITE_EXTRA_INIT=bpe_suite_init
**
** so that, when the environment variable BPE_SUITE_LIB names sqlite-bpe's loadable extension
** (target/release/libsqlite_bpe.so), every sqlite3_initialize() leaves the `bpe` VFS registered
** as the process's default VFS. Without BPE_SUITE_LIB it does nothing, and the same testfixture
** gives the plain unix baseline.
**
** SQLITE_EXTRA_INIT runs at the end of every sqlite3_initialize() that actually initialized
** (the first one, and the first one after each sqlite3_shutdown()). The test suite shuts SQLite
** down and re-initializes it often (to change the allocator, the mutexes, ...), and each
** re-initialization runs sqlite3_os_init() again, which makes "unix" the default once more. So:
**
**   - the first call loads the extension (through a throw-away :memory: connection; the nested
**     sqlite3_initialize() that sqlite3_open() makes returns at once, as isInit is already set).
**     The extension asks never to be unloaded, so its VFS outlives that connection.
**   - every call (re)makes "bpe" the default VFS. That allocates nothing, so it cannot be
**     disturbed by the fault-injecting allocators the malloc tests install before initializing.
**
** The extension also registers an auto-extension adding its SQL functions and virtual tables to
** every new connection. For the suite we want the VFS only (the malloc and function-list tests
** would see the extra work on every open), so it is removed again, unless BPE_SUITE_KEEP_FUNCS=1.
** (sqlite3_shutdown() would drop it anyway at the first re-initialization.)
**
** BPE_SUITE_CHILDREN=plain removes BPE_SUITE_LIB from this process's environment once the
** extension is loaded, so that the testfixture processes a test spawns (the second client of
** lock_common.tcl's do_multiclient_test, crash children, ...) use the plain unix VFS: the bpe
** process then shares its database with plain SQLite processes, which exercises bpe's
** cross-process change detection instead of its one-bpe-process-per-file refusal.
**
** If the library cannot be loaded, the process says so on stderr and exits with status 3:
** a run that silently fell back to the unix VFS would be a false "pass".
*/
#include "sqlite3.h"
#include "../bpe_load_extension.h"

int bpe_suite_init(const char *zArg){
  static int loaded = 0;    /* the extension is in the process */
  static int loading = 0;   /* guard against re-entry while loading */
  const char *zLib;
  sqlite3_vfs *pBpe;
  (void)zArg;

  if( loading ) return SQLITE_OK;

  if( !loaded ){
    zLib = getenv("BPE_SUITE_LIB");
    if( zLib==0 || zLib[0]==0 ) return SQLITE_OK;
    loading = 1;
    bpe_load_extension("bpe_suite_init", zLib, "BPE_SUITE_KEEP_FUNCS");
    {
      const char *zChildren = getenv("BPE_SUITE_CHILDREN");
      if( zChildren && strcmp(zChildren, "plain")==0 ) unsetenv("BPE_SUITE_LIB");
    }
    loaded = 1;
    loading = 0;
  }

  pBpe = sqlite3_vfs_find("bpe");
  if( pBpe==0 ){
    /* A test unregistered it (vfs_unregister_all and friends): nothing to make default. */
    return SQLITE_OK;
  }
  if( sqlite3_vfs_find(0)!=pBpe ){
    return sqlite3_vfs_register(pBpe, 1);
  }
  return SQLITE_OK;
}
