#!/usr/bin/env bash
# A real S3 server on 127.0.0.1 for the object-storage tests: SeaweedFS's `weed server -s3`
# (Apache-2.0), built once from the Go module proxy into a cache (about 6 minutes on 2 cores, a
# 233 MB binary), started in a temporary data directory on ports nobody listens on, with one
# bucket made. No credentials: weed without an identities file accepts any (the Litestream
# clients sign with dummy keys so that the AWS SDK never asks the EC2 metadata service).
#
#   tools/s3-server.sh --build-only        build weed into the cache if it is not there
#   tools/s3-server.sh -- COMMAND ARGS...  start the server, run COMMAND with S3_ENDPOINT
#                                          (http://127.0.0.1:PORT) and S3_BUCKET in its
#                                          environment, stop the server, exit with COMMAND's status
#   tools/s3-server.sh                     start it, print the endpoint, serve until interrupted
#
# Environment: S3_BUCKET (default bpe), WEED_VERSION (the seaweedfs module version), WEED (a weed
# binary to use instead of the cache's).
set -euo pipefail

WEED_VERSION=${WEED_VERSION:-v0.0.0-20261109003541-7506e5f91cd6}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/sqlite-bpe/weed/$WEED_VERSION
BUCKET=${S3_BUCKET:-bpe}

build_weed() {
  [[ -x $CACHE/weed ]] && return 0
  echo "s3-server: building weed $WEED_VERSION into $CACHE (once per machine, about 6 minutes)" >&2
  local src dir
  dir=$(GOFLAGS=-mod=mod go mod download -json "github.com/seaweedfs/seaweedfs@$WEED_VERSION" |
    /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  src=$(mktemp -d /tmp/bpe-weed-src.XXXXXX)
  cp -r "$dir/." "$src" && chmod -R u+w "$src"
  mkdir -p "$CACHE"
  # go install refuses the module (its go.mod has replace directives): build in its directory.
  (cd "$src" && GOFLAGS=-mod=mod nice go build -o "$CACHE/weed.tmp" ./weed)
  mv "$CACHE/weed.tmp" "$CACHE/weed"
  rm -rf "$src"
}

# A port nobody listens on, with its gRPC twin (weed's default: port + 10000) free too.
used_ports=" "
free_port() {
  local p i
  for ((i = 0; i < 200; i++)); do
    p=$((20000 + RANDOM % 25000))
    [[ $used_ports == *" $p "* || $used_ports == *" $((p + 10000)) "* ]] && continue
    if ! (echo >"/dev/tcp/127.0.0.1/$p") 2>/dev/null &&
      ! (echo >"/dev/tcp/127.0.0.1/$((p + 10000))") 2>/dev/null; then
      used_ports+="$p $((p + 10000)) "
      echo "$p"
      return 0
    fi
  done
  echo "s3-server: no free port found in 200 tries" >&2
  return 1
}

if [[ ${1:-} == --build-only ]]; then
  build_weed
  exit 0
fi
if [[ -n ${1:-} && $1 != -- ]]; then
  echo "s3-server: unknown argument '$1' (use --build-only, or -- COMMAND ARGS...)" >&2
  exit 2
fi
[[ ${1:-} == -- ]] && shift

WEED_BIN=${WEED:-}
if [[ -z $WEED_BIN ]]; then
  build_weed
  WEED_BIN=$CACHE/weed
fi

data=$(mktemp -d /tmp/bpe-s3-data.XXXXXX)
pid=""
stop_server() {
  if [[ -n $pid ]]; then
    kill "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  rm -rf "$data"
}
trap stop_server EXIT
trap 'exit 130' INT TERM

s3_port=$(free_port)
master_port=$(free_port)
volume_port=$(free_port)
filer_port=$(free_port)
# Nothing leaves the machine: no telemetry (on by default: it posts to telemetry.seaweedfs.com).
# No Iceberg or Lance listeners (on by default, on fixed ports). Small volumes (the default
# grows each to 30 GB). The log goes beside the data.
"$WEED_BIN" server -ip=127.0.0.1 -ip.bind=127.0.0.1 -dir="$data" -master.telemetry=false \
  -master.port="$master_port" -volume.port="$volume_port" -filer.port="$filer_port" \
  -s3 -s3.port="$s3_port" -s3.port.iceberg=0 -s3.port.lance=0 \
  -master.volumeSizeLimitMB=512 -volume.max=20 \
  >"$data/weed.log" 2>&1 &
pid=$!

endpoint=http://127.0.0.1:$s3_port
ready=""
for ((i = 0; i < 240; i++)); do # up to 120 s
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "s3-server: weed exited; its log:" >&2
    tail -30 "$data/weed.log" >&2
    exit 1
  fi
  # The bucket can be made once the filer and the S3 gateway are both up.
  if curl -sf -o /dev/null -X PUT "$endpoint/$BUCKET" 2>/dev/null &&
    curl -sf "$endpoint/" 2>/dev/null | grep -q "<Name>$BUCKET</Name>"; then
    ready=1
    break
  fi
  sleep 0.5
done
if [[ -z $ready ]]; then
  echo "s3-server: the S3 port $s3_port did not answer within 120 s; weed's log:" >&2
  tail -30 "$data/weed.log" >&2
  exit 1
fi
echo "s3-server: weed $WEED_VERSION serves $endpoint (bucket $BUCKET, data $data, up after $((i / 2)) s)" >&2

if (($# == 0)); then
  echo "$endpoint"
  wait "$pid"
  exit $?
fi
rc=0
S3_ENDPOINT=$endpoint S3_BUCKET=$BUCKET "$@" || rc=$?
exit $rc
