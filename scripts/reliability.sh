#!/usr/bin/env bash
# Regenerates RELIABILITY.md from what the reliability runs print (never edited by hand), as
# scripts/benchmarks.sh does BENCHMARKS.md: the fuzz targets (scripts/fuzz.sh long), the kill -9
# rounds (tests/durability.rs), the fault cases (tests/faults.rs) and the FLUSH proof
# (tests/flush.rs), the Linux compatibility suite (tests/linux_compat.rs) and the daemon's
# restarts with requests in flight (tests/inflight.rs), with the commit, the date, the machine and
# the exact commands.
#
#   scripts/reliability.sh short   a few minutes: each fuzz target for FUZZ_SMOKE_SECONDS
#                                  (default 25, the smoke run's length) from its committed seeds,
#                                  EXITLESS_DURABILITY_ROUNDS (default 3) kill -9 rounds per case,
#                                  and the Linux guests' mixed fio run for
#                                  EXITLESS_LINUX_MIXED_SECS (default 10) seconds per target, and
#                                  EXITLESS_INFLIGHT_RESTARTS (default 3) kill -9 restarts of the
#                                  daemon under fio, and EXITLESS_OSD_KILLS (default 1) kill -9s
#                                  of a Ceph OSD under a guest's writes
#   scripts/reliability.sh long    each fuzz target to FUZZ_LONG_RUNS executions (default
#                                  10000000) or FUZZ_LONG_SECONDS (default 3600: one hour),
#                                  whichever comes first, EXITLESS_DURABILITY_ROUNDS (default 50) rounds, and
#                                  a mixed fio run of EXITLESS_LINUX_MIXED_SECS (default 60) seconds,
#                                  EXITLESS_INFLIGHT_RESTARTS (default 20) restarts, and
#                                  EXITLESS_OSD_KILLS (default 5) OSD kills
#
#   scripts/reliability.sh short|long --resume
#                                  goes on with a run that stopped (a machine that went down):
#                                  a part that passed on this same tree and form is not run
#                                  again, nor a fuzz target that finished with the same binary;
#                                  the report counts their times from the first attempt
#
# The fault and FLUSH cases are the same in both forms. Every part runs even when one before it
# failed; RELIABILITY.md then says which failed, and the script exits 1. Logs (libFuzzer's, the
# tests') are kept in target/reliability/. Needs root and what scripts/setup.sh installs.
set -euo pipefail
cd "$(dirname "$0")/.."

form=${1:-}
resume=false
case "${2:-}" in
'') ;;
--resume) resume=true ;;
*)
    echo "usage: scripts/reliability.sh short|long [--resume]" >&2
    exit 2
    ;;
esac
case "$form" in
short)
    fuzz_env=(FUZZ_LONG_RUNS=-1 "FUZZ_LONG_SECONDS=${FUZZ_SMOKE_SECONDS:-25}")
    rounds=${EXITLESS_DURABILITY_ROUNDS:-3}
    mixed_secs=${EXITLESS_LINUX_MIXED_SECS:-10}
    restarts=${EXITLESS_INFLIGHT_RESTARTS:-3}
    osd_kills=${EXITLESS_OSD_KILLS:-1}
    ;;
long)
    fuzz_env=("FUZZ_LONG_RUNS=${FUZZ_LONG_RUNS:-10000000}" "FUZZ_LONG_SECONDS=${FUZZ_LONG_SECONDS:-3600}")
    rounds=${EXITLESS_DURABILITY_ROUNDS:-50}
    mixed_secs=${EXITLESS_LINUX_MIXED_SECS:-60}
    restarts=${EXITLESS_INFLIGHT_RESTARTS:-20}
    osd_kills=${EXITLESS_OSD_KILLS:-5}
    ;;
*)
    echo "usage: scripts/reliability.sh short|long [--resume] (see the comment at its top)" >&2
    exit 2
    ;;
esac

if ! [[ $rounds =~ ^[0-9]+$ ]]; then
    echo "reliability: EXITLESS_DURABILITY_ROUNDS ($rounds) must be a number" >&2
    exit 2
fi
if ! [[ $restarts =~ ^[0-9]+$ ]]; then
    echo "reliability: EXITLESS_INFLIGHT_RESTARTS ($restarts) must be a number" >&2
    exit 2
fi
if ! [[ $mixed_secs =~ ^[1-9][0-9]*$ ]]; then
    echo "reliability: EXITLESS_LINUX_MIXED_SECS ($mixed_secs) must be a number of seconds, at least 1" >&2
    exit 2
fi

