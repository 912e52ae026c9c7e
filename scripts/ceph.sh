#!/usr/bin/env bash
# A throw-away Ceph cluster on this machine, for exitless's RBD tests and benchmarks: one monitor
# and one BlueStore OSD on a sparse file, pool `rbd` with one replica, cephx on, no manager, no
# systemd, no containers. Everything (configuration, keys, data, logs, PID files) lives in DIR.
#
#   scripts/ceph.sh up DIR [--addr IP] [--port PORT] [--size GIB] [--until-exit PID]
#       Start a cluster in DIR (which must not hold one already) and wait until pool `rbd` is
#       ready. Prints DIR/ceph.conf's path on its last line; `rbd -c DIR/ceph.conf ...` and
#       exitless's `rbd=rbd/IMAGE,conf=DIR/ceph.conf` use it. IP defaults to 127.0.0.1 (give an
#       address other network namespaces reach to serve them), PORT to a free one, the OSD's
#       file to 10 GiB (sparse: it takes what is written). With --until-exit, the cluster is
#       taken down (as by `down`) once process PID has ended: a test binary's cluster goes
#       with it, however it ends.
#   scripts/ceph.sh down DIR
#       Stop the daemons by PID (SIGTERM, then SIGKILL after 10 s) and remove DIR. With
#       CEPH_KEEP_LOGS=KEEP in the environment (of `up`, for a cluster taken down on exit), the
#       daemons' logs are kept in KEEP/DIR's name first: what a stalled test's cluster did.
#   scripts/ceph.sh stop-osd DIR | start-osd DIR
#       Kill the OSD with SIGKILL / start it again on its data (fault tests).
#   scripts/ceph.sh pause-osd DIR | resume-osd DIR
#       Stop the OSD with SIGSTOP, as a host too busy to run it for a while does / let it go on
#       with SIGCONT (fault tests).
#
# The settings that make it come up in seconds rather than tens of seconds are explained where
# they are written below. Needs root-free access to DIR only; the packages are installed by
# scripts/setup.sh (ceph-mon, ceph-osd, ceph-common).
set -euo pipefail

