# Helpers for guest tests: daemon and QEMU lifetimes, initramfs per test, console
# markers, counters. Sourced by guest-tests/*.sh. Every wait is bounded; everything a
# test starts is ended by the EXIT trap, whatever happens. A failed test keeps its logs
# (consoles, daemon logs, counters) in its run directory; VNIC_KEEP_RUN=1 keeps them always.
# shellcheck shell=bash
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

VNIC_BIN=${VNIC_BIN:-$REPO_ROOT/target/release/dpaa-vnic}
# Boot timeout per guest; TCG on a loaded 2-core machine is slow.
GUEST_TIMEOUT=${GUEST_TIMEOUT:-120}
TEST_NAME=$(basename "$0" .sh)
# Inside the QEMU rootfs, so the chrooted QEMU sees the same paths under /vnic/run/...
RUN_DIR=$QEMU_ROOT/vnic/run/$TEST_NAME-$$
RUN_IN_CHROOT=/vnic/run/$TEST_NAME-$$
PIDS=()
NETNS=()
declare -A DAEMON_PID GUEST_PID

# bench_setup: what every scripts/bench-* does first: provision (idempotent), build the
# daemon, make the run directory, and pick the accelerator (VNIC_ACCEL, exported).
bench_setup() {
    "$REPO_ROOT/scripts/provision" >/dev/null
    log "building dpaa-vnic (release)"
    (cd "$REPO_ROOT" && cargo build --release --locked)
    setup_run
    VNIC_ACCEL=$("$REPO_ROOT/scripts/probe-accel")
    export VNIC_ACCEL
}

cleanup() {
    local rc=$?
    # Clean-up must run to the end even where a kill finds nothing left to kill.
    set +e
    local p d n
    # QEMU is a well-behaved frontend: any message of its that a daemon refused (policy.rs)
    # is a failure of the scenario, whatever else passed.
    if ((rc == 0)) && [[ -d $RUN_DIR ]]; then
        for d in "${!DAEMON_PID[@]}"; do
            kill -0 "${DAEMON_PID[$d]}" 2>/dev/null || continue
            n=$(timeout 5 "$VNIC_BIN" ctl --control "$RUN_DIR/$d.ctl" stats 2>/dev/null | python3 -c '
import json, sys
ports = json.load(sys.stdin)["ports"]
print(sum(p.get("frontend_refused", p.get("totals", {}).get("frontend_refused", 0)) for p in ports))' 2>/dev/null)
            if [[ -n $n && $n != 0 ]]; then
                echo "FAIL: daemon $d refused $n of QEMU's vhost-user messages" >&2
                rc=1
            elif [[ -n $n ]]; then
                log "ok: daemon $d refused none of QEMU's vhost-user messages"
            fi
        done
    fi
    # A failure's first clue is often in the daemon's counters (a drop, a refused frame):
    # read them from every daemon still running, before anything is stopped.
    if ((rc != 0)) && [[ -d $RUN_DIR ]]; then
        for d in "${!DAEMON_PID[@]}"; do
            kill -0 "${DAEMON_PID[$d]}" 2>/dev/null || continue
            timeout 5 "$VNIC_BIN" ctl --control "$RUN_DIR/$d.ctl" stats >"$RUN_DIR/$d-stats.json" 2>/dev/null \
                || rm -f "$RUN_DIR/$d-stats.json"
        done
    fi
    for p in "${PIDS[@]}"; do
        kill "$p" 2>/dev/null
    done
    for p in "${PIDS[@]}"; do
        # Bounded: escalate to SIGKILL after 5 s.
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$p" 2>/dev/null
    done
    for n in "${NETNS[@]}"; do ip netns del "$n" 2>/dev/null; done
    if ((rc != 0)) && [[ -d $RUN_DIR ]]; then
        log "$TEST_NAME failed; logs kept in $RUN_DIR"
        for f in "$RUN_DIR"/*.log; do
            [[ -f $f ]] || continue
            echo "----- $(basename "$f") (last 25 lines)" >&2
            tail -n 25 "$f" | sed 's/\x1b\[[0-9;?]*[a-zA-Z]//g' >&2
        done
        for f in "$RUN_DIR"/*-stats.json; do
            [[ -f $f ]] || continue
            echo "----- $(basename "$f" .json): each port's non-zero totals when the test failed" >&2
            python3 -c '
import json, sys
for p in json.load(open(sys.argv[1]))["ports"]:
    t = p.get("totals", {})
    print("port %s: %s" % (p["id"], " ".join("%s=%s" % (k, v) for k, v in t.items() if v)))
' "$f" >&2
        done
    elif [[ -n ${VNIC_KEEP_RUN:-} ]]; then
        log "VNIC_KEEP_RUN: logs kept in $RUN_DIR"
    else
        rm -rf "$RUN_DIR"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

setup_run() {
    [[ -x $VNIC_BIN ]] || die "$VNIC_BIN missing: build with cargo build --release"
    # Your own kernel (a path): prepared on first use, and again when the file changes.
    if [[ $VNIC_KERNEL == */* && ! ($GUEST_DIR/.kernel-ready -nt $VNIC_KERNEL && -f $GUEST_DIR/base.cpio) ]]; then
        "$REPO_ROOT/scripts/provision" || die "preparing kernel $VNIC_KERNEL failed"
    fi
    [[ -f $QEMU_ROOT/.vnic-ready && -f $GUEST_DIR/base.cpio ]] || die "guest assets missing: run scripts/provision"
    # A scenario run on its own after guest-tests/init or a guest tool changed: the base
    # initramfs again (nothing when it is up to date).
    VNIC_KERNEL=$VNIC_KERNEL GUEST_DIR=$GUEST_DIR "$REPO_ROOT/scripts/build-initramfs" || die "building the guest initramfs failed"
    mkdir -p "$RUN_DIR" "$QEMU_ROOT/vnic/guest/$KERNEL_KEY"
    cp -u "$GUEST_DIR/kernel" "$QEMU_ROOT/vnic/guest/$KERNEL_KEY/kernel"
}

