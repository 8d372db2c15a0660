#!/usr/bin/env bash
# Per vCPU, through the router and a checksum action at once, in both attachments. Guest A
# has 4 vCPUs and 4 queue pairs; its XPS map puts vCPU n on TX queue n and its RX
# interrupts follow. One UDP sender is pinned to each vCPU, all four at once, to guest B on
# another subnet, through dpaa-vnic's router, with an ingress checksum action on A's port.
#
# A virtio queue carries no CPU number, so the daemon sees vCPU n only as the traffic of
# queue n; the guest prints its XPS map, the host checks it and tells the daemon
# (ctl queue-cpus), and ctl stats shows each queue's CPUs beside its counters. A Linux per-CPU route cache
# becomes here one cache per queue worker (docs/pipeline.md). What shows that each queue's
# worker kept its own cache, and that no other queue's traffic emptied it:
# - every queue counted its own sender's datagrams (tx, routed, checksums rewritten);
# - every queue resolved B exactly once through its own cache: misses minus the misses
#   that found B's address not yet resolved equal 1, and the rest were hits. A cache shared
#   between queues would leave the queues after the first with no miss at all; a cache
#   emptied by another queue's traffic would miss again.
# TCG runs the 4 vCPUs on this machine's 2 CPUs: they take turns, which is enough for the
# queue a datagram takes, the only thing checked here.
# vnic-kernels: bookworm trixie-bpo
set -euo pipefail
source "$(dirname "$0")/../scripts/guest-lib.sh"
setup_run

N=400
CPUS=4

make_initrd a <<GUEST
wait_carrier eth0 || exit 1
ip addr add 10.1.0.2/24 dev eth0
ip route add default via 10.1.0.1
queue_per_cpu eth0 $CPUS || exit 1
# The warm-up pings from vCPU 0 (queue 0): B answers through the router, so both
# neighbours are resolved before the senders start.
retry 30 taskset 1 ping -c 1 -W 1 10.1.0.1 || exit 1
retry 90 taskset 1 ping -c 1 -W 1 10.2.0.2 || exit 1
cpu=0 senders=
while [ \$cpu -lt $CPUS ]; do
    taskset \$((1 << cpu)) vnic-udp send 10.2.0.2 6001 $N 200 400 \$((7000 + cpu)) &
    senders="\$senders \$!"
    cpu=\$((cpu + 1))
done
fail=0
for p in \$senders; do wait \$p || fail=1; done
[ \$fail = 0 ] || exit 1
report_stats eth0
GUEST

make_initrd b <<GUEST
vnic-udp recv 6001 $((CPUS * N)) 240 >/tmp/recv.txt &
recv=\$!
wait_carrier eth0 || exit 1
ip addr add 10.2.0.2/24 dev eth0
ip route add default via 10.2.0.1
retry 30 ping -c 1 -W 1 10.2.0.1 || exit 1
wait \$recv || { cat /tmp/recv.txt; exit 1; }
cat /tmp/recv.txt
report_stats eth0
GUEST

# queue_counter D QUEUE COUNTER: port 0's counter on one queue, from daemon D's last snapshot.
queue_counter() {
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["ports"][0]["queues"][int(sys.argv[2])][sys.argv[3]])' \
        "$RUN_DIR/stats-$1.json" "$2" "$3"
}