logs=target/reliability
$resume || rm -rf "$logs"
mkdir -p "$logs"
logs=$(cd "$logs" && pwd)
# Artifacts (crashes, slow inputs) newer than this are this run's; a resumed run's began with
# the first attempt.
[ -e "$logs/started" ] || touch "$logs/started"
# Relative to fuzz/, where fuzz.sh runs: a fresh work corpus, so every target starts from its
# committed seeds alone.
fuzz_env+=("FUZZ_WORK_DIR=../target/reliability/fuzz-corpus")
$resume && fuzz_env+=(FUZZ_RESUME=1)

# What the figures were measured on: the tree (RELIABILITY.md itself, the output, aside), the
# machine as BENCHMARKS.md names it, and how busy it was.
commit=$(git rev-parse HEAD)
dirty=$(git status --porcelain -- . ':!RELIABILITY.md' | sed 's/^...//' | paste -sd ' ' -)
tree="commit $commit"
[ -n "$dirty" ] && tree="$tree plus uncommitted changes to: $dirty"
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
kvm=unknown
for module in kvm_pvm kvm_intel kvm_amd; do
    if [ -e "/sys/module/$module" ]; then
        kvm=$module
        break
    fi
done
machine="$cpu ($(nproc) CPUs), Linux $(cat /proc/sys/kernel/osrelease), KVM backend $kvm"
# A resumed run keeps the first attempt's start, and says it was resumed.
if ! $resume || ! [ -s "$logs/start" ]; then
    echo "$(date +%s) $(cut -d ' ' -f 1-3 /proc/loadavg)" >"$logs/start"
fi
read -r start load_before < "$logs/start"
started=$(date -u -d "@$start" '+%Y-%m-%d %H:%M UTC')
$resume && started="$started (resumed $(date -u '+%Y-%m-%d %H:%M UTC'))"

tests=(cargo test --release -p exitless)
test_flags=(-- --test-threads 1 --show-output)
fuzz_command="${fuzz_env[*]} scripts/fuzz.sh long"
durability_command="EXITLESS_DURABILITY_ROUNDS=$rounds ${tests[*]} --test integration durability:: ${test_flags[*]}"
faults_command="${tests[*]} --test integration faults:: ${test_flags[*]}"
flush_command="${tests[*]} --test integration flush:: ${test_flags[*]}"
linux_command="EXITLESS_LINUX_MIXED_SECS=$mixed_secs ${tests[*]} --test integration linux_compat:: ${test_flags[*]}"
osd_command="EXITLESS_OSD_KILLS=$osd_kills ${tests[*]} --test integration rbd::an_osd_killed ${test_flags[*]}"
inflight_command="EXITLESS_INFLIGHT_RESTARTS=$restarts ${tests[*]} --test integration inflight:: ${test_flags[*]} && EXITLESS_FRONTEND_RESTARTS=$restarts ${tests[*]} --test integration vhost_user_frontend::a_vm_keeps_its_disk_across_daemon_restarts ${test_flags[*]}"

echo "reliability $form: $tree" >&2
echo "  machine: $machine (load $load_before)" >&2
echo "  fuzz:       $fuzz_command" >&2
echo "  durability: $durability_command" >&2
echo "  faults:     $faults_command" >&2
echo "  flush:      $flush_command" >&2
echo "  linux:      $linux_command" >&2
echo "  inflight:   $inflight_command" >&2
echo "  osd:        $osd_command" >&2
echo "  logs:       $logs/" >&2

scripts/setup.sh >&2
cargo build --release >&2
"${tests[@]}" --test integration --no-run >&2

failed=()
# Runs part $1 ($2: its command line, run by bash), its output in $logs/$1.log; records its wall
# time in seconds_$1 and whether it passed.
# With --resume a part that passed on this tree and form ($logs/$1.passed) is not run again.
part() {
    local name=$1 command=$2 start seconds
    if $resume && [ "$(head -n 1 "$logs/$name.passed" 2>/dev/null)" = "$form $tree" ]; then
        echo "reliability: $name passed earlier on this tree" >&2
        printf -v "seconds_$name" '%s' "$(sed -n 2p "$logs/$name.passed")"
        return
    fi
    rm -f "$logs/$name.passed"
    echo "reliability: $name ($command)" >&2
    start=$(date +%s)
    local passed=true
    bash -c "$command" >"$logs/$name.log" 2>&1 || passed=false
    # A test filter that matches nothing passes with no test run: that part did nothing.
    if grep -q '^test result: ok\. 0 passed' "$logs/$name.log"; then
        echo "reliability: $name: a command of it ran no test" >&2
        passed=false
    fi
    seconds=$(($(date +%s) - start))
    printf -v "seconds_$name" '%s' "$seconds"
    if $passed; then
        echo "reliability: $name passed" >&2
        printf '%s\n%s\n' "$form $tree" "$seconds" >"$logs/$name.passed"
    else
        echo "reliability: $name FAILED (log: $logs/$name.log)" >&2
        failed+=("$name")
    fi
}

