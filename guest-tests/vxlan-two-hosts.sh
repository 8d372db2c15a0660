#!/usr/bin/env bash
# Two hosts, one segment, through an engine we did not write: two network namespaces stand
# in for two hosts, each with its own daemon, guest and tap. In each, the tap and a kernel
# VXLAN device (VNI 42, over a veth pair between the namespaces) share a bridge. Guest A
# (exact filter) joins 20 groups; guest B, behind the other daemon, pings A across the
# tunnel, then sends 5 datagrams to each of 20 groups A did not join and to each it did.
# A's sockets receive exactly the joined traffic, A's daemon drops exactly the rest in its
# filter, and every port's counters equal its guest's.
set -euo pipefail
source "$(dirname "$0")/../scripts/guest-lib.sh"
setup_run

J=20
K=5
make_initrd a <<GUEST
wait_carrier eth0 || exit 1
ip addr add 10.91.0.1/24 dev eth0
vnic-mcast ip eth0 239.5.0.1 $J 7021 180 >/tmp/m 2>&1 & m=\$!
wait_line /tmp/m VNIC-JOINED || exit 1
echo "VNIC-READY"
vnic-udp recv 7031 1 180 >/dev/null || exit 1
vnic-udp recv 7020 100000 15 >/tmp/rx 2>&1
grep received /tmp/rx | sed 's/^/VNIC-RX /'
wait \$m || exit 1
report_stats eth0
GUEST
make_initrd b <<GUEST
wait_carrier eth0 || exit 1
ip addr add 10.91.0.2/24 dev eth0
ip route add 224.0.0.0/4 dev eth0
retry 90 ping -c 1 -W 1 10.91.0.1 || exit 1
echo "VNIC-PINGED"
vnic-udp recv 7030 1 180 >/dev/null || exit 1
for g in \$(seq 1 $J); do vnic-udp send 239.6.0.\$g 7020 $K 64 1000 >/dev/null || exit 1; done
for g in \$(seq 1 $J); do vnic-udp send 239.5.0.\$g 7020 $K 64 1000 >/dev/null || exit 1; done
echo "VNIC-SENT"
report_stats eth0
GUEST

# host A: daemon a, tap vtapa, bridge bra (10.91.0.253) with vxlan vx0 to 10.200.0.2
# host B: daemon b, tap vtapb, bridge brb (10.91.0.254) with vxlan vx0 to 10.200.0.1
nsa=vnic-vxa-$$ nsb=vnic-vxb-$$
make_netns "$nsa"
make_netns "$nsb"
ip link add vxa$$ type veth peer name vxb$$
ip link set vxa$$ netns "$nsa" name uplink
ip link set vxb$$ netns "$nsb" name uplink
start_daemon a "$nsa" --socket "$RUN_DIR/a.sock" --tap vtapa --filter exact
start_daemon b "$nsb" --socket "$RUN_DIR/b.sock" --tap vtapb --mac 52:54:00:d0:bb:01
for side in a b; do
    ns=$nsa me=1 peer=2 br=10.91.0.253
    [[ $side == b ]] && ns=$nsb me=2 peer=1 br=10.91.0.254
    ip -n "$ns" addr add 10.200.0.$me/24 dev uplink
    ip -n "$ns" link set uplink up
    ip -n "$ns" link add vx0 type vxlan id 42 local 10.200.0.$me remote 10.200.0.$peer dstport 4789 dev uplink
    # No IGMP snooping on the bridge: the NIC filter behind the tap is what is tested.
    ip -n "$ns" link add br0 type bridge mcast_snooping 0
    ip -n "$ns" link set vx0 master br0
    ip -n "$ns" link set vtap$side master br0
    ip -n "$ns" addr add $br/24 dev br0
    for dev in vx0 vtap$side br0; do ip -n "$ns" link set "$dev" up; done
done
start_guest ga device a.sock a 1 52:54:00:d0:aa:01
start_guest gb device b.sock b
wait_console ga "VNIC-READY" "$GUEST_TIMEOUT" || exit 1
wait_for 10 "the joined groups in daemon a's table" bash -c \
    "'$VNIC_BIN' ctl --control '$RUN_DIR/a.ctl' filter | grep -c '01:00:5e:05:00:' | grep -qx $J"
wait_console gb "VNIC-PINGED" "$GUEST_TIMEOUT" || exit 1
filtered0=$(daemon_counter a 0 rx_filtered)
tunnel0=$(daemon_counter b 1 tx_packets)
ip netns exec "$nsa" "$HOST_UDP" send 10.91.0.1 7031 1 16 >/dev/null
ip netns exec "$nsb" "$HOST_UDP" send 10.91.0.2 7030 1 16 >/dev/null
wait_console gb "VNIC-SENT" "$GUEST_TIMEOUT" || exit 1
wait_console ga "VNIC-RX " 60 || exit 1
ip netns exec "$nsa" "$HOST_UDP" send 10.91.0.1 7021 1 16 >/dev/null
wait_guest ga
wait_guest gb
expect_eq "guest A's sockets received only the joined traffic" \
    "$(grep -a 'VNIC-RX' "$RUN_DIR/ga.log" | tr -d '\r' | awk '{print $3}')" $((J * K))
expect_eq "daemon A filtered the non-joined traffic that crossed the tunnel" \
    "$(($(daemon_counter a 0 rx_filtered) - filtered0))" $((J * K))
expect_ge "frames daemon B sent into its tap (towards the tunnel)" \
    "$(($(daemon_counter b 1 tx_packets) - tunnel0))" $((2 * J * K))
compare_counters ga a 0
compare_counters gb b 0
printf 'REPORT vxlan-two-hosts %d datagrams across VXLAN: %d to joined groups delivered, %d to others filtered by the NIC\n' \
    $((2 * J * K)) $((J * K)) $((J * K)) | tee -a "$RUN_DIR/../reports.txt"
stop_daemon a
stop_daemon b
