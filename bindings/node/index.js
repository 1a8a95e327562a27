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

// The workspace this package sits in (bindings/node), when it is used from a checkout.
const WORKSPACE = path.join(__dirname, '..', '..');

// Cargo's target directory for the workspace: $CARGO_TARGET_DIR (relative to the workspace, where
// cargo is run), else `target/`, else what `cargo metadata` says (a `build.target-dir` in a cargo
// config). Returns the directories to look in, most likely first.
function targetDirs() {
  if (process.env.CARGO_TARGET_DIR) {
    return [path.resolve(WORKSPACE, process.env.CARGO_TARGET_DIR)];
  }
  const dirs = [path.join(WORKSPACE, 'target')];
  if (fs.existsSync(path.join(WORKSPACE, 'Cargo.toml'))) {
    try {
      const out = require('child_process').execFileSync(
        'cargo',
        ['metadata', '--format-version', '1', '--no-deps'],
        { cwd: WORKSPACE, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }
      );
      const dir = JSON.parse(out).target_directory;
      if (dir && !dirs.includes(dir)) dirs.push(dir);
    } catch (_) {
      // No cargo on PATH: the default target directory is all there is to look in.
    }
  }
  return dirs;
}

// The loadable extension: $SQLITE_BPE_LIBRARY (which must exist), else the library packed beside
// this file, else the workspace's build where cargo put it (`dist/` of
// `cargo build --profile dist -p sqlite-bpe`, else `release/` of `cargo build --release`).
function getLoadablePath() {
  const chosen = process.env.SQLITE_BPE_LIBRARY;
  if (chosen) {
    if (!fs.existsSync(chosen)) {
      throw new Error(`sqlite-bpe: SQLITE_BPE_LIBRARY names a file that does not exist: ${chosen}`);
    }
    return chosen;
  }
  const packed = path.join(__dirname, 'libsqlite_bpe.so');
  if (fs.existsSync(packed)) return packed;
  const candidates = [packed];
  for (const dir of targetDirs()) {
    for (const profile of ['dist', 'release']) {
      const p = path.join(dir, profile, 'libsqlite_bpe.so');
      if (fs.existsSync(p)) return p;
      candidates.push(p);
    }
  }
  throw new Error(
    `sqlite-bpe: the loadable extension is missing (looked in ${candidates.join(', ')}); ` +
      'build it with `cargo build --profile dist -p sqlite-bpe` in the checkout or set SQLITE_BPE_LIBRARY'
  );
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
