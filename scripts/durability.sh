#!/usr/bin/env bash
# The durability part of scripts/reliability.sh alone (which records it in RELIABILITY.md):
# ROUNDS (default 50) rounds of each kill -9 test in crates/exitless/tests/durability.rs (the
# probe under `exitless run`, and a Linux TCG guest through `exitless vhost-user-blk`), then one
# summary line per test.
#   scripts/durability.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-50}"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
command=(cargo test --release -p exitless --test integration durability:: -- --test-threads 1 --nocapture)
echo "EXITLESS_DURABILITY_ROUNDS=$rounds ${command[*]}" >&2
start=$(date +%s)
if ! EXITLESS_DURABILITY_ROUNDS="$rounds" "${command[@]}" >"$log" 2>&1; then
    cat "$log" >&2
    echo "durability: FAILED (log above)" >&2
    exit 1
fi
grep -o 'durability .*lost ([^)]*)' "$log"
echo "durability: passed in $(( $(date +%s) - start )) s on $(nproc) CPUs, $(uname -r)"
