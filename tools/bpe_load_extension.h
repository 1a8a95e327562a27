/*
** bpe_load_extension.h: the loading of sqlite-bpe's extension that the SQLITE_EXTRA_INIT hooks
** compiled into SQLite's own programs share (tools/sqlite-suite/bpe_suite_init.c,
** tools/speedtest1/bpe_speedtest_init.c). Include it after sqlite3.h.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
** Loads the loadable extension zLib (target/release/libsqlite_bpe.so) through a throw-away
** :memory: connection, which registers the `bpe` VFS; the extension asks never to be unloaded,
** so its VFS outlives that connection. The extension also registers an auto-extension adding
** its SQL functions and virtual tables to every new connection: it is removed again unless the
** environment variable zKeepEnv is 1. If the library cannot be loaded, says so on stderr
** (after zWho) and exits with status 3: a run that silently fell back to the unix VFS would
** compare unix with itself.
*/
static void bpe_load_extension(const char *zWho, const char *zLib, const char *zKeepEnv){
  sqlite3 *db = 0;
  char *zErr = 0;
  const char *zKeep;
  int rc = sqlite3_open_v2(":memory:", &db, SQLITE_OPEN_READWRITE|SQLITE_OPEN_CREATE, 0);
  if( rc==SQLITE_OK ) rc = sqlite3_enable_load_extension(db, 1);
  if( rc==SQLITE_OK ) rc = sqlite3_load_extension(db, zLib, "sqlite3_sqlitebpe_init", &zErr);
  if( rc!=SQLITE_OK ){
    fprintf(stderr, "%s: cannot load %s: %s\n", zWho, zLib,
            zErr ? zErr : (db ? sqlite3_errmsg(db) : "cannot open :memory:"));
    sqlite3_free(zErr);
    sqlite3_close(db);
    exit(3);
  }
  sqlite3_close(db);
  zKeep = getenv(zKeepEnv);
  if( zKeep==0 || strcmp(zKeep, "1")!=0 ) sqlite3_reset_auto_extension();
}
