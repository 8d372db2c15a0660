#!/usr/bin/env bash
# The two seeds' experiments in their own form, in one 4-vCPU guest per daemon, each "after"
# against its "before" in the same daemon binary, alternating round by round:
#   per-queue  the defaults: a route cache per queue worker, lockless checksum actions;
#   shared     --route-cache shared: one locked route cache for every worker (the shared
#              cached route Linux replaced by nh_pcpu_rth_output);
#   locked     --csum-rules locked: each port's actions under one lock, with statistics
#              every worker writes (act_csum before it went lockless).
# Guest A (4 vCPUs, 4 queue pairs, net attachment; XPS puts vCPU n on queue n) reaches the
# tap's namespace (10.2.0.2) through dpaa-vnic's router. Port 0's ingress has two checksum
# actions: iph+udp with verdict=drop for 10.2.0.3, iph+udp passing everything else.
#   route: N = 4, 8, 24 concurrent UDP floods (udpflood-style, sender i on vCPU i mod 4)
#          share TOTAL datagrams of 60-byte frames to 10.2.0.2; the guest times each N;
#   csum:  T = 1, 2, 4 flood threads (pktgen-style: one per vCPU, each on its own queue)
#          send PER datagrams each, to 10.2.0.2 (the pass verdict) or 10.2.0.3 (drop).
# What is checked, in every daemon: each action counted exactly what it was sent (matched,
# passed, dropped), every routed datagram was routed, each queue carried its vCPU's
# floods, and each mode is really in force: per queue, every queue resolved 10.2.0.2 once
# in its own cache; shared, the one cache resolved it once for all queues.
# What is measured: the guest's time per phase, and the daemon's CPU time per frame over
# the whole run. TCG runs the 4 vCPUs in one host thread (scripts/guest-lib.sh), which
# bounds how fast the guest sends: the guest's times compare the modes as a guest sees
# them, the daemon's CPU per frame what each mode costs the host (docs/performance.md,
# "The seeds' experiments", says what both showed here).
# Env: VNIC_SEEDS_ROUNDS (1); VNIC_SEEDS_MODES (per-queue shared locked);
#      VNIC_SEEDS_POLL=N (the daemon in poll mode with N threads; what it spends per frame
#      is then its poll threads' busy time); VNIC_SEEDS_CSV (also write the rows there);
#      VNIC_SEEDS_PLOT=PREFIX (the medians as PREFIX-route.csv and PREFIX-csum.csv, drawn
#      by scripts/plot as .svg and .png).
# vnic-kernels: bookworm trixie-bpo
set -euo pipefail
source "$(dirname "$0")/../scripts/guest-lib.sh"
setup_run

CPUS=4
TOTAL=48000
PER=12000
ROUNDS=${VNIC_SEEDS_ROUNDS:-1}
POLL=${VNIC_SEEDS_POLL:-0}
read -r -a MODES <<<"${VNIC_SEEDS_MODES:-per-queue shared locked}"
CSV=$RUN_DIR/seeds.csv