# make_netns NAME: a network namespace for the test, removed on exit, IPv6 off so that
# only the test's own traffic moves the counters.
make_netns() {
    ip netns del "$1" 2>/dev/null || true
    ip netns add "$1"
    NETNS+=("$1")
    ip netns exec "$1" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
    ip netns exec "$1" ip link set lo up
}

# Placement as an orchestrator does it, for benchmarks that want it: VNIC_DAEMON_CPUS and
# VNIC_GUEST_CPUS (taskset lists, e.g. 1 and 0) pin the daemons and the QEMUs started after.
# Unset (the default), the scheduler places everything.
pinned() {
    [[ -n $1 ]] && echo "taskset -c $1"
    return 0
}

# start_daemon NAME NETNS|- ARGS...: starts dpaa-vnic; waits until its control socket answers.
start_daemon() {
    local name=$1 ns=$2; shift 2
    local pre=()
    read -r -a pre <<<"$(pinned "${VNIC_DAEMON_CPUS:-}")"
    [[ $ns != - ]] && pre+=(ip netns exec "$ns")
    RUST_LOG=${RUST_LOG:-info} "${pre[@]}" "$VNIC_BIN" "$@" --control "$RUN_DIR/$name.ctl" >>"$RUN_DIR/$name.log" 2>&1 &
    local pid=$!
    PIDS+=("$pid")
    DAEMON_PID[$name]=$pid
    wait_for 15 "daemon $name control socket" "$VNIC_BIN" ctl --control "$RUN_DIR/$name.ctl" stats \
        || die "daemon $name did not come up"
}

# stop_daemon NAME: SIGTERM, and a clean stop is required: exit status 0 within 10 s, and
# every thread ended in time (src/daemon.rs says which did not, and that fails the test).
stop_daemon() {
    local pid=${DAEMON_PID[$1]} rc=0
    kill -TERM "$pid"
    wait_for 10 "daemon $1 to exit" bash -c "! kill -0 $pid" || die "daemon $1 ignored SIGTERM"
    wait "$pid" 2>/dev/null || rc=$?
    ((rc == 0)) || die "daemon $1 exited with status $rc after SIGTERM"
    if grep -a -q "did not stop in time\|had panicked" "$RUN_DIR/$1.log"; then
        die "daemon $1 did not stop cleanly: $(grep -a "stopping:\|did not stop" "$RUN_DIR/$1.log" | head -5)"
    fi
}

