#!/usr/bin/env bash
# bpe under Litestream's read-replica VFS on object storage: a real S3 server on 127.0.0.1
# (SeaweedFS, tools/s3-server.sh: built once per machine into the cache, about 6 minutes), the
# writer's `litestream replicate` writing to it, the readers reading through a proxy that adds a
# latency to each GET (main.go's -s3-delay). What CI runs:
#   1. the stale-row oracle (short rounds) with an S3 replica, 5 ms per GET;
#   2. the quick hit-ratio measurement: bpe's share of pages served from its pool with no writes
#      and with one write a second, 20 ms per GET.
#
#   tests/replicated/litestream-vfs/s3.sh                  both, as CI runs them
#   tests/replicated/litestream-vfs/s3.sh -- ARGS...       run.sh ARGS... once against the server,
#                                                          with -replica s3://… added
#   e.g. s3.sh -- -mode bench-all -rows 60000 -queries 1000 -s3-delay 20ms -work DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$here/../../.." && pwd)

if [[ ${1:-} == --inside ]]; then
  shift
  # A path of its own for each run, so that no run reads another's replica.
  replica() { echo "s3://$S3_BUCKET/$1-$$?endpoint=$S3_ENDPOINT"; }
  if [[ ${1:-} == -- ]]; then
    shift
    exec "$here/run.sh" -replica "$(replica run)" "$@"
  fi
  # A small table: each read sums every row, a GET per page a new snapshot has not cached yet.
  "$here/run.sh" -replica "$(replica oracle)" -s3-delay 5ms -rows 400 -updates 10 -rounds 150
  "$here/run.sh" -mode hitratio -replica "$(replica hitratio)" -s3-delay 20ms -quick
  exit 0
fi
if (($# == 0)); then
  # The proxy's GET classes and the -replica checks, before any server.
  (cd "$here" && SQLITE_BPE_LIBRARY=${BPE_LIB:-} go test -tags vfs -count=1 .)
fi
exec "$ROOT/tools/s3-server.sh" -- "$0" --inside "$@"