usage() {
    sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

[[ $# -ge 2 ]] || usage
command=$1
dir=$2
shift 2

die() {
    echo "ceph.sh: $*" >&2
    exit 1
}

free_port() {
    local port
    for port in $(shuf -i 20000-39999 -n 50); do
        if ! (exec 3<>"/dev/tcp/$1/$port") 2>/dev/null; then
            echo "$port"
            return
        fi
    done
    die "no free TCP port found on $1"
}

pid_alive() {
    [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

ceph_cli() {
    timeout 60 ceph -c "$dir/ceph.conf" "$@"
}

start_osd() {
    ceph-osd -c "$dir/ceph.conf" -i 0 2>>"$dir/log/osd-start.log" || die "ceph-osd did not start: see $dir/log/osd.0.log"
}

stop_pid() {
    local file=$1 pid
    [[ -f $file ]] || return 0
    pid=$(cat "$file")
    kill -TERM "$pid" 2>/dev/null || return 0
    for _ in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
}

up() {
    local addr=127.0.0.1 port="" size_gib=10 owner=""
    while [[ $# -gt 0 ]]; do
        case $1 in
        --addr) addr=$2; shift 2 ;;
        --port) port=$2; shift 2 ;;
        --size) size_gib=$2; shift 2 ;;
        --until-exit) owner=$2; shift 2 ;;
        *) usage ;;
        esac
    done
    for tool in ceph-mon ceph-osd ceph ceph-authtool monmaptool rbd; do
        command -v "$tool" >/dev/null || die "$tool is missing: run scripts/setup.sh (it installs ceph-mon, ceph-osd and ceph-common)"
    done
    [[ -e $dir/ceph.conf ]] && die "$dir already holds a cluster: scripts/ceph.sh down $dir first"
    [[ -n $port ]] || port=$(free_port "$addr")
    mkdir -p "$dir"/{mon.a,osd.0,run,log}
    chmod 0700 "$dir"
    dir=$(cd "$dir" && pwd)
    local fsid started
    fsid=$(cat /proc/sys/kernel/random/uuid)
    started=$(date +%s.%N)

    cat >"$dir/ceph.conf" <<EOF
[global]
fsid = $fsid
mon host = v2:$addr:$port
mon initial members = a
public network = $addr/32
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
keyring = $dir/keyring
run dir = $dir/run
admin socket = $dir/run/\$name.asok
log file = $dir/log/\$name.log
pid file = $dir/run/\$name.pid
# Only this cluster's daemons log here; keep what they print to errors.
log to stderr = false
err to stderr = true
# One OSD: one replica, placement across OSDs rather than hosts, no warning about it.
osd pool default size = 1
osd pool default min size = 1
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon warn on pool no redundancy = false
# Each osdmap change otherwise waits about 1 s for the next Paxos proposal.
paxos propose interval = 0.1
# A client killed with its image open keeps the image's exclusive lock until the OSD times its
# watch out (30 s by default), and the next client waits that long for the lock: a throw-away
# cluster whose clients are killed on purpose times them out after 5 s. Clients ping their
# watches every objecter tick (5 s by default), so the tick comes every second.
osd client watch timeout = 5
objecter tick interval = 1
# A PG may serve reads only within its read lease (osd heartbeat grace x this ratio: 16 s by
# default), renewed as it goes. An OSD stalled past its lease with reads in flight (a busy host
# stalls one for seconds) finds its PGs laggy, and Ceph 16 never re-checks a laggy PG with one
# OSD in it (tracker 80404): every read then waits for good. One OSD has no peer that could serve
# a stale read, so a lease of an hour costs nothing.
osd pool default read lease ratio = 180

[mon]
mon data = $dir/mon.\$id
mon allow pool delete = true

[osd]
osd data = $dir/osd.\$id
keyring = $dir/osd.\$id/keyring
osd objectstore = bluestore
bluestore block path = $dir/osd.\$id.block
bluestore block create = true
bluestore block size = $((size_gib << 30))
# Closing the block file otherwise waits 250 ms each time for the aio thread's poll.
bdev aio poll ms = 10
# A fresh store has nothing to check; the check costs seconds at mkfs.
bluestore fsck on mkfs = false
osd memory target = 1073741824

[client]
# librbd's write-around cache acknowledges writes before the OSD has them: off, so that an
# acknowledged write is on the OSD (what QEMU's cache.direct=on does too).
rbd cache = false
EOF

    # Keys: the monitor's, the admin client's and the OSD's, all known to the monitor at mkfs.
    ceph-authtool --create-keyring "$dir/keyring.mon" --gen-key -n mon. --cap mon 'allow *' >/dev/null
    ceph-authtool --create-keyring "$dir/keyring" --gen-key -n client.admin \
        --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' >/dev/null
    ceph-authtool --create-keyring "$dir/osd.0/keyring" --gen-key -n osd.0 \
        --cap mon 'allow profile osd' --cap mgr 'allow profile osd' --cap osd 'allow *' >/dev/null
    ceph-authtool "$dir/keyring.mon" --import-keyring "$dir/keyring" >/dev/null
    ceph-authtool "$dir/keyring.mon" --import-keyring "$dir/osd.0/keyring" >/dev/null
    monmaptool --create --fsid "$fsid" --addv a "[v2:$addr:$port]" "$dir/monmap" >/dev/null

    ceph-mon -c "$dir/ceph.conf" --mkfs -i a --monmap "$dir/monmap" --keyring "$dir/keyring.mon" \
        || die "ceph-mon --mkfs failed: see $dir/log/mon.a.log"
    ceph-mon -c "$dir/ceph.conf" -i a || die "ceph-mon did not start: see $dir/log/mon.a.log"

    # The OSD's store is made while the monitor starts (--no-mon-config: mkfs needs no monitor).
    local osd_uuid
    osd_uuid=$(cat /proc/sys/kernel/random/uuid)
    ceph-osd -c "$dir/ceph.conf" -i 0 --mkfs --osd-uuid "$osd_uuid" --no-mon-config \
        >"$dir/log/osd-mkfs.log" 2>&1 &
    local mkfs=$!
    local id
    id=$(ceph_cli osd new "$osd_uuid" 0) || die "the monitor at $addr:$port did not answer: see $dir/log/mon.a.log"
    [[ $id == 0 ]] || die "the monitor gave OSD id $id, expected 0"
    wait "$mkfs" || die "ceph-osd --mkfs failed: see $dir/log/osd-mkfs.log"
    start_osd

    ceph_cli osd pool create rbd 8 8 >/dev/null 2>&1
    # Without a manager, `rbd pool init` waits until the pool's placement groups are active.
    timeout 60 rbd -c "$dir/ceph.conf" pool init rbd || die "pool rbd did not become active: see $dir/log/osd.0.log"
    if [[ -n $owner ]]; then
        # Detached from our caller's pipes, so that it does not wait for this watcher.
        setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; exec "$2" down "$3"' \
            ceph-watch "$owner" "$(realpath "$0")" "$dir" </dev/null >/dev/null 2>&1 &
    fi
    local ended
    ended=$(date +%s.%N)
    printf 'ceph.sh: cluster up in %.1f s (mon %s:%s, pid %s; osd pid %s)\n' \
        "$(echo "$ended - $started" | bc)" "$addr" "$port" \
        "$(cat "$dir/run/mon.a.pid")" "$(cat "$dir/run/osd.0.pid")" >&2
    echo "$dir/ceph.conf"
}

down() {
    [[ -e $dir/ceph.conf ]] || die "$dir holds no cluster"
    stop_pid "$dir/run/osd.0.pid"
    stop_pid "$dir/run/mon.a.pid"
    if [[ -n ${CEPH_KEEP_LOGS:-} ]]; then
        mkdir -p "$CEPH_KEEP_LOGS" && cp -r "$dir/log" "$CEPH_KEEP_LOGS/$(basename "$dir")"
    fi
    rm -rf "$dir"
}

case $command in
up) up "$@" ;;
down) down ;;
stop-osd)
    pid_alive "$dir/run/osd.0.pid" || die "no OSD runs in $dir"
    kill -KILL "$(cat "$dir/run/osd.0.pid")"
    for _ in $(seq 100); do
        pid_alive "$dir/run/osd.0.pid" || exit 0
        sleep 0.05
    done
    die "the OSD in $dir outlived SIGKILL"
    ;;
start-osd)
    pid_alive "$dir/run/osd.0.pid" && die "the OSD in $dir runs already"
    start_osd
    ;;
pause-osd | resume-osd)
    pid_alive "$dir/run/osd.0.pid" || die "no OSD runs in $dir"
    if [[ $command == pause-osd ]]; then signal=STOP; else signal=CONT; fi
    kill -"$signal" "$(cat "$dir/run/osd.0.pid")"
    ;;
*) usage ;;
esac