# pair_script NET SELF PEER N: the guest script of one of two guests on a segment: address
# NET.SELF/24, reach NET.PEER, exchange N counted datagrams each way, report the counters.
pair_script() {
    cat <<GUEST
peer_listen $4
wait_carrier eth0 || exit 1
ip addr add $1.$2/24 dev eth0
retry 90 ping -c 1 -W 1 $1.$3 || exit 1
ping -c 5 -W 2 $1.$3 | tail -2
peer_exchange $1.$3 $4 || exit 1
report_stats eth0
GUEST
}

# ctl NAME SUBCOMMAND...: e.g. ctl d0 stats, ctl d0 action add SPEC
ctl() {
    local name=$1
    shift
    "$VNIC_BIN" ctl --control "$RUN_DIR/$name.ctl" "$@"
}

# daemon_counter DAEMON PORT COUNTER [QUEUE]: a port's total (or one queue's) counter.
daemon_counter() {
    ctl "$1" stats | python3 -c '
import json, sys
d = json.load(sys.stdin)
port, key = int(sys.argv[1]), sys.argv[2]
p = next(p for p in d["ports"] if p["id"] == port)
if len(sys.argv) > 3 and sys.argv[3] != "":
    print(p["queues"][int(sys.argv[3])][key])
else:
    print(p["totals"][key] if key in p["totals"] else p[key])
' "$2" "$3" "${4:-}"
}

# daemon_mcast_digest DAEMON [PORT]: "md5 count" of a guest port's multicast table, in the
# notation of the guest's /proc/net/dev_mcast (see mcast_snapshot in guest-tests/init).
daemon_mcast_digest() {
    ctl "$1" filter | python3 -c '
import hashlib, json, sys
m = json.load(sys.stdin)["ports"][int(sys.argv[1])]["multicast"]
lines = sorted(a.replace(":", "") for a in m)
print(hashlib.md5("".join(l + "\n" for l in lines).encode()).hexdigest(), len(lines))' "${2:-0}"
}

# converge_mcast DAEMON WHAT GUEST_DIGEST: a guest applies its rx mode from deferred work,
# so give the daemon's multicast table up to 10 s to reach the digest the guest printed
# (mcast_snapshot). Leaves the daemon's entry count in DCOUNT.
converge_mcast() {
    local daemon=$1 what=$2 want=$3 got=""
    for _ in $(seq 100); do
        read -r got DCOUNT < <(daemon_mcast_digest "$daemon")
        [[ $got == "$want" ]] && break
        sleep 0.1
    done
    expect_eq "$what (daemon has $DCOUNT)" "$got" "$want"
}

# make_initrd NAME: base initramfs + this test's guest script (read from stdin) as /test.sh.
make_initrd() {
    local name=$1 d
    d=$(mktemp -d)
    cat >"$d/test.sh"
    (cd "$d" && echo test.sh | busybox cpio -o -H newc 2>/dev/null) >"$d/test.cpio"
    python3 - "$GUEST_DIR/base.cpio" "$d/test.cpio" "$RUN_DIR/$name.cpio" <<'PY'
import sys
base = open(sys.argv[1], "rb").read()
# The kernel reads concatenated newc archives; the second must start 512-byte aligned.
pad = (-len(base)) % 512
open(sys.argv[3], "wb").write(base + b"\0" * pad + open(sys.argv[2], "rb").read())
PY
    rm -rf "$d"
}

# accel_args [VCPUS]: kvm only where a probe boot succeeds (DESIGN: the paravirtual KVM here
# cannot run the guest kernel); cached for the run in VNIC_ACCEL. Under TCG, a guest with
# more vCPUs than the host has CPUs runs them in one thread, round robin (thread=single):
# with a thread per vCPU (MTTCG) the host preempts vCPUs half-way through the guest
# kernel's cross-CPU code patching (jump labels, int3 first), which the 7.3 kernel can die
# on at boot; in one thread, round robin, every vCPU sees each change at once.
accel_args() {
    local vcpus=${1:-1}
    case ${VNIC_ACCEL:-tcg} in
        kvm) echo "-accel kvm -cpu host" ;;
        *)
            if ((vcpus > $(nproc))); then
                echo "-accel tcg,thread=single -cpu max"
            else
                echo "-accel tcg -cpu max"
            fi
            ;;
    esac
}

