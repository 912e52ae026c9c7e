#!/usr/bin/env bash
# Coverage-guided fuzzing of the parsers of untrusted input (guest, vhost-user frontend, snapshot
# file, migration stream, hand-over channel, in-flight region; fuzz/, cargo-fuzz with
# libFuzzer on the stable toolchain: no sanitizer, release build with debug assertions and
# overflow checks).
#
#   scripts/fuzz.sh [smoke] [TARGET...]  every target (or those named) for FUZZ_SMOKE_SECONDS
#                                        (default 25) from its committed seeds in
#                                        fuzz/corpus/TARGET; fails on any crash, hang (10 s) or
#                                        RSS above 2 GiB. For CI.
#   scripts/fuzz.sh long [TARGET...]     each target to FUZZ_LONG_RUNS
#                                        (default 10000000; -1: no limit) executions or
#                                        FUZZ_LONG_SECONDS (default 3600: one hour; 0: no
#                                        limit), whichever comes first, niced,
#                                        growing FUZZ_WORK_DIR/TARGET (default fuzz/corpus-work;
#                                        a relative path is taken from fuzz/); prints
#                                        executions, time, coverage, corpus, slowest input and
#                                        peak RSS per target as a Markdown table. With
#                                        FUZZ_RESUME=1 a target that already finished in
#                                        FUZZ_WORK_DIR with the same binary (sha256) and the same
#                                        limits is not run again; its row comes from its log.
#
# Both run FUZZ_JOBS targets at a time (default: one per CPU), each on a CPU of its own.
# A crash leaves its input in fuzz/artifacts/TARGET/; reproduce it with
#   fuzz/target/strict/x86_64-unknown-linux-gnu/release/TARGET fuzz/artifacts/TARGET/crash-...
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

mode=smoke
if [ $# -gt 0 ] && { [ "$1" = smoke ] || [ "$1" = long ]; }; then
    mode=$1
    shift
fi
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cargo fuzz list)
fi

target_dir=target/strict
cargo fuzz build -O -a --sanitizer none --target-dir "$target_dir" >&2
bin_dir=$target_dir/x86_64-unknown-linux-gnu/release

# libFuzzer's flags for every run: a hang is an input that runs 10 s; a leak shows as RSS
# growing past 2 GiB (no LeakSanitizer without a sanitizer); the vhost-user target's log lines
# (one per stopped ring) go nowhere (close_fd_mask=2: libFuzzer keeps its own output).
flags_for() {
    local flags=(-timeout=10 -rss_limit_mb=2048 "-artifact_prefix=artifacts/$1/")
    [ "$1" = vhost_user_messages ] && flags+=(-close_fd_mask=2)
    echo "${flags[@]}"
}

# Run `$1 TARGET` for every target, FUZZ_JOBS at a time: each has a CPU of its own for its
# time, and the whole takes the targets' time over the CPUs rather than their sum.
jobs=${FUZZ_JOBS:-$(nproc)}
each_target() {
    local run=$1 running=0 target
    for target in "${targets[@]}"; do
        if [ "$running" -ge "$jobs" ]; then
            wait -n
            running=$((running - 1))
        fi
        "$run" "$target" &
        running=$((running + 1))
    done
    wait
}
# Each target's outcome: results/TARGET (its line, or row) or results/TARGET.failed.
results=$(mktemp -d)
trap 'rm -rf "$results"' EXIT

status=0
if [ "$mode" = smoke ]; then
    seconds=${FUZZ_SMOKE_SECONDS:-25}
    smoke_one() {
        local target=$1 work
        mkdir -p "artifacts/$target"
        work=$(mktemp -d)
        # New inputs go to a scratch directory: the committed seeds stay as they are.
        # shellcheck disable=SC2046
        if "$bin_dir/$target" $(flags_for "$target") -max_total_time="$seconds" "$work" "corpus/$target" \
            >"$work.log" 2>&1; then
            echo "fuzz smoke: $target: ok ($(grep -o 'Done [0-9]* runs in [0-9]* second(s)' "$work.log"))" \
                >"$results/$target"
        else
            { echo "fuzz smoke: $target: FAILED; the end of its log:"; tail -n 40 "$work.log"; } \
                >"$results/$target.failed"
        fi
        rm -rf "$work" "$work.log"
    }
    each_target smoke_one
    for target in "${targets[@]}"; do
        if [ -f "$results/$target.failed" ]; then
            cat "$results/$target.failed" >&2
            status=1
        else
            cat "$results/$target"
        fi
    done
    exit $status
