/*
 * The adapter's only door to SQLite. Every call goes through the sqlite3_api_routines table of
 * whichever SQLite we serve: the host's when loaded as an extension (sqlite3 shell, Python, ...),
 * the bundled one when used as a Rust library. Only routines present since SQLite 3.8.7 are used,
 * so their offsets in the table are valid in any host we can load into.
 */
#include "sqlite3ext.h"
SQLITE_EXTENSION_INIT1

void bpe_shim_set_api(const sqlite3_api_routines *api) { sqlite3_api = api; }
int bpe_shim_has_api(void) { return sqlite3_api != 0; }

/*
 * Binds the shim to `api` unless it is bound to another table already (another SQLite library
 * of the same process loaded us first); returns the table it is bound to afterwards.
 */
const sqlite3_api_routines *bpe_shim_bind(const sqlite3_api_routines *api) {
  const sqlite3_api_routines *expected = 0;
  if (__atomic_compare_exchange_n(&sqlite3_api, &expected, api, 0, __ATOMIC_SEQ_CST,
                                  __ATOMIC_SEQ_CST))
    return api;
  return expected;
}

/* Through a routines table other than the bound one: its library's version, a function of it
 * (to find the file it lives in), and its allocator (for an error message it will free). */
const char *bpe_api_libversion(const sqlite3_api_routines *api) { return api->libversion(); }
void *bpe_api_function(const sqlite3_api_routines *api) { return (void *)api->libversion; }
void *bpe_api_malloc(const sqlite3_api_routines *api, int n) { return api->malloc(n); }

sqlite3_vfs *bpe_vfs_find(const char *name) { return sqlite3_vfs_find(name); }
int bpe_vfs_register(sqlite3_vfs *vfs, int make_default) { return sqlite3_vfs_register(vfs, make_default); }
int bpe_auto_extension(void (*entry)(void)) { return sqlite3_auto_extension(entry); }
void bpe_log(int code, const char *msg) { sqlite3_log(code, "%s", msg); }
void *bpe_malloc(int n) { return sqlite3_malloc(n); }
void bpe_free(void *p) { sqlite3_free(p); }
const char *bpe_uri_parameter(const char *name, const char *param) {
  return sqlite3_uri_parameter(name, param);
}
int bpe_uri_boolean(const char *name, const char *param, int dflt) {
  return sqlite3_uri_boolean(name, param, dflt);
}
int bpe_libversion_number(void) { return sqlite3_libversion_number(); }
sqlite3_mutex *bpe_mutex_alloc(int id) { return sqlite3_mutex_alloc(id); }
int bpe_mutex_try(sqlite3_mutex *m) { return sqlite3_mutex_try(m); }
void bpe_mutex_leave(sqlite3_mutex *m) { sqlite3_mutex_leave(m); }

int bpe_create_function(sqlite3 *db, const char *name, int nargs, int flags, void *app,
                        void (*fn)(sqlite3_context *, int, sqlite3_value **)) {
  return sqlite3_create_function_v2(db, name, nargs, SQLITE_UTF8 | flags, app, fn, 0, 0, 0);
}
int bpe_create_module(sqlite3 *db, const char *name, const sqlite3_module *m, void *aux) {
  return sqlite3_create_module_v2(db, name, m, aux, 0);
}
int bpe_declare_vtab(sqlite3 *db, const char *sql) { return sqlite3_declare_vtab(db, sql); }

void bpe_result_text(sqlite3_context *c, const char *s, int n) { sqlite3_result_text(c, s, n, SQLITE_TRANSIENT); }
void bpe_result_int64(sqlite3_context *c, sqlite3_int64 v) { sqlite3_result_int64(c, v); }
void bpe_result_null(sqlite3_context *c) { sqlite3_result_null(c); }
void bpe_result_error(sqlite3_context *c, const char *s, int n) { sqlite3_result_error(c, s, n); }
const unsigned char *bpe_value_text(sqlite3_value *v) { return sqlite3_value_text(v); }
int bpe_value_bytes(sqlite3_value *v) { return sqlite3_value_bytes(v); }
int bpe_value_type(sqlite3_value *v) { return sqlite3_value_type(v); }
sqlite3 *bpe_context_db_handle(sqlite3_context *c) { return sqlite3_context_db_handle(c); }
const char *bpe_db_filename(sqlite3 *db, const char *name) { return sqlite3_db_filename(db, name); }
sqlite3_int64 bpe_value_int64(sqlite3_value *v) { return sqlite3_value_int64(v); }
