#!/usr/bin/env bash
# Lifetimes. (1) The daemon is killed and started again under a running guest whose QEMU
# uses reconnect-ms: traffic resumes both ways, and the new daemon's counters equal what
# the guest moved since. (2) QEMU exits and a new QEMU attaches to the same running daemon,
# in the other attachment: the daemon's counters equal the sum of both guests'.
set -euo pipefail
source "$(dirname "$0")/../scripts/guest-lib.sh"
setup_run

ns=vnic-rs-$$
make_netns "$ns"
tap_up() {
    ip netns exec "$ns" ip addr add 10.66.0.1/24 dev vtap0
    ip netns exec "$ns" ip link set vtap0 up
}

# --- (1) daemon restart -------------------------------------------------------------------
make_initrd reconnect <<'GUEST'
vnic-udp recv 5005 1 150 >/tmp/go.txt & rp=$!
wait_carrier eth0 || exit 1
ip addr add 10.66.0.2/24 dev eth0
ping -c 3 -W 2 10.66.0.1 >/dev/null || exit 1
report_stats eth0
echo "VNIC-PHASE1"
wait $rp || { cat /tmp/go.txt; exit 1; }
i=0
until ping -c 1 -W 1 10.66.0.1 >/dev/null 2>&1; do i=$((i + 1)); [ $i -gt 60 ] && exit 1; done
echo "VNIC-PHASE2 after $i failed pings"
report_stats eth0
GUEST

start_daemon d1 "$ns" --socket "$RUN_DIR/p.sock" --tap vtap0
tap_up
start_guest g1 net p.sock reconnect 1 52:54:00:d0:aa:01 ",reconnect-ms=500"
wait_console g1 "VNIC-PHASE1" "$GUEST_TIMEOUT" || exit 1
before_tx=$(guest_stat g1 eth0 tx_packets)
before_rx=$(guest_stat g1 eth0 rx_packets)
stop_daemon d1
[[ ! -e $RUN_DIR/p.sock ]] || { log "FAIL: socket left behind after SIGTERM"; exit 1; }
log "ok: daemon exited on SIGTERM and removed its socket"
t0=$(date +%s.%N)
start_daemon d1b "$ns" --socket "$RUN_DIR/p.sock" --tap vtap0
tap_up
wait_for 30 "QEMU to reconnect" bash -c "[[ \$('$VNIC_BIN' ctl --control '$RUN_DIR/d1b.ctl' stats | grep -c '\"connected\": true') == 2 ]]" || exit 1
log "QEMU reconnected $(elapsed_since "$t0") s after the restart"
# The guest waits for one datagram; send a few, paced, until the link is back.
ip netns exec "$ns" "$HOST_UDP" send 10.66.0.2 5005 1 64 >/dev/null
wait_for 30 "guest to see traffic again" grep -q "VNIC-PHASE2" "$RUN_DIR/g1.log" || {
    for _ in 1 2 3; do ip netns exec "$ns" "$HOST_UDP" send 10.66.0.2 5005 1 64 >/dev/null; sleep 1; done
    wait_console g1 "VNIC-PHASE2" 30 || exit 1
}
wait_guest g1
expect_eq "tx since restart (daemon vs guest)" "$(daemon_counter d1b 0 tx_packets)" \
    "$(($(guest_stat g1 eth0 tx_packets) - before_tx))"
expect_eq "rx since restart (daemon vs guest)" "$(daemon_counter d1b 0 rx_packets)" \
    "$(($(guest_stat g1 eth0 rx_packets) - before_rx))"

# --- (2) QEMU restart against the running daemon --------------------------------------------
make_initrd again <<'GUEST'
wait_carrier eth0 || exit 1
ip addr add 10.66.0.2/24 dev eth0
ip neigh flush dev eth0
ping -c 4 -W 2 10.66.0.1 | tail -2
ping -c 1 -W 2 10.66.0.1 >/dev/null || exit 1
report_stats eth0
GUEST
tx0=$(daemon_counter d1b 0 tx_packets)
rx0=$(daemon_counter d1b 0 rx_packets)
start_guest g2 net p.sock again
wait_guest g2
start_guest g3 device p.sock again
wait_guest g3
expect_eq "tx over two QEMUs (daemon vs guests)" "$(($(daemon_counter d1b 0 tx_packets) - tx0))" \
    "$(($(guest_stat g2 eth0 tx_packets) + $(guest_stat g3 eth0 tx_packets)))"
expect_eq "rx over two QEMUs (daemon vs guests)" "$(($(daemon_counter d1b 0 rx_packets) - rx0))" \
    "$(($(guest_stat g2 eth0 rx_packets) + $(guest_stat g3 eth0 rx_packets)))"
expect_eq "daemon still serving after both left" "$(daemon_counter d1b 0 connected)" False
