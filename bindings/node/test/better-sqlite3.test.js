'use strict';
// better-sqlite3 cannot name a VFS: the default-VFS switch is how it reaches the buffer pool.
// Each case runs in a child process, since the default VFS is process-wide.
const test = require('node:test');
const assert = require('node:assert');
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const ROWS = 2000;
const script = (defaultVfs) => `
const Database = require(${JSON.stringify(require.resolve('better-sqlite3'))});
const bpe = require(${JSON.stringify(path.join(__dirname, '..'))});
bpe.load(new Database(':memory:'), { defaultVfs: ${defaultVfs} });
const db = new Database('plain.db');
db.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, n TEXT)");
db.exec("WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < ${ROWS}) INSERT INTO t SELECT i, printf('%.500c', 'A') FROM c");
const sum = db.prepare('SELECT sum(length(n)) AS s FROM t').get().s;
const cached = db.prepare('SELECT count(*) AS c FROM bpe_buffer_descriptors').get().c;
console.log(JSON.stringify({ sum, cached, left: process.env.BPE_DEFAULT_VFS ?? null }));
`;

function run(defaultVfs) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'bpe-node-'));
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('BPE_')));
  const out = execFileSync(process.execPath, ['-e', script(defaultVfs)], { cwd: dir, env });
  return JSON.parse(out.toString().trim().split('\n').pop());
}

test('with defaultVfs a plain file name is served by the buffer pool', () => {
  const r = run(true);
  assert.strictEqual(r.sum, ROWS * 500);
  assert.ok(r.cached > 0, JSON.stringify(r));
  assert.strictEqual(r.left, null);
});

test('without it better-sqlite3 stays on SQLite\'s own VFS', () => {
  const r = run(false);
  assert.strictEqual(r.sum, ROWS * 500);
  assert.strictEqual(r.cached, 0, JSON.stringify(r));
});
