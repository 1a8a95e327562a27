#!/usr/bin/env bash
# Replays the README's two set-up commands as a newcomer runs them: literally, in a fresh clone
# of this checkout's HEAD, with CARGO_TARGET_DIR set to a directory of its own (a common setting
# that once broke the tests' lookup of the library). The commands are read from the
# README's first fenced code block, which must hold exactly the two of them.
#
#   tools/readme-replay.sh          the demo command in full; the test command literally with
#                                   `--no-run` (every test target builds), then literally with
#                                   `--test shell` (the tests that load the library into the stock
#                                   sqlite3 shell, and the CLI shell's)
#   tools/readme-replay.sh --full   both commands exactly as written, the whole test suite
#
# Why not the whole suite by default: CI runs the README's test command in full already, in the
# checkout (.ci/run). What the replay adds is the fresh clone (no target/ left over from earlier
# builds, such as a library at target/release that hides a wrong lookup) and CARGO_TARGET_DIR;
# building every test target and running the ones that find and load the library under the
# fresh target directory covers that, for a few minutes of tests instead of the suite twice.
# Only arguments are added to the test command; the command itself is the README's, unchanged.
#
# Then, in the same clone and target directory, what a newcomer does next: the README's `sh`
# block (the stock sqlite3 shell, finding the library where cargo put it), and the Node and Go
# packages' lookup of the library (Node's loader tests and the path it finds; Go's tests that
# load the library, with SQLITE_BPE_LIBRARY unset). Each is skipped, with a line saying so,
# when its tool (sqlite3, node, go) is not installed.
#
# SEED_TARGET=DIR starts the fresh target directory with the registry crates another target
# directory built (CI passes the checkout's, which `cargo build --release` and the test command
# filled): hard links (copies across file systems) of their compiled files, build-script outputs
# and fingerprints, in both profiles. Nothing of the workspace's own crates is taken (no library,
# no binary, no fingerprint: a package with a cdylib has files without a hash in their names), so
# the replay still builds every crate of the clone and every file the README's commands produce;
# it only skips compiling the same registry crates a second time.
#
# KEEP=1 leaves the clone and the target directory (their path is printed).
set -euo pipefail
full=0
case "${1:-}" in
  "") ;;
  --full) full=1 ;;
  *)
    echo "usage: $0 [--full]" >&2
    exit 2
    ;;
esac

checkout="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/readme-replay.XXXXXX")"
if [[ "${KEEP:-0}" == 1 ]]; then
  echo "readme-replay: keeping $work"
else
  trap 'rm -rf "$work"' EXIT
fi

# The README's first fenced block: exactly two commands, both cargo's.
commands=()
while IFS= read -r line; do
  [[ -n "${line// /}" ]] && commands+=("$line")