part flush "$flush_command"
part linux "$linux_command"
part inflight "$inflight_command"
part osd "$osd_command"
part faults "$faults_command"
part durability "$durability_command"
# fuzz.sh prints its table on stdout and its progress and failures on stderr.
part fuzz "$fuzz_command 2>$logs/fuzz.stderr"
load_after=$(cut -d ' ' -f 1-3 /proc/loadavg)

# Every input libFuzzer kept in fuzz/artifacts/ during this run, replayed alone: a slow input's
# time in the run is wall time, which on a shared machine includes time the fuzzer was not
# running at all.
artifacts=()
while IFS= read -r -d '' unit; do
    target=$(basename "$(dirname "$unit")")
    t0=$(date +%s%N)
    outcome=ok
    fuzz/target/strict/x86_64-unknown-linux-gnu/release/"$target" "$unit" >"$logs/replay.log" 2>&1 ||
        outcome="FAILED (exit $?)"
    artifacts+=("| \`$unit\` | $(((($(date +%s%N) - t0) / 1000000))) | $outcome |")
done < <(find fuzz/artifacts -type f -newer "$logs/started" -print0 2>/dev/null | sort -z)
total_seconds=$(($(date +%s) - start))

# `NAME RESULT` for every test libtest ran in log $1.
results() {
    sed -nE 's/^test ([^ ]+) \.\.\. (ok|FAILED|ignored)$/\1 \2/p' "$1"
}

# A Markdown table of the tests of log $1: name and result.
result_table() {
    echo "| test | result |"
    echo "|---|---|"
    results "$1" | while read -r name result; do
        echo "| \`$name\` | $result |"
    done
    if [ -z "$(results "$1")" ]; then
        echo "| (no test ran: see the log) | FAILED |"
    fi
}

# How part $1 ended, for a heading: its wall time (builds included) and, for a test part, libtest's
# count and time.
verdict() {
    local name=$1 seconds_var="seconds_$1" tests
    tests=$(sed -nE 's/^test result: [a-zA-Z]+\. ([0-9]+ passed; [0-9]+ failed).*finished in ([0-9.]+)s$/, tests: \1 in \2 s/p' \
        "$logs/$name.log" | tail -n 1)
    if [[ " ${failed[*]} " == *" $name "* ]]; then
        echo "**FAILED** (${!seconds_var} s$tests; the end of its log is below)"
    else
        echo "passed (${!seconds_var} s$tests)"
    fi
}

# The last lines of a failed part's log, as a code block.
failure_tail() {
    if [[ " ${failed[*]} " == *" $1 "* ]]; then
        echo
        echo '```'
        tail -n 60 "$2"
        echo '```'
    fi
}

# Lines the tests printed that start with $2, from log $1, temporary paths made generic.
printed() {
    grep -E "^$2 " "$1" | sed -E 's#path=/[^ ,]*#path=FILE#g' || true
}

