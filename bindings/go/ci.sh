#!/usr/bin/env bash
# The Go package: builds the extension's dist library (in CARGO_TARGET_DIR when set; skipped when
# SQLITE_BPE_LIBRARY names one), then `go test` (mattn/go-sqlite3 with cgo).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ -z "${SQLITE_BPE_LIBRARY:-}" ]]; then
  cargo build --profile dist -p sqlite-bpe
  target="$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
  export SQLITE_BPE_LIBRARY="$target/dist/libsqlite_bpe.so"
  [[ -f "$SQLITE_BPE_LIBRARY" ]] || { echo "no $SQLITE_BPE_LIBRARY after the build" >&2; exit 1; }
fi
cd bindings/go
go test -count=1 ./...
