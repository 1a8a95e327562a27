'use strict';
// sqlite-bpe for Node: load the extension into a better-sqlite3 or sqlite3 (node-sqlite3) database.
//
//   const Database = require('better-sqlite3');
//   const bpe = require('sqlite-bpe');
//   bpe.load(new Database(':memory:'), { defaultVfs: true }); // bpe becomes the default VFS
//   const db = new Database('app.db');                       // served by the buffer pool
//
// better-sqlite3 cannot pass a URI or a VFS name, so it needs defaultVfs. node-sqlite3 can open
// 'file:app.db?vfs=bpe' with sqlite3.OPEN_URI; its load() returns a Promise.

const fs = require('fs');
const path = require('path');

const ENTRY_POINT = 'sqlite3_sqlitebpe_init';

// The loadable extension: $SQLITE_BPE_LIBRARY (which must exist), else the library packed beside
// this file, else the workspace's dist build (cargo build --profile dist -p sqlite-bpe).
function getLoadablePath() {
  const chosen = process.env.SQLITE_BPE_LIBRARY;
  if (chosen) {
    if (!fs.existsSync(chosen)) {
      throw new Error(`sqlite-bpe: SQLITE_BPE_LIBRARY names a file that does not exist: ${chosen}`);
    }
    return chosen;
  }
  const candidates = [
    path.join(__dirname, 'libsqlite_bpe.so'),
    path.join(__dirname, '..', '..', 'target', 'dist', 'libsqlite_bpe.so'),
  ].filter(Boolean);
  const found = candidates.find((p) => fs.existsSync(p));
  if (!found) {
    throw new Error(
      `sqlite-bpe: the loadable extension is missing (looked in ${candidates.join(', ')}); ` +
        'build it with `cargo build --profile dist -p sqlite-bpe` or set SQLITE_BPE_LIBRARY'
    );
  }
  return found;
}

// Sets BPE_DEFAULT_VFS=1 while `fn` loads the extension, then puts the variable back.
function withDefaultVfs(on, fn) {
  if (!on) return fn(() => {});
  const had = Object.prototype.hasOwnProperty.call(process.env, 'BPE_DEFAULT_VFS');
  const previous = process.env.BPE_DEFAULT_VFS;
  process.env.BPE_DEFAULT_VFS = '1';
  const restore = () => {
    if (had) process.env.BPE_DEFAULT_VFS = previous;
    else delete process.env.BPE_DEFAULT_VFS;
  };
  return fn(restore);
}

// Loads sqlite-bpe into `db`. better-sqlite3: synchronous. node-sqlite3: returns a Promise.
// The first load in a process creates the buffer pool and registers the `bpe` VFS (reading the
// BPE_* environment variables); `defaultVfs: true` makes `bpe` the process's default VFS.
function load(db, { defaultVfs = false } = {}) {
  const file = getLoadablePath();
  const isNodeSqlite3 = typeof db.serialize === 'function' && typeof db.prepare === 'function' && typeof db.pragma !== 'function';
  if (isNodeSqlite3) {
    return withDefaultVfs(defaultVfs, (restore) =>
      new Promise((resolve, reject) => {
        db.loadExtension(file, (err) => {
          restore();
          if (err) reject(err);
          else resolve();
        });
      })
    );
  }
  if (typeof db.loadExtension !== 'function') {
    throw new TypeError('sqlite-bpe: load() takes a better-sqlite3 or sqlite3 Database');
  }
  withDefaultVfs(defaultVfs, (restore) => {
    try {
      db.loadExtension(file, ENTRY_POINT);
    } finally {
      restore();
    }
  });
  return undefined;
}

module.exports = { load, getLoadablePath, ENTRY_POINT };
