#!/usr/bin/env bash
# The Go package: builds the extension's dist library, then `go test` (mattn/go-sqlite3 with cgo).
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --profile dist -p sqlite-bpe
cd bindings/go
go test -count=1 ./...