fi

runs=${FUZZ_LONG_RUNS:-10000000}
max_seconds=${FUZZ_LONG_SECONDS:-3600}
work=${FUZZ_WORK_DIR:-corpus-work}
if ! [[ $runs =~ ^-?[0-9]+$ && $max_seconds =~ ^[0-9]+$ ]]; then
    echo "fuzz long: FUZZ_LONG_RUNS ($runs) and FUZZ_LONG_SECONDS ($max_seconds) must be numbers" >&2
    exit 2
fi
resume=${FUZZ_RESUME:-0}
# The table row of target $1 from its finished libFuzzer log $2:
# "#10000000 DONE cov: 512 ft: 2048 corp: 300/20Kb ..." and "Done 10000000 runs in 600 second(s)".
row_from_log() {
    local target=$1 log=$2 done_line cov ft corpus executions seconds rss slowest rate date
    done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1)
    cov=$(sed -E 's/.* cov: ([0-9]+).*/\1/' <<<"$done_line")
    ft=$(sed -E 's/.* ft: ([0-9]+).*/\1/' <<<"$done_line")
    corpus=$(sed -E 's/.* corp: ([^ ]+).*/\1/' <<<"$done_line")
    read -r executions seconds < <(sed -nE 's/^Done ([0-9]+) runs in ([0-9]+) second.*/\1 \2/p' "$log")
    rss=$(sed -nE 's/^stat::peak_rss_mb: *([0-9]+)/\1/p' "$log")
    slowest=$(sed -nE 's/^stat::slowest_unit_time_sec: *([0-9]+)/\1/p' "$log")
    rate=$((executions / (seconds > 0 ? seconds : 1)))
    date=$(date -u -r "$log" +%Y-%m-%d)
    echo "| $target | $executions | $seconds | $rate | $cov | $ft | $corpus | $slowest | $rss | $date |"
}

long_one() {
    local target=$1 log key limit command
    mkdir -p "artifacts/$target" "$work/$target"
    log="$work/$target.log"
    # What a finished run is recorded under: the binary it ran and its limits.
    key="$(sha256sum <"$bin_dir/$target" | cut -d ' ' -f 1) runs=$runs seconds=$max_seconds"
    limit="$runs executions"
    [ "$runs" -lt 0 ] && limit="no execution limit"
    [ "$max_seconds" -gt 0 ] && limit="$limit, $max_seconds s"
    # shellcheck disable=SC2207
    command=(nice -n 10 "$bin_dir/$target" $(flags_for "$target") -runs="$runs" -max_total_time="$max_seconds"
        -print_final_stats=1 "$work/$target" "corpus/$target")
    echo "fuzz long: command (in fuzz/): ${command[*]}" >&2
    if [ "$resume" = 1 ] && [ "$(cat "$work/$target.finished" 2>/dev/null)" = "$key" ]; then
        echo "fuzz long: $target: finished earlier with this binary and these limits (log: $log)" >&2
        row_from_log "$target" "$log" >"$results/$target"
        return
    fi
    rm -f "$work/$target.finished"
    echo "fuzz long: $target: $limit (log: $log)" >&2
    if ! "${command[@]}" >"$log" 2>&1; then
        { echo "fuzz long: $target: FAILED; the end of its log:"; tail -n 40 "$log"; } >"$results/$target.failed"
        return
    fi
    echo "$key" >"$work/$target.finished"
    row_from_log "$target" "$log" >"$results/$target"
}
each_target long_one
rows=()
for target in "${targets[@]}"; do
    if [ -f "$results/$target.failed" ]; then
        cat "$results/$target.failed" >&2
        status=1
    else
        rows+=("$(cat "$results/$target")")
    fi
done
echo
echo "| target | executions | seconds | exec/s | cov | ft | corpus (inputs/size) | slowest input (s) | peak RSS (MB) | date |"
echo "|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
exit $status
