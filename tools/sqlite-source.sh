# Sourced by tools/sqlite-suite/run.sh and tools/speedtest1/run.sh (after they define log):
# packages from Debian's archives, and SQLite's source tree from Debian's sqlite3 source package.

# install_packages SRC_ROOT PACKAGE...: installs the packages not installed yet and, when
# SRC_ROOT is not empty and holds no source package yet while apt has no deb-src entries, adds
# deb-src entries (the same archives as the binary entries) for sqlite_source_tree.
install_packages() {
  local root=$1 p added=0 need=()
  shift
  for p in "$@"; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
  done
  if [ -n "$root" ] && [ -z "$(ls "$root"/*.dsc 2>/dev/null)" ] \
      && ! grep -rqs '^Types:.*deb-src\|^deb-src ' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    log "adding deb-src entries (/etc/apt/sources.list.d/bpe-sqlite-src.*)"
    if [ -f /etc/apt/sources.list.d/debian.sources ]; then
      sed -n 's/^Types: deb$/Types: deb-src/; /^#/d; p' /etc/apt/sources.list.d/debian.sources \
        > /etc/apt/sources.list.d/bpe-sqlite-src.sources
    else
      sed -n 's/^deb /deb-src /p' /etc/apt/sources.list > /etc/apt/sources.list.d/bpe-sqlite-src.list
    fi
    added=1
  fi
  if [ ${#need[@]} -gt 0 ] || [ "$added" = 1 ]; then
    log "apt-get update; installing: ${need[*]:-(nothing, sources only)}"
    apt-get update -q >/dev/null
    if [ ${#need[@]} -gt 0 ]; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null
    fi
  fi
}

# sqlite_source_tree SRC_ROOT: sets SQLITE_TREE to SQLite's source tree from Debian's sqlite3
# source package without Debian's patches (upstream as released), unpacked in SRC_ROOT once.
sqlite_source_tree() {
  local root=$1 dsc upstream
  SQLITE_TREE=$(ls -d "$root"/sqlite-src-* 2>/dev/null | head -1 || true)
  if [ -z "$SQLITE_TREE" ]; then
    log "fetching the sqlite3 source package"
    mkdir -p "$root"
    ( cd "$root" && apt-get source --download-only -q sqlite3 >/dev/null 2>&1 )
    dsc=$(ls "$root"/sqlite3_*.dsc | head -1)
    upstream=$(basename "$dsc" .dsc | sed 's/^sqlite3_//; s/-[^-]*$//')
    SQLITE_TREE="$root/sqlite-src-$upstream"
    ( cd "$root" && dpkg-source -x --skip-patches "$dsc" "$SQLITE_TREE" >/dev/null )
  fi
}