{
    cat <<'EOF'
# Reliability

Generated by `scripts/reliability.sh` from what its runs printed; not edited by hand. Every
figure below comes from the run described here; how each part works is explained with it.

EOF
    echo "- form: \`scripts/reliability.sh $form\`"
    echo "- tree: $tree"
    echo "- started: $started; $total_seconds s in all from the first start, builds included; load average $load_before at the start, $load_after at the end"
    echo "- machine: $machine"
    echo "- toolchain: $(rustc --version), $(cargo fuzz --version)"
    if [ ${#failed[@]} -eq 0 ]; then
        echo "- outcome: every part passed"
    else
        echo "- outcome: **FAILED: ${failed[*]}**"
    fi
    echo
    echo "| part | command | outcome (wall time, builds included) |"
    echo "|---|---|---|"
    for name in fuzz durability faults flush linux inflight osd; do
        command_var="${name}_command"
        echo "| $name | \`${!command_var}\` | $(verdict "$name") |"
    done
    echo

    cat <<'EOF'
## Fuzzing

Everything a guest driver, a vhost-user frontend, a snapshot file, a migration source or a
predecessor daemon controls is fuzzed with coverage guidance:
[cargo-fuzz](https://github.com/rust-fuzz/cargo-fuzz) driving libFuzzer, on the **stable**
toolchain with no sanitizer (`--sanitizer none`; no `RUSTC_BOOTSTRAP`, no nightly), release
builds with debug assertions and overflow checks (`-O -a`), so an arithmetic overflow is a crash.
Without a sanitizer there is no AddressSanitizer or LeakSanitizer: out-of-bounds accesses are
caught only where they fault or where Rust checks them, and a leak only as RSS growing past the
2 GiB limit or, for descriptors, as running out of them (the vhost-user target creates several
per input). A hang is an input that runs longer than 10 s.

The targets live in `fuzz/` (their own cargo workspace, outside the project's), share a harness
(`fuzz/src/lib.rs`: guest RAM of two 64 KiB regions with a hole between them, split rings laid
out in it, a hostile driver that writes descriptors, requests and ring indices drawn from the
input, a RAM disk on a memfd) and check behaviour, not only the absence of panics:

| target | what it drives | what it checks besides "no panic" |
|---|---|---|
| `split_queue` | `Queue::new` with fuzzed sizes and ring addresses, then any order of `pop_avail`, `walk_chain`, `add_used`, `publish_used`, `needs_interrupt`, `set_notifications`, `descriptor` and driver writes, continued after the driver broke the queue | heads taken are inside the queue and were published; a chain walk visits at most queue-size descriptors; the used index in RAM is always the one last published |
| `blk_worker` | `BlockWorker` over a RAM disk: requests of every type (read, write, flush, get-id, unknown) with sectors on and off the disk, bent descriptors (direction, length, address, loops, indirect), avail-index jumps, polling on and off, polls in between | after every poll nothing is in flight; answers never outnumber requests; while the queue is not broken every request taken has exactly one used entry; a broken queue is not served |
| `blk_chains` | `BlockWorker` over a RAM disk on a queue of 1 to 256 that negotiated indirect descriptors: requests each in an indirect table of 0 to 1099 data segments (so tables longer than the queue, up to and past 1024 descriptors), segments of 512 B, 1 KiB, 4 KiB or any length, at consecutive places, the same 512 bytes every time or anywhere, a bent link, a table anywhere; its input is read a byte or word at a time, so its seeds (Linux's 130-descriptor table of 128 x 512 B written and read back, the same page 128 times, 129 and 1022 data segments, a table of 1025, a table of 130 on a queue of 1) are written by hand | nothing in flight after a poll; a well-formed table of at most 1024 descriptors never breaks the queue and gets one used entry, with IOERR when it holds more than 128 data segments and OK when its segments are sectors in RAM and on the disk; a table of more than 1024 breaks the queue |
| `net_chains` | `NetWorker` over a real datagram socket pair: transmit chains (header + frame over 1-3 descriptors), receive chains, frames of 0 to 70 000 bytes arriving | every frame sent reached the wire with a length in 14..=1518; while no queue broke, each ring's used index counts exactly the chains taken; every frame that arrived was delivered, dropped with a counter, or is still waiting |
| `switch_frames` | the vhost-user-net switch with two or three guests, each in its own memory: transmit chains (header + frame over 1-3 descriptors) to each other's addresses, to broadcast, to unknown addresses and to the sender itself, frames from 0 to 1520 bytes, receive chains of any size and direction, hostile ring writes | while a port's rings are not broken, each ring's used index counts exactly the chains the switch took from it; no port receives more frames than the others sent |
| `super_frames` | a guest's TCP super-frames on their way to the host: any bytes as the frame (Ethernet with IPv4, IPv6 or a VLAN tag, or none), any segment size, checksum offsets and interface MTU | a super-frame the switch passes to the host's kernel whole carries a header the kernel takes from an untrusted sender (TCP segmentation of the size asked, the checksum inside the headers, `hdr_len` within the frame, segments that fit the interface), and the switch could cut it itself |
| `vhost_user_messages` | `Message::parse` and `Session::handle` as `server.rs` drives them (a refused message ends the connection; the next gets a new session), messages mostly well formed per request code plus QEMU's ring start-up sequence, with real descriptors (memfds, eventfds, a pipe's read end, a pipe whose reader is gone, sockets, /dev/null); requests posted in the shared memory; the running rings' workers polled | after a poll nothing is in flight; a worker id is never attached twice; when a connection ends every ring it started has been stopped |
| `snapshot_state` | a snapshot's `state.json` as a restore reads it: `Snapshot::parse` (format, version, the configuration's checks, counts, each KVM structure's exact length), the configuration made into a VM's, each saved transport restored (`MmioTransport::restore`) into a block device of its disk's queue count over guest RAM, resumed and notified; inputs that start with `{` are state files (seeds: real ones from `vm.snapshot`), others build a state that restores and bend its fields and its JSON text | a state that parses makes a VM configuration and writes back as text that parses to the same text; a restored transport saves the registers, features and queues it was restored from; a state built to restore and not bent is taken |
| `migration_stream` | the destination's reading of a live-migration stream (`migration::wire::parse_stream`, the checks `receive` makes, without a VM): hello, page records against the RAM layout, the state record against the hello; inputs that start with the magic are streams (seeds written from a real state), others build a stream and bend it (records anywhere, lengths that lie, unknown tags, JSON bytes changed, the stream cut short) | a stream built here and not bent is taken, with the records, pages, vCPU and device states it holds |
| `handover_messages` | a successor daemon reading its predecessor (`handover::read_as_successor`): DISK messages with their sockets, each disk's vhost-user messages replayed into a session with its rings held, DONE, REFUSE, unknown codes, bytes that are no message; mostly QEMU's ring start-up and SET_INFLIGHT_FD with arbitrary regions, sometimes counts that lie, descriptors missing or of the wrong kind, requests a hand-over never replays | no ring is started before a commit; a channel of well-formed disks without a frontend that ends with DONE is taken, with every disk |
| `inflight_region` | `Queue::track_inflight` (`InflightTracker::recover`) over an in-flight area every byte of which comes from the input, for a queue of fuzzed size and used index; then the queue serves (recovered heads first, driver heads, batches returned) and the backend "crashes" | recovered heads are in the queue, distinct, marked in flight and oldest first, and the queue resumes at the used index plus their count; after the crash a new queue recovers exactly the heads taken and not returned, in the order taken, and resumes where the first stood |
| `mmio_registers` | `MmioTransport` in trap mode with a block device: register reads and writes at any offset, width and value, the driver's status/feature/queue set-up sequence (so queues are activated, and reset again), requests, notifications | the magic value always reads right; a reset clears status, queue-ready and interrupt status; while the device runs, a notification leaves no available request unanswered |

Seeds are in `fuzz/corpus/TARGET/` (hand-written ones, inputs picked from a `-merge=1`
minimisation of short runs, and every input a target ever found, kept as `regression-*` so that
each run replays it); this run started from them alone, in a fresh work corpus, one target after
the other. A crash leaves its input in `fuzz/artifacts/TARGET/`. `scripts/fuzz.sh` (smoke mode)
is CI's short run of every target from the same seeds.

Issue 9's defect #2 (a duplicate head leaked an in-flight slot) was found by fuzzing three ways:
by `blk_worker` directly (`regression-blk_worker-duplicate-head-in-flight-leak`), by
`vhost_user_messages` through a running ring (`regression-vhost_user_messages-in-flight-leak`),
and by `mmio_registers` through a reset, where a driver that sets the device up again without
clearing its avail ring has the new queue take the stale entries, one head twice
(`regression-mmio_registers-duplicate-head-after-reset`, and
`regression-mmio_registers-in-flight-leak-20s-hang`, which once spun on the leaked count). The
queue now refuses a head offered again before it was returned (DEVICE_NEEDS_RESET) and a reset
waits for what the backend really holds; every run below replays these inputs. Defect #1
(completions past the 64th lost) was not reached by a fuzzer.

EOF
    echo "### This run"
    echo
    echo "\`$fuzz_command\`: $(verdict fuzz). \`cov\` is libFuzzer's count of covered edges and"
    echo "\`ft\` of features (edge hit counts, compared values) at the end; the corpus is what the"
    echo "run kept; the slowest input is libFuzzer's \`slowest_unit_time_sec\` (wall time)."
    echo
    echo "Each target's libFuzzer command, as fuzz.sh ran it:"
    echo
    echo '```'
    sed -n 's/^fuzz long: command (in fuzz\/): //p' "$logs/fuzz.stderr"
    echo '```'
    echo
    echo "Seeds in \`fuzz/corpus/\` at the start (inputs, bytes):"
    for dir in fuzz/corpus/*/; do
        target=$(basename "$dir")
        echo "\`$target\` $(find "$dir" -type f | wc -l), $(find "$dir" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}');"
    done | paste -sd ' ' - | sed 's/;$/./'
    echo
    sed -n '/^| target /,$p' "$logs/fuzz.log"
    echo
    seeds=$(for log in "$logs"/fuzz-corpus/*.log; do
        [ -e "$log" ] || continue
        echo "\`$(basename "$log" .log)\` $(sed -nE 's/^INFO: Seed: ([0-9]+).*/\1/p' "$log" | head -n 1)"
    done | paste -sd ',' - | sed 's/,/, /g')
    [ -n "$seeds" ] && echo "libFuzzer's random seeds (\`-seed=N\` repeats a target's run): $seeds." && echo
    if [ ${#artifacts[@]} -gt 0 ]; then
        echo "Inputs this run left in \`fuzz/artifacts/\` (\`slow-unit-*\`: slower than 10 s of wall time in the"
        echo "run, which on a shared machine includes time the fuzzer was not scheduled; \`crash-*\`,"
        echo "\`timeout-*\`, \`oom-*\`: a failure), each replayed alone after the run:"
        echo
        echo "| input | replayed alone (ms) | replay |"
        echo "|---|---|---|"
        printf '%s\n' "${artifacts[@]}"
        echo
    else
        echo "The run left no input in \`fuzz/artifacts/\` (no crash, timeout, out-of-memory or slow input)."
        echo
    fi
    if [ -s "$logs/fuzz.stderr" ] && grep -q FAILED "$logs/fuzz.stderr"; then
        echo '```'
        grep -A 40 FAILED "$logs/fuzz.stderr" | tail -n 80
        echo '```'
        echo
    fi

    cat <<'EOF'
## Faults

A disk's backing file fails under a running guest. The probe's `blk-faults` workload does
rounds of 4 KiB writes and read-back checks (pattern `probe_abi::pattern`) on the disk under
test. The host steers it step by step through a second disk of the same VM (the control disk:
`probe_abi::fault_control` words in sector 0; a step starts only when two reads in a row agree,
and runs at least 3 rounds). The host breaks the file while the guest is between steps (the VM
is running and its control disk is in use), then asks for the next step. At the end the guest prints,
per step, how each request ended (OK, IOERR, other status, and reads answered OK with wrong
data), and the host compares its own error count with the guest's.

| fault | how it is made | the guest must see | afterwards |
|---|---|---|---|
| out of space | 64 MiB sparse disk on a 16 MiB ext4 (loop device); a filler file takes every free block (and ext4's `reserved_clusters` pool is emptied first) | writes to blocks not yet allocated: IOERR (all but the few blocks ext4 still finds; how many varies); reads and rewrites of blocks already written: OK, right data | filler deleted, `sync -f`: writes to the new blocks OK, read back right; the host file holds the pattern |
| truncated file | 128-block file cut to 64 blocks (`ftruncate`) | reads past the new end: IOERR (a short read is no success), exactly 64 per round; reads before it: OK, right data | the lost half written again: all 128 blocks read back right |
| file system turned read-only | ext4 with `errors=remount-ro`, then an error (`/sys/fs/ext4/<loop>/trigger_fs_error`) | every write: IOERR; every read: OK, right data | reads keep working; the blocks written before hold the pattern |

In every case the test also checks that no read answered OK returned wrong data, that the control
disk served every round (0 errors), that nothing panicked, that `exitless run` ended with the
probe's status 0 and that the `vhost-user-blk` daemon ended cleanly on SIGTERM. Each fault is
tested through both frontends:

- `exitless run` with the IOCore polling (`--io-mode exitless`), the disk under test
  `path=FILE,direct` and the control disk a RAM disk on a /dev/shm file;
- `exitless vhost-user-blk --io-mode adaptive` (disk `path=FILE,direct`) serving the same probe
  under QEMU-KVM (`-M microvm`, `vhost-user-blk`), the control disk QEMU's own
  `virtio-blk-device`.

Host-side counts: the daemon's per-vring log line ("N requests completed, E I/O errors, ...")
must equal the IOERRs the guest saw. For `exitless run`, `devices[0].io_errors` in
`run --stats --json` must equal them too, with 0 for the control disk and no `needs_reset`.

What the kernel does not allow: `mount -o remount,ro` fails with EBUSY while any file on the
file system is open for writing, as the VMM's disk is. So a read-only remount cannot happen
under a running VMM; what can happen is the file system turning itself read-only on an error,
which is what the test does. That state lasts until the file system is unmounted
(`mount -o remount,rw` succeeds but the file system stays `emergency_ro`), so the test does
not expect writes to work again in that case. A read past the end of a truncated file comes back
short and is answered IOERR.

EOF
    echo "### This run"
    echo
    echo "\`$faults_command\`: $(verdict faults)."
    echo
    result_table "$logs/faults.log"
    echo
    echo "What each passing case printed (per step: the guest's counts for the disk under test's"
    echo "writes and reads and for the control disk; step 2 is the pause in which the host breaks"
    echo "the file; the host's count of I/O errors on the disk under test):"
    echo
    echo '```'
    printed "$logs/faults.log" fault | sed 's/; step/;\n    step/g'
    echo '```'
    failure_tail faults "$logs/faults.log"
    echo

    cat <<'EOF'
## Durability under kill -9

A guest writes generations of blocks, each closed by a FLUSH, and says on its console which
generations' FLUSH completed; the host kills the process that serves the disk with SIGKILL at a
random moment after the first durable generation, then checks the backing file sector by sector.
Every block must hold the data of the last durable generation that wrote it (or zeros if none
did), or of a generation the guest had begun after the last durable one (its writes may or may
not have landed), and nothing else; the data encodes generation and block, so an old generation
or a torn sector is caught (the check is itself tested on hand-built files).

- Probe (`probe.workload=blk-durable`, `exitless run --disk path=FILE,direct`, the `exitless`,
  `eventfd` and `adaptive` modes in turn): up to 64 blocks per generation at queue depth 8, a
  JSON line before a generation's writes and one after its FLUSH. `exitless run` is killed 0 to
  0.5 s after the first durable line. Console lines reach the host (line-buffered) before the
  vCPU resumes, so every line the host saw was reached.
- Linux (Debian cloud kernel under QEMU TCG, busybox initramfs) through
  `exitless vhost-user-blk --disk path=FILE,direct`: fio is not in the initramfs this test
  builds, so the guest runs a busybox loop: up to 32 blocks per generation written with
  `dd conv=notrunc,fsync` (fsync of the block device: the writes, then a FLUSH), a
  `DUR-WRITING` line before and a `DUR-DURABLE` line after. The daemon is killed 0 to 2 s after
  the first durable line; the guest's console is then read until it is quiet (nothing can
  become durable once the backend is gone), and QEMU is killed.

kill -9 leaves the host's page cache intact, so these rounds show that a write acknowledged
after a FLUSH was handed to the kernel, not that it reached stable storage; the FLUSH proof
below shows the latter's first half, that every FLUSH is an fsync that completed first.

("blocks checked": per round, the blocks some durable generation wrote, each checked sector by
sector against its last durable generation; every other block of the 4 MiB disk was checked
too, against zeros or a generation begun after the last durable one.)

EOF
    echo "### This run"
    echo
    echo "\`$durability_command\`: $(verdict durability)."
    echo
    echo "| guest, killed process | rounds | block writes acknowledged (after a completed FLUSH) | blocks checked | lost |"
    echo "|---|---|---|---|---|"
    printed "$logs/durability.log" durability |
        sed -nE 's/^durability (.*): ([0-9]+) rounds, ([0-9]+) block writes .*, ([0-9]+) blocks checked, ([0-9]+) lost \((.*)\)$/| \1, \6 | \2 | \3 | \4 | \5 |/p'
    echo
    result_table "$logs/durability.log"
    failure_tail durability "$logs/durability.log"
    echo
    echo "\`cargo test\` alone runs 3 rounds of each (the default); \`EXITLESS_DURABILITY_ROUNDS=N\`"
    echo "sets the rounds. \`scripts/durability.sh [ROUNDS]\` runs this part alone."
    echo

    cat <<'EOF'
## FLUSH is an fsync that completes before the guest goes on

In every I/O mode of the VMM (`exitless run`: trap, eventfd, pv-eoi, sidecore, exitless,
adaptive) and of the daemon (`exitless vhost-user-blk`: sidecore, adaptive, eventfd, serving the
probe through `exitless run --disk vhost-user=`), on a file through the page cache and with
O_DIRECT, the probe writes and flushes in turn at queue depth 1 (`probe.rw=writeflush`). The
kernel's own io_uring tracepoints (`io_uring_submit_req`, `io_uring_complete`), recorded in a
tracefs instance of the test's own for the serving process's rings alone, must show one FSYNC per
FLUSH the guest made, each completed with result 0, and no other request submitted on that ring
before the fsync completed: the guest's next write is its answer to the FLUSH's status, so the
guest went on only after the fsync finished.

EOF
    echo "### This run"
    echo
    echo "\`$flush_command\`: $(verdict flush)."
    echo
    echo "| serving process, disk, mode | guest FLUSHes | fsyncs, each completed before the next submission | io_uring submissions traced | completions traced |"
    echo "|---|---|---|---|---|"
    printed "$logs/flush.log" flush |
        sed -E 's/^flush path=/flush exitless run path=/; s/^flush daemon ([a-z-]+) path(,direct)?:/flush exitless vhost-user-blk path=FILE\2 \1:/' |
        sed -nE 's/^flush (.*): ([0-9]+) FLUSHes, ([0-9]+) fsyncs .*; ([0-9]+) io_uring submissions, ([0-9]+) completions traced$/| \1 | \2 | \3 | \4 | \5 |/p'
    echo
    result_table "$logs/flush.log"
    failure_tail flush "$logs/flush.log"
    echo

    cat <<'EOF'
## Linux guests, QEMU's virtio-blk as the reference

Debian's cloud kernel boots under QEMU TCG from a busybox initramfs that holds the host's own
e2fsprogs, util-linux `blkdiscard`, coreutils `dd` and fio, with their libraries. Its two disks,
a file and a RAM disk, are served by QEMU's own `virtio-blk-pci` (the reference: whatever it
handles, the daemon must) and by `exitless vhost-user-blk` in each I/O mode. In one boot the
guest writes and reads back 512 B to 1 MiB blocks with dd and from buffers that start 512 bytes
into a page; runs fio with 512 B to 1 MiB blocks, O_DIRECT and through the page cache, from
buffers that do not start on a page (`--iomem_align`), every block checked by crc32c, and checked
again from the disk with the page cache dropped; then the mixed run below; then zeroes a range
with `blkdiscard -z`, makes, fills, remounts and checks an ext4 file system and has `e2fsck -fn`
find it clean. The mixed run is six fio jobs at once, three per disk, each in its own range, at
queue depth 32 (libaio), reads and writes mixed half and half: 4 KiB and 512 B to 128 KiB with
O_DIRECT, 1 MiB through the page cache, every block written checked by crc32c after at most 64
more (`verify_backlog`). The test requires fio's exit status 0, `err= 0` for every job, no failed
check, no I/O error in the guest's dmesg, a clean ext4 on the host's e2fsck of the file disk and,
for the daemon, no broken queue and 0 I/O errors and 0 refused requests in its log.

EOF
    echo "### This run"
    echo
    echo "\`$linux_command\`: $(verdict linux). Read and written: fio's totals for the mixed run"
    echo "(the reads include those that checked what was written)."
    echo
    echo "| disks served by | mixed run | read | written | outcome |"
    echo "|---|---|---|---|---|"
    printed "$logs/linux.log" linux-compat |
        sed -nE 's/^linux-compat (.*): mixed run ([0-9]+) s, [^,]*, read ([^,]+), written ([^,]+), (.*)$/| \1 | \2 s | \3 | \4 | \5 |/p'
    echo
    result_table "$logs/linux.log"
    failure_tail linux "$logs/linux.log"
    echo

    cat <<'EOF'
## The daemon restarted with requests in flight

`exitless vhost-user-blk` keeps the requests it holds in the shared memory of
VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD; QEMU (`-chardev socket,...,reconnect=1`) hands it to the
next daemon, which resubmits them. A Linux guest under QEMU TCG runs fio at queue depth 32
(libaio, O_DIRECT, 4 KiB random writes, each checked by crc32c) while the daemon is killed with
SIGKILL and started again; its disk file is served through a FUSE file system that answers each
write after 1 ms, so that the daemon holds requests when it is killed. Every fio run must finish
with exit status 0, `err= 0` and no failed check, and the guest's kernel must log no I/O error.
The same test file holds a write back (FUSE) behind a completed read across a kill -9, which
only resubmission completes, and hands the disk over with SIGTERM under fio. Then an exitless VM
(`tests/vhost_user_frontend.rs`) runs the probe's verify while its daemon is killed (two rounds in
three) or stopped with SIGTERM (every third) as many times, a new daemon started each time: the
VM reconnects to each, which resubmits what the region marks, and verify must pass with the
file holding every block.

EOF
    echo "### This run"
    echo
    echo "\`$inflight_command\`: $(verdict inflight)."
    echo
    printed "$logs/inflight.log" inflight | sed 's/^/- /'
    echo
    result_table "$logs/inflight.log"
    failure_tail inflight "$logs/inflight.log"
    echo

    cat <<'EOF'
## A Ceph OSD killed under a guest's writes

The probe's verify writes 4000 blocks at depth 8 to an RBD image of a throw-away cluster
(`scripts/ceph.sh`), served by `exitless vhost-user-blk`; one second in, the cluster's only OSD
is killed with SIGKILL, a second guest runs its verify on the daemon's RAM disk meanwhile, and
the OSD is started again. librbd sends the requests again: the guest waits, and its verify must
read back every block it was answered for, as must `rbd export` of the image.

EOF
    echo "### This run"
    echo
    echo "\`$osd_command\`: $(verdict osd)."
    echo
    printed "$logs/osd.log" "OSD kill" | sed 's/^/- /'
    echo
    result_table "$logs/osd.log"
    failure_tail osd "$logs/osd.log"
} >RELIABILITY.md.new
mv RELIABILITY.md.new RELIABILITY.md
echo "RELIABILITY.md updated ($form form; logs in $logs/)" >&2
if [ ${#failed[@]} -gt 0 ]; then
    echo "reliability: FAILED: ${failed[*]}" >&2
    exit 1
fi
