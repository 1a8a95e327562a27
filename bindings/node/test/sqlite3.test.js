'use strict';
// node-sqlite3 opens 'file:...?vfs=bpe' with OPEN_URI once the extension is loaded.
const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const sqlite3 = require('sqlite3');
const bpe = require('..');

const ROWS = 2000;
const call = (db, method, sql, params = []) =>
  new Promise((resolve, reject) => db[method](sql, params, (err, v) => (err ? reject(err) : resolve(v))));

test('node-sqlite3 reads through the pool with a vfs=bpe URI', async () => {
  const boot = new sqlite3.Database(':memory:');
  await bpe.load(boot);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'bpe-node-'));
  const uri = `file:${path.join(dir, 'a.db')}?vfs=bpe`;
  const db = await new Promise((resolve, reject) => {
    const d = new sqlite3.Database(uri, sqlite3.OPEN_READWRITE | sqlite3.OPEN_CREATE | sqlite3.OPEN_URI, (err) =>
      err ? reject(err) : resolve(d)
    );
  });
  await call(db, 'run', 'CREATE TABLE t(id INTEGER PRIMARY KEY, n TEXT)');
  await call(
    db,
    'run',
    `WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < ${ROWS}) INSERT INTO t SELECT i, printf('%.500c', 'A') FROM c`
  );
  const row = await call(db, 'get', 'SELECT sum(length(n)) AS s FROM t');
  assert.strictEqual(row.s, ROWS * 500);
  const cached = await call(db, 'get', 'SELECT count(*) AS c FROM bpe_buffer_descriptors');
  assert.ok(cached.c > 0, JSON.stringify(cached));
  await new Promise((r) => db.close(r));
  await new Promise((r) => boot.close(r));
});

test('SQLITE_BPE_LIBRARY naming a missing file is an error that names it', () => {
  const saved = process.env.SQLITE_BPE_LIBRARY;
  process.env.SQLITE_BPE_LIBRARY = '/nonexistent/libsqlite_bpe.so';
  try {
    assert.throws(() => bpe.load(new sqlite3.Database(':memory:')), /SQLITE_BPE_LIBRARY.*\/nonexistent\/libsqlite_bpe\.so/);
  } finally {
    if (saved === undefined) delete process.env.SQLITE_BPE_LIBRARY;
    else process.env.SQLITE_BPE_LIBRARY = saved;
  }
});