make_initrd a <<GUEST
wait_carrier eth0 || exit 1
ip addr add 10.1.0.2/24 dev eth0
ip route add default via 10.1.0.1
queue_per_cpu eth0 $CPUS || exit 1
# Both next hops resolved from vCPU 0 (queue 0) before anything is timed.
retry 30 taskset 1 ping -c 1 -W 1 10.1.0.1 || exit 1
retry 90 taskset 1 ping -c 1 -W 1 10.2.0.2 || exit 1
# Centiseconds since boot.
cs() { read up _ </proc/uptime; echo \${up%.*}\${up#*.}; }
# flood DST SENDERS EACH: SENDERS concurrent floods of EACH datagrams, sender i on vCPU
# i mod $CPUS; prints the centiseconds from the first start to the last end.
flood() {
    local i=0 pids= t0
    t0=\$(cs)
    while [ \$i -lt \$2 ]; do
        taskset \$((1 << (i % $CPUS))) vnic-udp send \$1 6001 \$3 18 0 \$((7000 + i)) >/dev/null &
        pids="\$pids \$!"
        i=\$((i + 1))
    done
    for p in \$pids; do wait \$p || return 1; done
    echo \$((\$(cs) - t0))
}
# Each phase after a mark and a second's pause, in which the host reads the daemon's CPU
# time and frames; a last mark after the last phase.
i=0
# A datagram the guest's own queue had no room for is dropped there and counted in
# SndbufErrors (sendto still succeeds): each phase says how many, and the host expects
# the rest.
sndbuf_errors() { awk '/^Udp: [0-9]/ {print \$7}' /proc/net/snmp; }
phase() {
    echo "VNIC-SEED-MARK \$i"
    sleep 1
    e0=\$(sndbuf_errors)
    c=\$(flood \$3 \$2 \$4) || exit 1
    echo "VNIC-SEED \$1 \$2 \$c \$((\$(sndbuf_errors) - e0))"
    i=\$((i + 1))
}
for n in 4 8 24; do phase route \$n 10.2.0.2 \$(($TOTAL / n)); done
for t in 1 2 4; do phase csum-pass \$t 10.2.0.2 $PER; done
for t in 1 2 4; do phase csum-drop \$t 10.2.0.3 $PER; done
echo "VNIC-SEED-MARK \$i"
sleep 1
report_stats eth0
GUEST

# daemon_ns DAEMON PID: what the daemon spent so far, in ns: its poll threads' busy time in
# poll mode (TSC-timed visits that found frames), else the CPU time of all its threads.
daemon_ns() {
    if ((POLL)); then
        ctl "$1" stats | python3 -c 'import json,sys; print(sum(t["busy_ns"] for t in json.load(sys.stdin)["poll_threads"]))'
    else
        cat /proc/"$2"/task/*/schedstat | awk '{ns += $1} END {printf "%.0f", ns}'
    fi
}

echo "round,mode,experiment,x,centiseconds,daemon_ns,frames,guest_dropped" >"$CSV"
run_mode() {
    local mode=$1 round=$2 d=d-$1-$2 ns=vnic-seeds-$1-$2-$$ extra=()
    ((POLL)) && extra=(--poll "$POLL")
    case $mode in
        shared) extra+=(--route-cache shared) ;;
        locked) extra+=(--csum-rules locked) ;;
    esac
    make_netns "$ns"
    start_daemon $d "$ns" --socket "$RUN_DIR/$d.sock" --tap vtap0 --queues $CPUS \
        --router-ip 0=10.1.0.1/24 --router-ip 1=10.2.0.1/24 \
        --csum-action port=0,dir=ingress,update=iph+udp,dst=10.2.0.3/32,verdict=drop \
        --csum-action port=0,dir=ingress,update=iph+udp "${extra[@]}"
    ip netns exec "$ns" ip addr add 10.2.0.2/24 dev vtap0
    ip netns exec "$ns" ip link set vtap0 up
    ip netns exec "$ns" ip route add 10.1.0.0/24 via 10.2.0.1
    # A socket that takes the floods and never reads: the host's stack drops what overflows
    # it, and answers no port-unreachable.
    ip netns exec "$ns" python3 -c 'import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("10.2.0.2", 6001)); time.sleep(3600)' &
    local sink=$!
    PIDS+=("$sink")
    start_guest g-$d net $d.sock a $CPUS
    # At each mark: the daemon's CPU time (all its threads, ns) and port 0's frames so far.
    local pid=${DAEMON_PID[$d]} i marks=()
    for i in $(seq 0 9); do
        wait_console g-$d "VNIC-SEED-MARK $i" "$GUEST_TIMEOUT" || exit 1
        marks+=("$(daemon_ns $d "$pid") $(daemon_counter $d 0 tx_packets)")
    done
    wait_guest g-$d
    # Phase i ran between marks i and i + 1.
    i=0
    local sent_pass=0 sent_drop=0 sent lost_all=0
    while read -r _ experiment x centis lost; do
        read -r ns0 f0 <<<"${marks[$i]}"
        read -r ns1 f1 <<<"${marks[$((i + 1))]}"
        echo "$round,$mode,$experiment,$x,$centis,$((ns1 - ns0)),$((f1 - f0)),$lost" >>"$CSV"
        if [[ $experiment == route ]]; then sent=$TOTAL; else sent=$((x * PER)); fi
        sent=$((sent - lost))
        lost_all=$((lost_all + lost))
        if [[ $experiment == csum-drop ]]; then
            sent_drop=$((sent_drop + sent))
        else
            sent_pass=$((sent_pass + sent))
        fi
        i=$((i + 1))
    done < <(grep -a -o "VNIC-SEED [a-z-]* [0-9]* [0-9]* [0-9]*" "$RUN_DIR/g-$d.log")
    expect_eq "$mode: phases the guest timed" "$i" 9
    compare_counters g-$d $d 0

    read -r dm dp dd pm pp pd < <(ctl $d action list | python3 -c '
import json, sys
c = json.load(sys.stdin)["counts"]
print(*(c[i][k] for i in (0, 1) for k in ("matched", "passed", "dropped")))')
    expect_eq "$mode: drop action: matched, passed, dropped" "$dm $dp $dd" "$sent_drop 0 $sent_drop"
    expect_ge "$mode: pass action: passed" "$pp" "$sent_pass"
    expect_eq "$mode: pass action: matched = passed, none dropped" "$pm $pd" "$pp 0"
    expect_ge "$mode: routed from port 0" "$(daemon_counter $d 0 routed)" "$sent_pass"
    local q own total_own=0
    for q in $(seq 0 $((CPUS - 1))); do
        expect_ge "$mode: queue $q carried its vCPU's floods" \
            "$(daemon_counter $d 0 tx_packets "$q")" \
            "$((3 * TOTAL / CPUS - lost_all))"
        # The queue's route cache misses that found 10.2.0.2 resolved.
        own=$(($(daemon_counter $d 0 route_cache_miss "$q") - $(daemon_counter $d 0 route_unresolved "$q")))
        total_own=$((total_own + own))
        if [[ $mode != shared ]]; then
            expect_eq "$mode: queue $q resolved 10.2.0.2 once, in its own cache" "$own" 1
        fi
    done
    if [[ $mode == shared ]]; then
        expect_eq "shared: the one cache resolved 10.2.0.2 once for all queues" "$total_own" 1
    fi
    stop_daemon $d
    kill "$sink" 2>/dev/null || true
}

for round in $(seq "$ROUNDS"); do
    for mode in "${MODES[@]}"; do
        log "round $round of $ROUNDS: $mode"
        run_mode "$mode" "$round"
    done
done
[[ -n ${VNIC_SEEDS_CSV:-} ]] && cp "$CSV" "$VNIC_SEEDS_CSV"

# The tables: medians over the rounds, and each "after" against its "before".
python3 - "$CSV" "$TOTAL" "$PER" "${VNIC_SEEDS_PLOT:-}" <<'PY' | tee -a "$RUN_DIR/../reports.txt"
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
total, per, plot = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def med(mode, experiment, x):
    """Median guest seconds and daemon ns per frame of one phase over the rounds."""
    rs = [r for r in rows if (r["mode"], r["experiment"], r["x"]) == (mode, experiment, x)]
    if not rs:
        return None
    return (statistics.median(int(r["centiseconds"]) / 100 for r in rs),
            statistics.median(int(r["daemon_ns"]) / max(int(r["frames"]), 1) for r in rs))
route, csum = [], []
for n in ("4", "8", "24"):
    if not (med("per-queue", "route", n) and med("shared", "route", n)):
        break
    (a, an), (b, bn) = med("per-queue", "route", n), med("shared", "route", n)
    route += [("per-queue", n, a), ("shared", n, b)]
    print(f"REPORT seeds route cache, {n:>2} floods of {total} datagrams: guest {a:.2f} s per-queue, "
          f"{b:.2f} s shared ({b / a:.2f}x); daemon {an:.0f} ns/frame per-queue, {bn:.0f} shared ({bn / an:.2f}x)")
for v in ("pass", "drop"):
    for t in ("1", "2", "4"):
        if not (med("per-queue", "csum-" + v, t) and med("locked", "csum-" + v, t)):
            break
        (a, an), (b, bn) = med("per-queue", "csum-" + v, t), med("locked", "csum-" + v, t)
        rate = lambda s: int(t) * per / s
        csum += [("lockless", v, t, rate(a)), ("locked", v, t, rate(b))]
        print(f"REPORT seeds csum {v}, {t} thread(s): guest {rate(a):.0f} pps lockless, {rate(b):.0f} locked "
              f"({rate(a) / rate(b):.2f}x); daemon {an:.0f} ns/frame lockless, {bn:.0f} locked ({bn / an:.2f}x)")
if plot:
    with open(plot + "-route.csv", "w") as f:
        f.write("route cache,concurrent floods,seconds for all datagrams\n")
        f.writelines(f"{m},{n},{s:.2f}\n" for m, n, s in route)
    with open(plot + "-csum.csv", "w") as f:
        f.write("checksum rules,verdict,flood threads,datagrams per second\n")
        f.writelines(f"{m},{v},{t},{r:.0f}\n" for m, v, t, r in csum)
PY
if [[ -n ${VNIC_SEEDS_PLOT:-} ]]; then
    "$REPO_ROOT/scripts/plot" "$VNIC_SEEDS_PLOT-route.csv" "$VNIC_SEEDS_PLOT-route" "Route cache: floods through the router ($(date +%Y-%m-%d))"
    "$REPO_ROOT/scripts/plot" "$VNIC_SEEDS_PLOT-csum.csv" "$VNIC_SEEDS_PLOT-csum" "Checksum action: flood threads ($(date +%Y-%m-%d))"
fi