for mode in net device; do
    d=r-$mode
    start_daemon $d - --socket "$RUN_DIR/a-$mode.sock" --socket "$RUN_DIR/b-$mode.sock" --queues $CPUS \
        --router-ip 0=10.1.0.1/24 --router-ip 1=10.2.0.1/24 \
        --csum-action port=0,dir=ingress,update=iph+udp
    start_guest gb-$mode net b-$mode.sock b 1 52:54:00:d0:aa:02
    start_guest ga-$mode $mode a-$mode.sock a $CPUS
    wait_console ga-$mode "VNIC-XPS tx-$((CPUS - 1))" "$GUEST_TIMEOUT" || exit 1
    # The guest's XPS map, as it printed it, told to the daemon for ctl stats (a queue
    # carries no CPU number): tx-N's mask as a CPU list.
    map=$(grep -a -o "VNIC-XPS tx-[0-9]* [0-9a-f,]*" "$RUN_DIR/ga-$mode.log" | tr -d ',' | python3 -c '
import sys
for line in sys.stdin:
    _, q, mask = line.split()
    cpus = [str(c) for c in range(64) if int(mask, 16) >> c & 1]
    print(q[3:] + "=" + ",".join(cpus), end=" ")')
    # shellcheck disable=SC2086
    ctl $d queue-cpus 0 $map >/dev/null
    if [[ $mode == device ]]; then
        # The driver's VQ_PAIRS_SET, read while it runs (a disconnect resets it).
        expect_eq "device: active queue pairs (the driver's VQ_PAIRS_SET)" \
            "$(ctl $d filter | python3 -c 'import json,sys; print(json.load(sys.stdin)["ports"][0]["active_queue_pairs"])')" "$CPUS"
    fi
    wait_guest ga-$mode
    wait_guest gb-$mode
    compare_counters ga-$mode $d 0
    compare_counters gb-$mode $d 1
    for q in $(seq 0 $((CPUS - 1))); do
        line=$(grep -a -o "VNIC-XPS tx-$q [0-9a-f,]* irq [0-9a-z]*" "$RUN_DIR/ga-$mode.log" | tr -d ',')
        # The guest's own map: vCPU n sends on TX queue n (mask 1 << n).
        expect_eq "$mode: guest A's XPS mask of tx-$q" "$(awk '{print $3}' <<<"$line" | sed 's/^0*//')" "$(printf '%x' $((1 << q)))"
        # Its RX interrupts follow where the queue has a vector of its own: QEMU's
        # virtio-net-pci has one per queue; vhost-user-test-device-pci has no MSI-X vectors
        # to set (one shared INTx line), so there only XPS is set.
        if [[ $mode == net ]]; then
            expect_eq "$mode: guest A's input.$q interrupt found and pinned" "$(awk '{print $5 != "none"}' <<<"$line")" 1
        fi
    done
    ctl $d stats >"$RUN_DIR/stats-$d.json"
    for q in $(seq 0 $((CPUS - 1))); do
        expect_eq "$mode: ctl stats: queue $q's CPUs, from the guest's XPS map" "$(queue_counter $d "$q" cpus)" "$q"
        expect_ge "$mode: queue $q: frames from vCPU $q" "$(queue_counter $d "$q" tx_packets)" "$N"
        expect_ge "$mode: queue $q: routed" "$(queue_counter $d "$q" routed)" "$N"
        expect_ge "$mode: queue $q: checksums rewritten by the ingress action" "$(queue_counter $d "$q" csum_updated)" "$N"
        expect_eq "$mode: queue $q: checksum action failures" "$(queue_counter $d "$q" csum_failed)" 0
        miss=$(queue_counter $d "$q" route_cache_miss)
        unresolved=$(queue_counter $d "$q" route_unresolved)
        hit=$(queue_counter $d "$q" route_cache_hit)
        expect_eq "$mode: queue $q: B resolved once by this queue's own cache (misses $miss, unresolved $unresolved)" \
            "$((miss - unresolved))" 1
        expect_ge "$mode: queue $q: route cache hits" "$hit" "$((N - 1))"
        printf 'REPORT per-vcpu %s: queue %s (vCPU %s): %s routed, route cache %s hits / %s misses, %s checksums rewritten\n' \
            "$mode" "$q" "$q" "$(queue_counter $d "$q" routed)" "$hit" "$miss" "$(queue_counter $d "$q" csum_updated)" \
            | tee -a "$RUN_DIR/../reports.txt"
    done
    stop_daemon $d
done