# start_guest NAME MODE SOCKET_NAME INITRD_NAME [QUEUES] [MAC] [EXTRA_CHARDEV_OPTS]
#   MODE: net (-netdev vhost-user) or device (vhost-user-test-device-pci), or qemu-tap:
#   QEMU's own virtio-net on a tap named SOCKET_NAME, a baseline without dpaa-vnic (QEMU then
#   runs in the namespace GUEST_NETNS, where it creates the tap), or net+device or
#   device+net: one NIC of each attachment, the one named first first on the PCI bus,
#   SOCKET_NAME being "NET_SOCKET,DEVICE_SOCKET" (one queue pair each; the net NIC has MAC,
#   the device NIC the one its daemon serves). GUEST_EXTRA_ARGS are added to QEMU's command
#   line (paths inside the QEMU root: $RUN_IN_CHROOT/...).
# Ring size of the device attachment's queues (QEMU's test device defaults to 64, where
# virtio-net-pci has 256): VNIC_VQ_SIZE, by default 256 as virtio-net-pci (a ring of 64
# overflows sooner under bursts to the guest).
VNIC_VQ_SIZE=${VNIC_VQ_SIZE:-256}
start_guest() {
    local name=$1 mode=$2 sock=$3 initrd=$4 queues=${5:-1} mac=${6:-52:54:00:d0:aa:01} chopts=${7:-}
    local smp=$queues nic
    local net_nic="-netdev vhost-user,id=n0,chardev=c0,queues=$queues -device virtio-net-pci,id=nic0,netdev=n0,mac=$mac,romfile=${GUEST_NIC_OPTS:+,$GUEST_NIC_OPTS}"
    local device_nic="-device vhost-user-test-device-pci,chardev=CHARDEV,virtio-id=1,num_vqs=$((2 * queues + 1)),config_size=24,vq_size=$VNIC_VQ_SIZE"
    case $mode in
        net)
            nic=$net_nic
            ((queues > 1)) && nic+=",mq=on,vectors=$((2 * queues + 2))"
            ;;
        device)
            nic=${device_nic/CHARDEV/c0}
            ;;
        net+device | device+net)
            ((queues == 1)) || die "$mode takes one queue pair"
            [[ $sock == *,* ]] || die "$mode wants NET_SOCKET,DEVICE_SOCKET, got '$sock'"
            local second="-chardev socket,id=c1,path=$RUN_IN_CHROOT/${sock#*,} ${device_nic/CHARDEV/c1}"
            if [[ $mode == net+device ]]; then nic="$net_nic $second"; else nic="$second $net_nic"; fi
            sock=${sock%%,*}
            ;;
        qemu-tap)
            ensure_chroot_tun
            nic="-netdev tap,id=n0,ifname=$sock,script=no,downscript=no,vhost=off -device virtio-net-pci,netdev=n0,mac=$mac,romfile="
            ;;
        *) die "unknown attachment $mode" ;;
    esac
    local chardev=(-chardev "socket,id=c0,path=$RUN_IN_CHROOT/$sock$chopts") pre=()
    read -r -a pre <<<"$(pinned "${VNIC_GUEST_CPUS:-}")"
    [[ $mode == qemu-tap ]] && chardev=() && pre+=(ip netns exec "$GUEST_NETNS")
    # shellcheck disable=SC2046,SC2086
    timeout "$GUEST_TIMEOUT" "${pre[@]}" chroot "$QEMU_ROOT" qemu-system-x86_64 $(accel_args "$smp") -m 256 -smp "$smp" \
        -nographic -no-reboot -nodefaults -serial stdio \
        -machine q35,memory-backend=mem -object memory-backend-memfd,id=mem,size=256M,share=on \
        -kernel "/vnic/guest/$KERNEL_KEY/kernel" -initrd "$RUN_IN_CHROOT/$initrd.cpio" \
        -append "console=ttyS0 quiet panic=-1 vnic.name=$name" \
        "${chardev[@]}" $nic ${GUEST_EXTRA_ARGS:-} \
        </dev/null >"$RUN_DIR/$name.log" 2>&1 &
    local pid=$!
    PIDS+=("$pid")
    GUEST_PID[$name]=$pid
}

