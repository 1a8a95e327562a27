#!/usr/bin/env bash
# Prints the workspace's cargo target directory, where cargo puts its builds: $CARGO_TARGET_DIR,
# a cargo config's build.target-dir, or target/ (as `cargo metadata` resolves them).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo metadata --format-version 1 --no-deps | sed 's/.*"target_directory":"\([^"]*\)".*/\1/'
