#!/usr/bin/env bash
# A guest on dpaa-vnic reaches the host through a tap inside a network namespace, in both
# QEMU attachments: link up, ping, 500 counted UDP datagrams each way; the daemon's
# counters equal the guest's own.
set -euo pipefail
source "$(dirname "$0")/../scripts/guest-lib.sh"
setup_run

N=500
make_initrd guest <<GUEST
wait_carrier eth0 || { echo "VNIC: no carrier"; exit 1; }
ip addr add 10.77.0.2/24 dev eth0
ping -c 5 -W 3 10.77.0.1 >/tmp/ping.txt; cat /tmp/ping.txt
grep -q " 0% packet loss" /tmp/ping.txt || exit 1
vnic-udp send 10.77.0.1 5001 $N 200 || exit 1
vnic-udp recv 5002 $N 60 || exit 1
report_stats eth0
GUEST

for mode in net device; do
    ns=vnic-tap-$mode-$$
    make_netns "$ns"
    start_daemon d-$mode "$ns" --socket "$RUN_DIR/$mode.sock" --tap vtap0
    ip netns exec "$ns" ip addr add 10.77.0.1/24 dev vtap0
    ip netns exec "$ns" ip link set vtap0 up
    ip netns exec "$ns" "$HOST_UDP" recv 5001 $N 120 >"$RUN_DIR/host-recv-$mode.log" 2>&1 &
    hostrecv=$!
    PIDS+=("$hostrecv")
    t0=$(date +%s.%N)
    start_guest g-$mode $mode $mode.sock guest
    wait_console g-$mode "VNIC-LINK eth0 up" "$GUEST_TIMEOUT" || exit 1
    t_link=$(elapsed_since "$t0")
    # The daemon tells the attachments apart by the features the driver acked.
    expect_eq "$mode: attachment reported by ctl stats" "$(daemon_counter d-$mode 0 attachment)" "$mode"
    wait_console g-$mode "listening 5002" 60 || exit 1
    # Paced: a TCG guest drains its RX ring slower than the host fills it, and a counted
    # exchange must not depend on the ring size.
    ip netns exec "$ns" "$HOST_UDP" send 10.77.0.2 5002 $N 200 1000 >/dev/null
    wait_guest g-$mode
    wait "$hostrecv" || { log "host received fewer than $N datagrams: $(cat "$RUN_DIR/host-recv-$mode.log")"; exit 1; }
    expect_eq "$mode: host received" "$(grep "^received" "$RUN_DIR/host-recv-$mode.log")" "received $N"
    compare_counters g-$mode d-$mode 0
    if [[ $mode == device ]]; then
        expect_ge "device: control commands served" "$(daemon_counter d-$mode 0 ctrl_commands)" 1
        expect_eq "device: control errors" "$(daemon_counter d-$mode 0 ctrl_errors)" 0
    fi
    uptime_link=$(grep -a "VNIC-LINK eth0 up" "$RUN_DIR/g-$mode.log" | sed 's/.*uptime=//' | tr -d '\r')
    rtt=$(grep -a "round-trip" "$RUN_DIR/g-$mode.log" | tr -d '\r' | awk -F'= ' '{print $2}')
    printf 'REPORT tap %-6s qemu-start-to-link %s s (guest uptime %s s), ping min/avg/max %s\n' \
        "$mode" "$t_link" "$uptime_link" "$rtt" | tee -a "$RUN_DIR/../reports.txt"
    stop_daemon d-$mode
done