# The chrooted QEMU opens /dev/net/tun inside its root for the qemu-tap baseline.
ensure_chroot_tun() {
    [[ -e $QEMU_ROOT/dev/net/tun ]] && return
    mkdir -p "$QEMU_ROOT/dev/net"
    mknod -m 0666 "$QEMU_ROOT/dev/net/tun" c 10 200
}

# wait_console NAME PATTERN TIMEOUT: waits for PATTERN (grep -E) on the guest's console.
wait_console() {
    wait_for "$3" "'$2' on $1's console" grep -qE "$2" "$RUN_DIR/$1.log"
}

# wait_guest NAME: waits for the guest to power off; fails unless its test script said 0.
wait_guest() {
    local pid=${GUEST_PID[$1]}
    wait "$pid" || { log "guest $1: QEMU exited with $? (124: timeout)"; return 1; }
    grep -q "VNIC-RESULT 0" "$RUN_DIR/$1.log" || { log "guest $1: test script failed"; return 1; }
}

# guest_stat NAME IFACE FIELD: from the guest's last VNIC-STATS line.
guest_stat() {
    grep -a "VNIC-STATS $2 " "$RUN_DIR/$1.log" | tail -1 | tr ' ' '\n' | tr -d '\r' | awk -F= -v k="$3" '$1 == k {print $2}'
}

# elapsed_since T0: seconds since a `date +%s.%N` stamp, two decimals.
elapsed_since() {
    awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'
}

# expect_eq WHAT GOT WANT
expect_eq() {
    if [[ $2 != "$3" ]]; then
        log "FAIL: $1: got '$2', want '$3'"
        return 1
    fi
    log "ok: $1 = $2"
}

# expect_ge WHAT GOT MIN
expect_ge() {
    if ! [[ $2 =~ ^[0-9]+$ ]] || (($2 < $3)); then
        log "FAIL: $1: got '$2', want >= $3"
        return 1
    fi
    log "ok: $1 = $2 (>= $3)"
}

# expect_le WHAT GOT MAX: for decimals (seconds).
expect_le() {
    if ! awk -v g="$2" -v m="$3" 'BEGIN { exit !(g ~ /^[0-9.]+$/ && g + 0 <= m + 0) }'; then
        log "FAIL: $1: got '$2', want <= $3"
        return 1
    fi
    log "ok: $1 = $2 (<= $3)"
}

# compare_counters GUEST DAEMON PORT: the daemon's view of a guest port equals the guest's own.
compare_counters() {
    local g=$1 d=$2 port=$3
    expect_eq "$g tx_packets (daemon vs guest)" "$(daemon_counter "$d" "$port" tx_packets)" "$(guest_stat "$g" eth0 tx_packets)"
    expect_eq "$g rx_packets (daemon vs guest)" "$(daemon_counter "$d" "$port" rx_packets)" "$(guest_stat "$g" eth0 rx_packets)"
    expect_eq "$g tx_bytes (daemon vs guest)" "$(daemon_counter "$d" "$port" tx_bytes)" "$(guest_stat "$g" eth0 tx_bytes)"
    expect_eq "$g rx_bytes (daemon vs guest)" "$(daemon_counter "$d" "$port" rx_bytes)" "$(guest_stat "$g" eth0 rx_bytes)"
}

# compare_counters_within GUEST DAEMON PORT SLACK: as compare_counters, for packets only,
# allowing the daemon up to SLACK more each way: for a daemon that keeps talking to the
# guest on its own (the snoop querier's general queries, and the guest's answers) until
# the guest powers off, after the guest's last look at its counters.
compare_counters_within() {
    local g=$1 d=$2 port=$3 slack=$4 k dv gv
    for k in tx_packets rx_packets; do
        dv=$(daemon_counter "$d" "$port" $k)
        gv=$(guest_stat "$g" eth0 $k)
        if ! [[ $dv =~ ^[0-9]+$ && $gv =~ ^[0-9]+$ ]] || ((dv < gv || dv - gv > slack)); then
            log "FAIL: $g $k: daemon $dv, guest $gv (allowed: daemon 0..$slack more)"
            return 1
        fi
        log "ok: $g $k daemon $dv, guest $gv (within $slack)"
    done
}

HOST_UDP=$CACHE_DIR/host/vnic-udp
HOST_TCP=$CACHE_DIR/host/vnic-tcp