done < <(awk '/^```/ { n++; next } n == 1 { print } n >= 2 { exit }' "$checkout/README.md")
if ((${#commands[@]} != 2)) || [[ "${commands[0]}" != cargo\ * || "${commands[1]}" != cargo\ * ]]; then
  echo "readme-replay: README.md's first code block is not two cargo commands:" >&2
  printf '  %s\n' "${commands[@]}" >&2
  exit 1
fi
demo="${commands[0]}"
tests="${commands[1]}"

git clone --quiet "$checkout" "$work/clone"
export CARGO_TARGET_DIR="$work/target"
if [[ -n "${SEED_TARGET:-}" ]]; then
  # The workspace's names as cargo names their files (both spellings): packages, libraries and
  # binaries everywhere (.fingerprint/ and build/ are named by package); every target in deps/,
  # where test programs keep the same hashed names in a clone of the same workspace.
  names() {
    cargo metadata --manifest-path "$checkout/Cargo.toml" --format-version 1 --no-deps |
      python3 -c 'import json, sys
every = sys.argv[1] == "all"
names = set()
for p in json.load(sys.stdin)["packages"]:
    names.add(p["name"])
    names.update(t["name"] for t in p["targets"]
                 if every or set(t["kind"]) & {"lib", "rlib", "cdylib", "bin"})
for n in sorted(names):
    print(n)
    print(n.replace("-", "_"))' "$1"
  }
  mapfile -t own < <(names libs)
  mapfile -t own_targets < <(names all)
  seeded=0
  for profile in debug release; do
    for sub in deps build .fingerprint; do
      from="$SEED_TARGET/$profile/$sub"
      [[ -d "$from" ]] || continue
      mkdir -p "$CARGO_TARGET_DIR/$profile/$sub"
      skip=("${own[@]}")
      [[ $sub == deps ]] && skip=("${own_targets[@]}")
      for f in "$from"/*; do
        base="${f##*/}"
        for name in "${own[@]}"; do
          [[ "$base" == "lib$name"-* || "$base" == "lib$name".* ]] && continue 2
        done
        for name in "${skip[@]}"; do
          [[ "$base" == "$name"-* || "$base" == "$name".* ]] && continue 2
        done
        cp -al "$f" "$CARGO_TARGET_DIR/$profile/$sub/" 2>/dev/null || cp -a "$f" "$CARGO_TARGET_DIR/$profile/$sub/"
        seeded=$((seeded + 1))
      done
    done
  done
  echo "readme-replay: seeded $CARGO_TARGET_DIR with $seeded entries of $SEED_TARGET (registry crates only)"
fi
cd "$work/clone"
echo "readme-replay: fresh clone of $(git rev-parse --short HEAD), CARGO_TARGET_DIR=$CARGO_TARGET_DIR"

run() {
  echo "readme-replay: \$ $*"
  bash -euo pipefail -c "$*"
}

run "$demo"
if ((full)); then
  run "$tests"
else
  run "$tests --no-run"
  run "$tests --test shell"
fi

# The README says the test command also builds the loadable extension (in the target directory).
if [[ ! -f "$CARGO_TARGET_DIR/release/libsqlite_bpe.so" ]]; then
  echo "readme-replay: the test command built no $CARGO_TARGET_DIR/release/libsqlite_bpe.so" >&2
  exit 1
fi

# The README's stock-shell example, as written (its first ```sh block), in the clone.
shell_block="$(awk '/^```sh$/ { on = 1; next } on && /^```/ { exit } on { print }' README.md)"
if [[ -z "$shell_block" ]]; then
  echo "readme-replay: README.md has no \`\`\`sh block (the stock sqlite3 shell's example)" >&2
  exit 1
fi
if command -v sqlite3 >/dev/null; then
  printf '%s\n' "$shell_block" >"$work/readme-shell.sh"
  had_ext=0
  [[ -e /var/tmp/app.bpe ]] && had_ext=1
  echo "readme-replay: the README's sqlite3 example"
  out="$(bash -euo pipefail "$work/readme-shell.sh" 2>&1)" || {
    echo "$out" >&2
    echo "readme-replay: the README's sqlite3 example failed" >&2
    exit 1
  }
  echo "$out" | sed 's/^/  /'
  rm -f app.db
  ((had_ext)) || rm -f /var/tmp/app.bpe
  if grep -qi 'error' <<<"$out"; then
    echo "readme-replay: the README's sqlite3 example printed an error" >&2
    exit 1
  fi
else
  echo "readme-replay: no sqlite3: the README's shell example is skipped"
fi

# Node and Go find the library the test command built, under CARGO_TARGET_DIR.
want="$CARGO_TARGET_DIR/release/libsqlite_bpe.so"
unset SQLITE_BPE_LIBRARY
if command -v node >/dev/null; then
  run "node --test bindings/node/test/loadable_path.test.js"
  found="$(node -e 'console.log(require("./bindings/node").getLoadablePath())')"
  if [[ "$found" != "$want" ]]; then
    echo "readme-replay: Node's loader found $found, not $want" >&2
    exit 1
  fi
  echo "readme-replay: Node finds $found"
else
  echo "readme-replay: no node: the Node package's lookup is skipped"
fi
if command -v go >/dev/null; then
  run "cd bindings/go && go test -count=1 -run 'TestDSNWithVfsBpeOpensWithoutABootConnection|TestLoadablePathFollowsCargoTargetDir' ."
else
  echo "readme-replay: no go: the Go package's lookup is skipped"
fi
echo "readme-replay: both README commands, its sqlite3 example and the Node and Go lookups ran from a fresh clone"
