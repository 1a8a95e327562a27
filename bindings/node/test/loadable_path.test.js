'use strict';
// Where getLoadablePath() finds the library: cargo's target directory as CARGO_TARGET_DIR names
// it, dist before release. Each case runs in a child process with its own environment.
const test = require('node:test');
const assert = require('node:assert');
const fs = require('fs');
const os = require('os');
const path = require('path');
const { execFileSync } = require('child_process');

const INDEX = path.join(__dirname, '..', 'index.js');

function lookup(env) {
  const clean = { ...process.env };
  delete clean.SQLITE_BPE_LIBRARY;
  delete clean.CARGO_TARGET_DIR;
  try {
    const out = execFileSync(process.execPath, ['-e', `console.log(require(${JSON.stringify(INDEX)}).getLoadablePath())`], {
      env: { ...clean, ...env },
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    return { path: out.trim() };
  } catch (e) {
    return { error: String(e.stderr) };
  }
}

function fakeTarget(...profiles) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sqlite-bpe-target-'));
  for (const p of profiles) {
    fs.mkdirSync(path.join(dir, p));
    fs.writeFileSync(path.join(dir, p, 'libsqlite_bpe.so'), '');
  }
  return dir;
}

test('CARGO_TARGET_DIR: the library is found where cargo put it', () => {
  const dir = fakeTarget('dist');
  assert.deepStrictEqual(lookup({ CARGO_TARGET_DIR: dir }), { path: path.join(dir, 'dist', 'libsqlite_bpe.so') });
});

test('CARGO_TARGET_DIR: a release build serves when there is no dist build', () => {
  const dir = fakeTarget('release');
  assert.deepStrictEqual(lookup({ CARGO_TARGET_DIR: dir }), { path: path.join(dir, 'release', 'libsqlite_bpe.so') });
});

test('CARGO_TARGET_DIR without a build: the error names the places looked in', () => {
  const dir = fakeTarget();
  const r = lookup({ CARGO_TARGET_DIR: dir });
  assert.ok(r.error, `expected an error, found ${r.path}`);
  assert.match(r.error, /the loadable extension is missing/);
  assert.ok(r.error.includes(path.join(dir, 'dist', 'libsqlite_bpe.so')), r.error);
});
