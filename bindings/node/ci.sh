#!/usr/bin/env bash
# The Node package with the two clients it serves: builds the extension's dist library, installs
# better-sqlite3 and sqlite3 without their install scripts (those download prebuilt binaries),
# builds both native modules from source against the installed Node's headers, runs node --test.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --profile dist -p sqlite-bpe
cd bindings/node
npm install --ignore-scripts --no-audit --no-fund --loglevel=error
nodedir="$(dirname "$(dirname "$(command -v node)")")"
for m in better-sqlite3 sqlite3; do
  log="$(pwd)/node_modules/.build-$m.log"
  (cd "node_modules/$m" && npx --yes node-gyp rebuild --release --nodedir="$nodedir" >"$log" 2>&1) ||
    { cat "$log"; exit 1; }
done
npm test
