#!/usr/bin/env bash
# Two queue pairs, one worker thread each: a 2-vCPU guest sends from each CPU (XPS puts
# CPU n on TX queue n) and the host sends 16 flows through a multi-queue tap (the kernel
# spreads them over the tap's queues, which map onto the guest's RX queues). Both queues of
# both directions must carry traffic, in both attachments, and the totals match the guest.
set -euo pipefail
source "$(dirname "$0")/../scripts/guest-lib.sh"
setup_run

N=200
FLOWS=16
make_initrd guest <<GUEST
wait_carrier eth0 || exit 1
ip addr add 10.99.0.2/24 dev eth0
echo "VNIC: \$(ls -d /sys/class/net/eth0/queues/tx-* | wc -l) tx queues"
ping -c 2 -W 2 10.99.0.1 >/dev/null || exit 1
taskset 1 vnic-udp send 10.99.0.1 6001 $N 100 1000 || exit 1
taskset 2 vnic-udp send 10.99.0.1 6001 $N 100 1000 || exit 1
vnic-udp recv 6002 $((N * FLOWS / 8)) 90 || exit 1
report_stats eth0
GUEST

for mode in net device; do
    ns=vnic-mq-$mode-$$
    make_netns "$ns"
    start_daemon d-$mode "$ns" --queues 2 --socket "$RUN_DIR/$mode.sock" --tap vtap0
    ip netns exec "$ns" ip addr add 10.99.0.1/24 dev vtap0
    ip netns exec "$ns" ip link set vtap0 up
    ip netns exec "$ns" "$HOST_UDP" recv 6001 $((2 * N)) 120 >"$RUN_DIR/host-recv-$mode.log" 2>&1 &
    PIDS+=($!)
    hostrecv=$!
    start_guest g-$mode $mode $mode.sock guest 2
    wait_console g-$mode "listening 6002" "$GUEST_TIMEOUT" || exit 1
    if [[ $mode == device ]]; then
        # The driver enables both pairs through the control queue's VQ_PAIRS_SET.
        pairs=$(ctl d-$mode filter | python3 -c 'import json,sys; print(json.load(sys.stdin)["ports"][0]["active_queue_pairs"])')
        expect_eq "device: active queue pairs set by the driver" "$pairs" 2
    fi
    # Each sender uses its own source port, so each is its own flow for the tap's hash.
    for f in $(seq $FLOWS); do
        ip netns exec "$ns" "$HOST_UDP" send 10.99.0.2 6002 $((N / 8)) 100 200 >/dev/null &
        PIDS+=($!)
    done
    wait_guest g-$mode
    wait "$hostrecv" || { log "host: $(cat "$RUN_DIR/host-recv-$mode.log")"; exit 1; }
    for q in 0 1; do
        expect_ge "$mode: tx_packets on queue $q" "$(daemon_counter d-$mode 0 tx_packets $q)" 1
        expect_ge "$mode: rx_packets on queue $q" "$(daemon_counter d-$mode 0 rx_packets $q)" 1
    done
    compare_counters g-$mode d-$mode 0
    stop_daemon d-$mode
done
