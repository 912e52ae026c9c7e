#!/usr/bin/env bash
# The project's checks, from a fresh machine: set-up, formatting, lints (host and guest), tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo fmt --all --check
(cd guest && cargo fmt --check)
cargo clippy --all-targets --release -- -D warnings
(cd guest && cargo clippy --release -- -D warnings)
cargo test --release
scripts/fuzz.sh smoke
