#!/usr/bin/env bash
# Segmentation offload. Guest A negotiates TSO both ways; guest B's NIC has its receive
# offloads off (QEMU guest_tso4=off, ...), as a NIC without LRO/GRO support would. Each
# transfer is 4 MiB of TCP whose every byte the receiver checks:
#  A -> B     A sends 64 KiB TSO frames; B cannot take them, so dpaa-vnic cuts them into
#             MSS-sized segments with fresh IP IDs, sequence numbers and checksums;
#  A -> host  the same frames go to the tap whole (the host kernel takes GSO);
#  host -> B  the tap hands dpaa-vnic the host's GSO frames; they are segmented for B.
# The daemon's counters show each path: tx_gso on A's port, rx_gso on the tap,
# rx_gso_segmented on B's port; and each port's counters equal its guest's.
# vnic-kernels: bookworm trixie-bpo
set -euo pipefail
source "$(dirname "$0")/../scripts/guest-lib.sh"
setup_run

BYTES=$((4 << 20))
make_initrd a <<GUEST
wait_carrier eth0 || exit 1
ip addr add 10.66.0.2/24 dev eth0
retry 90 ping -c 1 -W 1 10.66.0.3 || exit 1
ping -c 1 -W 2 10.66.0.1 >/dev/null || exit 1
vnic-udp recv 5801 1 120 || exit 1
vnic-tcp send 10.66.0.3 5901 $BYTES || exit 1
vnic-tcp send 10.66.0.1 5902 $BYTES || exit 1
vnic-udp send 10.66.0.3 5803 1 64 || exit 1
report_stats eth0
GUEST
make_initrd b <<GUEST
vnic-tcp recv 5901 120 >/tmp/ab & ab=\$!
vnic-tcp recv 5903 180 >/tmp/hb & hb=\$!
vnic-udp recv 5803 1 240 >/dev/null & done=\$!
wait_carrier eth0 || exit 1
ip addr add 10.66.0.3/24 dev eth0
echo "VNIC-B-READY"
wait \$ab; r=\$?; sed 's/^/A->B /' /tmp/ab; [ \$r = 0 ] || exit 1
wait \$hb; r=\$?; sed 's/^/host->B /' /tmp/hb; [ \$r = 0 ] || exit 1
wait \$done || exit 1
report_stats eth0
GUEST

ns=vnic-gso-$$
make_netns "$ns"
start_daemon d "$ns" --socket "$RUN_DIR/a.sock" --socket "$RUN_DIR/b.sock" --tap vtap0
ip netns exec "$ns" ip addr add 10.66.0.1/24 dev vtap0
ip netns exec "$ns" ip link set vtap0 up
ip netns exec "$ns" "$HOST_TCP" recv 5902 240 >"$RUN_DIR/host-recv.log" 2>&1 &
hostrecv=$!
PIDS+=("$hostrecv")
start_guest ga net a.sock a 1 52:54:00:d0:aa:01
GUEST_NIC_OPTS=guest_tso4=off,guest_tso6=off,guest_ecn=off,guest_ufo=off,guest_uso4=off,guest_uso6=off \
    start_guest gb net b.sock b 1 52:54:00:d0:aa:02
wait_console gb "VNIC-B-READY" "$GUEST_TIMEOUT" || exit 1
wait_console ga "VNIC-LINK eth0 up" "$GUEST_TIMEOUT" || exit 1
# Both guests are up: start A's transfers, and send to B from the host.
wait_for 40 "A's go listener" grep -qa "listening 5801" "$RUN_DIR/ga.log" || { ctl d stats; exit 1; }
ip netns exec "$ns" "$HOST_UDP" send 10.66.0.2 5801 1 64 >/dev/null
wait_console gb "A->B received" 180 || exit 1
# A's last frame to B is one datagram, B's signal to report: the host's flood to B can fill
# B's receive ring, and a NIC drops what finds no room (rx_dropped), so the flood starts only
# once A is done. A CI run lost that datagram when the two overlapped.
wait_guest ga
ip netns exec "$ns" "$HOST_TCP" send 10.66.0.3 5903 "$BYTES" >"$RUN_DIR/host-send.log"
wait_guest gb
wait "$hostrecv" || { log "host: $(cat "$RUN_DIR/host-recv.log")"; exit 1; }
expect_eq "A -> B" "$(grep -a "A->B received" "$RUN_DIR/gb.log" | tr -d '\r' | awk '{print $3, $4, $5}')" "$BYTES bad 0"
expect_eq "host -> B" "$(grep -a "host->B received" "$RUN_DIR/gb.log" | tr -d '\r' | awk '{print $3, $4, $5}')" "$BYTES bad 0"
expect_eq "A -> host" "$(grep "^received" "$RUN_DIR/host-recv.log" | awk '{print $2, $3, $4}')" "$BYTES bad 0"
expect_ge "A sent TSO frames (tx_gso, port 0)" "$(daemon_counter d 0 tx_gso)" 1
expect_ge "the host sent GSO frames (rx_gso, tap)" "$(daemon_counter d 2 rx_gso)" 1
expect_ge "segmented for B (rx_gso_segmented, port 1)" "$(daemon_counter d 1 rx_gso_segmented)" 1
expect_eq "nothing segmented for A" "$(daemon_counter d 0 rx_gso_segmented)" 0
compare_counters ga d 0
compare_counters gb d 1
printf 'REPORT gso A->B %s; host->B %s; A->host %s; frames segmented for B: %s, TSO frames from A: %s\n' \
    "$(grep -a "A->B received" "$RUN_DIR/gb.log" | tr -d '\r' | sed 's/.*(\(.*\))/\1/')" \
    "$(grep -a "host->B received" "$RUN_DIR/gb.log" | tr -d '\r' | sed 's/.*(\(.*\))/\1/')" \
    "$(grep "^received" "$RUN_DIR/host-recv.log" | sed 's/.*(\(.*\))/\1/')" \
    "$(daemon_counter d 1 rx_gso_segmented)" "$(daemon_counter d 0 tx_gso)" | tee -a "$RUN_DIR/../reports.txt"
stop_daemon d
